"""`/`: every job, who needs attention first, a few jobs' answers in full, the set-up
problems, the sources and the exporter's own facts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ...diagnosis.advice import look_at
from ...diagnosis.change import STEADY
from ...metrics.snapshot import Problem, Snapshot
from ...render.dashboards.style import BAD, CHANGE_COLOURS, VERDICT_COLOURS
from .. import draw
from .answer import (
    _engine_note,
    answer_box,
    charts,
    engine_box,
    history_advice,
    history_episodes,
    job_episodes,
    warm_up_points,
    warming_up,
)
from .common import (
    CSS,
    SIDECAR_CSS,
    Facts,
    Links,
    _age,
    _breakable,
    _duration,
    _header,
    _page,
    _tag,
    facts_section,
    job_name,
    job_path,
    sources_table,
)
from .stall import hangs_line

DETAIL_JOBS = 3  # `/` draws each job in full when there are at most this many


# -- who needs attention first -------------------------------------------------------------

_RANK_CHANGE = {"regression": 0, "workload_shift": 1}


def attention(job: Mapping[str, Any], stalled: bool = False) -> tuple[int, str, str]:
    """Sort key: stalled jobs first, then regressions, workload shifts, bound jobs, the rest."""
    verdict = job.get("verdict")
    rank = _RANK_CHANGE.get(job.get("change") or "")
    if stalled:
        rank = -1
    elif rank is None:
        rank = 4 if verdict is None else 3 if verdict in ("balanced", "unknown") else 2
    return (rank, job["project"], job["experiment"])


def problems_box(problems: Sequence[Problem]) -> str:
    """The set-up mistakes the sources see now (a verl root one level off, a missing root, a
    file in another format), each with what to change; nothing when there are none."""
    if not problems:
        return ""
    items = "".join(
        f'<li class="problem" data-kind="{escape(p.kind)}"><b>{escape(p.message)}</b>. '
        f'{escape(p.hint)}. <span class="muted">({escape(p.source)}: {escape(p.kind)})</span>'
        "</li>"
        for p in problems
    )
    return (
        '<div class="problems"><p><b>Set-up problems</b>: what keeps this exporter from '
        'seeing a job (also in its log, and in <a href="/api/v1/status">/api/v1/status</a>):'
        "</p>"
        f"<ul>{items}</ul></div>"
    )


def no_job_yet(collectors: set[str]) -> str:
    """What `/` says before any job, naming the setting that lets this exporter see one."""
    console = "console" in collectors
    seen_by = []
    if console:
        seen_by.append("every verl job on this Ray cluster, from the steps its trainer prints "
                       "(verl's <code>console</code> logger, on by default)")  # fmt: skip
    if "verl" in collectors:
        seen_by.append("verl's file logger under <code>--verl-root</code> "
                       "(<code>&lt;root&gt;/&lt;project&gt;/&lt;experiment&gt;.jsonl</code>)")  # fmt: skip
    if "push" in collectors:
        seen_by.append("records posted to <code>/api/v1/records</code>")
    add = []
    if not console:
        add.append("<code>--ray --console</code> (a job on Ray needs no change: the steps it "
                   "prints are read from Ray's state API)")  # fmt: skip
    if "verl" not in collectors:
        add.append("<code>--verl-root DIR</code> (jobs outside Ray, or with the console "
                   "logger off: <code>trainer.logger</code> with <code>file</code>)")  # fmt: skip
    said = "No verl job seen yet. "
    said += ("This exporter sees " + "; ".join(seen_by) + ". ") if seen_by else (
        "<strong>No source here can see a verl job.</strong> ")  # fmt: skip
    if add:
        said += "To see more, add " + " or ".join(add) + ". "
    return f'<p class="no-job">{said}Or try <code>rlhf-exporter serve --demo</code>.</p>'


def _framework_note(job: Mapping[str, Any]) -> str:
    """The framework whose output a job was read from, when not verl's (frameworks/)."""
    framework = job.get("framework")
    if not isinstance(framework, str) or framework == "verl":
        return ""
    return f' <span class="muted framework">{escape(framework)}</span>'


def _job_row(job: Mapping[str, Any], stall: float | None, links: Links, now: float) -> str:
    """`/`'s row of one job: verdict, change, sparkline, step, age, what to look at."""
    verdict, reason, change = job.get("verdict"), job.get("reason"), job.get("change")
    history = job.get("history") or ()
    tag = _tag(verdict, VERDICT_COLOURS[verdict]) if verdict else "-"
    change_text = ""
    if change and change != STEADY:
        text = f"regression: {job.get('regressed')}" if change == "regression" else "shift"
        change_text = _tag(text, CHANGE_COLOURS[change])
    elif warming_up(job):
        change_text = f'<span class="muted warming">{escape(warming_up(job))}</span>'
    if stall is not None:
        change_text = _tag(f"stalled {_duration(stall)}", BAD) + " " + change_text
        change_text += hangs_line(job.get("stacks"))
    url, _ = links.runbook(verdict, change)
    advice = ""
    if verdict:
        advice = look_at(verdict, reason) or history_advice(history, verdict) or ""
    found = job_episodes(job)
    if found:  # the latest change episode: its first clause (the whole one on hover)
        whole = found[-1].summary()
        latest = escape(whole.split("; ", 1)[0])
        change_text += f' <span class="muted episode" title="{escape(whole)}">{latest}</span>'
    return (
        f'<tr class="job"><td class="name"><a href="{job_path(job["project"], job["experiment"])}">'
        f"{job_name(job['project'], job['experiment'])}</a>{_framework_note(job)}</td>"
        f"<td>{tag} {escape(reason or '')}{_engine_note(job)}</td><td>{change_text}</td>"
        f"<td>{draw.sparkline(history)}</td>"
        f"<td>{escape(str(job.get('step')))}</td><td>{_age(now, job.get('last_step_time'))}</td>"
        f'<td>{_breakable(advice)} <a class="runbook" href="{escape(url)}">runbook</a></td></tr>'
    )


def index_page(
    jobs: Sequence[Mapping[str, Any]], snapshots: Sequence[Snapshot], facts: Facts, links: Links
) -> str:
    """`/`: a few jobs' answers first (state, verdict, since when, what changed, what to
    do, then their step chart), then every job compactly (sparklines), who needs attention
    first."""
    now = time.time()
    stalls = {id(j): facts.stalled(j, now) for j in jobs}
    ordered = sorted(jobs, key=lambda j: attention(j, stalls[id(j)] is not None))
    rows = [_job_row(job, stalls[id(job)], links, now) for job in ordered]
    table = (
        "<table><tr><th>job</th><th>verdict</th><th>change</th><th>step time and verdicts "
        "(last steps)</th><th>step</th><th>last step</th><th>look at next</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else no_job_yet({s.collector for s in snapshots})
    )
    detail = ""
    if 0 < len(jobs) <= DETAIL_JOBS:  # a few jobs: their answers first, no click needed
        for job in ordered:
            history = job.get("history") or ()
            detail += (
                f'<h2 class="job-answer">{job_name(job["project"], job["experiment"])}</h2>'
                + answer_box(job, stalls[id(job)], facts, links, now)
                + charts(history, warm=warm_up_points(job))
                + engine_box(job.get("engine"), job.get("verdict"))
                + history_episodes(job)
            )
    body = (
        _header(facts)
        + problems_box([p for s in snapshots for p in s.problems])
        + detail
        + f"<h2>{'All jobs' if detail else 'Jobs'} ({len(rows)})</h2>"
        + table
        + "<h2>Sources</h2>"
        + sources_table(snapshots, now)
        + facts_section(facts, links)
    )
    return _page("rlhf-exporter", body, refresh=10, css=CSS + SIDECAR_CSS)
