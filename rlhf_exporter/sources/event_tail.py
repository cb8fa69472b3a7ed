"""TensorBoard event directories under the `verl` source's root: `<root>/<project>/
<experiment>/` holding event files (verl's `tensorboard` logger writes
`tensorboard_log/<project>/<experiment>/`; every other framework's logger an event file in a
directory of its own), read as the job `<project>/<experiment>`. What was appended to the
files is read each poll (sources/tensorboard_reader.py) and fed to the job."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from .tensorboard_reader import TensorBoardMissing
from .verl_tail import Watched, shown

log = logging.getLogger(__name__)

TENSORBOARD_MISSING = "tensorboard_missing"  # record_errors: the extra is not installed
LOOK_INTO = 16  # subdirectories of a candidate looked into for event files, at most


def holds_events(path: str) -> bool:
    """Whether the directory `path` holds an event file, in itself or one level down (at
    most LOOK_INTO subdirectories listed); no symbolic link followed."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        return False
    if any("tfevents" in e.name and e.is_file(follow_symlinks=False) for e in entries):
        return True
    subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)][:LOOK_INTO]
    for sub in subdirs:
        try:
            with os.scandir(sub) as it:
                if any("tfevents" in e.name for e in it):
                    return True
        except OSError:
            continue
    return False


class EventTail:
    """Reads what is new in watched event directories; counts the records read and the
    readers' rejections (in the source's `rejected`)."""

    def __init__(self, rejected: Counter[str]):
        self.rejected = rejected
        self.records = 0

    def read(self, w: Watched, now: float) -> None:
        events = w.events
        assert events is not None
        try:
            records = list(events.poll())
        except TensorBoardMissing as exc:
            if w.problem != TENSORBOARD_MISSING:
                w.problem = TENSORBOARD_MISSING
                self.rejected[TENSORBOARD_MISSING] += 1
                log.warning("%s: %s", shown(w.path), exc, extra={"path": shown(w.path)})
            return
        if w.identity is None:  # first sight: the job last changed when its files did
            w.identity = (0, 0)
            w.last_change = _newest_mtime(w.path)
        if records:
            w.last_change = now
            self.records += w.job.feed(records, now)
        w.backlog = False
        for reason, n in events.rejected.items():
            new = n - w.rejected_seen[reason]
            if new > 0:
                self.rejected[reason] += new
                w.rejected_seen[reason] = n


def _newest_mtime(path: Path) -> float:
    try:
        return max((p.stat().st_mtime for p in path.rglob("*tfevents*")), default=0.0)
    except OSError:
        return 0.0
