"""The job dashboard: "RLHF job: where the step time goes".

One verl job (project and experiment are single-select, without "All"): the decision table's
verdict over time with its reason, the step's windows, the change against the job's own
baseline, and the evidence each reason is decided on; the job's alerts are annotations over
every panel. Thresholds drawn on panels come from the thresholds file.
"""

from __future__ import annotations

from typing import Any

from ...diagnosis import CHANGES, REASONS, VERDICTS, Thresholds
from ...diagnosis.advice import CHANGE_MEANING, LOOK_AT, VERDICT_MEANING
from ..addresses import FLEET_UID, JOB_UID
from . import style
from .context import DashboardContext
from .gpuhealth import gpu_health_row
from .layout import Board, Cell, Row, header
from .panels import (
    BigValueColorMode,
    P,
    PanelBuilder,
    Q,
    bar_gauge,
    colour_by_name,
    colour_by_thresholds,
    prop,
    said,
    stat_panel,
    state_timeline,
    threshold_line,
    thresholds,
    time_series,
    value_mappings,
)
from .queries import (
    BY_EXPORTER,
    BY_JOB,
    MAX_SERIES,
    RANGE,
    RATE,
    TARGET,
    TOP,
    change_code,
    eq,
    match,
    on_job_exporters,
    on_sole_job_exporters,
    reason_code,
    seconds,
    sel,
    since_last_step,
    steady,
    verdict_code,
    worst,
)
from .style import change_mappings, reason_mappings, verdict_mappings

PER_GPU = f"{BY_EXPORTER}, gpu"
PER_COLLECTOR = "cluster, instance, collector"
PER_REASON = "cluster, instance, collector, reason"

TITLE = "RLHF job: where the step time goes"
JOB_LEGEND = "{{project}}/{{experiment}}"
DESCRIPTION = (
    "Where one verl job's step time goes, step by step: the decision-table verdict, "
    "the windows behind it, and whether a slowdown is a workload shift or a regression."
)
FLEET_LINK = (
    f"/d/{FLEET_UID}/rlhf-fleet?${{datasource:queryparam}}"
    "&${cluster:queryparam}&${namespace:queryparam}"
)


def _verdict_legend() -> str:
    return "; ".join(f"{v}: {VERDICT_MEANING[v]}" for v in VERDICTS)


def _reason_legend() -> str:
    return "; ".join(
        f"{v}/{r}: {LOOK_AT[(v, r)]}" for v in VERDICTS for r in REASONS[v] if (v, r) in LOOK_AT
    )


def _dashed(panel: P, name_regex: str) -> P:
    """Series whose name matches `name_regex` drawn as a dashed line, outside the stack."""
    return panel.override_by_regexp(
        name_regex,
        [
            prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
            prop("custom.fillOpacity", 0),
            prop("custom.stacking", {"group": "baseline", "mode": "none"}),
            prop("custom.lineWidth", 2),
        ],
    )


def verdict_timeline(c: DashboardContext) -> PanelBuilder:
    return state_timeline(
        "Verdict and reason over time",
        "One band per job and line: the upper band is the verdict of the last classified step "
        "(the decision table's §3 row that won), the lower its reason, the evidence that says "
        "where to look next. Colours are the verdict's and are the same on the fleet "
        "dashboard. Verdicts: "
        + _verdict_legend()
        + ". Where to look next: "
        + _reason_legend()
        + ".",
        [Q(verdict_code(), JOB_LEGEND + " verdict"), Q(reason_code(), JOB_LEGEND + " reason")],
        {**verdict_mappings(), **reason_mappings()},
    )


def steps_per_verdict(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    return colour_by_name(
        bar_gauge(
            "Steps per verdict in the time range",
            "How many steps of the selected jobs got each verdict during the dashboard's time "
            "range (rlhf_bottleneck_steps_total). A long bar is the window that made the loop wait "
            "most often."
            + said(
                alerts,
                " A bound alert fires only when a verdict that holds {bound_fraction:.0%} of the "
                "steps in {window} is new (the bottleneck moved) or costs throughput; a steady "
                "bottleneck is shown here, not paged.",
            ),
            [
                Q(
                    f"sum by (verdict) (increase({sel('rlhf_bottleneck_steps_total')}[{RANGE}]))",
                    "{{verdict}}",
                    instant=True,
                )
            ],
            style.PLAIN,
        ).decimals(0),
        style.VERDICT_COLOURS,
    )


def time_since_last_step(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    stall = seconds(alerts["stall_min"])
    return stat_panel(
        "Time since the last step",
        "Seconds since the exporter read the last step of each job. Orange past half the "
        f"stall floor, red past the floor ({alerts['stall_min']}); the stall alert also "
        f"allows {alerts['stall_factor']}x the job's baseline step time.",
        [Q(f"max by ({BY_JOB}) ({since_last_step()})", JOB_LEGEND)],
        style.SECONDS,
    ).thresholds(thresholds(style.OK, (stall / 2, style.WARN), (stall, style.BAD)))


def step_and_run(c: DashboardContext) -> PanelBuilder:
    return stat_panel(
        "Step",
        "The last step number ingested (rlhf_step) and the job's 0-based run (rlhf_run): a "
        "lower step number (restart or resume) starts a new run and an empty baseline.",
        [
            Q(f"max by ({BY_JOB}) ({sel('rlhf_step')})", JOB_LEGEND + " step"),
            Q(f"max by ({BY_JOB}) ({sel('rlhf_run')})", JOB_LEGEND + " run"),
        ],
        style.PLAIN,
    ).color_mode(BigValueColorMode.NONE)


def change_now(c: DashboardContext) -> PanelBuilder:
    return stat_panel(
        "Change against the baseline now",
        "The last step's change (§4): "
        + "; ".join(f"{kind}: {CHANGE_MEANING[kind]}" for kind in CHANGES)
        + ".",
        [Q(change_code(), JOB_LEGEND)],
    ).mappings(value_mappings(change_mappings()))


def verdict_mix(c: DashboardContext) -> PanelBuilder:
    alerts, rules = c.alerts, c.rules
    return colour_by_name(
        threshold_line(
            time_series(
                f"Verdict mix over the last {rules.window}",
                f"Fraction of each job's classified steps per verdict over the last {rules.window} (the "
                "recording rule the bound alerts use; with several jobs selected, the highest job's "
                f"fraction). Above {alerts['bound_fraction']:g} (dashed line) the job is bound by "
                "that window; its bound alert fires only when the bottleneck moved (another verdict "
                f"held the {alerts['bound_reference']} before) or the job's throughput fell below "
                f"{alerts['bound_throughput_ratio']:.0%} of that reference.",
                [Q(f"max by (verdict) ({sel(rules.verdicts)})", "{{verdict}}")],
                style.RATIO,
                fill=0,
            )
            .min(0)
            .max(1),
            alerts["bound_fraction"],
            style.WARN,
        ),
        style.VERDICT_COLOURS,
    )


def step_time_by_group(c: DashboardContext) -> PanelBuilder:
    return _dashed(
        colour_by_name(
            time_series(
                "Step time by decision-table group",
                "Seconds of the last classified step per group, stacked (rlhf_group_duration_seconds; "
                "other includes the untimed remainder), against timing_s/step (dashed). The tallest "
                "band is the verdict's group. With several jobs selected the bands add up the jobs.",
                [
                    Q(f"sum by (group) ({sel('rlhf_group_duration_seconds')})", "{{group}}"),
                    Q(f"sum({sel('rlhf_step_duration_seconds')})", "timing_s/step"),
                ],
                style.SECONDS,
                stacked=True,
            ),
            style.group_colours(),
        ),
        "^timing_s/step$",
    )


def share_per_group(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return colour_by_name(
        threshold_line(
            time_series(
                "Share of the step per group",
                "Each group's share of the last step (rlhf_group_share_ratio, averaged over the "
                f"selected jobs). Decision table §3: the top group is the verdict when its share is at "
                f"least {th.min_share:g} (dashed line) and {th.min_margin:g} ahead of the runner-up; "
                "otherwise the step is balanced.",
                [Q(f"avg by (group) ({sel('rlhf_group_share_ratio')})", "{{group}}")],
                style.RATIO,
                fill=0,
            )
            .min(0)
            .max(1),
            th.min_share,
            style.WARN,
        ),
        style.group_colours(),
    )


def untimed_remainder(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Untimed remainder",
        "R = timing_s/step minus every counted timer: driver time outside any timer (data "
        "movement, batching, serialization). It is part of the `other` group.",
        [Q(sel("rlhf_untimed_duration_seconds"), JOB_LEGEND)],
        style.SECONDS,
    )


def untimed_share(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return threshold_line(
        time_series(
            "Untimed share of `other`",
            "R divided by the `other` group's seconds. Decision table, row `other`: at or above "
            f"{th.untimed_fraction:g} (dashed line) the reason is `untimed` (look at data "
            "movement and the controller), below it `driver_compute` (timed driver work such as adv).",
            [
                Q(
                    f"{sel('rlhf_untimed_duration_seconds')}\n/ ignoring (group) "
                    f"({sel('rlhf_group_duration_seconds', eq('group', 'other'))} > 0)",
                    JOB_LEGEND,
                )
            ],
            style.RATIO,
            fill=0,
        ).min(0),
        th.untimed_fraction,
        style.WARN,
    )


def weight_sync_time(c: DashboardContext) -> PanelBuilder:
    th = c.th
    sync_timers = th.document["groups"]["sync"]
    return time_series(
        "Weight-sync time",
        "Seconds per step spent pushing new weights to the rollout engines, per verl timer "
        f"({', '.join(sync_timers)}) and for the whole `sync` group. Decision table, row "
        "`sync`/`weight_sync`: look at the checkpoint-engine backend and "
        "update_weights_bucket_megabytes.",
        [
            Q(
                f"sum by (phase) ({sel('rlhf_phase_duration_seconds', match('phase', '|'.join(sync_timers)))})",
                "{{phase}}",
            ),
            Q(f"sum({sel('rlhf_group_duration_seconds', eq('group', 'sync'))})", "sync group"),
        ],
        style.SECONDS,
        fill=0,
    )


def throughput(c: DashboardContext) -> PanelBuilder:
    return (
        time_series(
            "Throughput",
            "perf/throughput: tokens per GPU per second of step time. Annotations mark steps that "
            "the decision table (§4) called a regression (red) or a workload shift (blue): a "
            "shift is slower because the work grew (tokens, sequence length, the longest "
            "response), a regression is a window that costs more than its work explains.",
            [Q(sel("rlhf_throughput_tokens_per_gpu_second"), JOB_LEGEND)],
            "short",
            fill=0,
        )
        .axis_label("tokens / GPU / s")
        .min(0)
    )


def tokens_per_step(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Tokens per step",
        "perf/total_num_tokens of the last step (K). A step that is slower because K grew, "
        "with no window costing more than its work explains, is a workload shift, not a "
        "regression.",
        [Q(sel("rlhf_step_tokens"), JOB_LEGEND)],
        "short",
        fill=0,
    ).min(0)


def change_timeline(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return state_timeline(
        "Change against the baseline",
        "The last step's change (§4), per job. "
        + "; ".join(f"{kind}: {CHANGE_MEANING[kind]}" for kind in CHANGES)
        + f". The baseline is the median of the last {th.baseline_steps} usable steps of the run; "
        f"with fewer than {th.min_baseline_steps} the change is steady.",
        [Q(change_code(), JOB_LEGEND)],
        change_mappings(),
        row_height=0.9,
    )


def step_time_against_baseline(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return _dashed(
        time_series(
            "Step time against the baseline",
            "timing_s/step of the last step and the job's baseline step time (dashed: the median "
            f"of recent steps without checkpoint saves). §4: the change is steady while the step "
            f"stays under {th.step_time_ratio:g}x the baseline and tokens per second above "
            f"{th.throughput_ratio:g}x.",
            [
                Q(sel("rlhf_step_duration_seconds"), JOB_LEGEND),
                Q(sel("rlhf_baseline_step_duration_seconds"), JOB_LEGEND + " baseline"),
            ],
            style.SECONDS,
            fill=0,
        ),
        " baseline$",
    )


def cost_per_token_against_baseline(c: DashboardContext) -> PanelBuilder:
    return _dashed(
        colour_by_name(
            time_series(
                "Cost per token by group against the baseline",
                "Seconds per token (T(g)/K) per group for the last step, and the job's baseline "
                "(dashed). A group above its baseline costs more per token than the job used to.",
                [
                    Q(
                        f"sum by (group) ({sel('rlhf_group_cost_seconds_per_token')})",
                        "{{group}}",
                    ),
                    Q(
                        f"sum by (group) ({sel('rlhf_baseline_group_cost_seconds_per_token')})",
                        "{{group}} baseline",
                    ),
                ],
                style.SECONDS,
                fill=0,
            ),
            style.group_colours(),
        ),
        " baseline$",
    )


def cost_ratio(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return colour_by_name(
        threshold_line(
            time_series(
                "Cost per token ÷ baseline",
                "Each group's cost per token divided by its baseline (groups with a zero baseline are "
                f"left out). §4: a slow step is a workload shift only while every significant group "
                f"stays at or under {th.cost_ratio:g}x (dashed line); a group above it makes the step a "
                "regression, and the group that added the most seconds is `regressed`.",
                [
                    Q(
                        f"max by (group) (\n  {sel('rlhf_group_cost_seconds_per_token')}\n  / "
                        f"({sel('rlhf_baseline_group_cost_seconds_per_token')} > 0)\n)",
                        "{{group}}",
                    )
                ],
                "suffix:×",
                fill=0,
            ),
            th.cost_ratio,
        ),
        style.group_colours(),
    )


def regressed_steps(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    return colour_by_name(
        time_series(
            "Regressed steps per group",
            "Steps diagnosed as a regression of each group (rlhf_regression_steps_total, per "
            "interval)."
            + said(
                alerts,
                " The regression alert fires when {regression_min_steps} steps "
                "in {window} regressed one group.",
            ),
            [
                Q(
                    f"sum by (group) (increase({sel('rlhf_regression_steps_total')}[{RATE}]))",
                    "{{group}}",
                )
            ],
            style.PLAIN,
            bars=True,
            calcs=("sum",),
        ),
        style.group_colours(),
    )


def mfu_by_stage(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return threshold_line(
        time_series(
            "MFU by stage",
            "perf/mfu/<stage>: actor (update), actor_infer (log-prob; v0 trainer only), critic. "
            f"Decision table rows `update` and `logprob`: at or above {th.mfu_compute_bound:g} "
            "(dashed line) the window is compute_bound (more GPUs or fewer tokens), below it "
            "low_mfu (micro-batch size, dynamic bsz, offload, communication); 0 or missing is "
            "mfu_unknown.",
            [
                Q(
                    sel("rlhf_mfu_ratio", 'stage=~"actor|actor_infer|critic"'),
                    JOB_LEGEND + " {{stage}}",
                )
            ],
            style.RATIO,
            fill=0,
        ).min(0),
        th.mfu_compute_bound,
        style.OK,
    )


def actor_memory_peak(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Actor memory peak",
        "actor/perf/max_memory_allocated_gb and max_memory_reserved_gb of the last step, in "
        "bytes: how close the update is to the GPU's memory (offload and micro-batch choices).",
        [
            Q(sel("rlhf_memory_max_allocated_bytes"), JOB_LEGEND + " allocated"),
            Q(sel("rlhf_memory_max_reserved_bytes"), JOB_LEGEND + " reserved"),
        ],
        style.BYTES,
        fill=0,
    )


def generate_max_and_mean(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Agent loop: generate_sequences max and mean",
        "Per-sample generate_sequences seconds of the last step: the slowest sample (max) "
        "against the average (mean). Far apart means a few long samples hold the batch.",
        [
            Q(
                sel("rlhf_agent_loop_seconds", 'part="generate_sequences"', 'stat=~"max|mean"'),
                JOB_LEGEND + " {{stat}}",
            )
        ],
        style.SECONDS,
        fill=0,
    )


def long_tail_ratio(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return threshold_line(
        time_series(
            "Long tail: generate max ÷ mean",
            "generate_sequences max divided by mean. Decision table, row `rollout`: at or above "
            f"{th.long_tail_generate_ratio:g} (dashed line) the reason is long_tail (response length "
            "cap, partial rollout, over-sampling). Without agent-loop statistics the table falls "
            f"back to response_length max ≥ {th.long_tail_response_ratio:g}x mean (next panel).",
            [
                Q(
                    f"{sel('rlhf_agent_loop_seconds', eq('part', 'generate_sequences'), eq('stat', 'max'))}\n/ ignoring (stat) "
                    f"({sel('rlhf_agent_loop_seconds', eq('part', 'generate_sequences'), eq('stat', 'mean'))} > 0)",
                    JOB_LEGEND,
                )
            ],
            "suffix:×",
            fill=0,
        ).min(0),
        th.long_tail_generate_ratio,
        style.WARN,
    )


def response_length(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Response length: slowest sample, mean and max",
        "Response tokens of the slowest agent-loop sample against response_length mean and "
        "max of the batch. The slowest sample being the longest one points at the length cap.",
        [
            Q(
                sel("rlhf_agent_loop_slowest_response_length_tokens"),
                JOB_LEGEND + " slowest sample",
            ),
            Q(sel("rlhf_response_length_tokens", 'stat=~"mean|max"'), JOB_LEGEND + " {{stat}}"),
        ],
        "short",
        fill=0,
    ).axis_label("tokens")


def preemptions(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return (
        time_series(
            "Preemptions",
            "agent_loop/num_preempted/max: the most preemptions any one sample suffered. Decision "
            f"table, row `rollout`: above {th.preempted_max:g} the reason is preemption (KV-cache "
            "pressure: rollout gpu_memory_utilization, max_num_seqs).",
            [Q(sel("rlhf_agent_loop_preempted_max"), JOB_LEGEND)],
            style.PLAIN,
            bars=True,
        )
        .thresholds(thresholds(style.OK, (th.preempted_max + 1, style.BAD)))
        .color_scheme(colour_by_thresholds())
        .min(0)
    )


def slowest_sample_shares(c: DashboardContext) -> PanelBuilder:
    th = c.th
    return threshold_line(
        time_series(
            "Slowest sample: share in tool calls and scoring",
            "The slowest sample's tool_calls and compute_score seconds as a share of its "
            "generate_sequences + tool_calls + compute_score. Decision table, row `rollout`: at or "
            f"above {th.tool_calls_fraction:g} (dashed line) for tool_calls the reason is tool_calls "
            f"(tool latency and concurrency); at or above {th.compute_score_fraction:g} for "
            "compute_score it is reward_in_loop (reward function / reward workers).",
            [
                Q(
                    f"{sel('rlhf_agent_loop_slowest_seconds', match('part', 'tool_calls|compute_score'))}\n"
                    f"/ ignoring (part) group_left ()\n(sum without (part) "
                    f"({sel('rlhf_agent_loop_slowest_seconds', match('part', 'generate_sequences|tool_calls|compute_score'))}) > 0)",
                    JOB_LEGEND + " {{part}}",
                )
            ],
            style.RATIO,
            fill=0,
        )
        .min(0)
        .max(1),
        th.tool_calls_fraction,
        style.WARN,
    )


def tool_and_score_time(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Tool and score time per sample",
        "Per-sample seconds in tool calls and in compute_score (agent_loop/<part>/mean and "
        "max) of the last step. Growing tool or score time with a rollout verdict points at "
        "tools or the reward function rather than generation.",
        [
            Q(
                sel(
                    "rlhf_agent_loop_seconds",
                    'part=~"tool_calls|compute_score"',
                    'stat=~"mean|max"',
                ),
                JOB_LEGEND + " {{part}} {{stat}}",
            )
        ],
        style.SECONDS,
        fill=0,
    )


def gpu_busy(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    busy = f"rate({sel('rlhf_gpu_busy_seconds_total')}[{RATE}])"
    return threshold_line(
        time_series(
            "GPU busy ratio",
            "rate(rlhf_gpu_busy_seconds_total): the exact fraction of time each GPU was busy, on "
            f"every node that serves the selected job (GPU series carry their job), the {MAX_SERIES} "
            "least busy at the end of the time range. Busy below "
            f"{alerts['gpu_idle_ratio']:g} (dashed line) while steps progress means the loop waits "
            "on something that is not GPU work."
            + said(alerts, " The GPU-idle alert fires after {gpu_idle_for}."),
            [
                Q(
                    worst(busy, steady(busy), by=PER_GPU, k=MAX_SERIES, lowest=True),
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            style.RATIO,
            fill=0,
        )
        .min(0)
        .max(1),
        alerts["gpu_idle_ratio"],
        style.WARN,
    )


def gpu_busy_by_window_and_role(c: DashboardContext) -> PanelBuilder:
    busy, total = "rlhf_window_gpu_busy_seconds_total", "rlhf_window_gpu_seconds_total"
    return time_series(
        "GPU busy by window and role",
        "GPU-seconds per step-window group and GPU role (rollout, trainer, colocated), busy and "
        "idle, stacked: NVML's timestamped samples joined to each step's windows, summed over "
        "the job's nodes (docs/gpu-windows.md). A tall idle band on the trainer in `rollout` "
        "means the trainer waits for samples; on the rollout outside `rollout`, rollout GPUs "
        "wait for the trainer.",
        [
            Q(
                f"sum by (gpu_role, group) (increase({sel(busy)}[{RATE}]))",
                "{{gpu_role}} {{group}} busy",
            ),
            Q(
                f"sum by (gpu_role, group) (\n  increase({sel(total)}[{RATE}])\n"
                f"  - increase({sel(busy)}[{RATE}])\n)",
                "{{gpu_role}} {{group}} idle",
            ),
        ],
        "s",
        stacked=True,
        bars=True,
    ).min(0)


def gpu_memory(c: DashboardContext) -> PanelBuilder:
    used = sel("rlhf_gpu_memory_used_bytes")
    total = sel("rlhf_gpu_memory_total_bytes")
    fullest = steady(used)
    return time_series(
        "GPU memory used per GPU",
        "Memory used on each GPU serving the selected job, on every node (NVML), and each "
        f"GPU's total (dashed): the {TOP} fullest GPUs at the end of the time range.",
        [
            Q(worst(used, fullest, by=PER_GPU), "{{instance}} GPU {{gpu}}"),
            Q(worst(total, fullest, by=PER_GPU), "{{instance}} GPU {{gpu}} total"),
        ],
        style.BYTES,
        fill=0,
    ).min(0)


def gpu_memory_by_role(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "GPU memory by role",
        "GPU memory of processes matched to Ray actors of each role (unknown: not matched), "
        "stacked: which part of the job (rollout engines, actor, critic, reward) holds the memory.",
        [
            Q(
                f"sum by (role) ({sel('rlhf_gpu_role_memory_bytes')})",
                "{{role}}",
            )
        ],
        style.BYTES,
        stacked=True,
    )


def ray_actors(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    return time_series(
        "Ray actors by role and state",
        "Actors of the Ray cluster the exporter reads, per role and state (ALIVE, "
        "PENDING_CREATION, RESTARTING, DEAD), from an exporter that serves the selected job "
        "alone (its head sidecar): a fleet exporter's one shared cluster is no single job's, "
        "so it is shown for none."
        + said(
            alerts,
            " Actors stuck in PENDING_CREATION "
            "for {pending_for} fire an alert: the cluster cannot place them.",
        ),
        [
            Q(
                f"sum by (role, state) ({on_sole_job_exporters(sel('rlhf_ray_actors', scope=TARGET))})",
                "{{role}} {{state}}",
            )
        ],
        style.PLAIN,
        stacked=True,
    )


def actor_restarts_and_deaths(c: DashboardContext) -> PanelBuilder:
    restarts = f"increase({sel('rlhf_ray_actor_restarts_total', scope=TARGET)}[{RATE}])"
    deaths = f"increase({sel('rlhf_ray_actor_deaths_total', scope=TARGET)}[{RATE}])"
    return time_series(
        "Actor restarts and deaths",
        "Restarts seen (growth of num_restarts) and actors that became DEAD, by role and "
        "death reason, per interval; a role without deaths shows a line at 0.",
        [
            Q(f"sum by (role) ({on_sole_job_exporters(restarts)})", "{{role}} restarts"),
            Q(
                f"sum by (role, reason) ({on_sole_job_exporters(deaths)})\n"
                f"or 0 * sum by (role) ({on_sole_job_exporters(restarts)})",
                "{{role}} died {{reason}}",
            ),
        ],
        style.PLAIN,
        bars=True,
        calcs=("sum",),
    )


def collector_up(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    up = on_job_exporters(sel("rlhf_exporter_collector_up", scope=TARGET))
    return state_timeline(
        "Collector up",
        "1 (green) when each collector's last collection succeeded, per exporter of the "
        f"selected job (the {MAX_SERIES} first, down ones first)."
        + said(alerts, " A collector down for {collector_down_for} fires an alert.")
        + " A failing collector's series are dropped, so gaps on the other panels start here.",
        [
            Q(
                worst(up, steady(up), by=PER_COLLECTOR, k=MAX_SERIES, lowest=True),
                "{{instance}} {{collector}}",
            )
        ],
        {0: ("down", style.BAD), 1: ("up", style.OK)},
    )


def collection_duration(c: DashboardContext) -> PanelBuilder:
    duration = on_job_exporters(sel("rlhf_exporter_collector_duration_seconds", scope=TARGET))
    return time_series(
        "Collection duration",
        "Seconds each collector's last collection took, on the selected job's exporters (the "
        f"{TOP} slowest). Slow collections happen in the background and never hold a scrape.",
        [Q(worst(duration, steady(duration), by=PER_COLLECTOR), "{{instance}} {{collector}}")],
        style.SECONDS,
        fill=0,
    )


def records_ingested(c: DashboardContext) -> PanelBuilder:
    def rate_of(metric: str, by: str) -> str:
        return f"sum by ({by}) (\n  {on_job_exporters(f'rate({sel(metric, scope=TARGET)}[{RATE}])')}\n)"

    zero_per_collector = f"0 * {rate_of('rlhf_exporter_records_total', PER_COLLECTOR)}"
    ingested = rate_of("rlhf_exporter_records_total", PER_COLLECTOR)
    rejected = (
        f"{rate_of('rlhf_exporter_record_errors_total', PER_REASON)}\nor {zero_per_collector}"
    )
    failed = (
        f"{rate_of('rlhf_exporter_collector_errors_total', PER_REASON)}\nor {zero_per_collector}"
    )
    # 8 + 6 + 6 series at most: the busiest collectors, the most frequent rejections
    return time_series(
        "Records ingested and rejected",
        "Input records ingested per second, rejected input by reason (bad input is counted, "
        "never fatal) and failed collections by reason, on the selected job's exporters (the "
        "busiest collectors and the most frequent reasons). A collector without any rejection "
        "or failure shows a line at 0.",
        [
            Q(
                worst(ingested, steady(ingested), by=PER_COLLECTOR, k=8),
                "{{instance}} {{collector}} ingested",
            ),
            Q(
                worst(rejected, steady(rejected), by=PER_REASON, k=6),
                "{{instance}} {{collector}} rejected {{reason}}",
            ),
            Q(
                worst(failed, steady(failed), by=PER_REASON, k=6),
                "{{instance}} {{collector}} failed {{reason}}",
            ),
        ],
        "reqps",
        fill=0,
    )


def verdict_row(c: DashboardContext) -> Row:
    return Row(
        100,
        "Verdict: which window made the loop wait",
        [
            Cell(verdict_timeline(c), w=16, h=8),
            Cell(steps_per_verdict(c), w=8, h=8),
            Cell(time_since_last_step(c), w=8, h=4),
            Cell(step_and_run(c), w=8, h=4),
            Cell(change_now(c), w=8, h=4),
            Cell(verdict_mix(c), w=24, h=7),
        ],
    )


def anatomy_row(c: DashboardContext) -> Row:
    return Row(
        200,
        "Step anatomy: where the step time goes",
        [
            Cell(step_time_by_group(c), w=12, h=9),
            Cell(share_per_group(c), w=12, h=9),
            Cell(untimed_remainder(c), w=8, h=8),
            Cell(untimed_share(c), w=8, h=8),
            Cell(weight_sync_time(c), w=8, h=8),
        ],
    )


def change_row(c: DashboardContext) -> Row:
    return Row(
        300,
        "Throughput and change against the job's own baseline",
        [
            Cell(throughput(c), w=12, h=8),
            Cell(tokens_per_step(c), w=12, h=8),
            Cell(change_timeline(c), w=24, h=4),
            Cell(step_time_against_baseline(c), w=8, h=8),
            Cell(cost_per_token_against_baseline(c), w=8, h=8),
            Cell(cost_ratio(c), w=8, h=8),
            Cell(regressed_steps(c), w=24, h=6),
        ],
    )


def efficiency_row(c: DashboardContext) -> Row:
    return Row(
        400,
        "Efficiency: model FLOPs utilization and memory",
        [
            Cell(mfu_by_stage(c), w=12, h=8),
            Cell(actor_memory_peak(c), w=12, h=8),
        ],
    )


def rollout_row(c: DashboardContext) -> Row:
    return Row(
        500,
        "Rollout evidence: why the trainer waits for samples",
        [
            Cell(generate_max_and_mean(c), w=8, h=8),
            Cell(long_tail_ratio(c), w=8, h=8),
            Cell(response_length(c), w=8, h=8),
            Cell(preemptions(c), w=8, h=8),
            Cell(slowest_sample_shares(c), w=8, h=8),
            Cell(tool_and_score_time(c), w=8, h=8),
        ],
    )


# -- engines (issue 29: docs/engines.md): what vLLM / SGLang did during the rollout windows --
ENGINE_REPLICA_LEGEND = "{{project}}/{{experiment}} {{replica}}"


def _engine(c: DashboardContext) -> dict[str, Any]:
    return dict(c.th.document["engine"])


def engine_requests(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Engines: running and waiting requests",
        "Over each step's rollout window W, summed over the rollout replicas: the peak and the "
        "time-weighted mean of running requests, and the mean of waiting (queued) requests. "
        "Requests waiting while the KV cache has room is `queueing`; waiting with a full cache "
        "is `kv_pressure` (docs/engines.md).",
        [
            Q(sel("rlhf_engine_running_requests_peak"), JOB_LEGEND + " running, peak"),
            Q(sel("rlhf_engine_running_requests_mean"), JOB_LEGEND + " running, mean"),
            Q(sel("rlhf_engine_waiting_requests_mean"), JOB_LEGEND + " waiting, mean"),
        ],
        style.PLAIN,
        fill=0,
    ).min(0)


def engine_kv_cache(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return threshold_line(
        time_series(
            "Engines: KV-cache usage, highest during W",
            "The highest KV-cache usage of any replica (and of each replica) during the step's "
            f"rollout window. At or above {e['kv_full']:g} (dashed line) with requests waiting "
            f"for {e['kv_pressure_share']:g} of W the reason is kv_pressure; waiting below "
            f"{e['kv_free']:g} is queueing.",
            [
                Q(sel("rlhf_engine_kv_cache_usage_max_ratio"), JOB_LEGEND),
                Q(sel("rlhf_engine_replica_kv_cache_usage_max_ratio"), ENGINE_REPLICA_LEGEND),
            ],
            style.RATIO,
            fill=0,
        )
        .min(0)
        .max(1),
        float(e["kv_full"]),
    )


def engine_preemptions(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return (
        time_series(
            "Engines: preemptions during W",
            "vllm:num_preemptions_total / sglang:num_retracted_requests_total: their increase over "
            f"the step's rollout window, summed over replicas. Above {e['preemptions_min']:g} the "
            "reason is preemption (verl's own agent_loop/num_preempted is never reported).",
            [Q(sel("rlhf_engine_window_preemptions"), JOB_LEGEND)],
            style.PLAIN,
            bars=True,
        )
        .thresholds(thresholds(style.OK, (float(e["preemptions_min"]) + 1, style.BAD)))
        .color_scheme(colour_by_thresholds())
        .min(0)
    )


def engine_tokens_per_replica(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Engines: tokens per replica during W",
        "Tokens each rollout replica generated during the step's rollout window "
        '(vllm:generation_tokens_total; SGLang: sglang:realtime_tokens_total{mode="decode"}, '
        "else sglang:generation_tokens_total). One replica far "
        "above the others: replica_imbalance (next panel).",
        [Q(sel("rlhf_engine_replica_generated_tokens"), ENGINE_REPLICA_LEGEND)],
        style.TOKENS,
        fill=0,
    ).min(0)


def engine_imbalance(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return threshold_line(
        time_series(
            "Engines: token imbalance (max ÷ mean replica)",
            "The busiest replica's tokens over the mean replica's during W. At or above "
            f"{e['imbalance_ratio']:g} (dashed line) the reason is replica_imbalance (one slow "
            "node, an uneven load).",
            [Q(sel("rlhf_engine_imbalance_ratio"), JOB_LEGEND)],
            "suffix:×",
            fill=0,
        ).min(0),
        float(e["imbalance_ratio"]),
        style.WARN,
    )


def engine_window_shares(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return time_series(
        "Engines: share of W by condition, and coverage",
        f"kv_pressure (KV ≥ {e['kv_full']:g} with requests waiting; the reason at "
        f"{e['kv_pressure_share']:g}), queueing (waiting with KV < {e['kv_free']:g}; at "
        f"{e['queueing_share']:g}), long_tail (running ≤ {e['long_tail_running_ratio']:g} × peak; "
        f"at {e['long_tail_share']:g}). Coverage: the least-covered replica's share of W; below "
        f"{e['min_coverage']:g} the evidence is not usable and the log's reasons apply.",
        [
            Q(sel("rlhf_engine_window_share_ratio"), JOB_LEGEND + " {{condition}}"),
            Q(sel("rlhf_engine_coverage_ratio"), JOB_LEGEND + " coverage"),
        ],
        style.RATIO,
        fill=0,
    ).min(0)


def engines_row(c: DashboardContext) -> Row:
    return Row(
        550,
        "Engines: what vLLM / SGLang did during the rollout windows",
        [
            Cell(engine_requests(c), w=8, h=8),
            Cell(engine_kv_cache(c), w=8, h=8),
            Cell(engine_preemptions(c), w=8, h=8),
            Cell(engine_tokens_per_replica(c), w=8, h=8),
            Cell(engine_imbalance(c), w=8, h=8),
            Cell(engine_window_shares(c), w=8, h=8),
        ],
    )


def gpu_row(c: DashboardContext) -> Row:
    return Row(
        600,
        "GPUs (NVML) serving the selected jobs, every node",
        [
            Cell(gpu_busy(c), w=8, h=8),
            Cell(gpu_memory(c), w=8, h=8),
            Cell(gpu_memory_by_role(c), w=8, h=8),
            Cell(gpu_busy_by_window_and_role(c), w=24, h=9),
        ],
    )


def ray_row(c: DashboardContext) -> Row:
    return Row(
        700,
        "Ray actors",
        [
            Cell(ray_actors(c), w=16, h=8),
            Cell(actor_restarts_and_deaths(c), w=8, h=8),
        ],
    )


def health_row(c: DashboardContext) -> Row:
    return Row(
        800,
        "Exporter health",
        [
            Cell(collector_up(c), w=12, h=7),
            Cell(collection_duration(c), w=6, h=7),
            Cell(records_ingested(c), w=6, h=7),
        ],
    )


ROWS = (
    verdict_row,
    anatomy_row,
    change_row,
    efficiency_row,
    rollout_row,
    engines_row,
    gpu_row,
    gpu_health_row,
    ray_row,
    health_row,
)


def change_annotations(b: Board) -> None:
    """Regressions and workload shifts (decision table §4) marked on every time series."""
    b.annotate(
        "Regression",
        f"max by ({BY_JOB}) ({sel('rlhf_change', eq('kind', 'regression'))}) == 1",
        style.CHANGE_COLOURS["regression"],
        "regression: " + JOB_LEGEND,
    )
    b.annotate(
        "Workload shift",
        f"max by ({BY_JOB}) ({sel('rlhf_change', eq('kind', 'workload_shift'))}) == 1",
        style.CHANGE_COLOURS["workload_shift"],
        "workload shift: " + JOB_LEGEND,
    )


ALERTS_FIRING = (
    f"max by (alertname, severity, {BY_JOB}) ({sel('ALERTS', eq('alertstate', 'firing'))})"
)
"""The job's firing alerts, one series per alert (what the alert annotations draw)."""


def alert_annotations(b: Board) -> None:
    """The job's alerts as regions over every panel: from when each fired to when it
    resolved (Prometheus's ALERTS series for the job's project and experiment)."""
    b.annotate("Alerts", ALERTS_FIRING, style.BAD, "{{alertname}} ({{severity}})")


def build(th: Thresholds) -> Board:
    c = DashboardContext.of(th)
    b = header(JOB_UID, TITLE, DESCRIPTION, "RLHF fleet", FLEET_LINK, single_job=True)
    change_annotations(b)
    alert_annotations(b)
    for row in ROWS:
        b.add_row(row(c))
    return b


def render(th: Thresholds) -> str:
    return build(th).json()
