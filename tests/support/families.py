"""prometheus_client views of the exporter's snapshots, for tests that parse families
directly (the server itself serves `rlhf_exporter.metrics.exposition`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric as Family

from rlhf_exporter.metrics.families import families
from rlhf_exporter.metrics.snapshot import Sample, Snapshot


class SnapshotCollector:
    """A prometheus_client collector over a fixed list of sources' `snapshot` methods."""

    def __init__(self, snapshot_fns: Iterable[Callable[[], Snapshot]]):
        self._fns = tuple(snapshot_fns)

    def collect(self) -> Iterator[Family]:
        return iter(families([fn() for fn in self._fns]))

    def describe(self) -> Iterator[Family]:
        return iter(())  # no fixed description: avoids a collect() at registration


def render_samples(samples: Iterable[Sample]) -> list[Family]:
    """Families for a bare list of samples (one job's, say)."""
    return families([Snapshot("adhoc", True, rest=tuple(samples))])
