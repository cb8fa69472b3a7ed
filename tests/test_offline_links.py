"""Links that work offline (issue 38): `/`, the job view and the `diagnose --html` report
point at nothing `.invalid` by default; `serve` answers every link it puts on a page (the
runbooks, docs and dashboards shipped with the package), each `#section` exists; the report
embeds the runbook sections it links; a runbook URL a user sets still wins."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from rlhf_exporter.view.docs_pages import doc_names, served_link
from rlhf_exporter.view.markdown import anchor, to_html
from tests.support.procs import exporter_cmd
from tests.support.serve import Exporter

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "regression_after_slowdown_v1.jsonl"


def hrefs(page: str) -> list[str]:
    return re.findall(r'href="([^"]*)"', page)


def ids(page: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', page))


def _check_served(exp: Exporter, path: str, seen: set[str]) -> None:
    """Every link of the page at `path` answers 200 and lands on an existing section."""
    page = exp.get(path).text
    for href in hrefs(page):
        assert ".invalid" not in href, (path, href)
        if href.startswith("data:") or href.startswith("http"):
            continue
        target, _, frag = href.partition("#")
        target = target or path
        answer = exp.get(target)
        assert answer.status_code == 200, (path, href, answer.status_code)
        if frag:
            assert frag in ids(answer.text), (path, href)
        if target.startswith("/docs/") and target not in seen and len(seen) < 40:
            seen.add(target)
            _check_served(exp, target, seen)


def test_every_link_on_the_served_pages_leads_somewhere(tmp_path):
    with Exporter(tmp_path / "serve") as exp:
        (exp.verl_root / "grpo").mkdir()
        (exp.verl_root / "grpo" / "slow.jsonl").write_bytes(TRACE.read_bytes())
        exp.wait_for(lambda: exp.value("rlhf_step") is not None, 30, "the job")
        seen: set[str] = set()
        for path in ("/", "/jobs/grpo/slow", "/runbooks", "/docs/"):
            _check_served(exp, path, seen)
        assert "/docs/metrics" in seen and "/docs/runbooks" not in seen
        index = exp.get("/").text
        assert 'href="/runbooks' in index and 'href="/docs/"' in index
        assert 'id="rlhfjobregression"' in exp.get("/runbooks").text
        dashboard = exp.get("/grafana/rlhf-job.json")
        assert dashboard.status_code == 200 and dashboard.json()["uid"] == "rlhf-job"
        for bad in ("/docs/../pyproject", "/docs/nope", "/grafana/../x.json", "/docs/.md"):
            assert exp.get(bad).status_code == 404, bad


def test_a_runbook_url_the_user_sets_still_wins(tmp_path):
    th = tmp_path / "th.yaml"
    th.write_text(yaml.safe_dump({"alerts": {"runbook_url": "https://wiki.example.org/rb.md"}}))
    with Exporter(tmp_path / "serve", "--thresholds", str(th)) as exp:
        (exp.verl_root / "grpo").mkdir()
        (exp.verl_root / "grpo" / "slow.jsonl").write_bytes(TRACE.read_bytes())
        exp.wait_for(lambda: exp.value("rlhf_step") is not None, 30, "the job")
        page = exp.get("/").text
        assert 'href="https://wiki.example.org/rb.md' in page
        assert "/runbooks" not in page


def test_the_report_embeds_the_runbook_sections_it_links(tmp_path):
    out = tmp_path / "report.html"
    subprocess.run(
        exporter_cmd("diagnose", "--summary", str(TRACE), "--html", str(out)),
        capture_output=True,
        timeout=60,
        check=True,
    )
    page = out.read_text()
    assert ".invalid" not in page
    links = [h for h in hrefs(page) if not h.startswith("data:")]
    assert links and all(h.startswith("#") for h in links), links
    assert {h[1:] for h in links} <= ids(page), sorted({h[1:] for h in links} - ids(page))
    assert 'id="rlhfjobregression"' in page and "Runbooks (the sections this report links" in page


def test_every_doc_link_between_shipped_docs_is_served():
    """A doc's link to another doc goes to the served page, with an existing section."""
    for name in doc_names():
        from rlhf_exporter.view.docs_pages import markdown

        text = markdown(name)
        assert text is not None
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            got = served_link(target)
            if got is None or not got.startswith(("/docs/", "/runbooks")):
                continue
            page, _, frag = got.partition("#")
            doc = "runbooks" if page == "/runbooks" else page[len("/docs/") :]
            assert doc in doc_names(), (name, target)
            if frag:
                html = to_html(markdown(doc) or "")
                assert frag in ids(html), (name, target)


def test_headings_get_githubs_anchors():
    assert anchor("RLHFJobStalled") == "rlhfjobstalled"
    assert anchor("Bottleneck alerts: moved, costs, and the steady state") == (
        "bottleneck-alerts-moved-costs-and-the-steady-state"
    )
    html = to_html("# A <b>&</b>\n\n[x](javascript:alert(1)) `<i>`", lambda t: None)
    assert "<b>" not in html and "&lt;i&gt;" in html and "javascript" not in html
