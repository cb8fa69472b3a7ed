"""A step's windows in time: the intervals `timing_s/<timer>` covered, rebuilt from the record.

verl logs how long each window lasted, not when it ran. Every verl trainer runs its windows
in one fixed order inside `with marked_timer("step")`, so the intervals follow from the
durations, the order, and one anchor: the time the step's record arrived.

The order, checked in verl 0.9.1's source (`pip download --no-deps verl==0.9.1`):

- legacy `verl/trainer/ppo/ray_trainer.py` (fit): `step` 1508, `gen` 1510, `reward` 1561,
  `old_log_prob` 1585, `ref` 1620, `values` 1626, `adv` 1630, `update_critic` 1678,
  `update_actor` 1689, `save_checkpoint` 1711 (inside `step`), `update_weights` 1715;
  `testing` 1730 runs after `step`, before the record is logged.
- V1 `verl/trainer/ppo/v1/trainer_base.py`: `step` 473 wraps `on_step_begin()` 474, `step()`
  477 (whose `_step_once` times `gen` 565, `reward` 578, `old_log_prob` 585, `ref` 590,
  `values` 595, `adv` 599, `update_critic` 604, `update_actor` 609), `save_checkpoint` 484,
  `on_step_end()` 488; `testing` 494 after `step`. `on_step_end` times `update_weights`
  (`trainer_sync.py`:36, `trainer_colocate_async.py`:38). `trainer_separate_async.py`:
  `on_step_begin`/`prepare_step` time `switch_to_trainer` 258 and `switch_wait` 283 before
  `gen`; `on_step_end` times `switch_to_rollout` 375/390 and `update_weights` 380.
- one-step-off `verl/experimental/one_step_off_policy/ray_trainer.py`: `step` 345, `gen` 389,
  `sync_rollout_weights` 398 (then the next batch's `generate_async` starts: it overlaps,
  not a window), then reward .. `update_actor` (346-369); after `step`: validation 374
  (`testing`) and the checkpoint 376.
- separation `verl/experimental/separation/ray_trainer.py`: `step` 362, `gen` 432, `reward`
  490, `old_log_prob` 520, `values` 571, `adv` 582, `update_critic` 636, `update_actor` 648,
  `update_weights` 659; after `step`: `testing` 680, `save_checkpoint` 705.
- fully-async `verl/experimental/fully_async_policy/fully_async_trainer.py`: `step` 559,
  `wait_for_enough_samples` 567, `gen` 646, reward .. `update_actor` (587-594),
  `param_sync` 729 (logged as `timing_s/timing_s/param_sync`); after `step`: validation 598,
  `save_checkpoint` 599/895.

One order covers every mode, because no mode times two of these windows in opposite order:
`ORDER` below. A timer the order does not name (a new verl timer) runs after the named ones;
the untimed remainder R (driver time outside every timer: DataProto movement, batching)
is spread evenly over the gaps before each window and after the last.

The anchor: a step's record is written after `step` ends and after what runs between
`step` and the logger: `testing`, and `save_checkpoint` where it ran outside the step (the
separated trainers, verl 0.6; `windows.split` decides). Both are timed in the same record,
so the step ended at `arrival - testing - checkpoint outside`.

The alignment error (seconds), per window edge, is at most:
  delay (how late the arrival time is after the step's end: the time verl spends computing
  metrics after `step`, typically well under a second; the file source takes the file's
  mtime as the arrival of a poll's last record, so its poll interval does not add, while a
  pushed record arrives when its push does)
  + R (where the untimed remainder really ran is unknown; spread evenly, the error is
    usually a fraction of R, never more)
`Timeline.error_seconds` carries `delay + R` for each step; tests measure it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from .thresholds import Thresholds
from .windows import Windows

ORDER = (
    "switch_wait",
    "switch_to_trainer",
    "wait_for_enough_samples",
    "gen",
    "sync_rollout_weights",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "save_checkpoint",
    "switch_to_rollout",
    "update_weights",
    "param_sync",
    "dump_rollout_generations",
)
"""Timers in the order verl runs them inside `step` (module docstring: file:line per mode)."""
_RANK = {name: i for i, name in enumerate(ORDER)}
UNTIMED = "untimed"  # the interval of the untimed remainder R (group `other`)
AFTER_STEP = ("testing",)  # timed in the record, run after `step`, before the record is logged


class Interval(NamedTuple):
    timer: str
    group: str
    start: float  # seconds since the epoch
    end: float


class Timeline(NamedTuple):
    """One step's windows in time."""

    step: int
    start: float
    end: float
    intervals: tuple[Interval, ...]  # ordered, contiguous, covering [start, end]
    error_seconds: float  # the alignment error bound: delay + R

    def group_at(self, t: float) -> str | None:
        """The group of the window running at `t`, or None outside the step."""
        for iv in self.intervals:
            if iv.start <= t < iv.end:
                return iv.group
        return None


def after_step_seconds(all_timers: Mapping[str, float], windows: Windows, th: Thresholds) -> float:
    """Seconds timed in the record that ran after `step` ended: validation, and the
    checkpoint when `split` found it ran outside the step."""
    out = sum(all_timers.get(name, 0.0) for name in AFTER_STEP)
    if windows.checkpoint_seconds == 0.0:
        out += all_timers.get(th.checkpoint_timer, 0.0)
    return out


def rebuild(
    step: int,
    windows: Windows,
    all_timers: Mapping[str, float],
    arrival: float,
    th: Thresholds,
    delay: float = 0.0,
) -> Timeline:
    """The intervals of a step's counted windows, anchored at the record's `arrival` time.

    `windows`: `split()`'s result for the step; `all_timers`: `timers()` of its record;
    `delay`: the expected lag between the logger's write and `arrival` (subtracted, and
    counted in the error bound).
    """
    th_groups = th.timer_groups
    end = arrival - delay - after_step_seconds(all_timers, windows, th)
    start = end - windows.step_seconds
    counted = windows.counted
    named = sorted((n for n in counted if n in _RANK), key=_RANK.__getitem__)
    rest = sorted(n for n in counted if n not in _RANK)
    durations = [(n, th_groups.get(n, "other"), counted[n]) for n in (*named, *rest)]
    total = sum(d for _, _, d in durations)
    # timers that add up to more than S (rounding, overlap) are scaled into the step
    scale = windows.step_seconds / total if total > windows.step_seconds else 1.0
    # R, the driver's work outside every timer, runs between windows: spread it evenly over
    # the gaps before each window and after the last (an `untimed` interval, group `other`)
    gap = windows.untimed_seconds / (len(durations) + 1) if windows.untimed_seconds > 0 else 0.0
    t = start
    intervals = []
    for name, group, seconds in durations:
        if gap > 0.0:
            intervals.append(Interval(UNTIMED, "other", t, t + gap))
            t += gap
        if seconds <= 0.0:
            continue
        nxt = t + seconds * scale
        intervals.append(Interval(name, group, t, nxt))
        t = nxt
    if gap > 0.0:
        intervals.append(Interval(UNTIMED, "other", t, end))
    return Timeline(step, start, end, tuple(intervals), delay + windows.untimed_seconds)


class Recent:
    """The last `keep` steps' timelines of one job (bounded: older steps drop off)."""

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self._steps: deque[Timeline] = deque(maxlen=keep)

    def add(self, timeline: Timeline) -> None:
        # a restarted run (lower step) or a duplicate replaces nothing: times still increase
        self._steps.append(timeline)

    def __len__(self) -> int:
        return len(self._steps)

    def __iter__(self) -> Iterator[Timeline]:
        return iter(self._steps)

    def covering(self, start: float, end: float) -> Iterator[Timeline]:
        """The kept steps that overlap [start, end)."""
        for tl in self._steps:
            if tl.end > start and tl.start < end:
                yield tl
