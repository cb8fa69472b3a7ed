"""One step printed in halves by two processes, joined before it is diagnosed.

slime prints each step twice, `perf N: {...}` from its rollout manager (the rollout's keys,
`perf/rollout_time` among them) and from its trainer (the other windows and the step total
`perf/step_time`). Through Ray the two lines come from two actors, so either may arrive
first, and a step classified when the trainer's half (the one holding S) arrives would miss
its rollout window. `StepJoiner` holds each step of such a framework until both halves are
in, then gives the step as one record; steps leave in order, each once.

A step leaves with a half missing only when it is forced out, counted by reason:
- `half_step`: a half of a step two or more later arrived (the missing half is late by more
  than a step: the printing actor restarted or its line was lost), more than
  MAX_HELD_STEPS steps are held, or the job's input ended;
- `late_half`: the missing half of a step forced out before the last step given out arrives
  after all: dropped (a lower step number would read as a restart of the run). A record of
  the last step given out passes on: the job merges it into that step (`late_record` there
  when the step was classified).
A step number below the last one given out that is no such late half is a new run: what is
held leaves first, then the new run's steps are held as before.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from ..diagnosis import Record
from ..diagnosis.steps import STEP_KEY
from ..diagnosis.values import TIMER_PREFIX
from ..frameworks import SLIME, TABLES

MAX_HELD_STEPS = 4  # steps held at most (an older one is forced out)
FORCE_AFTER = 2  # a half of step N + FORCE_AFTER forces step N out
HALF_STEP = "half_step"
LATE_HALF = "late_half"
REASONS = (HALF_STEP, LATE_HALF)

# the framework's keys that mark each half of its step: the rollout manager's window and the
# trainer's step total
_HALF_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {SLIME: ("perf/rollout_time", "perf/step_time")}
)


def _verl_key(framework: str, key: str) -> str:
    """The verl key a framework key becomes in its record (translate.py's rule)."""
    fw = TABLES[framework]
    if key == fw.step_total:
        return STEP_KEY
    (timer,) = [w.timer for w in fw.windows if w.key == key]
    return TIMER_PREFIX + str(timer)


HALVES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {fw: tuple(_verl_key(fw, k) for k in keys) for fw, keys in _HALF_KEYS.items()}
)
"""By framework: the verl keys of its translated record that mark each half of a step."""


class StepJoiner:
    """Records of one job whose steps come in halves, joined per step (see the module)."""

    def __init__(self, framework: str):
        self.marks = HALVES[framework]
        self.rejected: Counter[str] = Counter()
        self._held: dict[int, tuple[dict[str, Any], set[str]]] = {}
        self._last: int | None = None  # the last step given out
        self._forced: deque[int] = deque(maxlen=MAX_HELD_STEPS)  # left with a half missing

    @property
    def held(self) -> int:
        return len(self._held)

    def feed(self, records: Iterable[Record]) -> Iterator[Record]:
        for record in records:
            yield from self._one(record)

    def finish(self) -> Iterator[Record]:
        """The input ended: every held step leaves, in order."""
        for step in sorted(self._held):
            yield self._out(step)

    def _one(self, record: Record) -> Iterator[Record]:
        step = record.step
        if self._last is not None and step <= self._last:
            if step == self._last:  # in order still: the job merges it into its step
                yield record
                return
            if step in self._forced:
                self.rejected[LATE_HALF] += 1
                return
            yield from self.finish()  # a new run: the old one's steps leave first
            self._last = None
            self._forced.clear()
        data, seen = self._held.setdefault(step, ({}, set()))
        data.update(record.data)
        seen.update(m for m in self.marks if m in record.data)
        newest = max(self._held)
        for held in sorted(self._held):
            complete = len(self._held[held][1]) == len(self.marks)
            forced = held <= newest - FORCE_AFTER or len(self._held) > MAX_HELD_STEPS
            if not complete and not forced:
                break  # a later step waits behind it: steps leave in order
            yield self._out(held)

    def _out(self, step: int) -> Record:
        data, seen = self._held.pop(step)
        if len(seen) < len(self.marks):
            self.rejected[HALF_STEP] += 1
            self._forced.append(step)
        self._last = step
        return Record(step, data)
