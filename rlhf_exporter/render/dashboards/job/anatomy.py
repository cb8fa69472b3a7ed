"""The job dashboard's "Step anatomy" row: where the step time goes, window by window, and
what no timer covers."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    colour_by_name,
    dashed,
    threshold_line,
    time_series,
)
from ..queries import (
    JOB_LEGEND,
    eq,
    match,
    sel,
)


def step_time_by_group(c: DashboardContext) -> PanelBuilder:
    return dashed(
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
