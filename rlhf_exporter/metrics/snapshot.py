"""What sources publish and the collector reads: immutable series and health.

Sources build `Snapshot`s; the collector turns them into metric families at scrape time.
Both import from here, so no import climbs back up a layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple


class Sample(NamedTuple):
    """One series: a catalog metric name, its label values in catalog order, a value."""

    name: str
    labels: tuple[str, ...]
    value: float


@dataclass(frozen=True, init=False)
class Snapshot:
    """What a source knows right now. Replaced whole, never changed in place.

    A source with many jobs publishes each job's samples as one tuple in `parts` (the same
    tuple object for as long as the job's series are unchanged) and its other samples in
    `rest`: a new step of one job then costs a new `parts` tuple of references, never a copy
    of every job's samples. Consumers iterate `series()`; `samples` (every sample, flattened)
    is built on first use only, for readers that want one tuple."""

    collector: str
    up: bool = False
    duration: float = 0.0  # seconds the last collection took
    last_success: float | None = None  # unix time of the last successful collection
    errors: Mapping[str, int] = field(default_factory=dict)  # failed collections by reason
    records: int | None = None  # input records ingested (sources that take records)
    record_errors: Mapping[str, int] = field(default_factory=dict)  # rejected input by reason
    rest: tuple[Sample, ...] = ()  # the samples that are in no part (all, without parts)
    created: float = field(default_factory=time.time)
    parts: tuple[tuple[Sample, ...], ...] = ()  # per-job sample tuples, served before `rest`

    def __init__(
        self,
        collector: str,
        up: bool = False,
        duration: float = 0.0,
        last_success: float | None = None,
        errors: Mapping[str, int] | None = None,
        records: int | None = None,
        record_errors: Mapping[str, int] | None = None,
        rest: tuple[Sample, ...] = (),
        created: float | None = None,
        parts: tuple[tuple[Sample, ...], ...] = (),
        *,
        samples: tuple[Sample, ...] | None = None,
    ):
        """`samples=` is the former contract, kept for callers written against it: every
        sample, beginning with the parts' (those are cut off into `rest`'s place)."""
        if samples is not None:
            rest = tuple(samples)[sum(map(len, parts)) :]
        init = object.__setattr__
        init(self, "collector", collector)
        init(self, "up", up)
        init(self, "duration", duration)
        init(self, "last_success", last_success)
        init(self, "errors", {} if errors is None else errors)
        init(self, "records", records)
        init(self, "record_errors", {} if record_errors is None else record_errors)
        init(self, "rest", rest)
        init(self, "created", time.time() if created is None else created)
        init(self, "parts", parts)

    def series(self) -> Iterator[Sample]:
        """Every sample: each part's in order, then `rest`'s."""
        for part in self.parts:
            yield from part
        yield from self.rest

    @cached_property
    def samples(self) -> tuple[Sample, ...]:
        """Every sample as one tuple (flattened on first use, then kept)."""
        if not self.parts:
            return self.rest
        return tuple(self.series())


SnapshotFn = Callable[[], Snapshot]
"""A source's `snapshot` method: what the exposition and the server read."""
