"""The fleet dashboard's row on the senders into the fleet's store: how far each cluster's
Prometheus (or vmagent) is behind in remote-writing what it scraped (the record and alert of
rlhf_exporter/render/rules/remotewrite.py)."""

from __future__ import annotations

from ..rules.remotewrite import LAG, LAG_FOR_S, LAG_LIMIT_S
from . import style
from .context import DashboardContext
from .layout import Cell, Row
from .panels import PanelBuilder, Q, threshold_line, time_series
from .queries import RANGE, TARGET, TOP, at_end, sel, worst

BY_SENDER = "cluster, job, instance, url"
"""A sender's queue: one Prometheus (or vmagent) of one cluster, to one store URL."""


def remote_write_lag(c: DashboardContext) -> PanelBuilder:
    lag = f"max by ({BY_SENDER}) ({sel(LAG, scope=TARGET)})"
    score = f"max by ({BY_SENDER}) (max_over_time({at_end(sel(LAG, scope=TARGET) + f'[{RANGE}]')}))"
    return threshold_line(
        time_series(
            "Remote-write lag per sender",
            "How many seconds each cluster's Prometheus (or vmagent) is behind in sending what "
            "it scraped to the fleet's store (the record instance_url:remote_write_lag:seconds): "
            "for Prometheus, its newest sample minus the newest its queue sent; for vmagent, "
            "its pending bytes over its recent send rate. The "
            f"{TOP} highest in the time range. Above the dashed line ({LAG_LIMIT_S:g} s) for "
            f"{LAG_FOR_S / 60:g} minutes, RLHFRemoteWriteBehind fires. The senders' own metrics "
            "must be scraped; they carry their own namespace, not a job's: keep the namespace "
            "variable at All.",
            [Q(worst(lag, score, by=BY_SENDER), "{{cluster}} {{instance}} to {{url}}")],
            style.SECONDS,
            fill=0,
        ).min(0),
        LAG_LIMIT_S,
    )


def store_row(c: DashboardContext) -> Row:
    return Row(500, "Into the fleet's store", [Cell(remote_write_lag(c), w=24, h=8)])
