"""The simulated engine (tests/support/sim_engine.py) against the engines' own pages
(tests/fixtures/engine_pages, from vLLM 0.33.0's and SGLang 0.5.23's metric code), family by
family: the same names, types and labels, each series appearing when the real one does (SGLang's
first-use counters), the same values; and the same script replayed by the simulated engine
gives the same evidence and reason through the scraper.

The simulated engine stays for the live tests (it follows a job's windows in wall time); this
keeps it honest about the behaviours the real pages showed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlhf_exporter.diagnosis.engines import EngineLimits, reason
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import FAMILIES, EngineSource
from tests.support.engine_pages import Fixture, load, names
from tests.support.sim_engine import EngineSim, Replica, Segment, SimClock, page

FIXTURES = names()
KEY_LABELS = (
    "engine",
    "reason",
    "tp_rank",
    "pp_rank",
    "moe_ep_rank",
    "dp_rank",
    "priority",
    "mode",
    "is_streaming",
)


def sim_replicas(fx: Fixture) -> list[Replica]:
    out = []
    for name in fx.replicas:
        sc = fx.doc["replicas"][name]
        burst = sc["retract_burst"]
        out.append(
            Replica(
                fx.doc["engine"],
                tuple(Segment(*seg) for seg in sc["profile"]),
                name=name,
                tp=sc["tp"],
                dp=sc["dp"],
                pp=sc.get("pp", 1),
                ep=sc.get("ep", False),
                priority=sc["priority"],
                finish_at=tuple(sc["finish_at"]),
                retract_burst=(burst[0], int(burst[1])) if burst else None,
            )
        )
    return out


def windows(fx: Fixture) -> list[tuple[float, float]]:
    return [(fx.spans[0][0], fx.spans[-1][1])]  # the script plays over the whole of W


def families(body: bytes) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """The scraper's families on a page: sample name -> (type, [(name, labels, value)])."""
    out: dict[str, tuple[str, list[Any]]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name in FAMILIES:
                out.setdefault(s.name, (fam.type, []))[1].append((s.name, s.labels, s.value))
    return out


def keys(samples: Iterable[tuple[str, dict[str, str], float]]) -> set[tuple[Any, ...]]:
    return {
        (n, frozenset(labels), tuple(labels.get(k) for k in KEY_LABELS)) for n, labels, _ in samples
    }


@pytest.mark.parametrize("name", FIXTURES)
def test_the_simulated_engine_writes_what_the_real_one_does(name: str) -> None:
    fx = load(name)
    reps = {r.name: r for r in sim_replicas(fx)}
    wins = windows(fx)
    last = len(fx.times) - 1
    for rname in fx.replicas:
        real_last = families(fx.page(rname, last))
        sim_last = families(page(reps[rname], fx.times[last], wins))
        assert set(sim_last) == set(real_last), (name, rname)
        for fam, (typ, samples) in real_last.items():
            assert sim_last[fam][0] == typ, (name, fam)
            assert keys(sim_last[fam][1]) == keys(samples), (name, rname, fam)
        # each series appears when the real one does (within one read: SGLang logs its
        # gauges at its first step, after the first page), and holds the same values
        first_real: dict[tuple[Any, ...], int] = {}
        first_sim: dict[tuple[Any, ...], int] = {}
        for k, t in enumerate(fx.times):
            real = families(fx.page(rname, k))
            sim = families(page(reps[rname], t, wins))
            for got, first in ((real, first_real), (sim, first_sim)):
                for _typ, samples in got.values():
                    for key in keys(samples):
                        first.setdefault(key, k)
            if k in (len(fx.times) // 2, last):
                _same_values(name, rname, real, sim)
        assert first_sim.keys() == first_real.keys(), (name, rname)
        for key, k in first_real.items():
            assert abs(first_sim[key] - k) <= 1, (name, rname, key, k, first_sim[key])


def _same_values(name: str, rname: str, real: dict[str, Any], sim: dict[str, Any]) -> None:
    for fam, (_typ, samples) in real.items():
        want = {key: v for key, v in zip(keys(samples), (v for *_, v in samples), strict=True)}
        got = {
            key: v for key, v in zip(keys(sim[fam][1]), (v for *_, v in sim[fam][1]), strict=True)
        }
        for key, v in want.items():
            assert abs(got[key] - v) <= max(0.05 * abs(v), 1.0), (name, rname, fam, key, got, v)


@pytest.mark.parametrize("name", FIXTURES)
def test_the_simulated_engine_gives_the_real_pages_evidence(name: str) -> None:
    fx = load(name)
    clock = SimClock(fx.times[0])
    with EngineSim(sim_replicas(fx), windows(fx), clock) as sim:
        by_url = dict(zip(sim.urls(), fx.replicas, strict=True))
        source = EngineSource(
            Targets(static=sim.urls()), interval=0.5, timeout=2.0, clock=clock, active=lambda: True
        )
        for t in fx.times:
            clock.t = t
            source.poll()
        ev = source.evidence(fx.spans)
        source.close()
    assert ev is not None and ev.usable
    assert reason(ev, EngineLimits()) == fx.doc["reason"], (name, ev)
    truth = fx.truth
    assert abs(ev.preemptions - truth["preemptions"]) <= 0.05 * truth["preemptions"] + 1e-6
    assert abs(ev.peak_running - truth["peak_running"]) <= 0.05 * truth["peak_running"]
    for url, replica in by_url.items():
        hostport = url.split("/")[2]
        want = truth["tokens"][replica]
        assert abs(ev.tokens[hostport] - want) <= 0.05 * want, (name, replica)
