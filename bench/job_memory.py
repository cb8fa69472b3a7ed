"""Where the exporter's memory goes per job (issue 37): bytes per job by structure.

    .venv/bin/python bench/job_memory.py [--jobs 300] [--history 30 90] [--top 25]
        [--baseline DIR]

In one process, as `serve --verl-root` holds them: N verl JSONL files written by
`bench/fleet.py`'s `Jobs` (its realistic ~60-key records), each with `--history` steps
(30: what `bench/profile_load.py` starts with; 90: a job past every bound, its history and
baseline full), read by the real `VerlFileSource`, and the exposition built for one
OpenMetrics + gzip scrape (what Prometheus asks for).

Printed, for each history length:
- the process's RSS before the jobs and after (the interpreter, the imports and the
  thresholds are in "before"), and the difference per job;
- a deep `sys.getsizeof` walk of each job's structures, every object counted once, in the
  order listed (an object two structures share counts in the first): bytes per job;
- `tracemalloc`'s live memory grouped by file and by line (where it was allocated: a
  dict orjson parsed counts at `verl_reader.py`'s `orjson.loads` line), per job.

`--baseline DIR` (another checkout's tree, e.g. `git archive main`) runs the same in a
child process with that tree first on `sys.path`, and prints both side by side. Nothing is
asserted: the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
TREE = Path(os.environ.get("JOB_MEMORY_TREE", BENCH.parent)).resolve()
sys.path.insert(0, str(BENCH))  # fleet (the parent only: it imports this tree's package)
sys.path.insert(0, str(TREE))  # the package measured (this tree, or --baseline's)
OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.5"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_ATOMIC = (str, bytes, bytearray, int, float, bool, type(None), complex)


def deep_size(root: Any, seen: set[int]) -> int:
    """Bytes of `root` and everything it reaches that `seen` has not counted (modules,
    classes and functions are shared code, not state: not followed)."""
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | type(sys) | type(deep_size)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, _ATOMIC):
            continue
        stack.extend(_children(obj))
    return total


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        yield from obj.keys()
        yield from obj.values()
        return
    if isinstance(obj, list | tuple | set | frozenset):
        yield from obj
        return
    if hasattr(obj, "__iter__") and type(obj).__name__ in ("deque", "array"):
        yield from obj
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        yield d
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if hasattr(obj, slot) and not slot.startswith("__"):
                yield getattr(obj, slot)


def structures(src: Any, ex: Any) -> Iterable[tuple[str, list[Any]]]:
    """(name, the objects of every job that make it up), in counting order."""
    watched = list(src._watched.values())
    jobs = [w.job for w in watched]

    def attrs(*names: str) -> list[Any]:
        return [getattr(j, n, None) for j in jobs for n in names]

    yield "exported samples (Job._samples)", attrs("_samples")
    yield "last step's diagnosis (Job.last)", attrs("last")
    yield "history for the job view (Job._history)", attrs("_history", "_episodes")
    yield "diagnoser: current step's data", [j._diagnoser.data for j in jobs]
    yield "diagnoser: baseline", [j._diagnoser.baseline for j in jobs]
    yield "diagnoser: rest", [j._diagnoser for j in jobs]
    yield "record cleaner", attrs("_cleaner")
    yield "extra gauges (Job._extra)", attrs("_extra")
    yield "placer", attrs("_placer")
    yield "engine evidence", attrs("engine", "_engine_windows")
    yield (
        "counters (Job dicts)",
        attrs("group_seconds", "verdict_steps", "reason_steps", "change_steps", "regression_steps"),
    )
    yield "Job (rest)", jobs
    yield "summaries (landing page)", [src._summary_of.get(w.path) for w in watched]
    yield "file reader (Watched)", watched
    frags = list(ex._by_id.values())
    yield "exposition: fragment lines", [f.lines for f in frags]
    yield "exposition: fragments (rest)", frags
    yield "exposition: chunks, plain", [c.raw for c in ex._chunks.cache.values()]
    yield "exposition: chunks, gzip segments", [c.gz for c in ex._chunks.cache.values()]
    yield "exposition: family lines cache", [ex._lines.family_lines]
    yield "exposition: bodies", list(ex._bodies.values())
    yield "exposition: rest", [ex]
    yield "source (rest)", [src]


def measure(root: Path, jobs: int, history: int, top: int, trace: bool) -> dict[str, Any]:
    """One process's figures for the files under `root`: RSS and the walk, or (`trace`)
    tracemalloc's, which costs memory of its own and would inflate the RSS."""
    from rlhf_exporter.metrics.exposition import Exposition
    from rlhf_exporter.sources.verl_files import VerlFileSource
    from rlhf_exporter.thresholds_file import load_thresholds

    th = load_thresholds()
    out: dict[str, Any] = {"jobs": jobs, "history": history}
    gc.collect()
    rss0 = rss_kib()
    if trace:
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
    src = VerlFileSource(th, [root], poll_budget=1 << 40, file_budget=1 << 30)
    src.poll_once()
    ex = Exposition([src.snapshot])
    body = ex.render(OPENMETRICS, True)[0]
    src.poll_once()  # a poll that finds nothing new
    ex.render(OPENMETRICS, True)
    gc.collect()
    out["exported"] = len(src.snapshot().parts)
    out["body"] = len(body)
    if trace:
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        files: Counter[str] = Counter()
        lines: Counter[str] = Counter()
        for stat in snap1.compare_to(snap0, "lineno"):
            frame = stat.traceback[0]
            short = frame.filename.split("site-packages/")[-1].removeprefix(f"{TREE}/")
            files[short] += stat.size_diff
            lines[f"{short}:{frame.lineno}"] += stat.size_diff
        out["files"] = {k: v / jobs for k, v in files.most_common(top)}
        out["lines"] = {k: v / jobs for k, v in lines.most_common(top)}
        out["traced_per_job"] = sum(files.values()) / jobs
        return out
    rss1 = rss_kib()
    out["rss_before_mib"] = rss0 / 1024
    out["rss_after_mib"] = rss1 / 1024
    out["rss_per_job"] = (rss1 - rss0) * 1024 / jobs
    seen: set[int] = set()
    # what existed before the jobs is not theirs (interned names, catalog constants)
    for obj in (th, sys.modules):
        deep_size(obj, seen)
    held = list(structures(src, ex))  # held: a freed list's id could be reused
    out["structures"] = {name: deep_size(objs, seen) / jobs for name, objs in held}
    return out


def child(args: argparse.Namespace, tree: Path, roots: list[Path]) -> dict[str, Any]:
    """Each history's files, in fresh processes: one for RSS and the walk, one traced."""
    runs = []
    for history, root in zip(args.history, roots):
        run: dict[str, Any] = {}
        for trace in (False, True):
            cmd = [sys.executable, __file__, "--json", "--jobs", str(args.jobs)]
            cmd += ["--top", str(args.top), "--history", str(history), "--root", str(root)]
            cmd += ["--trace"] if trace else []
            env = dict(os.environ, JOB_MEMORY_TREE=str(tree))
            done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            run.update(json.loads(done.stdout))
        runs.append(run)
    return {"runs": runs}


def show(results: list[tuple[str, dict[str, Any]]], top: int) -> None:
    names = [n for n, _ in results]
    for k, _h in enumerate(results[0][1]["runs"]):
        runs = [r["runs"][k] for _, r in results]
        first = runs[0]
        print(
            f"\n{first['jobs']} jobs x {first['history']} steps of history "
            f"({first['exported']} exported; OpenMetrics gzip body {first['body'] / 1e6:.2f} MB)"
        )
        head = "".join(f"{n:>14}" for n in names)
        print(f"  {'':<44}{head}")
        print(
            f"  {'RSS before the jobs, MiB':<44}"
            + "".join(f"{r['rss_before_mib']:>14.1f}" for r in runs)
        )
        print(
            f"  {'RSS with the jobs, MiB':<44}"
            + "".join(f"{r['rss_after_mib']:>14.1f}" for r in runs)
        )
        print(
            f"  {'RSS per job, bytes':<44}" + "".join(f"{r['rss_per_job']:>14,.0f}" for r in runs)
        )
        print(
            f"  {'traced (tracemalloc) per job, bytes':<44}"
            + "".join(f"{r['traced_per_job']:>14,.0f}" for r in runs)
        )
        print("  getsizeof walk, bytes per job:")
        keys = list(dict.fromkeys(k for r in runs for k in r["structures"]))
        for key in keys:
            vals = "".join(f"{r['structures'].get(key, 0):>14,.0f}" for r in runs)
            print(f"    {key:<42}{vals}")
        total = "".join(f"{sum(r['structures'].values()):>14,.0f}" for r in runs)
        print(f"    {'total':<42}{total}")
        for n, r in zip(names, runs):
            print(f"  tracemalloc, {n}: bytes per job by file (top {top})")
            for where, b in r["files"].items():
                print(f"    {where:<60}{b:>10,.0f}")
            print(f"  tracemalloc, {n}: bytes per job by line (top {top})")
            for where, b in r["lines"].items():
                print(f"    {where:<60}{b:>10,.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--history", type=int, nargs="+", default=[30, 90])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--baseline", type=Path, help="another checkout's tree, measured beside")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        out = measure(args.root, args.jobs, args.history[0], args.top, args.trace)
        print(json.dumps(out))
        return 0
    import fleet  # writes the files (with this tree's simulator): both trees read the same

    with tempfile.TemporaryDirectory() as tmp:
        roots = []
        for history in args.history:
            roots.append(Path(tmp) / f"verl-{history}")
            fleet.HISTORY = history
            fleet.Jobs(roots[-1], args.jobs)
        results = [("this tree", child(args, BENCH.parent, roots))]
        if args.baseline:
            results.append(("baseline", child(args, args.baseline.resolve(), roots)))
    show(results, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
