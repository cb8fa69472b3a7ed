"""The fleet dashboard: "RLHF fleet".

Every verl job at a glance (a table whose rows open the job dashboard), how many jobs wait
on each window, where the fleet's GPU time goes by decision-table group, and which jobs are
stalled or regressed. Verdict colours are the job dashboard's (`style.VERDICT_COLOURS`).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import statetimeline, timeseries

from ...diagnosis import CHANGES, Thresholds
from ...diagnosis.advice import CHANGE_MEANING
from ..addresses import FLEET_UID, JOB_UID
from ..rules import all_alerts
from ..rules.recording import VERDICT_CODE, VERDICT_HOT
from . import remotewrite, style
from .context import DashboardContext
from .fleet_table import jobs_table
from .layout import Board, Cell, Row, header
from .panels import (
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
)
from .queries import (
    BY_JOB,
    JOB_LEGEND,
    RANGE,
    TARGET,
    TOP,
    at_end,
    change_code,
    eq,
    job_state_is,
    match,
    seconds,
    sel,
    stall_budget,
    steady,
    verdict_code,
    worst,
)
from .style import (
    change_mappings,
    verdict_mappings,
)

CHANGED = "|".join(k for k in CHANGES if k != CHANGES[0])
"""The change kinds that are news (every kind but `steady`)."""

TITLE = "RLHF fleet"
DESCRIPTION = (
    "Every verl job's decision-table verdict at a glance, where the fleet's GPU time "
    "goes, and the jobs that stalled or regressed. Click a job to open its dashboard."
)
JOB_DASHBOARD_LINK = (
    f"/d/{JOB_UID}/rlhf-job?${{datasource:queryparam}}&${{cluster:queryparam}}"
    "&${namespace:queryparam}&${project:queryparam}&${experiment:queryparam}"
)


def jobs_count(c: DashboardContext) -> PanelBuilder:
    return stat_panel(
        "Jobs",
        "verl jobs exported (series of rlhf_step), per the filters above.",
        [Q(f"count({sel('rlhf_step')}) or vector(0)")],
        style.PLAIN,
    ).color_mode(BigValueColorMode.NONE)


def stalled_jobs(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    return stat_panel(
        "Stalled jobs",
        "Running jobs without a new step for longer than their stall limit: max(stall_factor "
        f"x baseline step time, stall_min) = max({alerts['stall_factor']}x, "
        f"{alerts['stall_min']}) plus the longest validation and checkpoint seen in the run. "
        "Finished and failed jobs are not stalled. The recording rule RLHFJobStalled reads "
        "(project_experiment_state:rlhf_job_state:max), so this and the alert agree.",
        [Q(f"count({job_state_is('stalled')}) or vector(0)")],
        style.PLAIN,
    ).thresholds(thresholds(style.OK, (1, style.BAD)))


def jobs_in_regression(c: DashboardContext) -> PanelBuilder:
    return stat_panel(
        "Jobs in regression",
        "Jobs whose last step the decision table (§4) called a regression: a window costs more "
        "than its work explains, against the job's own baseline.",
        [Q(f"sum({sel('rlhf_change', eq('kind', 'regression'))}) or vector(0)")],
        style.PLAIN,
    ).thresholds(thresholds(style.OK, (1, style.BAD)))


def bundle_alerts(c: DashboardContext) -> list[str]:
    """Every alert the rule files ship (alerts/*.rules.yaml), in file order."""
    return [a.name for a in all_alerts(c.rules)]


def firing_alerts_expr(c: DashboardContext) -> str:
    """Firing alerts of the bundle: the selected jobs' ones, and those that carry no job
    (Ray actors, GPUs, the exporter itself; the cluster and namespace filters still apply)."""
    names = match("alertname", "|".join(bundle_alerts(c)))
    firing = eq("alertstate", "firing")
    return (
        f"count(\n  {sel('ALERTS', names, firing)}\n"
        f"  or {sel('ALERTS', names, firing, eq('project', ''), scope=TARGET)}\n) or vector(0)"
    )


def firing_alerts(c: DashboardContext) -> PanelBuilder:
    return stat_panel(
        "Firing alerts",
        "Alerts of the rlhf-exporter rules now firing: the selected jobs' alerts and those that "
        "carry no job (Ray actors, GPUs, the exporter and its collectors).",
        [Q(firing_alerts_expr(c))],
        style.PLAIN,
    ).thresholds(thresholds(style.OK, (1, style.BAD)))


def jobs_per_verdict(c: DashboardContext) -> PanelBuilder:
    """A count by verdict of each job's recorded hot verdict (one series per job, its replicas
    folded by the record, every `alerts.fleet_interval`): no `count_values`, which turns every
    sample's value into a new label at every step (0.76x over 24 h of 1,000 jobs, side by
    side: bench/HISTORY.md), and no per-step `max by` of the job's series."""
    return colour_by_name(
        time_series(
            "Jobs per verdict",
            "How many jobs' last step had each verdict, stacked: the fleet's waiting windows "
            f"over time (a recording rule every {c.rules.fleet_interval}). Colours are the "
            "verdict colours of the job dashboard.",
            [
                Q(
                    f"count by (verdict) ({sel(VERDICT_HOT)})",
                    "{{verdict}}",
                )
            ],
            style.PLAIN,
            stacked=True,
        ).decimals(0),
        style.VERDICT_COLOURS,
    )


def steps_per_verdict(c: DashboardContext) -> PanelBuilder:
    return colour_by_name(
        bar_gauge(
            "Steps per verdict in the time range",
            "Classified steps of all selected jobs per verdict during the dashboard's time range "
            f"(a recording rule every {c.rules.fleet_interval}).",
            [
                Q(
                    f"sum by (verdict) (sum_over_time({sel(c.rules.verdict_steps_fleet)}[{RANGE}]))",
                    "{{verdict}}",
                    instant=True,
                )
            ],
            style.PLAIN,
        ).decimals(0),
        style.VERDICT_COLOURS,
    )


def verdict_per_job(c: DashboardContext) -> PanelBuilder:
    return state_timeline(
        "Verdict per job",
        f"The verdict of each job's last classified step over time, one band per job: the {TOP} "
        "jobs whose verdict changed most often in the time range (the full list is the table "
        "above).",
        [
            Q(
                worst(
                    verdict_code(),
                    f"max by ({BY_JOB}) (changes({sel(VERDICT_CODE)}[{RANGE}] @ end()))",
                ),
                JOB_LEGEND,
            )
        ],
        verdict_mappings(),
        row_height=0.9,
    )


def gpu_hours_per_group(c: DashboardContext) -> PanelBuilder:
    return colour_by_name(
        bar_gauge(
            "GPU-hours per group in the time range",
            "Step seconds per decision-table group times each job's GPU count, summed over the "
            "fleet: where the fleet's GPU-hours went while the loop waited on each window. The GPU "
            "count is verl's own: total_num_tokens / (timing_s/step x throughput). Read from a "
            f"recording rule evaluated every {c.rules.fleet_interval}.",
            [
                Q(
                    f"sum by (group) (\n  sum_over_time({sel(c.rules.group_gpu_seconds)}[{RANGE}])\n"
                    ") / 3600",
                    "{{group}}",
                    instant=True,
                )
            ],
            "h",
        ).decimals(1),
        style.group_colours(),
    )


def gpus_waiting_per_group(c: DashboardContext) -> PanelBuilder:
    return colour_by_name(
        time_series(
            "GPUs waiting in each group",
            "Rate of step seconds per group times each job's GPU count, stacked: how many GPUs "
            "of the fleet, on average, sat in each window. The total is the fleet's GPUs in "
            f"training loops. Averaged over {c.rules.fleet_interval} (a recording rule).",
            [
                Q(
                    f"sum by (group) ({sel(c.rules.group_gpu_seconds)})\n"
                    f"/ {seconds(c.alerts['fleet_interval']):g}",
                    "{{group}}",
                )
            ],
            "short",
            stacked=True,
        ).axis_label("GPUs"),
        style.group_colours(),
    )


def idle_gpu_hours_by_window(c: DashboardContext) -> PanelBuilder:
    busy, total = "rlhf_window_gpu_busy_seconds_total", "rlhf_window_gpu_seconds_total"
    return bar_gauge(
        "GPU-hours idle by window, top jobs",
        "Idle GPU-hours in the time range per job, step-window group and GPU role, the 10 "
        "largest: GPU-seconds available during the job's windows minus the busy ones (NVML's "
        "samples joined to the windows, summed over each job's nodes; docs/gpu-windows.md).",
        [
            Q(
                f"topk(10, sum by ({BY_JOB}, group, gpu_role) (\n"
                f"  increase({sel(total)}[{RANGE}])\n  - increase({sel(busy)}[{RANGE}])\n) / 3600)",
                "{{project}}/{{experiment}} {{group}} {{gpu_role}}",
                instant=True,
            )
        ],
        "h",
    ).decimals(1)


def stall_budget_used(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    budget = stall_budget()
    return threshold_line(
        time_series(
            "Stall budget used",
            "Seconds since each running job's last step divided by its stall limit, "
            f"max(stall_factor x baseline step time, stall_min) = max({alerts['stall_factor']}x, "
            f"{alerts['stall_min']}) plus the longest validation and checkpoint seen in its run "
            "(the recording rule project_experiment:rlhf_job_stall_budget:ratio, which the stall "
            f"alert reads). The {TOP} highest at the end of the time range. Above 1 (dashed line) "
            "the job is stalled"
            + said(alerts, "; the stall alert fires after {stall_for} there")
            + ". Finished and failed jobs are left out.",
            [Q(worst(budget, steady(budget)), JOB_LEGEND)],
            style.RATIO,
            fill=0,
        ).min(0),
        1.0,
    )


def change_per_job(c: DashboardContext) -> PanelBuilder:
    return state_timeline(
        "Change against the baseline per job",
        "Each job's last-step change (§4). "
        + "; ".join(f"{kind}: {CHANGE_MEANING[kind]}" for kind in CHANGES)
        + f". The {TOP} jobs with the most regressed or shifted steps in the time range (the "
        "full list is the table above).",
        [
            Q(
                worst(
                    change_code(),
                    f"sum by ({BY_JOB}) (sum_over_time("
                    f"{sel(c.rules.change_steps_fleet, match('kind', CHANGED))}[{RANGE}] @ end()))",
                ),
                JOB_LEGEND,
            )
        ],
        change_mappings(),
        row_height=0.9,
    )


def regressed_steps_per_job(c: DashboardContext) -> PanelBuilder:
    alerts, rules = c.alerts, c.rules
    return threshold_line(
        time_series(
            f"Regressed steps in the last {rules.window}, per job and group",
            f"Steps of each job that were a regression of a group over the last {rules.window} (the "
            f"recording rule of the regression alert): the {TOP} jobs and groups with the most "
            f"regressed steps in the range, only while they have one (recording rules every "
            f"{rules.fleet_interval})."
            + said(
                alerts,
                " At {regression_min_steps} (dashed line) for {regression_for} the regression "
                "alert fires.",
            ),
            [
                Q(
                    worst(
                        sel(rules.regressions_nonzero),
                        f"sum by ({BY_JOB}, group) (sum_over_time("
                        f"{sel(rules.regression_steps_fleet)}[{RANGE}] @ end())) > 0",
                        by=f"{BY_JOB}, group",
                    ),
                    JOB_LEGEND + " {{group}}",
                )
            ],
            style.PLAIN,
            fill=0,
        ).min(0),
        alerts["regression_min_steps"],
        style.BAD,
    )


def regressed_steps_per_group(c: DashboardContext) -> PanelBuilder:
    return colour_by_name(
        bar_gauge(
            "Regressed steps per group in the time range",
            "Steps of all selected jobs diagnosed as a regression of each group during the time "
            "range: which window gets slower per token across the fleet (a recording rule "
            f"every {c.rules.fleet_interval}).",
            [
                Q(
                    f"sum by (group) (sum_over_time({sel(c.rules.regression_steps_fleet)}[{RANGE}]))",
                    "{{group}}",
                    instant=True,
                )
            ],
            style.PLAIN,
        ).decimals(0),
        style.group_colours(),
    )


def throughput_against_baseline(c: DashboardContext) -> PanelBuilder:
    alerts, rules = c.alerts, c.rules
    reference_text = (
        f"its best baseline over {rules.throughput_reference} (recording rule; it restarts at "
        "a workload shift)"
    )
    return threshold_line(
        time_series(
            "Tokens per second ÷ baseline",
            f"Each job's tokens per second of step time over the last {rules.window} (recording rule) "
            f"divided by {reference_text}: the {TOP} lowest at the end of the time range. Below "
            f"{alerts['throughput_drop_ratio']:g} (dashed line) the throughput alert fires unless a "
            "workload shift (more tokens per step) explains it.",
            [
                Q(
                    worst(
                        sel(rules.tokens_vs_best),
                        at_end(sel(rules.tokens_vs_best)),
                        lowest=True,
                    ),
                    JOB_LEGEND,
                )
            ],
            "suffix:×",
            fill=0,
        ).min(0),
        alerts["throughput_drop_ratio"],
        style.BAD,
    )


def jobs_row(c: DashboardContext) -> Row:
    return Row(
        100,
        "Jobs now",
        [
            Cell(jobs_count(c), w=6, h=4),
            Cell(stalled_jobs(c), w=6, h=4),
            Cell(jobs_in_regression(c), w=6, h=4),
            Cell(firing_alerts(c), w=6, h=4),
            Cell(jobs_table(c), w=24, h=10),
        ],
    )


def verdicts_row(c: DashboardContext) -> Row:
    return Row(
        200,
        "Verdicts across the fleet",
        [
            Cell(jobs_per_verdict(c), w=12, h=8),
            Cell(steps_per_verdict(c), w=12, h=8),
            Cell(verdict_per_job(c), w=24, h=8),
        ],
    )


def gpu_time_row(c: DashboardContext) -> Row:
    return Row(
        300,
        "Where the fleet's GPU time goes",
        [
            Cell(gpu_hours_per_group(c), w=8, h=9),
            Cell(gpus_waiting_per_group(c), w=16, h=9),
            Cell(idle_gpu_hours_by_window(c), w=24, h=9),
        ],
    )


def stalls_row(c: DashboardContext) -> Row:
    return Row(
        400,
        "Stalled jobs and regressions",
        [
            Cell(stall_budget_used(c), w=12, h=8),
            Cell(change_per_job(c), w=12, h=8),
            Cell(regressed_steps_per_job(c), w=12, h=8),
            Cell(regressed_steps_per_group(c), w=12, h=8),
            Cell(throughput_against_baseline(c), w=24, h=8),
        ],
    )


ROWS = (
    jobs_row,
    verdicts_row,
    gpu_time_row,
    stalls_row,
    remotewrite.store_row,
)


MIN_STEP = "2m"
"""The fleet's time series never ask for points closer than this (Grafana's panel "min
interval"): their series are recording rules over 30 m or longer (or every 2 m), so a finer step only
multiplies the work by 1,000 jobs (bench/dashboard_cost.py)."""


def build(th: Thresholds) -> Board:
    c = DashboardContext.of(th)
    b = header(FLEET_UID, TITLE, DESCRIPTION, "RLHF job", JOB_DASHBOARD_LINK)
    for row in ROWS:
        r = row(c)
        cells = [
            Cell(x.panel.interval(MIN_STEP), x.w, x.h)
            if isinstance(x.panel, (timeseries.Panel, statetimeline.Panel))
            else x
            for x in r.cells
        ]
        b.add_row(Row(r.id, r.title, cells))
    return b


def render(th: Thresholds) -> str:
    return build(th).json()
