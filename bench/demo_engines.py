"""The demo's simulated engines: CPU of `serve --demo` with them vs without (`--no-engines`).

    .venv/bin/python bench/demo_engines.py [--seconds 30]

Both run side by side as their own processes over the same window, after a warm-up: the
demo with its simulated vLLM replicas (rlhf_exporter/demo/engines.py), read by the real
engine source every demo.engines.INTERVAL (its job clock runs ~135x the wall's), and the
same demo with `--no-engines`. CPU is user + system time of each process over the window
(the replicas' HTTP servers run inside the exporter's process, so both sides of every read
count). Also printed: the reads per second each replica answered, and the engine windows
the job joined, usable or not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.procs import free_port, wait_until  # noqa: E402
from tests.support.serve import parse_samples  # noqa: E402


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def start(port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rlhf_exporter", "serve", "--demo", "--listen", f"127.0.0.1:{port}"]
        + list(extra),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def windows(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        dict(labels)["usable"]: v
        for (name, labels), v in parse_samples(text).items()
        if name == "rlhf_engine_windows_total"
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    ports = {"engines": free_port(), "no engines": free_port()}
    procs = {
        "engines": start(ports["engines"]),
        "no engines": start(ports["no engines"], "--no-engines"),
    }
    try:
        for port in ports.values():
            wait_until(
                lambda port=port: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).ok,
                60,
                0.2,
                "the exporter",
            )
        time.sleep(args.warmup)
        ps = {k: psutil.Process(p.pid) for k, p in procs.items()}
        before = {k: cpu(p) for k, p in ps.items()}
        w0 = windows(ports["engines"])
        t0 = time.monotonic()
        time.sleep(args.seconds)
        wall = time.monotonic() - t0
        used = {k: cpu(p) - before[k] for k, p in ps.items()}
        w1 = windows(ports["engines"])
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)
    print(f"window {wall:.1f} s")
    for k in ("engines", "no engines"):
        print(f"{k:11} {used[k]:7.3f} CPU s  {100 * used[k] / wall:6.2f} % of one core")
    extra = 100 * (used["engines"] - used["no engines"]) / wall
    ratio = used["engines"] / max(used["no engines"], 1e-9)
    print(f"the demo's engines cost {extra:.2f} % of one core ({ratio:.1f}x the demo without them)")
    usable = w1.get("true", 0) - w0.get("true", 0)
    unusable = w1.get("false", 0) - w0.get("false", 0)
    print(f"engine windows joined in the window: {usable:.0f} usable, {unusable:.0f} not")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
