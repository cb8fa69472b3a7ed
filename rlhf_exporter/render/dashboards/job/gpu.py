"""The job dashboard's "GPUs (NVML)" row: busy and memory per GPU, and GPU time by step
window and role."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    said,
    threshold_line,
    time_series,
)
from ..queries import (
    BY_EXPORTER,
    MAX_SERIES,
    RATE,
    TOP,
    sel,
    steady,
    worst,
)

PER_GPU = f"{BY_EXPORTER}, gpu"


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
