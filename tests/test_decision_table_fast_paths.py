"""The decision table's fast paths (issue 37) against plain reference code.

`Baseline` keeps sorted lists updated step by step and reads every median in one pass;
the reference below keeps the raw steps and sorts each median from scratch, as §4 reads.
`step_timers` looks at a key set once for `timers()` and `separated_trainer()`;
`shown_evidence(data, seen)` skips keys already seen. Each must say exactly what the plain
code says, float for float, on random step sequences.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis.advice import EVIDENCE_KEYS, shown_evidence
from rlhf_exporter.diagnosis.change import (
    COST_GROUPS,
    MEASURES,
    NONE,
    PAIRS,
    REGRESSION,
    TOKENS,
    WORKLOAD_SHIFT,
    Baseline,
    Change,
    Point,
    work_of,
)
from rlhf_exporter.diagnosis.windows import (
    Windows,
    separated_trainer,
    split,
    step_timers,
    timers,
)
from rlhf_exporter.thresholds_file import load_thresholds

TH = load_thresholds()


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class ReferenceBaseline:
    """§4 as written: the last N usable steps, each median sorted from scratch."""

    def __init__(self) -> None:
        self.steps: deque[tuple[float, float, dict[tuple[str, str], float | None]]] = deque(
            maxlen=TH.baseline_steps
        )

    def _cost(self, pair: tuple[str, str]) -> float | None:
        values = [c[pair] for _, _, c in self.steps if c[pair] is not None]
        return _median(values) if len(values) >= TH.min_baseline_steps else None  # type: ignore[arg-type]

    def judge(self, w: Windows, tokens: float | None, data: dict[str, Any]) -> Change:
        busy = w.busy_seconds
        if tokens is None or busy <= 0:
            return Change(NONE, None, None, None)
        seconds = w.group_seconds
        work = work_of(tokens, data)
        costs = {p: None if work[p[1]] is None else seconds[p[0]] / work[p[1]] for p in PAIRS}  # type: ignore[operator]
        point = Point(busy, tokens / busy, {g: seconds[g] / tokens for g in COST_GROUPS})
        if len(self.steps) < TH.min_baseline_steps:
            self.steps.append((busy, tokens / busy, costs))
            return Change(NONE, None, point, None)
        base = Point(
            _median([b for b, _, _ in self.steps]),
            _median([t for _, t, _ in self.steps]),
            {g: self._cost((g, TOKENS)) for g in COST_GROUPS},  # type: ignore[misc]
        )
        excess = {}
        for g in COST_GROUPS:
            t = seconds[g]
            if t < TH.significant_share * busy:
                continue
            unexplained: float | None = None
            for m in MEASURES[g]:
                b = self._cost((g, m))
                if work[m] is None or b is None:
                    continue
                if not t / work[m] > TH.cost_ratio * b:  # type: ignore[operator]
                    unexplained = None
                    break
                u = t - b * work[m]  # type: ignore[operator]
                unexplained = u if unexplained is None else min(unexplained, u)
            if unexplained is not None and unexplained >= TH.min_excess * base.busy_seconds:
                excess[g] = unexplained
        self.steps.append((busy, tokens / busy, costs))
        if excess:
            worst = max(COST_GROUPS, key=lambda g: excess.get(g, -1.0))
            return Change(REGRESSION, worst, point, base, excess)
        if (
            busy >= TH.step_time_ratio * base.busy_seconds
            or point.tokens_per_second <= TH.throughput_ratio * base.tokens_per_second
        ):
            return Change(WORKLOAD_SHIFT, None, point, base)
        return Change(NONE, None, point, base)


seconds = st.one_of(st.just(0.0), st.floats(0.01, 200.0))
maybe = st.one_of(st.none(), st.floats(0.0, 4000.0), st.just(-1.0), st.just(float("nan")))
a_step = st.fixed_dictionaries(
    {
        "timing_s/step": st.floats(0.5, 600.0),
        "timing_s/gen": seconds,
        "timing_s/old_log_prob": seconds,
        "timing_s/update_actor": seconds,
        "timing_s/update_weights": seconds,
        "timing_s/save_checkpoint": st.one_of(st.none(), seconds),
        "perf/total_num_tokens": st.one_of(st.floats(1.0, 1e7), st.none(), st.just(0)),
        "response_length/max": maybe,
        "response_length/mean": maybe,
        "prompt_length/mean": maybe,
    }
)


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _same(a: object, b: object) -> bool:
    return repr(a) == repr(b)  # floats bit for bit (repr round-trips), NaN equal to NaN


@settings(max_examples=200, deadline=None)
@given(
    st.lists(a_step, min_size=1, max_size=40) | st.lists(a_step, min_size=12, max_size=30),
    st.integers(0, 6),
)
def test_baseline_equals_the_reference_on_random_steps(steps, shifted_at) -> None:
    fast, ref = Baseline(TH), ReferenceBaseline()
    for i, raw in enumerate(steps):
        data = _clean(raw)
        if i % 7 == shifted_at:  # a sudden regime: everything 3x slower
            data = {k: v * 3 if k.startswith("timing_s/") else v for k, v in data.items()}
        all_timers = timers(data)
        w = split(data["timing_s/step"], all_timers, TH, separated_trainer(all_timers, data, TH))
        tokens = data.get("perf/total_num_tokens") or None
        got, want = fast.judge(w, tokens, data), ref.judge(w, tokens, data)
        assert _same(got, want), (i, got, want)


keys = st.sampled_from(
    [
        "timing_s/gen",
        "timing_s/timing_s/param_sync",
        "timing_s/agent_loop/generate_sequences/max",
        "agent_loop/slowest/tool_calls",
        "fully_async/count",
        "timing_s/update_actor",
        "perf/mfu/actor",
        "perf/mfu/actor_infer",
        *sorted(EVIDENCE_KEYS),
    ]
)
values = st.one_of(st.floats(allow_nan=True), st.integers(-2, 5), st.none(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(keys, values, max_size=12), min_size=1, max_size=20))
def test_one_look_at_the_key_set_equals_timers_and_separated_trainer(records) -> None:
    seen: set[str] = set()
    plain: set[str] = set()
    for data in records:
        all_timers, separated = step_timers(data, TH)
        assert _same(all_timers, timers(data))
        assert separated == separated_trainer(timers(data), data, TH)
        seen |= shown_evidence(data, seen)
        plain |= shown_evidence(data)
        assert seen == plain
