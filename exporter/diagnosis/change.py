"""§4 of the decision table: is a slower step a workload shift or a regression?

The baseline is the job's own recent past: per-field medians over the last N usable steps
of the same run. A fresh `Baseline` belongs to each run.
"""
from __future__ import annotations

from collections import deque
from typing import Mapping, NamedTuple

from .thresholds import GROUPS, Thresholds
from .windows import Windows

NONE, WORKLOAD_SHIFT, REGRESSION = "none", "workload_shift", "regression"
CHANGES = (NONE, WORKLOAD_SHIFT, REGRESSION)
COST_GROUPS = tuple(g for g in GROUPS if g != "checkpoint")
"""Groups that have a per-token cost; also the tie order for `regressed`."""


class Point(NamedTuple):
    """One step, as the baseline sees it."""

    busy_seconds: float  # S' = S - save_checkpoint
    tokens_per_second: float  # K / S'
    costs: Mapping[str, float]  # group -> seconds per token


class Change(NamedTuple):
    change: str
    regressed: str | None
    point: Point | None  # this step, when it had K and S' > 0
    baseline: Point | None  # the medians it was compared with, when there were enough steps


def point_of(windows: Windows, tokens: float | None) -> Point | None:
    """The step as a baseline point, or None when it has no K or no positive S'."""
    if tokens is None:
        return None
    busy = windows.step_seconds - windows.counted.get("save_checkpoint", 0.0)
    if busy <= 0:
        return None
    gs = windows.group_seconds
    costs = {g: gs[g] / tokens for g in COST_GROUPS}
    return Point(busy, tokens / busy, costs)


class Baseline:
    """The last `th.baseline_steps` usable points of one run."""

    def __init__(self, th: Thresholds):
        self._th = th
        n = th.baseline_steps
        self._points: deque[Point] = deque(maxlen=n)
        self._busy: deque[float] = deque(maxlen=n)  # the same points, one field each,
        self._tps: deque[float] = deque(maxlen=n)  # so medians need no list building

    def __len__(self) -> int:
        return len(self._points)

    def judge(self, windows: Windows, tokens: float | None) -> Change:
        """Compare the step with the baseline, then add it to the baseline."""
        point = point_of(windows, tokens)
        if point is None:
            return Change(NONE, None, None, None)
        base = self.medians()
        self._points.append(point)
        self._busy.append(point.busy_seconds)
        self._tps.append(point.tokens_per_second)
        if base is None:
            return Change(NONE, None, point, None)
        return Change(*_compare(point, base, windows, tokens, self._th), point, base)

    def medians(self) -> Point | None:
        """The baseline now, or None with fewer than `min_baseline_steps` points."""
        points = self._points
        if len(points) < self._th.min_baseline_steps:
            return None
        return Point(_median(self._busy), _median(self._tps), _MedianCosts(tuple(points)))


class _MedianCosts(Mapping[str, float]):
    """Per-group median costs, computed on first use (most steps never need them)."""

    def __init__(self, points: tuple[Point, ...]):
        self._points = points
        self._costs: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._costs is None:
            pts = self._points
            self._costs = {g: _median([p.costs[g] for p in pts]) for g in COST_GROUPS}
        return self._costs

    def __getitem__(self, group: str) -> float:
        return self._get()[group]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(COST_GROUPS)


def _median(values) -> float:
    """The median; the mean of the middle two for an even count."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _compare(p: Point, base: Point, w: Windows, tokens: float, th: Thresholds):
    if (
        p.busy_seconds < th.step_time_ratio * base.busy_seconds
        and p.tokens_per_second > th.throughput_ratio * base.tokens_per_second
    ):
        return NONE, None
    significant = th.significant_share * p.busy_seconds
    if all(
        p.costs[g] <= th.cost_ratio * base.costs[g] and base.costs[g] > 0
        for g in COST_GROUPS
        if w.group_seconds[g] >= significant
    ):
        return WORKLOAD_SHIFT, None
    added = {g: (p.costs[g] - base.costs[g]) * tokens for g in COST_GROUPS}
    regressed = max(COST_GROUPS, key=lambda g: added[g])  # max() keeps the first of ties
    return REGRESSION, regressed
