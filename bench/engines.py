"""Benchmark (issue 29): the engine scraper and the join, 16 replicas read at 1 Hz.

Sixteen simulated vLLM replicas (tests/support/sim_engine.py, pages the size of a real
vLLM's: the read series plus a dozen histogram families) run in a child process, so their
own CPU is not counted. In this process, side by side over the same wall time, on this
process's CPU clock (every thread: the scrape pool too):
  (a) the engine source polling 16 replicas every second (HTTP, the line filter,
      prometheus_client's parser on the kept lines, the rings), and every 40 s the join of a
      30 s rollout window (what a Job does per step);
  (b) the same, handing the whole page to prometheus_client's parser (no line filter);
  (c) a baseline: the same loop that only sleeps.
The cost = (a) - (c) as a share of one core. Goal: < 1 %.

    .venv/bin/python bench/engines.py [--seconds 60] [--replicas 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.sources import engine_page as engines_mod  # noqa: E402
from rlhf_exporter.sources.engine_targets import Targets  # noqa: E402
from rlhf_exporter.sources.engines import EngineSource, fetch  # noqa: E402

ROLLOUT, STEP = 30.0, 40.0


def serve(n: int, start: float, q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[valid-type]
    from tests.support.sim_engine import EngineSim, Replica, Segment

    windows = [(start + k * STEP, start + k * STEP + ROLLOUT) for k in range(1000)]
    prof = (Segment(0.6, 48, 4, 0.8, 900, 0.1), Segment(1.0, 8, 0, 0.4, 200))
    sim = EngineSim([Replica("vllm", prof) for _ in range(n)], windows, bulk=True).start()
    q.put(sim.urls())
    stop.wait()
    sim.stop()


def run(urls: list[str], seconds: float, mode: str) -> tuple[float, int]:
    """CPU seconds of this process over `seconds` of wall time, and the windows joined."""
    source = EngineSource(Targets(static=urls), interval=1.0, timeout=2.0, active=lambda: True)
    whole = engines_mod.wanted_lines
    if mode == "unfiltered":  # every line to the parser (the filter's own worth)
        engines_mod.wanted_lines = lambda body: body.split(b"\n")
    joined = 0
    t0, c0 = time.monotonic(), time.process_time()
    next_join = t0 + STEP
    try:
        while time.monotonic() - t0 < seconds:
            tick = time.monotonic()
            if mode != "baseline":
                source.poll()
                if tick >= next_join:
                    now = time.time()
                    ev = source.evidence([(now - ROLLOUT - 5.0, now - 5.0)])
                    joined += ev is not None
                    next_join += STEP
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    finally:
        engines_mod.wanted_lines = whole
        source.close()
    return time.process_time() - c0, joined


def join_cost(replicas: int, runs: int = 200) -> float:
    """Milliseconds of CPU for one join: a 30 s rollout window over `replicas` rings at 1 Hz."""
    from collections import deque

    from rlhf_exporter.diagnosis.engines import EngineSample

    source = EngineSource(Targets(), interval=1.0)
    for r in range(replicas):
        ring: deque = deque(maxlen=900)
        for i in range(900):
            t = 1000.0 + i
            ring.append(EngineSample(t, 40 + r, i % 3, 0.9, i * 0.1, i * 900.0 + r))
        source._rings[f"r{r}"] = ring
    spans = [(1800.0, 1804.0), (1805.0, 1830.0)]
    c = time.process_time()
    for _ in range(runs):
        source.evidence(spans)
    return 1000 * (time.process_time() - c) / runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--replicas", type=int, default=16)
    args = ap.parse_args()
    q: mp.Queue = mp.Queue()
    stop = mp.Event()
    child = mp.Process(target=serve, args=(args.replicas, time.time(), q, stop), daemon=True)
    child.start()
    urls = q.get(timeout=60)
    try:
        body = fetch(urls[0], 2.0, 1 << 24)
        lines = body.count(b"\n")
        print(f"{len(urls)} replicas, a page: {len(body)} bytes, {lines} lines")
        out = {}
        for mode in ("baseline", "filtered", "unfiltered"):
            cpu, joined = run(urls, args.seconds, mode)
            out[mode] = cpu
            print(
                f"{mode:>10}: {cpu:7.3f} CPU s over {args.seconds:g} s "
                f"({100 * cpu / args.seconds:6.3f} % of a core), windows joined: {joined}"
            )
        base = out["baseline"]
        for mode in ("filtered", "unfiltered"):
            extra = out[mode] - base
            print(
                f"{mode} - baseline: {100 * extra / args.seconds:6.3f} % of a core "
                f"({1000 * extra / args.seconds / len(urls):.3f} ms CPU per replica read)"
            )
        ms = join_cost(len(urls))
        print(
            f"join: {ms:.2f} ms CPU per rollout window of 30 s over {len(urls)} replicas "
            f"({100 * ms / 1000 / STEP:.4f} % of a core at one step per {STEP:g} s)"
        )
        print(
            f"unfiltered / filtered cost: {(out['unfiltered'] - base) / max(out['filtered'] - base, 1e-9):.1f}x"
        )
    finally:
        stop.set()
        child.join(10)


if __name__ == "__main__":
    main()
