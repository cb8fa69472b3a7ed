"""Benchmark: `diagnose --format jsonl` end to end against the parse floor, in one run.

Builds a 20,000-step log in verl's exact format (~1.5 KB a record, with the simulator's
regimes), then measures side by side:
  (a) `rlhf-exporter diagnose --format jsonl LOG > /dev/null`, as a subprocess (end to end:
      interpreter start, reading, parsing, the decision table, JSON output);
  (b) the parse floor: `orjson.loads` of every line and nothing else (in-process).
Prints steps per second for both and their ratio (goal, issue 37: at most 3).

With `--baseline DIR` (a tree of an earlier commit: `git archive REV rlhf_exporter | tar -x
-C DIR`) it also runs that tree's diagnose on the same log in the same run, interleaved,
and checks that both outputs are byte-identical.

    .venv/bin/python bench/diagnose.py [--steps 20000] [--repeat 3] [--baseline DIR]
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


# Runs another tree's rlhf_exporter: the editable install's finder would win over sys.path.
BASELINE_MAIN = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]
sys.path.insert(0, sys.argv.pop(1))
from rlhf_exporter.cli import main
raise SystemExit(main())"""


def command(baseline: str | None) -> list[str]:
    if baseline is None:
        return [sys.executable, "-m", "rlhf_exporter"]
    return [sys.executable, "-c", BASELINE_MAIN, os.path.abspath(baseline)]


def output(path: str, baseline: str | None) -> bytes:
    argv = [*command(baseline), "diagnose", "--format", "jsonl", path]
    return subprocess.run(argv, capture_output=True, check=True, env=INSTALLED_ENV).stdout


def end_to_end(path: str, baseline: str | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of the whole `diagnose --format jsonl` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run(
            [*command(baseline), "diagnose", "--format", "jsonl", path],
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
    ap.add_argument("--baseline", metavar="DIR", help="a tree of an earlier commit, side by side")
    ap.add_argument("--log", help="diagnose this log instead of building one (e.g. kept)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.log or os.path.join(tmp, "bench.jsonl")
        if not args.log:
            build_log(path, args.steps)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = sum(1 for _ in f)
        print(f"log: {n} records, {size / 1e6:.1f} MB, {size / n:.0f} B/record")
        sides = (
            {"this tree": None}
            if args.baseline is None
            else {
                "baseline": args.baseline,
                "this tree": None,
            }
        )
        if args.baseline is not None:
            same = output(path, args.baseline) == output(path, None)  # also the warm-up
            print(f"outputs byte-identical: {same}")
        else:
            end_to_end(path)  # warm-up: writes the bytecode cache
        floors: list[tuple[float, float]] = []
        e2es: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for i in range(args.repeat):  # interleaved, so every side sees the same machine
            floors.append(parse_floor(path))
            order = list(sides.items())
            for name, tree in order if i % 2 == 0 else order[::-1]:
                e2es[name].append(end_to_end(path, tree))
    floor = min(w for w, _ in floors), min(c for _, c in floors)
    print(
        f"(b) parse floor, orjson.loads per line: {n / floor[0]:>9,.0f} steps/s wall, "
        f"{n / floor[1]:>9,.0f} steps/s CPU"
    )
    for name, runs in e2es.items():
        e2e = min(w for w, _ in runs), min(c for _, c in runs)
        print(
            f"(a) diagnose --format jsonl, {name:>9}: {n / e2e[0]:>9,.0f} steps/s wall, "
            f"{n / e2e[1]:>9,.0f} steps/s CPU; (a)/(b) {e2e[0] / floor[0]:.2f}x wall, "
            f"{e2e[1] / floor[1]:.2f}x CPU  (goal: <= 3)"
        )


if __name__ == "__main__":
    main()
