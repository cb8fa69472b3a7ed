"""Benchmark: `diagnose --format jsonl` end to end against the parse floor, in one run.

Builds a 20,000-step log in verl's exact format (~1.5 KB a record, with the simulator's
regimes), then measures side by side:
  (a) `rlhf-exporter diagnose --format jsonl LOG > /dev/null`, as a subprocess (end to end:
      interpreter start, reading, parsing, the decision table, JSON output);
  (b) the parse floor: `orjson.loads` of every line and nothing else (in-process).
Prints steps per second for both and their ratio (goal: at most 8).

    .venv/bin/python bench/diagnose.py [--steps 20000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import orjson

from exporter.demo.simulator import REGIMES, encode, records, regressed, shifted


def build_log(path: str, steps: int) -> int:
    base = REGIMES["rollout_long_tail"]
    quarter = steps // 4
    plan = [(base, quarter), (REGIMES["update_low_mfu"], quarter),
            (shifted(REGIMES["sync_bound"], 1.5), quarter),
            (regressed(REGIMES["sync_bound"], "update_actor", 2.0), steps - 3 * quarter)]
    with open(path, "wb") as f:
        for record in records(plan, seed=1, validation=False):
            f.write(encode(record))
    return os.path.getsize(path)


def parse_floor(path: str) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            orjson.loads(line)
    return time.perf_counter() - start


def end_to_end(path: str) -> float:
    start = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run([sys.executable, "-m", "exporter", "diagnose", "--format", "jsonl", path],
                       stdout=devnull, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.jsonl")
        size = build_log(path, args.steps)
        print(f"log: {args.steps} steps, {size / 1e6:.1f} MB, {size / args.steps:.0f} B/record")
        floor = min(parse_floor(path) for _ in range(args.repeat))
        e2e = min(end_to_end(path) for _ in range(args.repeat))
    print(f"(b) parse floor, orjson.loads per line: {args.steps / floor:>10,.0f} steps/s ({floor:.3f} s)")
    print(f"(a) diagnose --format jsonl, end to end: {args.steps / e2e:>10,.0f} steps/s ({e2e:.3f} s)")
    print(f"ratio (a)/(b) time: {e2e / floor:.2f}x  (goal: <= 8)")


if __name__ == "__main__":
    main()
