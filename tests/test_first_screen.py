"""Issue 48's first screen and demo story, on `/` and a job's page.

- The answer first: state, verdict and since when, what changed and what to do, before any
  table; the engines' evidence in full only where it bears on the verdict (rollout), with
  W defined in words; who waits on whom agrees with the verdict or says why it differs;
  GPU time by step window is a picture over a stated range; the Sources table lists only
  the errors that happened, and push (not polled) reads "accepting", never "never".
- Steps before the job's baseline are "warming up", not steady.
- The demo names the incident now playing from its scenario table, and its stall passes
  the stall limit on the demo's clock within its first five minutes.
- In Chromium at 1280x800 the answer and the step chart are above the fold (screenshots in
  test-artifacts/screenshots/).
"""

from __future__ import annotations

import re
import time
from html import unescape

import pytest

from rlhf_exporter.demo.job import EXPERIMENT, PROJECT, DemoJob
from rlhf_exporter.demo.simulator import DEMO_PLAN, REGIMES, records
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.snapshot import Snapshot
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view import draw
from rlhf_exporter.view.pages import Facts, Links, index_page, job_page
from tests.support import browser
from tests.support.browser import Elements
from tests.support.serve import Exporter

RUNBOOKS = "https://example.org/rlhf/blob/main/docs/runbooks.md"
FACTS, LINKS = Facts("test", "http://127.0.0.1:9", "verl (test)"), Links(RUNBOOKS)


def fed(plan, seed: int = 1, experiment: str = "e") -> dict:
    job = Job("p", experiment, load_thresholds())
    job.feed(Record(r["step"], r["data"]) for r in records(plan, seed))
    return job.summary()


def _before(page: str, first: str, then: str) -> bool:
    return 0 <= page.index(first) < page.index(then)


def test_the_answer_comes_before_any_table_and_the_chart():
    job, snaps = fed(DEMO_PLAN), [Snapshot("verl", True, 0.001, time.time())]
    for page in (job_page(job, snaps, FACTS, LINKS), index_page([job], snaps, FACTS, LINKS)):
        answer = page.index('class="verdict-box answer"')
        assert answer < page.index("<table") and answer < page.index('class="anatomy"')
        box = page[answer : page.index('<svg class="anatomy"')]
        text = re.sub(r"\s+", " ", " ".join(Elements(box).text))
        assert re.search(r"State: running, step \d+", text), text
        assert re.search(r"Current verdict: \S+ since step \d+ \(\d+ steps?, ", text), text
        assert "What changed:" in text and "Look at next:" in text


def test_engine_evidence_shows_in_full_only_for_a_rollout_verdict_and_defines_w():
    job = fed(DEMO_PLAN)
    engine = {"step": job["step"], "usable": True, "replicas": 2, "coverage": 0.9, "kv_max": 0.6}
    update = {**job, "verdict": "update", "reason": "low_mfu", "engine": engine}
    page = job_page(update, [], FACTS, LINKS)
    assert '<details class="engine-box" data-bears="0">' in page
    assert "W is the step's rollout window: the seconds it spent generating" in unescape(page)
    assert "engines: KV max" not in index_page([update], [], FACTS, LINKS)
    rollout = {**update, "verdict": "rollout", "reason": "queueing"}
    page = job_page(rollout, [], FACTS, LINKS)
    assert '<div class="engine-box" data-bears="1">' in page
    assert "W is the step's rollout window" in unescape(page)
    assert "engines: KV max 60%" in index_page([rollout], [], FACTS, LINKS)


def test_sources_show_only_the_errors_that_happened_and_push_is_accepting():
    snaps = [
        Snapshot("engines", True, 0.001, time.time(), {"engine_bad_http": 0, "engine_timeout": 2}),
        Snapshot("push", True, 0.0, None),
    ]
    page = job_page(fed(DEMO_PLAN), snaps, FACTS, LINKS)
    rows = {r[0]: r for r in _rows(page, "source")}
    assert "engine_timeout ×2" in rows["engines"][3] and "×0" not in page
    assert rows["push"][1] == "up" and rows["push"][2] == "not polled: accepting"
    assert "never" not in rows["push"]


def _rows(page: str, cls: str) -> list[list[str]]:
    found = re.findall(rf'<tr class="{cls}"[^>]*>(.*?)</tr>', page)
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", r)] for r in found]


def _windows(trainer_idle_in_rollout: float) -> tuple[dict, float]:
    """Separated GPUs (4 rollout, 4 trainer) over 1000 s: the trainer idles in rollout."""
    c = {
        ("rollout", "rollout"): (3600.0, 4000.0),
        ("rollout", "trainer"): (4000.0 * (1 - trainer_idle_in_rollout), 4000.0),
        ("update", "rollout"): (200.0, 2000.0),
        ("update", "trainer"): (1800.0, 2000.0),
    }
    return c, 1500.0


def test_gpu_time_is_a_picture_over_a_stated_range_and_who_waits_agrees_or_says_why():
    job = fed(DEMO_PLAN)
    limits = load_thresholds().document["balance"]
    counters, wall = _windows(0.9)
    update = {**job, "verdict": "update", "reason": "low_mfu"}
    page = unescape(
        job_page(update, [], FACTS, LINKS, windows=(counters, wall), balance_limits=limits)
    )
    assert '<svg class="gpu-time"' in page
    assert len(re.findall(r'<rect class="gpu-seg"', page)) == 8  # 4 (group, role), busy+idle
    assert "Over the 25 min of this job's steps joined since this exporter started" in page
    table = page.index("<details><summary>The numbers</summary><table>")
    assert page.index('<svg class="gpu-time"') < table  # the numbers a click away
    assert "trainer_starved" in page
    assert "It differs from the verdict (update): it adds up the 25 min" in page
    rollout = {**job, "verdict": "rollout", "reason": "long_tail"}
    page = unescape(
        job_page(rollout, [], FACTS, LINKS, windows=(counters, wall), balance_limits=limits)
    )
    assert "It agrees with the verdict (rollout)." in page and "differs" not in page


def test_a_zero_move_next_to_a_waiting_side_says_why():
    from rlhf_exporter.diagnosis.balance import Balance
    from rlhf_exporter.view.pages import balance_words

    b = Balance("trainer_starved", 0.5, 0.45, 0.43, 0.4, 5000.0, 4600.0, 4.0, 4.0, 0)
    words = unescape(balance_words(b, "update", "the 63 min"))
    assert "keep the split (no GPU to move): each side's share of the busy" in words


def test_the_gpu_picture_draws_each_role_once():
    counters, _ = _windows(0.5)
    svg = draw.gpu_time(counters)
    assert [m for m in re.findall(r'class="axis">(\w+)</text>', svg)] == ["rollout", "trainer"]
    assert draw.gpu_time({}).startswith('<p class="empty">')


def test_steps_before_the_baseline_are_warming_up_not_steady():
    three = fed([(REGIMES["balanced"], 3)])
    assert three["change"] == "steady" and not three["baseline_ready"]  # the JSON's value stays
    for page in map(
        unescape, (job_page(three, [], FACTS, LINKS), index_page([three], [], FACTS, LINKS))
    ):
        assert "warming up: no baseline yet: 3 of 5 steps" in page
        assert "no regression or workload shift against the job's own baseline" not in page
    twelve = fed([(REGIMES["balanced"], 12)])
    assert twelve["baseline_ready"]
    page = unescape(job_page(twelve, [], FACTS, LINKS))
    assert "warming up" not in page
    assert "nothing: no regression or workload shift against the job's own baseline" in page


def _warm_steps(page: str, job: dict) -> list[int]:
    """The steps the step chart draws in a warm-up band."""
    history = job["history"]
    bands = re.findall(r'<rect class="warm-up" data-first="(\d+)" data-last="(\d+)"', page)
    return [history[i].step for a, z in bands for i in range(int(a), int(z) + 1)]


def _unjudged(*plans) -> list[int]:
    """The steps the change module judged without a baseline, each plan a new run."""
    from rlhf_exporter.diagnosis import BatchDiagnoser

    recs = [Record(r["step"], r["data"]) for seed, p in enumerate(plans) for r in records(p, seed)]
    return [
        d.step
        for d in BatchDiagnoser(load_thresholds()).diagnose(recs)
        if d.change.baseline is None
    ]


def test_the_step_chart_marks_the_warm_up_steps_as_the_change_module_judged_them():
    """The job page's and `/`'s step chart draw a band behind the steps judged before their
    run had a baseline (so no change was judged), the same steps as the change module's."""
    balanced = REGIMES["balanced"]
    three = fed([(balanced, 3)])
    for page in (job_page(three, [], FACTS, LINKS), index_page([three], [], FACTS, LINKS)):
        assert _warm_steps(page, three) == [1, 2, 3] == _unjudged([(balanced, 3)])
        assert "Grey band: warm-up</span> (no baseline yet: no change judged)" in page
    twelve = fed([(balanced, 12)])
    assert _warm_steps(job_page(twelve, [], FACTS, LINKS), twelve) == [1, 2, 3, 4, 5]
    assert _unjudged([(balanced, 12)]) == [1, 2, 3, 4, 5]
    # a restart (a new run) warms up again; its steps start over at 1
    job = Job("p", "e", load_thresholds())
    plans = ([(balanced, 9)], [(balanced, 7)])
    job.feed(Record(r["step"], r["data"]) for seed, p in enumerate(plans) for r in records(p, seed))
    restarted = job.summary()
    assert _warm_steps(job_page(restarted, [], FACTS, LINKS), restarted) == _unjudged(*plans)
    assert _unjudged(*plans) == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    # a long run: its kept steps are all past its warm-up, nothing is marked
    long = fed([(balanced, 80)])
    page = job_page(long, [], FACTS, LINKS)
    assert _warm_steps(page, long) == [] and "Grey band" not in page


# -- the demo's story -------------------------------------------------------------------------


def test_the_demo_names_the_incident_now_playing_from_its_scenario_table(tmp_path):
    demo = DemoJob(tmp_path, th=load_thresholds())
    seen = []
    for _wait, _record in demo.timeline(0):
        if not seen or seen[-1] != demo.story():
            seen.append(demo.story())
    names = [p.name for p in demo.phases]
    assert len(seen) == len(names)
    for i, (story, name) in enumerate(zip(seen, names)):
        assert story.startswith(f"now playing {i + 1} of {len(names)}: {name} (next: ")
    assert seen[-1].endswith("(next: then the loop starts over as a new run)")
    facts = Facts("test", "", "demo", demo=True, story=demo.story())
    page = job_page(fed(DEMO_PLAN), [], facts, LINKS)
    assert f'<span class="story">Now playing {len(names)} of {len(names)}: {names[-1]}' in page
    assert '<span class="story">' in index_page([], [], facts, LINKS)


def test_the_demo_stall_passes_the_stall_limit_on_its_clock_within_five_minutes(tmp_path):
    """The `all` scenario played on a simulated wall clock as the demo's thread plays it:
    `/` says stalled only in the stall phase, within the demo's first five minutes, for
    long enough to be seen; no other pause (a long validation) reads as a stall."""
    th = load_thresholds()
    step = 0.7
    demo = DemoJob(tmp_path, step_seconds=step, th=th)
    job = Job(PROJECT, EXPERIMENT, th)
    facts = Facts.of("t", "", "demo", True, th.alerts, clock=(PROJECT, EXPERIMENT, demo.clock.at))
    t, stalled = 0.0, []  # (wall time, phase) while `/` says stalled
    entered: dict[str, float] = {}  # phase -> when `/` was first looked at in it
    for wait, record in demo.timeline(0):
        if record is not None:
            demo.schedule(t + wait * step, record, start=t)
        end = t + wait * step
        while t < end:  # look at `/` ten times a step while waiting
            t = min(end, t + step / 10)
            entered.setdefault(demo.phase.name, t)
            if facts.stalled(job.summary(), t) is not None:
                stalled.append((t, demo.phase.name))
        if record is not None:
            job.feed([Record(record["step"], record["data"])], now=t)
    assert stalled, "the demo's stall never passed the stall limit"
    # in the stall, and in the step's time after it (the job runs again, its record not yet
    # written)
    stall = "stall: the job stopped writing steps"
    assert all(name == stall or at <= entered[name] + step for at, name in stalled), stalled
    first, last = stalled[0][0], stalled[-1][0]
    assert first < 300.0 and last - first > 30.0, (first, last)
    # without the demo's clock (the wall's), its stall never reaches the limit: the clock is
    # what makes it one
    assert Facts.of("t", "", "demo", True, th.alerts).stalled(job.summary(), t) is None


# -- Chromium at 1280x800 -----------------------------------------------------------------------

FOLD = 800
TOPS = (  # what must be above the fold on both pages
    "const out = {};"
    "for (const [k, s] of [['answer', '.verdict-box.answer'], ['chart', 'svg.anatomy']]) {"
    "  const e = document.querySelector(s); out[k] = e ? e.getBoundingClientRect().top : -1; }"
    "document.body.setAttribute('data-tops', JSON.stringify(out));"
)


def _tops(html: str, tmp_path, name: str) -> dict[str, float]:
    import json

    page = tmp_path / f"{name}.html"
    page.write_text(html.replace("</body>", f"<script>{TOPS}</script></body>"))
    proc = browser._run(
        page.as_uri(), "--dump-dom", "--virtual-time-budget=2000", f"--window-size=1280,{FOLD}"
    )
    found = re.search(r"data-tops=\"([^\"]+)\"", proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.slow
@pytest.mark.skipif(not browser.available(), reason="chromium-headless-shell not installed")
def test_the_answer_and_the_step_chart_are_above_the_fold_in_chromium(tmp_path):
    """`serve --demo` in Chromium at 1280x800: on `/` and on the job's page the answer box
    and the step chart start above the fold; screenshots of both are kept."""
    import requests

    with Exporter(tmp_path / "serve", "--demo", defaults=False) as exp:
        path = f"/jobs/{PROJECT}/{EXPERIMENT}"
        exp.wait_for(lambda: 'svg class="anatomy"' in exp.get(path).text, 60, what="steps")
        for url, name in ((exp.url + "/", "index-1280x800"), (exp.url + path, "job-1280x800")):
            html = requests.get(url, timeout=10).text
            tops = _tops(html, tmp_path, name)
            assert 0 <= tops["answer"] < FOLD and 0 <= tops["chart"] < FOLD, (name, tops)
            shot = browser.screenshot(url, browser.SCREENSHOTS / f"{name}.png", 1280, FOLD)
            width, height, rows = browser.png_pixels(shot)
            assert (width, height) == (1280, FOLD)
            assert browser.colour_stats(rows)[0] > 100, f"{name}: the screenshot is blank"
