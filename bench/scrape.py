"""Scrape latency: `serve` with 100 verl jobs vs. a bare prometheus_client server, side by side.

    .venv/bin/python bench/scrape.py [--jobs 100] [--requests 400]

Both servers run as their own processes on 127.0.0.1 and serve the same number of series (the
bare one: static `Gauge` series with the exporter's names and labels, the usual way to
instrument with prometheus_client). GETs of /metrics alternate between the two, one new
connection per request, uncompressed text format, as one Prometheus scrape would be. The
exporter keeps polling its files every second while it is measured (the default). Prints p50
and p99 of each and the ratios; the goal is exporter p50 <= 1.5x bare p50.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.demo.simulator import (  # noqa: E402
    DEMO_PLAN,
    REGIMES,
    encode,
    records,
    regressed,
    shifted,
    write_jsonl,
)
from tests.support.procs import free_port, wait_until  # noqa: E402
from tests.support.serve import parse_samples  # noqa: E402

BARE = textwrap.dedent("""
    import json, sys, time
    from prometheus_client import CollectorRegistry, Gauge, start_http_server
    port, spec = int(sys.argv[1]), json.load(open(sys.argv[2]))
    registry = CollectorRegistry()
    for name, series in spec.items():
        labels = sorted(series[0][0]) if series else []
        g = Gauge(name, "static series for the benchmark", labels, registry=registry)
        for lab, value in series:
            (g.labels(**lab) if labels else g).set(value)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    while True:
        time.sleep(3600)
""")


def get(port: int) -> tuple[float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    t = time.perf_counter()
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - t
    conn.close()
    assert resp.status == 200, resp.status
    return elapsed, len(body)


def append_steps(root: Path, stop: threading.Event) -> None:
    step = 10_000
    data = next(iter(records([(REGIMES["sync_bound"], 1)], validation=False)))["data"]
    while not stop.wait(1.0):
        step += 1
        line = encode({"step": step, "data": data})
        for path in root.glob("*/*.jsonl"):
            with open(path, "ab") as f:
                f.write(line)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--requests", type=int, default=400, help="GETs per server")
    ap.add_argument(
        "--live",
        action="store_true",
        help="append a step to every job every second while measuring (each poll then "
        "changes every job, and the job series are re-rendered once per poll)",
    )
    args = ap.parse_args()
    regimes = list(REGIMES.values())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        for i in range(args.jobs):
            project = root / f"team{i % 5}"
            project.mkdir(parents=True, exist_ok=True)
            base = regimes[i % len(regimes)]
            plan = (
                [(base, 20), (shifted(base, 1.5), 5), (regressed(base, "update_actor", 3.0), 5)]
                if i % 3
                else DEMO_PLAN
            )
            write_jsonl(project / f"exp{i:03d}.jsonl", plan, seed=i)
        port = free_port()
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--verl-root",
                str(root),
                "--no-ray",
                "--no-nvml",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bare = None
        try:

            def all_jobs():
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/metrics")
                text = conn.getresponse().read().decode()
                conn.close()
                return f'rlhf_exporter_jobs{{collector="verl"}} {float(args.jobs)}' in text and text

            text = wait_until(all_jobs, 120, 0.5, "every job ingested")
            samples = parse_samples(text)
            spec: dict[str, list] = {}
            for (name, labels), value in samples.items():
                spec.setdefault(name, []).append((dict(labels), value))
            spec_path = Path(tmp) / "spec.json"
            spec_path.write_text(json.dumps(spec))
            bare_port = free_port()
            bare = subprocess.Popen(
                [sys.executable, "-c", BARE, str(bare_port), str(spec_path)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_until(lambda: get(bare_port), 60, 0.2, "bare server")
            for _ in range(20):  # warm both
                get(port), get(bare_port)
            stop = threading.Event()
            if args.live:
                threading.Thread(target=append_steps, args=(root, stop), daemon=True).start()
            ex_times, bare_times = [], []
            ex_size = bare_size = 0
            for _ in range(args.requests):
                t, ex_size = get(port)
                ex_times.append(t)
                t, bare_size = get(bare_port)
                bare_times.append(t)
            stop.set()
        finally:
            for p in (exporter, bare):
                if p is not None:
                    p.terminate()
                    p.wait(10)
    ms = 1000.0
    print(
        f"mode: {'live (every job gets a step per second)' if args.live else 'steady (jobs idle, polls every 1 s)'}"
    )
    print(
        f"series: {len(samples)} ({args.jobs} jobs); body bytes: exporter {ex_size}, bare {bare_size}"
    )
    print(f"{'':10} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
    for name, xs in (("exporter", ex_times), ("bare", bare_times)):
        print(
            f"{name:10} {pct(xs, 50) * ms:9.2f} {pct(xs, 99) * ms:9.2f} {statistics.mean(xs) * ms:9.2f}"
        )
    r50 = pct(ex_times, 50) / pct(bare_times, 50)
    r99 = pct(ex_times, 99) / pct(bare_times, 99)
    print(
        f"ratio rlhf_exporter/bare: p50 {r50:.2f}x (goal <= 1.5x: {'met' if r50 <= 1.5 else 'NOT met'}), p99 {r99:.2f}x"
    )
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
