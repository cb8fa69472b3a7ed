"""The engines' OWN pages through the real scraper: vLLM 0.33.0's PrometheusStatLogger and
SGLang 0.5.23's Scheduler/TokenizerMetricsCollector, run unchanged on scripted engine state
(scripts/engine-pages.py), served over 127.0.0.1 and read by the engine source every 0.5 s.

Done-when of issue 33: every fixture gives the scripted reason, and the evidence is within 5 %
of the scripted truth. Each fixture names the fix it needs (`fixes`); before that fix its
case here failed:
- first_appearance_from_zero (sglang_first_use_counters): SGLang creates a counter at its
  first use; absent -> 5 read as no increase (the reason was kv_pressure, half the tokens lost);
- sglang_counters_once_per_replica (sglang_tp2_retractions): every TP rank counts each
  retraction: 12 read for 6;
- sglang_counters_once_per_stage (sglang_pp2_ep_retractions): every pipeline stage runs the
  same scheduler loop, and with expert parallelism each TP rank has its own moe_ep_rank:
  retractions read 4 times over (24 for 6), decoded tokens twice;
- sglang_gauges_priority_total (sglang_priority): the total under priority="" beside each
  priority's series: running/waiting read double;
- sglang_tokens_realtime (sglang_window_edges): generation_tokens_total grows when requests
  finish: a replica whose requests finish just after W read as idle (imbalance 2.0 for 1.0);
- queueing_from_capacity (vllm_deferred_waits): vllm:num_requests_waiting counts deferred
  requests: queueing read for a long tail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis.engines import EngineLimits, reason
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import EngineSource, parse
from tests.support.engine_pages import PageServer, load, names
from tests.support.sim_engine import SimClock

FIXTURES = names()


def test_every_fixture_is_there() -> None:
    assert {
        "vllm_kv_pressure_long_tail",
        "vllm_queueing",
        "vllm_deferred_waits",
        "vllm_data_parallel",
        "sglang_first_use_counters",
        "sglang_tp2_retractions",
        "sglang_priority",
        "sglang_window_edges",
        "sglang_dp_kv_pressure",
    } <= set(FIXTURES)


def close(got: float | None, want: float, rel: float = 0.05, abs_: float = 1e-6) -> bool:
    return got is not None and abs(got - want) <= max(rel * abs(want), abs_)


def scrape(name: str, tmp_path: Path):
    fx = load(name)
    clock = SimClock(fx.times[0])
    with PageServer(fx) as served:
        targets = Targets(file_sd=str(served.targets_file(tmp_path / "targets.json")))
        source = EngineSource(targets, interval=0.5, timeout=2.0, clock=clock, active=lambda: True)
        try:
            for k, t in enumerate(fx.times):
                served.show(k)
                clock.t = t
                source.poll()
            return fx, source.evidence(fx.spans), source.error_counts()
        finally:
            source.close()


@pytest.mark.parametrize("name", FIXTURES)
def test_the_engines_own_pages_give_the_scripted_reason_and_truth(name: str, tmp_path) -> None:
    fx, ev, errors = scrape(name, tmp_path)
    assert ev is not None and ev.usable, (name, ev, errors)
    truth = fx.truth
    got = {
        k: getattr(ev, k)
        for k in ("peak_running", "running_mean", "waiting_mean", "kv_max", "preemptions")
    }
    for key, value in got.items():
        assert close(value, truth[key]), (name, key, value, truth[key])
    for key in ("kv_pressure_share", "queueing_share", "long_tail_share"):
        assert abs(getattr(ev, key) - truth[key]) <= 0.05, (name, key, getattr(ev, key), truth[key])
    assert set(ev.tokens) == set(truth["tokens"])
    for replica, want in truth["tokens"].items():
        assert close(ev.tokens[replica], want), (name, replica, ev.tokens[replica], want)
    if truth["imbalance"] is not None:
        assert close(ev.imbalance, truth["imbalance"]), (name, ev.imbalance, truth["imbalance"])
    assert reason(ev, EngineLimits()) == fx.doc["reason"], (name, ev)


# -- the combination rules as properties (pages like SGLang's, any ranks/priorities) --------


_LABELS = 'model_name="m",engine_type="unified",tp_rank="{tp}",pp_rank="{pp}",moe_ep_rank="{ep}"'
_series = st.lists(
    st.tuples(
        st.sampled_from(["0", "1", "2"]),  # dp_rank
        st.floats(0, 500, allow_nan=False),  # running
        st.floats(0, 1, allow_nan=False),  # token usage
        st.integers(0, 40),  # retractions
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda x: x[0],
)


def _sglang_page(groups, tp: int, priorities: bool, pp: int = 1, ep: bool = False) -> bytes:
    lines = [
        "# TYPE sglang:num_running_reqs gauge",
        "# TYPE sglang:token_usage gauge",
        "# TYPE sglang:num_retracted_requests_total counter",
    ]
    for dp, running, kv, retracted in groups:
        for stage, rank in ((s, r) for s in range(pp) for r in range(tp)):
            lab = _LABELS.format(tp=rank, pp=stage, ep=rank if ep else 0) + f',dp_rank="{dp}"'
            prio = ',priority=""' if priorities else ""
            if rank == 0:  # each stage's stats rank logs the gauges
                lines.append(f"sglang:num_running_reqs{{{lab}{prio}}} {running}")
                lines.append(f"sglang:token_usage{{{lab}{prio}}} {kv}")
                if priorities:  # one series per priority beside the total
                    high = running * 2 / 3
                    lines.append(f'sglang:num_running_reqs{{{lab},priority="0"}} {high}')
                    lines.append(f'sglang:num_running_reqs{{{lab},priority="1"}} {running - high}')
            lines.append(f"sglang:num_retracted_requests_total{{{lab}{prio}}} {retracted}")
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=150, deadline=None)
@given(_series, st.integers(1, 4), st.booleans(), st.integers(1, 3), st.booleans())
def test_a_replica_counts_once_whatever_its_tp_ranks_and_priorities(
    groups, tp, prio, pp, ep
) -> None:
    """TP, PP and EP ranks and priority series never change what a replica reads: running
    and retractions summed over data-parallel ranks, the KV usage their maximum."""
    base = parse(_sglang_page(groups, 1, False), 1.0)
    got = parse(_sglang_page(groups, tp, prio, pp, ep), 1.0)
    assert base.error is None and got.error is None and got.sample is not None
    assert got.sample == base.sample
    assert got.sample.running == pytest.approx(sum(g[1] for g in groups))
    assert got.sample.kv == max(g[2] for g in groups)
    assert got.sample.preempted == sum(g[3] for g in groups)
