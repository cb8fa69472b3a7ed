"""What a wheel is built from: pyproject's package-data patterns and the license."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_data_pattern_matches_a_file():
    """A pattern that matches nothing ships nothing, silently (setuptools does not warn)."""
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert data, "no package-data: thresholds.yaml would not ship"
    for package, patterns in data.items():
        folder = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern} matches nothing"


def test_run_time_files_are_package_data():
    """Files the package opens at run time are covered by some package-data pattern."""
    folder = ROOT / "rlhf_exporter"
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["rlhf_exporter"]
    shipped = {p for pattern in patterns for p in folder.glob(pattern)}
    for needed in ("thresholds.yaml", "py.typed", "examples/demo_job.jsonl"):
        assert folder / needed in shipped, needed


def test_license_file_matches_the_declared_license():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a one-line pointer


def test_every_file_the_dockerfile_copies_passes_dockerignore():
    """.dockerignore ignores everything (`*`) and lets named paths back in (`!path`): a COPY
    of a path it does not let in fails the image build."""
    allowed = {
        line[1:].strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied += words[1:-1]
    assert "LICENSE" in copied and "rlhf_exporter" in copied
    assert set(copied) <= allowed, set(copied) - allowed
    for path in copied:
        assert (ROOT / path).exists(), path


def test_the_import_package_is_rlhf_exporter_not_a_generic_name():
    """A top-level `exporter` would collide with anything else of that name (issue 28)."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import exporter"], cwd=ROOT, capture_output=True)
    assert gone.returncode != 0 and b"No module named 'exporter'" in gone.stderr
    ok = subprocess.run([sys.executable, "-c", "import rlhf_exporter"], cwd=ROOT)
    assert ok.returncode == 0
    assert not (ROOT / "exporter").exists()
