"""The fleet dashboard's jobs table: one row per verl job, its state, verdict, reason, change,
throughput and health, each row a link to the job dashboard."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.builders.common import TableSortByFieldState
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig

from ..addresses import JOB_UID
from . import style
from .context import DashboardContext
from .gpuhealth import gpus_with_errors_column
from .panels import (
    Q,
    prop,
    table_panel,
    thresholds,
    value_mappings,
)
from .queries import (
    BY_JOB,
    attention_code,
    change_code,
    eq,
    reason_code,
    sel,
    since_last_step,
    stall_budget,
    verdict_code,
)
from .style import (
    attention_mappings,
    change_mappings,
    reason_mappings,
    verdict_mappings,
)

JOB_LINK = (
    f"/d/{JOB_UID}/rlhf-job?${{datasource:queryparam}}&${{cluster:queryparam}}"
    "&${namespace:queryparam}&var-project=${__data.fields.project}"
    "&var-experiment=${__data.fields.experiment}&${__url_time_range}"
)


def job_columns(c: DashboardContext) -> list[tuple[str, Q]]:
    """The jobs table's columns after project and experiment: (name, instant table query)."""
    rules = c.rules
    return [
        ("state", Q(attention_code(), table=True, instant=True)),
        (
            "since",
            Q(
                f"max by ({BY_JOB}) (time() - {sel('rlhf_job_state_timestamp_seconds')})",
                table=True,
                instant=True,
            ),
        ),
        (
            "stall budget",
            Q(f"max by ({BY_JOB}) (\n  {stall_budget()}\n)", table=True, instant=True),
        ),
        ("verdict", Q(verdict_code(), table=True, instant=True)),
        ("reason", Q(reason_code(), table=True, instant=True)),
        ("change", Q(change_code(), table=True, instant=True)),
        (
            "throughput",
            Q(
                f"max by ({BY_JOB}) ({sel('rlhf_throughput_tokens_per_gpu_second')})",
                table=True,
                instant=True,
            ),
        ),
        (
            "step time",
            Q(f"max by ({BY_JOB}) ({sel('rlhf_step_duration_seconds')})", table=True, instant=True),
        ),
        (
            "since last step",
            Q(f"max by ({BY_JOB}) ({since_last_step()})", table=True, instant=True),
        ),
        (
            "GPU busy",
            Q(f"max by ({BY_JOB}) ({sel(rules.gpus_busy)})", table=True, instant=True),
        ),
        gpus_with_errors_column(c),
        (
            "firing alerts",
            Q(
                f"count by ({BY_JOB}) ({sel('ALERTS', eq('alertstate', 'firing'))})\n"
                f"or max by ({BY_JOB}) ({sel('rlhf_step')}) * 0",
                table=True,
                instant=True,
            ),
        ),
    ]


def jobs_table(c: DashboardContext) -> table.Panel:
    alerts, rules = c.alerts, c.rules
    columns = job_columns(c)
    refs = [chr(ord("A") + i) for i in range(len(columns))]
    t = table_panel(
        "Every job: verdict, throughput, health",
        "One row per verl job, what needs attention first: state is failed, stalled, "
        "regressed (running, its last step regressed), running, unknown (no step yet) or "
        "finished, as the alerts see it (docs/job-states.md); since: how long the exporter has "
        "seen it in that state; stall budget: time since its last step over its stall limit "
        "(red at 1, where RLHFJobStalled counts); verdict/reason: the decision table's answer for the last "
        "classified step (colours as on the job dashboard); change: against the job's own "
        "baseline; throughput: tokens per GPU-second; since last step: the time itself; "
        f"GPU busy: the average busy ratio over {rules.window} of "
        f"the job's GPUs on every node (red below {alerts['gpu_idle_ratio']:g}); GPUs with errors: the job's GPUs lost, with a bad-GPU XID, an uncorrectable "
        "ECC error or a failed row remap in the time range (a recording rule every "
        f"{rules.dur('gpu_interval')}); firing alerts: alerts from "
        "the rlhf-exporter rules that carry the job's labels. Click a job's experiment to open "
        "the job dashboard.",
        [q for _, q in columns],
    )
    t = t.with_transformation(_transformation("merge", {}))
    t = t.with_transformation(
        _transformation(
            "organize",
            {
                "excludeByName": {"Time": True},
                # cluster and namespace first: two clusters' grpo/exp1 are two rows;
                # on a single Prometheus the columns are absent
                "indexByName": {
                    "cluster": 0,
                    "namespace": 1,
                    "project": 2,
                    "experiment": 3,
                    **{name: i + 4 for i, (name, _) in enumerate(columns)},
                },
                "renameByName": {f"Value #{ref}": name for ref, (name, _) in zip(refs, columns)},
            },
        )
    )
    return style_job_columns(t, c).sort_by([_sort("state")])


def style_job_columns(t: table.Panel, c: DashboardContext) -> table.Panel:
    """Units, colours and the job-dashboard link of the jobs table, by column name."""
    coloured_cell = {"type": "color-background", "mode": "basic"}
    t = t.override_by_name(
        "state",
        [
            prop("mappings", _mappings_json(attention_mappings())),
            prop("custom.cellOptions", coloured_cell),
        ],
    )
    t = t.override_by_name("since", [prop("unit", style.SECONDS)])
    t = t.override_by_name(
        "stall budget",
        [
            prop("unit", style.RATIO),
            prop("custom.cellOptions", {"type": "color-text"}),
            prop("thresholds", _thresholds_json(style.OK, (0.5, style.WARN), (1, style.BAD))),
        ],
    )
    t = t.override_by_name(
        "verdict",
        [
            prop("mappings", _mappings_json(verdict_mappings())),
            prop("custom.cellOptions", coloured_cell),
        ],
    )
    t = t.override_by_name(
        "reason",
        [
            prop("mappings", _mappings_json(reason_mappings())),
            prop("custom.cellOptions", {"type": "color-text"}),
        ],
    )
    t = t.override_by_name(
        "change",
        [
            prop("mappings", _mappings_json(change_mappings())),
            prop("custom.cellOptions", {"type": "color-text"}),
        ],
    )
    t = t.override_by_name("throughput", [prop("unit", "short"), prop("decimals", 0)])
    t = t.override_by_name("step time", [prop("unit", style.SECONDS)])
    t = t.override_by_name("since last step", [prop("unit", style.SECONDS)])
    t = t.override_by_name(
        "GPU busy",
        [
            prop("unit", style.RATIO),
            prop("custom.cellOptions", {"type": "color-text"}),
            prop("thresholds", _thresholds_json(style.BAD, (c.alerts["gpu_idle_ratio"], style.OK))),
        ],
    )
    t = t.override_by_name(  # lost, bad XID, uncorrectable ECC, failed row remap
        "GPUs with errors",
        [
            prop("custom.cellOptions", {"type": "color-background", "mode": "basic"}),
            prop("thresholds", _thresholds_json("transparent", (1, style.BAD))),
        ],
    )
    t = t.override_by_name(
        "firing alerts",
        [
            prop("custom.cellOptions", {"type": "color-background", "mode": "basic"}),
            prop("thresholds", _thresholds_json("transparent", (1, style.BAD))),
        ],
    )
    t = t.override_by_name(
        "experiment",
        [
            prop(
                "links",
                [{"title": "Open the job dashboard", "url": JOB_LINK, "targetBlank": False}],
            )
        ],
    )
    return t


def _transformation(id_: str, options: dict[str, Any]) -> DataTransformerConfig:
    return DataTransformerConfig(id_val=id_, options=options)


def _mappings_json(mappings: Mapping[int, tuple[str, str]]) -> list[Any]:
    return [m.to_json() for m in value_mappings(mappings)]


def _thresholds_json(base: str, *steps: tuple[float, str]) -> dict[str, Any]:
    return thresholds(base, *steps).build().to_json()


def _sort(name: str) -> TableSortByFieldState:
    return TableSortByFieldState().display_name(name).desc(True)
