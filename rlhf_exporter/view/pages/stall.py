"""A job's state line (running, or stalled past the stall limit) and where a stalled job
hangs: `/`'s one line and the job view's panel of its stack round.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from html import escape
from typing import Any

from ...diagnosis.stacks import StackRound
from ...diagnosis.words import counted
from ...render.dashboards.style import BAD
from ...render.rules import runbook_url
from .common import STALL_ALERT, Facts, Links, _age, _duration, _tag

WHERE_ANCHOR = "Where-it-hangs"  # docs/runbooks.md's section on each `where`


def hangs_line(found: Any) -> str:
    """`/`'s one line under a stalled job: where it hangs (or why that is not known)."""
    if not isinstance(found, StackRound):
        return ""
    text = found.answer or found.why
    return f' <span class="hangs-line">where it hangs: {escape(text[:300])}</span>' if text else ""


def hangs_panel(found: Any, runbook: str) -> str:
    """The job view's "where it hangs": each role's wait, folded, then every stack."""
    if not isinstance(found, StackRound):
        return ""
    age = time.time() - found.taken_at
    head = (
        f'<div class="hangs"><b>Where it hangs</b> <span class="muted">(stacks taken '
        f"{_duration(max(0.0, age))} ago, {_duration(found.stalled_for)} into the stall, "
        f"{len(found.processes)} processes in {found.seconds:.1f} s; what each "
        f'<code>where</code> means: <a href="{escape(runbook)}">runbook</a>)</span>'
    )
    if found.why:
        head += f"<p>{escape(found.why)}</p>"
    rows = "".join(
        f"<tr><td>{escape(f.role)}</td><td>{_tag(f.where, BAD)}</td>"
        f"<td>{escape(f.text())}</td></tr>"
        for f in found.folds
    )
    table = f"<table><tr><th>role</th><th>where</th><th>processes</th></tr>{rows}</table>"
    stacks = "".join(
        f"<details><summary>{escape(p.role)}: {escape(p.label)} (pid {p.pid}): "
        + (escape(f"{p.wait.where} {p.wait.detail}") if p.wait else escape(f"unread: {p.error}"))
        + "</summary>"
        + (f"<pre>{escape(p.text)}</pre>" if p.text else _unread_words(p.message, found.why))
        + "</details>"
        for p in found.processes
    )
    return head + (table if found.folds else "") + stacks + "</div>"


def _unread_words(message: str, why: str) -> str:
    """A process's own words on why it has no stack, unless the panel said them already."""
    return f"<p>{escape(message)}</p>" if message and message not in why else ""


def state_html(
    job: Mapping[str, Any], stall: float | None, facts: Facts, links: Links, now: float
) -> str:
    """The job's state in one line: running (its step, its last step's age) or stalled
    (for how long, past which limit, and the runbook)."""
    step = escape(str(job.get("step")))
    if stall is not None:
        clock = " on the demo's clock" if facts.on_job_clock(job) else ""
        url = runbook_url(links.runbook_base, STALL_ALERT)
        return (
            f'<div class="state stalled"><b>State:</b> {_tag("stalled", BAD)} no new step for '
            f"{_duration(stall)}{clock} after step {step}: past the stall limit of "
            f'<a href="{escape(url)}">{STALL_ALERT}</a> (see its runbook).</div>'
        )
    state = escape(str(job.get("state") or "unknown"))
    return (
        f'<div class="state"><b>State:</b> {state}, step {step} (run '
        f"{escape(str(job.get('run')))}, {counted(int(job.get('steps') or 0), 'step')} seen), "
        f"last step {_age(now, job.get('last_step_time'))}</div>"
    )
