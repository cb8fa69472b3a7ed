"""A live Prometheus that falls behind in remote-writing to the fleet's store (issue 49).

Two full Prometheus 2.42 servers on 127.0.0.1, each scraping itself every second (its own
remote-write metrics are the lag record's inputs) and evaluating the shipped
alerts/remote-write.rules.yaml, remote-write into one VictoriaMetrics. Cluster `a`'s path
goes through `SlowProxy`, a test-owned HTTP proxy that holds each remote-write request for
`DELAY_S` seconds before forwarding it; its queue sends at most one request at a time of
`BATCH` samples (`max_shards: 1`), so it sends far fewer samples per second than it scrapes
and its lag grows about one second per second. Cluster `b` writes straight to the store.

Asserted:

- `instance_url:remote_write_lag:seconds` (the rendered recording rule, evaluated by each
  Prometheus, where a full Prometheus's own lag is known: docs/fleet.md) passes the
  alert's limit for `a` and stays far below it for `b`;
- RLHFRemoteWriteBehind (the rendered expression and labels) fires for `a` only. Its `for:`
  is shortened here to `FOR` to keep the test short; the promtool tests
  (tests/test_fleet_remote_write_rules.py) keep the real one;
- once the proxy stops holding requests, `a`'s lag falls back under `CAUGHT_UP_S`, the
  alert resolves, and every sample `a` has in its own TSDB from before the slow period to
  its end is in the store (nothing lost, the rules' outputs and `ALERTS` included);
- the fleet dashboard's lag panel query (read from the rendered grafana/ JSON), run against
  the store over the test, returns one series per Prometheus: `a`'s above the limit, `b`'s
  below it.

About 3 minutes (the lag must pass the 120 s limit).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from rlhf_exporter.render.addresses import FLEET_PATH
from rlhf_exporter.render.rules.remotewrite import LAG, LAG_LIMIT_S, REMOTE_WRITE_FILE
from tests.support import grafana_vars
from tests.support.procs import REPO, Proc, free_port, wait_until
from tests.support.prometheus import binary, victoria_metrics, vm_binary, vm_export

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

DELAY_S = 10.0
"""How long the slow path holds each remote-write request (under the 30 s remote timeout:
every request arrives, late)."""
BATCH = 100
"""Samples per remote-write request (`max_samples_per_send`); a Prometheus scraping itself
appends several hundred samples a second."""
FOR = "10s"
"""RLHFRemoteWriteBehind's `for:` in this test (shipped: 5m, kept by the promtool tests)."""
CAUGHT_UP_S = 15.0
"""A lag under this once the proxy lets requests through: caught up."""
ALERT = "RLHFRemoteWriteBehind"


class SlowProxy:
    """Forwards every POST to `target` (the store), each after `delay` seconds."""

    def __init__(self, target: str):
        self.delay = 0.0
        self.requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(proxy.delay)
                keep = ("Content-Type", "Content-Encoding", "X-Prometheus-Remote-Write-Version")
                headers = {k: v for k in keep if (v := self.headers.get(k)) is not None}
                try:
                    r = requests.post(target + self.path, data=body, headers=headers, timeout=30)
                    status, reply = r.status_code, r.content
                except requests.RequestException as exc:
                    status, reply = 502, repr(exc).encode()
                proxy.requests += 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def lag_rules(dest: Path) -> Path:
    """The rendered remote-write rules, the alert's `for:` shortened to `FOR`."""
    doc = yaml.safe_load((REPO / REMOTE_WRITE_FILE).read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert len(alerts) == 1 and alerts[0]["expr"] == f"{LAG} > {LAG_LIMIT_S:g}", alerts
    alerts[0]["for"] = FOR
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


class Sender:
    """A full Prometheus of one cluster, scraping itself, remote-writing to `write_url`."""

    def __init__(self, workdir: Path, cluster: str, write_url: str, rules: Path):
        workdir.mkdir(parents=True)
        self.cluster = cluster
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "external_labels": {"cluster": cluster},
            },
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            ],
            "remote_write": [
                {
                    "url": write_url,
                    "name": "store",
                    "queue_config": {
                        "min_shards": 1,
                        "max_shards": 1,
                        "capacity": BATCH,
                        "max_samples_per_send": BATCH,
                        "batch_send_deadline": "1s",
                    },
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = Proc(
            [
                binary("prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            workdir / "prometheus.log",
        )
        wait_until(lambda: requests.get(self.url + "/-/ready", timeout=1).ok, 60, what="ready")

    def lag(self) -> float | None:
        r = requests.get(self.url + "/api/v1/query", params={"query": LAG}, timeout=10)
        result = r.json()["data"]["result"]
        return max(float(s["value"][1]) for s in result) if result else None

    def alert_states(self) -> set[str]:
        r = requests.get(self.url + "/api/v1/alerts", timeout=10)
        return {a["state"] for a in r.json()["data"]["alerts"] if a["labels"]["alertname"] == ALERT}


def lag_panel_query() -> str:
    """The fleet dashboard's remote-write lag query, as rendered."""
    doc = json.loads((REPO / FLEET_PATH).read_text())
    exprs = [
        t["expr"]
        for p in grafana_vars.panels(doc)
        for t in p.get("targets", [])
        if LAG in t.get("expr", "")
    ]
    assert len(exprs) == 1, exprs
    return exprs[0]


def local_samples(sender: Sender, start: float, end: float) -> dict[frozenset, set[int]]:
    """Every sample `sender` holds in [start, end] but NaNs (a summary's quantile with no
    observation: the store does not keep them), keyed by its labels as the store has them."""
    r = requests.get(
        sender.url + "/api/v1/query",
        params={"query": f'{{__name__=~".+"}}[{int(end - start) + 1}s]', "time": f"{end:.3f}"},
        timeout=60,
    )
    return {
        frozenset({**s["metric"], "cluster": sender.cluster}.items()): {
            round(float(t) * 1000)
            for t, v in s["values"]
            if start <= float(t) <= end and v != "NaN"  # the store keeps no NaN
        }
        for s in r.json()["data"]["result"]
    }


def test_a_prometheus_that_falls_behind_is_seen_alerted_and_loses_nothing(tmp_path):
    procs: list[Proc] = []
    senders: list[Sender] = []
    proxy: SlowProxy | None = None
    try:
        vm_url = victoria_metrics(
            vm_binary("victoria-metrics"), tmp_path / "vm", tmp_path / "vm.log", procs
        )
        proxy = SlowProxy(vm_url)
        rules = lag_rules(tmp_path / "remote-write.rules.yaml")
        a = Sender(tmp_path / "a", "a", f"{proxy.url}/api/v1/write", rules)
        senders.append(a)
        b = Sender(tmp_path / "b", "b", f"{vm_url}/api/v1/write", rules)
        senders.append(b)
        begin = time.time()
        wait_until(lambda: a.lag() is not None and b.lag() is not None, 60, 1, "a first send")

        # the slow path: a's queue falls behind, b's keeps up
        slow_start = time.time()
        proxy.delay = DELAY_S
        peak = {"b": 0.0}

        def behind() -> bool:
            peak["b"] = max(peak["b"], b.lag() or 0.0)
            return "firing" in a.alert_states()

        wait_until(behind, LAG_LIMIT_S + 90, 2, f"{ALERT} to fire for a")
        lag_a = a.lag()
        assert lag_a is not None and lag_a > LAG_LIMIT_S, lag_a
        assert peak["b"] < LAG_LIMIT_S / 4 and not b.alert_states(), (peak, b.alert_states())

        # the path is fast again: a catches up, the alert resolves, nothing was lost
        proxy.delay = 0.0
        slow_end = time.time()
        wait_until(
            lambda: (lag := a.lag()) is not None and lag < CAUGHT_UP_S, 120, 1, "a to catch up"
        )
        caught_up = time.time() - slow_end
        wait_until(lambda: not a.alert_states(), 30, 1, f"{ALERT} to resolve")
        local = local_samples(a, slow_start - 5, slow_end)
        assert len(local) > 100, len(local)

        def missing() -> dict[str, int]:
            stored: dict[frozenset, set[int]] = {}
            for s in vm_export(vm_url, '{cluster="a"}', slow_start - 5, slow_end):
                stored.setdefault(frozenset(s["metric"].items()), set()).update(s["timestamps"])
            gaps = {k: len(v - stored.get(k, set())) for k, v in local.items()}
            return {dict(k)["__name__"]: n for k, n in gaps.items() if n}

        try:
            wait_until(lambda: not missing(), 60, 2, "every sample in the store")
        except TimeoutError:
            pytest.fail(f"samples lost: {missing()}")

        # the fleet dashboard's lag panel, on the store: one series per Prometheus
        end = time.time()
        expr = grafana_vars.substitute(lag_panel_query(), range_=f"{int(end - begin)}s")
        r = requests.get(
            vm_url + "/api/v1/query_range",
            params={"query": expr, "start": begin, "end": end, "step": "2s"},
            timeout=30,
        )
        assert r.ok, r.text
        drawn = {
            s["metric"]["cluster"]: (s["metric"], max(float(v) for _, v in s["values"]))
            for s in r.json()["data"]["result"]
        }
        assert set(drawn) == {"a", "b"}, drawn
        assert drawn["a"][1] > LAG_LIMIT_S > drawn["b"][1], drawn
        assert all({"job", "instance", "url"} <= set(m) for m, _ in drawn.values()), drawn
        print(
            f"a {lag_a:.0f} s behind after {slow_end - slow_start:.0f} s of {DELAY_S:g} s "
            f"requests ({proxy.requests} sent); caught up {caught_up:.0f} s later; b at most "
            f"{peak['b']:.1f} s behind; {len(local)} series of a, every sample in the store"
        )
    finally:
        for sender in senders:
            sender.proc.terminate()
        if proxy is not None:
            proxy.close()
        for p in procs:
            p.terminate()
