"""Key floods (issue 12): RSS and scrape latency of `serve` under floods vs. a clean `serve`.

    .venv/bin/python bench/flood.py [--pushes 100] [--keys 30000] [--scrapes 200]

Two `serve` processes on 127.0.0.1, each with the same healthy verl job. The flooded one
then takes:
- push: `--pushes` pushes of `--keys` new `perf/mfu/<x>` keys each (a new job every 10 pushes,
  the same step pushed again otherwise, so step merging is flooded too);
- files: one verl file whose first record holds `--keys` new `timing_s/<x>` timers.
Then both are scraped `--scrapes` times (one new connection each, uncompressed text). Prints
RSS, scrape p50/p99, /metrics size and series, the flooded/clean ratios, and checks that
every flooded key was counted as dropped. Goals: flooded RSS < 150 MB, scrape p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.demo.simulator import REGIMES, encode, records  # noqa: E402
from tests.support.serve import Exporter, parse_samples  # noqa: E402

TOKEN = "bench-token"


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> tuple[float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    dt = time.perf_counter() - t0
    conn.close()
    return dt, len(body)


def push(port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST",
        "/api/v1/records",
        body,
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    status = conn.getresponse().status
    conn.close()
    return status


def measure(exp: Exporter, n: int) -> dict:
    times, size = [], 0
    for _ in range(n):
        dt, size = scrape(exp.port)
        times.append(dt)
    times.sort()
    samples = parse_samples(exp.metrics_text())
    return {
        "rss_mb": rss_mb(exp.popen.pid),
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
        "bytes": size,
        "series": len(samples),
        "samples": samples,
    }


def dropped(samples: dict, collector: str, reason: str) -> float:
    return sum(
        v
        for (name, lab), v in samples.items()
        if name == "rlhf_exporter_record_errors_total"
        and ("collector", collector) in lab
        and ("reason", reason) in lab
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=100)
    ap.add_argument("--keys", type=int, default=30_000)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    good = b"".join(encode(r) for r in records([(REGIMES["sync_bound"], 20)], seed=1))
    # push_max_bytes is raised so one push can carry --keys keys (the flood the issue used)
    flags = ("--push-max-bytes", "8MiB", "--verl-interval", "0.5")
    env = {"RLHF_EXPORTER_PUSH_TOKEN": TOKEN}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Exporter(Path(tmp) / "clean", *flags, env=env) as clean,
        Exporter(Path(tmp) / "flood", *flags, env=env) as flood,
    ):
        for exp in (clean, flood):
            (exp.verl_root / "ok").mkdir()
            (exp.verl_root / "ok" / "job.jsonl").write_bytes(good)
            exp.wait_for(lambda e=exp: e.value("rlhf_steps_total", project="ok") == 21)
        t0 = time.perf_counter()
        for i in range(args.pushes):
            data = {f"perf/mfu/p{i}_{k}": 0.5 for k in range(args.keys)}
            data["timing_s/step"] = 10.0
            body = json.dumps(
                {"project": "flood", "experiment": f"e{i // 10}", "step": 1, "data": data}
            ).encode()
            assert push(flood.port, body) == 200
        push_s = time.perf_counter() - t0
        timers = {f"timing_s/t{k}": 0.001 for k in range(args.keys)}
        timers["timing_s/step"] = 10.0
        (flood.verl_root / "timers").mkdir()
        (flood.verl_root / "timers" / "job.jsonl").write_text(
            json.dumps({"step": 1, "data": timers}) + "\n"
        )
        flood.wait_for(lambda: flood.value("rlhf_steps_total", project="timers") == 1)
        c, f = measure(clean, args.scrapes), measure(flood, args.scrapes)
    mfu = dropped(f["samples"], "push", "unknown_mfu_stage")
    tim = dropped(f["samples"], "verl", "too_many_timers")
    print(
        f"flood: {args.pushes} pushes x {args.keys} perf/mfu keys ({push_s:.1f} s), "
        f"1 file x {args.keys} timing_s keys; {args.scrapes} scrapes each"
    )
    print(f"{'':14}{'clean':>12}{'flooded':>12}{'ratio':>8}")
    for key, label in (
        ("rss_mb", "RSS MB"),
        ("p50_ms", "scrape p50 ms"),
        ("p99_ms", "scrape p99 ms"),
        ("bytes", "/metrics B"),
        ("series", "series"),
    ):
        print(f"{label:14}{c[key]:12.1f}{f[key]:12.1f}{f[key] / c[key]:8.2f}")
    print(f"dropped unknown_mfu_stage: {mfu:.0f} of {args.pushes * args.keys}")
    print(f"dropped too_many_timers:   {tim:.0f} of {args.keys} (32 kept as phase)")
    ok = (
        f["rss_mb"] < 150
        and f["p99_ms"] < 50
        and mfu == args.pushes * args.keys
        and tim == args.keys - 32
    )
    print(
        "goals (RSS < 150 MB, p99 < 50 ms, every flooded key counted):", "met" if ok else "MISSED"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
