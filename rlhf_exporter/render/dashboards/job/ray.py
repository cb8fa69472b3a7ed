"""The job dashboard's "Ray actors" row: the job's actors, their restarts and deaths."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    said,
    time_series,
)
from ..queries import (
    RATE,
    TARGET,
    on_sole_job_exporters,
    sel,
)


def ray_actors(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    return time_series(
        "Ray actors by role and state",
        "Actors of the Ray cluster the exporter reads, per role and state (ALIVE, "
        "PENDING_CREATION, RESTARTING, DEAD), from an exporter that serves the selected job "
        "alone (its head sidecar): a fleet exporter's one shared cluster is no single job's, "
        "so it is shown for none."
        + said(
            alerts,
            " Actors stuck in PENDING_CREATION "
            "for {pending_for} fire an alert: the cluster cannot place them.",
        ),
        [
            Q(
                f"sum by (role, state) ({on_sole_job_exporters(sel('rlhf_ray_actors', scope=TARGET))})",
                "{{role}} {{state}}",
            )
        ],
        style.PLAIN,
        stacked=True,
    )


def actor_restarts_and_deaths(c: DashboardContext) -> PanelBuilder:
    restarts = f"increase({sel('rlhf_ray_actor_restarts_total', scope=TARGET)}[{RATE}])"
    deaths = f"increase({sel('rlhf_ray_actor_deaths_total', scope=TARGET)}[{RATE}])"
    return time_series(
        "Actor restarts and deaths",
        "Restarts seen (growth of num_restarts) and actors that became DEAD, by role and "
        "death reason, per interval; a role without deaths shows a line at 0.",
        [
            Q(f"sum by (role) ({on_sole_job_exporters(restarts)})", "{{role}} restarts"),
            Q(
                f"sum by (role, reason) ({on_sole_job_exporters(deaths)})\n"
                f"or 0 * sum by (role) ({on_sole_job_exporters(restarts)})",
                "{{role}} died {{reason}}",
            ),
        ],
        style.PLAIN,
        bars=True,
        calcs=("sum",),
    )


def ray_row(c: DashboardContext) -> Row:
    return Row(
        700,
        "Ray actors",
        [
            Cell(ray_actors(c), w=16, h=8),
            Cell(actor_restarts_and_deaths(c), w=8, h=8),
        ],
    )
