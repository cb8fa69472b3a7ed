"""The job dashboard's "Verdict" row: which window made the loop wait, the reason, and the
step and run now."""

from __future__ import annotations

from ....diagnosis import CHANGES, REASONS, VERDICTS
from ....diagnosis.advice import CHANGE_MEANING, LOOK_AT, VERDICT_MEANING
from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    BigValueColorMode,
    PanelBuilder,
    Q,
    bar_gauge,
    colour_by_name,
    said,
    stat_panel,
    state_timeline,
    threshold_line,
    thresholds,
    time_series,
    value_mappings,
)
from ..queries import (
    BY_JOB,
    JOB_LEGEND,
    RANGE,
    change_code,
    reason_code,
    seconds,
    sel,
    since_last_step,
    verdict_code,
)
from ..style import change_mappings, reason_mappings, verdict_mappings


def _verdict_legend() -> str:
    return "; ".join(f"{v}: {VERDICT_MEANING[v]}" for v in VERDICTS)


def _reason_legend() -> str:
    return "; ".join(
        f"{v}/{r}: {LOOK_AT[(v, r)]}" for v in VERDICTS for r in REASONS[v] if (v, r) in LOOK_AT
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
