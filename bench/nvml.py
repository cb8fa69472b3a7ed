"""Benchmark: the NVML collector's CPU cost per second of sampling, 8 fake GPUs, in one run.

No GPU here, so `pynvml` is the scripted fake from tests/support/fake_pynvml.py, injected as
`sys.modules['pynvml']` (the collector's own code path; the fake's Python functions cost
about what pynvml's ctypes calls do). Each GPU has two compute processes matched to "Ray
actor" PIDs through a /proc tree, so role attribution is paid for too.

Measured side by side, on the thread's CPU clock:
  (a) the source's background loop: PollingSource's thread calling poll() (integrate NVML's
      sample buffer, read memory/power/temperature/clock/processes and the health readings:
      ECC counters, remapped rows, throttle reasons, the XID event queue; the job's labels
      on every series; build the snapshot);
  (b) the same loop with the health readings not supported by the fake GPUs (asked once,
      then skipped: what the health readings cost is (a) - (b));
  (c) the same loop without the collector: the same thread, wait and bookkeeping, no poll.
The loop runs at a short interval to get many iterations quickly; the cost per poll is
then the cost per second of sampling at the default --nvml-interval 1 s. Goal: < 0.2 % of
one core.

    .venv/bin/python bench/nvml.py [--polls 2000] [--gpus 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.sources.base import PollingSource, PollResult  # noqa: E402
from rlhf_exporter.sources.nvml import NvmlSource  # noqa: E402
from rlhf_exporter.sources.ray import ActorProcess  # noqa: E402
from tests.support.fake_pynvml import (  # noqa: E402
    HEALTH_CALLS,
    FakeClock,
    FakeGpu,
    FakeRay,
    make_module,
)


class Idle(PollingSource):
    """The loop without the collector."""

    def poll(self) -> PollResult:
        return PollResult(())


def thread_cpu(
    source: PollingSource, polls: int, interval: float, clock: FakeClock | None = None
) -> float:
    """CPU seconds the source's own thread used for `polls` iterations. With `clock`, each
    poll first moves the fake GPUs' clock on by 1 s: every poll integrates a second's worth
    of NVML samples, as at the default interval."""
    done = threading.Event()
    result = {}
    original = source.poll_once
    count = 0
    start_cpu = None

    def counted():
        nonlocal count, start_cpu
        if start_cpu is None:
            start_cpu = time.thread_time()
        if clock is not None:
            clock.advance(1.0)
        snap = original()
        count += 1
        if count == polls:
            result["cpu"] = time.thread_time() - start_cpu
            done.set()
            source._stop.set()
        return snap

    source.poll_once = counted
    source.interval = interval
    source.start()
    done.wait(600)
    source.stop()
    return result["cpu"]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--polls", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.002, help="loop interval while measuring")
    args = ap.parse_args()

    proc = Path(tempfile.mkdtemp(prefix="rlhf-bench-proc-"))
    actors, gpus = {}, []
    for i in range(args.gpus):
        pids = (1000 + 2 * i, 1001 + 2 * i)
        for pid, title in ((pids[0], b"ray::WorkerDict"), (pids[1], b"ray::vLLMHttpServer")):
            (proc / str(pid)).mkdir()
            (proc / str(pid) / "cmdline").write_bytes(title + b"\0" * 64)
            (proc / str(pid) / "stat").write_bytes(f"{pid} (python) S 1 {pid} {pid} 0".encode())
        actors[pids[0]] = ActorProcess("WorkerDict", "trainer")
        actors[pids[1]] = ActorProcess("vLLMHttpServer", "rollout")
        gpus.append(
            FakeGpu(
                i, util=[(0, 50), (5, 100)], processes=[(pids[0], 40 << 30), (pids[1], 30 << 30)]
            )
        )

    def collector(health: bool) -> tuple[NvmlSource, FakeClock]:
        clock = FakeClock()
        for gpu in gpus:
            gpu.unsupported = set() if health else set(HEALTH_CALLS)
        sys.modules["pynvml"] = make_module(gpus, clock)
        source = NvmlSource(
            1.0,
            ray=FakeRay(actors),
            roles=True,
            clock=clock,
            proc_root=str(proc),
            job=("proj", "exp"),
        )
        assert source.poll_once().up
        return source, clock

    bare, bare_clock = collector(health=False)
    no_health_cpu = thread_cpu(bare, args.polls, args.interval, bare_clock)
    source, clock = collector(health=True)
    with_cpu = thread_cpu(source, args.polls, args.interval, clock)
    without_cpu = thread_cpu(Idle("idle", 1.0), args.polls, args.interval)
    snap = source.snapshot()
    samples = sum(s.value for s in snap.samples if s.name == "rlhf_gpu_samples_total")
    assert samples >= args.polls * 6 * args.gpus * 0.99, samples  # a second of samples per poll
    per_poll = (with_cpu - without_cpu) / args.polls
    print(f"{args.gpus} fake GPUs, {args.polls} polls, {len(snap.samples)} series per snapshot")
    print(f"  loop with the collector:    {with_cpu / args.polls * 1e6:8.1f} us CPU per poll")
    print(f"  without the health readings:{no_health_cpu / args.polls * 1e6:8.1f} us CPU per poll")
    print(f"  same loop, no collector:    {without_cpu / args.polls * 1e6:8.1f} us CPU per poll")
    health = (with_cpu - no_health_cpu) / args.polls
    print(
        f"  health readings per poll:   {health * 1e6:8.1f} us ({health / args.gpus * 1e6:.1f} us per GPU)"
    )
    print(
        f"  collector cost per poll:    {per_poll * 1e6:8.1f} us "
        f"({per_poll / args.gpus * 1e6:.1f} us per GPU)"
    )
    share = per_poll / 1.0 * 100
    print(f"  at --nvml-interval 1 s:     {share:.3f} % of one core (goal < 0.2 %)")
    print(f"  ratio with/without:         {with_cpu / max(without_cpu, 1e-9):.1f}x")
    return 0 if share < 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
