"""A Prometheus (or vmagent) that falls behind in sending to the fleet's store.

Their own file, `alerts/remote-write.rules.yaml`: one record, the seconds each sender's
remote-write queue is behind what it scraped, and one alert on it. The inputs are the
senders' own metrics, so the sender must be scraped (a Prometheus scraping itself, as
kube-prometheus-stack does; vmagent's `/metrics`):

- Prometheus: the newest sample appended to its WAL minus the newest sample its queue sent
  (`prometheus_remote_storage_highest_timestamp_in_seconds`,
  `prometheus_remote_storage_queue_highest_sent_timestamp_seconds`); a queue that has sent
  nothing yet is left out;
- vmagent: its pending bytes (memory and disk buffer) divided by the bytes per second it
  sent over the window: how long sending what is pending takes at that rate (vmagent keeps
  no timestamp of what it sent). A store that takes nothing makes it infinite.

Evaluate it where the sender's metrics are: in each cluster's Prometheus (the lag of a full
Prometheus is known there even while the store is down), or centrally in vmalert for agents,
which then sees an agent's lag only once its metrics arrive.
"""

from __future__ import annotations

from typing import Any

from .model import Alert, Context, alert_prose, duration, runbook

REMOTE_WRITE_FILE = "alerts/remote-write.rules.yaml"
LAG = "instance_url:remote_write_lag:seconds"
LAG_LIMIT_S = 120.0
"""Behind by more than this (seconds) pages: twice a default queue's longest back-off cycle,
so a store restart or a burst never does, a store down for minutes does."""
LAG_FOR_S = 300.0
"""How long the lag must stay above its limit (a queue catching up after an outage falls by
about its send rate: minutes for a 5-minute gap at the fleet's rates, measured in
docs/fleet.md)."""
RATE_WINDOW_S = 300.0
"""vmagent's send rate is averaged over this long."""


def records(ctx: Context) -> list[dict[str, str]]:
    return [
        {
            "record": LAG,
            "expr": (
                "prometheus_remote_storage_highest_timestamp_in_seconds\n"
                "- ignoring (remote_name, url) group_right ()\n"
                "(prometheus_remote_storage_queue_highest_sent_timestamp_seconds > 0)"
            ),
        },
        {
            "record": LAG,
            "expr": (
                "vmagent_remotewrite_pending_data_bytes\n"
                "/ ignoring (path)\n"
                f"rate(vmagent_remotewrite_bytes_sent_total[{duration(ctx.scale * RATE_WINDOW_S)}])"
            ),
        },
    ]


def behind(ctx: Context) -> Alert:
    text = alert_prose("RLHFRemoteWriteBehind", {"limit": duration(LAG_LIMIT_S)})
    return Alert(
        name="RLHFRemoteWriteBehind",
        expr=f"{LAG} > {LAG_LIMIT_S * ctx.scale:g}",
        for_=duration(LAG_FOR_S * ctx.scale),
        severity="warning",
        category="store",
        summary=text.summary,
        description=text.description,
        runbook=runbook("RLHFRemoteWriteBehind", [LAG, f"{LAG} > {LAG_LIMIT_S:g}"]),
    )


def alerts(ctx: Context) -> list[Alert]:
    return [behind(ctx)]


def groups(ctx: Context) -> list[dict[str, Any]]:
    base = ctx.a["runbook_url"]
    return [
        {"name": "rlhf-exporter.remote-write.recording", "rules": records(ctx)},
        {"name": "rlhf-exporter.remote-write", "rules": [a.rule(base) for a in alerts(ctx)]},
    ]
