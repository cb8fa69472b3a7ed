"""A streaming reader of verl's console output: the steps a job prints, as records.

verl's `console` logger (on by default) prints each step with `LocalLogger.log`:
`concat_dict_to_str(data, step)` is `step:N - key:value - ...`, only the values that are
`numbers.Number`, each as `pprint.pformat(v)` (verl 0.6 to 0.9.1): `5`, `0.1`, `1e-05`,
`nan`, `inf`, `True`, and under NumPy 2 `np.float64(0.1)`, `np.int64(5)`, `np.float32(...)`.
Feed it bytes as they arrive (a saved driver log, `ray job logs`, `kubectl logs`, or a trainer
actor's own stdout streamed from Ray); it yields `Record(step, data)` with exactly the values
the `file` logger's JSONL holds for the same step (docs/verl-support.md#verls-console-output).

- A line is complete at its `\\n`; a longer one than `max_line` is skipped to its newline
  without being held (`too_long`, whatever it holds), so gigabytes without a newline cost
  `max_line` bytes. Only lines holding `step:` (or, until the job's names are found,
  `_name`) are decoded at all: the rest is found with `bytes.find`, never split or decoded.
- `\\r` rewrites a line (a progress bar): only the text after the last one counts (a CRLF's
  own `\\r` aside). ANSI escape sequences (CSI, OSC) are removed, then a `kubectl logs
  --timestamps` time, Ray's prefix `(Class pid=N)` / `(Class pid=N, ip=A)` (any further
  `, name=value`), and its dedup suffix ` [repeated Nx across cluster]` (with the one-time
  note Ray appends to the first).
- A step line with a Ray prefix counts only when the class (or the last part of a dotted
  qualname, `main.<locals>.TaskRunner`) matches `trainers` in full (default
  `sources/roles.py` TRAINER_CLASSES: TaskRunner, TaskRunnerV1, OneStepTaskRunner,
  FullyAsyncTaskRunner, FullyAsyncTrainer); another actor's is `foreign_step`. An unprefixed
  step line counts (an actor's own stdout, a trainer's pod log) unless the stream's
  `:actor_name:` marker (Ray's first lines of an actor's stdout) named another class.
- Fields are split on ` - `, each field on its last `:` (a value never holds one; a key may).
  A field without `:` belongs to the key of the next one (a key holding ` - `).
- Values: an int is an int; a float a float (`float(repr(x)) == x`: the JSONL's number);
  `np.<int type>(N)` an int, `np.<float type>(X)` a float; `True`/`False` (a bool is a
  Number) the bool, as the JSONL holds it (the decision table treats it as missing);
  `nan`/`inf`/`-inf` None, as the JSONL's `null`; anything else (a complex, a Decimal, no
  number) None and the line counted once as `bad_value`. A key stays in the record whatever
  its value, so a later record of the same step replaces it as the JSONL's would.
- A line starting `step:` that is not `step:<int>` alone or followed by ` - k:v` fields (or
  with more than MAX_KEYS fields, or a field with an empty value) is `bad_step_line`; a step
  beyond ±2**53 `bad_step`. Lines that are no step lines (other actors' and libraries'
  output) are normal: nothing is counted for them.
- The job's identity: the first `'project_name': <str>` and `'experiment_name': <str>` of
  the resolved config verl prints at start (`pprint`; a long name pprint wraps over lines as
  `('part' 'part')` is joined), from a trainer's or an unprefixed line; `None` is skipped;
  looked for until both are found or the first step line counted.
Nothing read is ever logged: only counts by reason leave this module.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Generator, Iterator
from typing import NamedTuple

from ..diagnosis import Record
from ..job.limits import MAX_STEP
from .roles import TRAINER_CLASSES

MAX_LINE_BYTES = 1 << 20
MAX_KEYS = 4096  # keys of one step line at most
MAX_DIGITS = 400  # an int printed with more digits is no metric (int() limits at 4300)
MAX_WRAP_LINES = 32  # a name pprint wrapped over more lines is left unknown

TOO_LONG = "too_long"
FOREIGN_STEP = "foreign_step"
BAD_STEP_LINE = "bad_step_line"
BAD_STEP = "bad_step"
BAD_VALUE = "bad_value"
INCOMPLETE = "incomplete_line"  # a step line cut by the input's end (see finish())
REASONS = (TOO_LONG, FOREIGN_STEP, BAD_STEP_LINE, BAD_STEP, BAD_VALUE, INCOMPLETE)

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_TIME = r"(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? )?"
_PREFIX = re.compile(_TIME + r"(?P<ray>\((?:(?P<cls>[^()\s]+) )?pid=\w+(?:, \w+=[^,()\s]*)*\) ?)?")
_REPEATED = re.compile(
    r" \[repeated \d+x across cluster\](?: \(Ray deduplicates logs by default\.[^()]*\))?$"
)
_STEP_INT = re.compile(r"-?\d+")
_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NP = re.compile(r"np\.(\w+)\((.*)\)")
_NP_INTS = frozenset(f"{s}int{n}" for s in ("", "u") for n in (8, 16, 32, 64)) | frozenset(
    ("intc", "uintc", "intp", "uintp", "longlong", "ulonglong", "int_")
)
_NP_FLOATS = frozenset(("float16", "float32", "float64", "float96", "float128", "half",
                        "single", "double", "longdouble", "float_"))  # fmt: skip
_NONFINITE = frozenset(("nan", "inf", "-inf", "+inf"))
_BOOLS = {"True": True, "False": False, "np.True_": True, "np.False_": False}
_LIT = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_NAME = re.compile(r"'(project|experiment)_name': (None\b|" + _LIT + r"|\()")
_WRAPPED = re.compile(r"\s*(" + _LIT + r")\s*(\))?")
_MARKER = b":actor_name:"
_STEP = b"step:"
_HALLMARK = re.compile(
    rb"(?m)^(?:\x1b\[[0-9;]*m)?(?:\([^()\n]{0,200}pid=\w+[^()\n]{0,200}\)(?:\x1b\[[0-9;]*m)? )?"
    rb"step:-?\d|^:(?:actor_name|job_id):"
)


class _Bad:
    """What parse_value() returns for no number at all."""


_BAD = _Bad()


class Identity(NamedTuple):
    """The job's names as its printed config gives them (None where it did not)."""

    project: str | None
    experiment: str | None


def looks_console(head: bytes) -> bool:
    """Whether the first bytes of a file look like console output rather than JSONL: a line
    that starts (after colour and Ray's prefix) as a step line or Ray's stdout markers, or
    else text (no NUL) whose first line does not start as a JSON object."""
    if _HALLMARK.search(head):
        return True
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return bool(text) and not text.startswith(b"{") and b"\x00" not in head


def parse_value(text: str) -> int | float | _Bad | None:
    """A printed value as the JSONL holds it: a number, a bool, None (nan, inf); `_BAD`
    when it is no number at all."""
    if _INT.fullmatch(text):
        return int(text) if len(text) <= MAX_DIGITS else _BAD
    if _FLOAT.fullmatch(text):
        value = float(text)
        return value if math.isfinite(value) else None
    if text in _NONFINITE:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    m = _NP.fullmatch(text)
    if m is None:
        return _BAD
    kind, inner = m.groups()
    if kind in _NP_INTS:
        return int(inner) if _INT.fullmatch(inner) and len(inner) <= MAX_DIGITS else _BAD
    if kind in _NP_FLOATS:
        inner = inner.strip("'")  # np.longdouble('0.1')
        if _FLOAT.fullmatch(inner):
            value = float(inner)
            return value if math.isfinite(value) else None
        return None if inner in _NONFINITE else _BAD
    return _BAD


class _Wrap:
    """A name pprint wrapped over lines: `('part'` now, `'part')` on a later line."""

    def __init__(self, field: str, cls: str | None):
        self.field = field
        self.cls = cls
        self.parts: list[str] = []
        self.lines = 0


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
        self._wrap: _Wrap | None = None
        self._stream_trainer = True  # the `:actor_name:` marker named a trainer (or none)
        self._trainer_cache: dict[str, bool] = {}
        self._partial = bytearray()
        self._skipping = False  # inside a line already counted as too long

    @property
    def identity(self) -> Identity | None:
        if self._project is None and self._experiment is None:
            return None
        return Identity(self._project, self._experiment)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished last line held back until its newline arrives."""
        return len(self._partial)

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if not chunk:
            return
        last = chunk.rfind(b"\n")
        if last < 0:
            self._hold(chunk)
            return
        self.lines += chunk.count(b"\n")
        first = chunk.find(b"\n")
        if self._skipping:  # the rest of a line already counted as too long
            self._skipping = False
        elif self._partial:
            if len(self._partial) + first > self.max_line:
                self.rejected[TOO_LONG] += 1
            else:
                yield from self._one(bytes(self._partial) + chunk[:first])
            self._partial.clear()
        elif first > self.max_line:
            self.rejected[TOO_LONG] += 1
        else:
            yield from self._one(chunk[:first])
        if first < last:
            yield from self._lines(chunk, first + 1, last)
        if last + 1 < len(chunk):
            self._hold(chunk[last + 1 :])

    def finish(self) -> None:
        """The input has ended: an unfinished last line that would be a step line is counted
        (`incomplete_line`), never parsed; one of other output is not."""
        if _STEP in self._partial:
            self.rejected[INCOMPLETE] += 1
        self.reset()

    def reset(self) -> None:
        """Forget a partial line and a half-read wrapped name (the input was truncated or
        started over); the names found and the stream's marker are kept."""
        self._partial.clear()
        self._skipping = False
        self._wrap = None

    def _hold(self, tail: bytes) -> None:
        if self._skipping:
            return
        if len(self._partial) + len(tail) > self.max_line:
            self._partial.clear()
            self._skipping = True
            self.rejected[TOO_LONG] += 1
            return
        self._partial += tail

    # -- the complete lines of a chunk ------------------------------------------------------
    def _lines(self, chunk: bytes, pos: int, end: int) -> Iterator[Record]:
        """The lines of chunk[pos:end] (each ended by a newline, the last at `end`)."""
        while pos < end:
            if self._wrap is not None:  # every line, until the wrapped name is read
                nl = chunk.find(b"\n", pos, end)
                nl = end if nl < 0 else nl
                if nl - pos > self.max_line:
                    self.rejected[TOO_LONG] += 1
                else:
                    yield from self._one(chunk[pos:nl])
                pos = nl + 1
                continue
            long_at = self._long_line(chunk, pos, end)
            pos = yield from self._candidates(chunk, pos, long_at)
            if pos >= long_at and long_at < end:  # skip the long line, counted
                self.rejected[TOO_LONG] += 1
                nl = chunk.find(b"\n", long_at + self.max_line + 1, end)
                pos = end + 1 if nl < 0 else nl + 1

    def _long_line(self, chunk: bytes, pos: int, end: int) -> int:
        """Where the first line longer than max_line starts in chunk[pos:end], or `end`;
        a jump of max_line bytes a step (the last newline within reach)."""
        reach = self.max_line + 1
        while end - pos >= reach:
            nl = chunk.rfind(b"\n", pos, pos + reach)
            if nl < 0:
                return pos
            pos = nl + 1
        return end

    def _candidates(self, chunk: bytes, pos: int, end: int) -> Generator[Record, None, int]:
        """Parse the lines of chunk[pos:end] that may matter, found with bytes.find; returns
        where to go on (at `end`, or after a line that began a wrapped name)."""
        other = b"_name" if self._looking else _MARKER
        s = chunk.find(_STEP, pos, end)
        o = chunk.find(other, pos, end)
        while s >= 0 or o >= 0:
            hit = o if s < 0 or 0 <= o < s else s
            start = chunk.rfind(b"\n", pos, hit) + 1 or pos
            nl = chunk.find(b"\n", hit, end)
            nl = end if nl < 0 else nl
            looking = self._looking
            yield from self._one(chunk[max(start, pos) : nl])
            pos = nl + 1
            if self._wrap is not None:
                return pos
            if looking and not self._looking:
                other = _MARKER
                o = -2
            if s < pos and s >= 0:
                s = chunk.find(_STEP, pos, end)
            if o < pos and o != -1:
                o = chunk.find(other, pos, end)
        return end

    # -- one line ----------------------------------------------------------------------------
    def _one(self, raw: bytes) -> Iterator[Record]:
        record = self._line(raw)
        if record is not None:
            self.records += 1
            yield record

    def _line(self, raw: bytes) -> Record | None:
        """The record of a step line, or None (anything else: counted only when it tried)."""
        if self._wrap is None and _STEP not in raw:
            if raw.startswith(_MARKER):
                self._marker(raw)
                return None
            if not (self._looking and b"_name'" in raw):
                return None
        text = raw.decode("utf-8", "replace")
        if "\r" in text:  # a CRLF's, then a progress bar's rewrites: the last text counts
            text = text.rstrip("\r").rpartition("\r")[2]
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        m = _PREFIX.match(text)
        assert m is not None  # (every part of it is optional)
        cls = m.group("cls")
        trainer = self._is_trainer(cls) if m.group("ray") else self._stream_trainer
        text = text[m.end() :].rstrip()
        if "across cluster]" in text:
            text = _REPEATED.sub("", text)
        is_step = text.startswith("step:")
        if self._wrap is not None:
            if not is_step:
                self._wrapped(text, cls, trainer)
                return None
            self._wrap = None  # a step line: the dump is over
        if not is_step:
            if self._looking and trainer and "_name'" in text:
                self._names(text, cls)
            return None
        if not trainer:
            self.rejected[FOREIGN_STEP] += 1
            return None
        record = self._step(text)
        if record is not None:
            if cls is not None:
                self.actor_class = cls
            self._looking = False
        return record

    def _is_trainer(self, cls: str | None) -> bool:
        if cls is None:  # `(pid=N)`: a process with no actor or task name
            return False
        known = self._trainer_cache.get(cls)
        if known is None:
            known = bool(
                self.trainers.fullmatch(cls) or self.trainers.fullmatch(cls.rpartition(".")[2])
            )
            if len(self._trainer_cache) < 256:
                self._trainer_cache[cls] = known
        return known

    def _marker(self, raw: bytes) -> None:
        name = raw[len(_MARKER) :].decode("utf-8", "replace").strip()[:200]
        self.actor_class = name or None
        self._stream_trainer = bool(name) and self._is_trainer(name)

    def _names(self, text: str, cls: str | None) -> None:
        for m in _NAME.finditer(text):
            field, literal = m.groups()
            if literal == "(":
                self._wrap = _Wrap(field, cls)
                self._wrapped(text[m.end() :], cls, True)
                return
            if literal != "None":
                self._found(field, _literal(literal))

    def _wrapped(self, text: str, cls: str | None, trainer: bool) -> None:
        """One line of a wrapped name: `'part'`, the last `'part')`; another source's line
        in between is passed over; anything else gives the name up."""
        wrap = self._wrap
        assert wrap is not None
        wrap.lines += 1
        if wrap.lines > MAX_WRAP_LINES:
            self._wrap = None
            return
        if cls != wrap.cls or not trainer:
            return
        m = _WRAPPED.match(text)
        if m is None:
            self._wrap = None
            return
        wrap.parts.append(_literal(m.group(1)) or "")
        if m.group(2):
            self._wrap = None
            self._found(wrap.field, "".join(wrap.parts))

    def _found(self, field: str, value: str | None) -> None:
        if not value:
            return
        if field == "project" and self._project is None:
            self._project = value
        elif field == "experiment" and self._experiment is None:
            self._experiment = value
        if self._project is not None and self._experiment is not None:
            self._looking = False

    def _step(self, text: str) -> Record | None:
        head, sep, rest = text.partition(" - ")
        digits = head[5:]
        if not _STEP_INT.fullmatch(digits) or (sep and not rest):
            self.rejected[BAD_STEP_LINE] += 1
            return None
        if len(digits) > 20 or not -MAX_STEP <= int(digits) <= MAX_STEP:
            self.rejected[BAD_STEP] += 1
            return None
        step = int(digits)
        if not sep:
            return Record(step, {})
        if rest.count(" - ") >= MAX_KEYS:
            self.rejected[BAD_STEP_LINE] += 1
            return None
        data = _fields(rest.split(" - "))
        if data is None:
            self.rejected[BAD_STEP_LINE] += 1
            return None
        if _BAD in data.values():
            self.rejected[BAD_VALUE] += 1
            data = {k: (None if v is _BAD else v) for k, v in data.items()}
        return Record(step, data)


def _fields(parts: list[str]) -> dict[str, object] | None:
    """`k:v` fields as a dict (the last of a repeated key wins); None when one has no value."""
    data: dict[str, object] = {}
    carry = ""
    for part in parts:
        key, sep, value = part.rpartition(":")
        if not sep:  # a key holding ` - `: it goes on in the next field
            carry += part + " - "
            continue
        if not value:
            return None
        data[carry + key] = parse_value(value)
        carry = ""
    return None if carry else data


def _literal(text: str) -> str | None:
    """A Python string literal's value; None when it is none."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str) else None
