"""Where the verl side and the NVML side of the GPU-window join meet.

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

from ..diagnosis.gpujoin import GpuWindowJoin
from ..diagnosis.timeline import Recent, Timeline
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


Posted = list[tuple[tuple[str, str], Timeline]]


def _latest_anchors(posted: Posted) -> Posted:
    """Drop a step that a later-posted step of the same job overlaps: both were anchored at
    one read time (a backlog read in several chunks), so only the later one is right."""
    out: Posted = []
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
        # readings: 1 while its clocks were held down by heat or hardware, else 0
        self._throttle = GpuWindowJoin(horizon)
        self._skipped_logged = False
        self._pending: list[tuple[tuple[str, str], Timeline]] = []
        self._wall: dict[tuple[str, ...], float] = {}  # step seconds joined, per job
        # per job: ((group, role) -> (busy, available), step seconds); replaced whole after
        # each join, so the job view reads it from another thread without a lock
        self.view: dict[
            tuple[str, ...], tuple[dict[tuple[str, str], tuple[float, float]], float]
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
        # placed together (substeps.place_substeps); every other step alone
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
            for tl in placed:  # throttled time per window, as placed
                self._throttle.attribute(tl, labels)
            for tl in tls:
                self._wall[labels] = self._wall.get(labels, 0.0) + (tl.end - tl.start)
        # counters only for the jobs the board keeps (at most its max_jobs): a head that
        # names a new job at every answer cannot grow this worker's series
        kept = self.board.jobs()
        self._join.retain(kept)
        self._wall = {k: v for k, v in self._wall.items() if k in kept}
        view: dict[tuple[str, ...], tuple[dict[tuple[str, str], tuple[float, float]], float]] = {}
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
