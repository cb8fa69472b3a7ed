"""§2 of the decision table: verl timers -> counted windows -> group seconds and shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .thresholds import GROUPS, Thresholds
from .values import AGENT_LOOP, TIMER_PREFIX, num

_PREFIX_LEN = len(TIMER_PREFIX)


def timers(data: Mapping[str, Any]) -> dict[str, float]:
    """Every usable `timing_s/<timer>` value, with fully-async's doubled prefix undone.

    `timing_s/timing_s/param_sync` becomes `param_sync`; when a timer appears under both
    spellings the larger value is kept. `agent_loop/` keys are per-sample statistics, not
    windows, and are left out.
    """
    out: dict[str, float] = {}
    for key, value in data.items():
        if not key.startswith(TIMER_PREFIX):
            continue
        name = key[_PREFIX_LEN:]
        if name.startswith(TIMER_PREFIX):
            name = name[_PREFIX_LEN:]
        if name.startswith(AGENT_LOOP):
            continue
        x = num(value)
        if x is None:
            continue
        old = out.get(name)
        if old is None or x > old:
            out[name] = x
    return out


@dataclass(frozen=True)
class Windows:
    """The step's time, split into decision-table groups."""

    step_seconds: float  # S
    counted: Mapping[str, float]  # timer -> seconds, only timers that count as windows
    group_seconds: Mapping[str, float]  # every group; `other` includes the untimed remainder
    untimed_seconds: float  # R
    shares: Mapping[str, float]  # every group, unrounded


def split(step_seconds: float, all_timers: Mapping[str, float], th: Thresholds) -> Windows:
    """Group the counted timers of one step whose `timing_s/step` is `step_seconds` (> 0)."""
    counted = {
        name: value
        for name, value in all_timers.items()
        if name not in th.ignored_timers
        and not (name in th.nested_timers and th.nested_timers[name] in all_timers)
    }
    group_seconds = dict.fromkeys(GROUPS, 0.0)
    total = 0.0
    for name, value in counted.items():
        group_seconds[th.timer_groups.get(name, "other")] += value
        total += value
    untimed = max(0.0, step_seconds - total)
    group_seconds["other"] += untimed
    denominator = max(step_seconds, total)
    shares = {g: t / denominator for g, t in group_seconds.items()}
    return Windows(step_seconds, counted, group_seconds, untimed, shares)
