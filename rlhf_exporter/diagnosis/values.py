"""Reading numbers out of a verl record's flat `data` dict, the way the decision table says.

A value is usable when it is a finite, non-negative int or float (not a bool). Everything
else (`null`, booleans, lists, strings, NaN/Inf, negatives) is *missing*, returned as None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TIMER_PREFIX = "timing_s/"
AGENT_LOOP = "agent_loop/"
_INF = math.inf


def num(value: Any) -> float | None:
    """The usable number in `value`, or None when the decision table calls it missing."""
    t = type(value)
    if t is float:  # `type() is` excludes bool, whose type is bool
        return value if value >= 0.0 and value != _INF else None  # NaN fails `>=`
    if t is int:
        return float(value) if value >= 0 else None
    return None


def positive(value: Any) -> float | None:
    """Like num(), but 0 is missing too (S and K in the decision table)."""
    x = num(value)
    return x if x is not None and x > 0 else None


_AGENT_KEYS: dict[str, tuple[str, str]] = {}


def agent_loop(data: Mapping[str, Any], name: str) -> float | None:
    """`agent_loop/<name>`, which verl logs under a `timing_s/` prefix.

    Both spellings are accepted; the prefixed key wins when both are present.
    """
    keys = _AGENT_KEYS.get(name)
    if keys is None:
        keys = _AGENT_KEYS[name] = (TIMER_PREFIX + AGENT_LOOP + name, AGENT_LOOP + name)
    prefixed, plain = keys
    if prefixed in data:
        return num(data[prefixed])
    return num(data.get(plain))
