"""Scrapes at random moments against 1,000 stepping jobs: how often a scrape waits (issue 37).

    .venv/bin/python bench/scrape_phase.py [--jobs 1000] [--seconds 50] [--baseline DIR]

`bench/profile_load.py` scrapes at a fixed tick, so a run's scrapes keep one phase against
the exporter's 1 s polls. The runs then disagree: scrapes in phase with the builds are slow
every time, and the others never are. This bench scrapes at random moments, 50-300 ms
apart, and covers every phase. It uses the same files as profile_load, with jobs stepping
about every 60 s at random moments, and one `serve --verl-root` per tree. With `--baseline
DIR` (another checkout's tree) the baseline runs right after this tree, on the same files.
It prints p50, p90 and p99 in ms, and the share of scrapes over 10 ms. Nothing is asserted:
the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet import OPENMETRICS, Jobs, get  # noqa: E402
from profile_load import RandomSteps, start_serve  # noqa: E402

from tests.support.procs import wait_until  # noqa: E402


def scrape_at_random(port: int, jobs: Jobs, seconds: float, seed: int) -> list[float]:
    """Scrape latencies in ms, while the jobs step."""
    stop = threading.Event()
    writer = threading.Thread(target=RandomSteps(jobs, seed).run, args=(stop,), daemon=True)
    writer.start()
    rng, out = random.Random(seed), []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            out.append(get(port, OPENMETRICS)[0] * 1000)
            time.sleep(rng.uniform(0.05, 0.3))
    finally:
        stop.set()
        writer.join()
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=50.0)
    ap.add_argument("--baseline", type=Path, help="another checkout's tree, run after this one")
    args = ap.parse_args()
    trees = [("this tree", REPO)] + (
        [("baseline", args.baseline.resolve())] if args.baseline else []
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        jobs = Jobs(root, args.jobs)
        last = f"exp{args.jobs - 1:05d}".encode()
        print(f"{args.jobs} jobs, a step each ~60 s at random moments; scrapes 50-300 ms apart")
        print(
            f"  {'server':<10} {'scrapes':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'> 10 ms':>8}"
        )
        for seed, (name, tree) in enumerate(trees):
            proc, port = start_serve(tree, root)
            try:
                wait_until(
                    lambda port=port: last in gzip.decompress(get(port, OPENMETRICS)[1]),
                    180,
                    0.5,
                    what=f"{name} serving every job",
                )
                lat = scrape_at_random(port, jobs, args.seconds, seed)
            finally:
                proc.terminate()
                proc.wait(30)
            n = len(lat)
            over = sum(x > 10 for x in lat) / n
            print(
                f"  {name:<10} {n:>8} {lat[n // 2]:>8.1f} {lat[int(n * 0.9)]:>8.1f} "
                f"{lat[min(n - 1, int(n * 0.99))]:>8.1f} {over:>7.0%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
