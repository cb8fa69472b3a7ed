"""A framework's step as a verl-keyed record, by its table (tables.py).

Windows become `timing_s/<verl timer>` (the windows a table maps to one timer add up: they run
one after another, or only one of them runs in a loop); a window nested inside another is taken out of its
parent's seconds (never counted twice); a timer the table does not name becomes an unnamed
verl timer (`timing_s/<framework>:<key>`), which the decision table clips into `other`; the
step total becomes `timing_s/step`, or, for a framework whose windows run one after another
with no total, the sum of its timers. Values the table names are copied under verl's key.
Nothing else of the framework's record is kept: a value the framework does not supply stays
missing, never guessed, and shows under "cannot show".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..diagnosis import Record
from ..diagnosis.steps import STEP_KEY, TOKENS_KEY
from ..diagnosis.values import TIMER_PREFIX, num
from .tables import TABLES, VERL, Framework

MAX_HELD_STEPS = 4  # steps a lagged framework's translator holds at most


def is_timer(fw: Framework, key: str) -> bool:
    """Whether `key` is one of the framework's timers (a window of the step or not)."""
    return key.startswith(fw.timer_prefixes) and key.endswith(fw.timer_suffix)


def to_record(framework: str, step: int, raw: Mapping[str, Any]) -> Record:
    """The verl record of one step of `framework` (its lagged keys included as they are:
    `Translator` moves them to the step they measured)."""
    if framework == VERL:
        return Record(step, dict(raw))
    fw = TABLES[framework]
    data: dict[str, Any] = {}
    timed = _windows(fw, raw, data)
    _unnamed(fw, raw, data, timed)
    if fw.step_total is not None:
        if fw.step_total in raw:
            data[STEP_KEY] = raw[fw.step_total]
    elif timed:
        data[STEP_KEY] = sum(timed.values())
    for verl_key, key in fw.values.items():
        if key in raw:
            data[verl_key] = raw[key]
    if TOKENS_KEY not in data and fw.tokens_product:
        factors = [num(raw.get(k)) for k in fw.tokens_product]
        if all(f is not None for f in factors):
            product = 1.0
            for f in factors:
                product *= f  # type: ignore[operator]  # (None ruled out above)
            data[TOKENS_KEY] = product
    return Record(step, data)


def _windows(fw: Framework, raw: Mapping[str, Any], data: dict[str, Any]) -> dict[str, float]:
    """The named windows' seconds as verl timers in `data`; returns every usable timer's
    seconds by the framework's key (a parent net of its nested windows)."""
    seconds = {w.key: v for w in fw.windows if (v := num(raw.get(w.key))) is not None}
    for w in fw.windows:
        if w.inside is not None and w.key in seconds and w.inside in seconds:
            seconds[w.inside] = max(0.0, seconds[w.inside] - seconds[w.key])
    for w in fw.windows:
        if w.key not in seconds or w.timer is None:
            continue
        name = TIMER_PREFIX + w.timer
        previous = num(data.get(name))
        data[name] = seconds[w.key] + (previous or 0.0)
    return seconds


def _unnamed(
    fw: Framework, raw: Mapping[str, Any], data: dict[str, Any], timed: dict[str, float]
) -> None:
    """Timers the table does not name, as unnamed verl timers (clipped into `other`)."""
    named = {w.key for w in fw.windows}
    for key, value in raw.items():
        if key in named or key == fw.step_total or key in fw.not_windows:
            continue
        if not isinstance(key, str) or not is_timer(fw, key):
            continue
        seconds = num(value)
        if seconds is not None:
            data[f"{TIMER_PREFIX}{fw.name}:{key}"] = seconds
            timed[key] = seconds


class Translator:
    """Records of one framework's job, each number on the step it measured: a framework
    that logs a key one step late has its step held until that key arrives (the next
    step's line), the next step after it begins, or the input ends. Steps come out in
    order, each once, merged."""

    def __init__(self, framework: str):
        self.framework = framework
        self.table = TABLES.get(framework)
        self._held: dict[int, dict[str, Any]] = {}
        self.late = 0  # lagged values whose step was already given out

    def feed(self, step: int, raw: Mapping[str, Any]) -> Iterator[Record]:
        fw = self.table
        if fw is None or not fw.lagged:
            yield to_record(self.framework, step, raw)
            return
        if self._held and step < max(self._held):  # a new run: the old one is over
            yield from self.finish()
        lagged = {k: v for k, v in raw.items() if k in fw.lagged}
        own = {k: v for k, v in raw.items() if k not in fw.lagged}
        if lagged:
            if step - 1 in self._held:
                self._held[step - 1].update(lagged)
            elif step - 1 >= 0:
                self.late += 1
        self._held.setdefault(step, {}).update(own)
        done = [s for s in self._held if s < step - 1 or (s == step - 1 and lagged)]
        if len(self._held) - len(done) > MAX_HELD_STEPS:
            done = sorted(self._held)[: len(self._held) - MAX_HELD_STEPS]
        for s in sorted(done):
            yield to_record(self.framework, s, self._held.pop(s))

    def finish(self) -> Iterator[Record]:
        """Every held step, in order: the input ended (or a new run began)."""
        for s in sorted(self._held):
            yield to_record(self.framework, s, self._held.pop(s))
