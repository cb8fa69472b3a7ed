"""The job dashboard's "Throughput and change" row: the job against its own baseline
(decision table §4)."""

from __future__ import annotations

from ....diagnosis import CHANGES
from ....diagnosis.advice import CHANGE_MEANING
from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    colour_by_name,
    dashed,
    said,
    state_timeline,
    threshold_line,
    time_series,
)
from ..queries import (
    JOB_LEGEND,
    RATE,
    change_code,
    sel,
)
from ..style import change_mappings


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
    return dashed(
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
    return dashed(
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
