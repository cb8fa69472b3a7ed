"""Prometheus-side cost of a fleet (issue 14): a real Prometheus scraping one exporter with N jobs.

    .venv/bin/python bench/prometheus_fleet.py [--jobs 1000] [--minutes 3]

The exporter and the jobs are bench/fleet.py's (each job steps every 60 s, staggered). The
Prometheus runs examples/prometheus/prometheus.yml as-is (15 s scrapes, every rule file of
alerts/). After `--minutes`, it prints, from Prometheus itself:

- `prometheus_rule_group_last_duration_seconds` for each rule group, and the evaluation
  failures (`prometheus_rule_evaluation_failures_total`);
- the head series (`prometheus_tsdb_head_series`) and the scrape duration of the exporter;
- the wall time of every query of both dashboards, run as a range query over the last hour
  (step 15 s, the variables set to all jobs). Only `--minutes` of data exist: the figure is
  the query engine's cost over the fleet's series, a lower bound for a full hour of history.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet import Jobs  # noqa: E402

from tests.support import grafana_vars  # noqa: E402
from tests.support.procs import free_port, wait_until  # noqa: E402


def substitute(expr: str) -> str:
    return grafana_vars.substitute(expr)  # Grafana's defaults for a 1 h view at 15 s


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((REPO / "grafana").glob("*.json")):
        doc = json.loads(path.read_text())
        for p in grafana_vars.panels(doc):
            for t in p.get("targets", []):
                out.append((f"{path.stem}: {p['title']} {t['refId']}", substitute(t["expr"])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        jobs = Jobs(tmp / "verl", args.jobs)
        port = free_port()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "rlhf_exporter", "serve", "--listen", f"127.0.0.1:{port}"]
            + ["--verl-root", str(tmp / "verl"), "--no-ray", "--no-nvml", "--no-push"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        prom = None
        stop = threading.Event()
        try:
            shutil.copytree(REPO / "alerts", tmp / "repo" / "alerts")
            conf = tmp / "repo" / "examples" / "prometheus"
            shutil.copytree(REPO / "examples" / "prometheus", conf)
            (conf / "targets" / "fleet.yaml").write_text(
                yaml.safe_dump([{"targets": [f"127.0.0.1:{port}"]}])
            )
            # Prometheus scrapes itself too, for its rule and TSDB metrics
            config = yaml.safe_load((conf / "prometheus.yml").read_text())
            prom_port = free_port()
            config["scrape_configs"].append(
                {
                    "job_name": "prometheus",
                    "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}],
                }
            )
            (conf / "prometheus.yml").write_text(yaml.safe_dump(config))
            url = f"http://127.0.0.1:{prom_port}"
            writer = threading.Thread(target=jobs.run, args=(stop, time.time()), daemon=True)
            writer.start()
            prom = subprocess.Popen(
                [
                    shutil.which("prometheus") or "prometheus",
                    f"--config.file={conf / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

            def q(expr: str) -> list[dict]:
                r = requests.get(url + "/api/v1/query", params={"query": expr}, timeout=60)
                r.raise_for_status()
                return r.json()["data"]["result"]

            def jobs_in() -> bool:
                got = q("count(rlhf_step)")
                return bool(got) and int(float(got[0]["value"][1])) == args.jobs

            wait_until(jobs_in, 600, 2.0, "every job in Prometheus")
            print(f"{args.jobs} jobs in Prometheus; running {args.minutes:g} min", flush=True)
            time.sleep(args.minutes * 60)
            print("\nrule group                                   last duration ms")
            for r in sorted(
                q("prometheus_rule_group_last_duration_seconds"),
                key=lambda r: r["metric"]["rule_group"],
            ):
                group = r["metric"]["rule_group"].split(";")[-1]
                print(f"  {group:<42} {float(r['value'][1]) * 1000:10.1f}")
            fails = q("sum(prometheus_rule_evaluation_failures_total)")
            print(f"rule evaluation failures: {fails[0]['value'][1] if fails else 'n/a'}")
            head = q("prometheus_tsdb_head_series")
            print(f"head series: {head[0]['value'][1] if head else 'n/a'}")
            scrape = q('max_over_time(scrape_duration_seconds{job="rlhf-exporter"}[5m])')
            last = q('scrape_duration_seconds{job="rlhf-exporter"}')
            samples = q('scrape_samples_scraped{job="rlhf-exporter"}')
            print(
                f"exporter scrape duration: last {float(last[0]['value'][1]) * 1000:.0f} ms, "
                f"max over 5m {float(scrape[0]['value'][1]) * 1000:.0f} ms; "
                f"samples per scrape {samples[0]['value'][1]}"
            )
            print("\nrange queries, last hour, step 15 s            wall ms   series")
            end = time.time()
            slow = []
            for what, expr in dashboard_queries():
                t = time.perf_counter()
                r = requests.get(
                    url + "/api/v1/query_range",
                    params={"query": expr, "start": end - 3600, "end": end, "step": "15s"},
                    timeout=120,
                )
                wall = time.perf_counter() - t
                n = len(r.json().get("data", {}).get("result", [])) if r.ok else -1
                print(f"  {what[:46]:<46} {wall * 1000:8.0f} {n:8d}", flush=True)
                if wall > 1.0:
                    slow.append(what)
            print(f"queries over 1 s: {len(slow)} {slow}")
        finally:
            stop.set()
            for p in (prom, exporter):
                if p is not None:
                    p.terminate()
                    p.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
