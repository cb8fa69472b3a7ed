"""Two stores as an HA pair, one of them killed: nothing lost, queries answered (issue 49).

One cluster (`h`) with an HA pair of Prometheus 2.42 agents scraping the same real exporter
(1 s scrapes), each with its replica as an external label that its remote write drops (the
kube-prometheus-stack example clears the Operator's `prometheus_replica` the same way), each
writing to both of two single-node VictoriaMetrics with `-dedup.minScrapeInterval=1s`. Queries
go through vmauth, which balances them over both stores and retries a dead one on the other.
Store 2 is killed (SIGKILL) half-way. vmauth 1.79 (Debian's) does not retry a request that
failed on a dead store on the other, so some queries fail until its configuration names the
live store only (reloaded on SIGHUP; newer vmauth retries on its own). Then, through vmauth:

- the pair's two copies are one series (no replica label) with one sample per scrape
  interval (deduplicated), before and after the kill;
- every series has a sample in every second from before the kill to well after it: nothing
  lost, every query answered (store 1 has it all);
- store 1 alone, asked directly, holds the same.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.support.procs import Proc, free_port, wait_until
from tests.support.prometheus import binary, victoria_metrics, vm_binary, vm_export
from tests.support.serve import Exporter
from tests.test_fleet_clusters_live import write_fleet

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

BEFORE_S = 20.0  # seconds of both stores up, then of store 1 alone
DEDUP = "1s"
AUTH = ("grafana", "fleet")  # vmauth 1.79 serves known users only


def replica(workdir: Path, name: str, exporter: Exporter, stores: list[str]) -> Proc:
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": "1s",
            "external_labels": {"cluster": "h", "prometheus_replica": name},
        },
        "scrape_configs": [
            {
                "job_name": "rlhf-exporter",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
            }
        ],
        "remote_write": [
            {
                "url": f"{url}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s"},
                "write_relabel_configs": [{"action": "labeldrop", "regex": "prometheus_replica"}],
            }
            for url in stores
        ],
    }
    workdir.mkdir(parents=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = Proc(
        [
            binary("prometheus"),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=agent",
            f"--storage.agent.path={workdir / 'wal'}",
        ],
        workdir / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: requests.get(url + "/-/ready", timeout=1).ok, 60, what=f"{name} ready")
    return proc


def write_auth(workdir: Path, stores: list[str]) -> None:
    user = {"username": AUTH[0], "password": AUTH[1], "url_prefix": stores}
    (workdir / "auth.yml").write_text(yaml.safe_dump({"users": [user]}))


def vmauth(workdir: Path, stores: list[str]) -> tuple[Proc, str]:
    """vmauth balancing every request over `stores` (a dead one's requests go to another)."""
    workdir.mkdir(parents=True)
    write_auth(workdir, stores)
    port = free_port()
    proc = Proc(
        [
            vm_binary("vmauth"),
            f"-auth.config={workdir / 'auth.yml'}",
            f"-httpListenAddr=127.0.0.1:{port}",
        ],
        workdir / "vmauth.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: requests.get(url + "/api/v1/status/buildinfo", auth=AUTH, timeout=1).ok,
        30,
        what="vmauth ready",
    )
    return proc, url


def longest_step(timestamps: list[int], start: float, end: float) -> float:
    inside = [start * 1e3, *(t for t in timestamps if start * 1e3 < t < end * 1e3), end * 1e3]
    return max(b - a for a, b in itertools.pairwise(inside)) / 1e3


def test_an_ha_pair_of_stores_loses_nothing_when_one_dies(tmp_path):
    vm = vm_binary("victoria-metrics")
    stop = threading.Event()
    procs: list[Proc] = []
    exporter = None
    try:
        write_fleet(
            tmp_path / "verl", {("grpo", "exp1"): "balanced", ("ppo", "e2"): "sync_bound"}, stop
        )
        exporter = Exporter(
            tmp_path / "exporter", "--verl-root", str(tmp_path / "verl"), "--verl-interval", "0.5"
        )
        dedup = [f"-dedup.minScrapeInterval={DEDUP}"]
        stores = [
            victoria_metrics(vm, tmp_path / f"vm{i}", tmp_path / f"vm{i}.log", procs, None, dedup)
            for i in (1, 2)
        ]
        store_procs = list(procs)
        for name in ("r1", "r2"):
            procs.append(replica(tmp_path / name, name, exporter, stores))
        auth, url = vmauth(tmp_path / "vmauth", stores)
        procs.append(auth)

        def up_count() -> int:
            r = requests.get(
                url + "/api/v1/query", params={"query": "up"}, auth=AUTH, timeout=5
            ).json()
            return len(r["data"]["result"])

        wait_until(up_count, 60, 0.5, "both replicas' samples in the stores")
        start = time.time()
        time.sleep(BEFORE_S)
        store_procs[1].popen.send_signal(signal.SIGKILL)  # a crash: no flush, no goodbye
        store_procs[1].popen.wait(10)
        killed = time.time()
        time.sleep(BEFORE_S)
        end = time.time() - 3  # what both replicas have sent by now

        # vmauth 1.79 balances over both stores but does not retry a dead one on the other:
        # some queries fail until its configuration names store 1 only (reloaded on SIGHUP)
        def answered() -> list[bool]:
            return [
                requests.get(url + "/api/v1/query", params={"query": "up"}, auth=AUTH, timeout=5).ok
                for _ in range(10)
            ]

        balanced = answered()
        assert not all(balanced), balanced
        write_auth(tmp_path / "vmauth", stores[:1])
        auth.popen.send_signal(signal.SIGHUP)
        wait_until(lambda: all(answered()), 10, 0.5, "vmauth on store 1 alone")
        assert up_count() == 1  # one series: the pair's two copies are one

        # nothing lost, deduplicated: one sample per second, before and after the kill
        via_auth = {
            frozenset(s["metric"].items()): s["timestamps"]
            for s in vm_export(url, '{cluster="h"}', start, end, AUTH)
        }
        alone = {
            frozenset(s["metric"].items()): s["timestamps"]
            for s in vm_export(stores[0], '{cluster="h"}', start, end)
        }
        assert len(via_auth) > 200, len(via_auth)
        assert via_auth == alone
        scraped = {k: v for k, v in alone.items() if not dict(k)["__name__"].startswith("scrape_")}
        assert all("prometheus_replica" not in dict(k) for k in scraped)
        steps = {dict(k)["__name__"]: longest_step(v, start, end) for k, v in scraped.items()}
        assert max(steps.values()) <= 1.5, sorted(steps.items(), key=lambda kv: -kv[1])[:5]
        up = next(v for k, v in scraped.items() if dict(k)["__name__"] == "up")
        seconds = end - start
        assert seconds - 2 <= len(up) <= seconds + 2, (len(up), seconds)  # deduplicated
        print(
            f"HA pair: store 2 killed after {killed - start:.0f} s; {len(scraped)} series, "
            f"{len(up)} samples each over {seconds:.0f} s through vmauth and in store 1"
        )
    finally:
        stop.set()
        for p in reversed(procs):
            p.terminate()
        if exporter is not None:
            exporter.terminate()
