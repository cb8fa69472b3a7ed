"""The `diagnose --html` report: per run of a log, its verdict mix, summary, every step
drawn and the runbook sections it links (embedded when no runbook URL is set).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from ...diagnosis.history import StepPoint
from .answer import cannot_show, charts, episodes_list, verdict_box
from .common import Links, _page


@dataclass
class ReportRun:
    summary: Mapping[str, Any]  # report.RunSummary.to_json()
    points: Sequence[StepPoint]
    width: int = 1  # steps per bar (history.StepBins): > 1 past MAX_DRAWN steps


@dataclass
class ReportFile:
    path: str
    records: int
    rejected: Mapping[str, int]
    runs: Sequence[ReportRun]
    cannot_show: Sequence[str] = ()  # advice.missing_evidence() of the file's records
    earlier: tuple[int, int] = (0, 0)  # runs, steps before the runs drawn (not drawn)


def _summary_html(s: Mapping[str, Any]) -> str:
    items = [
        f"{s['steps']} classified steps ({s['first_step']}-{s['last_step']})",
        "verdicts: " + ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()),
        "mean shares: "
        + ", ".join(
            f"{g} {x:.0%}"
            for g, x in sorted(s["mean_shares"].items(), key=lambda kv: -kv[1])
            if x >= 0.005
        ),
    ]
    for group, steps in s["regressions"].items():
        items.append(
            f"regression: {group} costs more than its work explains at steps {ranges(steps)}"
        )
    if s["workload_shifts"]:
        items.append(
            "workload shift (more work, not a regression) at steps " + ranges(s["workload_shifts"])
        )
    return "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def ranges(steps: Iterable[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out: list[list[int]] = []
    for st in steps:
        if out and st == out[-1][1] + 1:
            out[-1][1] = st
        else:
            out.append([st, st])
    return ", ".join(str(a) if a == z else f"{a}-{z}" for a, z in out)


def _run_html(run: ReportRun, links: Links) -> str:
    """One run of `diagnose --html`: its verdict, summary, bars, episodes and last step."""
    s = run.summary
    dom = s.get("dominant") or {}
    last = run.points[-1] if run.points else None
    # the headline names every regression episode, each with its steps
    regressed = ", ".join(
        f"{e['group']} (steps {e['first_step']}-{e['last_step']})"
        for e in s.get("episodes", ())
        if e["kind"] == "regression"
    ) or next(iter(s["regressions"]), None)
    return (
        f"<h3>Run {s['run']}</h3>"
        + (f'<p class="headline"><b>{escape(s["headline"])}</b></p>' if s.get("headline") else "")
        + episodes_list(
            [(e["summary"], e["look_at"]) for e in s.get("episodes", ())],
            "the whole run",
        )
        + verdict_box(
            dom.get("verdict"),
            dom.get("reason"),
            "regression" if regressed else None,
            regressed,
            links,
            what="Verdict mix, mostly",
            advice=dom.get("look_at"),
        )
        + _summary_html(s)
        + (
            f"<p class=muted>{s['steps']} steps drawn as {len(run.points)} bars, each "
            f"the mean of up to {run.width} consecutive steps (verdict: the most "
            "frequent; a marker where any step regressed or shifted).</p>"
            if run.width > 1
            else ""
        )
        + charts(run.points, "all")
        + (
            f"<p class=muted>Last step {last.step}: {escape(last.verdict)}"
            + (f" ({escape(last.reason)})" if last.reason else "")
            + "</p>"
            if last
            else ""
        )
    )


def report_page(files: Sequence[ReportFile], links: Links, version: str) -> str:
    """`diagnose --html`: per run, the dominant verdict, the summary and every step drawn."""
    parts = [
        "<h1>rlhf-exporter diagnose report</h1>"
        f"<p class=muted>rlhf-exporter {escape(version)}, made "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. For each run of a verl job's "
        "log: which window the training loop waited on, why, what to look at next, and where "
        "every step's time went (one bar per step; colours as in the Grafana dashboards).</p>"
        "<p class=muted>How to read it: verl's training loop waits on one window after "
        "another (rollout generation, log-prob inference, the optimizer update, the weight "
        "sync to the rollout engines, ...). The <b>verdict</b> of a step is the window it "
        "waited on longest (<i>balanced</i> when none clearly dominates); the <b>reason</b> "
        "is the evidence for why. A slower step is a <b>workload shift</b> when only its work "
        "grew (tokens, sequence length, the longest response), and a <b>regression</b> when a "
        "window costs more than its work explains, against the job's own recent steps.</p>"
    ]
    for f in files:
        parts.append(
            f"<h2>{escape(f.path)}</h2><p class=muted>{f.records} records"
            + (
                ", rejected lines: " + ", ".join(f"{n} {r}" for r, n in sorted(f.rejected.items()))
                if f.rejected
                else ""
            )
            + "</p>"
        )
        if not f.runs:
            parts.append('<p class="empty">No classified steps (no usable timing_s/step).</p>')
        if f.earlier[0]:
            parts.append(
                f"<p class=muted>{f.earlier[0]} earlier runs ({f.earlier[1]} steps) are not "
                f"drawn: the last {len(f.runs)} runs are.</p>"
            )
        parts += [_run_html(run, links) for run in f.runs]
        parts.append(cannot_show(f.cannot_show))  # after the answer, never above it
    if links.runbook_base:
        parts.append(
            f'<p class=muted>Runbooks: <a href="{escape(links.runbook_base)}">'
            f"{escape(links.runbook_base)}</a></p>"
        )
    else:  # no runbook URL of the user's: the sections this report links, embedded
        parts.append(embedded_runbooks("".join(parts)))
    return _page("rlhf-exporter diagnose report", "".join(parts))


def embedded_runbooks(html: str) -> str:
    """The runbook sections an HTML fragment links as `#<alert>`, for a report that must
    work offline (a file attached to a bug)."""
    from ..docs_pages import runbook_sections

    wanted = sorted(set(re.findall(r'href="#(rlhf[a-z]+)"', html)))
    sections = runbook_sections(wanted)
    if not sections:
        return ""
    return (
        '<h2 id="runbooks">Runbooks (the sections this report links; all of them: '
        "<code>rlhf-exporter serve</code>, /runbooks)</h2>"
        f'<div class="runbooks">{sections}</div>'
    )
