"""Scrape time: snapshots in, fresh metric families out. No I/O, no waiting, no mutation.

In the manner of prometheus_client's custom collectors: each scrape builds new families
from the immutable snapshots the sources last published.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as Family

from .. import __version__
from .catalog import BY_NAME, COUNTER, Metric
from .snapshot import Sample, Snapshot

SnapshotFn = Callable[[], Snapshot]
log = logging.getLogger(__name__)


def new_family(metric: Metric) -> Family:
    if metric.type == COUNTER:
        return CounterMetricFamily(
            metric.name.removesuffix("_total"), metric.help, labels=metric.labels
        )
    return GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)


def families(snapshots: Sequence[Snapshot]) -> list[Family]:
    """Every family for these snapshots, in catalog order, empty families left out."""
    by_name: dict[str, Family] = {}

    def add(name: str, labels: tuple[str, ...], value: float) -> None:
        family = by_name.get(name)
        if family is None:
            family = by_name[name] = new_family(BY_NAME[name])
        family.add_metric(labels, value)

    add("rlhf_exporter_build_info", (__version__,), 1.0)
    for snap in snapshots:
        c = (snap.collector,)
        add("rlhf_exporter_collector_up", c, 1.0 if snap.up else 0.0)
        add("rlhf_exporter_collector_duration_seconds", c, snap.duration)
        if snap.last_success is not None:
            add("rlhf_exporter_collector_last_success_timestamp_seconds", c, snap.last_success)
        for reason, n in snap.errors.items():
            add("rlhf_exporter_collector_errors_total", (snap.collector, reason), n)
        if snap.records is not None:
            add("rlhf_exporter_records_total", c, snap.records)
        for reason, n in snap.record_errors.items():
            add("rlhf_exporter_record_errors_total", (snap.collector, reason), n)
        try:  # last resort: a bad sample costs its source's remaining series, not the scrape
            for sample in snap.samples:
                add(*sample)
        except Exception:
            log.error("bad sample from %s dropped with the rest of its samples", snap.collector,
                      exc_info=True, extra={"collector": snap.collector})  # fmt: skip
    order = {name: i for i, name in enumerate(BY_NAME)}
    return sorted(by_name.values(), key=lambda f: order[_catalog_name(f)])


def _catalog_name(family: Family) -> str:
    return family.name + "_total" if family.type == COUNTER else family.name


class SnapshotCollector:
    """A prometheus_client collector over a fixed list of sources' `snapshot` methods."""

    def __init__(self, snapshot_fns: Iterable[SnapshotFn]):
        self._fns = tuple(snapshot_fns)

    def collect(self) -> Iterator[Family]:
        return iter(families([fn() for fn in self._fns]))

    def describe(self) -> Iterator[Family]:
        return iter(())  # no fixed description: avoids a collect() at registration


def render_samples(samples: Iterable[Sample]) -> list[Family]:
    """Families for a bare list of samples (tests, `diagnose --format prom`)."""
    return families([Snapshot("adhoc", True, samples=tuple(samples))])
