"""Whole HTML pages: the sidecar's `/` and `/jobs/<project>/<experiment>`, and the
`diagnose --html` report. Self-contained (inline CSS and SVG, no script, nothing fetched),
so they work air-gapped in a pod and as a file attached to a bug report.

Inputs are plain values the callers already hold (job summaries with their `history` of
`StepPoint`s, source `Snapshot`s, run summaries), never live objects: a page is rendered
from immutable state and never waits on a source.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

from ..diagnosis.advice import CHANGE_MEANING, REASON_MEANING, VERDICT_MEANING, look_at
from ..diagnosis.change import STEADY
from ..diagnosis.episodes import balanced_look_at, episodes
from ..diagnosis.history import HISTORY_STEPS, StepPoint
from ..diagnosis.stacks import StackRound
from ..diagnosis.stall import StallLimit
from ..diagnosis.thresholds import seconds
from ..diagnosis.words import counted
from ..metrics.snapshot import Problem, Snapshot
from ..render.dashboards.style import BAD, CHANGE_COLOURS, VERDICT_COLOURS
from ..render.rules import BOUND_ALERTS, runbook_url
from . import draw

REGRESSION_ALERT = "RLHFJobRegression"
STALL_ALERT = "RLHFJobStalled"
DETAIL_JOBS = 3  # `/` draws each job in full when there are at most this many

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em 2em;
color:#222;max-width:1100px}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em}
h3{font-size:1em;margin:1em 0 .3em}
a{color:#1f60c4}table{border-collapse:collapse}
td,th{padding:.25em .7em;text-align:left;vertical-align:middle;border-bottom:1px solid #e4e4e4}
th{font-weight:600;font-size:.9em;color:#555}
.verdict-box{border-left:8px solid #888;padding:.5em 1em;background:#f7f7f7;margin:.6em 0}
.verdict-box .big{font-size:1.25em;font-weight:600}
.cannot-show{font-size:.9em;color:#555;margin:.3em 0 .8em}.cannot-show ul{margin:.2em 0}
.tag{display:inline-block;padding:0 .5em;border-radius:3px;color:#fff;font-size:.9em}
.legend{font-size:.85em;margin:.3em 0}.sw{margin-right:1em;white-space:nowrap}
.sw i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-1px}
svg text.axis{font-size:10px;fill:#666}svg .grid{stroke:#ddd}svg text.marker{font-size:12px}
svg .run{stroke:#444;stroke-dasharray:3 3}
.up{color:#2d7d2d;font-weight:600}.down{color:#c4162a;font-weight:600}.starting{color:#6b6b6b}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto}.muted{color:#777}
.empty{color:#777;font-style:italic}td.name{min-width:9em;max-width:24em;overflow-wrap:anywhere}
h1,h2{overflow-wrap:anywhere}.demo{background:#fff4d6;padding:.4em .8em}
.hangs{border-left:8px solid #c4162a;padding:.5em 1em;background:#fbf1f1;margin:.6em 0}
.hangs pre{max-height:24em;font-size:.85em}.hangs details{margin:.2em 0}
.problems{border-left:8px solid #e0a800;padding:.4em 1em;background:#fff8e1;margin:.6em 0}
.problems ul{margin:.2em 0;padding-left:1.2em}.problems li{margin:.3em 0;overflow-wrap:anywhere}
"""
# the sidecar's pages only (`/`, a job's page): the report keeps CSS above, byte for byte
SIDECAR_CSS = """
.answer .state{margin:.1em 0 .3em}.answer .since{color:#555}.answer .changed{margin:.2em 0}
.answer .engines{font-size:.9em;color:#444}.gpu-time .sw i{opacity:1}
.gpu-time details{font-size:.9em}.demo .story{font-weight:600}
"""


@dataclass(frozen=True)
class Links:
    """Where the page points: the runbooks (the thresholds' `alerts.runbook_url`, as the
    rules do) and the docs and dashboards next to them."""

    runbook_base: str
    docs_base: str | None = None  # None: next to the runbooks (repo_base + "docs/")
    dashboards_base: str | None = None  # None: repo_base + "grafana/"

    @classmethod
    def served(cls) -> Links:
        """The exporter's own copies (`serve` answers /runbooks, /docs/, /grafana/)."""
        return cls("/runbooks", "/docs/", "/docs/#dashboards")

    @classmethod
    def of(cls, runbook_url: str, fallback: Links | None = None) -> Links:
        """A user's runbook URL wins; an unset one, or the default's reserved `.invalid`
        host (RFC 2606: it never resolves), is `fallback` (default: the served copies)."""
        if clickable(runbook_url):
            return cls(runbook_url)
        return fallback if fallback is not None else cls.served()

    @property
    def repo_base(self) -> str:  # .../blob/main/docs/runbooks.md -> .../blob/main/
        head, sep, _ = self.runbook_base.rpartition("/docs/")
        return head + "/" if sep else self.runbook_base.rsplit("/", 1)[0] + "/"

    @property
    def docs(self) -> str:
        return self.docs_base if self.docs_base is not None else self.repo_base + "docs/"

    @property
    def dashboards(self) -> str:
        if self.dashboards_base is not None:
            return self.dashboards_base
        return self.repo_base + "grafana/"

    def runbook(self, verdict: str | None, change: str | None = None) -> tuple[str, str]:
        """(url, alert name) of the runbook section for a verdict (a regression first)."""
        if change == "regression":
            return runbook_url(self.runbook_base, REGRESSION_ALERT), REGRESSION_ALERT
        alert = BOUND_ALERTS.get(verdict or "")
        if alert is None:
            return self.runbook_base or "#runbooks", "runbooks"
        return runbook_url(self.runbook_base, alert), alert


def clickable(url: str) -> bool:
    """Whether a URL leads somewhere a person can open: set, and not a `.invalid` host."""
    host = (urlsplit(url).hostname or "") if url else ""
    return bool(host) and not (host == "invalid" or host.endswith(".invalid"))


def _page(title: str, body: str, refresh: int | None = None, css: str = CSS) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">{meta}'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{css}</style></head><body>{body}</body></html>\n"
    )


def _tag(text: str, colour: str) -> str:
    return f'<span class="tag" style="background:{colour}">{escape(text)}</span>'


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _age(now: float, t: float | None) -> str:
    return "never" if t is None else f"{_duration(now - t)} ago"


def engine_short(engine: Mapping[str, Any] | None) -> str:
    """The engines' evidence of the last measured rollout window, in a few words (for `/`)."""
    if not engine:
        return ""
    if not engine.get("usable"):
        return f"engines: not usable (coverage {engine.get('coverage', 0.0):.0%})"
    parts = [
        f"KV max {engine.get('kv_max', 0.0):.0%}",
        f"waiting {engine.get('waiting_mean', 0.0):.1f}",
        f"preemptions {engine.get('preemptions', 0.0):.0f}",
    ]
    if engine.get("imbalance") is not None:
        parts.append(f"imbalance {engine['imbalance']:.2f}")
    return "engines: " + ", ".join(parts)


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


W_WORDS = (
    "W is the step's rollout window: the seconds it spent generating its samples "
    "(verl's timing_s/gen), placed on the step's timeline"
)


def engine_box(engine: Mapping[str, Any] | None, verdict: str | None = None) -> str:
    """The evidence beside the rollout reason (docs/engines.md), for the job view: in full
    where it bears on the verdict (a rollout verdict), else folded (a click away)."""
    if not engine:
        return ""
    usable = engine.get("usable")
    imbalance = engine.get("imbalance")
    rows = [
        ("replicas read", f"{engine.get('replicas', 0)}"),
        ("coverage of W", f"{engine.get('coverage', 0.0):.0%}"),
        ("peak running requests", f"{engine.get('peak_running', 0.0):.0f}"),
        ("mean waiting requests", f"{engine.get('waiting_mean', 0.0):.1f}"),
        ("KV cache, highest", f"{engine.get('kv_max', 0.0):.0%}"),
        ("preemptions", f"{engine.get('preemptions', 0.0):.0f}"),
        ("token imbalance (max / mean)", "-" if imbalance is None else f"{imbalance:.2f}"),
        ("share of W: KV full, requests waiting", f"{engine.get('kv_pressure_share', 0.0):.0%}"),
        ("share of W: waiting with KV room", f"{engine.get('queueing_share', 0.0):.0%}"),
        ("share of W: long tail", f"{engine.get('long_tail_share', 0.0):.0%}"),
    ]
    note = (
        "usable: a rollout verdict's reason comes from these numbers when one holds"
        if usable
        else "not usable (a replica was not covered for enough of the window): the log's "
        "reasons apply"
    )
    bears = verdict == "rollout"
    head = (
        f"<b>Engine evidence</b> (step {escape(str(engine.get('step')))}, rollout window W; "
        f"{escape(note)}"
        + ("" if bears else f"; the verdict is {escape(str(verdict))}, not rollout: context only")
        + f'). <span class="muted w-words">{escape(W_WORDS)}.</span>'
    )
    table = (
        "<table>"
        + "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )
    if bears:
        return f'<div class="engine-box" data-bears="1">{head}{table}</div>'
    return f'<details class="engine-box" data-bears="0"><summary>{head}</summary>{table}</details>'


def _engine_note(job: Mapping[str, Any]) -> str:
    """The engines' few words, where they bear on the verdict (rollout) only."""
    text = engine_short(job.get("engine")) if job.get("verdict") == "rollout" else ""
    return f'<br><span class="muted">{escape(text)}</span>' if text else ""


def verdict_box(
    verdict: str | None,
    reason: str | None,
    change: str | None,
    regressed: str | None,
    links: Links,
    what: str = "Current verdict",
    advice: str | None = None,
    answer: Answer | None = None,
) -> str:
    """The verdict in words, what to look at next (`advice`, else the verdict's), and the
    runbook section's link; with an `answer` (the sidecar's pages), first the job's state,
    since when the verdict holds and what changed."""
    if verdict is None:
        state = answer.state if answer else ""
        return (
            f'<div class="verdict-box{" answer" if answer else ""}">{state}'
            '<span class="big">No classified step yet.</span></div>'
        )
    colour = VERDICT_COLOURS[verdict]
    head = f"{verdict}-bound" if verdict in BOUND_ALERTS or verdict == "checkpoint" else verdict
    since = f' <span class="since">{escape(answer.since)}</span>' if answer and answer.since else ""
    lines = [
        answer.state if answer else "",
        f'<span class="big verdict-text" data-verdict="{verdict}">{escape(what)}: '
        f"{escape(head)}{escape(': ' + reason) if reason else ''}</span>{since}",
        f"<div>{escape(VERDICT_MEANING.get(verdict, ''))}"
        + (f"; {escape(REASON_MEANING.get(reason, ''))}" if reason else "")
        + ".</div>",
    ]
    if answer is not None:
        lines.append(answer.changed)
    advice = advice or look_at(verdict, reason)
    if advice:
        lines.append(f'<div class="look-at"><b>Look at next:</b> {escape(advice)}</div>')
    if answer is not None:
        lines.append(answer.extra)
    elif change and change != STEADY:
        text = f"regression: {regressed}" if change == "regression" else "workload shift"
        lines.append(
            f"<div><b>Change:</b> {_tag(text, CHANGE_COLOURS[change])} "
            f"{escape(CHANGE_MEANING[change])}.</div>"
        )
    anchors = []
    if change == "regression":
        url, alert = links.runbook(verdict, change)
        anchors.append(f'<a class="runbook" href="{escape(url)}">Runbook: {escape(alert)}</a>')
    url, alert = links.runbook(verdict)
    label = f"Runbook: {alert}" if alert != "runbooks" else "Runbooks"
    anchors.append(f'<a class="runbook" href="{escape(url)}">{escape(label)}</a>')
    lines.append(f"<div>{' · '.join(anchors)}</div>")
    cls = "verdict-box answer" if answer else "verdict-box"
    return f'<div class="{cls}" style="border-color:{colour}">{"".join(lines)}</div>'


@dataclass(frozen=True)
class Answer:
    """The first screen's words around the verdict (the sidecar's pages): HTML, escaped."""

    state: str = ""  # the job's state: running, stalled, finished ...
    since: str = ""  # since when the verdict holds (plain text)
    changed: str = ""  # what changed: the change now, the latest episode, or warming up
    extra: str = ""  # after the advice: where the engines' evidence bears on the verdict


def since_text(points: Sequence[StepPoint]) -> str:
    """Since when the last step's verdict holds: its first step in the kept steps of this
    run, and the step time since."""
    if not points:
        return ""
    last, first = points[-1], len(points) - 1
    while first > 0 and points[first - 1].verdict == last.verdict:
        if points[first - 1].run != last.run:
            break
        first -= 1
    streak = points[first:]
    earlier = " or earlier" if first == 0 and len(points) >= HISTORY_STEPS else ""
    seconds = sum(p.step_seconds for p in streak)
    return (
        f"since step {streak[0].step}{earlier} ({counted(len(streak), 'step')}, "
        f"{_duration(seconds)} of step time)"
    )


def warming_up(job: Mapping[str, Any]) -> str:
    """ "warming up: no baseline yet: N of 5 steps" while the job's run has no baseline (its
    `change` says steady, but nothing was compared); "" once it has one."""
    if job.get("verdict") is None or job.get("baseline_ready", True):
        return ""
    have, need = int(job.get("baseline_steps") or 0), int(job.get("baseline_needed") or 5)
    if have >= need:
        return "warming up: the baseline is ready, the next step is the first compared"
    return f"warming up: no baseline yet: {have} of {need} steps"


def episode_words(e: Any) -> str:
    """A change episode in one line: what and where, then how it ended."""
    head = str(e.summary()).split("; ", 1)[0]
    end = {
        "recovered": f"recovered at step {e.ended_at}",
        "absorbed": f"not recovered: the new normal after step {e.ended_at}",
        "ongoing": "still going",
    }.get(e.ended, "")
    return f"{head}; {end}" if end else head


def changed_html(job: Mapping[str, Any]) -> str:
    """What changed: the change of the last step, warming up, the latest change episode."""
    parts = []
    change = job.get("change")
    if change in ("regression", "workload_shift"):
        text = f"regression: {job.get('regressed')}" if change == "regression" else "workload shift"
        parts.append(f"{_tag(text, CHANGE_COLOURS[change])} {escape(CHANGE_MEANING[change])}.")
    warm = warming_up(job)
    if warm:
        parts.append(f'<span class="warming">{escape(warm)}; nothing compared.</span>')
    found = job_episodes(job)
    if found:
        parts.append(f'<span class="episode">{escape(episode_words(found[-1]))}</span>')
    if not parts:
        parts.append("nothing: no regression or workload shift against the job's own baseline")
    return f'<div class="changed"><b>What changed:</b> {" ".join(parts)}</div>'


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


def answer_box(
    job: Mapping[str, Any], stall: float | None, facts: Facts, links: Links, now: float
) -> str:
    """The first screen: state, verdict and since when, what changed, what to do."""
    history = job.get("history") or ()
    verdict = job.get("verdict")
    extra = ""
    if verdict == "rollout" and job.get("engine"):
        extra = (
            f'<div class="engines">{escape(engine_short(job.get("engine")))} (in W, the '
            "step's rollout window: the seconds it spent generating its samples)</div>"
        )
    answer = Answer(
        state_html(job, stall, facts, links, now),
        since_text(history),
        changed_html(job),
        extra,
    )
    return verdict_box(
        verdict,
        job.get("reason"),
        job.get("change"),
        job.get("regressed"),
        links,
        advice=history_advice(history, verdict),
        answer=answer,
    )


def history_advice(points: Sequence[StepPoint], verdict: str | None) -> str | None:
    """For a balanced verdict: the largest windows of the drawn steps and what to check."""
    if verdict != "balanced" or not points:
        return None
    sums: dict[str, float] = {}
    for p in points:
        if p.step_seconds > 0:
            for g, sec in p.seconds().items():
                sums[g] = sums.get(g, 0.0) + sec / p.step_seconds
    return balanced_look_at({g: v / len(points) for g, v in sums.items()}, {}) or None


def episodes_list(items: Sequence[tuple[str, str]], which: str) -> str:
    """Change episodes as a person tells them: (summary, look at) each."""
    if not items:
        return ""
    lis = "".join(
        f'<li class="episode">{escape(text)}<br><span class="muted"><b>Look at:</b> '
        f"{escape(advice)}</span></li>"
        for text, advice in items
    )
    return f"<h3>Change episodes ({escape(which)})</h3><ol>{lis}</ol>"


def job_episodes(job: Mapping[str, Any]) -> Sequence[Any]:
    """A job summary's change episodes: its own (computed once per step by the job), else
    from its history."""
    found = job.get("episodes")
    return found if found is not None else episodes(job.get("history") or ())


def history_episodes(job: Mapping[str, Any]) -> str:
    """The change episodes of the job's kept steps (`/` and the job view)."""
    points = job.get("history") or ()
    return episodes_list(
        [(e.summary(), e.look_at()) for e in job_episodes(job)], f"last {len(points)} steps"
    )


def charts(points: Sequence[StepPoint], which: str = "last") -> str:
    """Step anatomy (with verdict strip and markers) and tokens per GPU-second."""
    if not points:
        return '<p class="empty">No classified step yet.</p>'
    return (
        f"<h3>Where the step time went, step by step ({which} {len(points)} steps)</h3>"
        + draw.legend()
        + draw.anatomy(points)
        + '<div class="legend muted">Under the bars: each step\'s verdict (hover for the '
        "reason). Above: "
        f'<span style="color:{CHANGE_COLOURS["regression"]}">▼ regression</span> (hover: '
        f'the group that costs more than its work explains), <span style="color:'
        f'{CHANGE_COLOURS["workload_shift"]}">◆ workload shift</span>. Dashed line: a new '
        "run. Hatched: time no verl timer measured.</div>"
        + "<h3>Tokens per GPU-second</h3>"
        + draw.line(points, lambda p: p.tokens_per_gpu_second, "tokens per GPU-second")
    )


def job_name(project: str, experiment: str) -> str:
    """A job's name as HTML: each part escaped and bidi-isolated (`<bdi>`), so a U+202E in
    one part cannot reorder the other or the text around it."""
    return f"<bdi>{_breakable(project)}</bdi> / <bdi>{_breakable(experiment)}</bdi>"


def _breakable(name: str) -> str:
    """A name escaped, with a line-break opportunity (`<wbr>`) after each `_`, `.` and `/`:
    a long name wraps at its separators, not character by character."""
    out = escape(name)
    for sep in ("_", ".", "/"):
        out = out.replace(sep, sep + "<wbr>")
    return out


def job_path(project: str, experiment: str) -> str:
    return f"/jobs/{quote(project, safe='')}/{quote(experiment, safe='')}"


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


def stalled_for(job: Mapping[str, Any], now: float, factor: float, minimum: float) -> float | None:
    """Seconds without a new step, when that is past the stall alert's limit (the rule's:
    diagnosis/stall.py, from the job's baseline step time and between-steps work); else None."""
    return StallLimit(factor, minimum).job_stalled_for(job, now)


# -- the sidecar's pages -----------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the page says about the exporter itself."""

    version: str
    base_url: str  # http://host:port as the browser reached it
    sources_text: str
    demo: bool = False
    stall_factor: float = 3.0  # the thresholds' alerts.stall_factor and stall_min (seconds)
    stall_min: float = 600.0
    story: str = ""  # the demo: the incident now playing (demo/job.py `DemoJob.story`)
    # the demo: its job (project, experiment) and its clock (wall -> job time, demo/clock.py),
    # on which its stall is judged: its records say ~95 s a step, written every 0.7 s
    clock: tuple[str, str, Callable[[float], float]] | None = None

    def on_job_clock(self, job: Mapping[str, Any]) -> bool:
        c = self.clock
        return c is not None and (job.get("project"), job.get("experiment")) == (c[0], c[1])

    def stalled(self, job: Mapping[str, Any], now: float) -> float | None:
        if self.clock is not None and self.on_job_clock(job):
            at, last = self.clock[2], job.get("last_step_time")
            return StallLimit(self.stall_factor, self.stall_min).stalled_for(
                None if last is None else at(last),
                at(now),
                job.get("baseline_step_seconds"),
                job.get("between_steps_max"),
            )
        return stalled_for(job, now, self.stall_factor, self.stall_min)

    @classmethod
    def of(
        cls,
        version: str,
        base_url: str,
        sources: str,
        demo: bool,
        alerts: Mapping[str, Any],
        story: str = "",
        clock: tuple[str, str, Callable[[float], float]] | None = None,
    ) -> Facts:
        """With the stall deadline of the thresholds' `alerts` section (as the rule has it)."""
        factor = float(alerts.get("stall_factor", cls.stall_factor))
        minimum = seconds(alerts.get("stall_min", cls.stall_min))
        return cls(version, base_url, sources, demo, factor, minimum, story, clock)


def source_state(s: Snapshot) -> str:
    """`up`, `starting` (its first poll has not ended) or `down`: as `/` and
    `/api/v1/status` say it."""
    if s.up:
        return "up"
    if s.last_success is None and not s.errors and not s.duration:
        return "starting"
    return "down"


def sources_table(snapshots: Iterable[Snapshot], now: float) -> str:
    """Each source: its state, last success, the errors that happened (never a zero count)."""
    rows = []
    for s in snapshots:
        state = source_state(s)
        # a source that is not polled (push) is up from the start and has no last success
        unpolled = state == "up" and s.last_success is None
        last = "not polled: accepting" if unpolled else _age(now, s.last_success)
        state = f'<span class="{state}">{state}</span>'
        last_error = getattr(s, "last_error", None)  # a message, when the source keeps one
        errors = ", ".join(f"{r} ×{n}" for r, n in sorted(s.errors.items()) if n)
        err = escape(str(last_error)) if last_error else escape(errors) or "none"
        rows.append(
            f'<tr class="source" data-up="{int(s.up)}"><td>{escape(s.collector)}</td>'
            f"<td>{state}</td><td>{last}</td><td>{err}</td>"
            f"<td>{s.duration * 1000:.0f} ms</td></tr>"
        )
    if not rows:
        return "<p>No source is configured.</p>"
    return (
        "<table><tr><th>source</th><th>state</th><th>last success</th>"
        "<th>errors (reason ×count)</th><th>last collection took</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def facts_section(facts: Facts, links: Links) -> str:
    host = facts.base_url.split("://", 1)[-1]
    snippet = (
        "scrape_configs:\n"
        "  - job_name: rlhf-exporter\n"
        "    scrape_interval: 15s\n"
        "    static_configs:\n"
        f"      - targets: ['{host}']"
    )
    docs, dashboards = links.docs, links.dashboards
    return (
        "<h2>This exporter</h2>"
        f"<p>rlhf-exporter {escape(facts.version)}. Scrape URL: "
        f'<a href="/metrics"><code>{escape(facts.base_url)}/metrics</code></a>. Sources: '
        f"{escape(facts.sources_text)}.</p>"
        "<p>Add it to Prometheus (<code>prometheus.yml</code>):</p>"
        f'<pre class="scrape">{escape(snippet)}</pre>'
        f'<p><a href="/metrics">/metrics</a> · <a href="/api/v1/jobs">/api/v1/jobs</a> · '
        f'<a href="/api/v1/status">/api/v1/status</a> · '
        f'<a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a> · '
        f'<a href="{escape(docs)}">docs</a> (metrics, decision table) · '
        f'<a href="{escape(links.runbook_base)}">runbooks</a> · '
        f'<a href="{escape(dashboards)}">Grafana dashboards (JSON)</a></p>'
    )


def _header(facts: Facts) -> str:
    demo = (
        '<p class="demo"><b>Demo data.</b> The job, its GPUs and its Ray actors are simulated '
        "(<code>serve --demo</code>); nothing here is a real cluster."
        + (
            f' <span class="story">{escape(facts.story[:1].upper() + facts.story[1:])}.</span>'
            if facts.story
            else ""
        )
        + "</p>"
        if facts.demo
        else ""
    )
    return (
        '<h1><a href="/" style="color:inherit;text-decoration:none">rlhf-exporter</a></h1>'
        "<p class=muted>Where the step time of verl RLHF jobs goes, why, and whether a "
        "slowdown is a workload shift or a regression.</p>" + demo
    )


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
        f"{job_name(job['project'], job['experiment'])}</a></td>"
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
                + charts(history)
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


def cannot_show(lines: Sequence[str]) -> str:
    """What this job's log cannot tell (verl's V1 trainer, fully-async's idle ratio): shown
    beside the verdict, so a missing measurement is never read as a measured one."""
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return (
        f'<div class="cannot-show"><b>What this job\'s log cannot show:</b><ul>{items}</ul></div>'
    )


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
    from ..diagnosis.balance import balance

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
        + charts(job.get("history") or ())
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
    from .docs_pages import runbook_sections

    wanted = sorted(set(re.findall(r'href="#(rlhf[a-z]+)"', html)))
    sections = runbook_sections(wanted)
    if not sections:
        return ""
    return (
        '<h2 id="runbooks">Runbooks (the sections this report links; all of them: '
        "<code>rlhf-exporter serve</code>, /runbooks)</h2>"
        f'<div class="runbooks">{sections}</div>'
    )
