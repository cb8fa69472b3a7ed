"""A job's page (`/jobs/<project>/<experiment>`): the answer, where it hangs, the steps, the
engines' evidence, GPU time by step window and who waits on whom; and the pages for a
shipped doc and for a job that does not exist.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ...metrics.snapshot import Snapshot
from ...render.rules import runbook_url
from .. import draw
from .answer import answer_box, cannot_show, charts, engine_box, history_episodes, warm_up_points
from .common import (
    CSS,
    SIDECAR_CSS,
    Facts,
    Links,
    _duration,
    _header,
    _page,
    facts_section,
    job_name,
    sources_table,
)
from .stall import WHERE_ANCHOR, hangs_panel


def move_text(move: int) -> str:
    """The GPU-move estimate in words: never `+0 GPUs`."""
    if move == 0:
        return "keep the split (no GPU to move)"
    n = abs(move)
    gpus = f"{n} GPU{'s' if n > 1 else ''}"
    return f"move {gpus} to the rollout" if move > 0 else f"move {gpus} to the trainer"


AGREES = {  # who waits on whom, and the step verdicts it agrees with
    "trainer_starved": ("rollout",),  # the trainer waits for samples: rollout bounds it
    "rollout_overprovisioned": ("update", "logprob", "reward", "sync"),  # rollout waits
}


def balance_words(b: Any, verdict: str | None, range_words: str) -> str:
    """Who waits on whom in words: the idle shares, whether it agrees with the step verdict
    (or why it differs), and the GPU-move estimate with the reason it moves none."""
    said = b.verdict or "not enough GPU-seconds yet"
    out = (
        f"<b>Who waits on whom:</b> {escape(said)}: trainer idle {b.trainer_idle:.0%} "
        f"({b.starved_idle:.0%} waiting for samples, {b.trainer_idle_seconds:,.0f} "
        f"GPU-seconds), rollout idle {b.rollout_idle:.0%} ({b.overprovisioned_idle:.0%} while "
        f"the trainer works, {b.rollout_idle_seconds:,.0f} GPU-seconds)."
    )
    agrees = AGREES.get(b.verdict or "")
    if agrees is not None and verdict is not None:
        if verdict in agrees:
            out += f" It agrees with the verdict ({escape(verdict)})."
        else:
            out += (
                f' <span class="differs">It differs from the verdict ({escape(verdict)}): it '
                f"adds up {escape(range_words)}, the verdict judges the last step.</span>"
            )
    out += f" First-order estimate: {move_text(b.move_to_rollout)}"
    if b.move_to_rollout == 0 and agrees is not None:
        out += (
            ": each side's share of the busy GPU-seconds already matches its share of the "
            "GPUs, so the idle time is each side waiting on the other in turn, which moving "
            "GPUs does not remove"
        )
    return f"<p>{out} (assumptions in docs/gpu-windows.md).</p>"


def gpu_windows_section(windows: Any, limits: Mapping[str, Any], verdict: str | None = None) -> str:
    """GPU time by step window and role (docs/gpu-windows.md): a picture of the busy and
    idle GPU-seconds per GPU role and window group over the job's steps joined since the
    exporter started (the numbers a click away); for separate rollout and trainer GPUs, who
    waits on whom, beside the step verdict, and the GPU-move estimate."""
    if not windows:
        return ""
    from ...diagnosis.balance import balance

    counters, wall = windows
    range_words = f"the {_duration(wall)} of this job's steps joined since this exporter started"
    rows = "".join(
        f"<tr><td>{escape(group)}</td><td>{escape(role)}</td><td>{total:,.0f}</td>"
        f"<td>{busy / total:.0%}</td><td>{total - busy:,.0f}</td></tr>"
        for (group, role), (busy, total) in sorted(counters.items())
        if total > 0
    )
    out = (
        '<div class="gpu-time"><h2>GPU time by step window and role</h2>'
        f'<p class="muted range">Over {escape(range_words)}: one bar per GPU role, one '
        "segment per window group (its colour), solid where the GPUs were busy, pale where "
        "they idled.</p>"
        + draw.gpu_time(counters)
        + "<details><summary>The numbers</summary><table><tr><th>window group</th>"
        "<th>GPU role</th><th>GPU-seconds</th><th>busy</th>"
        f"<th>idle GPU-seconds</th></tr>{rows}</table></details>"
    )
    b = balance(counters, wall, limits) if limits else None
    if b is not None:
        out += balance_words(b, verdict, range_words)
    return out + "</div>"


def job_page(
    job: Mapping[str, Any],
    snapshots: Sequence[Snapshot],
    facts: Facts,
    links: Links,
    windows: Any = None,
    balance_limits: Mapping[str, Any] | None = None,
) -> str:
    """`/jobs/<project>/<experiment>`: the answer first (state, verdict, since when, what
    changed, what to do), then the step chart, the evidence and the sources."""
    now = time.time()
    name = f"{job['project']} / {job['experiment']}"
    stall = facts.stalled(job, now)
    body = (
        _header(facts)
        + f"<h2>{job_name(job['project'], job['experiment'])}</h2>"
        + answer_box(job, stall, facts, links, now)
        + hangs_panel(job.get("stacks"), runbook_url(links.runbook_base, WHERE_ANCHOR))
        + cannot_show(job.get("cannot_show") or ())
        + charts(job.get("history") or (), warm=warm_up_points(job))
        + engine_box(job.get("engine"), job.get("verdict"))
        + history_episodes(job)
        + gpu_windows_section(windows, balance_limits or {}, job.get("verdict"))
        + "<h2>Sources</h2>"
        + sources_table(snapshots, now)
        + facts_section(facts, links)
    )
    return _page(f"{name} - rlhf-exporter", body, refresh=10, css=CSS + SIDECAR_CSS)


def doc_page(html: str) -> str:
    """A shipped doc or runbook (`/runbooks`, `/docs/...`) in the view's style."""
    title = re.search(r"<h1[^>]*>(.*?)</h1>", html)
    name = re.sub(r"<[^>]+>", "", title.group(1)) if title else "rlhf-exporter docs"
    return _page(f"{name} - rlhf-exporter", html)


def not_found_page(project: str, experiment: str) -> str:
    return _page(
        "no such job",
        f'<h1>No job {job_name(project, experiment)}</h1><p><a href="/">All jobs</a></p>',
    )


# -- the `diagnose --html` report ----------------------------------------------------------
