"""The bounds on what one job keeps, each under one name: the per-job bounds `serve`'s
settings set (`Limits`) and the fixed ones cleaning applies to every record."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..settings import Settings

MAX_STEP = 1 << 53  # a step beyond this is not exactly a double
MAX_INT = 1 << 63  # an integer value beyond this is no verl number (and may overflow a float)
KEY_LABEL_CHARS = 120  # a label value cut from a verl key (phase, MFU stage, component, replica)
MAX_COMPONENTS = 16  # fully_async/<component>/idle_ratio components per job
ACCEPTED_KEYS = 1024  # keys a job remembers as already checked (a bounded memo)


class Limits(NamedTuple):
    """Per-job bounds on what a job keeps (settings max_unknown_timers, max_step_keys,
    max_key_chars)."""

    unknown_timers: int = 32  # distinct timers outside the thresholds' map, per job
    step_keys: int = 1024  # keys of one step's merged data
    key_chars: int = 256  # longest key kept
    # not a bound: the deprecated legacy_change_none setting, which every job of a source
    # shares like the bounds (kind="none" for a steady step; removed in the next release)
    legacy_change_none: bool = False


DEFAULT_LIMITS = Limits()


def limits_from_settings(settings: Settings) -> Limits:
    """The per-job bounds from `serve`'s settings (shared by the verl and push sources)."""
    return Limits(
        unknown_timers=settings.max_unknown_timers,
        step_keys=settings.max_step_keys,
        key_chars=settings.max_key_chars,
        legacy_change_none=settings.legacy_change_none,
    )
