"""The fleet at scale (issue 49): 10,000 jobs on 10 exporters in 2 clusters, one store.

    .venv/bin/python bench/fleet_scale.py [--jobs 10000] [--exporters 10] [--minutes 20]
        [--scrape-interval 15] [--backfill-jobs 500] [--backfill-hours 24] [--keep DIR]

Everything real, on 127.0.0.1. `--jobs` verl jobs (bench/fleet.py's realistic records, each
stepping about every 60 s at its own random moments) split over `--exporters` exporters
(`serve --verl-root`), half of them in cluster `a`, half in cluster `b`; the two clusters
reuse the same project/experiment names. Cluster `a`: a full Prometheus evaluating the
shipped rules (alerts/*.rules.yaml as shipped, their intervals kept) and scraping itself.
Cluster `b`: vmagent (disk buffer) scraping its exporters and itself, its rules evaluated
by vmalert against the store (each group limited to `cluster="b"`). Both remote-write into
one VictoriaMetrics.

After a warm-up, `--minutes` of live scraping are measured: the store's ingest rate
(`vm_rows_inserted_total`), every process's CPU (user + system from /proc, % of one core)
and RSS (last and peak), the machine's load average and how much of its CPU was other
work's, each rule group's evaluation time in Prometheus
(`prometheus_rule_group_last_duration_seconds`, mean and max over the window) and in
vmalert (`vmalert_iteration_duration_seconds`, from its /metrics) against its interval, and
the store's size on disk per sample.

Then the senders and exporters stop, and history is backfilled through the store's import
API (`/api/v1/import`): the live window's own samples of `--backfill-jobs` jobs per cluster
(their scraped series and their recording rules' outputs, as the store holds them) are
repeated back in time, window after window, over `--backfill-hours` (counters shifted to
stay monotonic). Every query of both dashboards (read from grafana/*.json, the variables
substituted as Grafana would for a 1000-pixel panel; the job dashboard on one backfilled
job) is then timed against the store over the 6 h and 24 h that end with the live window
(`nocache=1`: never from VM's result cache). Goals (issue 49): every query <= 1 s over
6 h, every rule group <= 10 % of its interval; each is reported as met or missed.

Last, the ratios of this one run (bytes per sample on disk, series per job, CPU per 1,000
samples/s, RSS per million series) and a sizing table for a year and for 5 M series that
multiplies those ratios and nothing else. Every process started is stopped at the end
(also on Ctrl-C or SIGTERM); the working directory is removed unless `--keep` names one.
Nothing is asserted: the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet import Jobs, cpu_seconds  # noqa: E402
from profile_load import RandomSteps  # noqa: E402

from rlhf_exporter.render.rules.remotewrite import LAG  # noqa: E402
from tests.support import grafana_vars  # noqa: E402
from tests.support.procs import Proc, free_port, wait_until  # noqa: E402

GOAL_QUERY_S = 1.0
GOAL_RULE_SHARE = 0.10
FIVE_M = 5_000_000
YEAR_S = 365 * 86400
PX = 1000  # Grafana's maxDataPoints for a panel about 1000 pixels wide
COUNTER = re.compile(r"(_total|_count|_sum|_bucket)$")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return float(sum(fields) - idle), float(sum(fields))


def vm_metrics(url: str) -> dict[str, float]:
    """A /metrics page as {line's name and labels: value} (no HELP/TYPE)."""
    out = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def total(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s lines whose labels include `labels`."""
    out = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base == name and all(
            f'{k}="{v}"' in re.findall(r'\w+="[^"]*"', rest) for k, v in labels.items()
        ):
            out += value
    return out


class Fleet:
    """Every process of the run, started in order, stopped in reverse."""

    def __init__(self, work: Path, args: argparse.Namespace):
        self.work, self.args = work, args
        self.procs: dict[str, Proc] = {}
        self.jobs: list[Jobs] = []
        self.stop_steps = threading.Event()
        self.vm_url = self.prom_url = self.vmagent_url = self.vmalert_url = ""

    def start(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(argv, self.work / f"{name}.log", cwd=REPO)
        self.procs[name] = proc
        return proc

    def stop(self, *names: str) -> None:
        for name in names or tuple(reversed(self.procs)):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.terminate(30)

    def exporters(self) -> dict[str, list[str]]:
        """Write every job's history, start one exporter per share: cluster -> targets."""
        per = self.args.jobs // self.args.exporters
        half = self.args.exporters // 2
        targets: dict[str, list[str]] = {"a": [], "b": []}
        for e in range(self.args.exporters):
            cluster, k = ("a", e) if e < half else ("b", e - half)
            root = self.work / f"verl-{cluster}{k}"
            self.jobs.append(Jobs(root, per, first=k * per))
            port = free_port()
            self.start(
                f"exporter-{cluster}{k}",
                [sys.executable, "-m", "rlhf_exporter", "serve", "--listen", f"127.0.0.1:{port}"]
                + ["--verl-root", str(root), "--no-ray", "--no-nvml", "--no-push"],
            )
            targets[cluster].append(f"127.0.0.1:{port}")
        for target in targets["a"] + targets["b"]:
            wait_until(
                lambda t=target: (
                    requests.get(f"http://{t}/metrics", timeout=60).text.count("\nrlhf_step{")
                    >= per
                ),
                600,
                2,
                f"{target} serving its {per} jobs",
            )
        for jobs in self.jobs:
            steps = RandomSteps(jobs)
            threading.Thread(target=steps.run, args=(self.stop_steps,), daemon=True).start()
        return targets

    def store(self) -> None:
        port = free_port()
        self.vm_url = f"http://127.0.0.1:{port}"
        self.start(
            "victoria-metrics",
            [
                "victoria-metrics",
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-storageDataPath={self.work / 'vm'}",
                "-search.maxUniqueTimeseries=5000000",
                "-search.maxQueryDuration=300s",  # a loaded machine: slow, not refused
                "-retentionPeriod=2",  # 2 months: the backfill reaches a day back
            ],
        )
        wait_until(lambda: requests.get(self.vm_url + "/health", timeout=1).ok, 60, 0.5, "vm")

    def rules(self, dest: Path, params: dict[str, list[str]] | None) -> list[Path]:
        """The shipped rule files, their groups' intervals as shipped, with vmalert's
        per-group query `params` if given."""
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
            doc = yaml.safe_load(path.read_text())
            for group in doc["groups"]:
                if params:
                    group["params"] = params
            (dest / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
            out.append(dest / path.name)
        return out

    def cluster_a(self, targets: list[str]) -> None:
        port = free_port()
        self.prom_url = f"http://127.0.0.1:{port}"
        every = f"{self.args.scrape_interval:g}s"
        config = {
            "global": {
                "scrape_interval": every,
                "scrape_timeout": f"{min(10.0, self.args.scrape_interval):g}s",
                "evaluation_interval": every,
                "external_labels": {"cluster": "a"},
            },
            "rule_files": [str(p) for p in self.rules(self.work / "rules-a", None)],
            "scrape_configs": [
                {"job_name": "rlhf-exporter", "static_configs": [{"targets": targets}]},
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            ],
            "remote_write": [{"url": f"{self.vm_url}/api/v1/write"}],
        }
        (self.work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.start(
            "prometheus-a",
            [
                "prometheus",
                f"--config.file={self.work / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.work / 'prom-a'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
        )
        wait_until(lambda: requests.get(self.prom_url + "/-/ready", timeout=1).ok, 120, 0.5, "prom")

    def cluster_b(self, targets: list[str]) -> None:
        agent, ruler, am = free_port(), free_port(), free_port()
        self.vmagent_url = f"http://127.0.0.1:{agent}"
        self.vmalert_url = f"http://127.0.0.1:{ruler}"
        every = f"{self.args.scrape_interval:g}s"
        scrape = {
            "global": {"scrape_interval": every},
            "scrape_configs": [
                {"job_name": "rlhf-exporter", "static_configs": [{"targets": targets}]},
                {"job_name": "vmagent", "static_configs": [{"targets": [f"127.0.0.1:{agent}"]}]},
            ],
        }
        (self.work / "vmagent.yml").write_text(yaml.safe_dump(scrape))
        self.start(
            "vmagent-b",
            [
                "vmagent",
                f"-promscrape.config={self.work / 'vmagent.yml'}",
                f"-remoteWrite.url={self.vm_url}/api/v1/write",
                f"-remoteWrite.tmpDataPath={self.work / 'vmagent-buffer'}",
                "-remoteWrite.label=cluster=b",
                f"-httpListenAddr=127.0.0.1:{agent}",
            ],
        )
        (self.work / "am.yml").write_text(
            yaml.safe_dump({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]})
        )
        self.start(
            "alertmanager",
            [
                "prometheus-alertmanager",
                f"--config.file={self.work / 'am.yml'}",
                f"--storage.path={self.work / 'am'}",
                f"--web.listen-address=127.0.0.1:{am}",
                f"--cluster.listen-address=127.0.0.1:{free_port()}",
            ],
        )
        rules = self.rules(self.work / "rules-b", {"extra_filters[]": ['{cluster="b"}']})
        self.start(
            "vmalert-b",
            [
                "vmalert",
                f"-datasource.url={self.vm_url}",
                f"-remoteWrite.url={self.vm_url}",
                *(f"-rule={p}" for p in rules),
                f"-evaluationInterval={every}",
                f"-notifier.url=http://127.0.0.1:{am}",
                "-external.label=ruler=vmalert",
                f"-httpListenAddr=127.0.0.1:{ruler}",
            ],
        )
        for url in (self.vmagent_url, self.vmalert_url):
            wait_until(lambda u=url: requests.get(u + "/health", timeout=1).ok, 60, 0.5, url)


def query(url: str, expr: str, at: float | None = None) -> list[dict]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    r = requests.get(url + "/api/v1/query", params=params, timeout=330)
    r.raise_for_status()
    return r.json()["data"]["result"]


def scalar(url: str, expr: str, at: float | None = None) -> float:
    """One number, or NaN (the refusal printed) when the server refuses the query: a figure
    lost, never the run."""
    try:
        result = query(url, expr, at)
    except requests.HTTPError as exc:
        print(f"refused: {expr}: {exc.response.text[:300]}", flush=True)
        return float("nan")
    return float(result[0]["value"][1]) if result else float("nan")


class Window:
    """What the measured window's start and end read, and what it sampled in between."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.pids = {name: p.popen.pid for name, p in fleet.procs.items()}
        self.rss: dict[str, list[float]] = {name: [] for name in self.pids}
        self.load: list[float] = []
        self.t0 = time.time()
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.self0 = sum(os.times()[:2])
        self.machine0 = machine_cpu()
        self.vm0 = vm_metrics(fleet.vm_url)
        self.alert0 = vm_metrics(fleet.vmalert_url)

    def sample(self) -> None:
        self.load.append(float(Path("/proc/loadavg").read_text().split()[0]))
        for name, pid in self.pids.items():
            self.rss[name].append(rss_mb(pid))

    def run(self, seconds: float) -> None:
        end = self.t0 + seconds
        while time.time() < end:
            self.sample()
            time.sleep(min(30.0, max(0.0, end - time.time())))
        self.sample()
        self.t1 = time.time()
        self.cpu1 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.self1 = sum(os.times()[:2])
        self.machine1 = machine_cpu()
        self.vm1 = vm_metrics(self.fleet.vm_url)
        self.alert1 = vm_metrics(self.fleet.vmalert_url)
        self.peak = {name: hwm_mb(pid) for name, pid in self.pids.items()}

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def cores(self, name: str) -> float:
        return (self.cpu1[name] - self.cpu0[name]) / self.seconds

    def ingest(self) -> float:
        rows = total(self.vm1, "vm_rows_inserted_total") - total(self.vm0, "vm_rows_inserted_total")
        return rows / self.seconds


def prometheus_groups(fleet: Fleet, w: Window) -> list[tuple[str, float, float, float]]:
    """(group, mean s, max s, interval s) of every rule group in Prometheus over the window."""
    rng = f"{int(w.seconds)}s"
    mean = query(
        fleet.prom_url, f"avg_over_time(prometheus_rule_group_last_duration_seconds[{rng}])", w.t1
    )
    peak = query(
        fleet.prom_url, f"max_over_time(prometheus_rule_group_last_duration_seconds[{rng}])", w.t1
    )
    every = query(fleet.prom_url, "prometheus_rule_group_interval_seconds", w.t1)
    by = {s["metric"]["rule_group"]: float(s["value"][1]) for s in peak}
    ivl = {s["metric"]["rule_group"]: float(s["value"][1]) for s in every}
    return sorted(
        (g.split(";")[-1], float(s["value"][1]), by[g], ivl[g])
        for s in mean
        for g in [s["metric"]["rule_group"]]
    )


def vmalert_groups(fleet: Fleet, w: Window) -> list[tuple[str, float, float, float]]:
    """(group, mean s, p99 s, interval s) of every vmalert group over the window (the p99 of
    its summary since vmalert started)."""
    out = []
    groups = {
        re.search(r'group="([^"]*)"', k).group(1)  # type: ignore[union-attr]
        for k in w.alert1
        if k.startswith("vmalert_iteration_interval_seconds{")
    }
    for name in groups:
        n, s = (
            total(w.alert1, f"vmalert_iteration_duration_seconds_{x}", group=name)
            - total(w.alert0, f"vmalert_iteration_duration_seconds_{x}", group=name)
            for x in ("count", "sum")
        )
        p99 = total(w.alert1, "vmalert_iteration_duration_seconds", group=name, quantile="0.99")
        every = total(w.alert1, "vmalert_iteration_interval_seconds", group=name)
        out.append((name, s / n if n else float("nan"), p99, every))
    return sorted(out)


def backfill_series(fleet: Fleet, w: Window, names: list[str]) -> Iterator[bytes]:
    """Import lines: the window's samples of the jobs `names`, repeated back in time."""
    span = w.seconds
    tiles = math.ceil(fleet.args.backfill_hours * 3600 / span)
    match = '{experiment=~"' + "|".join(names) + '"}'
    r = requests.get(
        fleet.vm_url + "/api/v1/export",
        params={"match[]": match, "start": f"{w.t0:.3f}", "end": f"{w.t1 - 0.001:.3f}"},
        timeout=300,
        stream=True,
    )
    r.raise_for_status()
    shift = np.arange(1, tiles + 1)
    for line in r.iter_lines():
        if not line:
            continue
        block = orjson.loads(line)
        ts = np.asarray(block["timestamps"], dtype=np.int64)
        vs = np.asarray(block["values"], dtype=np.float64)
        if len(ts) < 2:
            continue
        delta = vs[-1] - vs[0] if COUNTER.search(block["metric"]["__name__"]) else 0.0
        past_ts = (ts[None, :] - (shift[:, None] * int(span * 1000))).ravel()
        past_vs = (vs[None, :] - shift[:, None] * delta).ravel()
        yield (
            orjson.dumps(
                {"metric": block["metric"], "values": past_vs, "timestamps": past_ts},
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            + b"\n"
        )


def backfill(fleet: Fleet, w: Window) -> dict[str, float]:
    """Import the history; returns what was imported and how fast."""
    before = total(vm_metrics(fleet.vm_url), "vm_rows_inserted_total")
    per = fleet.args.jobs // fleet.args.exporters
    names = [f"exp{i:05d}" for i in range(min(fleet.args.backfill_jobs, per))]
    t = time.time()
    series = 0
    for k in range(0, len(names), 10):
        body = b"".join(backfill_series(fleet, w, names[k : k + 10]))
        series += body.count(b"\n")
        r = requests.post(fleet.vm_url + "/api/v1/import", data=body, timeout=600)
        r.raise_for_status()
    requests.get(fleet.vm_url + "/internal/force_flush", timeout=120)
    seconds = time.time() - t
    rows = total(vm_metrics(fleet.vm_url), "vm_rows_inserted_total") - before
    return {"jobs": 2 * len(names), "series": series, "samples": rows, "seconds": seconds}


def merged_size(fleet: Fleet) -> tuple[float, float, float, float]:
    """Flush and force-merge the store's partitions, wait for the merges to end: (rows,
    bytes of data, bytes of index, seconds it took)."""
    t = time.time()
    requests.get(fleet.vm_url + "/internal/force_flush", timeout=120)
    for month in {time.strftime("%Y_%m", time.gmtime(time.time() - d)) for d in (0, 86400 * 2)}:
        requests.get(fleet.vm_url + "/internal/force_merge", params={"partition_prefix": month})
    quiet = 0
    while quiet < 3 and time.time() - t < 600:
        time.sleep(5)
        m = vm_metrics(fleet.vm_url)
        quiet = quiet + 1 if total(m, "vm_active_merges") == 0 else 0
    return (*stored(m), time.time() - t)


def stored(m: dict[str, float]) -> tuple[float, float, float]:
    """(rows, bytes of their data, bytes of the index) of a store's /metrics."""
    parts = ("storage/big", "storage/small")
    rows = sum(total(m, "vm_rows", type=p) for p in parts)
    data = sum(total(m, "vm_data_size_bytes", type=p) for p in parts)
    return rows, data, total(m, "vm_data_size_bytes") - data


def step_for(range_s: float, scrape_s: float) -> tuple[float, str, str]:
    """Grafana's step, $__interval and $__rate_interval for a `range_s` panel of PX pixels."""
    raw = max(range_s / PX, scrape_s)
    for nice in (15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600):
        if raw <= nice * 1.25:
            raw = nice
            break
    rate = max(raw + scrape_s, 4 * scrape_s)
    return raw, f"{raw:g}s", f"{rate:g}s"


def dashboard_targets() -> list[tuple[str, str, str, bool]]:
    """(dashboard, panel title and refId, expr, instant) of every query of both dashboards."""
    out = []
    for path in sorted((REPO / "grafana").glob("*.json")):
        doc = json.loads(path.read_text())
        for p in grafana_vars.panels(doc):
            for t in p.get("targets", []):
                if t.get("expr"):
                    what = f"{p['title']} {t['refId']}"
                    out.append((path.stem, what, t["expr"], bool(t.get("instant"))))
    return out


def time_queries(
    fleet: Fleet, range_s: float, label: str, end: float
) -> list[tuple[str, str, float, str]]:
    """(dashboard, query, seconds, outcome) of every dashboard query over the `range_s` before
    `end` (the live window's end: its instant queries see live jobs, not stale ones)."""
    step, interval, rate = step_for(range_s, fleet.args.scrape_interval)
    out = []
    for dashboard, what, expr, instant in dashboard_targets():
        job = dashboard.endswith("job")
        expr = expr.replace("$cluster", "a") if job else expr
        text = grafana_vars.substitute(
            expr,
            rate_interval=rate,
            interval=interval,
            range_=label,
            project="team0" if job else ".*",
            experiment="exp00000" if job else ".*",
        )
        params: dict[str, Any] = {"query": text, "nocache": "1"}
        if instant:
            path, params["time"] = "/api/v1/query", f"{end:.3f}"
        else:
            path = "/api/v1/query_range"
            params.update(start=f"{end - range_s:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        t = time.perf_counter()
        try:
            r = requests.get(fleet.vm_url + path, params=params, timeout=120)
            body = r.json()
            outcome = (
                f"{len(body['data']['result'])} series"
                if r.ok
                else f"error: {body.get('error', r.text)[:120]}"
            )
        except (requests.RequestException, ValueError) as exc:
            outcome = f"error: {exc!r}"[:120]
        out.append((dashboard, what, time.perf_counter() - t, outcome))
    return out


def report_window(fleet: Fleet, w: Window) -> dict[str, float]:
    """Print the live window's figures; returns the ratios the sizing table multiplies."""
    jobs = fleet.args.jobs
    print(f"\n== live: {jobs} jobs on {fleet.args.exporters} exporters, {w.seconds / 60:.1f} min")
    busy = (w.machine1[0] - w.machine0[0]) / (w.machine1[1] - w.machine0[1]) * os.cpu_count()
    ours = sum(w.cores(n) for n in w.pids) + (w.self1 - w.self0) / w.seconds
    print(
        f"machine: {os.cpu_count()} cores, {busy:.2f} busy on average, of which this run "
        f"{ours:.2f} (other work {max(0.0, busy - ours):.2f}); load average (1 min) mean "
        f"{statistics.mean(w.load):.2f}, max {max(w.load):.2f}"
    )
    print(f"{'process':22} {'CPU % of a core':>16} {'RSS MiB':>9} {'peak':>7}")
    for name in w.pids:
        print(f"{name:22} {100 * w.cores(name):16.1f} {w.rss[name][-1]:9.0f} {w.peak[name]:7.0f}")
    print(f"{'job writers (bench)':22} {100 * (w.self1 - w.self0) / w.seconds:16.1f}")
    ingest = w.ingest()
    series = float(
        requests.get(fleet.vm_url + "/api/v1/series/count", timeout=300).json()["data"][0]
    )
    scraped_names = '{job="rlhf-exporter", experiment!="", __name__!~".+:.+"}'
    job_series = scalar(fleet.vm_url, f"count({scraped_names})", w.t1)
    records = scalar(fleet.vm_url, 'count({__name__=~".+:.+", experiment!=""})', w.t1)
    head = scalar(fleet.prom_url, "prometheus_tsdb_head_series", w.t1)
    rows, disk, index = stored(w.vm1)
    per_s = f"avg_over_time(scrape_samples_scraped{{cluster=%r}}[{int(w.seconds)}s])"
    every = fleet.args.scrape_interval
    scraped = {c: scalar(fleet.vm_url, f"sum({per_s % c}) / {every}", w.t1) for c in "ab"}
    appended = f"rate(prometheus_tsdb_head_samples_appended_total[{int(w.seconds)}s])"
    appended_a = scalar(fleet.prom_url, appended, w.t1)
    print(
        f"store: ingest {ingest:,.0f} samples/s; {series:,.0f} series ({job_series:,.0f} scraped "
        f"per-job series, {records:,.0f} per-job recording-rule outputs); {rows:,.0f} rows in "
        f"{disk / 2**20:,.1f} MiB of data, {index / 2**20:,.1f} MiB of index"
    )
    win = f"[{int(w.seconds)}s]"
    up = 'up{job="rlhf-exporter"}'
    scrapes = scalar(fleet.vm_url, f"sum(count_over_time({up}{win}))", w.t1)
    failed = scrapes - scalar(fleet.vm_url, f"sum(sum_over_time({up}{win}))", w.t1)
    took = scalar(
        fleet.vm_url,
        f'max(max_over_time(scrape_duration_seconds{{job="rlhf-exporter"}}{win}))',
        w.t1,
    )
    lag = query(fleet.vm_url, f"max by (cluster) (max_over_time({LAG}{win}))", w.t1)
    print(
        f"exporter scrapes: {failed:.0f} of {scrapes:.0f} failed, the longest {took:.2f} s; "
        "remote-write lag at most: "
        + ", ".join(f"{s['metric'].get('cluster')} {float(s['value'][1]):.1f} s" for s in lag)
    )
    print(
        f"scraped: cluster a {scraped['a']:,.0f} samples/s, cluster b {scraped['b']:,.0f}; "
        f"prometheus a: {head:,.0f} head series, {appended_a:,.0f} samples/s appended "
        "(rules' outputs included)"
    )
    return {
        "bytes per sample, fresh": disk / rows,
        "store series": series,
        "series per job, scraped": (scraped["a"] + scraped["b"]) * every / jobs,
        "series per job in the store (scraped names)": job_series / jobs,
        "records per job": records / jobs,
        "store CPU cores per 1,000 samples/s": w.cores("victoria-metrics") / (ingest / 1000),
        "store RSS MiB per million series": w.rss["victoria-metrics"][-1] / (series / 1e6),
        "prometheus CPU cores per 1,000 samples/s": w.cores("prometheus-a") / (appended_a / 1000),
        "prometheus RSS MiB per million head series": w.rss["prometheus-a"][-1] / (head / 1e6),
        "vmagent CPU cores per 1,000 samples/s": w.cores("vmagent-b") / (scraped["b"] / 1000),
        "exporter CPU cores per 1,000 jobs": statistics.mean(
            w.cores(n) for n in w.pids if n.startswith("exporter")
        )
        / (jobs / fleet.args.exporters / 1000),
        "exporter RSS MiB per 1,000 jobs": statistics.mean(
            w.rss[n][-1] for n in w.pids if n.startswith("exporter")
        )
        / (jobs / fleet.args.exporters / 1000),
    }


def report_groups(fleet: Fleet, w: Window) -> list[str]:
    """Print each rule group's evaluation time against its interval; returns the misses."""
    misses = []
    for where, rows, what in (
        ("prometheus a", prometheus_groups(fleet, w), "max"),
        ("vmalert b", vmalert_groups(fleet, w), "p99"),
    ):
        print(f"\n== rule groups in {where}: mean / {what} evaluation time against the interval")
        for name, mean, high, every in rows:
            share = high / every
            met = "met" if share <= GOAL_RULE_SHARE else "MISSED"
            print(f"{name:48} {mean:8.3f} s {high:8.3f} s  / {every:4.0f} s = {share:6.1%}  {met}")
            if share > GOAL_RULE_SHARE:
                misses.append(f"{where}: {name} {share:.1%} of {every:g} s")
    return misses


def report_queries(fleet: Fleet, w: Window) -> list[str]:
    """Time every dashboard query over 6 h and 24 h; print them; returns the 6 h misses."""
    misses = []
    for range_s, label in ((6 * 3600.0, "6h"), (24 * 3600.0, "24h")):
        rows = time_queries(fleet, range_s, label, w.t1)
        took = sorted(t for _, _, t, _ in rows)
        errors = [r for r in rows if r[3].startswith("error")]
        slow = [r for r in rows if r[2] > GOAL_QUERY_S]
        print(
            f"\n== {len(rows)} dashboard queries over {label}: p50 {took[len(took) // 2]:.3f} s, "
            f"max {took[-1]:.3f} s, {len(rows) - len(slow)} <= {GOAL_QUERY_S:g} s, "
            f"{len(errors)} errors"
        )
        for dashboard, what, seconds, outcome in sorted(rows, key=lambda r: -r[2])[:10]:
            print(f"{seconds:8.3f} s  {dashboard}: {what[:60]:60} {outcome}")
        for dashboard, what, _, outcome in errors:
            print(f"error: {dashboard}: {what}: {outcome}")
        if label == "6h":
            misses += [f"{d}: {w} {t:.2f} s over 6h" for d, w, t, o in slow + errors]
    return misses


def report_sizing(ratios: dict[str, float], scrape_s: float) -> None:
    """The ratios of this run, and what they multiply to for 5 M series over a year."""
    print("\n== ratios measured side by side in this run")
    for name, value in ratios.items():
        print(f"{name:48} {value:12.4g}")
    rate = FIVE_M / scrape_s
    print(
        f"\n== sizing, extrapolated ONLY from the ratios above: 5 M series at {scrape_s:g} s "
        f"scrapes = {rate:,.0f} samples/s"
    )
    jobs = FIVE_M / (ratios["series per job, scraped"] + ratios["records per job"])
    table = (
        ("jobs (scraped series + recording outputs per job)", f"{jobs:,.0f}"),
        (
            "store disk for a year",
            f"{rate * YEAR_S * ratios['bytes per sample, merged'] / 1e12:,.1f} TB",
        ),
        (
            "store disk per day",
            f"{rate * 86400 * ratios['bytes per sample, merged'] / 1e9:,.1f} GB",
        ),
        (
            "store index for 5 M series (none replaced)",
            f"{FIVE_M * ratios['index bytes per series, merged'] / 1e9:,.1f} GB",
        ),
        (
            "store CPU (ingest only)",
            f"{rate / 1000 * ratios['store CPU cores per 1,000 samples/s']:,.1f} cores",
        ),
        (
            "store RSS",
            f"{FIVE_M / 1e6 * ratios['store RSS MiB per million series'] / 1024:,.1f} GiB",
        ),
        (
            "full Prometheus CPU, all clusters together",
            f"{rate / 1000 * ratios['prometheus CPU cores per 1,000 samples/s']:,.1f} cores",
        ),
        (
            "vmagent CPU, all clusters together",
            f"{rate / 1000 * ratios['vmagent CPU cores per 1,000 samples/s']:,.1f} cores",
        ),
    )
    for what, value in table:
        print(f"{what:52} {value:>14}")


def run(work: Path, args: argparse.Namespace) -> None:
    fleet = Fleet(work, args)
    try:
        t = time.time()
        fleet.store()
        targets = fleet.exporters()
        print(f"{args.jobs} jobs written and served in {time.time() - t:.0f} s", flush=True)
        fleet.cluster_a(targets["a"])
        fleet.cluster_b(targets["b"])
        up = 'count(up{job="rlhf-exporter"} == 1)'
        wait_until(lambda: scalar(fleet.vm_url, up) == args.exporters, 300, 5, "every target up")
        time.sleep(max(3 * args.scrape_interval, 60.0))  # the first rounds of every group
        print(f"warm after {time.time() - t:.0f} s; measuring {args.minutes:g} min", flush=True)
        w = Window(fleet)
        w.run(args.minutes * 60)
        ratios = report_window(fleet, w)
        misses = report_groups(fleet, w)
        fleet.stop_steps.set()
        fleet.stop(*[n for n in list(fleet.procs) if n != "victoria-metrics"])
        rows, disk, index, took = merged_size(fleet)
        ratios["bytes per sample, merged"] = disk / rows
        ratios["index bytes per series, merged"] = index / ratios.pop("store series")
        print(
            f"\nstore merged in {took:.0f} s: {rows:,.0f} rows in {disk / 2**20:,.1f} MiB of "
            f"data ({disk / rows:.2f} bytes per sample), {index / 2**20:,.1f} MiB of index",
            flush=True,
        )
        done = backfill(fleet, w)
        print(
            f"\n== backfill: {done['jobs']} jobs' history ({args.backfill_jobs} per cluster, "
            f"{done['series']:,.0f} series), {args.backfill_hours:g} h back: "
            f"{done['samples']:,.0f} samples imported in {done['seconds']:.0f} s "
            f"({done['samples'] / done['seconds']:,.0f} samples/s)",
            flush=True,
        )
        misses += report_queries(fleet, w)
        report_sizing(ratios, args.scrape_interval)
        print("\n== goals missed: " + ("; ".join(misses) if misses else "none"))
    finally:
        fleet.stop_steps.set()
        fleet.stop()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs in all (default 10000)")
    ap.add_argument("--exporters", type=int, default=10, help="half per cluster (default 10)")
    ap.add_argument("--minutes", type=float, default=20.0, help="measured live window")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="seconds (default 15)")
    ap.add_argument("--backfill-jobs", type=int, default=500, help="jobs per cluster")
    ap.add_argument("--backfill-hours", type=float, default=24.0)
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = ap.parse_args()
    if args.exporters < 2 or args.exporters % 2:
        ap.error("--exporters must be even: half in each cluster")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args)
    else:
        work = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
        try:
            run(work, args)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
