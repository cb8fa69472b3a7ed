"""The job dashboard's "Exporter health" row: whether each collector reads, how long it
takes, what it ingests and rejects."""

from __future__ import annotations

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    said,
    state_timeline,
    time_series,
)
from ..queries import (
    MAX_SERIES,
    RATE,
    TARGET,
    TOP,
    on_job_exporters,
    sel,
    steady,
    worst,
)

PER_COLLECTOR = "cluster, instance, collector"


PER_REASON = "cluster, instance, collector, reason"


def collector_up(c: DashboardContext) -> PanelBuilder:
    alerts = c.alerts
    up = on_job_exporters(sel("rlhf_exporter_collector_up", scope=TARGET))
    return state_timeline(
        "Collector up",
        "1 (green) when each collector's last collection succeeded, per exporter of the "
        f"selected job (the {MAX_SERIES} first, down ones first)."
        + said(alerts, " A collector down for {collector_down_for} fires an alert.")
        + " A failing collector's series are dropped, so gaps on the other panels start here.",
        [
            Q(
                worst(up, steady(up), by=PER_COLLECTOR, k=MAX_SERIES, lowest=True),
                "{{instance}} {{collector}}",
            )
        ],
        {0: ("down", style.BAD), 1: ("up", style.OK)},
    )


def collection_duration(c: DashboardContext) -> PanelBuilder:
    duration = on_job_exporters(sel("rlhf_exporter_collector_duration_seconds", scope=TARGET))
    return time_series(
        "Collection duration",
        "Seconds each collector's last collection took, on the selected job's exporters (the "
        f"{TOP} slowest). Slow collections happen in the background and never hold a scrape.",
        [Q(worst(duration, steady(duration), by=PER_COLLECTOR), "{{instance}} {{collector}}")],
        style.SECONDS,
        fill=0,
    )


def records_ingested(c: DashboardContext) -> PanelBuilder:
    def rate_of(metric: str, by: str) -> str:
        return f"sum by ({by}) (\n  {on_job_exporters(f'rate({sel(metric, scope=TARGET)}[{RATE}])')}\n)"

    zero_per_collector = f"0 * {rate_of('rlhf_exporter_records_total', PER_COLLECTOR)}"
    ingested = rate_of("rlhf_exporter_records_total", PER_COLLECTOR)
    rejected = (
        f"{rate_of('rlhf_exporter_record_errors_total', PER_REASON)}\nor {zero_per_collector}"
    )
    failed = (
        f"{rate_of('rlhf_exporter_collector_errors_total', PER_REASON)}\nor {zero_per_collector}"
    )
    # 8 + 6 + 6 series at most: the busiest collectors, the most frequent rejections
    return time_series(
        "Records ingested and rejected",
        "Input records ingested per second, rejected input by reason (bad input is counted, "
        "never fatal) and failed collections by reason, on the selected job's exporters (the "
        "busiest collectors and the most frequent reasons). A collector without any rejection "
        "or failure shows a line at 0.",
        [
            Q(
                worst(ingested, steady(ingested), by=PER_COLLECTOR, k=8),
                "{{instance}} {{collector}} ingested",
            ),
            Q(
                worst(rejected, steady(rejected), by=PER_REASON, k=6),
                "{{instance}} {{collector}} rejected {{reason}}",
            ),
            Q(
                worst(failed, steady(failed), by=PER_REASON, k=6),
                "{{instance}} {{collector}} failed {{reason}}",
            ),
        ],
        "reqps",
        fill=0,
    )


def health_row(c: DashboardContext) -> Row:
    return Row(
        800,
        "Exporter health",
        [
            Cell(collector_up(c), w=12, h=7),
            Cell(collection_duration(c), w=6, h=7),
            Cell(records_ingested(c), w=6, h=7),
        ],
    )
