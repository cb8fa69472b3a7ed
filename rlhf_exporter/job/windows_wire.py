"""The window board on the wire: worker sidecars read the head's recent step
windows. `board_json` encodes a `WindowBoard` as the head's `GET /api/v1/windows` answer,
`parse_board` checks a worker's copy of it as strictly as a pushed record, and `WindowsApi`
is the endpoint `server.py` serves it from (read-only, behind the push token).

The board itself (rlhf_exporter/join/board.py) knows no HTTP and no auth.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import orjson

from ..auth import AuthGuard
from ..diagnosis.thresholds import GROUPS
from ..diagnosis.timeline import Interval, Timeline
from ..join.board import MAX_JOBS, WindowBoard
from .cleaning import clean_label
from .limits import MAX_STEP

WINDOWS_PATH = "/api/v1/windows"
WIRE_BODY_BYTES = 4 << 20  # bytes a worker reads from the head at most; the head's answer fits it
MAX_INTERVALS = 64  # intervals per step a worker accepts
WIRE_NAME_CHARS = 256  # a job's project and experiment on the wire (a directory name's length)
WIRE_TIMER_CHARS = 256  # a timer's name on the wire (as long as a record key may be)
MAX_STEPS_PER_JOB = 1024  # steps per job in an answer; more rejects it (a head keeps 32)
_GROUPS = frozenset(GROUPS)


def _sendable(text: str, limit: int) -> str:
    """A name as `parse_board` accepts it (cleaned, cut to `limit`): a head never sends an
    answer its workers refuse because one job logged an odd timer key."""
    return clean_label(text)[0][:limit] or "?"


def timeline_json(tl: Timeline) -> dict[str, object]:
    return {
        "step": tl.step,
        "start": tl.start,
        "end": tl.end,
        "error_seconds": tl.error_seconds,
        "intervals": [
            [_sendable(iv.timer, WIRE_TIMER_CHARS), iv.group, iv.start, iv.end]
            for iv in tl.intervals[:MAX_INTERVALS]
        ],
    }


def board_json(board: WindowBoard, max_bytes: int = WIRE_BODY_BYTES) -> bytes:
    """The board as the windows API's JSON answer, at most `max_bytes` long: when every
    job's kept steps do not fit (64 jobs x 32 steps x 39 timers is ~9 MB), the oldest steps
    are left out, so a worker always gets the newest ones (it reads at most WIRE_BODY_BYTES)."""
    jobs = board.snapshot()
    encoded = [
        (
            _sendable(p, WIRE_NAME_CHARS),
            _sendable(e, WIRE_NAME_CHARS),
            [orjson.dumps(timeline_json(tl)) for tl in tls],
            [tl.end for tl in tls],
        )
        for (p, e), tls in jobs
    ]
    size = sum(
        sum(len(b) + 1 for b in steps) + 128 + 6 * (len(p) + len(e)) for p, e, steps, _ in encoded
    )
    if size > max_bytes:  # drop the oldest steps of all jobs until the answer fits
        ends = sorted(
            (end, len(step), i, j)
            for i, (_p, _e, steps, tl_ends) in enumerate(encoded)
            for j, (step, end) in enumerate(zip(steps, tl_ends, strict=True))
        )
        dropped: set[tuple[int, int]] = set()
        for _end, n, i, j in ends:
            if size <= max_bytes:
                break
            dropped.add((i, j))
            size -= n + 1
        encoded = [
            (p, e, [b for j, b in enumerate(steps) if (i, j) not in dropped], ends_)
            for i, (p, e, steps, ends_) in enumerate(encoded)
        ]
    parts = [
        orjson.dumps({"project": p, "experiment": e})[:-1]
        + b',"steps":['
        + b",".join(steps)
        + b"]}"
        for p, e, steps, _ in encoded
    ]
    return b'{"jobs":[' + b",".join(parts) + b"]}"


def _num(x: object, what: str) -> float:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        raise ValueError(f"{what} is not a number")
    try:
        value = float(x)  # an int too big for a float raises OverflowError
    except OverflowError:
        raise ValueError(f"{what} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number")
    return value


def _label(x: object, what: str, limit: int = WIRE_NAME_CHARS) -> str:
    """A label value from the head, checked as a pushed job's name is (but up to 256
    characters: a file job is named after directories): a non-empty string, valid UTF-8 (no
    lone surrogate), no control character."""
    if not isinstance(x, str) or not x or len(x) > limit:
        raise ValueError(f"{what} is not a string of 1 to {limit} characters")
    if clean_label(x)[1] is not None:
        raise ValueError(f"{what} holds a control character or is not valid UTF-8")
    return x


def _list(x: object, what: str, limit: int) -> list[object]:
    if not isinstance(x, list) or len(x) > limit:
        raise ValueError(f"{what} is not a list of at most {limit}")
    return x


def parse_board(
    doc: object, max_jobs: int = MAX_JOBS, max_steps: int = 32
) -> list[tuple[tuple[str, str], Timeline]]:
    """The head's answer, checked as strictly as a pushed record: at most `max_jobs` jobs of
    at most MAX_STEPS_PER_JOB steps (of which the newest `max_steps` are returned: the
    worker's board keeps no more, whatever the head's `gpu_windows_keep`), each of at most
    MAX_INTERVALS intervals; job names checked as push checks them; groups only the decision
    table's (`GROUPS`); timer names valid label text of at most WIRE_TIMER_CHARS; steps
    integers in 0..2^53, times finite. Anything else raises ValueError (whose message holds
    no value from the answer) and the whole answer is rejected, as a push would be."""
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    jobs = _list(doc.get("jobs"), "jobs", max_jobs)
    out: list[tuple[tuple[str, str], Timeline]] = []
    seen: set[tuple[str, str]] = set()
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise ValueError(f"jobs[{i}] is not an object")
        labels = (
            _label(job.get("project"), "project"),
            _label(job.get("experiment"), "experiment"),
        )
        if labels in seen:
            raise ValueError(f"jobs[{i}] repeats a job")
        seen.add(labels)
        steps = _list(job.get("steps"), f"jobs[{i}].steps", MAX_STEPS_PER_JOB)
        first = len(out)
        for k, st in enumerate(steps):
            where = f"jobs[{i}].steps[{k}]"
            if not isinstance(st, dict):
                raise ValueError(f"{where} is not an object")
            step = st.get("step")
            if type(step) is not int or not 0 <= step <= MAX_STEP:
                raise ValueError(f"{where}.step is not an integer in 0..2^53")
            intervals = []
            for n, iv in enumerate(_list(st.get("intervals"), f"{where}.intervals", MAX_INTERVALS)):
                if not isinstance(iv, list) or len(iv) != 4:
                    raise ValueError(f"{where}.intervals[{n}] is not [timer, group, start, end]")
                timer, group, a, b = iv
                if group not in _GROUPS:
                    raise ValueError(f"{where}.intervals[{n}]: not a decision-table group")
                intervals.append(
                    Interval(
                        _label(timer, "a timer", WIRE_TIMER_CHARS),
                        group,
                        _num(a, "an interval's start"),
                        _num(b, "an interval's end"),
                    )
                )
            start, end = _num(st.get("start"), "start"), _num(st.get("end"), "end")
            error = _num(st.get("error_seconds"), "error_seconds")
            if end < start or error < 0:
                raise ValueError(f"{where}: end before start, or a negative error")
            out.append((labels, Timeline(step, start, end, tuple(intervals), error)))
        del out[first : max(first, len(out) - max_steps)]  # the newest max_steps
    return out


class WindowsApi:
    """`GET /api/v1/windows` on the head sidecar: its jobs' recent step windows, read-only,
    behind the push token when one is set (`Authorization: Bearer <token>`, as for push;
    failures counted and rate-limited by `guard`). The answer is encoded once per change of
    the board (any number of workers polling cost one encoding) and fits WIRE_BODY_BYTES."""

    def __init__(self, board: WindowBoard, token: str | None, guard: AuthGuard | None = None):
        self.board = board
        self.guard = guard or AuthGuard(token, "windows")
        self._cached: tuple[int, bytes] = (-1, b"")
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()  # answers_encoded

    def handle(self, authorization: str | None, client: str = "") -> tuple[int, bytes]:
        denied = self.guard.check(authorization, client)
        if denied is not None:
            return denied.status, orjson.dumps({"error": denied.message}) + b"\n"
        with self._lock:
            version = self.board.version
            if self._cached[0] != version:
                self.stats["answers_encoded"] += 1
                self._cached = (version, board_json(self.board) + b"\n")
            return 200, self._cached[1]
