"""A job's last steps for the job view, packed: one `bytes` row per step.

The sidecar keeps `history.HISTORY_STEPS` `StepPoint`s of every job. As named tuples each
costs about 500 bytes (a tuple, a tuple of group seconds, a float object per number); packed
with `struct` a step is 128 bytes, so 1,000 jobs' full histories take 7 MB instead of 30 MB.
`StepHistory` is an immutable `Sequence[StepPoint]` (a new one per step, as the tuple was,
so a page being drawn keeps a consistent history): indexing and iterating unpack the rows
into the same `StepPoint`s, field for field (numbers as IEEE doubles, exact; None of an
optional number as a NaN, which no kept number can be: they come from the decision table
and `num()`, which refuse NaN).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from typing import Any, overload

from ..diagnosis import GROUPS
from ..diagnosis.history import HISTORY_STEPS, StepPoint

_NONE = 0xFFFF  # string index of None
_ROW = struct.Struct(f"<qq4H{len(GROUPS) + 6}d")  # run, step, 4 strings, the numbers
_G = len(GROUPS)
MAX_STRINGS = 64  # distinct verdict/reason/change/group strings kept before the table is redone


def _opt(x: float) -> float | None:
    return None if x != x else x  # NaN: None


class StepHistory(Sequence[StepPoint]):
    """The last `limit` steps, oldest first (see the module)."""

    __slots__ = ("_limit", "_rows", "_strings")

    def __init__(
        self, rows: bytes = b"", strings: tuple[str, ...] = (), limit: int = HISTORY_STEPS
    ):
        self._rows = rows
        self._strings = strings
        self._limit = limit

    def __len__(self) -> int:
        return len(self._rows) // _ROW.size

    @overload
    def __getitem__(self, i: int) -> StepPoint: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[StepPoint, ...]: ...
    def __getitem__(self, i: int | slice) -> StepPoint | tuple[StepPoint, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("history index out of range")
        return self._point(_ROW.unpack_from(self._rows, i * _ROW.size))

    def __iter__(self) -> Iterator[StepPoint]:
        point = self._point
        for row in _ROW.iter_unpack(self._rows):
            yield point(row)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepHistory):
            return tuple(self) == tuple(other)
        return isinstance(other, tuple) and tuple(self) == other

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"StepHistory({tuple(self)!r})"

    def _point(self, row: tuple[Any, ...]) -> StepPoint:
        s = self._strings
        g = 7 + _G
        return StepPoint(
            row[0],
            row[1],
            s[row[2]],
            None if row[3] == _NONE else s[row[3]],
            row[6],
            row[7:g],
            row[g],
            s[row[4]],
            None if row[5] == _NONE else s[row[5]],
            _opt(row[g + 1]),
            _opt(row[g + 2]),
            _opt(row[g + 3]),
            _opt(row[g + 4]),
        )

    def appended(self, p: StepPoint) -> StepHistory:
        """This history with `p` after its last step (the oldest dropped past the limit)."""
        if self._limit <= 0:
            return self
        keep = (self._limit - 1) * _ROW.size
        rows, strings = self._rows[max(0, len(self._rows) - keep) :], self._strings
        new = (p.verdict, p.reason, p.change, p.regressed)
        if len(strings) + 4 > MAX_STRINGS and any(x is not None and x not in strings for x in new):
            kept = StepHistory(rows, strings, self._limit)  # the table redone from what is kept
            rows, strings = b"", ()
            for old in kept:
                rows, strings = _pack(rows, strings, old)
        rows, strings = _pack(rows, strings, p)
        return StepHistory(rows, strings, self._limit)


def _index(strings: tuple[str, ...], value: str | None) -> tuple[int, tuple[str, ...]]:
    if value is None:
        return _NONE, strings
    try:
        return strings.index(value), strings
    except ValueError:
        return len(strings), (*strings, value)


def _num(x: float | None) -> float:
    return math.nan if x is None else x


def _pack(rows: bytes, strings: tuple[str, ...], p: StepPoint) -> tuple[bytes, tuple[str, ...]]:
    verdict, strings = _index(strings, p.verdict)
    reason, strings = _index(strings, p.reason)
    change, strings = _index(strings, p.change)
    regressed, strings = _index(strings, p.regressed)
    row = _ROW.pack(
        p.run,
        p.step,
        verdict,
        reason,
        change,
        regressed,
        p.step_seconds,
        *p.group_seconds,
        p.untimed_seconds,
        _num(p.tokens),
        _num(p.tokens_per_gpu_second),
        _num(p.response_length),
        _num(p.longest_response),
    )
    return rows + row, strings


def history_of(points: Sequence[StepPoint], limit: int = HISTORY_STEPS) -> StepHistory:
    """The packed history of these points (the last `limit`)."""
    h = StepHistory(limit=limit)
    for p in points[-limit:] if limit > 0 else ():
        h = h.appended(p)
    return h
