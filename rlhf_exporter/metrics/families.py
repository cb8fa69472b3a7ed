"""Scrape time: snapshots in, fresh metric families out. No I/O, no waiting, no mutation.

In the manner of prometheus_client's custom collectors: each scrape builds new families
from the immutable snapshots the sources last published.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as Family

from .. import __version__
from .catalog import BY_NAME, COUNTER, KNOWN_ERRORS, Metric
from .snapshot import Sample, Snapshot


def new_family(metric: Metric) -> Family:
    if metric.type == COUNTER:
        return CounterMetricFamily(
            metric.name.removesuffix("_total"), metric.summary, labels=metric.labels
        )
    return GaugeMetricFamily(metric.name, metric.summary, labels=metric.labels)


def health_samples(snap: Snapshot) -> tuple[Sample, ...]:
    """A snapshot's own health as samples (collector_up, errors, records, ...)."""
    c = (snap.collector,)
    out = [
        Sample("rlhf_exporter_collector_up", c, 1.0 if snap.up else 0.0),
        Sample("rlhf_exporter_collector_duration_seconds", c, snap.duration),
    ]
    if snap.last_success is not None:
        out.append(
            Sample("rlhf_exporter_collector_last_success_timestamp_seconds", c, snap.last_success)
        )
    known = KNOWN_ERRORS.get(snap.collector, {})
    for name, counts in (
        ("rlhf_exporter_collector_errors_total", snap.errors),
        ("rlhf_exporter_record_errors_total", snap.record_errors),
    ):
        if name == "rlhf_exporter_record_errors_total" and snap.records is not None:
            out.append(Sample("rlhf_exporter_records_total", c, snap.records))
        for reason in known.get(name, ()):  # known reasons start at 0 (increase() sees a 1st)
            if reason not in counts:
                out.append(Sample(name, (snap.collector, reason), 0.0))
        for reason, n in counts.items():
            out.append(Sample(name, (snap.collector, reason), n))
    return tuple(out)


def build_info() -> Sample:
    return Sample("rlhf_exporter_build_info", (__version__,), 1.0)


def _process_start() -> float:
    """When this process started: /proc/self/stat's start time after boot, else now (the
    module is imported as the exporter starts)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


PROCESS_START = _process_start()


def process_samples() -> tuple[Sample, ...]:
    """The exporter's own identity: its version and when its process started."""
    return (build_info(), Sample("process_start_time_seconds", (), PROCESS_START))


def _check(sample: Any) -> tuple[Metric, tuple[str, ...], float] | str:
    """(metric, labels, value) of a servable sample, or why it cannot be served."""
    try:
        name, labels, value = sample
    except (TypeError, ValueError):
        return "malformed"
    metric = BY_NAME.get(name) if isinstance(name, str) else None
    if metric is None:
        return "unknown_metric"
    if (
        not isinstance(labels, tuple)
        or len(labels) != len(metric.labels)
        or not all(isinstance(v, str) for v in labels)
    ):
        return "bad_labels"
    if isinstance(value, (str, bytes)):
        return "bad_value"
    try:
        return metric, labels, float(value)
    except (TypeError, ValueError):
        return "bad_value"


def add_samples(
    by_name: dict[str, Any],
    samples: Iterable[Any],
    collector: str = "",
    dropped: Counter[tuple[str, str]] | None = None,
) -> None:
    """Add samples to families keyed by catalog name (made in first-seen order).

    A sample the catalog cannot serve (unknown name, wrong label count or types, a value
    that is not a number) is left out and counted in `dropped` by (collector, reason): one
    bad sample never fails the whole scrape."""
    for sample in samples:
        checked = _check(sample)
        if isinstance(checked, str):
            if dropped is not None:
                dropped[collector, checked] += 1
            continue
        metric, labels, value = checked
        family: Any = by_name.get(metric.name)
        if family is None:
            family = by_name[metric.name] = new_family(metric)
        family.add_metric(labels, value)  # a Counter/GaugeMetricFamily


def families(
    snapshots: Sequence[Snapshot], dropped: Counter[tuple[str, str]] | None = None
) -> list[Family]:
    """Every family for these snapshots, in catalog order, empty families left out.

    Within a family, samples keep their order: build_info, then each snapshot's health and
    its samples. Unservable samples are dropped (and counted in `dropped`)."""
    by_name: dict[str, Family] = {}
    add_samples(by_name, process_samples())
    for snap in snapshots:
        add_samples(by_name, health_samples(snap), snap.collector, dropped)
        add_samples(by_name, snap.series(), snap.collector, dropped)
    return [by_name[name] for name in BY_NAME if name in by_name]
