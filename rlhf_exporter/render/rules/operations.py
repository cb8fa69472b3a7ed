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
    Runbook,
    _num,
    _tq,
    duration,
    query_first,
)


def where_it_hangs() -> str:
    """Each role's wait from the job's last stack round (`rlhf_job_stalled_in`, issue 39), or
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
        runbook=Runbook(
            meaning=(
                f"No new step of the job arrived for longer than max({_num(f_)} x the job's "
                f"baseline step time, {stall_min}) plus the longest validation "
                "(`timing_s/testing`) and checkpoint (`timing_s/save_checkpoint`) seen in the "
                "run (`rlhf_between_steps_max_seconds`): verl runs them between two records, "
                f"outside the step. The rule reads the recording rule `{ctx.job_state}` "
                f'(`state="stalled"`: a running job whose `{ctx.stall_budget}` is above 1), '
                "the same the fleet dashboard shows. This is the main page: a hung collective (NCCL) blocks every "
                "rank silently. A finished or failed job never pages here "
                "([job states](job-states.md)): finished jobs raise nothing, failed ones "
                "[RLHFJobFailed](#rlhfjobfailed). The page does not resolve when the exporter "
                "goes blind (scrape failures, its target gone, the log unmounted): a job no "
                "target exports keeps the state it had when last seen, for "
                f"{ctx.a['blind_lookback']} (`alerts.blind_lookback`)."
            ),
            impact=(
                "A hung job holds all its GPUs and makes no progress; every hour costs its GPU "
                "count in GPU-hours, and the work since its last checkpoint is at risk."
            ),
            mitigate=[
                "Confirm it did not finish: its driver's last lines, and `ray job status` "
                "(or `rlhf_job_state`). A job that finished without saying so: put "
                "`<experiment>.finished` beside its log (fleet) or let its RayJob end.",
                "Read where it hangs: the `where_it_hangs` annotation, the exporter's job "
                "view (`/jobs/<project>/<experiment>`: each role's wait and every stack) or "
                "`GET /api/v1/jobs/<project>/<experiment>/stacks`; what each `where` means: "
                "[Where it hangs](#where-it-hangs). Without stacks (the panel says why), take "
                "one by hand: `ray stack`, or py-spy dump on the driver and one worker.",
                "Stop the job to free the GPUs (`ray job stop <id>` or delete the RayJob).",
                "Resubmit with `trainer.resume_mode=auto`: it restarts from the last "
                "checkpoint (`trainer.save_freq`).",
            ],
            escalate=(
                "The job's owning team (the `team` label) with the stack; the platform "
                "on-call if several jobs stall at once (a node, network or storage problem)."
            ),
            confirm=[
                'time() - rlhf_last_step_timestamp_seconds{project="P", experiment="E"}',
                'rlhf_baseline_step_duration_seconds{project="P", experiment="E"}',
                'rlhf_between_steps_max_seconds{project="P", experiment="E"}',
                f'{ctx.stall_budget}{{project="P", experiment="E"}}',
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
        runbook=Runbook(
            meaning=(
                "The job ended in failure, by the systems that know it "
                "([job states](job-states.md)): its Ray submission is FAILED, an actor of its "
                "submission died of WORKER_DIED, NODE_DIED, OUT_OF_MEMORY, "
                "CREATION_TASK_FAILED, RUNTIME_ENV_FAILED or UNSCHEDULABLE, or the submission "
                "was RUNNING when the Ray head restarted and the new head does not list it "
                "(LOST). It pages once and stays firing while the job is failed; "
                "RLHFJobStalled does not page for it, and RLHFRayActorsDied stays quiet for it."
            ),
            impact=(
                "The job makes no progress; its GPUs may still be held by surviving actors "
                "until the RayJob is deleted."
            ),
            mitigate=[
                "Read why: `ray job status <id>` / `ray job logs <id>` (the driver's "
                "traceback), `ray list actors --filter state=DEAD --detail` (death causes).",
                "Free the GPUs: delete the RayJob or `ray job stop <id>` if something still runs.",
                "Resubmit with `trainer.resume_mode=auto` once the cause is fixed (OOM: the "
                "memory keys of [RLHFRayActorsDied](#rlhfrayactorsdied)).",
            ],
            escalate=("The job's owning team; the platform on-call for NODE_DIED or a lost head."),
            confirm=[
                'rlhf_job_state{project="P", experiment="E"}',
                'rlhf_ray_jobs{status="FAILED"}',
                "increase(rlhf_ray_actor_failures_total[1h])",
            ],
            checks=["`ray job list` (the submission's status and message)"],
            verl_keys=["the driver's stderr: ActorDiedError, OOM, NCCL watchdog messages"],
            change=[
                "`trainer.resume_mode=auto` and `trainer.save_freq`: lose less work on the "
                "next failure."
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
        runbook=Runbook(
            meaning=(
                "A job that was running is exported by no target any more, and it did not "
                "finish or fail first (a finished job's last state is finished: no page). "
                "One page per job, with its identity: the exporter's own alerts "
                "(RLHFExporterDown, RLHFExporterCollectorDown) are warnings and carry no "
                "job. A job that was already stalled keeps its RLHFJobStalled page instead. "
                "In sidecar mode, a RayJob deleted as soon as it ends "
                "(`ttlSecondsAfterFinished: 0`) can vanish before its exporter saw the end: "
                "keep it a minute or more (the example keeps it an hour)."
            ),
            impact="The job runs unmonitored: a hang or crash now pages nobody.",
            mitigate=[
                'Find which: `up{instance="I"}` (0: the exporter is down), Prometheus\' '
                '`/targets` (target gone), `rlhf_exporter_collector_up{collector="verl"}` '
                "and `rlhf_exporter_collector_errors_total` (root_missing: the log volume).",
                "Bring the exporter or the volume back; check the job by hand meanwhile "
                "(`ray job status`, the tail of its log).",
            ],
            escalate="The platform on-call (Prometheus, storage or the cluster itself).",
            confirm=[
                f'last_over_time(rlhf_job_state{{project="P", experiment="E"}}[{blind}])',
                'up{instance="I"}',
            ],
            checks=["Prometheus' `/targets` page"],
            verl_keys=[],
            change=[
                "Mount the log volume read-only into the exporter; give the RayJob a "
                "`ttlSecondsAfterFinished` of at least a minute."
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
        runbook=Runbook(
            meaning=(
                "Ray reported actors of the cluster DEAD of a failure "
                "(`rlhf_ray_actor_failures_total`: WORKER_DIED, NODE_DIED, OUT_OF_MEMORY, "
                "CREATION_TASK_FAILED, RUNTIME_ENV_FAILED, UNSCHEDULABLE): a worker crashed, ran "
                "out of memory, lost its node, or an NCCL timeout ended it. A normal end "
                "(OWNER_DIED, OUT_OF_SCOPE, REF_DELETED, RAY_KILL by the driver at shutdown, "
                "an intended exit such as Ray's JobSupervisor's) is no failure and is only "
                "counted in `rlhf_ray_actor_deaths_total`. Quiet while the exporter's job is "
                "finished or failed: a failed job pages once, as RLHFJobFailed (the deaths of "
                "a submission tied to a job make it failed at once). It pages for deaths the "
                "exporter cannot tie to a job."
            ),
            impact="The job usually fails with it; its GPUs may sit idle until it is deleted.",
            mitigate=[
                "Confirm the job's state (`rlhf_job_state`, `ray job status`): a job that "
                "survived (actors with restarts left) needs no action now.",
                "Read the death causes: `ray list actors --filter state=DEAD --detail`.",
                "If the job is dead: stop it to free the GPUs; resubmit with "
                "`trainer.resume_mode=auto`.",
            ],
            escalate="The job's owning team; the platform on-call for NODE_DIED.",
            confirm=[
                f"increase(rlhf_ray_actor_failures_total[{win}])",
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
            "{{ $labels.instance }} watches: Ray cannot find the resources they ask for (longer "
            "than a cluster autoscaler takes to add a GPU node)."
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
                "no exporter at all is normal between jobs: the chart leaves this alert out in "
                "sidecar mode (`prometheusRule.alerts.RLHFExporterAbsent.enabled` turns it on), "
                "and a job whose exporter vanishes pages as RLHFJobUnwatched."
            ],
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
