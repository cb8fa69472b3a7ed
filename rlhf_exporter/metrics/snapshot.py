"""What sources publish and the collector reads: immutable series and health.

Sources build `Snapshot`s; the collector turns them into metric families at scrape time.
Both import from here, so no import climbs back up a layer.
"""

from __future__ import annotations

import time
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, overload


class Sample(NamedTuple):
    """One series: a catalog metric name, its label values in catalog order, a value."""

    name: str
    labels: tuple[str, ...]
    value: float


class Problem(NamedTuple):
    """A mistake in how the exporter is set up that keeps it from seeing a job (a verl root
    one level off, a missing root, a file in another format): a short, fixed statement of
    what is wrong and what to change, shown on `/`, logged once and listed in
    `GET /api/v1/status`. Never raw input text: paths come from the operator's own
    settings, shortened (`short_path`)."""

    source: str  # the collector that found it (`verl`), or `exporter`
    kind: str  # a fixed label: files_in_root, files_too_deep, root_missing, not_verl_records...
    message: str  # what is wrong
    hint: str  # what to change

    def to_json(self) -> dict[str, str]:
        return self._asdict()


PATH_SHOWN = 160  # characters of a path a problem shows (its end, where the names are)


def short_path(path: str) -> str:
    """A path as a problem shows it: at most PATH_SHOWN characters (its last ones)."""
    return path if len(path) <= PATH_SHOWN else "..." + path[-(PATH_SHOWN - 3) :]


Row = tuple[str, tuple[str, ...], float]
"""A job's sample without the job's own labels: name, the label values after them, value."""


class Layout:
    """The names and trailing label values of a job's series, in order. Jobs with the same
    series (most jobs of one verl version) share one `Layout`: it lives while one of their
    `PackedSamples` does (`_LAYOUTS` holds it weakly)."""

    __slots__ = ("__weakref__", "extras", "names")

    def __init__(self, names: tuple[str, ...], extras: tuple[tuple[str, ...], ...]):
        self.names, self.extras = names, extras


_LAYOUTS: weakref.WeakValueDictionary[
    tuple[tuple[str, ...], tuple[tuple[str, ...], ...]], Layout
] = weakref.WeakValueDictionary()


class PackedSamples(Sequence[Sample]):
    """One job's samples, packed (~130 `Sample`s a job would be 21 KB of tuples and
    floats; packed they are a shared `Layout` and one array of doubles, ~1.2 KB). Immutable;
    iterating gives the very `Sample`s the tuple held (`head` + the row's labels), so every
    reader of a `Snapshot`'s parts reads it as it read the tuple. Equal to any sequence of
    the same samples, a tuple included."""

    __slots__ = ("head", "layout", "values")

    head: tuple[str, ...]
    layout: Layout
    values: array[float]

    def __init__(self, head: tuple[str, ...], layout: Layout, values: array[float]):
        self.head, self.layout, self.values = head, layout, values

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Sample]:
        head = self.head
        for name, extra, value in zip(self.layout.names, self.layout.extras, self.values):
            yield Sample(name, head + extra if extra else head, value)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Sample, ...]: ...
    def __getitem__(self, i: int | slice) -> Sample | tuple[Sample, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        extra = self.layout.extras[i]
        return Sample(self.layout.names[i], self.head + extra, self.values[i])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PackedSamples, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PackedSamples({tuple(self)!r})"


def pack(head: tuple[str, ...], rows: Iterable[Row]) -> Sequence[Sample]:
    """These rows as one job's samples (labels `head` + each row's): packed, or a tuple of
    `Sample`s when a value is not a number an array of doubles holds exactly (an int too
    large for a double: the exposition's checked path then counts it)."""
    listed = list(rows)
    names = tuple(r[0] for r in listed)
    extras = tuple(r[1] for r in listed)
    try:
        values = array("d", [r[2] for r in listed])
    except (TypeError, OverflowError):
        return tuple(Sample(n, head + e, v) for n, e, v in listed)
    if any(type(r[2]) is not float and r[2] != v for r, v in zip(listed, values)):
        return tuple(Sample(n, head + e, v) for n, e, v in listed)  # an int a double rounds
    key = (names, extras)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = Layout(names, extras)
        _LAYOUTS[key] = layout
    return PackedSamples(head, layout, values)


@dataclass(frozen=True, init=False)
class Snapshot:
    """What a source knows right now. Replaced whole, never changed in place.

    A source with many jobs publishes each job's samples as one sequence in `parts` (the same
    object for as long as the job's series are unchanged) and its other samples in
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
    parts: tuple[Sequence[Sample], ...] = ()  # per-job samples, served before `rest`
    problems: tuple[Problem, ...] = ()  # set-up mistakes the source sees now (Problem)

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
        parts: tuple[Sequence[Sample], ...] = (),
        *,
        samples: tuple[Sample, ...] | None = None,
        problems: tuple[Problem, ...] = (),
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
        init(self, "problems", problems)

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
