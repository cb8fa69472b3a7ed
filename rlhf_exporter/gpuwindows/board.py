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
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ..diagnosis.gpujoin import GpuWindowJoin
from ..diagnosis.timeline import Recent, Timeline
from ..metrics.snapshot import Sample

log = logging.getLogger(__name__)

BUSY_METRIC = "rlhf_window_gpu_busy_seconds_total"
TOTAL_METRIC = "rlhf_window_gpu_seconds_total"
MAX_JOBS = 64  # jobs the board remembers (the least recently posted goes first)


class WindowBoard:
    """Recent step timelines per job (thread-safe: jobs post, NVML's poll thread reads)."""

    def __init__(self, keep: int = 32, max_jobs: int = MAX_JOBS):
        self.keep = keep
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._jobs: OrderedDict[tuple[str, str], Recent] = OrderedDict()
        self._new: list[tuple[tuple[str, str], Timeline]] = []
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

    def forget(self, gpu: str) -> None:
        self._join.forget(gpu)

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
        for labels, tl in new:
            self._join.add_timeline(tl, labels)
            self._wall[labels] = self._wall.get(labels, 0.0) + (tl.end - tl.start)
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
        return out


# -- multi-node: the head's recent windows, read by worker sidecars ------------------------------
WINDOWS_PATH = "/api/v1/windows"
MAX_BODY = 4 << 20  # bytes a worker reads from the head at most
MAX_INTERVALS = 64  # intervals per step a worker accepts


def timeline_json(tl: Timeline) -> dict:
    return {
        "step": tl.step,
        "start": tl.start,
        "end": tl.end,
        "error_seconds": tl.error_seconds,
        "intervals": [[iv.timer, iv.group, iv.start, iv.end] for iv in tl.intervals],
    }


def board_json(board: WindowBoard) -> dict:
    jobs = board.snapshot()
    return {
        "jobs": [
            {"project": p, "experiment": e, "steps": [timeline_json(tl) for tl in tls]}
            for (p, e), tls in jobs
        ]
    }


def parse_board(doc: object) -> list[tuple[tuple[str, str], Timeline]]:
    """The head's answer, checked: anything malformed raises ValueError."""
    from ..diagnosis.timeline import Interval

    def num(x: object) -> float:
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            raise ValueError(f"not a number: {x!r}")
        try:
            value = float(x)  # an int too big for a float raises OverflowError
        except OverflowError:
            raise ValueError(f"not a number: {x!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"not a number: {x!r}")
        return value

    def text(x: object) -> str:
        if not isinstance(x, str) or len(x) > 256:
            raise ValueError(f"not a label: {x!r}")
        return x

    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise ValueError("no jobs list")
    out = []
    for job in doc["jobs"]:
        labels = (text(job["project"]), text(job["experiment"]))
        for st in job["steps"]:
            ivs = st["intervals"]
            if not isinstance(ivs, list) or len(ivs) > MAX_INTERVALS:
                raise ValueError("bad intervals")
            step = st["step"]
            if type(step) is not int:
                raise ValueError(f"bad step: {step!r}")
            intervals = tuple(Interval(text(t), text(g), num(a), num(b)) for t, g, a, b in ivs)
            tl = Timeline(
                step, num(st["start"]), num(st["end"]), intervals, num(st["error_seconds"])
            )
            out.append((labels, tl))
    return out


class WindowsApi:
    """`GET /api/v1/windows` on the head sidecar: its jobs' recent step windows, read-only,
    behind the push token when one is set (`Authorization: Bearer <token>`, as for push)."""

    def __init__(self, board: WindowBoard, token: str | None):
        self.board = board
        self._token = token.encode() if token else None

    def handle(self, authorization: str | None) -> tuple[int, dict]:
        if self._token is not None:
            import hmac

            scheme, _, given = (authorization or "").partition(" ")
            ok = hmac.compare_digest(given.strip().encode(), self._token)
            if scheme.lower() != "bearer" or not ok:
                return 401, {"error": "missing or wrong 'Authorization: Bearer <token>'"}
        return 200, board_json(self.board)
