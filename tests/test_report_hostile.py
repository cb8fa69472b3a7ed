"""`diagnose --html` against hostile paths and sizes: it never overwrites its input (even
through a link), replaces a symlink at the target instead of writing through it, writes
atomically, and stays bounded whatever the log's length (at most MAX_DRAWN bars per run,
the last REPORT_RUNS runs of a file)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

from rlhf_exporter.commands.diagnose import REPORT_RUNS
from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.diagnosis import GROUPS
from rlhf_exporter.diagnosis.history import MAX_DRAWN, StepBins, StepPoint

ROOT = Path(__file__).resolve().parents[1]


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "diagnose", "--format", "jsonl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_report_never_overwrites_its_input(tmp_path):
    log = tmp_path / "run.jsonl"
    write_jsonl(log, [(REGIMES["balanced"], 5)])
    before = log.read_bytes()
    (tmp_path / "link.html").symlink_to(log)
    os.link(log, tmp_path / "hard.html")
    for target in (log, tmp_path / "link.html", tmp_path / "hard.html"):
        out = diagnose(str(log), "--html", str(target))
        assert out.returncode == 2, out.stderr
        assert "refusing to overwrite" in out.stderr
        assert log.read_bytes() == before


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    log = tmp_path / "run.jsonl"
    write_jsonl(log, [(REGIMES["balanced"], 5)])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "report.html"
    target.symlink_to(victim)
    out = diagnose(str(log), "--html", str(target))
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and "<svg" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "run.jsonl", "victim.txt"]


def test_a_long_log_is_drawn_in_at_most_max_drawn_bars(tmp_path):
    log = tmp_path / "long.jsonl"
    n = 2 * MAX_DRAWN + 500
    write_jsonl(log, [(REGIMES["balanced"], n)])
    out = diagnose(str(log), "--html", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    bars = page.count('<g class="bar"')
    assert MAX_DRAWN // 2 <= bars <= MAX_DRAWN
    assert (
        f"{n - 1} steps drawn as {bars} bars" in page or f"{n} steps drawn as {bars} bars" in page
    )
    assert len(page) < 4 << 20  # ~27 MB for 20,000 steps before


def test_only_the_last_runs_of_a_file_are_drawn(tmp_path):
    log = tmp_path / "restarts.jsonl"
    plan = [(REGIMES["balanced"], 4)]
    with log.open("w") as f:  # a log whose step goes back to 1 again and again (restarts)
        for _ in range(REPORT_RUNS + 10):
            one = tmp_path / "one.jsonl"
            write_jsonl(one, plan)
            f.write(one.read_text())
    out = diagnose(str(log), "--html", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert page.count("<h3>Run ") == REPORT_RUNS
    assert "10 earlier runs" in page


def _point(i: int) -> StepPoint:
    g = tuple(float((i + k) % 7) for k in range(len(GROUPS)))
    return StepPoint(0, i, "rollout", "long_tail", sum(g), g, 0.0, "steady", None, 10.0, None)


def test_step_bins_hold_any_number_of_steps_in_bounded_memory():
    n = 200_000  # a million in the issue: the bound does not depend on it
    bins = StepBins(limit=500)
    most = total = 0.0
    for i in range(n):
        p = _point(i)
        total += p.step_seconds
        bins.add(p)
        most = max(most, len(bins._bins))
    points = bins.points()
    assert most <= 500 and len(points) <= 500 and bins.steps == n
    # every step is in one bar: the bars' means times their widths add up to the total
    widths = [bins.width] * (len(points) - 1) + [n - bins.width * (len(points) - 1)]
    assert abs(sum(p.step_seconds * w for p, w in zip(points, widths)) - total) < 1e-6 * total
    assert [p.step for p in points[:2]] == [0, bins.width]
    tracemalloc.start()  # and memory does not grow with the steps added
    for i in range(20_000):
        bins.add(_point(n + i))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20
