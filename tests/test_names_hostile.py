"""Names and links from hostile input: a U+202E or a 200-character job name keeps the
view's table in its width and its other cells in order (Chromium measures it), `.`/`..`
never become a job whose link resolves elsewhere, and a `javascript:` runbook_url is
refused when the thresholds are read."""

from __future__ import annotations

import pytest

from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.diagnosis.thresholds import ThresholdsError
from rlhf_exporter.job.state import Job
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import ConfigError, load_thresholds
from rlhf_exporter.view.pages import Facts, Links, index_page
from tests.support import browser

TH = load_thresholds()
RLO = "\u202e"


def summary(project: str, experiment: str) -> dict:
    job = Job(project, experiment, TH)
    job.feed([Record(s, {"timing_s/step": 10.0, "timing_s/gen": 6.0}) for s in range(1, 6)], 1.0)
    return job.summary()


def page_of(*names: tuple[str, str]) -> str:
    facts = Facts("test", "http://127.0.0.1:9", "verl")
    return index_page(
        [summary(p, e) for p, e in names], [], facts, Links("https://example.org/r.md")
    )


def test_names_are_bidi_isolated_in_the_view():
    page = page_of((f"evil{RLO}gnp", "exp"))
    assert f"<bdi>evil{RLO}gnp</bdi> / <bdi>exp</bdi>" in page


def _measure(tmp_path, page: str, name: str) -> dict:
    """In Chromium at 1280 px: the table's width and where each row's cells start."""
    import json
    import re

    probe = (
        "<script>addEventListener('load',()=>{const t=document.querySelector('table');"
        "const rows=[...t.querySelectorAll('tr.job')].map(r=>[...r.cells].map(c=>"
        "Math.round(c.getBoundingClientRect().left)).join(','));"
        "document.title=JSON.stringify({table:t.scrollWidth,body:document.body.clientWidth,"
        "rows})})</script>"
    )
    f = tmp_path / name
    f.write_text(page.replace("</body>", probe + "</body>"))
    proc = browser._run(f.as_uri(), "--dump-dom", "--window-size=1280,900")
    assert proc.returncode == 0 and not browser.console_errors(proc.stderr), proc.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", proc.stdout).group(1)
    return json.loads(title.replace("&quot;", '"'))


@pytest.mark.skipif(not browser.available(), reason="chromium-headless-shell is not installed")
def test_long_and_right_to_left_names_keep_the_table_in_the_page(tmp_path):
    plain = _measure(tmp_path, page_of(("p", "a"), ("q", "b"), ("r", "c")), "plain.html")
    hostile = _measure(
        tmp_path, page_of(("p", "x" * 200), (f"{RLO}moc.live", "e" * 200), ("q", "ok")), "h.html"
    )
    assert hostile["table"] <= hostile["body"] + 1, hostile  # no 200-character line
    assert len(set(hostile["rows"])) == 1, hostile  # every row's cells start at one place
    assert plain["table"] <= plain["body"] + 1, plain


def test_dot_names_are_refused_by_push():
    src = PushSource(TH)
    for p, e in ((".", "e"), ("p", ".."), ("..", ".")):
        body = b'{"project": "%s", "experiment": "%s", "records": [{"step": 1, "data": {}}]}' % (
            p.encode(),
            e.encode(),
        )
        answer = src.handle(None, str(len(body)), lambda n, b=body: b, "127.0.0.1")
        assert answer.status == 400 and "'.' or '..'" in answer.body["error"]
    assert not src.snapshot().parts


def test_dot_named_files_are_not_watched(tmp_path):
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    for name in ("..jsonl", "...jsonl", "ok.jsonl"):
        write_jsonl(root / "p" / name, [(REGIMES["balanced"], 2)])
    src = VerlFileSource(TH, [root])
    snap = src.poll_once()
    assert {p[0].labels[:2] for p in snap.parts if p} == {("p", "ok")}
    assert snap.record_errors.get("bad_name") == 1


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "JavaScript:alert(1)//https://x",
        "data:text/html,<script>alert(1)</script>",
        'https://example.org/r.md" onmouseover="alert(1)',
        "https://exa mple.org/",
        "//example.org/r.md",
    ],
)
def test_a_runbook_url_that_is_not_http_is_refused(tmp_path, url):
    f = tmp_path / "th.yaml"
    import yaml

    f.write_text(yaml.safe_dump({"alerts": {"runbook_url": url}}))
    with pytest.raises((ConfigError, ThresholdsError)) as err:
        load_thresholds(f)
    assert "runbook_url" in str(err.value)


def test_an_https_runbook_url_is_accepted(tmp_path):
    f = tmp_path / "th.yaml"
    f.write_text("alerts:\n  runbook_url: https://wiki.example.org/rlhf/runbooks#x\n")
    assert load_thresholds(f).alerts["runbook_url"] == "https://wiki.example.org/rlhf/runbooks#x"


@pytest.mark.skipif(not browser.available(), reason="chromium-headless-shell is not installed")
def test_job_names_wrap_at_their_separators_not_character_by_character(tmp_path):
    """Issue 38: `dem o / grpo - simu lated`. In Chromium at a narrow width, beside the long
    change episodes of a regressed job, every line break in a name falls after a space or a
    separator, and no line of a name is a single character."""
    import json
    import re

    from rlhf_exporter.demo.simulator import DEMO_PLAN, records

    job = Job("demo", "grpo-simulated", TH)
    job.feed(list(records(DEMO_PLAN, seed=1)), 1.0)
    long = summary("my_team.research", "grpo_qwen2.5-7b_lr1e-6_kl0.001_seed42")
    facts = Facts("test", "http://127.0.0.1:9", "verl")
    page = index_page([job.summary(), long], [], facts, Links("https://example.org/r.md"))
    probe = (
        "<script>addEventListener('load',()=>{const out=[];"
        "for(const td of document.querySelectorAll('tr.job td.name')){"
        "const w=document.createTreeWalker(td,NodeFilter.SHOW_TEXT);let top=null,prev='',line='',lines=[];"
        "for(let n=w.nextNode();n;n=w.nextNode()){for(let i=0;i<n.length;i++){"
        "const r=document.createRange();r.setStart(n,i);r.setEnd(n,i+1);const b=r.getClientRects()[0];"
        "const c=n.data[i];if(b&&top!==null&&b.top>top+2){lines.push(line);out.push(prev+'|'+c);line='';}"
        "if(b){top=b.top;}line+=c;prev=c;}}lines.push(line);out.push('#'+JSON.stringify(lines));}"
        "document.title=JSON.stringify(out)})</script>"
    )
    f = tmp_path / "names.html"
    f.write_text(page.replace("</body>", probe + "</body>"))
    proc = browser._run(f.as_uri(), "--dump-dom", "--window-size=760,900")
    assert proc.returncode == 0 and not browser.console_errors(proc.stderr), proc.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", proc.stdout, re.S).group(1)
    found = json.loads(title.replace("&quot;", '"').replace("&amp;", "&"))
    breaks = [b for b in found if not b.startswith("#")]
    lines = [ln for b in found if b.startswith("#") for ln in json.loads(b[1:])]
    assert any(len(json.loads(b[1:])) > 1 for b in found if b.startswith("#")), found  # wraps
    for b in breaks:
        before, after = b.split("|")
        assert before in " _./-" or after == " ", (b, lines)
    assert all(len(ln.strip()) > 1 for ln in lines), lines
