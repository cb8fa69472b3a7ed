"""rlhf_exporter/job/state.py: one job's state, in process (fast), against the catalog and the offline diagnoser."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rlhf_exporter.demo.simulator import DEMO_PLAN, REGIMES, records
from rlhf_exporter.diagnosis import CHANGES, COST_GROUPS, GROUPS, VERDICTS, BatchDiagnoser, Record
from rlhf_exporter.job.record_keys import GIB
from rlhf_exporter.job.series import verl_metric_names
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.catalog import BY_NAME
from tests.support.families import render_samples


def recs(plan, seed=0):
    return [Record(r["step"], r["data"]) for r in records(plan, seed)]


def by_name(job):
    out: dict[str, dict[tuple, float]] = {}
    for s in job.samples():
        out.setdefault(s.name, {})[s.labels] = s.value
    return out


def test_every_verl_metric_is_emitted_with_catalog_labels(thresholds):
    job = Job("p", "e", thresholds)
    job.feed(recs(DEMO_PLAN))
    # fully-async and pre-0.8 keys come from records the simulator does not write
    job.feed(
        [
            Record(
                10_000,
                {
                    "fully_async/trainer/idle_ratio": 0.25,
                    "fully_async/rollouter/idle_ratio": 0.5,
                    "perf/max_memory_allocated_gb": 2.0,
                    # verl 0.9 keys: aborted samples, fully-async processing time, resources
                    "response/aborted_ratio": 0.1,
                    "response_length_non_aborted/max": 900.0,
                    "fully_async/processing_time/max": 30.0,
                    "dynamic_resource/train_resource_utilization": 0.6,
                },
            )
        ]
    )
    job.set_framework("verl")  # as the source that read it detects it
    seen = by_name(job)
    assert set(seen) == verl_metric_names(), set(verl_metric_names()) ^ set(seen)
    for name, series in seen.items():
        for labels in series:
            assert len(labels) == len(BY_NAME[name].labels), name
            assert labels[:2] == ("p", "e")
    assert seen["rlhf_fully_async_idle_ratio"] == {
        ("p", "e", "trainer"): 0.25,
        ("p", "e", "rollouter"): 0.5,
    }
    assert seen["rlhf_memory_max_allocated_bytes"][("p", "e")] == 2.0 * GIB
    # the families build (types, label counts) without error
    assert render_samples(job.samples())


def test_one_hots_always_carry_every_verdict_and_kind(thresholds):
    job = Job("p", "e", thresholds)
    job.feed([Record(0, {"val-core/x": 1.0})])  # no classified step yet
    seen = by_name(job)
    assert {lab[2] for lab in seen["rlhf_bottleneck"]} == set(VERDICTS)
    assert sum(seen["rlhf_bottleneck"].values()) == 0
    assert {lab[2] for lab in seen["rlhf_change"]} == set(CHANGES)
    assert {lab[2] for lab in seen["rlhf_group_seconds_total"]} == set(GROUPS)
    assert {lab[2] for lab in seen["rlhf_regression_steps_total"]} == set(COST_GROUPS)
    job.feed(recs([(REGIMES["sync_bound"], 3)])[1:])
    seen = by_name(job)
    assert seen["rlhf_bottleneck"][("p", "e", "sync")] == 1.0
    assert sum(seen["rlhf_bottleneck"].values()) == 1.0
    assert seen["rlhf_bottleneck_reason"] == {("p", "e", "sync", "weight_sync"): 1.0}
    assert sum(seen["rlhf_change"].values()) == 1.0


def test_counters_match_the_offline_diagnoser(thresholds):
    rs = recs(DEMO_PLAN, seed=3)
    offline = list(BatchDiagnoser(thresholds).diagnose(rs))
    job = Job("p", "e", thresholds)
    job.feed(rs)
    seen = by_name(job)
    verdicts = Counter(d.verdict for d in offline)
    for v in VERDICTS:
        assert seen["rlhf_bottleneck_steps_total"][("p", "e", v)] == verdicts[v]
    changes = Counter(d.change.change for d in offline)
    for k in CHANGES:
        assert seen["rlhf_change_steps_total"][("p", "e", k)] == changes[k]
    regressed = Counter(d.change.regressed for d in offline if d.change.regressed)
    assert regressed, "the demo plan ends in a regression"
    for g in COST_GROUPS:
        assert seen["rlhf_regression_steps_total"][("p", "e", g)] == regressed[g]
    assert seen["rlhf_steps_total"][("p", "e")] == len({r.step for r in rs})
    assert seen["rlhf_step_seconds_total"][("p", "e")] == pytest.approx(
        sum(d.windows.step_seconds for d in offline)
    )
    assert seen["rlhf_tokens_total"][("p", "e")] == pytest.approx(sum(d.tokens for d in offline))
    last = offline[-1]
    assert seen["rlhf_bottleneck"][("p", "e", last.verdict)] == 1.0
    assert seen["rlhf_step"][("p", "e")] == last.step


def test_counters_carry_on_across_runs(thresholds):
    job = Job("p", "e", thresholds)
    rs = recs([(REGIMES["rollout_long_tail"], 6)])
    job.feed(rs)
    before = by_name(job)
    job.new_run()  # a truncated file that restarts at a *higher* step: still a new run
    job.feed([Record(r.step + 100, r.data) for r in rs])
    after = by_name(job)
    assert after["rlhf_run"][("p", "e")] == 1
    for name, series in before.items():
        if BY_NAME[name].type == "counter":
            for labels, value in series.items():
                assert after[name][labels] >= value, name
    assert after["rlhf_steps_total"][("p", "e")] == 2 * before["rlhf_steps_total"][("p", "e")]
    assert "rlhf_baseline_step_duration_seconds" in after  # 6 steps: the run has a baseline
    job.new_run()
    job.feed(rs[:3])  # the new run's first steps compare with nothing: a fresh baseline
    seen = by_name(job)
    assert seen["rlhf_run"][("p", "e")] == 2
    assert "rlhf_baseline_step_duration_seconds" not in seen
    assert "rlhf_baseline_group_cost_seconds_per_token" not in seen
    job.feed(rs)  # step numbers going down: the diagnoser opens another run by itself
    assert by_name(job)["rlhf_run"][("p", "e")] == 3


def test_samples_are_cached_until_new_input(thresholds):
    job = Job("p", "e", thresholds)
    job.feed(recs([(REGIMES["balanced"], 2)]))
    first = job.samples()
    assert job.samples() is first
    job.feed([Record(5, {"timing_s/step": 1.0})])
    assert job.samples() is not first


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)
_keys = st.sampled_from(
    [
        "timing_s/step",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/update_weights",
        "perf/total_num_tokens",
        "perf/mfu/actor",
        "timing_s/agent_loop/generate_sequences/max",
        "response_length/mean",
        "fully_async/trainer/idle_ratio",
        "perf/max_memory_reserved_gb",
    ]
)
_events = st.lists(
    st.one_of(
        st.just("new_run"),
        st.tuples(st.integers(0, 30), st.dictionaries(_keys, _values, max_size=6)),
    ),
    max_size=40,
)


@hsettings(max_examples=150, deadline=None)
@given(events=_events)
def test_counters_never_decrease_on_any_input(thresholds, events):
    """Any records (bad values included), any restarts: counters only grow, families stay valid."""
    job = Job("p", "e", thresholds)
    previous: dict = {}
    for event in events:
        if event == "new_run":
            job.new_run()
        else:
            job.feed([Record(*event)])
        now = {
            (s.name, s.labels): s.value for s in job.samples() if BY_NAME[s.name].type == "counter"
        }
        for key, value in previous.items():
            assert now[key] >= value, key
        assert (
            sum(v for (n, _), v in now.items() if n == "rlhf_bottleneck_steps_total")
            <= now[("rlhf_steps_total", ("p", "e"))]
        )
        previous = now
        render_samples(job.samples())  # always a valid set of families
