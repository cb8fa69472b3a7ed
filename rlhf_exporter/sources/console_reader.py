"""A streaming reader of verl's console output: the steps a job prints, as records.

verl's `console` logger (on by default) prints each step with `LocalLogger.log`:
`concat_dict_to_str(data, step)` is `step:N - key:value - ...`, only the values that are
`numbers.Number`, each as `pprint.pformat(v)` (verl 0.6 to 0.9.1): `5`, `0.1`, `1e-05`,
`nan`, `inf`, `True`, and under NumPy 2 `np.float64(0.1)`, `np.int64(5)`, `np.float32(...)`.
Feed it bytes as they arrive (a saved driver log, `ray job logs`, `kubectl logs`, or a trainer
actor's own stdout streamed from Ray); it yields `Record(step, data)` with exactly the numbers
the `file` logger's JSONL holds for the same step (docs/verl-support.md#verls-console-output).

- A line is complete at its `\\n`; a longer one than `max_line` is skipped to its newline
  without being held (`too_long`), so gigabytes without a newline cost `max_line` bytes.
- `\\r` rewrites a line (a progress bar): only the text after the last one counts. ANSI
  escape sequences are removed, then Ray's prefix `(Class pid=N)` / `(Class pid=N, ip=A)`
  and its dedup suffix ` [repeated Nx across cluster]`.
- A step line with a Ray prefix counts only when the class is a verl trainer
  (`sources/roles.py` TRAINER_CLASSES); another actor's is `foreign_step`. An unprefixed
  step line counts (an actor's own stdout, a trainer's pod log) unless the stream's
  `:actor_name:` marker (Ray's first lines of an actor's stdout) named another class.
- A value that is `nan`/`inf`, a bool or no number is missing (left out of the record, as the
  JSONL's `null` is missing); a value that is no Python number at all is also counted
  (`bad_value`, once a line). A malformed step line is `bad_step_line`, a step beyond 2**53
  `bad_step`. Lines that are no step lines (other actors' and libraries' output) are
  normal: nothing is counted for them.
- The job's identity: the first `'project_name': '...'` and `'experiment_name': '...'` of
  the resolved config verl prints at start (a trainer's or an unprefixed line), looked for
  until the first step line.
Nothing read is ever logged: only counts by reason leave this module.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..diagnosis import Record
from .roles import TRAINER_CLASSES

MAX_LINE_BYTES = 1 << 20
MAX_KEYS = 4096  # keys of one step line at most
MAX_STEP = 1 << 53

TOO_LONG = "too_long"
FOREIGN_STEP = "foreign_step"
BAD_STEP_LINE = "bad_step_line"
BAD_STEP = "bad_step"
BAD_VALUE = "bad_value"
INCOMPLETE = "incomplete_line"
REASONS = (TOO_LONG, FOREIGN_STEP, BAD_STEP_LINE, BAD_STEP, BAD_VALUE, INCOMPLETE)

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_PREFIX = re.compile(r"\((?P<cls>[\w.<>]+) pid=\d+(?:, ip=[^)\s]+)?(?:, [^)]*)?\) ?")
_REPEATED = re.compile(r" \[repeated \d+x across cluster\]")
_STEP = re.compile(r"step:(-?\d+)(?: - (.*))?$", re.S)
_NP = re.compile(r"np\.(?:float|int|uint)(?:8|16|32|64|128)?\((.*)\)$")
_NAME = re.compile(r"'(project_name|experiment_name)': (.+?)[,}\s]*$")
_MARKER = b":actor_name:"


class Identity(NamedTuple):
    """The job's names as its printed config gives them (None where it did not)."""

    project: str | None
    experiment: str | None


def looks_console(head: bytes) -> bool:
    """Whether the first bytes of a file look like console output rather than JSONL."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"{") and b'"step"' in text[:4096]:
        return False
    return b"step:" in head or b"project_name" in head or _MARKER in head or b"pid=" in head


def number(text: str) -> float | int | str | None:
    """A printed value as its number; None when missing (nan, inf, a bool); the string
    "bad" when it is no number at all."""
    m = _NP.match(text)
    if m:
        text = m.group(1)
    if text in ("True", "False"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return "bad"
    return value if math.isfinite(value) else None


class ConsoleReader:
    """Splits console output into step records; keeps the partial last line for the next
    feed, and the job's identity from its printed config."""

    def __init__(self, max_line: int = MAX_LINE_BYTES, *, trainers: re.Pattern[str] | None = None):
        self.max_line = max_line
        self.trainers = trainers or TRAINER_CLASSES
        self.rejected: Counter[str] = Counter()
        self.records = 0
        self.lines = 0
        self.actor_class: str | None = None
        self._project: str | None = None
        self._experiment: str | None = None
        self._looking = True  # for the names: until both are found or a step passed
        self._stream_trainer = True  # the `:actor_name:` marker named a trainer (or none)
        self._partial = bytearray()
        self._skipping = False

    @property
    def identity(self) -> Identity | None:
        if self._project is None and self._experiment is None:
            return None
        return Identity(self._project, self._experiment)

    @property
    def pending_bytes(self) -> int:
        return len(self._partial)

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if not chunk:
            return
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if lines:
            if self._skipping:
                self._skipping = False
                lines[0] = b""
            elif self._partial:
                if len(self._partial) + len(lines[0]) > self.max_line:
                    self.rejected[TOO_LONG] += 1
                    lines[0] = b""
                else:
                    lines[0] = bytes(self._partial) + lines[0]
                self._partial.clear()
            for line in lines:
                self.lines += 1
                if len(line) > self.max_line:
                    self.rejected[TOO_LONG] += 1
                    continue
                record = self._line(line)
                if record is not None:
                    self.records += 1
                    yield record
        if tail:
            self._hold(tail)

    def _hold(self, tail: bytes) -> None:
        if self._skipping:
            return
        if len(self._partial) + len(tail) > self.max_line:
            self._partial.clear()
            self._skipping = True
            self.rejected[TOO_LONG] += 1
            return
        self._partial += tail

    def finish(self) -> None:
        """The input has ended: an unfinished last line is counted, never parsed."""
        if self._partial:
            self.rejected[INCOMPLETE] += 1
        self._partial.clear()
        self._skipping = False

    def reset(self) -> None:
        """Forget a partial line (the input started over)."""
        self._partial.clear()
        self._skipping = False

    # -- one line ----------------------------------------------------------------------------
    def _line(self, raw: bytes) -> Record | None:
        """The record of a step line, or None (anything else: counted only when it tried)."""
        if b"step:" not in raw and not (self._looking and b"_name'" in raw):
            if raw.startswith(_MARKER):
                self._marker(raw)
            return None
        text = raw.decode("utf-8", "replace")
        if "\r" in text:  # a CRLF's, then a progress bar's rewrites: the last text counts
            text = text.rstrip("\r").rpartition("\r")[2]
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        text = text.strip()
        cls = None
        m = _PREFIX.match(text)
        if m:
            cls = m.group("cls").rpartition(".")[2]
            text = text[m.end() :]
        if "[repeated" in text:
            text = _REPEATED.sub("", text)
        trainer = (cls is None and self._stream_trainer) or (
            cls is not None and self.trainers.fullmatch(cls) is not None
        )
        if not text.startswith("step:"):
            if self._looking and trainer and "_name'" in text:
                self._names(text)
            return None
        if not trainer:
            self.rejected[FOREIGN_STEP] += 1
            return None
        if cls is not None and self.actor_class is None:
            self.actor_class = cls
        self._looking = False
        return self._step(text)

    def _marker(self, raw: bytes) -> None:
        name = raw[len(_MARKER) :].decode("utf-8", "replace").strip()
        self.actor_class = name.rpartition(".")[2][:200] or None
        self._stream_trainer = (
            bool(name) and self.trainers.fullmatch(name.rpartition(".")[2]) is not None
        )

    def _names(self, text: str) -> None:
        m = _NAME.search(text)
        if m is None:
            return
        try:
            value: Any = ast.literal_eval(m.group(2).strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return
        if not isinstance(value, str) or not value:
            return
        if m.group(1) == "project_name" and self._project is None:
            self._project = value
        elif m.group(1) == "experiment_name" and self._experiment is None:
            self._experiment = value
        if self._project is not None and self._experiment is not None:
            self._looking = False

    def _step(self, text: str) -> Record | None:
        m = _STEP.match(text)
        if m is None:
            self.rejected[BAD_STEP_LINE] += 1
            return None
        step = int(m.group(1))
        if not -MAX_STEP <= step <= MAX_STEP:
            self.rejected[BAD_STEP] += 1
            return None
        data: dict[str, float | int] = {}
        rest = m.group(2)
        if not rest:
            return Record(step, data)
        parts = rest.split(" - ")
        if len(parts) > MAX_KEYS:
            self.rejected[BAD_STEP_LINE] += 1
            return None
        bad = False
        for part in parts:
            key, sep, value = part.rpartition(":")
            if not sep or not key:
                self.rejected[BAD_STEP_LINE] += 1
                return None
            parsed = number(value.strip())
            if isinstance(parsed, str):
                bad = True
            elif parsed is not None:
                data[key] = parsed
        if bad:
            self.rejected[BAD_VALUE] += 1
        return Record(step, data)
