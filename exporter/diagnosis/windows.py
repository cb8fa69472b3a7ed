"""§2 of the decision table: verl timers -> counted windows -> group seconds and shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .thresholds import GROUPS, Thresholds
from .values import _INF, AGENT_LOOP, TIMER_PREFIX

_PREFIX_LEN = len(TIMER_PREFIX)
_ZERO = dict.fromkeys(GROUPS, 0.0)


class Windows(NamedTuple):
    """The step's time, split into decision-table groups."""

    step_seconds: float  # S
    counted: Mapping[str, float]  # timer -> seconds, only timers that count as windows
    group_seconds: Mapping[str, float]  # every group; `other` includes the untimed remainder
    untimed_seconds: float  # R
    shares: Mapping[str, float]  # every group, unrounded


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


_KEYSETS: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
"""(key, timer) pairs by key set: a job writes the same keys step after step."""


def timers(data: Mapping[str, Any]) -> dict[str, float]:
    """Every usable timer value of a step's data. A timer under both spellings keeps the
    larger value."""
    keys = tuple(data)
    pairs = _KEYSETS.get(keys)
    if pairs is None:
        pairs = tuple((k, n) for k in keys if (n := timer_name(k)) is not None)
        if len(_KEYSETS) > 256:  # many different shapes: keep the memo bounded
            _KEYSETS.clear()
        _KEYSETS[keys] = pairs
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


def split(step_seconds: float, all_timers: Mapping[str, float], th: Thresholds) -> Windows:
    """Group the counted timers of one step whose `timing_s/step` is `step_seconds` (> 0)."""
    counted: dict[str, float] = {}
    group_seconds = _ZERO.copy()
    total = 0.0
    for name, group in _plan(tuple(all_timers), th):
        value = all_timers[name]
        counted[name] = value
        group_seconds[group] += value
        total += value
    untimed = step_seconds - total
    if untimed < 0.0:
        untimed = 0.0
    group_seconds["other"] += untimed
    scale = 1.0 / (step_seconds if step_seconds > total else total)
    shares = {g: t * scale for g, t in group_seconds.items()}
    return Windows(step_seconds, counted, group_seconds, untimed, shares)


_PLANS: dict[tuple, tuple[tuple[str, str], ...]] = {}


def _plan(names: tuple[str, ...], th: Thresholds) -> tuple[tuple[str, str], ...]:
    """(timer, group) for the timers that count, given which timers the step has.

    Not windows: ignored timers, and a nested timer whose outer timer is present.
    Memoized by (names, thresholds): a job logs the same timers step after step.
    """
    key = (names, th)
    plan = _PLANS.get(key)
    if plan is None:
        ignored, nested, groups = th.ignored_timers, th.nested_timers, th.timer_groups
        plan = tuple(
            (name, groups.get(name, "other"))
            for name in names
            if name not in ignored and not (name in nested and nested[name] in names)
        )
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan
