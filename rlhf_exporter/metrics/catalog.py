"""Every metric the exporter serves, defined once.

The collector builds its families from here, `docs/metrics.md` is generated from here, and
the dashboard and rule tests check their PromQL against `NAMES`. Renaming a metric needs a
migration note in docs/metrics.md.

Naming follows Prometheus conventions: base units in names, `_total` for counters, identity
in `*_info` gauges, snake_case labels. `project`/`experiment` identify a verl job; cluster,
namespace and pod are target labels added by Prometheus, never by the exporter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GAUGE, COUNTER = "gauge", "counter"
JOB = ("project", "experiment")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # GAUGE or COUNTER
    help: str
    labels: tuple[str, ...] = ()
    section: str = ""

    @property
    def summary(self) -> str:
        """The HELP line /metrics serves: the help itself when short, else its first
        sentence (under HELP_MAX characters); docs/metrics.md keeps the whole help."""
        if len(self.help) < HELP_MAX:
            return self.help
        for stop in (". ", ": ", "; ", ", ", " ("):
            cut = self.help.rfind(stop, 0, HELP_MAX - 1)
            while cut > 40 and self.help.count("(", 0, cut) != self.help.count(")", 0, cut):
                cut = self.help.rfind(stop, 0, cut)  # never inside parentheses
            if cut > 40:
                return self.help[:cut].rstrip(",;:") + "."
        return self.help[: HELP_MAX - 2].rstrip() + "…"


HELP_MAX = 200  # characters of a HELP line at most (a tooltip, not a manual)


def _section(title: str, *metrics: Metric) -> list[Metric]:
    return [Metric(m.name, m.type, m.help, m.labels, title) for m in metrics]


def _job(name: str, type_: str, help_: str, *extra: str) -> Metric:
    return Metric(name, type_, help_, JOB + extra)


VERL = _section(
    "verl steps",
    _job("rlhf_step", GAUGE, "Last step number ingested."),
    _job(
        "rlhf_run",
        GAUGE,
        "0-based run index of the job: a lower step number (restart or resume) starts a new run.",
    ),
    _job("rlhf_steps_total", COUNTER, "Steps ingested, classified or not."),
    _job(
        "rlhf_job_framework_info",
        GAUGE,
        "1 for the RLHF framework whose output the job's records were read from (verl, "
        "openrlhf, areal, nemo_rl, slime, roll; docs/frameworks.md), detected from the output "
        "itself; absent until the job's first record.",
        "framework",
    ),
    _job(
        "rlhf_last_step_timestamp_seconds",
        GAUGE,
        "Unix time at which the last step's first record was read.",
    ),
    _job(
        "rlhf_between_steps_max_seconds",
        GAUGE,
        "Longest work seen in this run that runs between two steps' records, outside "
        "timing_s/step: validation (timing_s/testing) plus timing_s/save_checkpoint. The stall "
        "alert's limit grows by it, so a validation or checkpoint already seen never pages.",
    ),
    _job(
        "rlhf_job_finished",
        GAUGE,
        'Deprecated, removed in the next release: use rlhf_job_state{state="finished"}. '
        "1 while rlhf_job_state is finished: Ray's Jobs API says SUCCEEDED or STOPPED, or the "
        "job reached its total steps, logged rlhf_job_finished=1 or has a .finished file; a "
        "finished job is not a stalled one.",
    ),
    _job(
        "rlhf_job_state",
        GAUGE,
        "1 for the job's state as the exporter knows it (running, finished, failed, unknown), "
        "from Ray's Jobs API, its actors' death causes, and the job's declared end "
        "(docs/job-states.md). Prometheus adds stalled (project_experiment_state:"
        "rlhf_job_state:max).",
        "state",
    ),
    _job(
        "rlhf_job_state_timestamp_seconds",
        GAUGE,
        "Unix time at which the exporter first saw the job in its current rlhf_job_state.",
    ),
    _job("rlhf_step_duration_seconds", GAUGE, "Last classified step's timing_s/step."),
    _job("rlhf_step_seconds_total", COUNTER, "Sum of timing_s/step over classified steps."),
    _job(
        "rlhf_phase_duration_seconds",
        GAUGE,
        "Last classified step's timing_s/<phase>, by verl timer name, and the rest window of "
        "a split timer (gen_weight_load: gen - generate_sequences, verl 0.6's weight load).",
        "phase",
    ),
    _job(
        "rlhf_group_seconds_total",
        COUNTER,
        "Seconds per decision-table group, including other's untimed remainder.",
        "group",
    ),
    _job(
        "rlhf_group_duration_seconds",
        GAUGE,
        "Last classified step's seconds per decision-table group.",
        "group",
    ),
    _job(
        "rlhf_group_share_ratio",
        GAUGE,
        "Last classified step's share of step time per decision-table group.",
        "group",
    ),
    _job(
        "rlhf_untimed_duration_seconds",
        GAUGE,
        "Last classified step's untimed remainder R (driver time outside any timer).",
    ),
    _job("rlhf_untimed_seconds_total", COUNTER, "Sum of the untimed remainder R."),
    _job(
        "rlhf_bottleneck",
        GAUGE,
        "1 for the last classified step's verdict, 0 for the others.",
        "verdict",
    ),
    _job(
        "rlhf_bottleneck_reason",
        GAUGE,
        "1 for the last classified step's reason, 0 for the verdict's other reasons.",
        "verdict",
        "reason",
    ),
    _job("rlhf_bottleneck_steps_total", COUNTER, "Classified steps per verdict.", "verdict"),
    _job(
        "rlhf_bottleneck_reason_steps_total",
        COUNTER,
        "Classified steps per verdict and reason.",
        "verdict",
        "reason",
    ),
    _job(
        "rlhf_change",
        GAUGE,
        "1 for the last classified step's change against the job's baseline.",
        "kind",
    ),
    _job("rlhf_change_steps_total", COUNTER, "Classified steps per change kind.", "kind"),
    _job(
        "rlhf_regression_steps_total", COUNTER, "Steps diagnosed as a regression of group.", "group"
    ),
    _job(
        "rlhf_group_cost_seconds_per_token",
        GAUGE,
        "Last step's seconds per token (perf/total_num_tokens) per group.",
        "group",
    ),
    _job(
        "rlhf_baseline_group_cost_seconds_per_token",
        GAUGE,
        "Baseline (median of recent steps) seconds per token per group.",
        "group",
    ),
    _job(
        "rlhf_baseline_step_duration_seconds",
        GAUGE,
        "Baseline step time without checkpoint saves (median S').",
    ),
    _job(
        "rlhf_baseline_tokens_per_second",
        GAUGE,
        "Baseline tokens per second of step time (median K/S').",
    ),
    _job("rlhf_step_tokens", GAUGE, "Last step's perf/total_num_tokens."),
    _job("rlhf_tokens_total", COUNTER, "Sum of perf/total_num_tokens."),
    _job(
        "rlhf_throughput_tokens_per_gpu_second",
        GAUGE,
        "Last perf/throughput (tokens per GPU per second).",
    ),
    _job("rlhf_mfu_ratio", GAUGE, "Model FLOPs utilization: perf/mfu/<stage>.", "stage"),
    _job("rlhf_response_length_tokens", GAUGE, "response_length/<stat> of the last step.", "stat"),
    _job(
        "rlhf_agent_loop_seconds",
        GAUGE,
        "Agent-loop per-sample seconds: agent_loop/<part>/<stat>.",
        "part",
        "stat",
    ),
    _job(
        "rlhf_agent_loop_slowest_seconds",
        GAUGE,
        "The slowest sample's seconds per part: agent_loop/slowest/<part>.",
        "part",
    ),
    _job(
        "rlhf_agent_loop_slowest_response_length_tokens",
        GAUGE,
        "The slowest sample's response length.",
    ),
    _job(
        "rlhf_agent_loop_preempted_max",
        GAUGE,
        "agent_loop/num_preempted/max: most preemptions of one sample.",
    ),
    _job("rlhf_memory_max_allocated_bytes", GAUGE, "actor/perf/max_memory_allocated_gb, in bytes."),
    _job("rlhf_memory_max_reserved_bytes", GAUGE, "actor/perf/max_memory_reserved_gb, in bytes."),
    _job(
        "rlhf_response_aborted_ratio",
        GAUGE,
        "response/aborted_ratio of the last step (verl 0.9): the share of samples whose "
        "response is empty (aborted). Aborted samples pull response_length/mean down, so "
        "the long-tail fallback (response_length max / mean) can fire on them.",
    ),
    _job(
        "rlhf_response_length_non_aborted_tokens",
        GAUGE,
        "response_length_non_aborted/<stat> of the last step (verl 0.9): response length "
        "without the aborted samples. The decision table does not read it.",
        "stat",
    ),
    _job(
        "rlhf_fully_async_processing_seconds",
        GAUGE,
        "fully_async/processing_time/<stat> (fully-async mode): per-sample generation "
        "seconds of the samples the last record trained on (avg, max, min, tp50, tp95, "
        "tp99; verl averages the sub-steps' avg and percentiles, and keeps the max of max "
        "and min of min): the long-tail evidence fully-async logs instead of agent_loop/*.",
        "stat",
    ),
    _job(
        "rlhf_dynamic_resource_utilization_ratio",
        GAUGE,
        "dynamic_resource/<side>_resource_utilization (fully-async, verl 0.9): the share "
        "of its allocated time each side computed over the last sync cycle, as verl "
        "measures it (rollout: the rollouter's busy time; train: training compute / "
        "allocated time). Beside the GPU join's busy shares, which NVML measures.",
        "side",
    ),
    _job(
        "rlhf_fully_async_idle_ratio",
        GAUGE,
        "fully_async/<component>/idle_ratio (fully-async mode), as verl logs it; the "
        "rollouter's is the time since its last fully drained pause divided by the version "
        "window (verl #6693), not its idle share.",
        "component",
    ),
)

RAY = _section(
    "Ray actors",
    Metric("rlhf_ray_actors", GAUGE, "Ray actors per role and state.", ("role", "state")),
    Metric(
        "rlhf_ray_actors_by_class",
        GAUGE,
        "Ray actors per class and state (opt-in: ray.per_class).",
        ("class_name", "state"),
    ),
    Metric(
        "rlhf_ray_actor_restarts_total",
        COUNTER,
        "Actor restarts seen (growth of num_restarts).",
        ("role",),
    ),
    Metric(
        "rlhf_ray_actor_deaths_total",
        COUNTER,
        "Actors seen becoming DEAD, by death reason.",
        ("role", "reason"),
    ),
    Metric(
        "rlhf_ray_actor_failures_total",
        COUNTER,
        "Actors seen becoming DEAD for a failure (worker, node, OOM, creation or runtime-env "
        "failure), by reason; a normal end (OWNER_DIED, OUT_OF_SCOPE, REF_DELETED, RAY_KILL, "
        "an intended exit, Ray's own JobSupervisor) is not counted.",
        ("role", "reason"),
    ),
    Metric(
        "rlhf_ray_jobs",
        GAUGE,
        "Ray Jobs API entries (submissions and drivers) by status, as last listed.",
        ("status",),
    ),
    Metric(
        "rlhf_ray_cluster_info",
        GAUGE,
        "Identity of the Ray cluster the exporter reads.",
        ("ray_version", "session_name"),
    ),
)

STACKS = _section(
    "Stacks of a stalled job",
    _job(
        "rlhf_job_stalled_in",
        GAUGE,
        "Processes of a stalled job's role that wait in `where`, from the Python stacks of its "
        "last stack round (taken through Ray's dashboard when the job passes its stall limit, "
        "again every stacks_every while the stall lasts; gone once it steps). `where` is a "
        "fixed vocabulary (docs/runbooks.md#where-it-hangs): stopped, checkpoint_save, "
        "collective, "
        "engine_generate, engine_step, ray_get, ray_wait, network, io_read, io_write, lock, "
        "sleep, event_loop, no_task, running, unknown.",
        "role",
        "where",
    ),
    _job(
        "rlhf_job_stacks_unread",
        GAUGE,
        "Processes of a stalled job whose stack its last stack round could not read, by "
        "reason (profiling_disabled, no_endpoint, unauthorized, no_py_spy, no_permission, "
        "no_process, no_agent, timeout, unreachable, http_error, not_read: over "
        "stacks_max_processes, no_processes: Ray lists none for the job).",
        "reason",
    ),
    Metric(
        "rlhf_exporter_stack_reads_total",
        COUNTER,
        "Stack requests to Ray's dashboard by outcome (ok; stopped: py-spy found the process "
        "stopped; or why not as in "
        "rlhf_job_stacks_unread), and processes or jobs left unread by a bound (not_read, "
        "jobs_over_limit).",
        ("outcome",),
    ),
)


def _gpu(name: str, type_: str, help_: str, *extra: str) -> Metric:
    """A per-GPU series: the GPU, its extra labels, then the job its node serves (empty when
    the sidecar does not know it yet: docs/gpu-windows.md, "Which job a GPU serves")."""
    return Metric(name, type_, help_, ("gpu", "uuid", *extra) + JOB)


GPU_ROLE = "gpu_role"  # rollout, trainer, colocated or unknown (rlhf_exporter/diagnosis/gpujoin.py)

GPU = _section(
    "GPUs (NVML)",
    _gpu(
        "rlhf_gpu_info",
        GAUGE,
        "GPU identity; join with dcgm-exporter on uuid (docs/dcgm-exporter.md).",
        "name",
        "driver_version",
    ),
    _gpu("rlhf_gpu_utilization_ratio", GAUGE, "GPU utilization, last sample (0-1)."),
    _gpu(
        "rlhf_gpu_busy_seconds_total",
        COUNTER,
        "Integral of utilization over time; rate() is the exact busy ratio.",
    ),
    _gpu("rlhf_gpu_samples_total", COUNTER, "Utilization samples integrated."),
    _gpu("rlhf_gpu_memory_used_bytes", GAUGE, "GPU memory used."),
    _gpu("rlhf_gpu_memory_total_bytes", GAUGE, "GPU memory total."),
    _gpu("rlhf_gpu_power_watts", GAUGE, "GPU power draw."),
    _gpu("rlhf_gpu_temperature_celsius", GAUGE, "GPU temperature."),
    _gpu("rlhf_gpu_sm_clock_hertz", GAUGE, "GPU SM clock."),
    _gpu(
        "rlhf_gpu_role_memory_bytes",
        GAUGE,
        "GPU memory of processes matched to Ray actors of a role (unknown: unmatched).",
        "role",
    ),
    _gpu(
        "rlhf_gpu_errors_total",
        COUNTER,
        "NVML errors per GPU, by reason (gpu_is_lost, ...); a failing GPU's other series are "
        "dropped until it answers. gpu_role: the GPU's role when it last answered.",
        GPU_ROLE,
        "reason",
    ),
)

GPU_HEALTH = _section(
    "GPU health (NVML)",
    _gpu(
        "rlhf_gpu_xid_errors_total",
        COUNTER,
        "XID critical-error events (NVML events) by XID code; codes outside the documented "
        'set (docs/dcgm-exporter.md) are counted as xid="other".',
        GPU_ROLE,
        "xid",
    ),
    _gpu(
        "rlhf_gpu_ecc_errors_total",
        COUNTER,
        "ECC memory errors (nvmlDeviceGetTotalEccErrors): error corrected or uncorrected; "
        "scope volatile (since the driver loaded) or aggregate (the GPU's lifetime).",
        GPU_ROLE,
        "error",
        "scope",
    ),
    _gpu(
        "rlhf_gpu_remapped_rows",
        GAUGE,
        "Memory rows remapped (A100 and later), by cause: correctable or uncorrectable errors.",
        GPU_ROLE,
        "cause",
    ),
    _gpu(
        "rlhf_gpu_row_remap_pending",
        GAUGE,
        "1 when a row remap waits for the next GPU reset (A100 and later).",
        GPU_ROLE,
    ),
    _gpu(
        "rlhf_gpu_row_remap_failed",
        GAUGE,
        "1 when a row remap failed: the GPU needs service (A100 and later).",
        GPU_ROLE,
    ),
    _gpu(
        "rlhf_gpu_retired_pages",
        GAUGE,
        "Retired memory pages (GPUs before A100, which have no row remapping), by cause: "
        "multiple_single_bit or double_bit ECC errors.",
        GPU_ROLE,
        "cause",
    ),
    _gpu(
        "rlhf_gpu_retired_pages_pending",
        GAUGE,
        "1 when a page retirement waits for the next GPU reset (GPUs before A100).",
        GPU_ROLE,
    ),
    _gpu(
        "rlhf_gpu_throttle_seconds_total",
        COUNTER,
        "Seconds the GPU's clocks were held down, by reason (power_cap, sw_thermal, "
        "hw_thermal, hw_power_brake, hw_slowdown), sampled at each poll; rate() is the time "
        "share.",
        GPU_ROLE,
        "reason",
    ),
    _gpu(
        "rlhf_gpu_reading_unsupported",
        GAUGE,
        "1 for each reading this GPU does not support (NVML's NotSupported): normal on some "
        "GPUs, asked once, never retried.",
        "reading",
    ),
)

WINDOW_GPU = _section(
    "GPU time by step window",
    _job(
        "rlhf_window_gpu_busy_seconds_total",
        COUNTER,
        "GPU-seconds of utilization (NVML's timestamped samples) during the job's step windows "
        "of a decision-table group, on this node's GPUs of a role (rollout, trainer, "
        "colocated: both on one GPU; unknown: no process matched). Windows are rebuilt in "
        "time from each step's record (docs/gpu-windows.md).",
        "group",
        "gpu_role",
    ),
    _job(
        "rlhf_window_gpu_seconds_total",
        COUNTER,
        "GPU-seconds available during the job's step windows of a group, on this node's GPUs "
        "of a role. Minus rlhf_window_gpu_busy_seconds_total: the idle GPU-seconds, exactly.",
        "group",
        "gpu_role",
    ),
    _job(
        "rlhf_window_gpu_throttled_seconds_total",
        COUNTER,
        "GPU-seconds of the job's step windows of a group, on this node's GPUs of a role, "
        "during which the GPU's clocks were held down by heat or hardware (thermal or "
        "hardware slowdown, power brake; not the power cap), from NVML's throttle reasons "
        "read at each poll. Over rlhf_window_gpu_seconds_total: the throttled share.",
        "group",
        "gpu_role",
    ),
)

ENGINE = _section(
    "Engine evidence",
    _job(
        "rlhf_engine_evidence_usable",
        GAUGE,
        "1 when the last measured rollout window W had usable engine evidence (every replica "
        "alive in W covered by samples for at least engine.min_coverage of W), so a rollout "
        "verdict's reason came from the engines when one held; 0: the log's rules applied.",
    ),
    _job(
        "rlhf_engine_windows_total",
        COUNTER,
        "Rollout windows measured against the engines' samples, by whether the evidence was "
        "usable (true/false).",
        "usable",
    ),
    _job(
        "rlhf_engine_window_seconds",
        GAUGE,
        "Length of W, the last measured step's rollout window (the union of its rollout-group "
        "spans in the step's timeline).",
    ),
    _job(
        "rlhf_engine_coverage_ratio",
        GAUGE,
        "Share of W covered by samples, for the least-covered replica alive in W.",
    ),
    _job("rlhf_engine_replicas", GAUGE, "Rollout replicas that answered during W."),
    _job(
        "rlhf_engine_running_requests_peak",
        GAUGE,
        "Peak over W of the running requests summed over replicas.",
    ),
    _job(
        "rlhf_engine_running_requests_mean",
        GAUGE,
        "Time-weighted mean over W of the running requests summed over replicas.",
    ),
    _job(
        "rlhf_engine_waiting_requests_mean",
        GAUGE,
        "Time-weighted mean over W of the waiting (queued) requests summed over replicas.",
    ),
    _job(
        "rlhf_engine_kv_cache_usage_max_ratio",
        GAUGE,
        "Highest KV-cache usage (0-1) of any replica during W.",
    ),
    _job(
        "rlhf_engine_window_preemptions",
        GAUGE,
        "Preemptions (vLLM) or retractions (SGLang) during W, summed over replicas.",
    ),
    _job(
        "rlhf_engine_preemptions",
        GAUGE,
        "Deprecated, removed in the next release: use rlhf_engine_window_preemptions (the "
        "same value; in OpenMetrics this gauge's family name is rlhf_engine_preemptions_total's).",
    ),
    _job(
        "rlhf_engine_preemptions_total",
        COUNTER,
        "Preemptions or retractions during the measured rollout windows (usable ones only).",
    ),
    _job(
        "rlhf_engine_imbalance_ratio",
        GAUGE,
        "Generated tokens during W: the busiest replica's over the mean replica's (1: even).",
    ),
    _job(
        "rlhf_engine_window_share_ratio",
        GAUGE,
        "Time-weighted share of W where a condition held: kv_pressure (KV cache >= "
        "engine.kv_full with requests waiting), queueing (requests waiting, KV cache < "
        "engine.kv_free), long_tail (running <= engine.long_tail_running_ratio x the peak).",
        "condition",
    ),
    _job(
        "rlhf_engine_replica_generated_tokens",
        GAUGE,
        "Tokens each rollout replica generated during W (at most --engine-max-replicas).",
        "replica",
    ),
    _job(
        "rlhf_engine_replica_kv_cache_usage_max_ratio",
        GAUGE,
        "Each rollout replica's highest KV-cache usage (0-1) during W.",
        "replica",
    ),
    Metric(
        "rlhf_engine_up",
        GAUGE,
        "1 when the rollout replica's last /metrics read succeeded (its engine label: vllm, "
        "sglang; empty when it exported no engine series).",
        ("replica", "engine"),
    ),
)

EXPORTER = _section(
    "The exporter itself",
    Metric(
        "rlhf_exporter_collector_up",
        GAUGE,
        "1 when the collector's last collection succeeded; 0 when it failed, when it ran but "
        "found its input broken (a missing or unreadable --verl-root), or when the source "
        "cannot run here (dependency_missing).",
        ("collector",),
    ),
    Metric(
        "rlhf_exporter_collector_duration_seconds",
        GAUGE,
        "Duration of the collector's last collection.",
        ("collector",),
    ),
    Metric(
        "rlhf_exporter_collector_last_success_timestamp_seconds",
        GAUGE,
        "Unix time of the collector's last successful collection (polled collectors only: "
        "push is not polled and has none).",
        ("collector",),
    ),
    Metric(
        "rlhf_exporter_collector_errors_total",
        COUNTER,
        "Failed collection attempts, by reason: one per attempt (NVML retries every 30 s, not "
        "every poll); a broken input that persists (a missing verl root) counts once per "
        "occurrence.",
        ("collector", "reason"),
    ),
    Metric("rlhf_exporter_records_total", COUNTER, "Input records ingested.", ("collector",)),
    Metric(
        "rlhf_exporter_record_errors_total",
        COUNTER,
        "Input rejected or dropped (lines, records, keys, values, names), by reason.",
        ("collector", "reason"),
    ),
    Metric(
        "rlhf_exporter_samples_dropped_total",
        COUNTER,
        "Samples a source published that /metrics could not serve (unknown_metric, bad_labels, "
        "bad_value, render_failed); counted once per published version of a job's series.",
        ("collector", "reason"),
    ),
    Metric(
        "rlhf_exporter_auth_failures_total",
        COUNTER,
        "Requests refused for their bearer token, by endpoint (push, windows) and reason: "
        "unauthorized (missing or wrong), auth_throttled (over auth_fail_rate: not compared).",
        ("endpoint", "reason"),
    ),
    Metric("rlhf_exporter_jobs", GAUGE, "verl jobs currently exported.", ("collector",)),
    Metric("rlhf_exporter_build_info", GAUGE, "Exporter version.", ("version",)),
    Metric(
        "process_start_time_seconds",
        GAUGE,
        "Unix time the exporter process started (the standard process metric): rules tell an "
        "exporter restart, whose re-read of a log grows counters again, from new work.",
    ),
)

LABELS: Mapping[str, str] = {
    # label name -> its one meaning, the same in every family that has it (docs/metrics.md,
    # "Label names"; tests/test_catalog_names.py fails on a label name without an entry).
    # Where a meaning's values depend on the family (`reason`, `state`), the family's help
    # names them.
    "project": "verl's trainer.project_name: with `experiment`, the job",
    "experiment": "verl's trainer.experiment_name: with `project`, the job",
    "framework": "the RLHF framework a job's records were read from: verl, openrlhf, areal, "
    "nemo_rl, slime or roll",
    "phase": "a verl timer name, as in timing_s/<phase>",
    "group": "a decision-table window group (rollout, reward, logprob, update, sync, "
    "checkpoint, other): the unit step time is counted in",
    "verdict": "a step's bottleneck verdict: a group's name, or balanced or unknown",
    "reason": "why: the cause of what the family counts, from the vocabulary its help names "
    "(a verdict's reason, an error's, a death's, a throttle's, an unread stack's)",
    "kind": "a step's change against the job's baseline: steady, workload_shift, regression",
    "state": "the lifecycle state of what the family counts: a job's (running, finished, "
    "failed, unknown) or a Ray actor's, as Ray names it (ALIVE, DEAD, ...)",
    "status": "a Ray Jobs API entry's status, as Ray names it (PENDING, RUNNING, SUCCEEDED, ...)",
    "stage": "verl's MFU stage, as in perf/mfu/<stage>",
    "stat": "a statistic of a distribution verl logs: mean, max, min (fully-async: avg, tp50, "
    "tp95, tp99)",
    "part": "a part of an agent-loop sample: generate_sequences, tool_calls, compute_score",
    "side": "a side of fully-async training, as in dynamic_resource/<side>: rollout or train",
    "component": "a fully-async component, as in fully_async/<component>/idle_ratio",
    "role": "a Ray actor's role, from the class-to-role map (docs/gpu-roles.md)",
    "class_name": "a Ray actor's class name (opt-in: ray.per_class)",
    "ray_version": "the Ray version of the cluster read",
    "session_name": "the Ray session of the cluster read",
    "where": "where a stalled process waits, from its Python stack "
    "(docs/runbooks.md#where-it-hangs)",
    "outcome": "a stack request's outcome: ok, or why not",
    "gpu": "a GPU's NVML index on its node",
    "uuid": "a GPU's UUID (the join key with dcgm-exporter)",
    "name": "a GPU's product name, as NVML reports it",
    "driver_version": "the NVIDIA driver version, as NVML reports it",
    "gpu_role": "what a GPU serves: rollout, trainer, colocated (both) or unknown",
    "xid": "an XID error code (other: outside the documented set)",
    "error": "an ECC error counter's type: corrected or uncorrected",
    "scope": "an ECC counter's scope: volatile (since the driver loaded) or aggregate (lifetime)",
    "cause": "what made NVML repair GPU memory (a remapped row's or retired page's cause, as "
    "NVML names it)",
    "reading": "an NVML reading a GPU does not support",
    "usable": "whether a rollout window's engine evidence was usable: true or false",
    "condition": "a condition of the rollout engines during a window: kv_pressure, queueing, "
    "long_tail",
    "replica": "a rollout replica (one engine server), as the engine targets name it",
    "engine": "a rollout replica's engine: vllm, sglang, or empty when unknown",
    "collector": "one of the exporter's collectors (verl, push, ray, nvml, engines, ...)",
    "endpoint": "an exporter endpoint that takes a bearer token: push, windows",
    "version": "the exporter's version",
}

LEGACY_STEADY = "none"
"""The change kind `steady` (a step in line with the job's baseline) as it was named in the
previous release; served instead of `steady` only with the deprecated legacy_change_none setting,
never beside it (rlhf_change is one-hot: both would count a step twice). Removed in the
next release."""

CATALOG: tuple[Metric, ...] = tuple(
    VERL + RAY + STACKS + GPU + GPU_HEALTH + WINDOW_GPU + ENGINE + EXPORTER
)
BY_NAME: Mapping[str, Metric] = {m.name: m for m in CATALOG}
NAMES = frozenset(BY_NAME)

KNOWN_ERRORS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    # collector -> metric -> reasons served at 0 from the start, so that increase() and
    # rate() see the first one (a counter that appears at 1 is missed); other reasons still
    # appear when they first happen
    "ray": {  # the HTTP client's reasons and its own the Ray source serves at 0 itself
        "rlhf_exporter_collector_errors_total": ("http_401", "http_403", "token_file"),
    },
    "verl": {
        "rlhf_exporter_collector_errors_total": (
            "root_missing",
            "root_not_a_directory",
            "root_permission_denied",
            "file_missing",
        ),
        "rlhf_exporter_record_errors_total": (
            "invalid_json",
            "too_long",
            "not_object",
            "bad_step",
            "bad_data",
            "incomplete_line",
            "file_missing",
            "file_deleted",
            "permission_denied",
            "late_record",
        ),
    },
    "console": {  # what the console reader drops (rlhf_exporter/sources/console.py)
        "rlhf_exporter_record_errors_total": (
            "too_long",
            "foreign_step",
            "bad_step_line",
            "name_claimed",
            "ended_job_forgotten",
        ),
    },
    "nvml": {  # per GPU, served by the NVML source itself: the GPU-lost alert's reason
        "rlhf_gpu_errors_total": ("gpu_is_lost",),
    },
    "push": {
        "rlhf_exporter_record_errors_total": (
            "unauthorized",
            "too_large",
            "invalid_json",
            "bad_schema",
            "too_many_jobs",
            "late_record",
        ),
    },
}
