"""GPU busy time by step window and GPU role: NVML's timestamped samples joined to timelines.

Pure (no I/O). Each GPU's utilization samples (`nvmlDeviceGetSamples`: a sample at `t`
covers `(previous t, t]`) are kept for a bounded horizon; when a step's `Timeline` arrives
(its record comes after the step), every sample span overlapping one of its intervals adds
`overlap` to the available GPU-seconds of (interval group, GPU role) and `ratio x overlap`
to the busy ones. A span crossing a window edge is split by the overlap, so

    idle = available - busy           exactly, per (group, role), by construction;
    busy / available                  the true busy share of that window on that side.

Before the split, the step's untimed remainder R (driver work outside every timer) is
moved to where this node's GPUs were idle (`gpufit.place_untimed`, fed the busy time of
this node's GPUs summed per role); with no signal it stays spread evenly, as `rebuild` put
it. A fully-async record's sub-steps are placed together, their windows fitted to their
busy stretches (`add_timelines`, `substeps.place_substeps`).

Each moment of a GPU is attributed at most once (per GPU, time before the last attributed
step end is never attributed again). Samples older than the horizon, and time no step
covers (validation, checkpoints after `step`, gaps), are not attributed.

GPU roles: `rollout`, `trainer`, or `colocated` when one GPU holds processes of both (the
hybrid engine); `unknown` when no process could be matched (docs/gpu-roles.md).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

from .gpufit import place_untimed
from .substeps import place_substeps
from .timeline import Timeline

ROLLOUT, TRAINER, COLOCATED, UNKNOWN = "rollout", "trainer", "colocated", "unknown"
GPU_ROLES = (ROLLOUT, TRAINER, COLOCATED, UNKNOWN)
_ROLLOUT_SIDE = frozenset({"rollout", "agent_loop"})
_TRAINER_SIDE = frozenset({"trainer"})


def gpu_role(process_roles: Iterable[str]) -> str:
    """One GPU's role from the roles of the processes on it (docs/gpu-roles.md)."""
    roles = set(process_roles)
    rollout, trainer = bool(roles & _ROLLOUT_SIDE), bool(roles & _TRAINER_SIDE)
    if rollout and trainer:
        return COLOCATED
    if rollout:
        return ROLLOUT
    if trainer:
        return TRAINER
    return UNKNOWN


Key = tuple[tuple[str, ...], str, str]
"""(job, group, GPU role): what the join counts GPU-seconds by."""


class _Track:
    """One GPU's recent sample spans, in time order: span i is (ends[i-1], ends[i]]."""

    __slots__ = ("done", "ends", "ratios", "role")

    def __init__(self) -> None:
        self.ends: deque[float] = deque()
        self.ratios: deque[float] = deque()
        self.done = float("-inf")  # attributed up to here
        self.role = UNKNOWN


class GpuWindowJoin:
    """Per-GPU sample history and the (group, role) -> [busy, available] seconds counters."""

    def __init__(self, horizon: float = 900.0):
        self.horizon = horizon  # seconds of samples kept; a step longer than this is cut
        self._gpus: dict[str, _Track] = {}
        # (job, group, role) -> seconds; `job` is whatever the caller names a job by
        self.busy: dict[Key, float] = {}
        self.available: dict[Key, float] = {}

    def add_samples(self, gpu: str, role: str, samples: Iterable[tuple[float, float]]) -> None:
        """Samples of one GPU: (end time in epoch seconds, utilization ratio 0..1), each
        covering the time since the GPU's previous sample. Old ones beyond the horizon go."""
        track = self._gpus.get(gpu)
        if track is None:
            track = self._gpus[gpu] = _Track()
        track.role = role
        ends, ratios = track.ends, track.ratios
        for t, ratio in samples:
            if ends and t <= ends[-1]:
                continue
            ends.append(t)
            ratios.append(ratio)
        if ends:
            cut = ends[-1] - self.horizon
            while len(ends) > 1 and ends[1] <= cut:
                ends.popleft()
                ratios.popleft()

    def covered_until(self) -> float | None:
        """The time up to which every GPU's samples are in (None: no GPU yet)."""
        ends = [t.ends[-1] for t in self._gpus.values() if t.ends]
        return min(ends) if ends else None

    def forget(self, gpu: str) -> None:
        """A GPU that failed: its history restarts (a gap is never attributed)."""
        self._gpus.pop(gpu, None)

    def add_timeline(self, tl: Timeline, job: tuple[str, ...] = ()) -> Timeline:
        """Attribute every kept GPU's samples overlapping the step's windows to `job`, after
        placing its untimed remainder where the GPUs idled; returns the placed timeline."""
        tl = place_untimed(tl, self._busy_function(tl.start, tl.end))
        self.attribute(tl, job)
        return tl

    def attribute(self, tl: Timeline, job: tuple[str, ...] = ()) -> None:
        """Attribute every kept GPU's samples overlapping the step's windows to `job`, the
        windows as they are (already placed: another join's `add_timeline` result)."""
        for track in self._gpus.values():
            self._attribute(track, tl, job)

    def add_timelines(
        self, tls: Sequence[Timeline], job: tuple[str, ...] = ()
    ) -> tuple[Timeline, ...]:
        """Consecutive sub-steps of one fully-async record, placed together
        (`substeps.place_substeps`) and attributed; returns them placed."""
        if not tls:
            return ()
        placed = place_substeps(tls, self._busy_function(tls[0].start, tls[-1].end))
        for tl in placed:
            for track in self._gpus.values():
                self._attribute(track, tl, job)
        return placed

    def _busy_function(self, lo: float, hi: float) -> Callable[[float], tuple[float, ...]]:
        """t -> GPU-seconds busy up to t (from an origin at or before `lo`; read for t in
        [lo, hi]), summed over the GPUs of each role (one signal per role: the placement
        tells a rollout window from a training one by which GPUs are busy, not only how
        many): a sample span counts its ratio x its length."""
        parts: list[tuple[int, list[float], list[float], list[float]]] = []
        roles: dict[str, int] = {}
        for track in self._gpus.values():
            ends, ratios = track.ends, track.ratios
            n = len(ends)
            i = max(bisect_right(ends, lo), 1)
            if i >= n:
                continue
            xs, cum, rs = [ends[i - 1]], [0.0], []
            while i < n and ends[i - 1] < hi:
                s0, s1, ratio = ends[i - 1], ends[i], ratios[i]
                xs.append(s1)
                rs.append(ratio)
                cum.append(cum[-1] + ratio * (s1 - s0))
                i += 1
            parts.append((roles.setdefault(track.role, len(roles)), xs, cum, rs))

        def busy(t: float) -> tuple[float, ...]:
            total = [0.0] * len(roles)
            for r, xs, cum, rs in parts:
                j = bisect_right(xs, t) - 1
                if j < 0:
                    continue
                if j >= len(rs):
                    total[r] += cum[-1]
                else:
                    total[r] += cum[j] + rs[j] * (t - xs[j])
            return tuple(total)

        return busy

    def _attribute(self, track: _Track, tl: Timeline, job: tuple[str, ...]) -> None:
        ends, ratios = track.ends, track.ratios
        if len(ends) < 2:
            return
        role, busy, avail = track.role, self.busy, self.available
        lo = max(tl.start, track.done)
        for iv in tl.intervals:
            a, b = max(iv.start, lo), iv.end
            if b <= a:
                continue
            # span i covers (ends[i-1], ends[i]]; the first span that ends after a
            i = max(bisect_right(ends, a), 1)
            key = (job, iv.group, role)
            total = busy_s = 0.0
            n = len(ends)
            while i < n:
                s0, s1 = ends[i - 1], ends[i]
                if s0 >= b:
                    break
                overlap = min(s1, b) - max(s0, a)
                if overlap > 0.0:
                    total += overlap
                    busy_s += ratios[i] * overlap
                i += 1
            if total > 0.0:
                avail[key] = avail.get(key, 0.0) + total
                busy[key] = busy.get(key, 0.0) + busy_s
        if tl.end > track.done:
            track.done = tl.end

    def retain(self, jobs: Container[tuple[str, ...]]) -> None:
        """Keep the counters of these jobs only (a job the caller no longer tracks goes)."""
        if any(k[0] not in jobs for k in self.available):
            self.available = {k: v for k, v in self.available.items() if k[0] in jobs}
            self.busy = {k: v for k, v in self.busy.items() if k[0] in jobs}

    def counters(self) -> Mapping[Key, tuple[float, float]]:
        """(job, group, role) -> (busy seconds, available seconds), both monotonic."""
        return {k: (self.busy.get(k, 0.0), v) for k, v in self.available.items()}
