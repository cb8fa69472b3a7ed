"""Benchmark: one stack round of a stalled job of 16 actors, on a real Ray head (issue 39).

Starts its own head (127.0.0.1, free ports, own temp dir, RAY_DASHBOARD_ENABLE_PROFILING=1;
stopped at the end) with this process as the driver of 16 actors named and classed like
verl's (a TaskRunner, 8 WorkerDict, 4 vLLMHttpServer, 2 AgentLoopWorker, 1 RewardLoopWorker),
each blocked in a task (a sleep), plus one more actor that ticks every millisecond and
records the longest gap between its ticks (in a thread) (how long a dump pauses its target). Then, over
--rounds rounds each:
  (1) one stack round (the stacks source's `_round`: 17 GET /worker/traceback, each a py-spy
      dump on the node) with the C frames (native=1, the default) and without;
  (2) one poll of the Ray source (what the sidecar does every 15 s anyway), for scale;
prints the medians side by side, the ratio of a round to a poll, bytes kept per round, and
the longest pause the ticking actor saw during the rounds.

    .venv/bin/python bench/stacks.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.diagnosis.stall import StallLimit  # noqa: E402
from rlhf_exporter.sources.ray import RaySource  # noqa: E402
from rlhf_exporter.sources.stacks import StackSource  # noqa: E402
from tests.support.ray_head import connected_head  # noqa: E402

SHAPE = {"TaskRunner": 1, "WorkerDict": 8, "vLLMHttpServer": 4, "AgentLoopWorker": 2,
         "RewardLoopWorker": 1}  # fmt: skip


def actors():
    import ray

    class Blocked:
        def wait(self) -> None:
            time.sleep(3600)

    class Ticker:
        """Ticks every millisecond in a thread; `gap()` is the longest pause seen."""

        def __init__(self) -> None:
            self.longest = 0.0
            import threading

            threading.Thread(target=self._tick, daemon=True).start()

        def _tick(self) -> None:
            last = time.perf_counter()
            while True:
                time.sleep(0.001)
                now = time.perf_counter()
                self.longest = max(self.longest, now - last)
                last = now

        def gap(self, reset: bool = False) -> float:
            out = self.longest
            if reset:
                self.longest = 0.0
            return out

    made = []
    for name, n in SHAPE.items():
        cls = ray.remote(num_cpus=0)(type(name, (Blocked,), {}))
        for i in range(n):
            actor = cls.options(name=f"{name.lower()}_{i}", max_concurrency=2).remote()
            actor.wait.remote()
            made.append(actor)
    cls = ray.remote(num_cpus=0)(type("RewardComputeWorker", (Ticker,), {}))
    ticker = cls.options(max_concurrency=2).remote()
    return made, ticker


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    env = {
        "RAY_DASHBOARD_ENABLE_PROFILING": "1",
        "RAY_AUTH_MODE": "disabled",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    with connected_head("bench-stacks", grace=3, num_cpus=4, env=env) as head:
        import ray

        made, ticker = actors()
        ray.get(ticker.gap.remote())
        ray_source = RaySource(head.dashboard_url, timeout=10)
        job = {"project": "b", "experiment": "e", "state": "running",
               "last_step_time": time.time() - 3600}  # fmt: skip
        results: dict[str, list[float]] = {"native": [], "python": [], "poll": []}
        kept: dict[str, list[int]] = {"native": [], "python": []}
        pauses: dict[str, float] = {"native": 0.0, "python": 0.0}
        # warm up: every actor's worker exists and runs its task
        time.sleep(3)
        ray_source.poll_once()
        n = len(ray_source.job_processes("b", "e", sole=True))
        time.sleep(1)
        quiet = ray.get(ticker.gap.remote(reset=True))  # its longest pause without dumps
        for _ in range(args.rounds):
            started = time.perf_counter()
            ray_source.poll_once()
            results["poll"].append(time.perf_counter() - started)
            for kind, native in (("native", True), ("python", False)):
                src = StackSource(head.dashboard_url, ray_source, [lambda: [job]],
                                  StallLimit(3.0, 60.0), native=native)  # fmt: skip
                started = time.perf_counter()
                found = src._round(("b", "e"), job["last_step_time"], 3600.0, True)
                results[kind].append(time.perf_counter() - started)
                kept[kind].append(sum(len(p.text) for p in found.processes))
                paused = ray.get(ticker.gap.remote(reset=True))
                pauses[kind] = max(pauses[kind], paused)
                bad = [p.error for p in found.processes if p.wait is None]
                assert not bad, bad
                src.close()
        ray_source.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"processes read per round: {n} (the 16 actors and the ticking one)")
    print(f"{'':24}{'native=1':>12}{'native=0':>12}{'Ray poll':>12}")
    print(f"{'median seconds':24}{med['native']:>12.3f}{med['python']:>12.3f}{med['poll']:>12.3f}")
    per = {k: med[k] / n * 1000 for k in ("native", "python")}
    print(f"{'ms per process':24}{per['native']:>12.1f}{per['python']:>12.1f}")
    print(f"{'round / Ray poll':24}{med['native'] / med['poll']:>12.1f}"
          f"{med['python'] / med['poll']:>12.1f}")  # fmt: skip
    print(f"{'KiB kept per round':24}{statistics.median(kept['native']) / 1024:>12.1f}"
          f"{statistics.median(kept['python']) / 1024:>12.1f}")  # fmt: skip
    print(f"{'longest pause, ms':24}{pauses['native'] * 1000:>12.1f}"
          f"{pauses['python'] * 1000:>12.1f}   (of the ticking actor while its stack was "
          f"taken; {quiet * 1000:.1f} ms in a second without)")  # fmt: skip
    print(
        f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
    )
    del made
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
