"""The job dashboard's "Efficiency" row: model FLOPs utilization and memory."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    threshold_line,
    time_series,
)
from ..queries import (
    JOB_LEGEND,
    sel,
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


def efficiency_row(c: DashboardContext) -> Row:
    return Row(
        400,
        "Efficiency: model FLOPs utilization and memory",
        [
            Cell(mfu_by_stage(c), w=12, h=8),
            Cell(actor_memory_peak(c), w=12, h=8),
        ],
    )
