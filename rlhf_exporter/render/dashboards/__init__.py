"""Grafana dashboards as code: `rlhf-exporter render dashboards` writes grafana/*.json.

The definitions are small Python modules (`job/`, one module per row, and `fleet`): one
function per panel taking a frozen `context.DashboardContext`, one function per row placing
those panels (`layout.Row`; their ids follow from their place), and a `build` that puts the
shared header (`layout.header`) above the rows, in the style of
grafana-foundation-sdk's examples. Shared helpers: `panels` (panel kinds), `queries`
(PromQL), `style` (colours and units). grafana-foundation-sdk (pinned in the `dashboards` extra) is imported
only when rendering, never by `serve` or `diagnose`.
"""

from __future__ import annotations

from ...diagnosis import Thresholds
from ..addresses import FLEET_PATH, JOB_PATH

ORDER = 25


def targets(thresholds: Thresholds) -> dict[str, str]:
    try:
        from . import fleet, job
    except ImportError as exc:  # the SDK is a rendering dependency only
        from .. import MissingExtra

        raise MissingExtra(
            "dashboards", "dashboards", "grafana-foundation-sdk==1769699379!11.6.0", str(exc)
        ) from exc
    return {JOB_PATH: job.render(thresholds), FLEET_PATH: fleet.render(thresholds)}
