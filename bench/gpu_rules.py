"""The GPU rule groups at every job's GPUs (issue 37): 8,000 GPUs against 400, side by side.

    .venv/bin/python bench/gpu_rules.py [--jobs 1000] [--hours 2] [--rounds 5] [--workdir DIR]

`bench/dashboard_cost.py` measured the GPU rule groups with one job in 20 behind an NVML
sidecar (400 GPUs of 1,000 jobs x 8). This bench builds two TSDBs of only the GPU series
(tests/support/fleet_hardware.py: the NVML source's names, labels and values, one sample per
15 s scrape): one with every job's 8 GPUs (8,000), one with one job in 20 (400), each with
the records of alerts/gpu-health.rules.yaml and alerts/gpu-windows.rules.yaml backfilled over
the same hours. Two real Prometheus servers serve them at once, and each GPU group is
timed on both, interleaved (each rule's expression as an instant query at the end, summed,
as `dashboard_cost.py` times groups; median of `--rounds`).

Why a short history is the figure for 24 h: these groups read at most 1 h of history (their
widest range is `[1h]`), and a query reads only the blocks its range covers, so 2 h of
history cost what the last 2 h of a 24 h TSDB cost. Nothing is asserted: the figures go to
bench/README.md.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dashboard_cost import BLOCK, SCRAPE, rule_groups, seconds_of, start_prometheus, time_group  # noqa: E402

from tests.support import fleet_hardware, fleet_history  # noqa: E402

RULE_FILES = [REPO / "alerts" / "gpu-health.rules.yaml", REPO / "alerts" / "gpu-windows.rules.yaml"]


def build(work: Path, jobs: int, gpu_every: int, start: float, end: float) -> int:
    """The GPU series of `jobs` jobs (GPUs on every `gpu_every`-th) over [start, end) and
    the GPU groups' records; returns the raw samples written."""
    data = work / "prom" / "data"
    if (work / "done").exists():
        return int((work / "done").read_text())
    plans = fleet_hardware.plans(jobs, start, end)
    total, t0 = 0, time.time()
    for k, lo in enumerate(range(int(start), int(end), BLOCK)):
        path = work / f"gpus-{k}.om"
        total += fleet_hardware.write_openmetrics(
            path, plans, start, (lo, lo + BLOCK), gpu_every=gpu_every
        )
        fleet_history.backfill(path, data)
        path.unlink()
        print(
            f"  {gpu_every=}: window {k}, {total:,} samples, {time.time() - t0:.0f} s", flush=True
        )
    fleet_history.backfill_record_levels(RULE_FILES, work, data, start, end, log=print)
    (work / "done").write_text(str(total))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=2, help="history, a multiple of 2 (>= 2)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", type=Path, help="keep both TSDBs here (reused when present)")
    args = ap.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-rules-"))
    end = float(math.floor(time.time() / BLOCK) * BLOCK)
    stamp = root / "end"
    if stamp.exists():
        end = float(stamp.read_text())
    root.mkdir(parents=True, exist_ok=True)
    stamp.write_text(str(end))
    start = end - args.hours * 3600
    sides = {
        "every job (8 GPUs each)": 1,
        f"one job in {fleet_hardware.GPU_EVERY}": fleet_hardware.GPU_EVERY,
    }
    t0 = time.time()
    samples = {}
    for name, every in sides.items():
        work = root / f"every{every}"
        work.mkdir(parents=True, exist_ok=True)
        samples[name] = build(work, args.jobs, every, start, end)
    print(f"setup {time.time() - t0:.0f} s", flush=True)
    groups = [g for g in rule_groups() if g["name"].startswith("rlhf-exporter.gpu")]
    proms = {
        name: start_prometheus(root / f"every{every}" / "prom") for name, every in sides.items()
    }
    try:
        at = end - SCRAPE
        times: dict[tuple[str, str], list[float]] = {}
        read: dict[tuple[str, str], int] = {}
        for _ in range(args.rounds):
            for group in groups:
                for name, prom in proms.items():
                    ms, n = time_group(prom, group, at)
                    times.setdefault((name, group["name"]), []).append(ms)
                    read[name, group["name"]] = n
        print(f"\n{args.jobs} jobs, {args.hours} h of GPU history at {SCRAPE} s")
        for name, prom in proms.items():
            gpus = prom.query(f"count(rlhf_gpu_busy_seconds_total @ {at})")
            series = prom.query(f"count({{__name__=~'.+'}} @ {at})")
            print(
                f"  {name}: {gpus[0]['value'][1] if gpus else 0} GPUs, "
                f"{series[0]['value'][1] if series else 0} series, {samples[name]:,} raw samples"
            )
        print(
            f"\n| rule group | interval | GPUs | ms (median of {args.rounds}) | % of interval "
            "| samples read | ms ratio to the smaller fleet |"
        )
        print("|---|---:|---|---:|---:|---:|---:|")
        small = list(sides)[1]
        for group in groups:
            interval = seconds_of(group.get("interval", f"{SCRAPE}s"))
            base = statistics.median(times[small, group["name"]])
            for name in sides:
                ms = statistics.median(times[name, group["name"]])
                print(
                    f"| {group['name']} | {interval} s | {name} | {ms:.0f} | "
                    f"{ms / 10 / interval:.1f} | {read[name, group['name']]:,} | "
                    f"{ms / base if base else float('nan'):.1f}x |"
                )
    finally:
        for prom in proms.values():
            prom.terminate()
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
