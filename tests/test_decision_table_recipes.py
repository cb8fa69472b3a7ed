"""The decision table on verl's recipes (docs/decision-table.md §2 and §4): the recipes'
timers, timers the table does not name (clipped to the untimed time), PRIME's `adv`, DAPO's n
generation batches, the fully-async recipe's `wait_last_valid` in a second record of the step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis import (
    BatchDiagnoser,
    Record,
    StreamDiagnoser,
    Thresholds,
    ThresholdsError,
    classify,
    split,
)
from rlhf_exporter.diagnosis.change import Baseline
from rlhf_exporter.diagnosis.windows import named_timers
from rlhf_exporter.job.state import Job
from rlhf_exporter.thresholds_file import default_document, load_thresholds

TH = load_thresholds()


def step(**timers_and_keys) -> dict:
    """A record's data: keyword `x=1.0` becomes `timing_s/x`, `k__y` a verbatim key `k/y`."""
    data = {}
    for key, value in timers_and_keys.items():
        data[key.replace("__", "/") if "__" in key else f"timing_s/{key}"] = value
    return data


def diag(data: dict, th: Thresholds = TH):
    return classify(0, 1, data, Baseline(th), th)


@pytest.mark.parametrize(
    "timer,group",
    [
        (
            "wait_prev_gen",
            "rollout",
        ),  # one-step-off recipe 0.6.1, GKD: the previous step's generation
        ("atropos_poll", "rollout"),
        ("generate_trajectories", "rollout"),  # rllm
        ("verify", "reward"),  # PRIME
        ("reward_calc", "reward"),  # SPIN
        ("policy_log_prob", "logprob"),  # SPIN
        ("ref_log_prob_dpo", "logprob"),
        ("old_log_probs", "logprob"),  # rllm
        ("wait_prev_teacher", "logprob"),  # GKD
        ("prepare_dpo_batch", "other"),  # SPIN
        ("data_convert", "other"),
        ("rollout_correction", "other"),
    ],
)
def test_each_recipe_timer_lands_in_its_group(timer, group):
    d = diag(step(step=10.0, **{timer: 8.0}))
    assert d.verdict == group
    assert d.windows.group_seconds[group] == pytest.approx(8.0 if group != "other" else 10.0)


@pytest.mark.parametrize(
    "timer",
    [
        "wait_last_valid",
        "get_teacher_knowledge",
        "generate_sequences_mean",
        "generate_sequences_min",
        "generate_sequences_max",
    ],
)
def test_recipe_timers_outside_the_step_are_ignored(timer):
    d = diag(step(step=10.0, update_actor=8.0, **{timer: 50.0}))
    assert d.verdict == "update" and d.shares["update"] == pytest.approx(0.8)
    assert timer not in d.windows.counted and d.timers[timer] == 50.0  # still a phase


# -- unnamed timers, clipped ----------------------------------------------------------------


def test_an_unnamed_timer_beside_the_others_inside_step_counts_whole_as_in_v3():
    d = diag(step(step=10.0, gen=4.0, update_actor=2.0, my_dedup=3.0))
    assert d.windows.group_seconds["other"] == pytest.approx(4.0)  # 3 s + R = 1 s
    assert d.windows.counted["my_dedup"] == pytest.approx(3.0)
    assert d.windows.untimed_seconds == pytest.approx(1.0)
    assert d.verdict == "balanced"  # 0.4 rollout, 0.4 other


def test_an_unnamed_timer_nested_in_gen_counts_only_up_to_the_untimed_time():
    # a fork's `my_dedup` runs inside `gen`: 6 + 2 named, 2 s untimed, 4 s of dedup
    d = diag(step(step=10.0, gen=6.0, update_actor=2.0, my_dedup=4.0))
    w = d.windows
    assert w.group_seconds["other"] == pytest.approx(2.0)  # U' = min(4, 10 - 8)
    assert w.counted["my_dedup"] == pytest.approx(2.0)
    assert w.untimed_seconds == 0.0
    assert w.shares["rollout"] == pytest.approx(0.6) and d.verdict == "rollout"
    assert d.timers["my_dedup"] == 4.0  # the phase keeps its own seconds
    assert sum(w.shares.values()) == pytest.approx(1.0)


def test_an_unnamed_timer_after_step_cannot_make_other_the_verdict():
    # v3 read this step as `other` (20 s of a 10 s step); the named timers fill the step
    d = diag(step(step=10.0, gen=5.0, update_actor=5.0, my_eval=20.0))
    assert d.windows.group_seconds["other"] == 0.0
    assert "my_eval" not in d.windows.counted
    assert d.verdict == "balanced"  # 0.5 / 0.5
    assert d.timers["my_eval"] == 20.0


def test_several_unnamed_timers_share_the_clipped_time_in_proportion():
    d = diag(step(step=10.0, gen=7.0, a_timer=3.0, b_timer=1.0))
    assert d.windows.counted["a_timer"] == pytest.approx(2.25)
    assert d.windows.counted["b_timer"] == pytest.approx(0.75)
    assert d.windows.group_seconds["other"] == pytest.approx(3.0)


def test_other_reads_its_reason_from_r_so_clipped_time_is_driver_compute():
    d = diag(step(step=10.0, gen=1.0, my_work=7.0))  # 7 s timed driver work, 2 s untimed
    assert (d.verdict, d.reason) == ("other", "driver_compute")
    d = diag(step(step=10.0, gen=1.0, my_work=2.0))  # 2 s timed, 7 s untimed
    assert (d.verdict, d.reason) == ("other", "untimed")


def test_unnamed_timers_are_left_out_of_c_when_placing_save_checkpoint():
    # C = 40 without the unnamed 30 s: the save fits (55 <= 100 - 40 + 1), a window of the step
    data = step(step=100.0, gen=20.0, update_actor=15.0, update_weights=5.0, save_checkpoint=55.0)
    data["timing_s/my_nested"] = 30.0
    w = diag(data).windows
    assert w.checkpoint_seconds == pytest.approx(55.0)
    assert w.group_seconds["other"] == pytest.approx(5.0)  # U' = min(30, 100 - 95)
    assert w.untimed_seconds == 0.0


def test_a_timer_the_user_names_is_not_clipped(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("groups:\n  update: [update_actor, update_critic, my_dedup]\n")
    custom = load_thresholds(cfg)
    data = step(step=10.0, gen=6.0, update_actor=2.0, my_dedup=4.0)
    assert diag(data, custom).windows.group_seconds["update"] == pytest.approx(6.0)
    assert "my_dedup" in named_timers(custom) and "my_dedup" not in named_timers(TH)


NAMED = ["gen", "reward", "old_log_prob", "update_actor", "adv", "update_weights"]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1.0, 1e4),
    st.lists(st.floats(0.0, 1.0), min_size=len(NAMED), max_size=len(NAMED)),
    st.dictionaries(st.sampled_from(["my_a", "my_b", "fork/c"]), st.floats(0.0, 1e4), min_size=1),
)
def test_unnamed_timers_only_fill_the_untimed_time(s, fractions, unnamed):
    """Property: the named groups keep their seconds, and `other` never holds more than
    max(T(other) without the unnamed timers, S - named timers of the other groups)."""
    named = {name: f * s / len(NAMED) for name, f in zip(NAMED, fractions)}
    without = split(s, named, TH)
    with_unnamed = split(s, {**named, **unnamed}, TH)
    for g in ("rollout", "reward", "logprob", "update", "sync", "checkpoint"):
        assert with_unnamed.group_seconds[g] == without.group_seconds[g]
    assert with_unnamed.group_seconds["other"] == pytest.approx(
        without.group_seconds["other"], rel=1e-9, abs=1e-9
    )
    assert with_unnamed.untimed_seconds <= without.untimed_seconds + 1e-9
    assert sum(with_unnamed.shares.values()) == pytest.approx(1.0)


# -- PRIME: `adv` runs the reward model ------------------------------------------------------


def test_prime_adv_counts_in_reward_when_verify_is_present():
    prime = diag(step(step=10.0, gen=2.0, verify=1.0, adv=5.0, update_actor=1.5))
    assert prime.windows.group_seconds["reward"] == pytest.approx(6.0)
    assert prime.windows.timer_groups["adv"] == "reward"  # where the GPU timeline places it
    assert (prime.verdict, prime.reason) == ("reward", "reward_model")
    plain = diag(step(step=10.0, gen=2.0, adv=5.0, update_actor=1.5))
    assert plain.verdict == "other" and plain.windows.group_seconds["reward"] == 0.0
    assert plain.windows.timer_groups["adv"] == "other"


def test_prime_adv_stays_in_other_when_verify_is_unusable():
    d = diag(step(step=10.0, gen=2.0, verify=None, adv=5.0, update_actor=1.5))
    assert d.windows.group_seconds["reward"] == 0.0


def test_regrouped_timers_are_one_key_of_the_thresholds_file():
    doc = default_document()
    assert doc["regrouped_timers"] == {"adv": ["verify", "reward"]}
    off = Thresholds.from_documents(doc, {"regrouped_timers": {"adv": []}})
    d = diag(step(step=10.0, verify=1.0, adv=5.0), off)
    assert d.windows.group_seconds["reward"] == pytest.approx(1.0)
    mine = Thresholds.from_documents(doc, {"regrouped_timers": {"my_adv": ["my_rm", "reward"]}})
    assert mine.regrouped_timers["my_adv"] == ("my_rm", "reward")
    with pytest.raises(ThresholdsError, match=r"regrouped_timers\.adv"):
        Thresholds.from_documents(doc, {"regrouped_timers": {"adv": ["verify", "nowhere"]}})
    with pytest.raises(ThresholdsError, match=r"regrouped_timers\.adv"):
        Thresholds.from_documents(doc, {"regrouped_timers": {"adv": ["verify"]}})


# -- DAPO's n generation batches ---------------------------------------------------------------


def dapo(n, gen=100.0, gs=20.0, **more):
    data = step(step=120.0, gen=gen, generate_sequences=gs, update_actor=15.0, **more)
    if n is not None:
        data["train/num_gen_batches"] = n
    return data


@pytest.mark.parametrize(
    "n,rollout,sync",
    [
        (4, 80.0, 20.0),  # n x generate_sequences of the 100 s of gen is generation
        (6, 100.0, 0.0),  # min(gen, n x generate_sequences)
        (1, 20.0, 80.0),  # one batch: v3's split
        (None, 20.0, 80.0),  # no n: v3's split
        (-1, 20.0, 80.0),  # unusable n: as without
        (True, 20.0, 80.0),
        ("4", 20.0, 80.0),
    ],
)
def test_dapo_splits_gen_by_n_times_generate_sequences(n, rollout, sync):
    w = diag(dapo(n)).windows
    assert w.group_seconds["rollout"] == pytest.approx(rollout)
    assert w.group_seconds["sync"] == pytest.approx(sync)


def test_dapo_with_generate_sequences_longer_than_gen_counts_gen_alone():
    w = diag(dapo(4, gen=10.0, gs=30.0)).windows
    assert w.counted.get("gen") == 10.0 and "gen_weight_load" not in w.counted


def dapo_job(batches: list[float | None], tokens=1e6) -> list[dict]:
    """Steps whose rollout, reward and weight load each take n times one batch's seconds."""
    out = []
    for n in batches:
        k = n or 1
        data = step(
            step=35.0 * k + 11.0,
            gen=30.0 * k,
            generate_sequences=25.0,
            reward=5.0 * k,
            update_actor=10.0,
        )
        data["perf/total_num_tokens"] = tokens
        if n is not None:
            data["train/num_gen_batches"] = n
        out.append(data)
    return out


def run(datas: list[dict], th: Thresholds = TH):
    return list(BatchDiagnoser(th).diagnose([Record(i + 1, d) for i, d in enumerate(datas)]))


def test_a_step_that_needed_more_batches_is_more_work_not_a_regression():
    out = run(dapo_job([1, 2, 1, 2, 1, 1, 2, 1, 1, 2, 4]))
    last = out[-1]
    assert last.verdict == "rollout"
    assert (last.change.change, last.change.regressed) == ("workload_shift", None)
    # the same step shape without n: rollout, reward and sync all regressed
    blind = run(dapo_job([None] * 10) + [dapo_job([4])[0] | {"train/num_gen_batches": None}])
    assert blind[-1].change.change == "regression"


def test_a_regression_is_still_seen_when_n_explains_nothing():
    steps = dapo_job([1, 2, 1, 2, 1, 1, 2, 1, 1, 2, 2])
    steps[-1]["timing_s/reward"] = 40.0  # 4x a two-batch step's reward
    steps[-1]["timing_s/step"] += 30.0
    last = run(steps)[-1]
    assert (last.change.change, last.change.regressed) == ("regression", "reward")


# -- the fully-async recipe: wait_last_valid in a second record of the step ----------------


def recipe_records(n: int) -> list[Record]:
    """verl 0.6.1/0.7.0's fully-async recipe: the trainer's aggregate, then a record of
    `timing_s/wait_last_valid` under the same step (`fully_async_trainer.py`)."""
    records = []
    for i in range(n):
        data = step(
            step=20.0, wait_for_enough_samples=2.0, gen=9.0, old_log_prob=2.0, update_actor=5.0
        )
        data["perf/total_num_tokens"] = 1e6 * (2 if i >= 12 else 1)
        data["fully_async/trainer/idle_ratio"] = 0.5
        records.append(Record(i + 1, data))
        records.append(Record(i + 1, step(wait_last_valid=30.0 + i)))
    return records


def test_wait_last_valid_in_a_second_record_is_read_alike_by_diagnose_and_serve():
    records = recipe_records(15)
    batch = [d.to_json() for d in BatchDiagnoser(TH).diagnose(records)]
    sd = StreamDiagnoser(TH)
    stream = [e.diagnosis.to_json() for e in map(sd.feed, records) if e.diagnosis]
    last = sd.close()  # v5: the job writes steps in two records, its last step is held
    assert last is not None
    assert stream + [last.to_json()] == batch and len(batch) == 15
    assert all(d["verdict"] == "rollout" and d["shares"]["other"] == 0.1 for d in batch)
    job = Job("recipes", "fully_async", TH)
    served = []
    for record in records:
        before = job.last
        job.feed([record])
        if job.last is not before and job.last is not None:
            served.append(job.last.to_json())
    assert job.tick(float("inf"))  # the last step's S has passed
    assert served + [job.last.to_json()] == batch
    assert job.drops == {"late_record": 1}  # step 1's second record, after its verdict


def test_the_recipes_second_record_with_param_sync_reads_alike():
    """Decision table v5 (section 1): once step 1's second record shows the job writes its
    steps in two records, every later step is held until complete and classified merged, as
    `diagnose` does; step 1 keeps the verdict it had before its `param_sync` came."""
    records = recipe_records(15)
    records = [
        Record(r.step, {**r.data, "timing_s/param_sync": 1.5})
        if "timing_s/wait_last_valid" in r.data
        else r
        for r in records
    ]
    batch = [d.to_json() for d in BatchDiagnoser(TH).diagnose(records)]
    sd = StreamDiagnoser(TH)
    events = list(map(sd.feed, records))
    last = sd.close()
    assert last is not None
    stream = [e.diagnosis.to_json() for e in events if e.diagnosis] + [last.to_json()]
    assert stream[1:] == batch[1:] and len(stream) == 15
    assert all(d["shares"]["sync"] == 0.075 for d in stream[1:])
    first = classify(0, 1, records[0].data, Baseline(TH), TH)
    assert stream[0] == first.to_json() and stream[0]["shares"]["sync"] == 0.0
    assert [e.late for e in events] == [False, True] + [False] * 28
