"""The job dashboard: "RLHF job: where the step time goes".

One verl job (project and experiment are single-select, without "All"): the decision table's
verdict over time with its reason, the step's windows, the change against the job's own
baseline, and the evidence each reason is decided on; the job's alerts are annotations over
every panel. Thresholds drawn on panels come from the thresholds file.

One module per row, in the order of `ROWS` (the GPU health row is `..gpuhealth`): one small
function per panel and a `..._row` function placing them."""

from __future__ import annotations

from ....diagnosis import Thresholds
from ...addresses import FLEET_UID, JOB_UID
from .. import style
from ..context import DashboardContext
from ..gpuhealth import gpu_health_row
from ..layout import Board, header
from ..queries import BY_JOB, JOB_LEGEND, eq, sel
from .anatomy import anatomy_row
from .change import change_row
from .efficiency import efficiency_row
from .engines import engines_row
from .gpu import gpu_row
from .health import health_row
from .ray import ray_row
from .rollout import rollout_row
from .verdict import verdict_row

TITLE = "RLHF job: where the step time goes"
DESCRIPTION = (
    "Where one verl job's step time goes, step by step: the decision-table verdict, "
    "the windows behind it, and whether a slowdown is a workload shift or a regression."
)
FLEET_LINK = (
    f"/d/{FLEET_UID}/rlhf-fleet?${{datasource:queryparam}}"
    "&${cluster:queryparam}&${namespace:queryparam}"
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
