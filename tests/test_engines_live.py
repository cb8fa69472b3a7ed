"""The engines end to end in wall time: a real `serve` reads a verl job written step by step
and simulated vLLM servers whose rollout follows the job's `gen` windows; a real Prometheus
scrapes the sidecar. The step's reason comes from the engines (queueing, where the log alone
says generation), and every query of the job dashboard's engines row returns data.
"""

from __future__ import annotations

import json
import time

import pytest

from rlhf_exporter.render.addresses import JOB_PATH
from rlhf_exporter.render.dashboards import targets
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import grafana_vars
from tests.support.prometheus import Prometheus
from tests.support.serve import Exporter
from tests.support.sim_engine import EngineSim, scenario

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

GEN, UPDATE, STEPS = 3.0, 1.0, 5
ENGINE_PANELS = range(551, 557)


def test_engine_reason_and_the_engines_row_live(tmp_path) -> None:
    replicas, expected = scenario("queueing")
    sim = EngineSim(replicas, []).start()
    exp = Exporter(tmp_path / "serve", *(a for u in sim.urls() for a in ("--engine-target", u)))
    prom = None
    try:
        prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{exp.port}"], scrape_interval="500ms")
        (exp.verl_root / "p").mkdir()
        path = exp.verl_root / "p" / "live.jsonl"
        for step in range(1, STEPS + 1):
            start = time.time()
            sim.windows.append((start, start + GEN))  # the engines play this step's rollout
            time.sleep(GEN + UPDATE)
            record = {
                "step": step,
                "data": {
                    "timing_s/step": GEN + UPDATE,
                    "timing_s/gen": GEN,
                    "timing_s/update_actor": UPDATE,
                    "response_length/mean": 100.0,
                    "response_length/max": 150.0,
                },
            }
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        exp.wait_for(
            lambda: prom.query(
                f'rlhf_bottleneck_reason{{experiment="live",reason="{expected}"}} == 1'
            ),
            30,
            what="Prometheus to see the engine reason",
        )
        steps = prom.query(
            f'rlhf_bottleneck_reason_steps_total{{experiment="live",reason="{expected}"}}'
        )
        assert float(steps[0]["value"][1]) >= STEPS - 2  # the first step may precede 1 Hz reads
        dash = json.loads(targets(load_thresholds(None))[JOB_PATH])
        panels = [p for row in dash["panels"] for p in [row, *row.get("panels", [])]]
        checked = 0
        for p in panels:
            if p.get("id") not in ENGINE_PANELS:
                continue
            for t in p["targets"]:
                expr = grafana_vars.substitute(t["expr"], project="p", experiment="live")
                assert prom.query(expr), (p["id"], p["title"], expr)
                checked += 1
        assert checked == 10
        up = prom.query("rlhf_engine_up == 1")
        assert len(up) == len(replicas)
    finally:
        if prom is not None:
            prom.terminate()
        exp.terminate()
        sim.stop()
