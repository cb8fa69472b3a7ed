"""Where the verl side and the NVML side of the GPU-window join meet (issue 17).

- Jobs post each classified step's `Timeline` (rlhf_exporter/diagnosis/timeline.py) to the
  `WindowBoard`, which keeps the last `keep` steps per job (bounded in steps and in jobs).
- The NVML source feeds each GPU's timestamped samples and role into its `GpuWindowJoin`
  (rlhf_exporter/diagnosis/gpujoin.py) and, every poll, attributes the steps posted since.

One job per node: NVML sees this node's GPUs, and nothing says which job a GPU serves
other than which job runs here. When the board has more than one job with a step in the
last `horizon` seconds, this poll's new steps are not joined (a GPU-second is never
given to a job that may not own it) and the skip is logged once.

Exported (catalog: rlhf_exporter/metrics/catalog.py, section "GPU time by step window"):
`rlhf_window_gpu_busy_seconds_total{project,experiment,group,gpu_role}` and
`rlhf_window_gpu_seconds_total{...}`; idle GPU-seconds are their difference.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any

import orjson

from ..auth import AuthGuard
from ..diagnosis.gpujoin import GpuWindowJoin
from ..diagnosis.thresholds import GROUPS
from ..diagnosis.timeline import Interval, Recent, Timeline
from ..jobs import MAX_STEP, clean_label
from ..metrics.snapshot import Sample

log = logging.getLogger(__name__)

BUSY_METRIC = "rlhf_window_gpu_busy_seconds_total"
TOTAL_METRIC = "rlhf_window_gpu_seconds_total"
THROTTLED_METRIC = "rlhf_window_gpu_throttled_seconds_total"
MAX_JOBS = 64  # jobs the board remembers (the least recently posted goes first)


class WindowBoard:
    """Recent step timelines per job (thread-safe: jobs post, NVML's poll thread reads)."""

    def __init__(self, keep: int = 32, max_jobs: int = MAX_JOBS):
        self.keep = keep
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._jobs: OrderedDict[tuple[str, str], Recent] = OrderedDict()
        self._new: list[tuple[tuple[str, str], Timeline]] = []
        self.version = 0  # bumped at every post (the windows API caches its answer per version)
        # the engine source (sources/engines.py), when the sidecar samples rollout engines:
        # a job joins its step's rollout window to the engines' samples through it
        self.engines: Any = None

    def post(self, labels: tuple[str, str], timeline: Timeline) -> None:
        with self._lock:
            recent = self._jobs.pop(labels, None) or Recent(self.keep)
            recent.add(timeline)
            self._jobs[labels] = recent
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)
            self._new.append((labels, timeline))
            del self._new[: -self.keep * self.max_jobs]  # bounded if no NVML source reads
            self.version += 1

    def recent(self, labels: tuple[str, str]) -> tuple[Timeline, ...]:
        """The job's kept timelines, oldest first (for the read-only API and the view)."""
        with self._lock:
            recent = self._jobs.get(labels)
            return tuple(recent) if recent is not None else ()

    def snapshot(self) -> list[tuple[tuple[str, str], tuple[Timeline, ...]]]:
        """Every job's kept timelines, oldest first (for GET /api/v1/windows)."""
        with self._lock:
            return [(k, tuple(r)) for k, r in self._jobs.items()]

    def take_new(self) -> list[tuple[tuple[str, str], Timeline]]:
        """The timelines posted since the last call."""
        with self._lock:
            new, self._new = self._new, []
            return new

    def jobs(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._jobs)

    def active_jobs(self, since: float) -> set[tuple[str, str]]:
        """Jobs with a step that ended after `since`."""
        with self._lock:
            return {k for k, r in self._jobs.items() if any(tl.end > since for tl in r)}


OVERLAP_TOLERANCE = 1.0  # seconds two consecutive steps of a job may overlap (anchor error)


def _latest_anchors(posted: list[tuple[tuple[str, str], Timeline]]) -> list:
    """Drop a step that a later-posted step of the same job overlaps: both were anchored at
    one read time (a backlog read in several chunks), so only the later one is right."""
    out = []
    for i, (labels, tl) in enumerate(posted):
        later = (t for lab, t in posted[i + 1 :] if lab == labels)
        if not any(t.start < tl.end - OVERLAP_TOLERANCE for t in later):
            out.append((labels, tl))
    return out


class WindowJoiner:
    """The NVML source's half: one GpuWindowJoin, counters per job."""

    def __init__(self, board: WindowBoard, horizon: float = 900.0):
        self.board = board
        self.horizon = horizon
        # one history: its per-GPU `done` mark keeps a GPU-second from counting twice
        self._join = GpuWindowJoin(horizon)
        # the same steps' windows (as the busy join placed them) over each GPU's throttle
        # readings: 1 while its clocks were held down by heat or hardware, else 0 (issue 23)
        self._throttle = GpuWindowJoin(horizon)
        self._skipped_logged = False
        self._pending: list[tuple[tuple[str, str], Timeline]] = []
        self._wall: dict[tuple[str, str], float] = {}  # step seconds joined, per job
        # per job: ((group, role) -> (busy, available), step seconds); replaced whole after
        # each join, so the job view reads it from another thread without a lock
        self.view: dict[
            tuple[str, str], tuple[dict[tuple[str, str], tuple[float, float]], float]
        ] = {}

    def add_samples(self, gpu: str, role: str, samples: Iterable[tuple[float, float]]) -> None:
        self._join.add_samples(gpu, role, samples)

    def add_throttle(self, gpu: str, role: str, samples: Iterable[tuple[float, float]]) -> None:
        self._throttle.add_samples(gpu, role, samples)

    def forget(self, gpu: str) -> None:
        self._join.forget(gpu)
        self._throttle.forget(gpu)

    def join(self, now: float) -> None:
        """Attribute the steps posted so far whose end every GPU's samples have reached (a
        step's last moments may still be in NVML's buffer when its record arrives)."""
        pending = self._pending + self.board.take_new()
        covered = self._join.covered_until()
        if covered is None:
            self._pending = pending[-self.board.keep :]
            return
        pending = _latest_anchors(pending)
        new = [p for p in pending if p[1].end <= covered]
        self._pending = [p for p in pending if p[1].end > covered][-self.board.keep :]
        if not new:
            return
        if len(self.board.active_jobs(now - self.horizon)) > 1:
            if not self._skipped_logged:
                log.warning(
                    "more than one verl job ran here recently: GPU time by step window is not "
                    "joined (NVML cannot tell which job a GPU serves)",
                    extra={"collector": "nvml"},
                )
                self._skipped_logged = True
            return
        # a fully-async record's sub-steps (one step posted more than once, in a row) are
        # placed together (timeline.place_substeps); every other step alone
        runs: list[tuple[tuple[str, str], list[Timeline]]] = []
        for labels, tl in new:
            if runs and runs[-1][0] == labels and runs[-1][1][-1].step == tl.step:
                runs[-1][1].append(tl)
            else:
                runs.append((labels, [tl]))
        for labels, tls in runs:
            if len(tls) == 1:
                placed: tuple[Timeline, ...] = (self._join.add_timeline(tls[0], labels),)
            else:
                placed = self._join.add_timelines(tls, labels)
            for tl in placed:  # throttled time per window, as placed (issue 23)
                self._throttle.attribute(tl, labels)
            for tl in tls:
                self._wall[labels] = self._wall.get(labels, 0.0) + (tl.end - tl.start)
        # counters only for the jobs the board keeps (at most its max_jobs): a head that
        # names a new job at every answer cannot grow this worker's series
        kept = self.board.jobs()
        self._join.retain(kept)
        self._wall = {k: v for k, v in self._wall.items() if k in kept}
        view: dict = {}
        for (job, group, role), value in self._join.counters().items():
            view.setdefault(job, ({}, self._wall.get(job, 0.0)))[0][group, role] = value
        self.view = view

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        for (job, group, role), (busy, total) in sorted(self._join.counters().items()):
            labels = (*job, group, role)
            out.append(Sample(BUSY_METRIC, labels, busy))
            out.append(Sample(TOTAL_METRIC, labels, total))
        for (job, group, role), (throttled, _avail) in sorted(self._throttle.counters().items()):
            out.append(Sample(THROTTLED_METRIC, (*job, group, role), throttled))
        return out


# -- multi-node: the head's recent windows, read by worker sidecars ------------------------------
WINDOWS_PATH = "/api/v1/windows"
MAX_BODY = 4 << 20  # bytes a worker reads from the head at most; the head's answer fits it
MAX_INTERVALS = 64  # intervals per step a worker accepts
MAX_LABEL_CHARS = 256  # project and experiment (a file job's names: a directory name's length)
MAX_TIMER_CHARS = 256  # a timer's name (a record key's limit)
MAX_STEPS_PER_JOB = 1024  # steps per job in an answer; more rejects it (a head keeps 32)
_GROUPS = frozenset(GROUPS)


def _sendable(text: str, limit: int) -> str:
    """A name as `parse_board` accepts it (cleaned, cut to `limit`): a head never sends an
    answer its workers refuse because one job logged an odd timer key."""
    return clean_label(text)[0][:limit] or "?"


def timeline_json(tl: Timeline) -> dict:
    return {
        "step": tl.step,
        "start": tl.start,
        "end": tl.end,
        "error_seconds": tl.error_seconds,
        "intervals": [
            [_sendable(iv.timer, MAX_TIMER_CHARS), iv.group, iv.start, iv.end]
            for iv in tl.intervals[:MAX_INTERVALS]
        ],
    }


def board_json(board: WindowBoard, max_bytes: int = MAX_BODY) -> bytes:
    """The board as the windows API's JSON answer, at most `max_bytes` long: when every
    job's kept steps do not fit (64 jobs x 32 steps x 39 timers is ~9 MB), the oldest steps
    are left out, so a worker always gets the newest ones (it reads at most MAX_BODY)."""
    jobs = board.snapshot()
    encoded = [
        (
            _sendable(p, MAX_LABEL_CHARS),
            _sendable(e, MAX_LABEL_CHARS),
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


def _label(x: object, what: str, limit: int = MAX_LABEL_CHARS) -> str:
    """A label value from the head, checked as a pushed job's name is (but up to 256
    characters: a file job is named after directories): a non-empty string, valid UTF-8 (no
    lone surrogate), no control character."""
    if not isinstance(x, str) or not x or len(x) > limit:
        raise ValueError(f"{what} is not a string of 1 to {limit} characters")
    if clean_label(x)[1] is not None:
        raise ValueError(f"{what} holds a control character or is not valid UTF-8")
    return x


def _list(x: object, what: str, limit: int) -> list:
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
    table's (`GROUPS`); timer names valid label text of at most MAX_TIMER_CHARS; steps
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
                        _label(timer, "a timer", MAX_TIMER_CHARS),
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
    the board (any number of workers polling cost one encoding) and fits MAX_BODY."""

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
