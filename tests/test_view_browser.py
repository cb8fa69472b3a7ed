"""The job view in headless Chromium: `/`, `/jobs/...` of a real `serve`, and a
`diagnose --html` report. Each page must load without console errors, draw one bar per step
and one segment per nonzero group in the dashboards' colours (read from the rendered
Grafana JSON, not from our code), show the verdict and its runbook link, and make a
screenshot that is not blank. Screenshots are kept in test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlhf_exporter.demo.simulator import DEMO_PLAN, REGIMES, encode, records, write_jsonl
from rlhf_exporter.diagnosis import BatchDiagnoser
from rlhf_exporter.diagnosis.history import HISTORY_STEPS
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import browser
from tests.support.browser import Elements
from tests.support.procs import exporter_cmd
from tests.support.segments import expected_segments
from tests.support.serve import Exporter

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not browser.available(), reason="chromium-headless-shell not installed"),
]
ROOT = Path(__file__).resolve().parents[1]
PLAN = [(REGIMES["other_untimed"], 20), *DEMO_PLAN]  # 72 steps, some with untimed time


def dashboard_colours() -> dict[str, str]:
    """group -> colour of the job dashboard's "Step time by decision-table group" panel."""
    doc = json.loads((ROOT / "grafana" / "rlhf-job.json").read_text())

    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    for panel in walk(doc["panels"]):
        if panel.get("title") == "Step time by decision-table group":
            out = {}
            for o in panel["fieldConfig"]["overrides"]:
                for prop in o["properties"]:
                    if prop["id"] == "color":
                        out[o["matcher"]["options"]] = prop["value"]["fixedColor"]
            return out
    raise AssertionError("the job dashboard has no step-time-by-group panel")


def offline(plan=PLAN, seed=1):
    data = b"".join(encode(r) for r in records(plan, seed))
    return list(BatchDiagnoser(load_thresholds()).diagnose(RecordReader().feed(data)))


def check_anatomy(dom: str, steps) -> Elements:
    el = Elements(dom)
    bars = el.find("g", "bar")
    assert [int(b["data-step"]) for b in bars] == [d.step for d in steps]
    segs: dict[int, list[str]] = {}
    colours = dashboard_colours()
    for tag, a, bar in el.items:
        if tag == "rect" and "seg" in a.get("class", "").split():
            group = a["data-group"]
            segs.setdefault(bar, []).append(group)
            want = colours["other" if group == "untimed" else group]
            assert a["data-colour"].lower() == want.lower()
            if group != "untimed":
                assert a["fill"].lower() == want.lower()
    assert [segs.get(i, []) for i in range(len(bars))] == [expected_segments(d) for d in steps]
    assert any("untimed" in s for s in segs.values())  # the remainder is drawn as such
    return el


def check_screenshot(url: str, name: str, height: int = 900) -> None:
    path = browser.screenshot(url, browser.SCREENSHOTS / name, 1000, height)
    width, got_height, rows = browser.png_pixels(path)
    assert (width, got_height) == (1000, height)
    variance, counts = browser.colour_stats(rows)
    assert variance > 100, f"{name}: the screenshot is (nearly) blank"
    colours = dashboard_colours()
    for group in ("rollout", "update", "sync"):  # big segments in every page's anatomy
        assert browser.near(counts, colours[group]) > 200, f"{name}: no {group} pixels"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view")
    with Exporter(tmp) as exp:
        d = exp.verl_root / "proj"
        d.mkdir()
        with open(d / "exp-a.jsonl", "wb") as f:
            for r in records(PLAN, seed=1):
                f.write(encode(r))
        with open(d / "exp-b.jsonl", "wb") as f:
            for r in records([(REGIMES["balanced"], 12)], seed=2):
                f.write(encode(r))
        exp.wait_for(lambda: len(exp.get("/api/v1/jobs").json()["jobs"]) == 2)
        exp.wait_for(
            lambda: (
                exp.value("rlhf_steps_total", project="proj", experiment="exp-a")
                == len(PLAN[0:0]) + sum(n for _, n in PLAN) + 1
            )
        )
        yield exp


def test_console_errors_are_seen(tmp_path):
    """The console check can fail: a page that logs an error is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><p>x</p><script>console.error('boom')</script>")
    _, errors = browser.dump_dom(page.as_uri())
    assert any("boom" in e for e in errors), errors


def test_job_page_in_chromium(served):
    url = f"{served.url}/jobs/proj/exp-a"
    dom, errors = browser.dump_dom(url)
    assert not errors, errors
    steps = offline()[-HISTORY_STEPS:]
    el = check_anatomy(dom, steps)
    last = steps[-1]
    text = " ".join(el.text)
    assert f"Current verdict: {last.verdict}-bound: {last.reason}" in text
    assert ".invalid" in load_thresholds().alerts["runbook_url"]  # the default: unset
    links = [a["href"] for a in el.find("a", "runbook")]
    assert links == [f"/runbooks#rlhfjob{last.verdict}bound"]  # served by the exporter itself
    check_screenshot(url, "job.png")


def test_index_in_chromium(served):
    dom, errors = browser.dump_dom(served.url + "/")
    assert not errors, errors
    el = Elements(dom)
    jobs = [a["href"] for a in el.find("a") if a.get("href", "").startswith("/jobs/")]
    assert jobs == ["/jobs/proj/exp-a", "/jobs/proj/exp-b"]  # bound before balanced
    assert len(el.find("svg", "spark")) == 2
    assert [r["data-up"] for r in el.find("tr", "source")] == ["1", "1"]  # verl, push
    # two jobs: `/` draws both in full too
    assert len(el.find("svg", "anatomy")) == 2
    text = " ".join(el.text)
    assert "scrape_configs:" in text and f"127.0.0.1:{served.port}" in text
    check_screenshot(served.url + "/", "index.png")


def test_diagnose_html_in_chromium(tmp_path):
    log = tmp_path / "run.jsonl"
    write_jsonl(log, PLAN, seed=1)
    out = tmp_path / "report.html"
    subprocess.run(
        exporter_cmd("diagnose", "--summary", str(log), "--html", str(out)),
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    dom, errors = browser.dump_dom(out.as_uri())
    assert not errors, errors
    el = check_anatomy(dom, offline())
    text = " ".join(el.text)
    assert "Verdict mix, mostly:" in text and "classified steps" in text
    assert next(a["href"] for a in el.find("a", "runbook")).endswith("#rlhfjobregression")
    # the report answers first (headline, episodes, verdict): its bars start lower
    check_screenshot(out.as_uri(), "diagnose-report.png", height=1600)


def test_demo_index_shows_no_collector_down_in_chromium(tmp_path):
    """`serve --demo` and nothing else: `/` under the demo banner lists only the collectors
    the demo uses, all up (no real Ray or NVML shown as down)."""
    with Exporter(tmp_path, "--demo", defaults=False) as exp:
        exp.wait_for(lambda: "grpo-simulated" in exp.get("/").text, what="the demo job")
        # each source's first poll ended (before it, a row says "starting", not "down")
        exp.wait_for(lambda: 'data-up="0"' not in exp.get("/").text, what="every source up")
        dom, errors = browser.dump_dom(exp.url + "/")
    assert not errors, errors
    el = Elements(dom)
    rows = el.find("tr", "source")
    assert rows and all(r["data-up"] == "1" for r in rows), rows
    text = " ".join(el.text)
    assert "Demo data" in text
    assert "ray" not in [t.strip() for t in el.text] and "nvml" not in [t.strip() for t in el.text]
