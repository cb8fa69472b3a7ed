"""The global view through remote write: Prometheus -> VictoriaMetrics, fleet queries agree.

A real `serve` with a small fleet, a real Prometheus (examples/prometheus/prometheus.yml with
`remote_write` added, intervals shortened) and a real VictoriaMetrics (Debian's
`victoria-metrics`) on 127.0.0.1. Every query of the fleet dashboard, and every recording
rule's output, is asked of both stores at the same instant: the same series (VictoriaMetrics
adds only the `cluster` external label) with the same values, within a scrape's tolerance.
vmalert (same package) accepts every rule file as-is, and evaluates the recording rules
against VictoriaMetrics to the same ratios as Prometheus.

MetricsQL differences met here (see docs/fleet.md): `increase()`/`rate()` do not extrapolate
to the window's edges as PromQL's do, so a ratio of two increases agrees, a bare increase
may differ by up to one scrape's worth; VictoriaMetrics hides the last 30 s of samples by
default (`-search.latencyOffset`), set to 1s here.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.render.addresses import FLEET_PATH
from tests.support import grafana_vars
from tests.support.procs import REPO, Proc, free_port, wait_until
from tests.support.prometheus import binary, victoria_metrics
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

JOBS = 12
SCRAPE = "1s"
TOLERANCE = 0.05  # relative; rate windows may hold one scrape more or less at their edges


def vm_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package victoria-metrics)")
    return path


def write_fleet(root: Path, stop: threading.Event) -> None:
    regimes = list(REGIMES.values())
    streams = []
    for i in range(JOBS):
        path = root / f"team{i % 3}" / f"exp{i:02d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        stream = records([(regimes[i % len(regimes)], 10**6)], seed=i)
        with open(path, "wb") as f:
            for _ in range(16):
                f.write(encode(next(stream)))
        streams.append((path, stream))

    def append() -> None:
        while not stop.wait(1.0):
            for path, stream in streams:
                with open(path, "ab") as f:
                    f.write(encode(next(stream)))

    threading.Thread(target=append, daemon=True).start()


def substitute(expr: str) -> str:
    return grafana_vars.substitute(expr, rate_interval="30s", interval="1s", range_="1m")


def fleet_queries() -> list[tuple[str, str]]:
    doc = json.loads((REPO / FLEET_PATH).read_text())
    panels = []
    for p in doc["panels"]:
        panels += [p, *p.get("panels", [])]
    out = []
    for p in panels:
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}", substitute(t["expr"])))
    return out


def recording_outputs(pattern: str = "*.rules.yaml", every_evaluation: bool = False) -> list[str]:
    """The records of the rule files; `every_evaluation`: only groups evaluated at the global
    interval (not the bound alerts' reference group, which runs every 2m)."""
    names = []
    for path in sorted((REPO / "alerts").glob(pattern)):
        for group in yaml.safe_load(path.read_text())["groups"]:
            if every_evaluation and "interval" in group:
                continue
            names += [r["record"] for r in group["rules"] if "record" in r]
    return names


def instant(url: str, expr: str, at: float) -> dict[frozenset, float]:
    r = requests.get(url + "/api/v1/query", params={"query": expr, "time": at}, timeout=20)
    assert r.ok, f"{url}: {r.status_code} {r.text}\n{expr}"
    data = r.json()["data"]
    if data["resultType"] == "scalar":
        return {frozenset(): float(data["result"][1])}
    return {
        frozenset((k, v) for k, v in s["metric"].items() if k != "cluster"): float(s["value"][1])
        for s in data["result"]
    }


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-9)


def test_vmalert_accepts_every_rule_file():
    vmalert = vm_binary("vmalert")
    out = subprocess.run(
        [vmalert, "-dryRun", f"-rule={REPO / 'alerts'}/*.rules.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_fleet_queries_agree_between_prometheus_and_victoriametrics(tmp_path):
    vm = vm_binary("victoria-metrics")
    prometheus = binary("prometheus")
    stop = threading.Event()
    root = tmp_path / "verl"
    write_fleet(root, stop)
    ex = Exporter(tmp_path / "exporter", "--verl-root", str(root), "--verl-interval", "0.5")
    procs: list[Proc] = []
    try:
        vm_url = victoria_metrics(vm, tmp_path / "vm", tmp_path / "vm.log", procs)
        # the example config, with remote write and test-speed intervals
        conf_dir = tmp_path / "examples" / "prometheus"
        shutil.copytree(REPO / "examples" / "prometheus", conf_dir)
        shutil.copytree(REPO / "alerts", tmp_path / "alerts")
        for rules in (tmp_path / "alerts").glob("*.rules.yaml"):  # the 2m groups too: their
            groups = yaml.safe_load(rules.read_text())  # first round may come 2 minutes late
            for group in groups["groups"]:
                group.pop("interval", None)
            rules.write_text(yaml.safe_dump(groups, sort_keys=False))
        config = yaml.safe_load((conf_dir / "prometheus.yml").read_text())
        config["global"].update(scrape_interval=SCRAPE, evaluation_interval=SCRAPE)
        config["global"]["scrape_timeout"] = SCRAPE
        config["remote_write"] = [
            {"url": f"{vm_url}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}
        ]
        (conf_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        (conf_dir / "targets" / "fleet.yaml").write_text(
            yaml.safe_dump([{"targets": [f"127.0.0.1:{ex.port}"]}])
        )
        prom_port = free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        procs.append(
            Proc(
                [
                    prometheus,
                    f"--config.file={conf_dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prometheus.log",
            )
        )

        def explain() -> str:
            return "\n".join(p.output()[-1500:] for p in procs)

        def fleet_in(url: str) -> bool:
            got = instant(url, "count(rlhf_step)", time.time() - 2)
            return got.get(frozenset()) == JOBS

        wait_until(lambda: fleet_in(prom_url), 30, 0.5, f"fleet in Prometheus\n{explain()}")
        wait_until(lambda: fleet_in(vm_url), 30, 0.5, f"fleet in VictoriaMetrics\n{explain()}")
        # the cluster external label arrives with every remote-written series
        r = requests.get(vm_url + "/api/v1/series", params={"match[]": "rlhf_step"}, timeout=10)
        assert {s.get("cluster") for s in r.json()["data"]} == {"example"}
        time.sleep(35)  # the 30 s rate windows fill; recording rules have run many times
        at = time.time() - 3  # both stores have everything up to here
        checked, empty, differ = 0, [], []
        queries = fleet_queries() + [(f"recording {n}", n) for n in recording_outputs()]
        for what, expr in queries:
            p, v = instant(prom_url, expr, at), instant(vm_url, expr, at)
            limited = re.search(r"\nand on \([^)]*\)\n(topk|bottomk)\(", expr)
            if limited:  # a per-job panel's worst few: which of tied jobs is the engine's
                assert len(p) == len(v), f"{what}: {len(p)} vs {len(v)} series\n{expr}"
                expr = expr[: limited.start()]  # and the unlimited series agree
                p, v = instant(prom_url, expr, at), instant(vm_url, expr, at)
            assert set(p) == set(v), f"{what}: series differ\n{expr}\n{p}\n{v}"
            if not p:
                empty.append(what)
                continue
            bad = {k: (p[k], v[k]) for k in p if not close(p[k], v[k])}
            if bad:
                differ.append((what, expr, bad))
            checked += 1
        assert not differ, differ
        # most of them have data (the rest need Ray or GPUs, absent here: 52 of 68 had)
        assert checked >= len(queries) * 2 // 3, (checked, empty)

        # the recording rules under vmalert too, reading and writing VictoriaMetrics (its
        # outputs carry ruler="vmalert"): the ratios agree with Prometheus's; a bare rate/increase over a window longer than the data does not
        # (MetricsQL divides by the time the samples span, PromQL by the window)
        procs.append(
            Proc(
                [
                    vm_binary("vmalert"),
                    f"-datasource.url={vm_url}",
                    f"-remoteWrite.url={vm_url}",
                    f"-rule={tmp_path / 'alerts' / 'recording.rules.yaml'}",
                    "-evaluationInterval=1s",
                    "-remoteWrite.flushInterval=1s",
                    "-external.label=ruler=vmalert",
                    f"-httpListenAddr=127.0.0.1:{free_port()}",
                ],
                tmp_path / "vmalert.log",
            )
        )
        ratios = [
            n
            for n in recording_outputs("recording.rules.yaml", every_evaluation=True)
            if ":ratio_" in n
        ]

        def vmalert_ran() -> bool:
            got = instant(vm_url, f'count({ratios[0]}{{ruler="vmalert"}})', time.time() - 2)
            return bool(got)

        wait_until(vmalert_ran, 30, 0.5, f"vmalert's outputs in VictoriaMetrics\n{explain()}")
        time.sleep(3)
        at = time.time() - 3
        agreed = 0
        for name in ratios:
            p = instant(prom_url, name, at)
            v = {
                k - {("ruler", "vmalert")}: x
                for k, x in instant(vm_url, f'{name}{{ruler="vmalert"}}', at).items()
            }
            if not p:
                continue  # GPU ratios: no GPUs here
            assert set(p) == set(v), f"vmalert {name}: series differ\n{p}\n{v}"
            bad = {k: (p[k], v[k]) for k in p if not close(p[k], v[k])}
            assert not bad, f"vmalert {name}: {bad}"
            agreed += 1
        assert agreed >= 5, agreed
        # the verdict code: the same series (a job's verdict may change between the two
        # rulers' evaluations, so values are not compared)
        code = next(n for n in recording_outputs() if n.endswith(":code"))
        p = instant(prom_url, code, at)
        v = instant(vm_url, f'{code}{{ruler="vmalert"}}', at)
        assert p and set(p) == {k - {("ruler", "vmalert")} for k in v}
    finally:
        stop.set()
        for p in reversed(procs):
            p.terminate()
        ex.terminate()
