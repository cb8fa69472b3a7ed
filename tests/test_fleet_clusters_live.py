"""Two clusters in one VictoriaMetrics, kept apart (issue 49), with real binaries on 127.0.0.1.

Each "cluster" has its own real exporter (`serve --verl-root`) whose fleet holds the same job
`grpo/exp1` (and one job of its own), and its own Prometheus, whose scrape relabels
`instance` to the same pod address in both. Cluster `a`'s Prometheus is full: it evaluates
the shipped rules itself and remote-writes series and outputs with `cluster="a"`. Cluster
`b`'s runs in agent mode (Prometheus 2.42 `--enable-feature=agent`: scrape and remote-write
only, `cluster="b"`); vmalert evaluates the same shipped rules against VictoriaMetrics for it
(each group limited to `cluster="b"` by VictoriaMetrics' `extra_label` query argument, so
cluster `a`'s rules do not run twice), writes their outputs back and sends alerts to a real
Alertmanager. Asserted through VictoriaMetrics' Prometheus API:

- the raw series of `grpo/exp1` are two, one per cluster, with the same `job` and `instance`;
- a recording rule's output (the verdict code) is two rows, one per cluster, each the code of
  that cluster's own job (a rollout-bound job in `a`, a sync-bound one in `b`), the `b` row
  written by vmalert only;
- the fleet dashboard's "Every job" table and "Verdict per job" queries give one row per
  cluster for `grpo/exp1`, with each cluster's own values.

Reduced scale: 2 jobs per cluster, 1 s scrapes; about 40 s. The 5-minute store outage and
the 10,000-job scale of issue 49 are not run here (docs/fleet.md).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.render.addresses import FLEET_PATH
from rlhf_exporter.render.rules.recording import VERDICT_CODE, VERDICT_CODES
from tests.support import grafana_vars
from tests.support.procs import REPO, Proc, free_port, wait_until
from tests.support.prometheus import Alertmanager, binary, victoria_metrics
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

SCRAPE = "1s"
SHARED_ADDRESS = "10.0.0.7:9400"  # both clusters' exporter pods have this address
# cluster -> {job: regime}: the shared job is rollout-bound in a, sync-bound in b
FLEETS = {
    "a": {("grpo", "exp1"): "rollout_long_tail", ("grpo", "only-a"): "balanced"},
    "b": {("grpo", "exp1"): "sync_bound", ("ppo", "only-b"): "update_low_mfu"},
}
EXPECTED_VERDICT = {"a": "rollout", "b": "sync"}


def vm_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package victoria-metrics)")
    return path


def write_fleet(root: Path, jobs: dict[tuple[str, str], str], stop: threading.Event) -> None:
    streams = []
    for i, ((project, experiment), regime) in enumerate(sorted(jobs.items())):
        path = root / project / f"{experiment}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        stream = records([(REGIMES[regime], 10**6)], seed=i)
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


def shipped_rules(dest: Path, params: dict[str, list[str]] | None = None) -> list[Path]:
    """alerts/*.rules.yaml, every group at the global interval (a 2m group's first round may
    come 2 minutes late), with vmalert's per-group query `params` if given."""
    dest.mkdir(parents=True)
    out = []
    for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group.pop("interval", None)
            if params:
                group["params"] = params
        (dest / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(dest / path.name)
    return out


def prometheus(
    workdir: Path, cluster: str, exporter: Exporter, vm_url: str, rules: list[Path] | None
) -> Proc:
    """A full Prometheus evaluating `rules`, or (rules None) one in agent mode."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": SCRAPE,
            "scrape_timeout": SCRAPE,
            "evaluation_interval": SCRAPE,
            "external_labels": {"cluster": cluster},
        },
        "scrape_configs": [
            {
                "job_name": "rlhf-exporter",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
                "relabel_configs": [{"target_label": "instance", "replacement": SHARED_ADDRESS}],
            }
        ],
        "remote_write": [
            {"url": f"{vm_url}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}
        ],
    }
    if rules is not None:
        config["rule_files"] = [str(p) for p in rules]
    workdir.mkdir(parents=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    storage = (
        [f"--storage.tsdb.path={workdir / 'data'}"]
        if rules is not None
        else ["--enable-feature=agent", f"--storage.agent.path={workdir / 'wal'}"]
    )
    proc = Proc(
        [
            binary("prometheus"),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *storage,
        ],
        workdir / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: requests.get(url + "/-/ready", timeout=1).ok, 60, what=f"{cluster} ready")
    return proc


def query(vm_url: str, expr: str, at: float) -> list[dict]:
    r = requests.get(vm_url + "/api/v1/query", params={"query": expr, "time": at}, timeout=20)
    assert r.ok, f"{r.status_code} {r.text}\n{expr}"
    return r.json()["data"]["result"]


def by_cluster(result: list[dict]) -> dict[str, float]:
    """cluster -> value of a result that must have one row per cluster."""
    clusters = [s["metric"].get("cluster", "") for s in result]
    assert len(clusters) == len(set(clusters)), f"two rows of one cluster: {result}"
    return {c: float(s["value"][1]) for c, s in zip(clusters, result)}


def every_job_queries() -> list[tuple[str, str]]:
    """(what, PromQL) of the fleet dashboard's table and verdict timeline, for grpo/exp1."""
    doc = json.loads((REPO / FLEET_PATH).read_text())
    panels = [q for p in doc["panels"] for q in (p, *p.get("panels", []))]
    titles = ("Every job: verdict, throughput, health", "Verdict per job")
    out = []
    for p in panels:
        if p["title"] in titles:
            for t in p["targets"]:
                expr = grafana_vars.substitute(
                    t["expr"], rate_interval="30s", interval="1s", range_="1m",
                    project="grpo", experiment="exp1",
                )  # fmt: skip
                out.append((f"{p['title']!r} {t['refId']}", expr))
    assert len(out) > 10, out
    return out


def test_two_clusters_with_the_same_job_and_address_stay_apart(tmp_path):
    vm = vm_binary("victoria-metrics")
    vmalert = vm_binary("vmalert")
    stop = threading.Event()
    procs: list[Proc] = []
    exporters: dict[str, Exporter] = {}
    try:
        for cluster, jobs in FLEETS.items():
            root = tmp_path / cluster / "verl"
            write_fleet(root, jobs, stop)
            exporters[cluster] = Exporter(
                tmp_path / cluster / "exporter", "--verl-root", str(root), "--verl-interval", "0.5"
            )
        vm_url = victoria_metrics(vm, tmp_path / "vm", tmp_path / "vm.log", procs)
        am = Alertmanager(
            tmp_path / "am", {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
        )
        procs.append(am)
        rules_a = shipped_rules(tmp_path / "rules-a")
        procs.append(prometheus(tmp_path / "prom-a", "a", exporters["a"], vm_url, rules_a))
        procs.append(prometheus(tmp_path / "prom-b", "b", exporters["b"], vm_url, None))
        rules_b = shipped_rules(tmp_path / "rules-b", {"extra_label": ["cluster=b"]})
        procs.append(
            Proc(
                [
                    vmalert,
                    f"-datasource.url={vm_url}",
                    f"-remoteWrite.url={vm_url}",
                    f"-notifier.url={am.url}",
                    *(f"-rule={p}" for p in rules_b),
                    "-evaluationInterval=1s",
                    "-remoteWrite.flushInterval=1s",
                    "-external.label=cluster=b",
                    "-external.label=ruler=vmalert",
                    f"-httpListenAddr=127.0.0.1:{free_port()}",
                ],
                tmp_path / "vmalert.log",
            )
        )

        def explain() -> str:
            return "\n".join(p.output()[-1500:] for p in procs)

        job = 'project="grpo", experiment="exp1"'

        def both(expr: str) -> bool:
            return set(by_cluster(query(vm_url, expr, time.time() - 2))) == {"a", "b"}

        wait_until(lambda: both(f"rlhf_step{{{job}}}"), 40, 0.5, f"both clusters\n{explain()}")
        expected = {c: float(VERDICT_CODES[v]) for c, v in EXPECTED_VERDICT.items()}

        def verdicts_recorded() -> bool:
            return by_cluster(query(vm_url, f"{VERDICT_CODE}{{{job}}}", time.time() - 2)) == (
                expected
            )

        wait_until(verdicts_recorded, 60, 0.5, f"each cluster's verdict code\n{explain()}")
        time.sleep(5)  # a few more rounds of rules and remote write
        at = time.time() - 3

        # the raw series: two, the same job and address, apart by cluster only
        raw = query(vm_url, f"rlhf_step{{{job}}}", at)
        assert len(raw) == 2, raw
        assert {s["metric"]["instance"] for s in raw} == {SHARED_ADDRESS}
        rest = [{k: v for k, v in s["metric"].items() if k != "cluster"} for s in raw]
        assert rest[0] == rest[1], rest

        # the recording rule's output: one row per cluster, b's from vmalert only
        recorded = query(vm_url, f"{VERDICT_CODE}{{{job}}}", at)
        assert by_cluster(recorded) == expected, recorded
        rulers = {s["metric"]["cluster"]: s["metric"].get("ruler") for s in recorded}
        assert rulers == {"a": None, "b": "vmalert"}, rulers
        assert not query(vm_url, 'count({ruler="vmalert", cluster!="b"})', at)

        # the fleet dashboard: one row per cluster, with each cluster's own values
        own = {
            "verdict": expected,
            "step time": by_cluster(query(vm_url, f"rlhf_step_duration_seconds{{{job}}}", at)),
        }
        assert own["step time"]["a"] != own["step time"]["b"], own
        rows = 0
        for what, expr in every_job_queries():
            result = query(vm_url, expr, at)
            if not result:
                continue  # GPU and alert columns: no GPUs, no alert here
            got = by_cluster(result)
            assert set(got) == {"a", "b"}, f"{what}: {result}\n{expr}"
            for s in result:
                assert (s["metric"]["project"], s["metric"]["experiment"]) == ("grpo", "exp1")
            if "rlhf_step_duration_seconds" in expr:
                assert got == own["step time"], (what, got, own)
            if expr.startswith(f"max by (cluster, namespace, project, experiment) ({VERDICT_CODE}"):
                assert got == own["verdict"], (what, got, own)
            rows += 1
        assert rows >= 8, rows
    finally:
        stop.set()
        for p in reversed(procs):
            p.terminate()
        for ex in exporters.values():
            ex.terminate()
