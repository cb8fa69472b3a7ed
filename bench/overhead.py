"""Overhead: CPU seconds and peak RSS of `serve --demo` vs. an idle bare prometheus_client server.

    .venv/bin/python bench/overhead.py [--seconds 60] [--scrape-every 15]

Both run side by side as their own processes over the same window (after a few seconds of
warm-up), each scraped every `--scrape-every` seconds like Prometheus would. CPU is user +
system time of the process over the window; peak RSS is the kernel's high-water mark
(VmHWM). `serve --demo` runs with its defaults (a step every 0.7 s, files polled every 1 s)
and Ray/NVML off (nothing to reach here; they would only report down), and its simulated
engines off (`--no-engines`: the demo reads them ~66 times a second because its job clock
runs ~135x the wall's, a real job's once a second; bench/demo_engines.py measures them). Goals: at most 0.5 %
of one core above the bare server, and at most 80 MB RSS.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.procs import free_port, wait_until  # noqa: E402

BARE = (
    "import time\nfrom prometheus_client import start_http_server\n"
    "start_http_server({port}, addr='127.0.0.1')\nwhile True: time.sleep(3600)\n"
)


def scrape(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    ok = conn.getresponse().read() and True
    conn.close()
    return ok


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    ex_port, bare_port = free_port(), free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "serve",
            "--demo",
            "--listen",
            f"127.0.0.1:{ex_port}",
            "--no-ray",
            "--no-nvml",
            "--no-engines",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE.format(port=bare_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: scrape(ex_port) and scrape(bare_port), 60, 0.2, "both servers")
        time.sleep(args.warmup)
        procs = {"exporter": psutil.Process(exporter.pid), "bare": psutil.Process(bare.pid)}
        start = {k: cpu(p) for k, p in procs.items()}
        t0 = time.monotonic()
        next_scrape = t0
        while (now := time.monotonic()) < t0 + args.seconds:
            if now >= next_scrape:
                scrape(ex_port), scrape(bare_port)
                next_scrape += args.scrape_every
            time.sleep(min(0.5, max(0.0, t0 + args.seconds - now)))
        wall = time.monotonic() - t0
        used = {k: cpu(p) - start[k] for k, p in procs.items()}
        peak = {"exporter": peak_rss_mb(exporter.pid), "bare": peak_rss_mb(bare.pid)}
    finally:
        for p in (exporter, bare):
            p.terminate()
            p.wait(10)
    print(f"window {wall:.1f} s, scrape every {args.scrape_every:g} s")
    print(f"{'':10} {'cpu s':>8} {'% core':>8} {'peak RSS MB':>12}")
    for k in ("exporter", "bare"):
        print(f"{k:10} {used[k]:8.3f} {100 * used[k] / wall:8.3f} {peak[k]:12.1f}")
    above = 100 * (used["exporter"] - used["bare"]) / wall
    print(
        f"exporter above the bare floor: {above:.3f} % of one core (goal <= 0.5 %: "
        f"{'met' if above <= 0.5 else 'NOT met'}); peak RSS {peak['exporter']:.1f} MB "
        f"(goal <= 80 MB: {'met' if peak['exporter'] <= 80 else 'NOT met'}); "
        f"ratio of CPU {used['exporter'] / max(used['bare'], 1e-9):.1f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
