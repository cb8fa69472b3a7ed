"""scripts/test.sh says what it installs and why, and stops with a clear message where it
cannot install the system tools (no apt-get, not root), before touching anything."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_without_tools(tmp_path: Path, uid: str, apt: bool) -> subprocess.CompletedProcess:
    """scripts/test.sh with a PATH holding only what it needs before its first install:
    no promtool, amtool, victoria-metrics or chromium; a fake `id`, and apt-get or not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bin_dir / "dirname").symlink_to(dirname)
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "id").chmod(0o755)
    if apt:
        (bin_dir / "apt-get").write_text("#!/bin/sh\necho apt-get must not run >&2\nexit 9\n")
        (bin_dir / "apt-get").chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(ROOT / "scripts" / "test.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )


def test_no_apt_get_fails_naming_what_is_missing_and_why(tmp_path):
    r = run_without_tools(tmp_path, "0", apt=False)
    assert r.returncode == 1, r.stderr
    err = r.stderr
    for package in ("prometheus", "prometheus-alertmanager", "victoria-metrics"):
        assert f"  {package} (" in err
    assert "alert rules' unit tests" in err  # why
    assert "no apt-get on this machine" in err and "SKIP_SYSTEM_PACKAGES=1" in err
    assert not (tmp_path / ".venv").exists()


def test_not_root_fails_with_the_command_to_run(tmp_path):
    r = run_without_tools(tmp_path, "1000", apt=True)
    assert r.returncode == 1, r.stderr
    assert "not root. Run: sudo apt-get install --no-install-recommends" in r.stderr
    assert "apt-get must not run" not in r.stderr


def test_the_script_says_what_it_installs():
    text = (ROOT / "scripts" / "test.sh").read_text()
    for what in ("prometheus-alertmanager", "900 MB", "verl==0.9.1", "SKIP_LINT=1"):
        assert what in text
