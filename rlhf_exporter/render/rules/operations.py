"""The on-call alerts: a stalled job, Ray actors, idle GPUs, and the exporter itself.

One function per alert, each returning the rule with its runbook beside it; `ALERTS` is the
group's order. An alert's PromQL is its function's; its words (summary, description, runbook)
are its template, render/templates/runbooks/<Alert>.md.
"""

from __future__ import annotations

from collections.abc import Callable

from ...diagnosis.thresholds import seconds
from .model import (
    EXPORTER_KEY,
    JOB_KEY,
    JOB_MATCH,
    NODES,
    Alert,
    Context,
    _num,
    _tq,
    alert_prose,
    counts_by,
    duration,
    fragment,
    query_open,
    runbook,
)


def where_it_hangs() -> str:
    """Each role's wait from the job's last stack round (`rlhf_job_stalled_in`), or
    why there are none: the page fires the same either way."""
    return fragment(
        "RLHFJobStalled",
        "where it hangs",
        {
            "if_stalled_in": query_open(
                f"max by (role, where) (rlhf_job_stalled_in{{{JOB_MATCH}}})"
            ),
            "if_unread": query_open(f"max by (reason) (rlhf_job_stacks_unread{{{JOB_MATCH}}})"),
        },
    )


def stalled(ctx: Context) -> Alert:
    # one definition with the dashboards: the stall budget and the job state records
    # (recording.lifecycle_records); they read a job's last-seen series while no target
    # exports it, so the page survives scrape failures, a vanished target and an unmounted
    # log, and a finished or failed job is never stalled
    expr = (
        f"{ctx.stall_budget}\n"
        f'and on ({JOB_KEY}, job, instance) ({ctx.job_state}{{state="stalled"}} == 1)'
    )
    since = _tq(
        f"time() - max(last_over_time(rlhf_last_step_timestamp_seconds{{{JOB_MATCH}}}"
        f"[{ctx.blind}]))",
        "humanizeDuration",
        default=fragment("RLHFJobStalled", "no step seen"),
    )
    baseline = _tq(
        f"max(last_over_time(rlhf_baseline_step_duration_seconds{{{JOB_MATCH}}}[{ctx.blind}]))",
        "humanizeDuration",
        default="unknown",
    )
    values = {
        "since": since,
        "baseline": baseline,
        "where_it_hangs": where_it_hangs(),
        "stall_factor": _num(ctx.a["stall_factor"]),
        "stall_min": ctx.a["stall_min"],
        "job_state": ctx.job_state,
        "stall_budget": ctx.stall_budget,
        "blind_lookback": ctx.a["blind_lookback"],
    }
    text = alert_prose("RLHFJobStalled", values)
    return Alert(
        name="RLHFJobStalled",
        expr=expr,
        for_=ctx.dur("stall_for"),
        severity="critical",
        category="job",
        summary=text.summary,
        description=text.description,
        annotations={"where_it_hangs": where_it_hangs()},
        runbook=runbook(
            "RLHFJobStalled",
            [
                'time() - rlhf_last_step_timestamp_seconds{project="P", experiment="E"}',
                'rlhf_baseline_step_duration_seconds{project="P", experiment="E"}',
                'rlhf_between_steps_max_seconds{project="P", experiment="E"}',
                f'{ctx.stall_budget}{{project="P", experiment="E"}}',
            ],
            values,
        ),
    )


def failed(ctx: Context) -> Alert:
    text = alert_prose(
        "RLHFJobFailed",
        {
            "ago": _tq(
                "time() - max(last_over_time(rlhf_job_state_timestamp_seconds{"
                + JOB_MATCH
                + f"}}[{ctx.blind}]))",
                "humanizeDuration",
                default="a while",
            ),
            "statuses": counts_by('rlhf_ray_jobs{instance="%s"}', "status", "$labels.instance"),
        },
    )
    return Alert(
        name="RLHFJobFailed",
        expr=f'max without (state) ({ctx.job_state}{{state="failed"}} == 1)',
        for_=ctx.dur("failed_for"),
        severity="critical",
        category="job",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFJobFailed",
            [
                'rlhf_job_state{project="P", experiment="E"}',
                'rlhf_ray_jobs{status="FAILED"}',
                "increase(rlhf_ray_actor_failures_total[1h])",
            ],
        ),
    )


def unwatched(ctx: Context) -> Alert:
    blind = ctx.blind
    # the state it had when last seen was running (a blind job keeps its state code): a
    # stalled one keeps RLHFJobStalled, a finished one raises nothing
    expr = (
        f'max without (state) ({ctx.job_state}{{state="running"}} == 1)\n'
        f"unless on ({JOB_KEY}) rlhf_job_state"
    )
    last = f"time() - max(last_over_time(rlhf_last_step_timestamp_seconds{{{JOB_MATCH}}}[{blind}]))"
    text = alert_prose(
        "RLHFJobUnwatched",
        {"down_for": ctx.a["exporter_down_for"], "ago": _tq(last, "humanizeDuration")},
    )
    return Alert(
        name="RLHFJobUnwatched",
        expr=expr,
        for_=ctx.dur("exporter_down_for"),
        severity="critical",
        category="job",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFJobUnwatched",
            [
                f'last_over_time(rlhf_job_state{{project="P", experiment="E"}}[{blind}])',
                'up{instance="I"}',
            ],
        ),
    )


NEW_SERIES_LOOKBACK = "6h"
"""How far before the window a series must be absent to be new. A series back after a gap
(the exporter or its collector down, a missed scrape) is not new: `X unless X offset 15m`
alone read a 5-minute gap as a first event, and paged the old deaths again."""


def _counter_increase(ctx: Context, metric: str, window: str, without: str | None = None) -> str:
    """Increase over `window`, counting a series that appeared within it from 0 (a counter
    that starts at its first event would otherwise lose that event)."""
    lookback = duration(seconds(NEW_SERIES_LOOKBACK) * ctx.scale)
    before = f"last_over_time({metric}[{lookback}] offset {window})"
    inner = f"({metric} unless {before})\n  or increase({metric}[{window}])"
    if without:
        return f"sum without ({without}) (\n  {inner}\n) > 0"
    return f"(\n  {inner}\n) > 0"


def actors_died(ctx: Context) -> Alert:
    win = ctx.dur("actors_window")
    failures = f'increase(rlhf_ray_actor_failures_total{{role="%s",instance="%s"}}[{win}])'
    text = alert_prose(
        "RLHFRayActorsDied",
        {
            "window": win,
            "by_reason": counts_by(failures, "reason", "$labels.role $labels.instance"),
        },
    )
    return Alert(
        name="RLHFRayActorsDied",
        expr=(
            _counter_increase(ctx, "rlhf_ray_actor_failures_total", win, "reason")
            + f"\nunless on ({EXPORTER_KEY}) "
            + '(rlhf_job_state{state=~"finished|failed"} == 1)'
        ),
        for_=ctx.dur("actors_dead_for"),
        severity="critical",
        category="ray",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFRayActorsDied",
            [
                f"increase(rlhf_ray_actor_failures_total[{win}])",
                'rlhf_ray_actors{state="DEAD"}',
            ],
        ),
    )


def actors_restarting(ctx: Context) -> Alert:
    win = ctx.dur("actors_window")
    text = alert_prose("RLHFRayActorsRestarting", {"window": win})
    return Alert(
        name="RLHFRayActorsRestarting",
        expr=_counter_increase(ctx, "rlhf_ray_actor_restarts_total", win),
        for_=ctx.dur("actors_restarting_for"),
        severity="warning",
        category="ray",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFRayActorsRestarting",
            [
                f"increase(rlhf_ray_actor_restarts_total[{win}])",
                'rlhf_ray_actors{state="RESTARTING"}',
            ],
        ),
    )


def actors_pending(ctx: Context) -> Alert:
    text = alert_prose("RLHFRayActorsPending", {"pending_for": ctx.a["pending_for"]})
    return Alert(
        name="RLHFRayActorsPending",
        expr='rlhf_ray_actors{state="PENDING_CREATION"} > 0',
        for_=ctx.dur("pending_for"),
        severity="warning",
        category="ray",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFRayActorsPending",
            ['rlhf_ray_actors{state="PENDING_CREATION"}'],
        ),
    )


def gpus_idle(ctx: Context) -> Alert:
    """The job's GPUs on every node (head and workers: GPU series carry their job)
    against the job's own step rate from the head: joined `on` the job, never on a target."""
    w, ratio = ctx.window, ctx.a["gpu_idle_ratio"]
    nodes = _tq(f"count(count by ({NODES}) ({ctx.gpu_busy}{{{JOB_MATCH}}}))", 'printf "%.0f"')
    values = {"window": w, "ratio": _num(ratio), "percent": f"{ratio:.0%}", "nodes": nodes}
    text = alert_prose("RLHFGPUsIdleWhileStepping", values)
    return Alert(
        name="RLHFGPUsIdleWhileStepping",
        expr=(
            f"{ctx.gpus_busy} < {_num(ratio)}\n"
            f"and on ({JOB_KEY})\n  sum without ({NODES}) ({ctx.step_rate}) > 0"
        ),
        for_=ctx.dur("gpu_idle_for"),
        severity="warning",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPUsIdleWhileStepping",
            [
                f'{ctx.gpus_busy}{{project="P", experiment="E"}}',
                f'{ctx.gpu_busy}{{project="P", experiment="E"}}',
                f'{ctx.verdicts}{{project="P", experiment="E"}}',
            ],
            values,
        ),
    )


def collector_down(ctx: Context) -> Alert:
    errors = 'rlhf_exporter_collector_errors_total{collector="%s",instance="%s"}'
    text = alert_prose(
        "RLHFExporterCollectorDown",
        {
            "down_for": ctx.a["collector_down_for"],
            "by_reason": counts_by(
                errors, "reason", "$labels.collector $labels.instance", "none counted"
            ),
        },
    )
    return Alert(
        name="RLHFExporterCollectorDown",
        expr="rlhf_exporter_collector_up == 0",
        for_=ctx.dur("collector_down_for"),
        severity="warning",
        category="exporter",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFExporterCollectorDown",
            ["rlhf_exporter_collector_up == 0", "rlhf_exporter_collector_errors_total"],
        ),
    )


def collector_stale(ctx: Context) -> Alert:
    after = ctx.secs("collector_stale_after")
    text = alert_prose(
        "RLHFExporterCollectorStale", {"stale_after": ctx.a["collector_stale_after"]}
    )
    return Alert(
        name="RLHFExporterCollectorStale",
        expr=(
            f"time() - rlhf_exporter_collector_last_success_timestamp_seconds > {_num(after)}\n"
            f"unless on ({EXPORTER_KEY}, collector) rlhf_exporter_collector_up == 0"
        ),
        for_=ctx.dur("collector_down_for"),
        severity="warning",
        category="exporter",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFExporterCollectorStale",
            [
                "time() - rlhf_exporter_collector_last_success_timestamp_seconds",
                "rlhf_exporter_collector_duration_seconds",
            ],
        ),
    )


def exporter_down(ctx: Context) -> Alert:
    sel = ctx.a["exporter_selector"]
    text = alert_prose("RLHFExporterDown", {"down_for": ctx.a["exporter_down_for"]})
    return Alert(
        name="RLHFExporterDown",
        expr=f"up{{{sel}}} == 0",
        for_=ctx.dur("exporter_down_for"),
        severity="warning",
        category="exporter",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFExporterDown",
            [f"up{{{sel}}}"],
        ),
    )


def exporter_absent(ctx: Context) -> Alert:
    sel = ctx.a["exporter_selector"]
    text = alert_prose(
        "RLHFExporterAbsent", {"up": f"up{{{sel}}}", "down_for": ctx.a["exporter_down_for"]}
    )
    return Alert(
        name="RLHFExporterAbsent",
        expr=f"absent(up{{{sel}}})",
        for_=ctx.dur("exporter_down_for"),
        severity="warning",
        category="exporter",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFExporterAbsent",
            [f"up{{{sel}}}"],
        ),
    )


ALERTS: tuple[Callable[[Context], Alert], ...] = (
    stalled,
    failed,
    unwatched,
    actors_died,
    actors_restarting,
    actors_pending,
    gpus_idle,
    collector_down,
    collector_stale,
    exporter_down,
    exporter_absent,
)
"""The operations group, in file order."""


def alerts(ctx: Context) -> list[Alert]:
    return [make(ctx) for make in ALERTS]
