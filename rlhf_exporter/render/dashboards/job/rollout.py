"""The job dashboard's "Rollout evidence" row: what the rollout reasons are decided on,
from the job's log."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    colour_by_thresholds,
    threshold_line,
    thresholds,
    time_series,
)
from ..queries import (
    JOB_LEGEND,
    eq,
    match,
    sel,
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
