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
- verl 0.6 legacy (0.6.1 `trainer/ppo/ray_trainer.py`): `step` 1036, `gen` 1038, REMAX's
  `gen_max` 1051 after `gen` (also 0.7.1 `:1318/1330`); in 0.6's sync rollout `gen` holds the
  worker's `rollout_mode()` (the weight load) 926, `generate_sequences` 929 and
  `trainer_mode()` 933 (`workers/fsdp_workers.py`; `megatron_workers.py` 688/691/695):
  a split timer's two parts (`split_timers` in the thresholds: the rest window, here `gen` -
  `generate_sequences`, then the inner timer) take the outer timer's place in the order, the
  rest first, since the load comes first and the switch back is short.
- fully-async `verl/experimental/fully_async_policy/fully_async_trainer.py`: `step` 559,
  `wait_for_enough_samples` 567, `gen` 646, reward .. `update_actor` (587-594),
  `param_sync` 729 (logged as `timing_s/timing_s/param_sync`); after `step`: validation 598,
  `save_checkpoint` 599/895.

Fully-async records are shifted by one sub-step (0.8.0, 0.9.1): `Placer` (below) places
them sub-step by sub-step, anchored at the previous record's arrival.

One order covers every mode, because no mode times two of these windows in opposite order:
`ORDER` below. A timer the order does not name (a new verl timer) runs after the named ones;
the untimed remainder R (driver time outside every timer: DataProto movement, batching)
is spread evenly over the gaps before each window and after the last. Where GPU samples
exist, `gpufit.place_untimed` then moves R to where the GPUs were idle (verl's untimed work is
driver-side CPU work, the GPUs wait through it); without a signal it keeps the even spread.

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
    usually a fraction of R, never more; placed by `place_untimed`, a window whose GPUs
    were busy lands on its busy edges, within a sample period)
`Timeline.error_seconds` carries `delay + R` for each step (the bound holds for any
placement); tests measure the actual edge error of both placements.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from .thresholds import Thresholds
from .windows import Windows

ORDER = (
    "switch_wait",
    "switch_to_trainer",
    "wait_for_enough_samples",
    "gen",
    "gen_max",
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
_RANKS: dict[Thresholds, Mapping[str, float]] = {}


def _ranks(th: Thresholds) -> Mapping[str, float]:
    """Timer -> place in time: `ORDER`, and a split timer's parts in their outer's place
    (the rest window, then the inner timer). One entry per Thresholds (a handful)."""
    ranks = _RANKS.get(th)
    if ranks is None:
        out: dict[str, float] = dict(_RANK)
        for inner, (outer, rest) in th.split_timers.items():
            if outer in _RANK:
                out.setdefault(rest, _RANK[outer] + 0.25)
                out.setdefault(inner, _RANK[outer] + 0.5)
        if len(_RANKS) >= 16:
            _RANKS.clear()
        ranks = _RANKS[th] = out
    return ranks


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
    end = arrival - delay - after_step_seconds(all_timers, windows, th)
    seconds = windows.step_seconds
    return _lay(
        step,
        windows.counted,
        windows.untimed_seconds,
        end - seconds,
        seconds,
        th,
        delay + windows.untimed_seconds,
    )


def _lay(
    step: int,
    counted: Mapping[str, float],
    untimed: float,
    start: float,
    seconds: float,
    th: Thresholds,
    error: float,
) -> Timeline:
    """Counted windows in `ORDER` from `start`, over `seconds`, R spread over the gaps."""
    th_groups = th.timer_groups
    end = start + seconds
    ranks = _ranks(th)
    named = sorted((n for n in counted if n in ranks), key=ranks.__getitem__)
    rest = sorted(n for n in counted if n not in ranks)
    durations = [(n, th_groups.get(n, "other"), counted[n]) for n in (*named, *rest)]
    total = sum(d for _, _, d in durations)
    # timers that add up to more than S (rounding, overlap) are scaled into the step
    scale = seconds / total if total > seconds else 1.0
    # R, the driver's work outside every timer, runs between windows: spread it evenly over
    # the gaps before each window and after the last (an `untimed` interval, group `other`)
    gap = untimed / (len(durations) + 1) if untimed > 0 else 0.0
    t = start
    intervals = []
    for name, group, secs in durations:
        if gap > 0.0:
            intervals.append(Interval(UNTIMED, "other", t, t + gap))
            t += gap
        if secs <= 0.0:
            continue
        nxt = t + secs * scale
        intervals.append(Interval(name, group, t, nxt))
        t = nxt
    if gap > 0.0:
        intervals.append(Interval(UNTIMED, "other", t, end))
    return Timeline(step, start, end, tuple(intervals), error)


# Fully-async (verl 0.8.0 and 0.9.1): each trainer record sums `trigger_parameter_sync_step`
# (N) sub-steps, shifted by one. The aggregate is logged when the cycle's last sub-step
# syncs the weights, before that sub-step's own metrics join the aggregator (verl's source:
# docs/verl-support.md, "Fully-async records are shifted by one sub-step"). So the record of
# step k holds the previous cycle's last sub-step (the one with `param_sync`, and
# `save_checkpoint` after it) and the first N-1 sub-steps of cycle k; a run's first record
# holds N-1. `training/global_step` counts sub-steps from 1 and is aggregated as the last
# value, so consecutive records differ by the number of sub-steps in the later one.
GLOBAL_STEP_KEY = "training/global_step"
FULLY_ASYNC_PREFIX = "fully_async/"
SHIFT_TIMER = "param_sync"  # only the cycle's last sub-step syncs: the shifted one
LOGGED_AFTER_STEP_PREFIX = "dynamic_resource/"
"""0.9.1 logs the aggregate after `step`, validation and `save_checkpoint` (`:598-603`), and
its records carry `dynamic_resource/*` (`dynamic_resource/mq_size`, every sub-step, `:908`);
0.8.0 logs it inside `step`, right after `param_sync` (`:510-533`), before the checkpoint."""
MAX_SUBSTEPS = 256  # more sub-steps than this in one record: not believed, placed as one block


def _trim(tl: Timeline, start: float) -> Timeline:
    """The timeline without what it holds before `start` (unchanged when it starts later)."""
    if start <= tl.start:
        return tl
    start = min(start, tl.end)
    kept = tuple(iv._replace(start=max(iv.start, start)) for iv in tl.intervals if iv.end > start)
    return tl._replace(start=start, intervals=kept)


class SubStep(NamedTuple):
    counted: Mapping[str, float]
    untimed: float
    seconds: float


def substeps(windows: Windows, n: int) -> tuple[SubStep, ...]:
    """A fully-async record's `n` sub-steps, alike but for the first, which holds the
    record's whole `param_sync` when it has one (the previous cycle's last sub-step)."""
    sync = windows.counted.get(SHIFT_TIMER)
    each = {k: v / n for k, v in windows.counted.items() if k != SHIFT_TIMER}
    r = windows.untimed_seconds / n
    base = sum(each.values()) + r
    out = []
    for i in range(n):
        if i == 0 and sync is not None:
            out.append(SubStep({**each, SHIFT_TIMER: sync}, r, base + sync))
        else:
            out.append(SubStep(each, r, base))
    return tuple(out)


def _global_step(data: Mapping[str, Any]) -> int | None:
    x = data.get(GLOBAL_STEP_KEY)
    if type(x) is float and x.is_integer():
        x = int(x)
    return x if type(x) is int and x >= 0 else None


def is_fully_async(all_timers: Mapping[str, float], data: Mapping[str, Any]) -> bool:
    return SHIFT_TIMER in all_timers or any(k.startswith(FULLY_ASYNC_PREFIX) for k in data)


class Placer:
    """One job's steps in time: `rebuild` for every trainer but fully-async, whose records
    are shifted by one sub-step (above) and are placed sub-step by sub-step, anchored at the
    previous trainer record's arrival: the shifted sub-step ended just before it (0.9.1:
    before its checkpoint; 0.8.0: at it), the current cycle's sub-steps ran after it, one
    after the other with the driver's short work between sub-steps (its length estimated
    from the records' arrivals: the median of the last `GAPS` cycles' time not in their
    sub-steps nor in a checkpoint or validation after `step`, spread over the sub-steps;
    0.9.1's checkpoint is in the next cycle's record, so the newest cycle's figure waits for
    it and is used only while no other exists). A record without that anchor (a run's first, or
    the one after a backlog read) cannot be placed: where its sub-steps ran depends on the
    cycle's last sub-step, which is in the next record; it is not joined (nothing is
    posted). Without `training/global_step` the number of sub-steps is unknown: one block,
    as `rebuild`. Pure; bounded (a few numbers)."""

    GAPS = 5

    def __init__(self, th: Thresholds, delay: float = 0.0):
        self.th = th
        self.delay = delay
        self._anchor: float | None = None  # arrival of the last trainer record seen
        self._global_step: int | None = None  # its training/global_step
        self._gaps: deque[float] = deque(maxlen=self.GAPS)  # seconds between sub-steps
        # 0.9.1: the last cycle's seconds not in sub-steps, and its sub-step count, until the
        # next record says what ran after `step` before the write (its checkpoint, validation)
        self._provisional: tuple[float, int] | None = None
        self._last_end: float | None = None  # end of the last timeline placed

    def reset(self) -> None:
        """A new run (restart or resume): no anchor, sub-steps counted afresh."""
        self._anchor = self._global_step = self._last_end = None
        self._gaps.clear()
        self._provisional = None

    def unplaced(self, data: Mapping[str, Any]) -> None:
        """A trainer record whose arrival is unknown (a backlog read): the anchor is lost;
        its sub-step count still moves on."""
        self._anchor = self._provisional = None
        gs = _global_step(data)
        if gs is not None:
            self._global_step = gs

    def empty(self, arrival: float, step: int) -> None:
        """verl 0.8.0's empty trainer record (no sub-step yet in the aggregate when the first
        cycle synced; docs/verl-support.md cites the source): nothing to place, but it marks when the weights were synced. On a fresh run (step 1,
        the first cycle) no sub-step came before it: the count starts at 0."""
        self._anchor = arrival
        if self._global_step is None and step <= 1:
            self._global_step = 0

    def gap(self) -> float:
        """The estimated driver time between two sub-steps (0 until a cycle was seen): the
        median of the cycles whose checkpoint and validation are known; the last cycle's
        uncorrected figure only while there is none."""
        if not self._gaps:
            if self._provisional is not None:
                seconds, n = self._provisional
                return max(0.0, seconds / n)
            return 0.0
        ordered = sorted(self._gaps)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def place(
        self,
        step: int,
        windows: Windows,
        all_timers: Mapping[str, float],
        data: Mapping[str, Any],
        arrival: float,
    ) -> tuple[Timeline, ...]:
        """The timelines of one classified record (one, one per fully-async sub-step, or
        none for a fully-async record that cannot be placed)."""
        th, delay = self.th, self.delay
        if not is_fully_async(all_timers, data):
            self.reset()
            return (rebuild(step, windows, all_timers, arrival, th, delay),)
        gs, prev, anchor = _global_step(data), self._global_step, self._anchor
        self._anchor, self._global_step = arrival, gs
        if gs is None:
            return (rebuild(step, windows, all_timers, arrival, th, delay),)
        if prev is None or not prev < gs <= prev + MAX_SUBSTEPS or anchor is None:
            self._provisional = None
            return ()
        n = gs - prev
        parts = substeps(windows, n)
        after = after_step_seconds(all_timers, windows, th)  # the shifted sub-step's checkpoint
        logged_after_step = any(k.startswith(LOGGED_AFTER_STEP_PREFIX) for k in data)
        # the cycle between the two records, less its sub-steps and what ran after `step`
        # in it: the driver's gaps. 0.8.0 writes the record inside `step`, so this record's
        # checkpoint ran after the previous one's write, in this cycle; 0.9.1 writes it after
        # the checkpoint, so this record's checkpoint belongs to the previous cycle, and this
        # cycle's is only known from the next record (a checkpoint of several seconds taken
        # for driver gaps would push every later sub-step that far)
        cycle = arrival - anchor - windows.step_seconds
        if logged_after_step:
            if self._provisional is not None:
                seconds, m = self._provisional
                self._gaps.append(max(0.0, (seconds - after) / m))
            self._provisional = (cycle, n)
        else:
            self._gaps.append(max(0.0, (cycle - after) / n))
            self._provisional = None
        gap = self.gap()
        written = anchor - delay  # when the previous record was written
        out = []
        rest = parts
        if SHIFT_TIMER in windows.counted:
            first, rest = parts[0], parts[1:]
            end = written - (after if logged_after_step else 0.0)
            shifted = _lay(
                step,
                first.counted,
                first.untimed,
                end - first.seconds,
                first.seconds,
                th,
                delay + first.untimed,
            )
            # it follows the previous record's last sub-step: where the two estimates overlap,
            # the earlier placement keeps the moment (the join attributes a moment once)
            if self._last_end is not None:
                shifted = _trim(shifted, self._last_end)
            if shifted.end > shifted.start:
                out.append(shifted)
        t = written + (0.0 if logged_after_step else after)
        for part in rest:
            t += gap
            out.append(
                _lay(step, part.counted, part.untimed, t, part.seconds, th, delay + part.untimed)
            )
            t += part.seconds
        if out:
            self._last_end = out[-1].end
        return tuple(out)


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
