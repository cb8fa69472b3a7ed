"""A fleet on one exporter, scraped by a real Prometheus run from examples/prometheus as-is.

300 verl jobs (a tenth of them rollout-bound) step every few seconds; one `serve` watches
them; Prometheus runs examples/prometheus/prometheus.yml unchanged (15 s scrapes, every rule
file of alerts/, file-based discovery: the test writes only the targets file). Checked:
every job's series arrives, every rule group evaluates without a failure, and `ALERTS` holds
only what the scenario expects. Kept under a minute.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
import yaml

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from tests.support.procs import REPO, Proc, free_port, wait_until
from tests.support.prometheus import binary
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

JOBS = 300
ROLLOUT_BOUND = {f"exp{i:03d}" for i in range(0, JOBS, 10)}


def write_fleet(root: Path, stop: threading.Event) -> None:
    """Every job gets 20 steps now, then one more every 3 s (staggered)."""
    streams = {}
    for i in range(JOBS):
        exp = f"exp{i:03d}"
        regime = REGIMES["rollout_long_tail"] if exp in ROLLOUT_BOUND else REGIMES["balanced"]
        streams[exp] = (root / f"team{i % 6}" / f"{exp}.jsonl", records([(regime, 10**6)], seed=i))
        streams[exp][0].parent.mkdir(parents=True, exist_ok=True)
        with open(streams[exp][0], "wb") as f:
            for _ in range(21):  # step 0 (validation) and 20 steps
                f.write(encode(next(streams[exp][1])))

    def append() -> None:
        while not stop.wait(3.0 / JOBS * 50):
            for _ in range(50):
                exp = next(cycle)
                path, stream = streams[exp]
                with open(path, "ab") as f:
                    f.write(encode(next(stream)))

    def forever():
        while True:
            yield from streams

    cycle = forever()
    threading.Thread(target=append, daemon=True).start()


def test_a_300_job_fleet_on_the_example_prometheus(tmp_path):
    prometheus = binary("prometheus")
    started = time.monotonic()
    stop = threading.Event()
    root = tmp_path / "verl"
    write_fleet(root, stop)
    ex = Exporter(tmp_path / "exporter", "--verl-root", str(root), "--verl-interval", "1")
    prom = None
    try:
        # the example as-is, next to a copy of the rules it names
        shutil.copytree(REPO / "alerts", tmp_path / "repo" / "alerts")
        conf_dir = tmp_path / "repo" / "examples" / "prometheus"
        shutil.copytree(REPO / "examples" / "prometheus", conf_dir)
        (conf_dir / "targets" / "fleet.yaml").write_text(
            yaml.safe_dump([{"targets": [f"127.0.0.1:{ex.port}"]}])
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        prom = Proc(
            [
                prometheus,
                f"--config.file={conf_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            tmp_path / "prometheus.log",
        )

        def query(promql: str) -> list[dict]:
            r = requests.get(url + "/api/v1/query", params={"query": promql}, timeout=10)
            r.raise_for_status()
            return r.json()["data"]["result"]

        def explain() -> str:
            return prom.output()[-3000:] if prom else ""

        # every job's series arrives (the first scrape comes within one 15 s interval)
        def all_jobs() -> bool:
            got = query("count(count by (project, experiment) (rlhf_step))")
            return bool(got) and int(float(got[0]["value"][1])) == JOBS

        wait_until(all_jobs, 45, 1.0, f"all {JOBS} jobs in Prometheus\n{explain()}")
        arrived = time.time()
        assert query('up{job="rlhf-exporter"}')[0]["value"][1] == "1"
        assert query('rlhf_exporter_jobs{collector="verl"}')[0]["value"][1] == str(JOBS)
        # the cluster external label is not part of local series (it is added on the way out)
        assert not query('rlhf_step{cluster!=""}')

        # every rule group evaluates after the data arrived, without a failure; a group with
        # an interval of a minute or more (the bound alerts' 6 h reference, every 2m; the GPU
        # groups, every 1m: promtool tests them) may not have run yet: its rules must only
        # never have failed
        def rules() -> list[dict] | None:
            r = requests.get(url + "/api/v1/rules", timeout=10)
            r.raise_for_status()
            groups = r.json()["data"]["groups"]
            evaluated = all(
                g["interval"] >= 60
                or (g["lastEvaluation"] and _unix(g["lastEvaluation"]) > arrived)
                for g in groups
            )
            return groups if groups and evaluated else None

        groups = wait_until(rules, 40, 1.0, f"every rule group evaluated\n{explain()}")
        files = {Path(g["file"]).name for g in groups}
        assert files == {p.name for p in (REPO / "alerts").glob("*.rules.yaml")}
        bad = [
            (g["name"], r.get("name") or r.get("alert"), r.get("lastError"))
            for g in groups
            for r in g["rules"]
            if r["health"] == "err"
        ]
        assert not bad, bad

        # the recording rules see the fleet: a verdict ratio for every job once two scrapes
        # are in (increase() needs two samples)
        def ratios() -> bool:
            got = query(
                "count(count by (project, experiment) "
                "(project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate30m))"
            )
            return bool(got) and int(float(got[0]["value"][1])) == JOBS

        wait_until(ratios, 35, 1.0, f"a verdict ratio for every job\n{explain()}")
        rollout = query(
            'project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate30m{verdict="rollout"}'
            " >= 0.7"
        )
        assert {r["metric"]["experiment"] for r in rollout} == ROLLOUT_BOUND

        # ALERTS holds only what the scenario expects: at most the rollout-bound jobs'
        # RLHFJobRolloutBound, pending (its `for` is 15m); nothing about the exporter itself
        for alert in query("ALERTS"):
            labels = alert["metric"]
            assert labels["alertname"] == "RLHFJobRolloutBound", labels
            assert labels["experiment"] in ROLLOUT_BOUND, labels
            assert labels["alertstate"] == "pending", labels
        assert time.monotonic() - started < 60 or pytest.fail("the fleet test took over a minute")
    finally:
        stop.set()
        if prom is not None:
            prom.terminate()
        ex.terminate()


def _unix(rfc3339: str) -> float:
    """Prometheus's RFC 3339 times carry nanoseconds; datetime takes microseconds."""
    m = re.fullmatch(r"(.*?T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    frac = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone).timestamp()
