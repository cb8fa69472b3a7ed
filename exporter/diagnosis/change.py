"""§4 of the decision table (v2): is a slower step a workload shift or a regression?

Each group is judged on its own against the job's recent past: its time per unit of each of
its work measures (tokens, the longest response, tokens x sequence length, or one step),
compared with the median over the last N usable steps of the same run. A fresh `Baseline`
belongs to each run.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from .thresholds import GROUPS, Thresholds
from .values import num
from .windows import Windows

NONE, WORKLOAD_SHIFT, REGRESSION = "none", "workload_shift", "regression"
CHANGES = (NONE, WORKLOAD_SHIFT, REGRESSION)
COST_GROUPS = tuple(g for g in GROUPS if g != "checkpoint")
"""Groups that can regress; also the tie order for `regressed`."""

TOKENS, LONGEST_RESPONSE, TOKEN_LENGTH, STEP = "tokens", "longest_response", "token_length", "step"
MEASURES: Mapping[str, tuple[str, ...]] = {
    "rollout": (TOKENS, LONGEST_RESPONSE),  # generation waits for the longest sample
    "reward": (TOKENS,),
    "logprob": (TOKENS, TOKEN_LENGTH),  # per-token cost grows with sequence length
    "update": (TOKENS, TOKEN_LENGTH),
    "sync": (STEP,),  # weight sync moves the model, not tokens
    "other": (TOKENS,),
}
"""The work measures of each group (§4). A group's time is explained when it grew no faster
than at least one of them."""

MEASURE_MEANING: Mapping[str, str] = {
    TOKENS: "K = perf/total_num_tokens",
    LONGEST_RESPONSE: "Lmax = response_length/max",
    TOKEN_LENGTH: "K x L, L = prompt_length/mean + response_length/mean",
    STEP: "1 (seconds per step)",
}


class Work(NamedTuple):
    """A step's work measures; None where a measure is not usable (§4)."""

    tokens: float
    longest_response: float | None
    token_length: float | None
    step: float = 1.0


def work_of(tokens: float, data: Mapping[str, Any]) -> Work:
    """The work measures of a step whose K is `tokens` (> 0)."""
    longest = num(data.get("response_length/max"))
    prompt = num(data.get("prompt_length/mean"))
    response = num(data.get("response_length/mean"))
    token_length = None
    if prompt is not None and response is not None:
        token_length = tokens * (prompt + response)
    return Work(
        tokens,
        longest if longest else None,  # > 0 to be usable
        token_length if token_length else None,
    )


class Point(NamedTuple):
    """One step, as the baseline sees it."""

    busy_seconds: float  # S' = S - save_checkpoint (when it ran inside the step)
    tokens_per_second: float  # K / S'
    costs: Mapping[str, float]  # group -> seconds per token (the K measure)


class Change(NamedTuple):
    change: str
    regressed: str | None
    point: Point | None  # this step, when it had K and S' > 0
    baseline: Point | None  # the medians it was compared with, when there were enough steps
    excess: Mapping[str, float] | None = None  # regressed group -> seconds no measure explains


class _Step(NamedTuple):
    """What the baseline keeps of one usable step."""

    busy_seconds: float  # S'
    tokens_per_second: float  # K / S'
    seconds: Mapping[str, float]  # T(g) for every group
    work: Work


def point_of(windows: Windows, tokens: float | None) -> Point | None:
    """The step as a baseline point, or None when it has no K or no positive S'."""
    if tokens is None:
        return None
    busy = windows.busy_seconds
    if busy <= 0:
        return None
    return Point(busy, tokens / busy, _Costs(windows.group_seconds, tokens))


class _Costs(Mapping[str, float]):
    """A step's seconds per token by group, computed when read."""

    __slots__ = ("_seconds", "_tokens")

    def __init__(self, group_seconds: Mapping[str, float], tokens: float):
        self._seconds = group_seconds
        self._tokens = tokens

    def __getitem__(self, group: str) -> float:
        if group == "checkpoint":
            raise KeyError(group)
        return self._seconds[group] / self._tokens

    def __iter__(self) -> Iterator[str]:
        return iter(COST_GROUPS)

    def __len__(self) -> int:
        return len(COST_GROUPS)


class Baseline:
    """The last `th.baseline_steps` usable steps of one run."""

    def __init__(self, th: Thresholds):
        self._th = th
        self._steps: deque[_Step] = deque(maxlen=th.baseline_steps)
        self._busy: list[float] = []  # the same steps' S' and K/S', kept sorted,
        self._tps: list[float] = []  # so a median is an index, not a sort

    def __len__(self) -> int:
        return len(self._steps)

    def judge(
        self, windows: Windows, tokens: float | None, data: Mapping[str, Any] | None = None
    ) -> Change:
        """Compare the step with the baseline, then add it to the baseline.

        `data` is the step's record data, for the work measures other than K.
        """
        point = point_of(windows, tokens)
        if point is None or tokens is None:
            return Change(NONE, None, None, None)
        step = _Step(
            point.busy_seconds,
            point.tokens_per_second,
            windows.group_seconds,
            work_of(tokens, data or {}),
        )
        base = self.medians()
        if base is None:
            self._add(step)
            return Change(NONE, None, point, None)
        excess = _regressed(step, point.busy_seconds, base.busy_seconds, self._steps, self._th)
        self._add(step)
        th = self._th
        if excess:
            regressed = max(COST_GROUPS, key=lambda g: excess.get(g, -1.0))  # first of ties
            return Change(REGRESSION, regressed, point, base, excess)
        if (
            point.busy_seconds >= th.step_time_ratio * base.busy_seconds
            or point.tokens_per_second <= th.throughput_ratio * base.tokens_per_second
        ):
            return Change(WORKLOAD_SHIFT, None, point, base)
        return Change(NONE, None, point, base)

    def _add(self, step: _Step) -> None:
        steps = self._steps
        if len(steps) == steps.maxlen:  # the oldest step leaves the window
            oldest = steps[0]
            del self._busy[bisect_left(self._busy, oldest.busy_seconds)]
            del self._tps[bisect_left(self._tps, oldest.tokens_per_second)]
        steps.append(step)
        insort(self._busy, step.busy_seconds)
        insort(self._tps, step.tokens_per_second)

    def medians(self) -> Point | None:
        """The baseline now, or None with fewer than `min_baseline_steps` steps."""
        steps = self._steps
        if len(steps) < self._th.min_baseline_steps:
            return None
        return Point(_middle(self._busy), _middle(self._tps), _MedianCosts(tuple(steps)))


class _MedianCosts(Mapping[str, float]):
    """Per-group median seconds per token, computed on first use."""

    def __init__(self, steps: tuple[_Step, ...]):
        self._steps = steps
        self._costs: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._costs is None:
            steps = self._steps
            self._costs = {
                g: _median([s.seconds[g] / s.work.tokens for s in steps]) for g in COST_GROUPS
            }
        return self._costs

    def __getitem__(self, group: str) -> float:
        return self._get()[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(COST_GROUPS)


def baseline_cost(
    steps: tuple[_Step, ...] | deque[_Step], group: str, measure: str, min_steps: int
) -> float | None:
    """The median of T(group) / measure over the baseline steps where the measure was
    usable, or None when fewer than `min_steps` had it (the measure is not used)."""
    values = []
    for s in steps:
        m = getattr(s.work, measure)
        if m is not None:
            values.append(s.seconds[group] / m)
    if len(values) < min_steps:
        return None
    return _median(values)


def _regressed(
    step: _Step, busy: float, base_busy: float, steps: deque[_Step], th: Thresholds
) -> dict[str, float]:
    """Every regressed group (§4) with its excess: the seconds that no used measure explains."""
    out: dict[str, float] = {}
    significant = th.significant_share * busy
    min_excess = th.min_excess * base_busy
    for group in COST_GROUPS:
        seconds = step.seconds[group]
        if seconds < significant:
            continue
        excess = _excess(group, seconds, step.work, steps, th)
        if excess is not None and excess >= min_excess:
            out[group] = excess
    return out


def _excess(
    group: str, seconds: float, work: Work, steps: deque[_Step], th: Thresholds
) -> float | None:
    """min over used measures of T(g) - baseline cost x m, or None when some used measure
    explains the time (the cost did not exceed cost_ratio x its baseline)."""
    excess: float | None = None
    for measure in MEASURES[group]:
        m = getattr(work, measure)
        if m is None:
            continue  # not usable in this step
        base = baseline_cost(steps, group, measure, th.min_baseline_steps)
        if base is None:
            continue  # not usable in enough baseline steps
        if not seconds / m > th.cost_ratio * base:  # a baseline of 0 counts as exceeded
            return None
        unexplained = seconds - base * m
        if excess is None or unexplained < excess:
            excess = unexplained
    return excess


def _median(values: list[float]) -> float:
    """The median; the mean of the middle two for an even count."""
    return _middle(sorted(values))


def _middle(s: list[float]) -> float:
    """The median of an already sorted list."""
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
