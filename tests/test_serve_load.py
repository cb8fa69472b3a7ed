"""Load: 32 concurrent scrapers and 4 pushers for 20 s against a real server with live jobs."""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections import Counter

import psutil
import pytest
import requests

from rlhf_exporter.demo.simulator import REGIMES, records, write_jsonl
from tests.support.serve import Exporter

DURATION = 20.0
SCRAPERS = 32
SAMPLE_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? [-+0-9.eE]+|.* [-+]?(Inf|NaN)")


def whole_exposition(text: str) -> bool:
    """A text exposition cut anywhere misses its last newline, a family or a whole sample
    line (0.0.4 has no end marker): the body ends in a newline after a complete sample, and
    holds the exporter's own first and last families."""
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    return (
        text.endswith("\n")
        and SAMPLE_LINE.fullmatch(last) is not None
        and "rlhf_exporter_build_info{" in text
        and "\nprocess_start_time_seconds " in text
    )


PUSHERS = 4


@pytest.mark.slow
def test_32_scrapers_and_4_pushers(tmp_path):
    root = tmp_path / "verl"
    for i in range(20):  # 20 file jobs next to the demo job and the pushed ones
        (root / "fleet").mkdir(parents=True, exist_ok=True)
        write_jsonl(root / "fleet" / f"job{i:02d}.jsonl", [(REGIMES["sync_bound"], 30)], seed=i)
    with Exporter(tmp_path, "--demo", "--demo-step-seconds", "0.05") as exp:
        proc = psutil.Process(exp.popen.pid)
        stop = threading.Event()
        statuses: Counter = Counter()
        failures: list[str] = []
        scrapes = Counter()

        def scraper(i: int) -> None:
            s = requests.Session()
            path = ("/metrics", "/metrics", "/metrics", "/", "/readyz")[i % 5]
            while not stop.is_set():
                try:
                    r = s.get(exp.url + path, timeout=10)
                    statuses[r.status_code] += 1
                    if path == "/metrics" and not whole_exposition(r.text):
                        failures.append("truncated /metrics body")
                    scrapes[path] += 1
                except requests.RequestException as exc:
                    failures.append(repr(exc))

        def pusher(i: int) -> None:
            s = requests.Session()
            step = 0
            rs = list(records([(REGIMES["update_low_mfu"], 40)], seed=i))
            while not stop.is_set():
                batch = []
                for r in rs[1:5]:
                    step += 1
                    batch.append({"step": step, "data": r["data"]})
                try:
                    r = s.post(
                        exp.url + "/api/v1/records",
                        timeout=10,
                        json={"project": "load", "experiment": f"pusher{i}", "records": batch},
                    )
                    statuses[r.status_code] += 1
                except requests.RequestException as exc:
                    failures.append(repr(exc))

        threads = [threading.Thread(target=scraper, args=(i,)) for i in range(SCRAPERS)]
        threads += [threading.Thread(target=pusher, args=(i,)) for i in range(PUSHERS)]
        rss: list[float] = []
        for t in threads:
            t.start()
        try:
            end = time.monotonic() + DURATION
            while time.monotonic() < end:
                rss.append(proc.memory_info().rss / 2**20)
                time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(15)
        assert not failures, failures[:5]
        assert set(statuses) == {200}, statuses
        assert scrapes["/metrics"] > 100
        assert exp.value("rlhf_steps_total", project="load") > 0
        # RSS settles: the last quarter is not steadily above the second quarter
        q = len(rss) // 4
        early, late = statistics.median(rss[q : 2 * q]), statistics.median(rss[-q:])
        assert late < early * 1.15 + 5, (early, late, rss)
        assert exp.alive()
        print(
            f"\n{sum(scrapes.values())} GETs, {statuses[200]} 200s; RSS MiB early {early:.1f} late {late:.1f}"
        )
