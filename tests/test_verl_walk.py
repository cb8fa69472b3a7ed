"""The verl root's walk (rlhf_exporter/sources/verl_files.py) under a hostile tree.

Anything that can write to the shared root can plant a looping symlink, an unreadable
folder, a folder that vanishes mid-walk, a newline in a name or 100,000 files: each costs
that entry only (counted and logged once), never the whole root's discovery, and ignored
files are not examined again at every poll.
"""

from __future__ import annotations

import io
import logging
import os
import time

import pytest

from rlhf_exporter import logs
from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.sources import verl_files
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


def jobs_of(snap) -> set[tuple[str, str]]:
    return {p[0].labels[:2] for p in snap.parts if p}


def job(root, project: str, experiment: str, steps: int = 2) -> None:
    (root / project).mkdir(parents=True, exist_ok=True)
    write_jsonl(root / project / f"{experiment}.jsonl", [(REGIMES["balanced"], steps)])


def test_a_looping_symlink_blinds_nothing_but_itself(tmp_path, th):
    root = tmp_path / "logs"
    job(root, "ok", "job")
    (root / "loop").symlink_to(root / "loop")  # ELOOP on every stat through it
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    src = VerlFileSource(th, [root])
    for _ in range(3):
        snap = src.poll_once()
    assert snap.up, snap.errors  # the root is not "missing"
    assert jobs_of(snap) == {("ok", "job")}
    assert snap.record_errors.get("symlink_loop") == 3  # each counted once, not per poll
    job(root, "later", "job")  # and discovery goes on
    assert jobs_of(src.poll_once()) == {("ok", "job"), ("later", "job")}


def test_an_unreadable_or_vanishing_folder_costs_that_folder_only(tmp_path, th, monkeypatch):
    root = tmp_path / "logs"
    for name in ("a", "locked", "gone", "z"):
        job(root, name, "job")
    locked, gone = str(root / "locked"), root / "gone"
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == locked and os.geteuid() == 0:
            raise PermissionError(13, "Permission denied", path)  # root reads a 000 folder
        it = real_scandir(path)
        if os.fspath(path) == str(root) and gone.exists():  # removed while the root is walked
            for f in gone.iterdir():
                f.unlink()
            gone.rmdir()
        return it

    os.chmod(locked, 0)
    monkeypatch.setattr(verl_files.os, "scandir", scandir)
    try:
        src = VerlFileSource(th, [root])
        for _ in range(3):
            snap = src.poll_once()
    finally:
        os.chmod(locked, 0o755)
    assert snap.up
    assert jobs_of(snap) == {("a", "job"), ("z", "job")}
    assert snap.record_errors.get("permission_denied") == 1
    monkeypatch.setattr(verl_files.os, "scandir", real_scandir)
    assert ("locked", "job") in jobs_of(src.poll_once())  # readable again: found


def test_files_ignored_beyond_max_files_are_not_examined_every_poll(tmp_path, th, monkeypatch):
    root = tmp_path / "logs"
    folder = root / "many"
    folder.mkdir(parents=True)
    for i in range(20_000):  # 100,000 in the issue; the cost per poll is what matters
        (folder / f"e{i}.jsonl").touch()
    past = time.time() - 60
    os.utime(folder, (past, past))  # the listing last changed a minute ago
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path="."):
        listed.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(verl_files.os, "scandir", scandir)
    src = VerlFileSource(th, [root], max_files=50)
    snap = src.poll_once()
    assert snap.record_errors.get("too_many_files") == 1
    assert listed == [str(root), str(folder)]
    listed.clear()
    for _ in range(3):
        snap = src.poll_once()
    assert listed == [str(root)] * 3  # the unchanged folder is not listed again
    assert snap.record_errors.get("too_many_files") == 1
    # a new file changes the folder: listed again (here the cap still ignores it)
    job(root, "many", "new")
    listed.clear()
    src.poll_once()
    assert listed == [str(root), str(folder)]


def test_a_new_file_in_a_remembered_folder_is_found(tmp_path, th):
    root = tmp_path / "logs"
    job(root, "p", "one")
    past = time.time() - 60
    os.utime(root / "p", (past, past))
    src = VerlFileSource(th, [root])
    assert jobs_of(src.poll_once()) == {("p", "one")}
    assert jobs_of(src.poll_once()) == {("p", "one")}
    assert src.stats["folders_unchanged"] == 1
    job(root, "p", "two")
    assert jobs_of(src.poll_once()) == {("p", "one"), ("p", "two")}


def test_a_newline_in_a_directory_name_cannot_forge_a_log_line(tmp_path, th):
    root = tmp_path / "logs"
    forged = "x\n2026-01-01T00:00:00.000Z error forged line"
    job(root, forged, "job")
    stream = io.StringIO()
    logs.configure("text", "info", stream)
    try:
        src = VerlFileSource(th, [root])
        src.poll_once()
        (root / forged / "job.jsonl").chmod(0o644)
        os.remove(root / forged / "job.jsonl")
        src.poll_once()
    finally:
        logging.getLogger().handlers.clear()
    lines = stream.getvalue().splitlines()
    assert lines and all(
        line.startswith("20") and " forged line" not in line[:40] for line in lines
    )
    assert not [line for line in lines if line.startswith("2026-01-01")]
