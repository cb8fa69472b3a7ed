"""The on-call alerts: a stalled job, Ray actors, idle GPUs, and the exporter itself.

One function per alert, each returning the rule with its runbook beside it; `ALERTS` is the
group's order. To change an alert, edit its function only.
"""

from __future__ import annotations

from collections.abc import Callable

from ...diagnosis.thresholds import seconds
from .model import (
    JOB_KEY,
    JOB_MATCH,
    JOB_NAME,
    NODES,
    Alert,
    Context,
    Runbook,
    _num,
    _tq,
    duration,
)


def stalled(ctx: Context) -> Alert:
    factor = ctx.a["stall_factor"] * ctx.scale
    floor = ctx.secs("stall_min")
    limit = (
        f"clamp_min({_num(factor)} * rlhf_baseline_step_duration_seconds, {_num(floor)})\n"
        f"    or 0 * rlhf_last_step_timestamp_seconds + {_num(floor)}"
    )
    # the longest validation + checkpoint seen in the run runs between records, outside
    # timing_s/step: the limit grows by it, so what the run already did never pages
    between = "rlhf_between_steps_max_seconds or 0 * rlhf_last_step_timestamp_seconds"
    expr = (
        f"(time() - rlhf_last_step_timestamp_seconds)\n  > (\n    {limit}\n  )\n"
        f"  + ({between})\n"
        "and on (job, instance) up == 1\n"
        "unless on (project, experiment, job, instance) rlhf_job_finished == 1\n"
        "unless on (job, instance) (\n"
        "  count by (job, instance) (rlhf_ray_actors)\n"
        '  unless on (job, instance) (rlhf_ray_actors{state="ALIVE"} > 0)\n)'
    )
    stall_min, f_ = ctx.a["stall_min"], ctx.a["stall_factor"]
    return Alert(
        name="RLHFJobStalled",
        expr=expr,
        for_=ctx.dur("stall_for"),
        severity="critical",
        category="job",
        summary=f"{JOB_NAME} has made no step for {{{{ $value | humanizeDuration }}}}",
        description=(
            f"No new step of {JOB_NAME} for {{{{ $value | humanizeDuration }}}} (limit: "
            f"max({_num(f_)} x its baseline step time of "
            + _tq(
                f"rlhf_baseline_step_duration_seconds{{{JOB_MATCH}}}",
                "humanizeDuration",
                default="unknown",
            )
            + f", {stall_min}) + its longest validation and checkpoint seen) while its "
            "exporter {{ $labels.instance }} is up. "
            "An NCCL hang ends in ActorDiedError only after the NCCL timeout (verl 0.8+: "
            "PyTorch's default; verl 0.6-0.7: actor_rollout_ref.nccl_timeout, 600 s)."
        ),
        runbook=Runbook(
            meaning=(
                f"The exporter is up and still exports the job, but no new step arrived for longer "
                f"than max({_num(f_)} x the job's baseline step time, {stall_min}) plus the "
                "longest validation (`timing_s/testing`) and checkpoint "
                "(`timing_s/save_checkpoint`) seen in the run "
                "(`rlhf_between_steps_max_seconds`): verl runs them between two records, "
                "outside the step. This is the "
                "main page: a hung collective (NCCL) blocks every rank silently. A finished job "
                "does not page: `rlhf_job_finished` is 1 once its step reaches `--total-steps` "
                "(verl's `trainer.total_training_steps`) or it logs `rlhf_job_finished: 1`; a "
                "sidecar ends with its job; where the exporter watches Ray, a cluster with no "
                "ALIVE actor left means the job ended. Otherwise a shared exporter without Ray "
                "cannot tell a finished job from a hung one until `--job-expiry`: give it "
                "`--total-steps`, or silence the alert for the job."
            ),
            confirm=[
                'time() - rlhf_last_step_timestamp_seconds{project="P", experiment="E"}',
                'rlhf_baseline_step_duration_seconds{project="P", experiment="E"}',
                'rlhf_between_steps_max_seconds{project="P", experiment="E"}',
                'rlhf_ray_actors{state!="ALIVE"}',
            ],
            checks=[
                "`rlhf_gpu_utilization_ratio`: near 100% on every GPU of a hung NCCL "
                "collective, near 0% on an idle wait"
            ],
            verl_keys=[
                "the last line of the job's `file` logger JSONL (its `step`)",
                "the driver's stdout (TaskRunner) for the last timer printed",
            ],
            change=[
                "`ray stack` / py-spy dump on the driver and a worker: a frame in an NCCL "
                "collective or in `ray.get` tells which side waits.",
                "verl 0.6-0.7 only: `actor_rollout_ref.nccl_timeout` (seconds): lower it so "
                "a hung collective fails fast instead of holding the GPUs. verl 0.8+ reads no "
                "such key: its workers use PyTorch's default process-group timeout.",
                "`trainer.save_freq` and `trainer.resume_mode=auto`: lose less work when the job "
                "must be restarted.",
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
        expr=_counter_increase(ctx, "rlhf_ray_actor_deaths_total", win, "reason"),
        for_=ctx.dur("actors_dead_for"),
        severity="critical",
        category="ray",
        summary="{{ $value | humanize }} Ray actors of role {{ $labels.role }} died on {{ $labels.instance }}",
        description=(
            f"{{{{ $value | humanize }}}} actors of role {{{{ $labels.role }}}} became DEAD in the last {win} "
            "on the Ray cluster that {{ $labels.instance }} watches. Deaths by reason: "
            '{{ with query (printf `increase(rlhf_ray_actor_deaths_total{role="%s",instance="%s"}'
            f"[{win}])` $labels.role $labels.instance) }}}}{{{{ range . }}}}{{{{ .Labels.reason }}}}={{{{ .Value | humanize }}}} "
            "{{ end }}{{ else }}n/a{{ end }}."
        ),
        runbook=Runbook(
            meaning=(
                "Ray reported actors of the job's cluster as DEAD: a worker crashed, ran out of "
                "memory, lost its node, or an NCCL timeout ended it. A verl job usually fails "
                "with it."
            ),
            confirm=[
                f"increase(rlhf_ray_actor_deaths_total[{win}])",
                'rlhf_ray_actors{state="DEAD"}',
            ],
            checks=["`ray list actors --filter state=DEAD --detail` (their death_cause)"],
            verl_keys=["the driver's stderr: ActorDiedError, OOM, NCCL watchdog messages"],
            change=[
                "OOM: `actor_rollout_ref.rollout.gpu_memory_utilization`, "
                "`actor_rollout_ref.actor.fsdp_config.param_offload`, "
                "`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`.",
                "Resume: `trainer.resume_mode=auto` restarts from the last checkpoint "
                "(`trainer.save_freq`).",
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
        runbook=Runbook(
            meaning="Ray restarted actors (their `num_restarts` grew): they crashed and Ray brought them back.",
            confirm=[
                f"increase(rlhf_ray_actor_restarts_total[{win}])",
                'rlhf_ray_actors{state="RESTARTING"}',
            ],
            verl_keys=["the driver's and the worker's logs around the restart"],
            change=[
                "Find why the actor crashed (OOM, node loss): the same keys as "
                "[RLHFRayActorsDied](#rlhfrayactorsdied)."
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
            "{{ $labels.instance }} watches: Ray cannot find the resources they ask for."
        ),
        runbook=Runbook(
            meaning="Actors wait for resources (GPUs, memory, a placement group) that no node offers.",
            confirm=['rlhf_ray_actors{state="PENDING_CREATION"}'],
            checks=[
                "`ray status` (pending demands)",
                "`kubectl get pods` of the RayCluster (Pending worker pods)",
            ],
            verl_keys=[],
            change=[
                "`trainer.n_gpus_per_node` and `trainer.nnodes` must match the cluster's GPU nodes; "
                "`actor_rollout_ref.rollout.tensor_model_parallel_size` must divide them."
            ],
        ),
    )


def gpus_idle(ctx: Context) -> Alert:
    """The job's GPUs on every node (head and workers: GPU series carry their job, issue 23)
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
        runbook=Runbook(
            meaning=(
                f"The mean NVML busy ratio over {w} of every GPU serving the job (the head's and "
                f"each worker sidecar's, summed across nodes) is below {_num(ratio)} while the "
                "job makes steps: most of the step time is spent off these GPUs (CPU reward, "
                "tools, data movement, a remote rollout). A worker's GPUs count once its "
                "sidecar knows the job: from the head's windows (`gpuWindowsFrom`) or from "
                "`--project`/`--experiment`."
            ),
            confirm=[
                f'{ctx.gpus_busy}{{project="P", experiment="E"}}',
                f'{ctx.gpu_busy}{{project="P", experiment="E"}}',
                f'{ctx.verdicts}{{project="P", experiment="E"}}',
            ],
            verl_keys=["the job's `timing_s/*` (which window is long)"],
            change=[
                "Follow the bound alert of the job's verdict. Idle GPUs in a rollout-bound job: "
                "`actor_rollout_ref.rollout.agent.num_workers`, "
                "`actor_rollout_ref.rollout.multi_turn.max_parallel_calls`; in a driver-bound "
                "job: `trainer.balance_batch`."
            ],
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
        runbook=Runbook(
            meaning=(
                "A source of the exporter (verl files, push, Ray, NVML) fails. Its series are "
                "dropped, so alerts that need them (stalled, actors, GPUs) cannot fire. The "
                "verl collector is also down while a `--verl-root` is missing, not a "
                "directory or unreadable (reasons `root_missing`, `root_not_a_directory`, "
                "`root_permission_denied`: a log volume that is not mounted), and a source "
                "whose optional dependency is missing is down with `dependency_missing`. "
                "The pod stays ready: a down collector never takes it out of its Service."
            ),
            confirm=["rlhf_exporter_collector_up == 0", "rlhf_exporter_collector_errors_total"],
            checks=["the exporter's log: one line per problem"],
            verl_keys=[],
            change=[
                'verl: `trainer.logger` must include `"file"`, and `VERL_FILE_LOGGER_ROOT` must be '
                "the volume the exporter reads as `--verl-root`.",
                "ray: the exporter's Ray address and dashboard port; nvml: the NVIDIA driver "
                "mounted into the exporter's container.",
            ],
        ),
    )


def collector_stale(ctx: Context) -> Alert:
    after = ctx.secs("collector_stale_after")
    return Alert(
        name="RLHFExporterCollectorStale",
        expr=(
            f"time() - rlhf_exporter_collector_last_success_timestamp_seconds > {_num(after)}\n"
            "unless on (job, instance, collector) rlhf_exporter_collector_up == 0"
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
        runbook=Runbook(
            meaning=(
                "A collector that says it is up has not collected for a while: its poll thread "
                "stopped, or a poll hangs longer than the stale limit. A collector that reports "
                "a failure (up 0) is RLHFExporterCollectorDown's, so one problem pages once; "
                "one that never succeeded, or is not polled (push), has no last-success series."
            ),
            confirm=[
                "time() - rlhf_exporter_collector_last_success_timestamp_seconds",
                "rlhf_exporter_collector_duration_seconds",
            ],
            verl_keys=[],
            change=[
                "As for [RLHFExporterCollectorDown](#rlhfexportercollectordown); a poll that hangs "
                "(a slow Ray dashboard, a stuck NFS mount) shows here first."
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
        runbook=Runbook(
            meaning="A scrape target of the exporter is down: the process, its pod or the network.",
            confirm=[f"up{{{sel}}}"],
            checks=["Prometheus' `/targets` page: the scrape error"],
            verl_keys=[],
            change=[
                "The exporter's pod and log; `--listen` must be reachable from Prometheus "
                "(the default 127.0.0.1 is not: use the chart, which listens on the pod IP)."
            ],
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
        runbook=Runbook(
            meaning=(
                "Prometheus has no exporter target: the exporter is not deployed, or service "
                "discovery (ServiceMonitor, scrape config) does not find it, or the scrape job is "
                "named differently from `alerts.exporter_selector`."
            ),
            confirm=[f"up{{{sel}}}"],
            checks=["Prometheus' `/service-discovery` page"],
            verl_keys=[],
            change=[
                "The chart's ServiceMonitor labels must match the Prometheus' selector; set "
                "`alerts.exporter_selector` in the thresholds file to the scrape job's name and "
                "run `rlhf-exporter render rules`. Where exporters run only as sidecars of jobs, "
                "silence this alert while no job runs."
            ],
        ),
    )


ALERTS: tuple[Callable[[Context], Alert], ...] = (
    stalled,
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
