"""The on-call alerts: a stalled job, Ray actors, idle GPUs, and the exporter itself.

One function per alert, each returning the rule with its runbook beside it; `ALERTS` is the
group's order. To change an alert, edit its function only.
"""

from __future__ import annotations

from collections.abc import Callable

from ...diagnosis.thresholds import seconds
from .model import (
    EXPORTER_KEY,
    JOB_KEY,
    JOB_MATCH,
    JOB_NAME,
    NODES,
    Alert,
    Context,
    _num,
    _tq,
    duration,
    query_first,
    runbook,
)


def where_it_hangs() -> str:
    """Each role's wait from the job's last stack round (`rlhf_job_stalled_in`), or
    why there are none: the page fires the same either way."""
    unread = query_first(
        f"max by (reason) (rlhf_job_stacks_unread{{{JOB_MATCH}}})",
        "no stacks ({{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s.Labels.reason }}"
        "{{ end }}): see the job view",
        default="no stacks yet (taken through Ray's dashboard once the job passes its stall "
        "limit: see the job view)",
    )
    return query_first(
        f"max by (role, where) (rlhf_job_stalled_in{{{JOB_MATCH}}})",
        "{{ range $i, $s := sortByLabel `role` . }}{{ if $i }}; {{ end }}{{ $s.Labels.role }}: "
        "{{ $s.Value }} in {{ $s.Labels.where }}{{ end }}",
        default=unread,
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
        default="longer than its stall limit",
    )
    stall_min, f_ = ctx.a["stall_min"], ctx.a["stall_factor"]
    return Alert(
        name="RLHFJobStalled",
        expr=expr,
        for_=ctx.dur("stall_for"),
        severity="critical",
        category="job",
        summary=f"{JOB_NAME} has made no step for {since}",
        description=(
            f"No new step of {JOB_NAME} for {since}: {{{{ $value | humanizePercentage }}}} "
            "of its stall limit (limit: "
            f"max({_num(f_)} x its baseline step time of "
            + _tq(
                f"max(last_over_time(rlhf_baseline_step_duration_seconds{{{JOB_MATCH}}}"
                f"[{ctx.blind}]))",
                "humanizeDuration",
                default="unknown",
            )
            + f", {stall_min}) + its longest validation and checkpoint seen), seen by "
            "{{ $labels.instance }} (last seen, if that exporter is down or gone). "
            "An NCCL hang ends in ActorDiedError only after the NCCL timeout (verl 0.8+: "
            "PyTorch's default; verl 0.6-0.7: actor_rollout_ref.nccl_timeout, 600 s). "
            "Where it hangs: " + where_it_hangs() + "."
        ),
        annotations={"where_it_hangs": where_it_hangs()},
        runbook=runbook(
            "RLHFJobStalled",
            [
                'time() - rlhf_last_step_timestamp_seconds{project="P", experiment="E"}',
                'rlhf_baseline_step_duration_seconds{project="P", experiment="E"}',
                'rlhf_between_steps_max_seconds{project="P", experiment="E"}',
                f'{ctx.stall_budget}{{project="P", experiment="E"}}',
            ],
            {
                "stall_factor": _num(f_),
                "stall_min": stall_min,
                "job_state": ctx.job_state,
                "stall_budget": ctx.stall_budget,
                "blind_lookback": ctx.a["blind_lookback"],
            },
        ),
    )


def failed(ctx: Context) -> Alert:
    return Alert(
        name="RLHFJobFailed",
        expr=f'max without (state) ({ctx.job_state}{{state="failed"}} == 1)',
        for_=ctx.dur("failed_for"),
        severity="critical",
        category="job",
        summary=f"{JOB_NAME} failed",
        description=(
            f"{JOB_NAME} failed "
            + _tq(
                "time() - max(last_over_time(rlhf_job_state_timestamp_seconds{"
                + JOB_MATCH
                + f"}}[{ctx.blind}]))",
                "humanizeDuration",
                default="a while",
            )
            + " ago, as {{ $labels.instance }} saw it: Ray's Jobs API said FAILED, one of its "
            "actors died of a failure (worker, node, OOM, creation), or its submission was "
            "lost in a Ray head restart. Ray job statuses there: "
            '{{ with query (printf `rlhf_ray_jobs{instance="%s"}` $labels.instance) }}'
            "{{ range . }}{{ .Labels.status }}={{ .Value | humanize }} {{ end }}"
            "{{ else }}n/a{{ end }}."
        ),
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

    return Alert(
        name="RLHFJobUnwatched",
        expr=expr,
        for_=ctx.dur("exporter_down_for"),
        severity="critical",
        category="job",
        summary=f"{JOB_NAME} is no longer watched: its exporter {{{{ $labels.instance }}}} went blind",
        description=(
            f"{JOB_NAME} was running when last seen, and no target has exported it for "
            f"{ctx.a['exporter_down_for']}: its exporter {{{{ $labels.instance }}}} is down, "
            "its target vanished (pod deleted), or its verl collector lost the log (an "
            "unmounted volume). A stall or failure of this job cannot page until it is back. "
            "Its last step: "
            + _tq(
                "time() - max(last_over_time(rlhf_last_step_timestamp_seconds{"
                + JOB_MATCH
                + f"}}[{blind}]))",
                "humanizeDuration",
            )
            + " ago."
        ),
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
        summary=(
            "{{ $value | humanize }} Ray actors of role {{ $labels.role }} failed on "
            "{{ $labels.instance }}"
        ),
        description=(
            f"{{{{ $value | humanize }}}} actors of role {{{{ $labels.role }}}} died of a failure in the last {win} "
            "on the Ray cluster that {{ $labels.instance }} watches. Failures by reason: "
            '{{ with query (printf `increase(rlhf_ray_actor_failures_total{role="%s",instance="%s"}'
            f"[{win}])` $labels.role $labels.instance) }}}}{{{{ range . }}}}{{{{ .Labels.reason }}}}={{{{ .Value | humanize }}}} "
            "{{ end }}{{ else }}n/a{{ end }}."
        ),
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
    return Alert(
        name="RLHFRayActorsRestarting",
        expr=_counter_increase(ctx, "rlhf_ray_actor_restarts_total", win),
        for_=ctx.dur("actors_restarting_for"),
        severity="warning",
        category="ray",
        summary="Ray actors of role {{ $labels.role }} restarted on {{ $labels.instance }}",
        description=(
            f"{{{{ $value | humanize }}}} restarts of Ray actors of role {{{{ $labels.role }}}} in "
            f"the last {win} on the cluster that {{{{ $labels.instance }}}} watches. A restarted "
            "verl worker loses its state: the step in flight is lost or repeated."
        ),
        runbook=runbook(
            "RLHFRayActorsRestarting",
            [
                f"increase(rlhf_ray_actor_restarts_total[{win}])",
                'rlhf_ray_actors{state="RESTARTING"}',
            ],
        ),
    )


def actors_pending(ctx: Context) -> Alert:
    return Alert(
        name="RLHFRayActorsPending",
        expr='rlhf_ray_actors{state="PENDING_CREATION"} > 0',
        for_=ctx.dur("pending_for"),
        severity="warning",
        category="ray",
        summary="{{ $value | humanize }} Ray actors of role {{ $labels.role }} cannot be placed",
        description=(
            f"{{{{ $value | humanize }}}} actors of role {{{{ $labels.role }}}} have been in "
            f"PENDING_CREATION for {ctx.a['pending_for']} on the cluster that "
            "{{ $labels.instance }} watches: Ray cannot find the resources they ask for (longer "
            "than a cluster autoscaler takes to add a GPU node)."
        ),
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
    return Alert(
        name="RLHFGPUsIdleWhileStepping",
        expr=(
            f"{ctx.gpus_busy} < {_num(ratio)}\n"
            f"and on ({JOB_KEY})\n  sum without ({NODES}) ({ctx.step_rate}) > 0"
        ),
        for_=ctx.dur("gpu_idle_for"),
        severity="warning",
        category="gpu",
        summary=f"{JOB_NAME}: GPUs busy {{{{ $value | humanizePercentage }}}} of the time while steps progress",
        description=(
            f"The GPUs serving {JOB_NAME} (on {nodes} node(s)) were busy "
            f"{{{{ $value | humanizePercentage }}}} of the last {w} on average (below "
            f"{ratio:.0%}) while the job kept making steps: the loop waits on something other "
            "than these GPUs."
        ),
        runbook=runbook(
            "RLHFGPUsIdleWhileStepping",
            [
                f'{ctx.gpus_busy}{{project="P", experiment="E"}}',
                f'{ctx.gpu_busy}{{project="P", experiment="E"}}',
                f'{ctx.verdicts}{{project="P", experiment="E"}}',
            ],
            {"window": w, "ratio": _num(ratio)},
        ),
    )


def collector_down(ctx: Context) -> Alert:
    return Alert(
        name="RLHFExporterCollectorDown",
        expr="rlhf_exporter_collector_up == 0",
        for_=ctx.dur("collector_down_for"),
        severity="warning",
        category="exporter",
        summary="Collector {{ $labels.collector }} of {{ $labels.instance }} is down",
        description=(
            "The {{ $labels.collector }} collector of the exporter {{ $labels.instance }} has failed "
            f"every collection for {ctx.a['collector_down_for']} (up {{{{ $value }}}}); its series are missing. "
            "Errors by reason: {{ with query (printf "
            '`rlhf_exporter_collector_errors_total{collector="%s",instance="%s"}` '
            "$labels.collector $labels.instance) }}{{ range . }}{{ .Labels.reason }}={{ .Value | humanize }} "
            "{{ end }}{{ else }}none counted{{ end }}."
        ),
        runbook=runbook(
            "RLHFExporterCollectorDown",
            ["rlhf_exporter_collector_up == 0", "rlhf_exporter_collector_errors_total"],
        ),
    )


def collector_stale(ctx: Context) -> Alert:
    after = ctx.secs("collector_stale_after")
    return Alert(
        name="RLHFExporterCollectorStale",
        expr=(
            f"time() - rlhf_exporter_collector_last_success_timestamp_seconds > {_num(after)}\n"
            f"unless on ({EXPORTER_KEY}, collector) rlhf_exporter_collector_up == 0"
        ),
        for_=ctx.dur("collector_down_for"),
        severity="warning",
        category="exporter",
        summary="Collector {{ $labels.collector }} of {{ $labels.instance }} last succeeded {{ $value | humanizeDuration }} ago",
        description=(
            "The {{ $labels.collector }} collector of {{ $labels.instance }} last succeeded "
            f"{{{{ $value | humanizeDuration }}}} ago (limit {ctx.a['collector_stale_after']}): "
            "what it exports is old."
        ),
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
    return Alert(
        name="RLHFExporterDown",
        expr=f"up{{{sel}}} == 0",
        for_=ctx.dur("exporter_down_for"),
        severity="warning",
        category="exporter",
        summary="Prometheus cannot scrape the exporter {{ $labels.instance }}",
        description=(
            "Prometheus has failed to scrape {{ $labels.instance }} (job {{ $labels.job }}) for "
            f"{ctx.a['exporter_down_for']} (up {{{{ $value }}}}): the jobs it watches are not monitored, and their "
            "stall alerts cannot fire."
        ),
        runbook=runbook(
            "RLHFExporterDown",
            [f"up{{{sel}}}"],
        ),
    )


def exporter_absent(ctx: Context) -> Alert:
    sel = ctx.a["exporter_selector"]
    return Alert(
        name="RLHFExporterAbsent",
        expr=f"absent(up{{{sel}}})",
        for_=ctx.dur("exporter_down_for"),
        severity="warning",
        category="exporter",
        summary="Prometheus scrapes no rlhf-exporter at all",
        description=(
            f"No target matching up{{{sel}}} has existed for {ctx.a['exporter_down_for']}: no verl "
            "job is monitored and no alert of this file can fire."
        ),
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
