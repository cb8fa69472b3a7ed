"""§4 of the decision table (v2): is a slower step a workload shift or a regression?

Each group is judged on its own against the job's recent past: its time per unit of each of
its work measures (tokens, the longest response, tokens x sequence length, or one step),
compared with the median over the last N usable steps of the same run. A fresh `Baseline`
belongs to each run.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from .thresholds import GROUPS, Thresholds
from .values import num
from .windows import Windows

STEADY, WORKLOAD_SHIFT, REGRESSION = "steady", "workload_shift", "regression"
NONE = STEADY  # no change found; the kind was named "none" before (docs/metrics.md)
CHANGES = (STEADY, WORKLOAD_SHIFT, REGRESSION)
CONTRACT_NONE = "none"  # the decision table's word for STEADY in diagnose's JSON (§4, §5)


def contract_change(change: str) -> str:
    """A change kind as the decision table writes it in `diagnose`'s JSON and JSONL."""
    return CONTRACT_NONE if change == STEADY else change


COST_GROUPS = tuple(g for g in GROUPS if g != "checkpoint")
"""Groups that can regress; also the tie order for `regressed`."""

TOKENS, LONGEST_RESPONSE, TOKEN_LENGTH, STEP = "tokens", "longest_response", "token_length", "step"
BATCH_TOKENS, BATCHES = "batch_tokens", "batches"  # v4: DAPO's n generation batches
MEASURES: Mapping[str, tuple[str, ...]] = {
    "rollout": (TOKENS, LONGEST_RESPONSE, BATCH_TOKENS),  # generation waits for the longest sample
    "reward": (TOKENS, BATCH_TOKENS),  # DAPO generates and scores n batches, keeps one's tokens
    "logprob": (TOKENS, TOKEN_LENGTH),  # per-token cost grows with sequence length
    "update": (TOKENS, TOKEN_LENGTH),
    "sync": (STEP, BATCHES),  # weight sync moves the model, not tokens (0.6: once per batch)
    "other": (TOKENS,),
}
"""The work measures of each group (§4). A group's time is explained when it grew no faster
than at least one of them."""

MEASURE_MEANING: Mapping[str, str] = {
    TOKENS: "K = perf/total_num_tokens",
    LONGEST_RESPONSE: "Lmax = response_length/max",
    TOKEN_LENGTH: "K x L, L = prompt_length/mean + response_length/mean",
    STEP: "1 (seconds per step)",
    BATCH_TOKENS: "n × K, n = DAPO's generation batches",
    BATCHES: "n (DAPO's generation batches; verl 0.6 loads the weights once per batch)",
}


PAIRS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(
        [(g, m) for g, ms in MEASURES.items() for m in ms] + [(g, TOKENS) for g in COST_GROUPS]
    )
)
"""Every (group, measure) whose cost the baseline tracks: the measures of the table, plus
seconds per token for every group (exported as rlhf_*_cost_seconds_per_token)."""
_GROUP_PAIRS: Mapping[str, tuple[tuple[int, str], ...]] = {
    g: tuple((PAIRS.index((g, m)), m) for m in MEASURES[g]) for g in COST_GROUPS
}
_TOKEN_PAIR = {g: PAIRS.index((g, TOKENS)) for g in COST_GROUPS}


def work_of(
    tokens: float, data: Mapping[str, Any], batches: float | None = None
) -> dict[str, float | None]:
    """The work measures of a step whose K is `tokens` (> 0) and whose DAPO generation
    batches are `batches` (n, when usable); None where one is unusable (an input missing, or
    a value that is not > 0)."""
    longest = num(data.get("response_length/max"))
    prompt = num(data.get("prompt_length/mean"))
    response = num(data.get("response_length/mean"))
    token_length = None
    if prompt is not None and response is not None:
        token_length = tokens * (prompt + response)
    return {
        TOKENS: tokens,
        LONGEST_RESPONSE: longest or None,
        TOKEN_LENGTH: token_length or None,
        STEP: 1.0,
        BATCH_TOKENS: None if not batches else tokens * batches,
        BATCHES: batches or None,
    }


class Point(NamedTuple):
    """One step, or the baseline's medians, as the sidecar exports them."""

    busy_seconds: float  # S' = S - save_checkpoint (when it ran inside the step)
    tokens_per_second: float  # K / S'
    costs: Mapping[str, float]  # group -> seconds per token (the K measure)


class Change(NamedTuple):
    change: str
    regressed: str | None
    point: Point | None  # this step, when it had K and S' > 0
    baseline: Point | None  # the medians it was compared with, when there were enough steps
    excess: Mapping[str, float] | None = None  # regressed group -> seconds no measure explains


_Row = tuple[float | None, ...]
"""What the baseline keeps of one usable step: S', K/S', then the cost per PAIRS entry
(None where the measure is unusable)."""
_BUSY, _TPS, _COST0 = 0, 1, 2  # where each field sits in a _Row and in Baseline._sorted
_POINT_COSTS = tuple((g, _COST0 + i) for g, i in _TOKEN_PAIR.items())
_REGRESSIBLE = tuple((g, tuple((_COST0 + i, m) for i, m in _GROUP_PAIRS[g])) for g in COST_GROUPS)


class Baseline:
    """The last `th.baseline_steps` usable steps of one run.

    Every field the table takes a median of (S', K/S', each group's cost per measure) is
    kept in a sorted list, updated as a step enters and the oldest leaves: a median is an
    index, not a sort.
    """

    def __init__(self, th: Thresholds):
        self._th = th
        self._steps: deque[_Row] = deque(maxlen=th.baseline_steps)
        self._sorted: list[list[float]] = [[] for _ in range(_COST0 + len(PAIRS))]
        self._busy = self._sorted[_BUSY]
        self._tps = self._sorted[_TPS]
        self._costs = self._sorted[_COST0:]  # the same lists

    def __len__(self) -> int:
        return len(self._steps)

    def judge(
        self,
        windows: Windows,
        tokens: float | None,
        data: Mapping[str, Any] | None = None,
        batches: float | None = None,
    ) -> Change:
        """Compare the step with the baseline, then add it to the baseline.

        `data` is the step's record data, for the work measures other than K; `batches` is
        DAPO's n generation batches, when usable (the n measures, v4).
        """
        busy = windows.step_seconds - windows.checkpoint_seconds  # S' (busy_seconds)
        if tokens is None or busy <= 0:
            return Change(NONE, None, None, None)
        seconds = windows.group_seconds
        work = work_of(tokens, data or {}, batches)
        tps = tokens / busy
        row: _Row = (
            busy,
            tps,
            *[None if (m := work[measure]) is None else seconds[g] / m for g, measure in PAIRS],
        )
        point = Point(busy, tps, {g: seconds[g] / tokens for g in COST_GROUPS})
        th = self._th
        if len(self._steps) < th.min_baseline_steps:
            self._add(row)
            return Change(NONE, None, point, None)
        mids = self._middles()
        base_busy, base_tps = mids[_BUSY], mids[_TPS]
        assert base_busy is not None and base_tps is not None  # every step has S' and K/S'
        # a K pair's median is never None: K is usable in every step the baseline keeps
        base = Point(
            base_busy, base_tps, cast(dict[str, float], {g: mids[i] for g, i in _POINT_COSTS})
        )
        excess = self._regressed(seconds, work, busy, base_busy, mids)
        self._add(row)
        if excess:
            regressed = max(COST_GROUPS, key=lambda g: excess.get(g, -1.0))  # first of ties
            return Change(REGRESSION, regressed, point, base, excess)
        if busy >= th.step_time_ratio * base_busy or tps <= th.throughput_ratio * base_tps:
            return Change(WORKLOAD_SHIFT, None, point, base)
        return Change(NONE, None, point, base)

    def medians(self) -> Point | None:
        """The baseline now, or None with fewer than `min_baseline_steps` steps."""
        if len(self._steps) < self._th.min_baseline_steps:
            return None
        costs = {g: _middle(self._costs[i]) for g, i in _TOKEN_PAIR.items()}
        return Point(_middle(self._busy), _middle(self._tps), costs)

    def cost(self, group: str, measure: str) -> float | None:
        """The baseline cost of `group` per `measure`: the median over the baseline steps
        where the measure was usable, or None when fewer than `min_baseline_steps` had it
        (then the measure is not used)."""
        values = self._costs[PAIRS.index((group, measure))]
        return _middle(values) if len(values) >= self._th.min_baseline_steps else None

    def _middles(self) -> list[float | None]:
        """The median of every field of a _Row in one pass (S', K/S', then cost() of every
        PAIRS entry: _middle inlined; None where fewer than `min_baseline_steps` steps had
        the measure)."""
        least = self._th.min_baseline_steps
        return [
            None
            if (n := len(s)) < least
            else s[n >> 1]
            if n & 1
            else (s[(n >> 1) - 1] + s[n >> 1]) / 2
            for s in self._sorted
        ]

    def _regressed(
        self,
        seconds: Mapping[str, float],
        work: Mapping[str, float | None],
        busy: float,
        base_busy: float,
        mids: list[float | None],
    ) -> dict[str, float]:
        """Every regressed group (§4) with its excess: the seconds no used measure explains.
        `mids`: the baseline's medians (`_middles()`)."""
        th = self._th
        out: dict[str, float] = {}
        significant = th.significant_share * busy
        min_excess = th.min_excess * base_busy
        cost_ratio = th.cost_ratio
        for group, pairs in _REGRESSIBLE:
            t = seconds[group]
            if t < significant:
                continue
            excess: float | None = None
            for i, measure in pairs:
                m = work[measure]
                base = mids[i]
                if m is None or base is None:
                    continue  # not used: unusable in this step or in too few baseline steps
                if not t / m > cost_ratio * base:  # a baseline of 0 counts as exceeded
                    excess = None
                    break  # this measure explains the time
                unexplained = t - base * m
                if excess is None or unexplained < excess:
                    excess = unexplained
            if excess is not None and excess >= min_excess:
                out[group] = excess
        return out

    def _add(self, row: _Row) -> None:
        steps, lists = self._steps, self._sorted
        if len(steps) == steps.maxlen:  # the oldest step leaves the window as `row` enters
            for values, old, new in zip(lists, steps[0], row):
                if old is not None:
                    del values[bisect_left(values, old)]
                if new is not None:
                    insort(values, new)
        else:
            for values, new in zip(lists, row):
                if new is not None:
                    insort(values, new)
        steps.append(row)


def _middle(s: list[float]) -> float:
    """The median of a sorted list; the mean of the middle two for an even count."""
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
