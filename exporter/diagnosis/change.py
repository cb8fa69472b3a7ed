"""§4 of the decision table: is a slower step a workload shift or a regression?

The baseline is the job's own recent past: per-field medians over the last N usable steps
of the same run. A fresh `Baseline` belongs to each run.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

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
    return Point(busy, tokens / busy, _Costs(windows.group_seconds, tokens))


class _Costs(Mapping[str, float]):
    """A step's seconds per token by group, computed when read (most steps never are)."""

    __slots__ = ("_seconds", "_tokens")

    def __init__(self, group_seconds: Mapping[str, float], tokens: float):
        self._seconds = group_seconds
        self._tokens = tokens

    def __getitem__(self, group: str) -> float:
        if group == "checkpoint":
            raise KeyError(group)
        return self._seconds[group] / self._tokens

    def __iter__(self):
        return iter(COST_GROUPS)

    def __len__(self) -> int:
        return len(COST_GROUPS)


class Baseline:
    """The last `th.baseline_steps` usable points of one run."""

    def __init__(self, th: Thresholds):
        self._th = th
        self._points: deque[Point] = deque(maxlen=th.baseline_steps)
        self._busy: list[float] = []  # the same points' S' and K/S', kept sorted,
        self._tps: list[float] = []  # so a median is an index, not a sort

    def __len__(self) -> int:
        return len(self._points)

    def judge(self, windows: Windows, tokens: float | None) -> Change:
        """Compare the step with the baseline, then add it to the baseline."""
        point = point_of(windows, tokens)
        if point is None:
            return Change(NONE, None, None, None)
        base = self.medians()
        self._add(point)
        if base is None:
            return Change(NONE, None, point, None)
        return Change(*_compare(point, base, windows, tokens, self._th), point, base)

    def _add(self, point: Point) -> None:
        points = self._points
        if len(points) == points.maxlen:  # the oldest point leaves the window
            oldest = points[0]
            del self._busy[bisect_left(self._busy, oldest.busy_seconds)]
            del self._tps[bisect_left(self._tps, oldest.tokens_per_second)]
        points.append(point)
        insort(self._busy, point.busy_seconds)
        insort(self._tps, point.tokens_per_second)

    def medians(self) -> Point | None:
        """The baseline now, or None with fewer than `min_baseline_steps` points."""
        points = self._points
        if len(points) < self._th.min_baseline_steps:
            return None
        return Point(_middle(self._busy), _middle(self._tps), _MedianCosts(tuple(points)))


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
    return _middle(sorted(values))


def _middle(s: list[float]) -> float:
    """The median of an already sorted list."""
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
