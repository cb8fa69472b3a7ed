"""The job view at 100 jobs: rendering `/` and `/jobs/...`, and /metrics while `/` is hammered.

    .venv/bin/python bench/view.py [--jobs 100] [--rounds 200]

1. In process: `index_page` over 100 jobs with 60 steps of history each (goal < 50 ms) and
   `job_page` for one job, side by side with the /metrics body of the same jobs built
   uncached (a fresh `Exposition(...).render()`, the text format /metrics serves by default).
2. Over HTTP (the real server class, 127.0.0.1): GET /metrics p50/p99 alone, then while
   another thread fetches `/` in a loop. The page is rendered from the sources' immutable
   summaries and snapshots, and takes no lock a scrape takes, so the ratio should be near 1
   (both threads share one interpreter; what is left is the GIL).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.demo.simulator import DEMO_PLAN, REGIMES, records  # noqa: E402
from rlhf_exporter.diagnosis import Record  # noqa: E402
from rlhf_exporter.job.state import Job  # noqa: E402
from rlhf_exporter.metrics.exposition import Exposition  # noqa: E402
from rlhf_exporter.metrics.snapshot import Snapshot  # noqa: E402
from rlhf_exporter.server import Endpoints, landing_page, make_server  # noqa: E402
from rlhf_exporter.thresholds_file import load_thresholds  # noqa: E402
from rlhf_exporter.view.pages import Facts, Links, index_page, job_page  # noqa: E402

PLAN = [(REGIMES["balanced"], 20), *DEMO_PLAN]


def jobs(n: int) -> list[Job]:
    th = load_thresholds()
    out = []
    for i in range(n):
        job = Job(f"project-{i % 7}", f"experiment-{i}", th)
        job.feed(Record(r["step"], r["data"]) for r in records(PLAN, seed=i))
        out.append(job)
    return out


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def get(port: int, path: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    t = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, resp.status
    return time.perf_counter() - t


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    js = jobs(args.jobs)
    summaries = tuple(j.summary() for j in js)
    samples = tuple(x for j in js for x in j.samples())
    snap = Snapshot("verl", True, 0.002, time.time(), rest=samples)
    facts, links = Facts("bench", "http://127.0.0.1:1", "verl"), Links("https://x/docs/r.md")
    ep = Endpoints(snapshot_fns=[lambda: snap], jobs_fns=[lambda: summaries])

    index_best, index_med = best(lambda: index_page(summaries, [snap], facts, links), args.rounds)
    job_best, job_med = best(lambda: job_page(summaries[0], [snap], facts, links), args.rounds)
    # no cache: a fresh Exposition (the public API /metrics uses) encodes every job each time
    metrics_best, metrics_med = best(
        lambda: Exposition([lambda: snap]).render(), max(args.rounds // 10, 5)
    )
    size = len(landing_page(ep))
    print(f"{args.jobs} jobs, {len(samples)} series; / is {size / 1024:.0f} KiB")
    print(
        f"index_page: best {index_best * 1e3:.1f} ms, median {index_med * 1e3:.1f} ms (goal < 50)"
    )
    print(f"job_page:   best {job_best * 1e3:.1f} ms, median {job_med * 1e3:.1f} ms")
    print(
        f"/metrics body built uncached: best {metrics_best * 1e3:.1f} ms, "
        f"median {metrics_med * 1e3:.1f} ms -> index/metrics {index_med / metrics_med:.2f}x"
    )

    server = make_server("127.0.0.1:0", ep)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for _ in range(20):
            get(port, "/metrics")
        alone = [get(port, "/metrics") for _ in range(args.rounds)]
        stop = threading.Event()
        pages: list[float] = []

        def hammer() -> None:
            while not stop.is_set():
                pages.append(get(port, "/"))

        t = threading.Thread(target=hammer, daemon=True)
        t.start()
        busy = [get(port, "/metrics") for _ in range(args.rounds)]
        stop.set()
        t.join()
    finally:
        server.shutdown()
        server.server_close()
    print(
        f"GET /metrics alone:       p50 {pct(alone, 0.5) * 1e3:.2f} ms, p99 {pct(alone, 0.99) * 1e3:.2f} ms"
    )
    print(
        f"GET /metrics while / is fetched in a loop ({len(pages)} pages, p50 "
        f"{pct(pages, 0.5) * 1e3:.1f} ms): p50 {pct(busy, 0.5) * 1e3:.2f} ms, "
        f"p99 {pct(busy, 0.99) * 1e3:.2f} ms -> ratio p50 {pct(busy, 0.5) / pct(alone, 0.5):.2f}x, "
        f"p99 {pct(busy, 0.99) / pct(alone, 0.99):.2f}x"
    )


if __name__ == "__main__":
    main()
