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
    assert {"image/requirements.txt", "image/build-requirements.txt"} <= set(copied)
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


DOCKERFILE = (ROOT / "Dockerfile").read_text() if (ROOT / "Dockerfile").exists() else ""


def test_dockerfile_has_one_base_of_the_release_ci_debootstraps():
    """One file, two bases: debian:bookworm-slim for `docker build`, a debootstrap'ed bookworm
    (scripts/build-image.sh's SUITE) in CI; both stages take BASE."""
    import re

    (base,) = re.findall(r"^ARG BASE=(\S+)$", DOCKERFILE, re.M)
    (suite,) = re.findall(r"^SUITE=(\w+)", (ROOT / "scripts" / "build-image.sh").read_text(), re.M)
    # by digest (issue 35): a tag moves, a digest is the bytes that were reviewed
    assert re.fullmatch(rf"docker\.io/library/debian:{suite}-slim@sha256:[0-9a-f]{{64}}", base)
    froms = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert froms and all(f == "${BASE}" for f in froms), froms


def test_debootstrap_checks_the_archive_with_an_explicit_keyring():
    """The CI base comes from Debian's archive checked against Debian's keyring (issue 35):
    debootstrap gets --keyring and --force-check-gpg (no unsigned fallback), the script
    refuses to run without the keyring, and no --no-check-gpg is anywhere."""
    import re

    script = (ROOT / "scripts" / "build-image.sh").read_text()
    call = re.search(r"^\s*debootstrap .*?(?<!\\)$", script.replace("\\\n", " "), re.M | re.S)
    assert call, "no debootstrap call"
    words = call.group(0).split()
    assert '--keyring="$KEYRING"' in words and "--force-check-gpg" in words
    assert "--no-check-gpg" not in script
    assert "KEYRING=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}" in script
    assert '[ -s "$KEYRING" ] || fail' in script
    assert "MIRROR=${DEBIAN_MIRROR:-https://" in script


def test_dockerfile_version_default_is_the_package_version():
    """`docker build` without --build-arg labels the image with the package's version (the
    build stage also refuses a VERSION other than the installed package's)."""
    import re

    import rlhf_exporter

    versions = set(re.findall(r"^ARG VERSION=(\S+)$", DOCKERFILE, re.M))
    assert versions == {rlhf_exporter.__version__}


def test_dockerfile_installs_by_hash_from_the_lock_files_only():
    """Two builds of one commit install the same files: every pip install of a dependency
    reads a lock file with --require-hashes, binary wheels only (no compiler in the image)."""
    lines = [line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#")]
    runs = [i for i in "\n".join(lines).replace("\\\n", " ").splitlines() if i.startswith("RUN ")]
    commands = [cmd.strip() for run in runs for cmd in run[4:].split("&&")]
    installs = [cmd for cmd in commands if "pip" in cmd.split()[0] and " install " in cmd]
    locked = [cmd for cmd in installs if "-r /tmp/lock/" in cmd]
    assert len(locked) == 2
    for cmd in locked:
        assert "--require-hashes" in cmd and "--only-binary :all:" in cmd
    others = [cmd for cmd in installs if cmd not in locked]
    assert others and all("--no-deps" in cmd and "--no-index" in cmd for cmd in others)
    for lock in ("requirements.txt", "build-requirements.txt"):
        text = (ROOT / "image" / lock).read_text()
        names = [line for line in text.splitlines() if line and line[0] not in "# "]
        assert names and all("==" in line for line in names), lock
        assert text.count("==") <= text.count("--hash=sha256:"), lock


def test_image_lock_covers_the_declared_dependencies():
    """Every dependency pyproject declares is pinned in image/requirements.txt."""
    import re

    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    lock = (ROOT / "image" / "requirements.txt").read_text()
    pinned = {norm(m) for m in re.findall(r"^([A-Za-z0-9_.-]+)==", lock, re.M)}
    declared = {
        norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
        for d in PYPROJECT["project"]["dependencies"]
    }
    assert declared <= pinned, declared - pinned


def test_the_image_archive_is_git_ignored():
    """scripts/build-image.sh writes build/image/rlhf-exporter-<version>.oci.tar, where
    docs/image.md says, and git ignores it."""
    import subprocess

    import rlhf_exporter

    script = (ROOT / "scripts" / "build-image.sh").read_text()
    assert "OUT=${RLHF_IMAGE_OUT:-$PWD/build/image}" in script
    assert 'ARCHIVE="$OUT/rlhf-exporter-$VERSION.oci.tar"' in script
    assert "build/image/rlhf-exporter-<version>.oci.tar" in (ROOT / "docs" / "image.md").read_text()
    archive = f"build/image/rlhf-exporter-{rlhf_exporter.__version__}.oci.tar"
    ignored = subprocess.run(["git", "check-ignore", "-q", archive], cwd=ROOT)
    assert ignored.returncode == 0, f"{archive} is not git-ignored"
