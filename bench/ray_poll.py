"""Benchmark: the Ray source against a real Ray head holding 1,000 pending actors.

Starts its own head (127.0.0.1, free ports, own temp dir; stopped at the end), a driver
with a few live actors named like verl's and 1,000 actors that ask for a resource no node
has (they stay PENDING_CREATION without a worker). Then, in one run:
  (1) the cost of one poll: wall time and the exporter's CPU time, over --polls polls;
  (2) GET /metrics latency of two real `serve` processes on the same verl log, one with the
      Ray source polling every --ray-interval seconds (far more often than the default
      15 s, so that many scrapes meet a poll) and one with --no-ray, measured in
      alternating rounds; prints both p99s and their ratio (goal: at most 1.2).

    .venv/bin/python bench/ray_poll.py [--pending 1000] [--polls 20] [--gets 1200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl  # noqa: E402
from rlhf_exporter.sources.ray import RaySource  # noqa: E402
from tests.support.ray_head import RayHead  # noqa: E402
from tests.support.serve import Exporter  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scrape_times(url: str, n: int) -> list[float]:
    """A new connection per GET: on a kept-alive connection the server currently adds a
    constant ~40 ms (delayed ACK against a response written in several sends), which would
    hide the difference this benchmark looks for."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        r = requests.get(url + "/metrics", timeout=10)
        r.raise_for_status()
        out.append(time.perf_counter() - started)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pending", type=int, default=1000)
    ap.add_argument("--polls", type=int, default=20)
    ap.add_argument("--gets", type=int, default=1200, help="GET /metrics per exporter")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ray-interval", type=float, default=1.0)
    args = ap.parse_args()

    import ray

    head = RayHead(num_cpus=2)
    try:
        ray.init(
            address=head.gcs_address,
            namespace="bench",
            log_to_driver=False,
            configure_logging=False,
        )

        class Live:
            def ping(self):
                return 1

        live = []
        for name in ("WorkerDict", "vLLMHttpServer", "AgentLoopWorker", "TaskRunner"):
            cls = type(name, (Live,), {})
            cls.__qualname__ = name
            live.append(ray.remote(num_cpus=0)(cls).remote())
        ray.get([a.ping.remote() for a in live], timeout=120)
        Pending = type("RewardLoopWorker", (Live,), {})
        pending_cls = ray.remote(num_cpus=0, resources={"nonexistent": 1})(Pending)
        pending = [pending_cls.remote() for _ in range(args.pending)]

        src = RaySource(head.dashboard_url, interval=60, timeout=10)
        deadline = time.monotonic() + 120
        while True:
            snap = src.poll_once()
            n = sum(
                v
                for s in [snap]
                for x in s.samples
                if x.name == "rlhf_ray_actors" and x.labels[1] == "PENDING_CREATION"
                for v in [x.value]
            )
            if n >= args.pending or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print(f"Ray {ray.__version__}: {len(live)} live actors, {int(n)} PENDING_CREATION")

        walls, cpus = [], []
        for _ in range(args.polls):
            w, c = time.perf_counter(), time.process_time()
            snap = src.poll_once()
            assert snap.up, snap.errors
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        print(
            f"one poll ({args.polls} polls): wall median {statistics.median(walls) * 1e3:.1f} ms, "
            f"p90 {pct(walls, 0.9) * 1e3:.1f} ms, max {max(walls) * 1e3:.1f} ms; "
            f"exporter CPU median {statistics.median(cpus) * 1e3:.1f} ms"
        )

        with tempfile.TemporaryDirectory(prefix="rlhf-bench-ray-") as tmp:
            tmp = Path(tmp)
            (tmp / "verl" / "bench").mkdir(parents=True)
            write_jsonl(tmp / "verl" / "bench" / "job.jsonl", DEMO_PLAN)
            common = ["--verl-root", str(tmp / "verl")]
            with (
                Exporter(
                    tmp / "on",
                    *common,
                    "--ray",
                    "--ray-address",
                    head.dashboard_url,
                    "--ray-interval",
                    str(args.ray_interval),
                ) as on,
                Exporter(tmp / "off", *common, "--no-ray") as off,
            ):
                for exp in (on, off):
                    exp.wait_for(
                        lambda e=exp: e.value("rlhf_steps_total", project="bench"), 60, "steps"
                    )
                on.wait_for(
                    lambda: on.value("rlhf_ray_actors", state="PENDING_CREATION") == args.pending,
                    60,
                    "ray polled",
                )
                times = {"on": [], "off": []}
                per_round = max(1, args.gets // args.rounds)
                for _ in range(args.rounds):
                    times["off"] += scrape_times(off.url, per_round)
                    times["on"] += scrape_times(on.url, per_round)
                errors = on.value("rlhf_exporter_collector_errors_total", collector="ray") or 0
                assert on.value("rlhf_exporter_collector_up", collector="ray") == 1.0
        for k in ("off", "on"):
            t = times[k]
            print(
                f"GET /metrics, Ray {k:>3}: n={len(t)} median {statistics.median(t) * 1e3:.2f} ms, "
                f"p99 {pct(t, 0.99) * 1e3:.2f} ms, max {max(t) * 1e3:.2f} ms"
            )
        ratio = pct(times["on"], 0.99) / pct(times["off"], 0.99)
        print(
            f"p99 ratio Ray on/off (polling every {args.ray_interval:g}s): {ratio:.2f} (goal <= 1.2); "
            f"ray poll errors during the run: {int(errors)}"
        )
        del pending
        return 0 if ratio <= 1.2 else 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop()


if __name__ == "__main__":
    sys.exit(main())
