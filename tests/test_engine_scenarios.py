"""Each engine scenario through the real scraper: simulated vLLM / SGLang servers on
127.0.0.1 (their real metric names, tests/support/sim_engine.py), read over HTTP and parsed
with prometheus_client's parser by the engine source, joined over a rollout window W.

Done-when of issue 29: each scenario gives the contract's reason, and the evidence matches
the simulated truth within 5 %.
"""

from __future__ import annotations

import pytest

from rlhf_exporter.diagnosis.engines import EngineLimits, reason
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import NO_STATS, EngineSource
from tests.support.sim_engine import SCENARIOS, EngineSim, SimClock, scenario

T0 = 1_000_000.0
SPANS = [(T0, T0 + 4.0), (T0 + 5.0, T0 + 25.0)]  # e.g. switch_wait, then gen: W is their union
DT = 0.25  # the sampling lag: a sample stands for the time before it (one DT per edge)


def run(name: str) -> tuple[EngineSim, EngineSource, list[tuple[float, float]], str | None]:
    replicas, expected = scenario(name)
    if name == "replica_dies":
        replicas[1].dies_at = T0 + 14.0
    clock = SimClock(T0 - 3.0)
    sim = EngineSim(replicas, SPANS, clock).start()
    source = EngineSource(
        Targets(static=sim.urls()), interval=DT, timeout=2.0, clock=clock, active=lambda: True
    )
    while clock.t <= SPANS[-1][1] + DT:
        source.poll()
        clock.t += DT
    return sim, source, SPANS, expected


@pytest.fixture(params=SCENARIOS)
def played(request):
    sim, source, spans, expected = run(request.param)
    yield request.param, sim, source, spans, expected
    source.close()
    sim.stop()


def close(got: float | None, want: float, rel: float = 0.05, abs_: float = 1e-9) -> bool:
    return got is not None and abs(got - want) <= max(rel * abs(want), abs_)


def test_scenario_gives_the_contracts_reason_and_the_truth(played) -> None:
    name, sim, source, spans, expected = played
    lim = EngineLimits()
    ev = source.evidence(spans)
    assert ev is not None, name
    if expected is None and name in ("replica_dies", "no_stats"):
        assert not ev.usable, (name, ev.coverage)
        assert reason(ev, lim) is None
        if name == "no_stats":
            assert source.error_counts()[NO_STATS] > 0
        return
    assert ev.usable, (name, ev.coverage)
    assert reason(ev, lim) == expected, (name, ev)
    truth = sim.truth(spans)
    for key in ("peak_running", "running_mean", "waiting_mean", "kv_max", "preemptions"):
        assert close(getattr(ev, key), truth[key], abs_=1e-6), (
            name,
            key,
            getattr(ev, key),
            truth[key],
        )
    for key in ("kv_pressure_share", "queueing_share", "long_tail_share"):
        assert abs(getattr(ev, key) - truth[key]) <= 0.05, (name, key, getattr(ev, key), truth[key])
    names = {r.name: url for r, url in zip(sim.replicas, sim.urls(), strict=True)}
    by_url = {f"127.0.0.1:{u.split(':')[2].split('/')[0]}": n for n, u in names.items()}
    assert set(ev.tokens) == set(by_url)
    for hostport, tokens in ev.tokens.items():
        assert close(tokens, truth["tokens"][by_url[hostport]]), (name, hostport)
    if truth["imbalance"] is not None:
        assert close(ev.imbalance, truth["imbalance"]), (name, ev.imbalance, truth["imbalance"])


def test_sglang_without_a_token_counter_integrates_gen_throughput() -> None:
    replicas, _ = scenario("kv_pressure")
    for r in replicas:
        r.gen_tokens_counter = False
    clock = SimClock(T0 - 3.0)
    with EngineSim(replicas, SPANS, clock) as sim:
        source = EngineSource(
            Targets(static=sim.urls()), interval=DT, timeout=2.0, clock=clock, active=lambda: True
        )
        while clock.t <= SPANS[-1][1] + DT:
            source.poll()
            clock.t += DT
        ev = source.evidence(SPANS)
        truth = sim.truth(SPANS)
        source.close()
    assert ev is not None
    for got, want in zip(sorted(ev.tokens.values()), sorted(truth["tokens"].values()), strict=True):
        assert close(got, want), (got, want)


def test_idle_polls_are_rare_and_a_busy_engine_wakes_the_scraper() -> None:
    replicas, _ = scenario("healthy")
    clock = SimClock(T0 - 100.0)
    with EngineSim(replicas, SPANS, clock) as sim:
        source = EngineSource(
            Targets(static=sim.urls()), interval=1.0, idle_interval=15.0, clock=clock
        )
        for _ in range(60):  # 60 s with nothing stepping and idle engines
            source.poll()
            clock.t += 1.0
        idle = sim.scrapes
        assert idle <= 4 * len(replicas) * len(replicas)  # every 15 s, not every second
        assert idle < 60 * len(replicas) / 3
        clock.t = T0 + 5.0  # engines busy for 20 s: read every second from the next read on
        for _ in range(20):
            source.poll()
            clock.t += 1.0
        assert sim.scrapes - idle >= 18 * len(replicas)
        source.close()


def test_bounds_are_counted() -> None:
    replicas, _ = scenario("healthy")
    clock = SimClock(T0 + 1.0)
    with EngineSim(replicas, SPANS, clock) as sim:
        source = EngineSource(
            Targets(static=[*sim.urls(), "127.0.0.1:1"]),
            max_replicas=3,
            max_bytes=1000,
            clock=clock,
            active=lambda: True,
        )
        source.poll()
        errors = source.error_counts()
        source.close()
    assert errors["engine_too_many_replicas"] == 2  # 5 targets, 3 read
    # targets are read in name order: 127.0.0.1:1 (nothing listens) first
    assert errors["engine_unreachable"] == 1
    assert errors["engine_body_too_large"] == 2  # every page is larger than 1000 bytes


def test_a_hung_engine_times_out_and_a_broken_page_is_counted() -> None:
    import socket
    import time

    from rlhf_exporter.sources.engines import PARSE_ERROR, TIMEOUT, parse

    with socket.socket() as mute:  # accepts connections (the kernel's backlog), never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        url = f"127.0.0.1:{mute.getsockname()[1]}"
        source = EngineSource(Targets(static=[url]), timeout=0.3, active=lambda: True)
        started = time.monotonic()
        source.poll()
        took = time.monotonic() - started
        source.close()
    assert source.error_counts()[TIMEOUT] == 1
    assert took < 2.0
    broken = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0" 5\n'
    assert parse(broken, 1.0).error == PARSE_ERROR
    odd = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{engine="0"} NaN\n'
        b'vllm:num_requests_running{engine="1"} 3\n'
        b'vllm:num_requests_waiting_by_reason{reason="deferred"} 7\n'
    )
    read = parse(odd, 1.0)
    assert read.error is None and read.sample is not None
    assert read.sample.running == 3.0  # NaN dropped, the other engine kept
    assert read.sample.waiting is None  # waiting_by_reason is not waiting; deferred is not read
    both = (
        odd + b'vllm:num_requests_waiting{engine="1"} 9\n' + odd.replace(b"deferred", b"capacity")
    )
    got = parse(both, 1.0).sample
    assert got is not None and got.waiting == 7.0  # the capacity waits, where vLLM has them
