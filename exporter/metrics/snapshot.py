"""What sources publish and the collector reads: immutable series and health.

Sources build `Snapshot`s; the collector turns them into metric families at scrape time.
Both import from here, so no import climbs back up a layer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class Sample(NamedTuple):
    """One series: a catalog metric name, its label values in catalog order, a value."""

    name: str
    labels: tuple[str, ...]
    value: float


@dataclass(frozen=True)
class Snapshot:
    """What a source knows right now. Replaced whole, never changed in place."""

    collector: str
    up: bool = False
    duration: float = 0.0  # seconds the last collection took
    last_success: float | None = None  # unix time of the last successful collection
    errors: Mapping[str, int] = field(default_factory=dict)  # failed collections by reason
    records: int | None = None  # input records ingested (sources that take records)
    record_errors: Mapping[str, int] = field(default_factory=dict)  # rejected input by reason
    samples: tuple[Sample, ...] = ()
    created: float = field(default_factory=time.time)
    # Optional grouping of `samples` for incremental exposition: when set, `samples` begins
    # with these tuples' samples, in order (one tuple per job, the same tuple object for as
    # long as the job's series are unchanged), followed by the snapshot's other samples.
    parts: tuple[tuple[Sample, ...], ...] = ()
