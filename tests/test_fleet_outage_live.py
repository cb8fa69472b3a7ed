"""The fleet's store down under load, then back: nothing lost, nobody paged (issue 49).

Three "clusters" on 127.0.0.1, each with its own real exporter (`JOBS` jobs stepping every
second, 1 s scrapes) and its own way into one VictoriaMetrics:

- `a`: a full Prometheus 2.42 that evaluates the shipped rules itself and remote-writes
  (its remote-write queue tails the WAL and retries);
- `b`: a Prometheus 2.42 in agent mode (WAL only, no rules);
- `c`: vmagent with its on-disk buffer (`-remoteWrite.tmpDataPath`), restarted half-way
  through the outage.

One vmalert evaluates the shipped rules for `b` and `c` against the store (each group limited
to them by VictoriaMetrics' `extra_filters[]` query argument) and sends alerts to a real
Alertmanager. The store is stopped for `OUTAGE_S` seconds (env `FLEET_OUTAGE_S`, default 300:
five minutes, as in CI; 60 for a quicker run), then started again on its data and address.
Asserted through the store's raw samples (/api/v1/export) once the senders have caught up:

- every series scraped in each cluster has a sample at every successful scrape of its target
  over the whole gap (the `up` series, written at every scrape, is the clock: no step of it
  longer than 1.5 scrape intervals, but for the seconds vmagent itself was down);
- cluster `a`'s store copy equals its own TSDB sample for sample over the gap, recording
  rules' outputs included;
- no alert fired anywhere (Prometheus, vmalert, Alertmanager, the store's `ALERTS`) from
  the start to well after the store came back; the only ones that went pending are vmalert's
  absence alerts, for less than a minute after the store came back (they do after an outage
  longer than vmalert's 5m query step: 300 s, not 60 s).

vmalert cannot read the store while it is down, so the agent clusters' recording-rule outputs
have a hole over the gap; `vmalert -replay.timeFrom/-replay.timeTo` fills it afterwards
(docs/fleet.md, "After a store outage"), and the test runs that and asserts the hole is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from rlhf_exporter.render.rules.recording import VERDICT_CODE
from tests.support.procs import REPO, Proc, free_port, wait_until
from tests.support.prometheus import (
    Alertmanager,
    binary,
    victoria_metrics,
    vm_binary,
    vm_export,
)
from tests.support.serve import Exporter
from tests.test_fleet_clusters_live import shipped_rules, write_fleet

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

OUTAGE_S = float(os.environ.get("FLEET_OUTAGE_S", "300"))
JOBS = int(os.environ.get("FLEET_OUTAGE_JOBS", "4"))
SCRAPE_S = 1.0
SHARED_ADDRESS = "10.0.0.7:9400"
REGIMES = ("balanced", "rollout_long_tail", "sync_bound", "update_low_mfu")
AGENT_CLUSTERS = ("b", "c")
ABSENCE = {"RLHFExporterAbsent", "RLHFJobUnwatched"}
"""The alerts whose condition is a series' absence."""
REPLAY_PASSES = 3
"""The shipped records chain (a record of a record of a record): each replay pass of vmalert
reads what the pass before it wrote."""
VMALERT_PARAMS = {"extra_filters[]": ['{cluster=~"b|c"}']}


def fleet(cluster: str) -> dict[tuple[str, str], str]:
    jobs = {("grpo", "exp1"): "balanced"}
    for i in range(1, JOBS):
        jobs[("grpo", f"{cluster}-{i}")] = REGIMES[i % len(REGIMES)]
    return jobs


def scrape_config(exporter: Exporter) -> dict[str, Any]:
    return {
        "job_name": "rlhf-exporter",
        "scrape_interval": f"{SCRAPE_S:g}s",
        "scrape_timeout": f"{SCRAPE_S:g}s",
        "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
        "relabel_configs": [{"target_label": "instance", "replacement": SHARED_ADDRESS}],
    }


EXAMPLE = REPO / "examples" / "kube-prometheus-stack" / "agent-values.yaml"
OPERATOR_KEYS = {  # the Prometheus Operator's RemoteWriteSpec -> Prometheus' remote_write
    "url": "url",
    "queueConfig": "queue_config",
    "capacity": "capacity",
    "maxShards": "max_shards",
    "maxSamplesPerSend": "max_samples_per_send",
    "batchSendDeadline": "batch_send_deadline",
    "minBackoff": "min_backoff",
    "maxBackoff": "max_backoff",
}


def example_remote_write(vm_url: str) -> dict[str, Any]:
    """The kube-prometheus-stack example's remoteWrite, as Prometheus' own configuration,
    writing to `vm_url` (the one key the example cannot know)."""
    values = yaml.safe_load(EXAMPLE.read_text())
    (spec,) = values["prometheus"]["prometheusSpec"]["remoteWrite"]

    def translate(d: dict[str, Any]) -> dict[str, Any]:
        return {OPERATOR_KEYS[k]: translate(v) if isinstance(v, dict) else v for k, v in d.items()}

    out = translate(spec)
    assert urlsplit(out["url"]).path == "/api/v1/write", out
    out["url"] = f"{vm_url}/api/v1/write"
    return out


def write_config(workdir: Path, cluster: str, exporter: Exporter, vm_url: str, rules: bool) -> None:
    """`workdir/prometheus.yml`: a full Prometheus evaluating the shipped rules, or (rules
    False) one in agent mode, scraping `exporter` as `cluster`."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": f"{SCRAPE_S:g}s",
            "evaluation_interval": f"{SCRAPE_S:g}s",
            "external_labels": {"cluster": cluster},
        },
        "scrape_configs": [scrape_config(exporter)],
        "remote_write": [example_remote_write(vm_url)],
    }
    if rules:
        config["rule_files"] = [str(p) for p in shipped_rules(workdir / "rules")]
    else:
        workdir.mkdir(parents=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))


def start_prometheus(workdir: Path, rules: bool) -> tuple[Proc, str]:
    port = free_port()
    storage = (
        [f"--storage.tsdb.path={workdir / 'data'}"]
        if rules
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
    wait_until(lambda: requests.get(url + "/-/ready", timeout=1).ok, 60, what=f"{workdir} ready")
    return proc, url


def start_vmagent(workdir: Path, exporter: Exporter, vm_url: str, port: int) -> Proc:
    """vmagent scraping `exporter` as cluster `c`, its remote-write buffer on disk."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scrape.yml").write_text(
        yaml.safe_dump({"scrape_configs": [scrape_config(exporter)]})
    )
    proc = Proc(
        [
            vm_binary("vmagent"),
            f"-promscrape.config={workdir / 'scrape.yml'}",
            f"-remoteWrite.url={vm_url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={workdir / 'buffer'}",
            "-remoteWrite.label=cluster=c",
            "-remoteWrite.flushInterval=1s",
            f"-httpListenAddr=127.0.0.1:{port}",
        ],
        workdir / f"vmagent-{time.monotonic_ns()}.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: requests.get(url + "/health", timeout=1).ok, 30, what="vmagent ready")
    return proc


class AlertWatch:
    """Every alert any part reports (pending or firing), polled once a second in a thread."""

    def __init__(self, sources: dict[str, str]):
        self.sources = sources  # what -> URL of an alerts API
        self.seen: dict[tuple[str, str, str], float] = {}  # (what, alert, state) -> last seen
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for what, url in self.sources.items():
                try:
                    body = requests.get(url, timeout=5).json()
                except (requests.RequestException, ValueError):
                    continue
                alerts = (body if isinstance(body, list) else body["data"]["alerts"]) or []
                for a in alerts:
                    state = a.get("state") or a.get("status", {}).get("state", "?")
                    self.seen[what, a["labels"]["alertname"], str(state)] = time.time()
            self.polls += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def holes(
    series: list[dict], window: tuple[float, float], skip: tuple[float, float] | None
) -> list[str]:
    """What the store lacks of one cluster's scrapes in `window`: `up` steps longer than 1.5
    intervals, from the window's start to its end (but within `skip`, when the scraper itself
    was down), and every scraped series' timestamps against the successful scrapes'
    (up == 1) from its first on (no job ends)."""
    up = [s for s in series if s["metric"]["__name__"] == "up"]
    assert len(up) == 1, [s["metric"] for s in up]
    first, last = window[0] * 1e3 + 1500 * SCRAPE_S, window[1] * 1e3 - 1500 * SCRAPE_S
    stamps = [first, *up[0]["timestamps"], last]
    ok = {t for t, v in zip(up[0]["timestamps"], up[0]["values"]) if v == 1}
    out = []
    for t0, t1 in itertools.pairwise(stamps):
        # the scraper's last scrape before its stop may come a whole interval, and a
        # scrape's jitter, before the stop
        inside = skip is not None and skip[0] - 2 * SCRAPE_S <= t0 / 1e3 <= skip[1] + SCRAPE_S
        if t1 - t0 > 1500 * SCRAPE_S and not inside:
            out.append(f"up: no scrape between {t0} and {t1}")
    for s in series:
        name = s["metric"]["__name__"]
        if ":" in name or name == "up" or name.startswith(("scrape_", "ALERTS")):
            continue  # rules' outputs; the scraper's own per-scrape series
        got = set(s["timestamps"])
        want = {t for t in ok if t >= min(got)}  # every job runs to the end
        if want - got:
            out.append(f"{s['metric']}: {len(want - got)} of {len(want)} scrapes missing")
    return out


def record_holes(series: list[dict], start: float, end: float) -> list[str]:
    """Recording rules' outputs that were recorded every second in the 5 s before `start`
    (the rest come and go with their input) and have a step longer than 3 s, or stop, in
    [start, end]."""
    out = []
    for s in series:
        ts = [t / 1e3 for t in s["timestamps"]]
        if sum(start - 5 <= t <= start for t in ts) < 3:
            continue
        inside = [start, *(t for t in ts if start < t < end), end]
        step = max(b - a for a, b in itertools.pairwise(inside))
        if step > 3:
            out.append(f"{s['metric']}: longest step {step:.1f} s")
    return out


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_store_outage_loses_nothing_and_pages_nobody(tmp_path):
    vm = vm_binary("victoria-metrics")
    vmalert = vm_binary("vmalert")
    stop = threading.Event()
    procs: list[Proc] = []
    exporters: dict[str, Exporter] = {}
    watch: AlertWatch | None = None
    agents: list[Proc] = []  # vmagent, started twice
    try:
        for cluster in ("a", "b", "c"):
            root = tmp_path / cluster / "verl"
            write_fleet(root, fleet(cluster), stop)
            exporters[cluster] = Exporter(
                tmp_path / cluster / "exporter", "--verl-root", str(root), "--verl-interval", "0.5"
            )
        vm_port = free_port()
        vm_url = victoria_metrics(vm, tmp_path / "vm", tmp_path / "vm-1.log", procs, vm_port)
        am = Alertmanager(
            tmp_path / "am", {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
        )
        procs.append(am)
        write_config(tmp_path / "prom-a", "a", exporters["a"], vm_url, rules=True)
        prom_a, prom_a_url = start_prometheus(tmp_path / "prom-a", rules=True)
        procs.append(prom_a)
        write_config(tmp_path / "prom-b", "b", exporters["b"], vm_url, rules=False)
        procs.append(start_prometheus(tmp_path / "prom-b", rules=False)[0])
        vmagent_port = free_port()
        agents.append(start_vmagent(tmp_path / "vmagent", exporters["c"], vm_url, vmagent_port))
        rules = shipped_rules(tmp_path / "rules-bc", VMALERT_PARAMS)
        vmalert_port = free_port()
        vmalert_args = [
            vmalert,
            f"-datasource.url={vm_url}",
            f"-remoteWrite.url={vm_url}",
            *(f"-rule={p}" for p in rules),
            "-evaluationInterval=1s",
            "-remoteWrite.flushInterval=1s",
            "-external.label=ruler=vmalert",
        ]
        procs.append(
            Proc(
                [
                    *vmalert_args,
                    f"-notifier.url={am.url}",
                    f"-httpListenAddr=127.0.0.1:{vmalert_port}",
                ],
                tmp_path / "vmalert.log",
            )
        )

        def explain() -> str:
            return "\n".join(p.output()[-1500:] for p in (*procs, *agents))

        def present(expr: str) -> set[str]:
            r = requests.get(vm_url + "/api/v1/query", params={"query": expr}, timeout=10)
            return {s["metric"].get("cluster", "") for s in r.json()["data"]["result"]}

        everyone = {"a", "b", "c"}
        job = 'project="grpo", experiment="exp1"'
        wait_until(lambda: present(f"rlhf_step{{{job}}}") == everyone, 60, 0.5, explain())
        code = f"{VERDICT_CODE}{{{job}}}"
        wait_until(lambda: present(code) == everyone, 90, 0.5, f"recorded\n{explain()}")
        watch = AlertWatch(
            {
                "prometheus a": prom_a_url + "/api/v1/alerts",
                "vmalert": f"http://127.0.0.1:{vmalert_port}/api/v1/alerts",
                "alertmanager": am.url + "/api/v2/alerts",
            }
        )
        time.sleep(10)  # steady state under load

        # the outage: the store stops (its senders retry and buffer), vmagent restarts within it
        start = time.time() - 5
        store = procs.pop(0)  # victoria_metrics appended it first
        store.terminate()
        down = time.time()
        time.sleep(OUTAGE_S / 2)
        vmagent_down = time.time()  # its scrapes stop at SIGTERM, not when it has exited
        agents[0].terminate()
        time.sleep(2)
        agents.append(start_vmagent(tmp_path / "vmagent", exporters["c"], vm_url, vmagent_port))
        vmagent_up = time.time()
        time.sleep(max(0.0, down + OUTAGE_S - time.time()))
        victoria_metrics(vm, tmp_path / "vm", tmp_path / "vm-2.log", procs, vm_port)
        back = time.time()
        end = back + 5

        def lost() -> dict[str, list[str]]:
            out = {}
            for cluster in everyone:
                series = vm_export(vm_url, f'{{cluster="{cluster}", ruler=""}}', start, end)
                skip = (vmagent_down, vmagent_up) if cluster == "c" else None
                out[cluster] = holes(series, (start, end), skip) if series else ["nothing"]
            return out if any(out.values()) else {}

        try:
            wait_until(lambda: not lost(), 120, 2, "the gap's samples to arrive")
        except TimeoutError:
            pytest.fail(f"samples lost: {lost()}\n{explain()}")
        caught_up = time.time() - back

        # cluster a: the store's copy is its own TSDB's, sample for sample, rules included
        r = requests.get(
            prom_a_url + "/api/v1/query",
            params={"query": f'{{job="rlhf-exporter"}}[{int(end - start) + 1}s]', "time": end},
            timeout=30,
        )
        local = {
            frozenset({**s["metric"], "cluster": "a"}.items()): {
                round(float(t) * 1000) for t, _ in s["values"] if start <= float(t) <= end
            }
            for s in r.json()["data"]["result"]
        }
        assert len(local) > 100 * JOBS, len(local)

        def missing_in_a() -> dict[str, int]:
            stored = {
                frozenset(s["metric"].items()): set(s["timestamps"])
                for s in vm_export(vm_url, '{cluster="a", job="rlhf-exporter"}', start, end)
            }
            missing = {k: len(v - stored.get(k, set())) for k, v in local.items()}
            return {dict(k)["__name__"]: n for k, n in missing.items() if n}

        # `lost()` reads the store's `up` up to 1.5 s before `end`; the local copy reaches `end`,
        # whose last samples may still be in the queue's final batch: wait for them, bounded
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not missing_in_a(), 30, 2, "cluster a's last batch")
        assert not (short := missing_in_a()), short
        a_records = vm_export(vm_url, '{cluster="a", __name__=~".+:.+"}', start, end)
        assert a_records and not record_holes(a_records, down, back), record_holes(
            a_records, down, back
        )

        # vmalert could not read the store: b's and c's records have a hole, until replayed
        bc = '{cluster=~"b|c", ruler="vmalert", __name__=~".+:.+"}'
        assert record_holes(vm_export(vm_url, bc, start, end), down, back)
        for n in range(REPLAY_PASSES):  # a pass fills one more link of chained records
            replay = Proc(
                [
                    *vmalert_args,
                    f"-replay.timeFrom={rfc3339(down - 2)}",
                    f"-replay.timeTo={rfc3339(back + 2)}",
                    "-replay.rulesDelay=0s",
                    "-datasource.queryStep=1s",  # the replay's range step (its default is 5m)
                ],
                tmp_path / f"vmalert-replay-{n}.log",
            )
            assert replay.popen.wait(120) == 0, replay.output()[-3000:]
            time.sleep(2)
        replayed = vm_export(vm_url, bc, start, end)
        assert replayed and not record_holes(replayed, down, back), record_holes(
            replayed, down, back
        )[:10]

        # nobody paged: several rounds of every rule after the store came back
        time.sleep(max(0.0, back + 30 - time.time()))
        watch.stop()
        assert watch.polls > OUTAGE_S, watch.polls
        firing = [k for k in watch.seen if k[2] != "pending"]
        assert not firing, firing  # Alertmanager's are "active": none received either
        # Pending, never firing: vmalert's absence alerts, in the seconds after the store came
        # back with the gap's samples still on their way (an outage longer than vmalert's 5m
        # query step); they clear when the samples arrive, long before their `for:`.
        pending = {k: t - back for k, t in watch.seen.items()}
        assert all(w == "vmalert" and a in ABSENCE for w, a, _ in pending), pending
        assert all(t < 60 for t in pending.values()), pending
        query = f'count by (alertname, cluster) (count_over_time(ALERTS{{alertstate="firing"}}[{int(time.time() - start)}s]))'
        fired = requests.get(vm_url + "/api/v1/query", params={"query": query}, timeout=10)
        assert not fired.json()["data"]["result"], fired.text
        print(
            f"outage {OUTAGE_S:.0f} s with {JOBS} jobs per cluster: every sample arrived "
            f"{caught_up:.1f} s after the store came back; vmagent down "
            f"{vmagent_up - vmagent_down:.1f} s within it; pending (s after the store came "
            f"back, last seen): {pending or 'none'}"
        )
    finally:
        stop.set()
        if watch is not None:
            watch.stop()
        for p in reversed(procs):
            p.terminate()
        for agent in agents:
            agent.terminate()
        for ex in exporters.values():
            ex.terminate()
