"""§2 of the decision table: verl timers -> counted windows -> group seconds and shares."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .thresholds import GROUPS, Thresholds
from .values import _INF, AGENT_LOOP, TIMER_PREFIX

_PREFIX_LEN = len(TIMER_PREFIX)
_ZERO = dict.fromkeys(GROUPS, 0.0)
_NO_GROUPS: Mapping[str, str] = MappingProxyType({})
MEMO_SIZE = 256
"""Entries each memo below keeps. A job writes the same keys step after step, so a few
shapes cover a fleet; a flood of shapes only costs a recomputation."""


class Windows(NamedTuple):
    """The step's time, split into decision-table groups."""

    step_seconds: float  # S
    counted: Mapping[str, float]  # timer -> seconds, only timers that count as windows
    group_seconds: Mapping[str, float]  # every group; `other` includes the untimed remainder
    untimed_seconds: float  # R
    shares: Mapping[str, float]  # every group, unrounded
    checkpoint_seconds: float = 0.0  # save_checkpoint when it ran inside the step (§2), else 0
    timer_groups: Mapping[str, str] = _NO_GROUPS  # the group each counted timer counted in
    unnamed: tuple[str, ...] = ()  # timers the thresholds do not name (clipped into `other`)

    @property
    def busy_seconds(self) -> float:
        """S' (§4): the step time without a checkpoint saved inside it."""
        return self.step_seconds - self.checkpoint_seconds


def timer_name(key: str) -> str | None:
    """The timer a data key holds, or None for keys that are not windows.

    `timing_s/timing_s/param_sync` (fully-async's doubled prefix) names `param_sync`;
    `timing_s/agent_loop/...` are per-sample statistics, not windows.
    """
    if not key.startswith(TIMER_PREFIX):
        return None
    name = key[_PREFIX_LEN:]
    if name.startswith(TIMER_PREFIX):
        name = name[_PREFIX_LEN:]
    return None if name.startswith(AGENT_LOOP) else name


class _Shape(NamedTuple):
    """What a step's key set says, whatever its values: (key, timer) for every timer key,
    and whether any key starts with a prefix (filled as prefixes are asked about)."""

    pairs: tuple[tuple[str, str], ...]
    prefixed: dict[str, bool]


_KEYSETS: dict[tuple[str, ...], _Shape] = {}
"""Shapes by key set: a job writes the same keys step after step. Bounded (MEMO_SIZE), least
recently used first out: a flood of new shapes never evicts a job's shape in use."""
_NEWEST: list[_Shape | None] = [None]  # the most recently used shape: the memo's last entry
_PREFIXES_KEPT = 8  # prefixes remembered per shape (the thresholds ask about one)


def _shape(keys: tuple[str, ...]) -> _Shape:
    """The memo's shape of `keys`. A hit on the shape used last (one job stepping) is one
    lookup; any other hit moves the shape to the memo's end (an LRU, as `_recall`)."""
    shape = _KEYSETS.get(keys)
    if shape is None:
        pairs = tuple((k, n) for k in keys if (n := timer_name(k)) is not None)
        shape = _Shape(pairs, {})
        _remember(_KEYSETS, keys, shape)
    elif shape is not _NEWEST[0]:
        del _KEYSETS[keys]
        _KEYSETS[keys] = shape
    _NEWEST[0] = shape
    return shape


def _recall(memo: dict[Any, Any], key: Any) -> Any:
    """A memo's value for `key` (None when absent), marked as the most recently used."""
    value = memo.pop(key, None)
    if value is not None:
        memo[key] = value  # dicts keep insertion order: the end is the most recent
    return value


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """Store in a bounded memo; when full, the least recently used entry goes (an LRU)."""
    if len(memo) >= MEMO_SIZE:
        del memo[next(iter(memo))]
    memo[key] = value


def timers(data: Mapping[str, Any]) -> dict[str, float]:
    """Every usable timer value of a step's data. A timer under both spellings keeps the
    larger value."""
    return _timers(data, _shape(tuple(data)).pairs)


def _timers(data: Mapping[str, Any], pairs: tuple[tuple[str, str], ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in pairs:
        x = data[key]
        t = type(x)  # inlined values.num(): this loop runs for every timer of every step
        if t is float:
            if not (x >= 0.0 and x != _INF):  # NaN fails `>=`
                continue
        elif t is int:
            if x < 0:
                continue
            x = float(x)
        else:
            continue
        old = out.get(name)
        if old is None or x > old:
            out[name] = x
    return out


def has_key_prefix(data: Mapping[str, Any], prefix: str) -> bool:
    """Whether any key of `data` starts with `prefix` (memoized by key set)."""
    return _has_prefix(_shape(tuple(data)), data, prefix)


def _has_prefix(shape: _Shape, data: Mapping[str, Any], prefix: str) -> bool:
    found = shape.prefixed.get(prefix)
    if found is None:
        found = any(k.startswith(prefix) for k in data)
        if len(shape.prefixed) < _PREFIXES_KEPT:
            shape.prefixed[prefix] = found
    return found


def separated_trainer(
    all_timers: Mapping[str, float], data: Mapping[str, Any], th: Thresholds
) -> bool:
    """§2 condition 2: the step carries a marker of a separated trainer (one-step-off,
    fully-async, separation), which saves its checkpoint after `step`."""
    if any(name in all_timers for name in th.separated_timers):
        return True
    return has_key_prefix(data, th.separated_key_prefix)


def step_timers(data: Mapping[str, Any], th: Thresholds) -> tuple[dict[str, float], bool]:
    """`timers(data)` and `separated_trainer()` of them, looking at the key set once."""
    shape = _shape(tuple(data))
    all_timers = _timers(data, shape.pairs)
    separated = not th.separated_timers.isdisjoint(all_timers) or _has_prefix(
        shape, data, th.separated_key_prefix
    )
    return all_timers, separated


def split(
    step_seconds: float,
    all_timers: Mapping[str, float],
    th: Thresholds,
    separated: bool = False,
    batches: float | None = None,
) -> Windows:
    """Group the counted timers of one step whose `timing_s/step` is `step_seconds` (> 0).

    `separated`: the step carries a separated trainer's marker (`separated_trainer()`).
    `batches`: DAPO's n generation batches (`generation_batches_key`), when usable.
    Timers the thresholds do not name count in `other` only up to the time the named ones
    left untimed (v4): `clip_unnamed`.
    """
    if th.split_timers:
        all_timers = split_inner(all_timers, th, batches)
    counted: dict[str, float] = {}
    groups: dict[str, str] = {}
    group_seconds = _ZERO.copy()
    total = 0.0  # C: every named counted timer but the checkpoint
    checkpoint: tuple[float, str] | None = None
    unnamed: list[tuple[str, float]] = []
    for name, group in _plan(tuple(all_timers), th):
        value = all_timers[name]
        if group is None:
            unnamed.append((name, value))
            continue
        if name == th.checkpoint_timer:
            checkpoint = (value, group)
            continue
        counted[name] = value
        groups[name] = group
        group_seconds[group] += value
        total += value
    checkpoint_seconds = 0.0
    if checkpoint is not None and _checkpoint_inside(
        checkpoint[0], step_seconds, total, all_timers, separated, th
    ):
        checkpoint_seconds, group = checkpoint
        counted[th.checkpoint_timer] = checkpoint_seconds
        groups[th.checkpoint_timer] = group
        group_seconds[group] += checkpoint_seconds
        total += checkpoint_seconds
    if unnamed:  # N = total now
        clipped = clip_unnamed(unnamed, step_seconds - total)
        counted.update(clipped)
        groups.update(dict.fromkeys(clipped, "other"))
        clipped_seconds = sum(clipped.values())
        group_seconds["other"] += clipped_seconds
        total += clipped_seconds
    untimed = step_seconds - total
    if untimed < 0.0:
        untimed = 0.0
    group_seconds["other"] += untimed
    scale = 1.0 / (step_seconds if step_seconds > total else total)
    shares = {g: t * scale for g, t in group_seconds.items()}
    names = tuple(name for name, _ in unnamed)
    return Windows(
        step_seconds, counted, group_seconds, untimed, shares, checkpoint_seconds, groups, names
    )


def clip_unnamed(unnamed: list[tuple[str, float]], room: float) -> dict[str, float]:
    """§2 (v4): the timers no threshold names, clipped to `room` = S − N (the time the named
    timers left untimed). They count U′ = min(U, max(0, room)) seconds in all, each its share
    of U′ (none is a window when U′ = 0). The log cannot say whether such a timer ran
    beside the others inside `step` (then it is unchanged), after `step`, or nested in
    another timer (then it cannot push `other` past the untimed time)."""
    whole = 0.0
    for _, value in unnamed:
        whole += value
    if whole <= room:
        return dict(unnamed)
    if room <= 0.0:
        return {}
    scale = room / whole
    return {name: value * scale for name, value in unnamed}


def split_inner(
    all_timers: Mapping[str, float], th: Thresholds, batches: float | None = None
) -> Mapping[str, float]:
    """§2 `split_timers`: an inner timer logged from inside an outer one splits it.

    When the inner is usable and <= the outer, the outer is replaced by the inner and a rest
    window (outer - inner); when it is larger, or the outer is absent, the inner is dropped.
    verl 0.6's sync rollout: `generate_sequences` inside `gen`, the rest its weight load.
    With DAPO's n > 1 generation `batches` the outer adds up over the n batches while the
    inner keeps the last one: the inner part is min(outer, n x inner) (v4).
    Returns `all_timers` itself when no inner timer is present.
    """
    out: dict[str, float] | None = None
    for inner, (outer, rest) in th.split_timers.items():
        seconds = all_timers.get(inner)
        if seconds is None:
            continue
        if out is None:
            out = dict(all_timers)
        del out[inner]
        whole = out.get(outer)
        if whole is not None and seconds <= whole:
            if batches is not None and batches > 1.0:
                seconds = min(whole, batches * seconds)
            del out[outer]
            out[inner] = seconds
            out[rest] = whole - seconds
    return all_timers if out is None else out


def _checkpoint_inside(
    seconds: float,
    step_seconds: float,
    others: float,
    all_timers: Mapping[str, float],
    separated: bool,
    th: Thresholds,
) -> bool:
    """§2: `save_checkpoint` is a window of the step only when all three conditions hold."""
    return (
        all(name in all_timers for name in th.checkpoint_needs)  # 1. e.g. update_weights
        and not separated  # 2. no marker of a separated trainer
        and seconds <= step_seconds - others + th.checkpoint_tolerance * step_seconds  # 3. fits
    )


_PLANS: dict[tuple[tuple[str, ...], Thresholds], tuple[tuple[str, str | None], ...]] = {}


def _plan(names: tuple[str, ...], th: Thresholds) -> tuple[tuple[str, str | None], ...]:
    """(timer, group) for the timers that may count, given which timers the step has; the
    group is None for a timer the thresholds do not name (clipped, `clip_unnamed`).

    Not windows: ignored timers, and a nested timer whose outer timer is present. A
    regrouped timer takes its other group when its marker timer is present (PRIME's `adv`
    with `verify`). The checkpoint timer is in the plan; `split` decides whether it ran
    inside the step. Memoized by (names, thresholds): a job logs the same timers step after
    step.
    """
    key = (names, th)
    plan: tuple[tuple[str, str | None], ...] | None = _recall(_PLANS, key)
    if plan is None:
        ignored, nested, groups = th.ignored_timers, th.nested_timers, th.timer_groups
        present = set(names)
        regrouped = {
            timer: group
            for timer, (marker, group) in th.regrouped_timers.items()
            if marker in present
        }
        plan = tuple(
            (name, regrouped.get(name) or groups.get(name) or _unnamed(name, th))
            for name in names
            if name not in ignored and not (name in nested and nested[name] in present)
        )
        _remember(_PLANS, key, plan)
    return plan


def _unnamed(name: str, th: Thresholds) -> str | None:
    """`other` for a timer the thresholds name outside `groups` (a nested timer whose outer
    is absent, a split's rest window), None for one they do not name at all."""
    if name in th.nested_timers or name in th.split_timers:
        return "other"
    return None


def named_timers(th: Thresholds) -> frozenset[str]:
    """Every timer the thresholds name: grouped, ignored, nested (inner and outer), split
    (inner, outer and rest) and regrouped (timer and marker). Any other is clipped."""
    names = set(th.timer_groups) | th.ignored_timers
    names |= set(th.nested_timers) | set(th.nested_timers.values())
    for inner, (outer, rest) in th.split_timers.items():
        names |= {inner, outer, rest}
    for timer, (marker, _group) in th.regrouped_timers.items():
        names |= {timer, marker}
    return frozenset(names)
