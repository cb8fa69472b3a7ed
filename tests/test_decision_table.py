"""Every row of the decision table (docs/decision-table.md), on records built here."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis import (
    BatchDiagnoser,
    Record,
    StreamDiagnoser,
    Thresholds,
    classify,
    split,
    timers,
)
from rlhf_exporter.diagnosis.change import Baseline
from rlhf_exporter.thresholds_file import default_document, load_thresholds

TH = load_thresholds()


def step(**timers_and_keys) -> dict:
    """A record's data: keyword `x=1.0` becomes `timing_s/x`, `k__y` a verbatim key `k/y`."""
    data = {}
    for key, value in timers_and_keys.items():
        if "__" in key:
            data[key.replace("__", "/")] = value
        else:
            data[f"timing_s/{key}"] = value
    return data


def diag(data: dict, th: Thresholds = TH):
    return classify(0, 1, data, Baseline(th), th)


# -- §3 verdicts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timer,group",
    [
        ("gen", "rollout"),
        ("gen_max", "rollout"),
        ("wait_for_enough_samples", "rollout"),
        ("switch_wait", "rollout"),
        ("reward", "reward"),
        ("old_log_prob", "logprob"),
        ("ref", "logprob"),
        ("values", "logprob"),
        ("update_actor", "update"),
        ("update_critic", "update"),
        ("update_weights", "sync"),
        ("sync_rollout_weights", "sync"),
        ("param_sync", "sync"),
        ("switch_to_trainer", "sync"),
        ("switch_to_rollout", "sync"),
        ("adv", "other"),
        ("dump_rollout_generations", "other"),
        ("some_new_timer", "other"),
    ],
)
def test_each_timer_lands_in_its_group(timer, group):
    d = diag(step(step=10.0, **{timer: 8.0}))
    assert d.verdict == group
    assert d.windows.shares[group] == pytest.approx(0.8 if group != "other" else 1.0)


def test_balanced_when_largest_share_below_min_share():
    d = diag(
        step(step=10.0, gen=3.4, update_actor=2.0, old_log_prob=2.0, update_weights=1.3, adv=1.3)
    )
    assert d.windows.shares["rollout"] == pytest.approx(0.34)
    assert (d.verdict, d.reason) == ("balanced", None)


def test_balanced_when_margin_below_min_margin():
    d = diag(step(step=10.0, gen=4.5, update_actor=4.1, adv=1.4))
    assert (d.verdict, d.reason) == ("balanced", None)
    d = diag(step(step=10.0, gen=4.5, update_actor=3.9, adv=1.6))
    assert d.verdict == "rollout"


def test_exact_tie_at_the_top_is_balanced():
    assert diag(step(step=10.0, gen=5.0, update_actor=5.0)).verdict == "balanced"


@pytest.mark.parametrize("s", [None, 0, 0.0, -1.0, True, "12", [12.0], float("nan"), float("inf")])
def test_no_usable_step_time_is_not_classified(s):
    assert diag({"timing_s/step": s, "timing_s/gen": 5.0}) is None
    assert diag({"timing_s/gen": 5.0}) is None


def test_perf_time_per_step_is_not_a_fallback_for_s():
    assert diag({"perf/time_per_step": 10.0, "timing_s/gen": 9.0}) is None


def test_s_without_any_timer_is_other_untimed_with_share_one():
    d = diag(step(step=7.0))
    assert (d.verdict, d.reason) == ("other", "untimed")
    assert d.windows.shares["other"] == 1.0
    assert d.windows.untimed_seconds == 7.0


# -- §2 windows ----------------------------------------------------------------------------


def test_untimed_remainder_goes_to_other_and_shares_sum_to_one():
    d = diag(step(step=10.0, gen=6.0, update_actor=2.0))
    assert d.windows.untimed_seconds == pytest.approx(2.0)
    assert d.windows.group_seconds["other"] == pytest.approx(2.0)
    assert sum(d.windows.shares.values()) == pytest.approx(1.0)


def test_timers_summing_past_s_divide_by_their_sum():
    d = diag(step(step=10.0, gen=9.0, update_actor=3.0))
    assert d.windows.untimed_seconds == 0.0
    assert d.windows.shares["rollout"] == pytest.approx(9.0 / 12.0)


@pytest.mark.parametrize(
    "timer",
    [
        "testing",
        "start_profile",
        "stop_profile",
        "generate_async",
        "generation_timing/max",
        "generation_timing/min",
        "generation_timing/topk_ratio",
    ],
)
def test_timers_outside_the_step_are_ignored(timer):
    d = diag(step(step=10.0, gen=5.0, update_actor=1.0, **{timer: 50.0}))
    assert d.verdict == "rollout"
    assert d.windows.shares["rollout"] == pytest.approx(0.5)
    assert timer not in d.windows.counted


def test_remax_gen_max_runs_beside_gen_in_rollout():
    # v3: verl <= 0.7.1's REMAX times its greedy baseline generation after `gen`, not in it
    d = diag(step(step=10.0, gen=3.0, gen_max=2.0, update_actor=4.0))
    assert d.windows.counted["gen_max"] == 2.0
    assert d.windows.group_seconds["rollout"] == pytest.approx(5.0)
    assert d.verdict == "rollout" and d.windows.untimed_seconds == pytest.approx(1.0)


V06 = dict(step=10.0, gen=7.0, generate_sequences=5.0, update_actor=2.0)
V06_STATS = {
    "timing_s/generation_timing/max": 5.5,
    "timing_s/generation_timing/min": 4.0,
    "timing_s/generation_timing/topk_ratio": 0.1,
}


def test_v06_sync_rollout_splits_gen_into_generation_and_weight_load():
    d = diag({**step(**V06), **V06_STATS})
    assert d.windows.counted == {
        "generate_sequences": 5.0,
        "gen_weight_load": 2.0,
        "update_actor": 2.0,
    }
    assert d.windows.group_seconds["rollout"] == pytest.approx(5.0)
    assert d.windows.group_seconds["sync"] == pytest.approx(2.0)
    assert d.windows.untimed_seconds == pytest.approx(1.0)
    assert d.verdict == "rollout"
    # a long weight load is `sync`/`weight_sync`, not rollout
    slow = diag(step(step=10.0, gen=8.0, generate_sequences=2.0, update_actor=1.0))
    assert (slow.verdict, slow.reason) == ("sync", "weight_sync")
    # the sync part is not an `update_weights` timer: 0.6 saves its checkpoint after `step`
    ckpt = diag(step(step=10.0, gen=7.0, generate_sequences=5.0, save_checkpoint=1.0))
    assert ckpt.windows.checkpoint_seconds == 0.0


@pytest.mark.parametrize(
    "timers,rollout,counted",
    [
        # larger than gen: gen counts alone, generate_sequences is ignored
        (dict(gen=5.0, generate_sequences=6.0), 5.0, {"gen": 5.0}),
        # without gen: ignored
        (dict(generate_sequences=6.0), 0.0, {}),
        # unusable: gen counts alone
        (dict(gen=5.0, generate_sequences=float("nan")), 5.0, {"gen": 5.0}),
        (dict(gen=5.0, generate_sequences=-1.0), 5.0, {"gen": 5.0}),
        # equal: the weight load is 0 s
        (
            dict(gen=5.0, generate_sequences=5.0),
            5.0,
            {"generate_sequences": 5.0, "gen_weight_load": 0.0},
        ),
        # unusable gen: ignored as without gen
        (dict(gen=None, generate_sequences=6.0), 0.0, {}),
    ],
)
def test_generate_sequences_is_ignored_when_larger_than_gen_or_without_it(timers, rollout, counted):
    d = diag(step(step=10.0, **timers))
    assert dict(d.windows.counted) == counted
    assert d.windows.group_seconds["rollout"] == pytest.approx(rollout)
    assert d.windows.group_seconds["sync"] == 0.0


def test_the_sidecar_exports_the_weight_load_as_a_phase():
    from rlhf_exporter.job.state import Job

    job = Job("p", "e", TH)
    job.feed([Record(1, {**step(**V06), **V06_STATS})])
    phases = {
        s.labels[2]: s.value for s in job.samples() if s.name == "rlhf_phase_duration_seconds"
    }
    assert phases["gen_weight_load"] == pytest.approx(2.0)
    assert phases["gen"] == 7.0 and phases["generate_sequences"] == 5.0  # as verl logs them
    assert not job.drops  # generation_timing/* are known timers: no cap, no drop


def test_split_timers_are_one_key_of_the_thresholds_file():
    doc = default_document()
    assert doc["split_timers"] == {"generate_sequences": ["gen", "gen_weight_load"]}
    th = Thresholds.from_documents(doc, {"split_timers": {"generate_sequences": ["gen", "load"]}})
    d = diag(step(**V06), th)
    assert d.windows.counted["load"] == 2.0 and d.windows.group_seconds["other"] == 3.0
    off = Thresholds.from_documents(doc, {"split_timers": {"generate_sequences": []}})
    assert "generate_sequences" not in off.split_timers
    d = diag(step(**V06), off)  # generate_sequences then counts beside gen: both rollout
    assert d.windows.group_seconds["rollout"] == pytest.approx(12.0)
    with pytest.raises(ValueError, match=r"split_timers\.generate_sequences"):
        Thresholds.from_documents(doc, {"split_timers": {"generate_sequences": ["gen"]}})


def test_fully_async_double_prefix_is_undone():
    d = diag({"timing_s/step": 10.0, "timing_s/timing_s/param_sync": 7.0, "timing_s/gen": 1.0})
    assert d.verdict == "sync" and d.reason == "weight_sync"
    assert d.windows.counted["param_sync"] == 7.0


def test_both_spellings_of_a_timer_use_the_larger():
    data = {"timing_s/step": 10.0, "timing_s/timing_s/param_sync": 3.0, "timing_s/param_sync": 6.0}
    assert timers(data)["param_sync"] == 6.0
    data = {"timing_s/step": 10.0, "timing_s/timing_s/param_sync": 6.5, "timing_s/param_sync": 2.0}
    assert timers(data)["param_sync"] == 6.5


def test_one_step_off_counts_update_weights_only_inside_sync_rollout_weights():
    d = diag(
        step(step=10.0, sync_rollout_weights=4.0, update_weights=3.5, gen=2.0, generate_async=30.0)
    )
    assert d.windows.group_seconds["sync"] == pytest.approx(4.0)
    assert "update_weights" not in d.windows.counted
    alone = diag(step(step=10.0, update_weights=3.5, gen=2.0))
    assert alone.windows.group_seconds["sync"] == pytest.approx(3.5)


def test_agent_loop_keys_are_statistics_not_windows():
    d = diag(
        {
            "timing_s/step": 10.0,
            "timing_s/gen": 6.0,
            "timing_s/agent_loop/generate_sequences/max": 90.0,
            "timing_s/agent_loop/slowest/tool_calls": 80.0,
        }
    )
    assert d.windows.untimed_seconds == pytest.approx(4.0)
    assert not any(k.startswith("agent_loop") for k in d.windows.counted)


@pytest.mark.parametrize(
    "bad",
    [None, True, False, [1.0], "3.0", {"x": 1}, float("nan"), float("inf"), -float("inf"), -2.0],
)
def test_unusable_timer_values_are_missing(bad):
    d = diag(step(step=10.0, gen=bad, update_actor=6.0))
    assert "gen" not in d.windows.counted
    assert d.verdict == "update"


# -- §3 reasons ----------------------------------------------------------------------------

ROLLOUT = dict(step=10.0, gen=8.0, update_actor=1.0)


def al(name: str) -> str:
    return f"timing_s/agent_loop/{name}"


def test_rollout_preemption_first():
    data = {**step(**ROLLOUT), al("num_preempted/max"): 2, al("slowest/tool_calls"): 50.0}
    assert diag(data).reason == "preemption"
    data[al("num_preempted/max")] = 0
    assert diag(data).reason == "tool_calls"


def test_rollout_tool_calls_and_reward_in_loop_share_of_the_slowest_sample():
    base = {**step(**ROLLOUT), al("slowest/generate_sequences"): 7.0}
    assert diag({**base, al("slowest/tool_calls"): 3.0}).reason == "tool_calls"  # 3/10 = 0.30
    assert diag({**base, al("slowest/tool_calls"): 2.9}).reason == "generation"
    assert diag({**base, al("slowest/compute_score"): 3.0}).reason == "reward_in_loop"
    # missing terms count 0; a zero sum skips both tests
    assert diag({**step(**ROLLOUT), al("slowest/compute_score"): 1.0}).reason == "reward_in_loop"
    assert diag({**step(**ROLLOUT), al("slowest/tool_calls"): 0.0}).reason == "generation"


def test_rollout_long_tail_from_agent_loop_then_response_length():
    base = step(**ROLLOUT)
    tail = {**base, al("generate_sequences/max"): 20.0, al("generate_sequences/mean"): 10.0}
    assert diag(tail).reason == "long_tail"
    no_tail = {
        **base,
        al("generate_sequences/max"): 19.0,
        al("generate_sequences/mean"): 10.0,
        "response_length/max": 9000.0,
        "response_length/mean": 900.0,
    }
    assert diag(no_tail).reason == "generation"  # agent-loop says no: response length not consulted
    fallback = {**base, "response_length/max": 2700.0, "response_length/mean": 900.0}
    assert diag(fallback).reason == "long_tail"
    fallback["response_length/max"] = 2600.0
    assert diag(fallback).reason == "generation"
    zero_mean = {
        **base,
        al("generate_sequences/max"): 5.0,
        al("generate_sequences/mean"): 0.0,
        "response_length/max": 3000.0,
        "response_length/mean": 900.0,
    }
    assert diag(zero_mean).reason == "long_tail"  # agent-loop unusable (mean 0): fallback applies


def test_agent_loop_keys_without_prefix_are_accepted_and_the_prefixed_wins():
    base = step(**ROLLOUT)
    assert diag({**base, "agent_loop/num_preempted/max": 1}).reason == "preemption"
    both = {**base, "agent_loop/num_preempted/max": 1, al("num_preempted/max"): 0}
    assert diag(both).reason == "generation"


@pytest.mark.parametrize(
    "mfu,reason",
    [
        (0.3, "compute_bound"),
        (0.55, "compute_bound"),
        (0.29, "low_mfu"),
        (0.01, "low_mfu"),
        (0.0, "mfu_unknown"),
        (None, "mfu_unknown"),
        (float("nan"), "mfu_unknown"),
    ],
)
def test_update_reason_from_actor_mfu(mfu, reason):
    data = step(step=10.0, update_actor=7.0, gen=1.0)
    if mfu is not None:
        data["perf/mfu/actor"] = mfu
    assert diag(data).reason == reason


def test_update_uses_critic_mfu_when_critic_update_is_longer():
    data = {
        **step(step=10.0, update_actor=2.0, update_critic=5.0),
        "perf/mfu/actor": 0.5,
        "perf/mfu/critic": 0.1,
    }
    assert diag(data).reason == "low_mfu"
    data["timing_s/update_actor"] = 5.5
    assert diag(data).reason == "compute_bound"


def test_logprob_reason_from_actor_infer_mfu_and_v1_has_none():
    data = step(step=10.0, old_log_prob=5.0, ref=3.0)
    assert diag({**data, "perf/mfu/actor_infer": 0.12}).reason == "low_mfu"
    assert diag({**data, "perf/mfu/actor_infer": 0.4}).reason == "compute_bound"
    assert diag({**data, "perf/mfu/actor": 0.4}).reason == "mfu_unknown"


@pytest.mark.parametrize(
    "timer,verdict,reason",
    [
        ("update_weights", "sync", "weight_sync"),
        ("reward", "reward", "reward_model"),
    ],
)
def test_fixed_reasons(timer, verdict, reason):
    assert (
        diag(step(step=10.0, **{timer: 9.0})).verdict,
        diag(step(step=10.0, **{timer: 9.0})).reason,
    ) == (verdict, reason)


def test_other_untimed_versus_driver_compute():
    assert diag(step(step=10.0, adv=3.0, gen=1.0)).reason == "untimed"  # R=6 >= 0.5 * 9
    d = diag(step(step=10.0, adv=7.0, gen=1.0))  # R=2 < 0.5 * 9
    assert (d.verdict, d.reason) == ("other", "driver_compute")


# -- §4 change ------------------------------------------------------------------------------


def job(n: int, *, tokens=1e6, gen=6.0, upd=3.0, untimed=1.0, ckpt=None) -> list[dict]:
    out = []
    for _ in range(n):
        data = step(step=gen + upd + untimed + (ckpt or 0.0), gen=gen, update_actor=upd)
        data["perf/total_num_tokens"] = tokens
        if ckpt:
            data["timing_s/save_checkpoint"] = ckpt
        out.append(data)
    return out


def run_job(datas: list[dict], th: Thresholds = TH):
    records = [Record(i + 1, d) for i, d in enumerate(datas)]
    return list(BatchDiagnoser(th).diagnose(records))


def test_no_change_before_min_baseline_steps():
    steady = job(4)
    slow = job(1, gen=60.0)
    assert [d.change.change for d in run_job(steady + slow)] == ["steady"] * 5
    assert run_job(job(5) + slow)[-1].change.change == "regression"


def test_workload_shift_when_every_window_grew_with_tokens():
    out = run_job(job(10) + job(1, tokens=2e6, gen=12.0, upd=6.0, untimed=2.0))
    assert (out[-1].change.change, out[-1].change.regressed) == ("workload_shift", None)


def test_regression_names_the_group_that_added_most_seconds():
    out = run_job(job(10) + job(1, upd=9.0))
    assert (out[-1].change.change, out[-1].change.regressed) == ("regression", "update")
    out = run_job(job(10) + job(1, tokens=2e6, gen=12.0, upd=6.0, untimed=9.0))
    assert (out[-1].change.change, out[-1].change.regressed) == ("regression", "other")


def test_regression_tie_goes_to_the_first_group_in_order():
    base = job(10)
    slow = step(step=16.0, gen=9.0, update_actor=6.0)  # +3 s each: rollout first
    slow["perf/total_num_tokens"] = 1e6
    out = run_job(base + [slow])
    assert out[-1].change.regressed == "rollout"


def test_a_new_group_with_zero_baseline_cost_fails_the_shift_test():
    shifted = job(1, tokens=2e6, gen=12.0, upd=6.0, untimed=2.0)[0]
    shifted["timing_s/update_weights"] = 2.0
    shifted["timing_s/step"] += 2.0
    out = run_job(job(10) + [shifted])
    assert (out[-1].change.change, out[-1].change.regressed) == ("regression", "sync")


def test_insignificant_groups_do_not_block_a_workload_shift():
    shifted = job(1, tokens=2e6, gen=12.0, upd=6.0, untimed=2.0)[0]
    shifted["timing_s/update_weights"] = 0.5  # < 0.05 * S'
    shifted["timing_s/step"] += 0.5
    assert run_job(job(10) + [shifted])[-1].change.change == "workload_shift"


def test_checkpoint_saves_are_not_a_change():
    steps = job(10) + job(1, ckpt=30.0)
    steps[-1]["timing_s/update_weights"] = 0.0  # legacy >= 0.7.1 / V1: saves inside the step
    out = run_job(steps)
    assert (out[-1].verdict, out[-1].reason) == ("checkpoint", "checkpoint")
    assert out[-1].windows.busy_seconds == pytest.approx(10.0)  # S' = S - save_checkpoint
    assert out[-1].change.change == "steady"


def test_steps_without_tokens_get_none_and_stay_out_of_the_baseline():
    no_k = job(10)
    for d in no_k:
        del d["perf/total_num_tokens"]
    out = run_job(job(4) + no_k + job(1, gen=60.0))
    assert all(d.change.change == "steady" for d in out)  # only 4 usable steps before the slow one
    assert out[-1].change.point is not None and out[-1].change.baseline is None


def test_baseline_is_the_last_n_steps_so_a_lasting_regression_becomes_normal():
    out = run_job(job(10) + job(12, upd=9.0))
    changes = [d.change.change for d in out[10:]]
    assert changes[0] == "regression"
    assert changes[-1] == "steady"
    assert 4 <= changes.index("steady") <= 7  # about half the window


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    bl = Baseline(TH)
    for seconds in (10.0, 10.0, 10.0, 12.0, 12.0, 12.0):
        w = split(seconds, {"gen": seconds}, TH)
        bl.judge(w, 1e6)
    assert bl.medians().busy_seconds == pytest.approx(11.0)


def test_step_time_and_cost_ratios_are_separate_keys(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("change:\n  step_time_ratio: 5.0\n  throughput_ratio: 0.1\n")
    loose = load_thresholds(cfg)
    shifted = job(10) + job(1, tokens=2e6, gen=12.0, upd=6.0, untimed=2.0)
    assert run_job(shifted, TH)[-1].change.change == "workload_shift"
    assert run_job(shifted, loose)[-1].change.change == "steady"
    regressed = job(10) + job(1, upd=9.0)
    assert run_job(regressed, loose)[-1].change.change == "regression"  # cost test unchanged
    assert loose.cost_ratio == TH.cost_ratio == 1.2


# -- runs and merging ------------------------------------------------------------------------


def test_lower_step_starts_a_new_run_and_empties_the_baseline():
    records = [Record(i + 1, d) for i, d in enumerate(job(10))]
    records += [Record(3, job(1, gen=60.0)[0])]  # resumed from a checkpoint at step 3
    out = list(BatchDiagnoser(TH).diagnose(records))
    assert [d.run for d in out] == [0] * 10 + [1]
    assert out[-1].change.change == "steady"  # no baseline yet in run 1


def test_records_of_one_step_merge_with_later_values_winning_even_null():
    records = [
        Record(1, {"timing_s/gen": 9.0, "perf/mfu/actor": 0.5}),
        Record(
            1,
            {
                "timing_s/step": 10.0,
                "timing_s/update_actor": 0.5,
                "timing_s/gen": 1.0,
                "timing_s/old_log_prob": 8.0,
            },
        ),
        Record(1, {"perf/mfu/actor_infer": None}),
    ]
    (d,) = BatchDiagnoser(TH).diagnose(records)
    assert d.verdict == "logprob" and d.windows.counted["gen"] == 1.0
    records[2] = Record(1, {"timing_s/old_log_prob": None})
    (d,) = BatchDiagnoser(TH).diagnose(records)
    assert "old_log_prob" not in d.windows.counted


def test_validation_only_step_zero_is_not_classified():
    records = [
        Record(0, {"val-core/openai/gsm8k/reward/mean@1": 0.4}),
        Record(1, step(step=10.0, gen=8.0)),
    ]
    assert [d.step for d in BatchDiagnoser(TH).diagnose(records)] == [1]


def test_stream_classifies_on_the_record_holding_s_and_agrees_with_batch():
    # fully-async: rollouter record first, trainer record (with timers and S) second
    records = []
    for i, data in enumerate(job(12) + job(3, upd=9.0)):
        records.append(Record(i + 1, {"fully_async/rollouter/idle_ratio": 0.1}))
        records.append(Record(i + 1, data))
    batch = [d.to_json() for d in BatchDiagnoser(TH).diagnose(records)]
    sd = StreamDiagnoser(TH)
    events = [sd.feed(r) for r in records]
    stream = [e.diagnosis.to_json() for e in events if e.diagnosis]
    assert stream == batch
    assert sum(e.new_step for e in events) == 15
    assert events[0].new_run and not events[2].new_run


def test_stream_counts_a_step_once_even_if_s_appears_again():
    sd = StreamDiagnoser(TH)
    first = sd.feed(Record(1, step(step=10.0, gen=8.0)))
    again = sd.feed(Record(1, step(step=11.0, gen=8.0)))
    assert first.diagnosis is not None and again.diagnosis is None and not again.new_step


def test_nan_parsed_from_old_logs_is_missing():
    d = diag({"timing_s/step": 10.0, "timing_s/gen": math.nan, "timing_s/update_actor": 7.0})
    assert d.verdict == "update"


def test_defaults_document_and_thresholds_agree():
    doc = default_document()
    assert TH.min_share == doc["verdict"]["min_share"]
    assert TH.timer_groups["gen"] == "rollout"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 100.0), st.floats(1e3, 1e7)), min_size=1, max_size=40))
def test_baseline_medians_are_the_medians_of_the_last_n_usable_steps(steps_and_tokens):
    bl = Baseline(TH)
    seen = []
    for seconds, tokens in steps_and_tokens:
        w = split(seconds, {"gen": seconds * 0.7, "update_actor": seconds * 0.2}, TH)
        change = bl.judge(w, tokens)
        last = seen[-TH.baseline_steps :]
        if len(last) < TH.min_baseline_steps:
            assert change.baseline is None
        else:
            assert change.baseline.busy_seconds == statistics.median(s for s, _ in last)
            assert change.baseline.tokens_per_second == statistics.median(k / s for s, k in last)
            assert change.baseline.costs["rollout"] == pytest.approx(
                statistics.median(0.7 * s / k for s, k in last)
            )
        seen.append((seconds, tokens))


# -- §2 v2: where save_checkpoint ran -------------------------------------------------------

INSIDE = dict(step=100.0, gen=20.0, update_actor=15.0, update_weights=5.0, save_checkpoint=60.0)


def test_checkpoint_inside_the_step_needs_all_three_conditions():
    d = diag(step(**INSIDE))  # legacy >= 0.7.1 or V1: update_weights, no marker, fits
    assert d.windows.counted["save_checkpoint"] == 60.0
    assert (d.verdict, d.windows.busy_seconds) == ("checkpoint", 40.0)


def test_checkpoint_without_update_weights_ran_after_the_step():
    # 1. verl 0.6 has no update_weights timer and saves after `step`
    data = step(**{k: v for k, v in INSIDE.items() if k != "update_weights"})
    d = diag(data)
    assert "save_checkpoint" not in d.windows.counted
    assert d.windows.busy_seconds == 100.0 and d.verdict != "checkpoint"
    assert d.windows.shares["checkpoint"] == 0.0


@pytest.mark.parametrize(
    "marker",
    [
        {"timing_s/sync_rollout_weights": 4.0},  # one-step-off
        {"timing_s/generate_async": 80.0},  # one-step-off's background rollout
        {"timing_s/param_sync": 4.0},  # fully-async, one spelling
        {"timing_s/timing_s/param_sync": 4.0},  # ... and the other
        {"fully_async/trainer/idle_ratio": None},  # a fully_async/ key needs no usable value
    ],
)
def test_checkpoint_with_a_separated_trainer_marker_ran_after_the_step(marker):
    d = diag({**step(**INSIDE), **marker})
    assert "save_checkpoint" not in d.windows.counted
    assert d.windows.busy_seconds == 100.0


@pytest.mark.parametrize("unusable", [None, -1.0, "4", float("nan")])
def test_an_unusable_timer_is_no_marker_and_no_update_weights(unusable):
    assert (
        "save_checkpoint"
        in diag({**step(**INSIDE), "timing_s/sync_rollout_weights": unusable}).windows.counted
    )
    no_uw = {**step(**INSIDE), "timing_s/update_weights": unusable}
    assert "save_checkpoint" not in diag(no_uw).windows.counted


def test_checkpoint_must_fit_in_the_step_within_the_tolerance():
    # C = 40; S - C = 60; tol = 0.01 x 100 = 1
    assert "save_checkpoint" in diag(step(**{**INSIDE, "save_checkpoint": 61.0})).windows.counted
    too_long = diag(step(**{**INSIDE, "save_checkpoint": 61.5}))
    assert "save_checkpoint" not in too_long.windows.counted
    assert too_long.windows.busy_seconds == 100.0  # S' = S: nothing subtracted


def test_a_checkpoint_longer_than_the_step_no_longer_drops_the_step():
    records = [Record(i + 1, d) for i, d in enumerate(job(10))]
    late = job(1)[0]
    late["timing_s/save_checkpoint"] = 60.0  # after `step` (verl 0.6: no update_weights)
    records.append(Record(11, late))
    out = list(BatchDiagnoser(TH).diagnose(records))
    assert out[-1].step == 11 and out[-1].verdict == "rollout"
    assert out[-1].change.point is not None  # it entered the baseline: S' = S = 10


def test_checkpoint_tolerance_is_a_key(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("checkpoint:\n  tolerance: 0.02\n")
    loose = load_thresholds(cfg)
    assert (
        "save_checkpoint"
        in diag(step(**{**INSIDE, "save_checkpoint": 61.5}), loose).windows.counted
    )


# -- §4 v2: per-group change with work measures ----------------------------------------------


def rec(*, tokens=1e6, gen=6.0, upd=3.0, lp=0.0, sync=0.0, untimed=1.0, lmax=None, lens=None):
    """One step: `lmax` = response_length/max, `lens` = (prompt mean, response mean)."""
    timers = dict(gen=gen, update_actor=upd)
    if lp:
        timers["old_log_prob"] = lp
    if sync:
        timers["update_weights"] = sync
    data = step(step=sum(timers.values()) + untimed, **timers)
    data["perf/total_num_tokens"] = tokens
    if lmax is not None:
        data["response_length/max"] = lmax
    if lens is not None:
        data["prompt_length/mean"], data["response_length/mean"] = lens
    return data


def last_change(datas, th=TH):
    c = run_job(datas, th)[-1].change
    return c.change, c.regressed


def test_a_longer_longest_response_explains_a_slower_rollout():
    base = [rec(lmax=1000.0) for _ in range(10)]
    assert last_change(base + [rec(gen=12.0, lmax=2000.0)]) == ("workload_shift", None)
    # the same slowdown without a longer tail is a rollout regression
    assert last_change(base + [rec(gen=12.0, lmax=1000.0)]) == ("regression", "rollout")


def test_weight_sync_is_judged_per_step_not_per_token():
    base = [rec(sync=2.0) for _ in range(10)]
    # half the batch: every per-token cost doubles, sync seconds stay the same
    half = rec(tokens=5e5, gen=3.0, upd=1.5, sync=2.0, untimed=0.5)
    assert last_change(base + [half]) == ("steady", None)
    assert last_change(base + [rec(sync=4.0)]) == ("regression", "sync")


def test_longer_sequences_explain_a_slower_update():
    base = [rec(upd=3.0, lens=(500.0, 500.0)) for _ in range(10)]
    longer = rec(upd=6.0, lens=(1000.0, 1000.0))  # same K, twice the sequence length
    assert last_change(base + [longer]) == ("workload_shift", None)  # S' 1.3x
    assert last_change(base + [rec(upd=6.0, lens=(500.0, 500.0))]) == ("regression", "update")


def test_a_regression_hides_behind_no_earlier_slowdown():
    # rollout slowed for a while (raising the baseline step time), then update regresses
    slowed = [rec(gen=6.0) for _ in range(10)] + [rec(gen=12.0) for _ in range(10)]
    assert last_change(slowed + [rec(gen=12.0, upd=7.8)]) == ("regression", "update")


def test_a_regression_of_one_window_while_another_gets_faster():
    base = [rec() for _ in range(10)]
    out = run_job(base + [rec(gen=3.0, upd=6.0)])  # S' unchanged: v1 said `none`
    assert (out[-1].change.change, out[-1].change.regressed) == ("regression", "update")
    assert out[-1].change.excess["update"] == pytest.approx(3.0)


def test_a_measure_unusable_in_this_step_is_not_used():
    base = [rec(lmax=1000.0) for _ in range(10)]
    # no response_length/max in this step: only K judges rollout
    assert last_change(base + [rec(gen=12.0)]) == ("regression", "rollout")
    # a zero measure is unusable too
    assert last_change(base + [rec(gen=12.0, lmax=0.0)]) == ("regression", "rollout")


def test_a_measure_needs_min_baseline_steps_that_had_it():
    few = [rec() for _ in range(6)] + [rec(lmax=1000.0) for _ in range(4)]
    # Lmax doubled, but only 4 baseline steps had Lmax: it is not used, K decides
    assert last_change(few + [rec(gen=12.0, lmax=2000.0)]) == ("regression", "rollout")
    enough = [rec() for _ in range(5)] + [rec(lmax=1000.0) for _ in range(5)]
    assert last_change(enough + [rec(gen=12.0, lmax=2000.0)]) == ("workload_shift", None)


def test_token_length_needs_both_means_usable():
    base = [rec(upd=3.0, lens=(500.0, 500.0)) for _ in range(10)]
    no_prompt = rec(upd=6.0, lens=(500.0, 500.0))
    del no_prompt["prompt_length/mean"]
    assert last_change(base + [no_prompt]) == ("regression", "update")


def test_the_minimum_excess_is_a_fraction_of_the_baseline_step():
    base = [rec(gen=6.0, upd=0.6, untimed=3.4) for _ in range(10)]  # S' = 10
    # update doubled (+100 % cost) but adds 0.45 s < 0.05 x 10: not a regression
    small = rec(gen=6.0, upd=1.05, untimed=3.4)
    assert last_change(base + [small])[0] != "regression"
    big = rec(gen=6.0, upd=1.15, untimed=3.4)  # + 0.55 s
    assert last_change(base + [big]) == ("regression", "update")


def test_min_excess_is_a_key(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("change:\n  min_excess: 0.5\n")
    strict = load_thresholds(cfg)
    datas = [rec() for _ in range(10)] + [rec(upd=6.0)]  # excess 3 s < 0.5 x 10
    assert last_change(datas) == ("regression", "update")
    assert last_change(datas, strict)[0] != "regression"


def test_the_largest_excess_wins_and_ties_go_in_table_order():
    base = [rec(lp=2.0, sync=1.0) for _ in range(10)]
    both = rec(gen=9.0, upd=6.0, lp=2.0, sync=1.0)  # +3 s rollout, +3 s update
    assert last_change(base + [both]) == ("regression", "rollout")
    more = rec(gen=9.0, upd=7.0, lp=2.0, sync=1.0)
    assert last_change(base + [more]) == ("regression", "update")
    tie = rec(lp=4.0, sync=3.0)  # +2 s logprob, +2 s sync
    assert last_change(base + [tie]) == ("regression", "logprob")


def test_an_insignificant_group_never_regresses():
    base = [rec(sync=0.1) for _ in range(10)]
    # sync x5 but 0.5 s < 0.05 x S' (10.5): no regression, and S' is within 1.2x
    assert last_change(base + [rec(sync=0.5)]) == ("steady", None)


def test_regression_is_judged_before_workload_shift():
    base = [rec() for _ in range(10)]
    # twice the tokens explain rollout and other, but update tripled
    out = rec(tokens=2e6, gen=12.0, upd=9.0, untimed=2.0)
    assert last_change(base + [out]) == ("regression", "update")


def test_plan_memo_is_keyed_by_thresholds(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("groups:\n  update: [update_actor, update_critic, my_timer]\n")
    custom = load_thresholds(cfg)
    data = step(step=10.0, my_timer=8.0)
    assert diag(data).verdict == "other"  # memoized for TH first ...
    assert diag(data, custom).verdict == "update"  # ... and not reused for other thresholds


def test_memos_stay_bounded():
    from rlhf_exporter.diagnosis import windows

    for i in range(3 * windows.MEMO_SIZE):
        diag(step(step=10.0, **{f"t{i}": 1.0}))
    assert len(windows._KEYSETS) <= windows.MEMO_SIZE
    assert len(windows._PLANS) <= windows.MEMO_SIZE
    # has_key_prefix's answers live in each key set's shape, a few prefixes each
    assert all(len(s.prefixed) <= windows._PREFIXES_KEPT for s in windows._KEYSETS.values())


def test_memos_are_lru_a_job_in_use_survives_a_flood_of_shapes():
    from rlhf_exporter.diagnosis import windows

    hot = step(step=10.0, gen=8.0, update_actor=1.0)
    diag(hot)
    for i in range(2 * windows.MEMO_SIZE):
        diag(step(step=10.0, **{f"flood{i}": 1.0}))  # a neighbour floods new shapes ...
        assert tuple(hot) in windows._KEYSETS  # ... and never evicts a shape in use
        diag(hot)  # the job keeps stepping
    assert len(windows._KEYSETS) <= windows.MEMO_SIZE
