"""Where the exporter's CPU goes at 1,000 jobs (issue 37), side by side with a baseline.

    .venv/bin/python bench/profile_load.py [--jobs 1000] [--seconds 120] [--interval 15 1]
        [--baseline DIR] [--no-profile] [--rounds 1]

N verl JSONL files (30 steps of history each); every job then appends one realistic record
(about 60 keys, `bench/fleet.py`'s) about every 60 s at its own random moments: a random
first moment in the minute, then 60 s x U(0.9, 1.1) after each step, so jobs never step in
label order. One `serve --verl-root` watches them; with `--baseline DIR` (a checkout of
another commit, e.g. `git worktree add /tmp/before <commit>`) a second `serve` from that
tree watches the SAME files at the same time, and both are scraped at the same moments: the
two run side by side under the same load and the same neighbours, and the ratio is the figure
to read on a shared machine.

For each scrape interval (`--interval`, default 15 s and 1 s), a scraper GETs /metrics with
gzip in Prometheus's Accept header (OpenMetrics first) for `--seconds` seconds. Printed per
server: scrape p50 / p99, the process's CPU (user + system from /proc, % of one core over
the window: every thread, the scrapes included), peak RSS, the body's size.

The profile (unless `--no-profile`): py-spy samples each exporter (`--nonblocking --gil`,
100 Hz: a sample is a moment a thread held the interpreter, i.e. ran Python) over the
same window, and the samples are grouped by area (the leaf-most frame that names one): file
polling, reading records, the job's state and snapshot, the decision table, the GPU join,
exposition encoding, exposition assembly, gzip, the view, the HTTP server, other. Nothing is
asserted: the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet import OPENMETRICS, Jobs, cpu_seconds, get, pct, peak_rss_mb  # noqa: E402

from tests.support.procs import free_port, wait_until  # noqa: E402

PERIOD = 60.0
PY_SPY = Path(sys.executable).parent / "py-spy"

# (area, substrings of a py-spy frame "function (file:line)"); the leaf-most frame that
# matches one decides, so the more specific areas come first in each frame's test
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gzip", ("metrics/gzip_member.py", "metrics/deflate.py", "gzip.py", "zlib")),
    (
        "exposition: encoding",
        ("metrics/fragment_lines.py", "metrics/lines.py", "prometheus_client/"),
    ),
    (
        "exposition: assembly",
        ("metrics/exposition.py", "metrics/chunks.py", "metrics/families.py"),
    ),
    ("GPU join", ("gpuwindows/", "diagnosis/gpujoin.py")),
    ("decision table", ("rlhf_exporter/diagnosis/",)),
    ("view", ("rlhf_exporter/view/",)),
    ("reading records", ("verl_reader.py", "orjson", "json/")),
    ("file polling", ("verl_files.py", "verl_tail.py")),
    ("job state / snapshot", ("rlhf_exporter/job/", "metrics/snapshot.py", "lifecycle.py")),
    ("sources (other)", ("rlhf_exporter/sources/",)),
    ("HTTP server", ("rlhf_exporter/server/", "http/server.py", "socketserver.py")),
)


def area_of(stack: list[str]) -> str:
    for frame in reversed(stack):  # leaf first
        for area, needles in AREAS:
            if any(n in frame for n in needles):
                return area
    return "other (threads, GC, interpreter)"


class RandomSteps:
    """Each job steps at its own random moments: first in U(0, PERIOD), then every PERIOD x
    U(0.9, 1.1) after its previous step (the writes of one job never line up with others')."""

    def __init__(self, jobs: Jobs, seed: int = 37):
        self.jobs, self.rng = jobs, random.Random(seed)
        self.steps = 0

    def run(self, stop: threading.Event) -> None:
        now = time.monotonic()
        heap = [(now + self.rng.uniform(0, PERIOD), i) for i in range(self.jobs.n)]
        heapq.heapify(heap)
        while not stop.is_set():
            at, i = heap[0]
            if stop.wait(max(0.0, at - time.monotonic())):
                return
            heapq.heapreplace(heap, (at + PERIOD * self.rng.uniform(0.9, 1.1), i))
            self.jobs.write(i)
            self.steps += 1


def start_serve(tree: Path, root: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhf_exporter", "serve", "--listen", f"127.0.0.1:{port}"]
        + ["--verl-root", str(root), "--no-ray", "--no-nvml", "--no-push"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, port


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(PY_SPY), "record", "--pid", str(pid), "--duration", str(int(seconds))]
        + ["--rate", "100", "--nonblocking", "--gil", "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def read_profile(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """(samples per area, samples per leaf function of the package, all samples)."""
    areas: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return areas, leaves, 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        areas[area_of(frames)] += n
        for frame in reversed(frames):
            if "rlhf_exporter" in frame:
                leaves[frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].split(":")[0]] += n
                break
        total += n
    return areas, leaves, total


def scrape_both(
    servers: list[tuple[str, subprocess.Popen, int]], seconds: float, interval: float
) -> dict[str, dict]:
    """Scrape every server at each tick (in turn, order alternating), for `seconds`."""
    res = {name: {"times": [], "size": (0, 0)} for name, _, _ in servers}
    for _name, _p, port in servers:
        get(port, OPENMETRICS)
    cpu0 = {name: cpu_seconds(p.pid) for name, p, _ in servers}
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        order = servers if n % 2 == 0 else servers[::-1]
        for name, _p, port in order:
            elapsed, zipped = get(port, OPENMETRICS)
            res[name]["times"].append(elapsed)
            if n == 0:
                res[name]["size"] = (len(gzip.decompress(zipped)), len(zipped))
        n += 1
        time.sleep(max(0.0, t0 + n * interval - time.monotonic()))
    wall = time.monotonic() - t0
    for name, p, _ in servers:
        res[name]["cpu"] = (cpu_seconds(p.pid) - cpu0[name]) / wall
        res[name]["rss"] = peak_rss_mb(p.pid)
    return res


def print_profile(label: str, path: Path, top: int) -> None:
    areas, leaves, total = read_profile(path)
    if not total:
        print(f"  profile {label}: no samples (py-spy needs ptrace)")
        return
    print(f"  profile {label}: {total} samples (100 Hz; a sample = a thread holding the GIL)")
    for area, n in areas.most_common():
        print(f"    {area:<34} {n:>6}  {100 * n / total:5.1f} %")
    print(f"    top {top} leaf functions of the package:")
    for fn, n in leaves.most_common(top):
        print(f"      {fn:<58} {n:>6}  {100 * n / total:5.1f} %")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=120.0, help="measured window per interval")
    ap.add_argument("--interval", type=float, nargs="+", default=[15.0, 1.0])
    ap.add_argument("--baseline", type=Path, help="another checkout's tree, run side by side")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--keep", type=Path, help="copy the raw py-spy profiles here")
    args = ap.parse_args()
    print(f"{args.jobs} jobs, a step each ~60 s at random moments; gzip; cpus {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        jobs = Jobs(root, args.jobs)
        servers = [("this tree", *start_serve(REPO, root))]
        if args.baseline:
            servers.append(("baseline", *start_serve(args.baseline.resolve(), root)))
        stop = threading.Event()
        try:
            want = f'rlhf_exporter_jobs{{collector="verl"}} {float(args.jobs)}'.encode()
            t = time.monotonic()
            for _name, _p, port in servers:
                wait_until(
                    lambda port=port: want in gzip.decompress(get(port, OPENMETRICS)[1]),
                    900,
                    1.0,
                    "every job ingested",
                )
            print(f"  ingested by all in {time.monotonic() - t:.0f} s")
            steps = RandomSteps(jobs)
            threading.Thread(target=steps.run, args=(stop,), daemon=True).start()
            time.sleep(20)  # into the steady state: steps arriving, formats warm
            for interval in args.interval:
                outs = [Path(tmp) / f"profile-{k}-{interval:g}.txt" for k in range(len(servers))]
                spies = (
                    []
                    if args.no_profile
                    else [profile(p.pid, args.seconds, o) for (_n, p, _), o in zip(servers, outs)]
                )
                s0 = steps.steps
                res = scrape_both(servers, args.seconds, interval)
                for spy in spies:
                    spy.wait(60)
                print(
                    f"\n scrape every {interval:g} s for {args.seconds:g} s "
                    f"({steps.steps - s0} steps written)"
                )
                print(
                    f"  {'server':<10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU %':>7} "
                    f"{'RSS MiB':>8} {'body MB':>8} {'gz MB':>6}"
                )
                for name, r in res.items():
                    ts = r["times"]
                    print(
                        f"  {name:<10} {pct(ts, 50) * 1e3:>8.1f} {pct(ts, 99) * 1e3:>8.1f} "
                        f"{max(ts) * 1e3:>8.1f} {r['cpu'] * 100:>7.2f} {r['rss']:>8.0f} "
                        f"{r['size'][0] / 1e6:>8.2f} {r['size'][1] / 1e6:>6.2f}"
                    )
                if args.baseline:
                    a, b = res["this tree"], res["baseline"]
                    print(
                        f"  ratio this/baseline: CPU {a['cpu'] / max(b['cpu'], 1e-9):.2f}x, "
                        f"p99 {pct(a['times'], 99) / pct(b['times'], 99):.2f}x, median "
                        f"{statistics.median(a['times']) / statistics.median(b['times']):.2f}x"
                    )
                for (name, _p, _port), out in zip(servers, outs) if spies else ():
                    print_profile(name, out, args.top)
                    if args.keep:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        shutil.copy(out, args.keep / out.name)
        finally:
            stop.set()
            for _name, p, _port in servers:
                p.terminate()
                p.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
