"""The first screen's answer (state, verdict and since when, what changed, what to do),
the step charts, the engines' evidence, the change episodes and what a log cannot show:
shared by `/`, a job's page and the `diagnose --html` report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from ...diagnosis.advice import CHANGE_MEANING, REASON_MEANING, VERDICT_MEANING, look_at
from ...diagnosis.change import STEADY
from ...diagnosis.episodes import balanced_look_at, episodes
from ...diagnosis.history import HISTORY_STEPS, StepPoint
from ...diagnosis.words import counted
from ...render.dashboards.style import CHANGE_COLOURS, VERDICT_COLOURS
from ...render.rules import BOUND_ALERTS
from .. import draw
from .common import Facts, Links, _duration, _tag
from .stall import state_html


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
    `change` says steady, but nothing was compared); "" once it has one; "no baseline" for
    a run whose steps carry no token count (it never gets one)."""
    if job.get("verdict") is None or job.get("baseline_ready", True):
        return ""
    have, need = int(job.get("baseline_steps") or 0), int(job.get("baseline_needed") or 5)
    if have == 0 and int(job.get("steps") or 0) >= need:
        return "no baseline: none of its steps logged a token count, so no change is judged"
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


def warm_up_points(job: Mapping[str, Any]) -> frozenset[int]:
    """The indices of the job's drawn steps judged before their run had a baseline (the
    change module's rule: a run's first `baseline_needed` usable steps, those with tokens and
    busy time, and any step between them), so nothing was compared. The current run's
    `baseline_ready` says it for its steps; an earlier run counts from its first step, unless
    the oldest drawn run may have begun before the kept steps (then it is not marked)."""
    points: Sequence[StepPoint] = job.get("history") or ()
    need = int(job.get("baseline_needed") or 5)
    complete = len(points) < HISTORY_STEPS  # no step of the oldest run was dropped
    out: set[int] = set()
    i = 0
    while i < len(points):
        run, start, usable = points[i].run, i, 0
        last_run = points[-1].run == run
        while i < len(points) and points[i].run == run:
            if last_run and not job.get("baseline_ready", True):
                out.add(i)  # the run has no baseline yet: every step of it so far
            elif usable < need and (start > 0 or complete):
                out.add(i)
            p = points[i]
            usable += p.tokens is not None and p.step_seconds - p.seconds()["checkpoint"] > 0
            i += 1
    return frozenset(out)


def charts(
    points: Sequence[StepPoint], which: str = "last", warm: frozenset[int] = frozenset()
) -> str:
    """Step anatomy (with verdict strip, markers and the warm-up steps `warm`, indices into
    `points`) and tokens per GPU-second."""
    if not points:
        return '<p class="empty">No classified step yet.</p>'
    return (
        f"<h3>Where the step time went, step by step ({which} {len(points)} steps)</h3>"
        + draw.legend()
        + draw.anatomy(points, warm=warm)
        + '<div class="legend muted">Under the bars: each step\'s verdict (hover for the '
        "reason). Above: "
        f'<span style="color:{CHANGE_COLOURS["regression"]}">▼ regression</span> (hover: '
        f'the group that costs more than its work explains), <span style="color:'
        f'{CHANGE_COLOURS["workload_shift"]}">◆ workload shift</span>. Dashed line: a new '
        "run. Hatched: time no verl timer measured."
        + (
            f' <span class="warm-legend" style="background:{draw.WARM_UP_FILL}">Grey band: '
            "warm-up</span> (no baseline yet: no change judged)."
            if warm
            else ""
        )
        + "</div>"
        + "<h3>Tokens per GPU-second</h3>"
        + draw.line(points, lambda p: p.tokens_per_gpu_second, "tokens per GPU-second")
    )


def cannot_show(lines: Sequence[str]) -> str:
    """What this job's log cannot tell (verl's V1 trainer, fully-async's idle ratio): shown
    beside the verdict, so a missing measurement is never read as a measured one."""
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return (
        f'<div class="cannot-show"><b>What this job\'s log cannot show:</b><ul>{items}</ul></div>'
    )
