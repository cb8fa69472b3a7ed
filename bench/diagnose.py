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
import resource
import subprocess
import sys
import tempfile
import time

import orjson

from rlhf_exporter.demo.simulator import REGIMES, encode, records, regressed, shifted


def build_log(path: str, steps: int) -> int:
    base = REGIMES["rollout_long_tail"]
    quarter = steps // 4
    plan = [
        (base, quarter),
        (REGIMES["update_low_mfu"], quarter),
        (shifted(REGIMES["sync_bound"], 1.5), quarter),
        (regressed(REGIMES["sync_bound"], "update_actor", 2.0), steps - 3 * quarter),
    ]
    with open(path, "wb") as f:
        for record in records(plan, seed=1, validation=False):
            f.write(encode(record))
    return os.path.getsize(path)


def parse_floor(path: str) -> tuple[float, float]:
    """(wall, CPU) seconds to orjson.loads every line."""
    start, cpu = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        for line in f:
            orjson.loads(line)
    return time.perf_counter() - start, time.process_time() - cpu


# As an installed tool runs: with its bytecode cached (pip compiles it at install; a
# development shell may set PYTHONDONTWRITEBYTECODE, which would recompile on every start).
INSTALLED_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def end_to_end(path: str) -> tuple[float, float]:
    """(wall, CPU) seconds of the whole `diagnose --format jsonl` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run(
            [sys.executable, "-m", "rlhf_exporter", "diagnose", "--format", "jsonl", path],
            stdout=devnull,
            check=True,
            env=INSTALLED_ENV,
        )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.jsonl")
        size = build_log(path, args.steps)
        print(f"log: {args.steps} steps, {size / 1e6:.1f} MB, {size / args.steps:.0f} B/record")
        end_to_end(path)  # warm-up: writes the bytecode cache
        floors, e2es = [], []
        for _ in range(args.repeat):  # interleaved, so both sides see the same machine
            floors.append(parse_floor(path))
            e2es.append(end_to_end(path))
    floor = min(w for w, _ in floors), min(c for _, c in floors)
    e2e = min(w for w, _ in e2es), min(c for _, c in e2es)
    n = args.steps
    print(
        f"(b) parse floor, orjson.loads per line: {n / floor[0]:>9,.0f} steps/s wall, "
        f"{n / floor[1]:>9,.0f} steps/s CPU"
    )
    print(
        f"(a) diagnose --format jsonl, end to end: {n / e2e[0]:>9,.0f} steps/s wall, "
        f"{n / e2e[1]:>9,.0f} steps/s CPU"
    )
    print(
        f"ratio (a)/(b): {e2e[0] / floor[0]:.2f}x wall, {e2e[1] / floor[1]:.2f}x CPU  (goal: <= 8)"
    )


if __name__ == "__main__":
    main()
