"""Where a record is parsed into what a job keeps: each verl record is cleaned here before
anything becomes a `Sample` (rlhf_exporter/job/state.py's `Job` feeds it on).

Hostile or broken input is stopped here (see `Limits`):
- a label value that is not valid UTF-8 (a lone surrogate from an undecodable file name or
  a `\\udc80` escape) or holds a control character has those code points replaced by
  U+FFFD (`label_not_utf8`, `label_control_char`);
- a number that is not a finite float (NaN, +-Inf, an integer too big for a double) is
  dropped from the record (`bad_number`); a step outside +-2**53 rejects the record
  (`bad_step`);
- per job, at most `Limits.unknown_timers` timers outside the thresholds' timer map are
  kept (and exported as `phase`); later ones are dropped (`too_many_timers`);
- `perf/mfu/<stage>` is kept for the known stages only (`unknown_mfu_stage`);
- a key longer than `Limits.key_chars` is dropped (`key_too_long`), and one step's merged
  data holds at most `Limits.step_keys` keys (`too_many_keys`), so it is bounded in keys
  and bytes however often the same step is sent again;
- a record that still makes ingestion fail is dropped and counted (`internal_error`, by
  `Job`); it never stops the records after it, nor any other job;
- a record of a step that comes after the sidecar classified the step (a step written in two
  records, decision table v5) keeps the step's verdict and is counted (`late_record`, by
  `Job`); its values still count where they are not the step's diagnosis.
Each drop is counted in the cleaner's own `dropped` counter and logged once per job and
reason; the job's source takes the counts (`Job.take_drops`) into its
`rlhf_exporter_record_errors_total{reason}`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from ..diagnosis import Record, Thresholds
from ..diagnosis.timeline import FULLY_ASYNC_PREFIX
from ..diagnosis.values import TIMER_PREFIX
from ..diagnosis.windows import timer_name
from .limits import ACCEPTED_KEYS, MAX_COMPONENTS, MAX_INT, MAX_STEP, Limits
from .record_keys import IDLE_SUFFIX, MFU_PREFIX, MFU_STAGES, USED_PREFIXES

# record_errors reasons for what ingestion drops (the sources add their own)
LABEL_NOT_UTF8 = "label_not_utf8"
LABEL_CONTROL_CHAR = "label_control_char"
BAD_NUMBER = "bad_number"
BAD_STEP = "bad_step"
TOO_MANY_TIMERS = "too_many_timers"
UNKNOWN_MFU_STAGE = "unknown_mfu_stage"
TOO_MANY_COMPONENTS = "too_many_components"
KEY_TOO_LONG = "key_too_long"
TOO_MANY_KEYS = "too_many_keys"
INTERNAL_ERROR = "internal_error"
LATE_RECORD = "late_record"  # a step's record after the step was classified (kept, counted)

log = logging.getLogger(__name__)


_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def clean_label(text: str) -> tuple[str, str | None]:
    """`text` fit to be a label value, and why it was not (None when it was).

    A lone surrogate (an undecodable byte that os.fsdecode escaped, or a JSON `\\udc80`)
    becomes U+FFFD (`label_not_utf8`), and so does a control character such as a newline
    in a directory name (`label_control_char`)."""
    if text.isprintable():  # the fast path: no surrogate, no control character
        return text, None
    reason = None
    if _SURROGATE.search(text):
        text, reason = _SURROGATE.sub("\ufffd", text), LABEL_NOT_UTF8
    if _CONTROL.search(text):
        text, reason = _CONTROL.sub("\ufffd", text), reason or LABEL_CONTROL_CHAR
    return text, reason


_KNOWN: dict[int, tuple[Thresholds, frozenset[str]]] = {}  # id(th) -> (th, its timers)


def known_timers(th: Thresholds) -> frozenset[str]:
    """Timer names the thresholds know (exported as `phase` without counting against the
    per-job cap on unknown timers). One set per thresholds object, shared by its jobs."""
    hit = _KNOWN.get(id(th))
    if hit is not None and hit[0] is th:
        return hit[1]
    nested = set(th.nested_timers) | set(th.nested_timers.values())
    known = frozenset(th.timer_groups) | th.ignored_timers | nested | {"step"}
    if len(_KNOWN) >= 8:  # a few thresholds objects per process (tests make more)
        _KNOWN.clear()
    _KNOWN[id(th)] = (th, known)
    return known


class RecordCleaner:
    """One job's cleaning: what it has let through so far (its unknown timers, its
    fully-async components, the current step's keys, a memo of keys taken unchanged) and its
    drops, counted in `dropped` (until its job's source takes them) and logged once per
    reason."""

    def __init__(self, project: str, experiment: str, th: Thresholds, limits: Limits):
        self.project, self.experiment = project, experiment
        self.limits = limits
        self.dropped: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._known_timers = known_timers(th)
        self._unknown_timers: set[str] = set()
        self._components: set[str] = set()
        self._step_keys: set[str] = set()  # keys kept so far for the current step
        self._accepted: set[str] = set()  # keys taken unchanged before (a memo, bounded)

    def drop(self, reason: str, n: int = 1, exc_info: bool = False) -> None:
        self.dropped[reason] += n
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "job %s/%s: dropped input (%s); counted in rlhf_exporter_record_errors_total, "
                "logged once per job and reason",
                self.project,
                self.experiment,
                reason,
                exc_info=exc_info,
                extra={"reason": reason},
            )

    def clean(self, record: Record, current: int | None) -> Record | None:
        """The record with every key and value this job may keep, or None to reject it
        (`current`: the step being merged, None before the run's first)."""
        step = record.step
        if type(step) is not int or not -MAX_STEP <= step <= MAX_STEP:
            self.drop(BAD_STEP)
            return None
        lim = self.limits
        out: dict[str, Any] = {}
        changed = False
        accepted = self._accepted
        for key, value in record.data.items():
            t = type(value)
            if t is float:
                if value - value != 0.0:  # NaN or +-Inf (math.isfinite, without a call)
                    self.drop(BAD_NUMBER)
                    changed = True
                    continue
            elif t is int and not -MAX_INT <= value <= MAX_INT:
                self.drop(BAD_NUMBER)
                changed = True
                continue
            if key in accepted:  # a key this job already took as it is: the common case
                out[key] = value
                continue
            if type(key) is not str or len(key) > lim.key_chars:
                self.drop(KEY_TOO_LONG)
                changed = True
                continue
            if not key.isprintable():  # a key may become a label value (phase, component)
                key, bad = clean_label(key)
                if bad:
                    self.drop(bad)
                    changed = True
            if key.startswith(TIMER_PREFIX):
                name = timer_name(key)
                if (
                    name is not None
                    and name not in self._known_timers
                    and name not in self._unknown_timers
                ):
                    if len(self._unknown_timers) >= lim.unknown_timers:
                        self.drop(TOO_MANY_TIMERS)
                        changed = True
                        continue
                    self._unknown_timers.add(name)
            elif key.startswith(MFU_PREFIX):
                if key[len(MFU_PREFIX) :] not in MFU_STAGES:
                    self.drop(UNKNOWN_MFU_STAGE)
                    changed = True
                    continue
            elif key.startswith(FULLY_ASYNC_PREFIX) and key.endswith(IDLE_SUFFIX):
                component = key[len(FULLY_ASYNC_PREFIX) : -len(IDLE_SUFFIX)]
                if component not in self._components:
                    if len(self._components) >= MAX_COMPONENTS:
                        self.drop(TOO_MANY_COMPONENTS)
                        changed = True
                        continue
                    self._components.add(component)
            if not changed and len(accepted) < ACCEPTED_KEYS:
                accepted.add(key)  # (a cleaned key is checked again each time: rare)
            out[key] = value
        if self._over_step_keys(out, current is None or step != current):
            changed = True
        return Record(step, out) if changed else record

    def _over_step_keys(self, out: dict[str, Any], new_step: bool) -> bool:
        """One step's merged data holds at most `step_keys` keys, whatever is sent again:
        the keys past the bound are dropped from `out` (the ones the exporter reads kept
        first); whether any was."""
        seen, bound = self._step_keys, self.limits.step_keys
        if new_step:
            seen.clear()
            if len(out) <= bound:  # a new step that fits: the common case
                seen.update(out)
                return False
        new = [k for k in out if k not in seen]
        room = bound - len(seen)
        over = len(new) > room
        if over:
            new.sort(key=lambda k: not k.startswith(USED_PREFIXES))  # stable: used keys first
            for key in new[max(room, 0) :]:
                del out[key]
            self.drop(TOO_MANY_KEYS, len(new) - max(room, 0))
            new = new[: max(room, 0)]
        seen.update(new)
        return over
