"""Benchmark (issue 17): the GPU-window join's CPU cost on the sidecar, 8 GPUs, a step per 30 s.

No GPU here, so `pynvml` is the scripted fake from tests/support/fake_pynvml.py, injected as
`sys.modules['pynvml']` (the collector's own code path; each GPU has a trainer or rollout
process matched through a /proc tree, so the role join is paid for too). Side by side, on
this process's CPU clock, over the same simulated hour (one poll per simulated second, NVML
sampling 6 times a second):
  (a) the NVML collector with the join: samples kept per GPU, a step timeline rebuilt from
      its record every 30 s (what the Job does) and joined, the window counters exported;
  (b) the same, with R left spread evenly (no `place_untimed`: the placement's own cost);
  (c) the same collector without the join.
The join's cost = (a) - (c), as a share of one core at one poll per second. Goal: <= 0.5 %.
With `--fully-async N`, the job is fully-async with trigger_parameter_sync_step = N: a record
every N steps, placed sub-step by sub-step (`timeline.Placer`, as the Job does) and joined
together (`place_substeps`: R placed over the run and each window fitted to its busy stretch).

    .venv/bin/python bench/gpuwindows.py [--seconds 3600] [--gpus 8] [--runs 5] [--fully-async N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.diagnosis import Record, StreamDiagnoser, gpujoin  # noqa: E402
from rlhf_exporter.diagnosis.gpufit import place_untimed  # noqa: E402
from rlhf_exporter.diagnosis.substeps import place_substeps  # noqa: E402
from rlhf_exporter.diagnosis.timeline import Placer  # noqa: E402
from rlhf_exporter.join.board import WindowBoard  # noqa: E402
from rlhf_exporter.sources.nvml import NvmlSource  # noqa: E402
from rlhf_exporter.sources.ray import ActorProcess  # noqa: E402
from rlhf_exporter.thresholds_file import load_thresholds  # noqa: E402
from tests.support.fake_pynvml import FakeClock, FakeGpu, FakeRay, make_module  # noqa: E402

STEP = 30.0
TH = load_thresholds()


def _proc(root: Path, pid: int, title: bytes) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(title + b"\0" * 20)
    (d / "stat").write_bytes(f"{pid} (x) S 1 {pid} {pid} 0".encode())


def run(
    seconds: int, n_gpus: int, join: bool, root: Path, place: bool = True, n_sync: int = 0
) -> tuple[float, int]:
    """CPU seconds for `seconds` polls, and the window samples exported at the end."""
    gpujoin.place_untimed = place_untimed if place else (lambda tl, busy: tl)
    gpujoin.place_substeps = place_substeps if place else (lambda tls, busy: tuple(tls))
    start = 1000.0
    clock = FakeClock(start)
    util = [(float(t), 90.0 if (t % 30) < 20 else 5.0) for t in range(0, seconds + 60, 5)]
    gpus = [
        FakeGpu(i, util=util, start=start, buffer=120, processes=[(100 + i % 2, 1 << 30)])
        for i in range(n_gpus)
    ]
    sys.modules["pynvml"] = make_module(gpus, clock)
    actors = {100: ActorProcess("WorkerDict", "trainer"), 101: ActorProcess("vLLM", "rollout")}
    board = WindowBoard(keep=32) if join else None
    src = NvmlSource(
        1.0, ray=FakeRay(actors), clock=clock, proc_root=str(root), wall=clock, windows=board
    )
    sd = StreamDiagnoser(TH)
    data = {
        "timing_s/gen": 18.0,
        "timing_s/reward": 1.0,
        "timing_s/old_log_prob": 3.0,
        "timing_s/adv": 0.5,
        "timing_s/update_actor": 6.0,
        "timing_s/update_weights": 1.0,
        "timing_s/step": 29.8,
    }
    placer = Placer(TH)
    every = int(STEP) * max(n_sync, 1)
    if n_sync:  # a record sums N sub-steps; the shifted one holds the weight sync
        data = {k: v * n_sync for k, v in data.items() if k != "timing_s/update_weights"}
        data["timing_s/timing_s/param_sync"] = 1.0
    src.poll_once()
    cpu0 = time.process_time()
    for t in range(1, seconds + 1):
        clock.advance(1.0)
        if join and t % every == 0:  # the Job's part: classify, place, post
            step = t // every
            rec = dict(data)
            if n_sync:
                rec["training/global_step"] = step * n_sync
                rec["fully_async/count/stale_samples_processed"] = 0
            d = sd.feed(Record(step, rec)).diagnosis
            for tl in placer.place(d.step, d.windows, d.timers, rec, clock()):
                board.post(("p", "e"), tl)
        snap = src.poll_once()
    cpu = time.process_time() - cpu0
    assert snap.up, snap.errors
    n = sum(1 for s in snap.samples if s.name.startswith("rlhf_window_gpu"))
    return cpu, n


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fully-async", type=int, default=0, metavar="N")
    args = ap.parse_args()
    n_sync = args.fully_async
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        _proc(root, 100, b"ray::WorkerDict")
        _proc(root, 101, b"ray::vLLM")
        with_join, even, without = [], [], []
        for _ in range(args.runs):  # interleaved, best of each
            cpu, n = run(args.seconds, args.gpus, True, root, n_sync=n_sync)
            with_join.append(cpu)
            even.append(run(args.seconds, args.gpus, True, root, place=False, n_sync=n_sync)[0])
            without.append(run(args.seconds, args.gpus, False, root)[0])
    a, e, b = min(with_join), min(even), min(without)
    per_s = (a - b) / args.seconds
    mode = f", fully-async N = {n_sync} (a record per {STEP * n_sync:g} s)" if n_sync else ""
    print(
        f"{args.gpus} GPUs, {args.seconds} s simulated, a step per {STEP:g} s{mode}, "
        f"best of {args.runs}"
    )
    print(f"  NVML collector with the join:    {a / args.seconds * 1e6:8.1f} us CPU per poll")
    print(f"  ... with R spread evenly:        {e / args.seconds * 1e6:8.1f} us CPU per poll")
    print(f"  NVML collector without the join: {b / args.seconds * 1e6:8.1f} us CPU per poll")
    steps = args.seconds // (int(STEP) * max(n_sync, 1))
    print(f"  placing R: {(a - e) / steps * 1e3:.2f} ms CPU per {'record' if n_sync else 'step'}")
    print(f"  ratio with/without: {a / b:.3f}x; window series exported: {n}")
    print(
        f"  the join: {per_s * 1e6:.1f} us per second = {per_s * 100:.4f} % of one core (goal <= 0.5 %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
