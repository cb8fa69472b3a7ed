"""GPU health panels: a row of the job dashboard (per node and GPU role) and the
fleet table's "GPUs with errors" column. Every GPU series carries the job its node serves,
so the panels select by the job, across all of its nodes (rlhf_exporter/sources/nvml.py)."""

from __future__ import annotations

from ...diagnosis.xid import BAD_GPU, regex
from ..rules import gpuhealth as rules
from . import style
from .context import DashboardContext
from .layout import Cell, Row
from .panels import PanelBuilder, Q, said, threshold_line, time_series
from .queries import BY_JOB, RANGE, RATE, sel

NODE_GPU = "{{instance}} GPU {{gpu}}"
UNCORRECTED = ('error="uncorrected"', 'scope="volatile"')


def gpu_errors(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "GPU errors by node and role",
        "Per interval, on every node serving the job: NVML errors (a lost GPU: gpu_is_lost), "
        "XID critical errors by code, and uncorrectable ECC errors, by node and GPU role. "
        f"XIDs {regex(BAD_GPU).replace('|', ', ')} mean a bad GPU and page; application XIDs "
        "(13, 31, 43, 45, ...) do not (docs/dcgm-exporter.md).",
        [
            Q(
                f"sum by (cluster, instance, gpu_role, reason) (increase({sel('rlhf_gpu_errors_total')}[{RATE}]))"
                f"\nor 0 * count by (cluster, instance) ({sel('rlhf_gpu_info')})",
                "{{instance}} {{gpu_role}} {{reason}}",
            ),
            Q(
                f"sum by (cluster, instance, gpu_role, xid) (increase({sel('rlhf_gpu_xid_errors_total')}[{RATE}]))"
                f"\nor 0 * count by (cluster, instance) ({sel('rlhf_gpu_info')})",
                "{{instance}} {{gpu_role}} XID {{xid}}",
            ),
            Q(
                "sum by (cluster, instance, gpu_role) (increase("
                f"{sel('rlhf_gpu_ecc_errors_total', *UNCORRECTED)}[{RATE}]))",
                "{{instance}} {{gpu_role}} uncorrectable ECC",
            ),
        ],
        style.PLAIN,
        bars=True,
        calcs=("sum",),
    ).min(0)


def _flag(names: tuple[str, ...], label: str) -> str:
    """1 where any GPU of the node and role has one of `names` at 1, as one series `label`."""
    either = "\nor ".join(sel(n) for n in names)
    return f'label_replace(max by (cluster, instance, gpu_role) (\n{either}\n), "repair", "{label}", "", "")'


def memory_repairs(c: DashboardContext) -> PanelBuilder:
    # per node and role, not per GPU: an 8-GPU node would draw 32 series
    return time_series(
        "Memory repairs: remapped rows, retired pages",
        "Rows remapped (A100 and later) or pages retired (older GPUs), summed over the GPUs "
        "of each node and GPU role, and whether any of them waits for a GPU reset to finish "
        "a repair (pending: 1) or has a repair that failed (failed: 1, the GPU needs "
        "service). Per GPU: rlhf_gpu_remapped_rows.",
        [
            Q(  # the causes tell them apart: correctable, uncorrectable rows; pages by ECC kind
                f"sum by (cluster, instance, gpu_role, cause) ({sel('rlhf_gpu_remapped_rows')})\n"
                f"or sum by (cluster, instance, gpu_role, cause) ({sel('rlhf_gpu_retired_pages')})",
                "{{instance}} {{gpu_role}} {{cause}}",
            ),
            Q(
                _flag(("rlhf_gpu_row_remap_pending", "rlhf_gpu_retired_pages_pending"), "pending")
                + "\nor "
                + _flag(("rlhf_gpu_row_remap_failed",), "failed"),
                "{{instance}} {{gpu_role}} {{repair}}",
            ),
        ],
        style.PLAIN,
        fill=0,
    ).min(0)


def throttle_reasons(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Clock throttling by reason, node and role",
        "Share of time the GPUs' clocks were held down, by reason (power_cap: at the power "
        "limit, normal at full load; sw_thermal, hw_thermal: heat; hw_slowdown, "
        "hw_power_brake: hardware protection), averaged per node and GPU role.",
        [
            Q(
                f"avg by (cluster, instance, gpu_role, reason) (rate({sel('rlhf_gpu_throttle_seconds_total')}[{RATE}]))",
                "{{instance}} {{gpu_role}} {{reason}}",
            )
        ],
        style.RATIO,
        fill=0,
    ).min(0)


def throttled_windows(c: DashboardContext) -> PanelBuilder:
    ratio = c.alerts.get("gpu_throttle_ratio", 0.2)
    return threshold_line(
        time_series(
            "Throttled share of the step windows",
            "GPU-seconds of each step-window group held down by heat or hardware, over the "
            "GPU-seconds of that group, per GPU role, summed over the job's nodes. Above "
            f"{ratio:g} (dashed) in rollout or update windows for "
            + said(c.alerts, "{gpu_throttle_for}")
            + " fires RLHFGPUThrottledInWindow, naming the window.",
            [
                Q(
                    f"sum by (group, gpu_role) (increase({sel(rules.THROTTLED)}[{RATE}]))\n"
                    f"/ (sum by (group, gpu_role) (increase({sel(rules.TOTAL)}[{RATE}])) > 0)",
                    "{{gpu_role}} {{group}}",
                )
            ],
            style.RATIO,
            fill=0,
        ).min(0),
        float(ratio),
        style.WARN,
    )


def temperature(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "GPU temperature",
        "Temperature per GPU on every node serving the job (NVML): heat is what the thermal "
        "throttle reasons react to.",
        [Q(sel("rlhf_gpu_temperature_celsius"), NODE_GPU)],
        "celsius",
        fill=0,
    )


def power(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "GPU power",
        "Power draw per GPU on every node serving the job (NVML): a GPU at its power limit "
        "shows the power_cap throttle reason.",
        [Q(sel("rlhf_gpu_power_watts"), NODE_GPU)],
        "watt",
        fill=0,
    ).min(0)


def sm_clock(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "GPU SM clock",
        "Streaming-multiprocessor clock per GPU (NVML): a drop while busy is throttling.",
        [Q(sel("rlhf_gpu_sm_clock_hertz"), NODE_GPU)],
        "hertz",
        fill=0,
    ).min(0)


def gpu_health_row(c: DashboardContext) -> Row:
    return Row(
        650,
        "GPU health (NVML), every node serving the selected jobs",
        [
            Cell(gpu_errors(c), w=12, h=8),
            Cell(memory_repairs(c), w=12, h=8),
            Cell(throttle_reasons(c), w=12, h=8),
            Cell(throttled_windows(c), w=12, h=8),
            Cell(temperature(c), w=8, h=7),
            Cell(power(c), w=8, h=7),
            Cell(sm_clock(c), w=8, h=7),
        ],
    )


# -- the fleet table's column ------------------------------------------------------------------
def gpus_with_errors_query(ctx: DashboardContext) -> str:
    """GPUs (distinct node and uuid) of each job that were lost, raised a bad-GPU XID, had an
    uncorrectable ECC error or a failed row remap in the time range (a record present only
    for such a GPU, every `alerts.gpu_interval`); 0 for a job whose GPUs are known and
    healthy, no cell for a job without GPU series."""
    bad = f"max_over_time({sel(rules.with_errors(ctx.rules))}[{RANGE}])"
    return (
        f"count by ({BY_JOB}) (max by ({BY_JOB}, instance, uuid) (\n  {bad}\n))\n"
        f"or 0 * count by ({BY_JOB}) ({sel('rlhf_gpu_info')})"
    )


def gpus_with_errors_column(ctx: DashboardContext) -> tuple[str, Q]:
    return ("GPUs with errors", Q(gpus_with_errors_query(ctx), table=True, instant=True))
