"""Restart semantics: a file truncated and rewritten (verl restarts and resumes) while scraped."""

from __future__ import annotations

import itertools
import os
import threading

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.metrics.catalog import BY_NAME, COUNTER
from tests.support.serve import Exporter

LAB = {"project": "p", "experiment": "e"}


def counters(exp) -> dict:
    return {
        (n, lab): v
        for (n, lab), v in exp.samples().items()
        if n in BY_NAME and BY_NAME[n].type == COUNTER
    }


def test_truncate_and_rewrite_20_times_while_scraping(tmp_path):
    with Exporter(tmp_path) as exp:
        path = exp.verl_root / "p" / "e.jsonl"
        path.parent.mkdir()
        stop = threading.Event()
        seen: list[dict] = []
        problems: list[str] = []

        def scrape():
            while not stop.is_set():
                try:
                    seen.append(counters(exp))
                except Exception as exc:
                    problems.append(repr(exc))

        scraper = threading.Thread(target=scrape)
        scraper.start()
        written = steps = 0
        try:
            for run in range(20):
                n = 3 + run % 4
                offset = (
                    100 * run if run % 2 else 0
                )  # odd runs restart at a *higher* step: a resume
                lines = [
                    encode({"step": r["step"] + offset, "data": r["data"]})
                    for r in records([(REGIMES["sync_bound"], n)], seed=run)
                ]
                with open(path, "wb", buffering=0) as f:  # "wb" truncates, like verl's FileLogger
                    f.write(lines[0])
                    written += 1
                    steps += 1
                    exp.wait_for(
                        lambda written=written: (
                            exp.value("rlhf_exporter_records_total", collector="verl") == written
                        ),
                        what=f"run {run}: first line",
                    )
                    for line in lines[1:]:
                        f.write(line)
                    f.write(b'{"step": 7, "da')  # a half-written line, cut off by the restart
                written += len(lines) - 1
                steps += len(lines) - 1
                exp.wait_for(
                    lambda written=written: (
                        exp.value("rlhf_exporter_records_total", collector="verl") == written
                    ),
                    what=f"run {run}: all lines",
                )
                assert exp.value("rlhf_run", **LAB) == run
        finally:
            stop.set()
            scraper.join(10)
        assert not problems, problems[:3]
        assert exp.value("rlhf_steps_total", **LAB) == steps
        assert exp.value("rlhf_exporter_records_total", collector="verl") == written
        # each cut-off line was counted once, when its file was truncated
        assert (
            exp.value(
                "rlhf_exporter_record_errors_total", collector="verl", reason="incomplete_line"
            )
            == 19
        )
        # counters never went backwards in any scrape
        assert len(seen) > 20
        for before, after in itertools.pairwise(seen):
            for key, value in before.items():
                assert after.get(key, value) >= value, key


def test_replaced_file_is_a_new_run(tmp_path):
    with Exporter(tmp_path) as exp:
        path = exp.verl_root / "p" / "e.jsonl"
        path.parent.mkdir()
        lines = [encode(r) for r in records([(REGIMES["rollout_long_tail"], 8)])]
        path.write_bytes(b"".join(lines))
        exp.wait_for(lambda: exp.value("rlhf_steps_total", **LAB) == len(lines))
        assert exp.value("rlhf_baseline_step_duration_seconds", **LAB) is not None
        # a new file moved over the old one (new inode), longer than before, at higher steps
        new = tmp_path / "new.jsonl"
        more = [
            encode({"step": r["step"] + 50, "data": r["data"]})
            for r in records([(REGIMES["sync_bound"], 9)], seed=5)
        ]
        new.write_bytes(b"".join(more))
        os.replace(new, path)
        exp.wait_for(lambda: exp.value("rlhf_steps_total", **LAB) == len(lines) + len(more))
        assert exp.value("rlhf_run", **LAB) == 1
        assert exp.value("rlhf_bottleneck", verdict="sync", **LAB) == 1.0
