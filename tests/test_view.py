"""The job view without a browser: what the pages hold, the job history, the terminal table.

The browser checks (console, layout, screenshot) are in test_view_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from rlhf_exporter.demo.simulator import DEMO_PLAN, REGIMES, records, write_jsonl
from rlhf_exporter.diagnosis import BatchDiagnoser, Record
from rlhf_exporter.diagnosis.advice import EVIDENCE_KEYS, look_at
from rlhf_exporter.diagnosis.history import HISTORY_STEPS, point
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.snapshot import Snapshot
from rlhf_exporter.render.dashboards.style import VERDICT_COLOURS
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view import pages
from rlhf_exporter.view.pages import Facts, Links, attention, index_page, job_page
from rlhf_exporter.view.report import Style, Table
from tests.support.browser import Elements
from tests.support.procs import exporter_cmd
from tests.support.segments import expected_segments

ROOT = Path(__file__).resolve().parents[1]
RUNBOOKS = "https://example.org/rlhf/blob/main/docs/runbooks.md"
LONG_PLAN = [(REGIMES["balanced"], 20), *DEMO_PLAN]  # 72 steps: more than the view keeps


def diagnosed(plan=DEMO_PLAN, seed: int = 1):
    th = load_thresholds()
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records(plan, seed))
    return list(BatchDiagnoser(th).diagnose(RecordReader().feed(data)))


def fed_job(project="p", experiment="e", plan=DEMO_PLAN, seed=1) -> Job:
    job = Job(project, experiment, load_thresholds())
    job.feed(Record(r["step"], r["data"]) for r in records(plan, seed))
    return job


def test_job_keeps_its_last_steps_as_points():
    job = fed_job(plan=LONG_PLAN)
    offline = diagnosed(LONG_PLAN)
    history = job.summary()["history"]
    assert len(offline) > HISTORY_STEPS >= len(history) == min(HISTORY_STEPS, len(offline))
    assert [p.step for p in history] == [d.step for d in offline[-len(history) :]]
    for p, d in zip(history, offline[-len(history) :]):
        assert p.verdict == d.verdict and p.change == d.change.change
        assert p.seconds() == pytest.approx(dict(d.windows.group_seconds))
        assert p.tokens_per_gpu_second and p.tokens_per_gpu_second > 0  # perf/throughput
    before = job.summary()["history"]
    job.feed([Record(10_000, {"timing_s/step": 5.0, "timing_s/gen": 4.0})])
    assert job.summary()["history"][-1].step == 10_000
    assert before[-1].step != 10_000  # a summary already handed out never changes


def _facts() -> tuple[Facts, Links]:
    return Facts("test", "http://127.0.0.1:9", "verl (test)"), Links(RUNBOOKS)


def test_job_page_draws_one_bar_per_step_one_segment_per_nonzero_group():
    job = fed_job(plan=LONG_PLAN)
    offline = diagnosed(LONG_PLAN)[-HISTORY_STEPS:]
    page = job_page(job.summary(), [], *_facts())
    el = Elements(page)
    bars = el.find("g", "bar")
    assert [int(b["data-step"]) for b in bars] == [d.step for d in offline]
    segs: dict[int, list[str]] = {}
    for tag, a, bar in el.items:
        if tag == "rect" and "seg" in a.get("class", ""):
            segs.setdefault(bar, []).append(a["data-group"])
            if a["data-group"] != "untimed":
                assert a["fill"] == VERDICT_COLOURS[a["data-group"]]
    assert [segs[i] for i in range(len(bars))] == [expected_segments(d) for d in offline]
    strip = el.find("rect", "verdict")
    assert [a["data-verdict"] for a in strip] == [d.verdict for d in offline]
    markers = el.find("text", "marker")
    assert [(int(a["data-step"]), a["data-change"]) for a in markers] == [
        (d.step, d.change.change) for d in offline if d.change.change != "steady"
    ]
    regressed = {a["data-regressed"] for a in markers if a["data-change"] == "regression"}
    assert regressed == {d.change.regressed for d in offline if d.change.regressed}
    last = offline[-1]
    assert f"Current verdict: {last.verdict}-bound: {last.reason}" in page
    # the runbook link is the rules' runbook_url: the thresholds' base + #alertname
    assert f'href="{RUNBOOKS}#rlhfjob{last.verdict}bound"' in page
    assert "<script" not in page and "src=" not in page  # nothing fetched, nothing run


def test_index_sorts_by_attention_and_links_each_job():
    plan = [*DEMO_PLAN[:-1], (DEMO_PLAN[-1][0], 2)]  # stops two steps into a regression
    regressed_job = fed_job("p", "regressing", plan=plan)
    quiet = fed_job("p", "quiet", plan=[(REGIMES["balanced"], 30)])
    bound = fed_job("a", "rollout", plan=[(REGIMES["rollout_long_tail"], 30)])
    jobs = [quiet.summary(), bound.summary(), regressed_job.summary()]
    assert regressed_job.summary()["change"] == "regression"
    order = [j["experiment"] for j in sorted(jobs, key=attention)]
    assert order == ["regressing", "rollout", "quiet"]
    snaps = [
        Snapshot("verl", True, 0.01, time.time() - 3),
        Snapshot("ray", False, 0.0, None, {"connection_refused": 4}),
        Snapshot("engines"),  # its first poll has not ended: starting, not down
    ]
    page = index_page(jobs, snaps, *_facts())
    assert (
        page.index("/jobs/p/regressing")
        < page.index("/jobs/a/rollout")
        < page.index("/jobs/p/quiet")
    )
    el = Elements(page)
    assert len(el.find("svg", "spark")) == 3
    rows = el.find("tr", "source")
    assert [r["data-up"] for r in rows] == ["1", "0", "0"]
    assert page.count(">down<") == 1  # ray only
    assert page.count('<span class="starting">starting</span>') == 1
    assert "connection_refused ×4" in page and "never" in page  # ray: down, never succeeded
    assert "scrape_configs:" in page and "targets: [&#x27;127.0.0.1:9&#x27;]" in page
    assert 'href="/metrics"' in page and "grafana/" in page and "docs/" in page


def test_stalled_jobs_come_first_and_say_so():
    fresh = fed_job("p", "fresh", plan=[(REGIMES["balanced"], 12)]).summary()
    old = fed_job("p", "old", plan=[(REGIMES["balanced"], 12)]).summary()
    regressing = fed_job("p", "regressing", plan=[*DEMO_PLAN[:-1], (DEMO_PLAN[-1][0], 2)])
    old = {**old, "last_step_time": time.time() - 900}  # > max(3 x ~100 s, 600 s)
    facts = Facts("test", "http://127.0.0.1:9", "verl", stall_factor=3.0, stall_min=600.0)
    page = index_page([fresh, regressing.summary(), old], [], facts, Links(RUNBOOKS))
    order = [a["href"] for a in Elements(page).find("a") if a["href"].startswith("/jobs/")]
    assert order[:3] == ["/jobs/p/old", "/jobs/p/regressing", "/jobs/p/fresh"]
    assert "stalled 15 min" in page
    one = job_page(old, [], facts, Links(RUNBOOKS))
    assert f'href="{RUNBOOKS}#rlhfjobstalled"' in one and "no new step for 15 min" in one
    assert "stalled" not in job_page(fresh, [], facts, Links(RUNBOOKS))


def test_index_renders_100_jobs_fast():
    """The goal is < 50 ms at 100 jobs (bench/view.py measures it); the test only guards
    against an order-of-magnitude slip on a loaded CI machine."""
    template = fed_job().summary()
    jobs = [{**template, "project": f"p{i % 7}", "experiment": f"e{i}"} for i in range(100)]
    facts = _facts()
    index_page(jobs, [], *facts)
    started = time.perf_counter()
    page = index_page(jobs, [], *facts)
    took = time.perf_counter() - started
    assert page.count('class="spark"') == 100
    assert took < 1.0, f"rendering / for 100 jobs took {took * 1000:.0f} ms"


def test_diagnose_html_report(tmp_path):
    log = tmp_path / "run.jsonl"
    write_jsonl(log, DEMO_PLAN, seed=2)
    out = tmp_path / "report.html"
    proc = subprocess.run(
        exporter_cmd("diagnose", "--summary", str(log), "--html", str(out)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "bottleneck:" in proc.stdout  # the table still goes to stdout
    page = out.read_text()
    offline = diagnosed(seed=2)
    el = Elements(page)
    assert [int(b["data-step"]) for b in el.find("g", "bar")] == [d.step for d in offline]
    assert "Verdict mix, mostly: sync-bound: weight_sync" in page
    # a regression links its runbook next to the verdict's
    assert "Runbook: RLHFJobRegression" in page and "Runbook: RLHFJobSyncBound" in page
    assert "<script" not in page and "src=" not in page


def test_diagnose_html_of_the_sample_traces(sample_traces, tmp_path):
    """Real verl logs (every mode of the sample traces): one bar per expected step."""
    logs = sorted(
        p for p in sample_traces.glob("*.jsonl") if not p.name.endswith(".expected.jsonl")
    )
    out = tmp_path / "traces.html"
    proc = subprocess.run(
        exporter_cmd("diagnose", "--summary", "--html", str(out)) + [str(p) for p in logs],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    el = Elements(out.read_text())
    expected = sum(
        len(p.with_name(p.name[: -len(".jsonl")] + ".expected.jsonl").read_text().splitlines())
        for p in logs
    )
    assert len(el.find("g", "bar")) == expected
    assert len(el.find("svg", "anatomy")) >= len(logs)


COLUMNS = (60, 80, 120, 200)


@pytest.mark.parametrize("width", COLUMNS)
def test_terminal_table_fits_the_width_and_keeps_look_at_next_whole(tmp_path, width):
    """No line is wider than the terminal; "look at next" is never cut nor dropped: it wraps
    under its own column; the summary's continuation lines wrap under their text."""
    from rlhf_exporter.diagnosis.advice import look_at

    log = tmp_path / "run.jsonl"
    write_jsonl(log, DEMO_PLAN, seed=3)
    proc = subprocess.run(
        exporter_cmd("diagnose", str(log)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(width)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = diagnosed(seed=3)
    table = [line for line in lines if line[:7].strip().isdigit()]
    assert len(table) == len(steps)
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, too_long[:3]
    assert "look at next" in proc.stdout
    # every step's advice, whole (spaces aside: it wraps), in its row and the lines under it
    start = next(i for i, line in enumerate(lines) if line.startswith("---"))
    end = next(i for i, line in enumerate(lines) if line.startswith("summary of"))
    rows = "\n".join(lines[start + 1 : end])
    flat = "".join(rows.split())
    for d in steps:
        advice = look_at(d.verdict, d.reason)
        assert "".join(advice.split()) in flat, (width, advice)
    assert "…" not in rows or width >= 200  # only the shares may be abbreviated
    # the summary wraps under its text, not under its label
    summary = proc.stdout.split("summary of")[1].splitlines()[1:]
    labelled = re.compile(r"^ {4,6}[a-z][a-z 0-9]*:\s+")
    indent = None
    for line in summary:
        m = labelled.match(line)
        if m:
            indent = m.end()
        elif line.startswith("    ") and indent is not None:
            assert len(line) - len(line.lstrip()) == indent, (indent, line)
    assert indent == 17  # "    look at:     ", "    episode 1:   ", "      look at:   "


def test_table_layout_at_each_width_drops_the_least_useful_columns_first():
    d = next(d for d in diagnosed() if d.change.change == "regression")
    style = Style(False)
    wide = Table(None)
    assert [c.name for c in wide.columns] == [
        "step",
        "verdict",
        "reason",
        "shares",
        "change",
        "look",
    ]
    assert "regression: update" in wide.row(d, style)
    layouts = {
        120: ["step", "verdict", "reason", "shares", "look"],
        80: ["step", "verdict", "reason", "look"],
        60: ["step", "verdict", "look"],
        40: ["step", "verdict", "look"],
    }
    for width, names in layouts.items():
        t = Table(width)
        assert [c.name for c in t.columns] == names, width
        assert t.widths["look"] >= min(40, width - 19), width  # readable: never squeezed
        row = t.row(d, style)
        # the dropped change column goes into the look-at cell of the rows that have one
        assert "[regression: update]" in " ".join(row.split()), width
        assert all(len(line) <= width for line in [*t.header(), *row.splitlines()]), width
    proc = subprocess.run(
        exporter_cmd("diagnose", "--wide"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
    )
    assert "top shares" in proc.stdout and max(map(len, proc.stdout.splitlines())) > 80


def test_wrap_breaks_a_long_verl_key_at_its_dots_and_underscores():
    from rlhf_exporter.view.report import wrap

    text = "bucket size (on verl 0.6: actor_rollout_ref.rollout.update_weights_bucket_megabytes)"
    lines = wrap(text, 30)
    assert all(len(line) <= 30 for line in lines)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    # Each line but the last ends where a word ends (a space follows it in the text) or
    # after a `.`, `_` or `/` inside the long key: never in the middle of a name.
    rest = text
    for line in lines[:-1]:
        assert rest.startswith(line), (line, rest)
        rest = rest[len(line) :]
        assert rest.startswith(" ") or line.endswith((".", "_", "/")), (line, lines)
        rest = rest.lstrip(" ")
    assert rest == lines[-1]
    assert lines == [
        "bucket size (on verl 0.6:",
        "actor_rollout_ref.rollout.",
        "update_weights_bucket_",
        "megabytes)",
    ]


def test_point_round_trip():
    d = diagnosed()[0]
    p = point(d, 12.0)
    assert p.step == d.step and p.tokens_per_gpu_second == 12.0


def test_server_routes_of_the_job_view():
    import threading

    import requests

    from rlhf_exporter.server import Endpoints, make_server

    jobs = (fed_job("proj", "exp/with slash").summary(),)
    ep = Endpoints(
        snapshot_fns=[lambda: Snapshot("verl", True, 0.0, time.time())],
        jobs_fns=[lambda: jobs],
        alerts={"runbook_url": RUNBOOKS},
    )
    server = make_server("127.0.0.1:0", ep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        index = requests.get(url + "/", timeout=5)
        assert index.status_code == 200 and "text/html" in index.headers["Content-Type"]
        assert "/jobs/proj/exp%2Fwith%20slash" in index.text
        one = requests.get(url + "/jobs/proj/exp%2Fwith%20slash", timeout=5)
        assert one.status_code == 200 and 'class="anatomy"' in one.text
        assert requests.get(url + "/jobs/proj/nope", timeout=5).status_code == 404
        assert requests.get(url + "/jobs/proj", timeout=5).status_code == 404
        api = requests.get(url + "/api/v1/jobs", timeout=5).json()["jobs"]
        assert api[0]["experiment"] == "exp/with slash" and "history" not in api[0]
        assert requests.head(url + "/", timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_job_page_says_what_the_log_cannot_show():
    from rlhf_exporter.diagnosis.advice import EVIDENCE_CAVEATS

    th = load_thresholds()
    v1 = Job("p", "v1", th)  # V1 trainer: no agent_loop/* keys, no perf/mfu/actor_infer
    v1.feed([Record(1, {"timing_s/step": 10.0, "timing_s/gen": 8.0})])
    lines = v1.summary()["cannot_show"]
    assert any("rollout/preemption cannot be seen" in line for line in lines)
    fully_async = Job("p", "fa", th)
    fully_async.feed([Record(1, {"timing_s/step": 10.0, "fully_async/rollouter/idle_ratio": 0.4})])
    assert EVIDENCE_CAVEATS["fully_async_idle_ratio"] in fully_async.summary()["cannot_show"]
    v0 = Job("p", "v0", th)  # legacy trainer with every key the reasons need
    keys = {k: 0.5 for k in EVIDENCE_KEYS if not k.startswith("fully_async/")}
    v0.feed([Record(1, {"timing_s/step": 10.0, **keys})])
    assert v0.summary()["cannot_show"] == ()
    html = pages.cannot_show(v1.summary()["cannot_show"])
    assert "cannot show" in html and "agent_loop" in html


def test_a_not_reported_value_is_no_evidence_on_the_job_page():
    """verl writes agent_loop/num_preempted = -1 when the engine does not report preemptions
    (and MFU 0 on a GPU it does not know): the notice must stay until a real value arrives."""
    th = load_thresholds()
    keys = {k: 0.5 for k in EVIDENCE_KEYS if not k.startswith("fully_async/")}
    job = Job("p", "unreported", th)
    pre = "timing_s/agent_loop/num_preempted/max"
    job.feed([Record(1, {"timing_s/step": 10.0, **keys, pre: -1})])
    lines = job.summary()["cannot_show"]
    assert len(lines) == 1 and lines[0].startswith("rollout/preemption cannot be seen"), lines
    plain = Job("p", "plain", th)  # the unprefixed spelling, and a null, are not evidence either
    plain.feed([Record(1, {"timing_s/step": 10.0, **keys, pre: None})])
    plain.feed([Record(2, {"timing_s/step": 10.0, "agent_loop/num_preempted/max": -1})])
    assert plain.summary()["cannot_show"] == lines
    job.feed([Record(2, {"timing_s/step": 10.0, pre: 0})])  # a reported 0 is evidence
    assert job.summary()["cannot_show"] == ()
    mfu = Job("p", "mfu0", th)
    mfu.feed([Record(1, {"timing_s/step": 10.0, **keys, "perf/mfu/actor_infer": 0.0})])
    assert [line.split(" cannot")[0] for line in mfu.summary()["cannot_show"]] == [
        "logprob/compute_bound",
        "logprob/low_mfu",
    ]


def test_the_report_answers_first_and_says_what_it_cannot_show_after(tmp_path):
    """Issue 38: per run, the headline (throughput change, episodes, verdict mix) and the
    episodes come before the verdict box; what the log cannot show comes after the answer."""
    log = ROOT / "tests" / "fixtures" / "traces" / "regression_after_slowdown_v1.jsonl"
    out = tmp_path / "report.html"
    subprocess.run(
        exporter_cmd("diagnose", "--summary", str(log), "--html", str(out)),
        capture_output=True,
        timeout=60,
        check=True,
    )
    page = out.read_text()
    headline = page.index('class="headline"')
    assert "Throughput fell 742 -&gt; 455 tokens/GPU-s (-39%)" in page[headline:]
    assert headline < page.index("Change episodes") < page.index("Verdict mix, mostly: balanced")
    assert page.index("Verdict mix, mostly") < page.index("cannot show")


def test_the_gpu_move_estimate_never_says_plus_zero():
    assert pages.move_text(0) == "keep the split (no GPU to move)"
    assert pages.move_text(1) == "move 1 GPU to the rollout"
    assert pages.move_text(-3) == "move 3 GPUs to the trainer"


def test_the_table_folds_a_look_at_that_repeats_the_row_above():
    diagnosed_steps = diagnosed(seed=2)
    table = Table(None)
    table.header()
    rows = [table.row(d, Style(False)) for d in diagnosed_steps]
    advice = [r.rstrip().rsplit("  ", 1)[-1] for r in rows]
    assert (
        advice.count(look_at(diagnosed_steps[0].verdict, diagnosed_steps[0].reason)) < len(rows) / 3
    )
    said = [look_at(d.verdict, d.reason) for d in diagnosed_steps]
    for step, before, now, text in zip(diagnosed_steps[1:], said, said[1:], advice[1:]):
        assert (text == '"') == (bool(now) and now == before), (step.step, text)


def test_no_job_yet_names_the_setting_that_would_show_one():
    """Before any job, `/` says what this exporter can see and which setting adds the rest."""
    none = Elements(index_page([], [], *_facts()))
    text = " ".join(none.text)
    assert "No source here can see a verl job." in text
    assert "--ray --console" in text and "--verl-root DIR" in text
    console_only = " ".join(Elements(index_page([], [Snapshot("console", True)], *_facts())).text)
    assert "every verl job on this Ray cluster" in console_only
    assert "--verl-root DIR" in console_only and "--ray --console" not in console_only
    assert "No source here" not in console_only
    both = [Snapshot("console", True), Snapshot("verl", True), Snapshot("push", True)]
    text = " ".join(Elements(index_page([], both, *_facts())).text)
    assert "To see more" not in text and "/api/v1/records" in text
