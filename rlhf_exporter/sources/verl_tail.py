"""Tailing one verl JSONL file for the `verl` source: where reading it has got to, what is new
since, and whether it was truncated, replaced or rewritten (then read again from the start
as a new run of the same job). Its problems are counted by reason and logged once."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..job.cleaning import clean_label
from ..job.state import Job
from . import verl_layout
from .base import Problems
from .file_records import FileRecordReader
from .tensorboard_reader import TensorBoardReader
from .verl_layout import NOT_VERL_RECORDS

log = logging.getLogger(__name__)

CHUNK = 1 << 20
HEAD_BYTES = 64 << 10  # at most this much of the first line is fingerprinted
TAIL_BYTES = 64  # the bytes before the read offset, kept to notice a rewrite that grew

# record_errors reasons for whole-file problems (line problems come from verl_reader)
FILE_DELETED = "file_deleted"
FILE_MISSING = "file_missing"
PERMISSION_DENIED = "permission_denied"
NOT_A_FILE = "not_a_file"
READ_FAILED = "read_failed"  # (a collector_errors reason too)


@dataclass
class Watched:
    """One file and where reading it has got to."""

    path: Path
    project: str
    experiment: str
    job: Job
    reader: FileRecordReader  # verl's JSONL, or another framework's lines (file_records)
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file being read
    offset: int = 0
    head: bytes = b""  # the first line (up to HEAD_BYTES) while it is being read
    head_len: int = 0  # bytes fingerprinted once the first line is complete (0: not yet)
    head_digest: bytes = b""
    tail: bytes = b""  # the TAIL_BYTES before `offset`
    mtime_ns: int = -1
    last_change: float = 0.0  # wall time of the last change seen (initially the file's mtime)
    problem: str | None = None
    markers_at: float = float("-inf")  # when the .finished/.total_steps files were last read
    backlog: bool = True  # its first read has not reached the end yet: not exported until it has
    rejected_seen: Counter[str] = field(default_factory=Counter)  # reader.rejected already counted
    logged: set[str] = field(default_factory=set)  # line problems already logged
    not_verl: bool = False  # listed as a file in another format (verl_layout.not_verl)
    events: TensorBoardReader | None = None  # an event directory's (event_tail), not a file
    spath: str = field(init=False)  # the path as str: a poll stats every file

    def __post_init__(self) -> None:
        self.spath = str(self.path)

    @property
    def framework(self) -> str | None:
        """The framework whose output it holds (None until its first bytes are read)."""
        return self.events.framework if self.events is not None else self.reader.framework


class FileTail:
    """Reads what is new in watched files; counts their problems and line rejections in
    `rejected` (the source's counter) and the records read in `records`."""

    def __init__(self, rejected: Counter[str], problems: Problems):
        self.rejected = rejected
        self.problems = problems
        self.records = 0

    def file_problem(self, w: Watched, reason: str, message: str) -> None:
        if w.problem != reason:
            w.problem = reason
            self.rejected[reason] += 1
            log.warning(
                "%s: %s",
                shown(w.path),
                message,
                extra={
                    "path": shown(w.path),
                    "reason": reason,
                    "project": w.project,
                    "experiment": w.experiment,
                },
            )

    def _restart(self, w: Watched, why: str) -> None:
        w.reader.finish()  # an unfinished last line is counted as incomplete_line
        self._count_rejections(w)
        w.reader.reset()
        w.offset = 0
        w.head, w.head_len, w.head_digest, w.tail = b"", 0, b"", b""
        w.job.new_run()
        log.info(
            "%s was %s: reading it again from the start as a new run",
            shown(w.path),
            why,
            extra={"path": shown(w.path), "project": w.project, "experiment": w.experiment},
        )

    def _count_rejections(self, w: Watched) -> None:
        for reason, n in w.reader.rejected.items():
            new = n - w.rejected_seen[reason]
            if new > 0:
                self.rejected[reason] += new
                w.rejected_seen[reason] = n
                if reason not in w.logged:
                    w.logged.add(reason)
                    log.warning(
                        "%s: rejected %d line(s): %s (counted, logged once per file and reason)",
                        shown(w.path),
                        new,
                        reason,
                        extra={
                            "path": shown(w.path),
                            "reason": reason,
                            "project": w.project,
                            "experiment": w.experiment,
                        },
                    )

    def read(self, w: Watched, budget: int, now: float) -> int:
        """Read what is new in one file; returns the bytes read."""
        try:
            st = os.stat(w.spath)
        except FileNotFoundError:
            if w.identity is not None:
                self.file_problem(
                    w, FILE_DELETED, "file deleted (a recreated file is read as a new run)"
                )
            else:
                self.file_problem(w, FILE_MISSING, "file does not exist (yet)")
            return 0
        except OSError as exc:
            reason = PERMISSION_DENIED if isinstance(exc, PermissionError) else READ_FAILED
            self.file_problem(w, reason, f"cannot stat: {exc.strerror or exc}")
            return 0
        if not stat.S_ISREG(st.st_mode):
            self.file_problem(w, NOT_A_FILE, "not a regular file")
            return 0
        if (
            st.st_size == w.offset
            and st.st_mtime_ns == w.mtime_ns
            and w.problem is None
            and (st.st_dev, st.st_ino) == w.identity
        ):
            return 0  # nothing new: the common case, no open()
        try:  # O_NONBLOCK: a FIFO named *.jsonl must not hang the poll
            fd = os.open(w.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return 0  # gone between stat and open: seen as deleted next poll
        except OSError as exc:
            reason = PERMISSION_DENIED if isinstance(exc, PermissionError) else READ_FAILED
            self.file_problem(w, reason, f"cannot open: {exc.strerror or exc}")
            return 0
        f = os.fdopen(fd, "rb", buffering=0)
        st = os.fstat(fd)  # what was opened, whatever happened since the stat
        if not stat.S_ISREG(st.st_mode):
            f.close()
            self.file_problem(w, NOT_A_FILE, "not a regular file")
            return 0
        if w.mtime_ns < 0:
            w.last_change = st.st_mtime  # first sight: the job last changed when the file did
        elif st.st_mtime_ns != w.mtime_ns:
            w.last_change = now
        identity = (st.st_dev, st.st_ino)
        if w.identity is not None and identity != w.identity:
            self._restart(w, "replaced")
        elif st.st_size < w.offset:
            self._restart(w, "truncated")
        total = 0
        with f:
            try:
                if w.identity == identity and w.offset > 0 and _rewritten(fd, w):
                    self._restart(w, "rewritten")
                w.identity = identity
                w.mtime_ns = st.st_mtime_ns
                f.seek(w.offset)
                while total < budget:
                    chunk = f.read(min(CHUNK, budget - total))
                    if not chunk:
                        break
                    if not w.head_len:
                        _grow_head(w, chunk)
                    w.offset += len(chunk)
                    w.tail = (w.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
                    total += len(chunk)
                    # the records were written by the file's mtime, not when we read them
                    self.records += w.job.feed(w.reader.feed(chunk), min(now, st.st_mtime))
            except OSError as exc:
                self.file_problem(w, READ_FAILED, f"read failed: {exc.strerror or exc}")
                return total
        if w.offset >= st.st_size:
            w.backlog = False
        if w.problem is not None:
            log.info("%s is readable again", shown(w.path), extra={"path": shown(w.path)})
            w.problem = None
        self._count_rejections(w)
        self._check_format(w)
        return total

    def _check_format(self, w: Watched) -> None:
        """A file none of whose lines is a verl record: listed once, with the logger setting
        that writes verl's format; cleared by its first record."""
        if w.not_verl and w.reader.records:
            w.not_verl = False
            self.problems.clear(f"file {w.spath}", "it holds verl records now")
        elif not w.not_verl:
            found = verl_layout.not_verl(w.spath, w.reader.records, w.reader.rejected)
            if found is not None:
                w.not_verl = True
                self.problems.set(f"file {w.spath}", NOT_VERL_RECORDS, *found)


def shown(path: Path | str) -> str:
    """A path as valid UTF-8 text for logs and the job list."""
    return clean_label(str(path))[0]


def _grow_head(w: Watched, chunk: bytes) -> None:
    """Collect the first line; once it is complete (or HEAD_BYTES long), fingerprint it."""
    part = chunk[: HEAD_BYTES - len(w.head)]
    nl = part.find(b"\n")
    if nl >= 0:
        part = part[: nl + 1]
    w.head += part
    if nl >= 0 or len(w.head) >= HEAD_BYTES:
        w.head_len = len(w.head)
        w.head_digest = hashlib.blake2b(w.head, digest_size=16).digest()
        w.head = b""


def _rewritten(fd: int, w: Watched) -> bool:
    """Whether the file no longer starts with the first line read, or no longer holds the
    bytes read just before `offset` (a rewrite that kept the start and grew past the old
    size between two polls)."""
    if w.head_len:
        head = os.pread(fd, w.head_len, 0)
        if hashlib.blake2b(head, digest_size=16).digest() != w.head_digest:
            return True
    elif w.head and os.pread(fd, len(w.head), 0) != w.head:
        return True
    if w.tail:
        start = w.offset - len(w.tail)
        if os.pread(fd, len(w.tail), start) != w.tail:
            return True
    return False
