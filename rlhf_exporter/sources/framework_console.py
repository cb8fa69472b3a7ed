"""A streaming reader of what the other RLHF frameworks print per step, as verl records.

- OpenRLHF: `✨ Global step N: {dict}` (its async trainer: `Global step N: {dict}`);
- slime: `perf N: {dict}`, two lines per step (the rollout manager's and the trainer's),
  merged;
- ROLL: `metrics_tag: {json}` (the step under `step` or `global_step`, the metrics under
  `metrics` or beside them); its JSON-lines file holds the same objects, one a line;
- AReaL: the boxed table (`│ key │ value │ ...`, four pairs a row) printed after
  `Train step N/M done.` (each `Stats (i/n):` table is step N-1+i-1, as AReaL logs it);
- NeMo-RL: the `⏱️  Timing:` block after `Step N/M`: `• Total step time: Xs`, then
  `• name: Xs (p%)` a line (timer names as its TensorBoard tags hold them, under
  `timing/train/`), and the `🔍 Performance Metrics` after it, for its per-group
  `E2E (Tokens/sec)`.

The framework is the first one whose line is seen (`framework`); a line of another framework
after that is `foreign_step`. Lines are complete at `\\n`; one longer than `max_line` is
skipped to its newline, never held (`too_long`). ANSI colour, a `kubectl --timestamps` time
and Ray's `(Class pid=N)` prefix are removed first; a line whose prefix names a class of
`forwarded_elsewhere` (read from that actor's own stream) is skipped. A dict that does not
parse (a Python literal for OpenRLHF and slime, JSON for ROLL) is `bad_step_line`; a step
beyond ±2**53 `bad_step`. Each step goes through the framework's `Translator`, so each
number lands on the step it measured. Nothing read is logged: only counts by reason leave
this module.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..diagnosis import Record
from ..frameworks import AREAL, NEMO_RL, OPENRLHF, ROLL, SLIME, Translator
from ..job.limits import MAX_STEP
from .console_reader import _ANSI, _PREFIX

MAX_LINE_BYTES = 1 << 20
MAX_KEYS = 4096
MAX_TABLE_ROWS = 4096  # rows of one AReaL table or NeMo-RL block at most

TOO_LONG = "too_long"
FOREIGN_STEP = "foreign_step"
BAD_STEP_LINE = "bad_step_line"
BAD_STEP = "bad_step"
INCOMPLETE = "incomplete_line"
REASONS = (TOO_LONG, FOREIGN_STEP, BAD_STEP_LINE, BAD_STEP, INCOMPLETE)

_DICT_LINES = {
    OPENRLHF: re.compile(r"(?:✨ )?Global step (-?\d+): (\{.*)$"),
    SLIME: re.compile(r"\bperf (-?\d+): (\{.*)$"),
}
_ROLL = re.compile(r"metrics_tag: (\{.*)$")
_AREAL_STEP = re.compile(r"Train step (-?\d+)/\d+ done\.")
_AREAL_STATS = re.compile(r"Stats \((\d+)/\d+\):")
_NEMO_STEP = re.compile(r"=+ Step (-?\d+)/\d+ =+")
_NEMO_TIMING = "⏱️  Timing:"
_NEMO_TOTAL = re.compile(r"• Total step time: ([-+0-9.eE]+|nan|inf)s")
_NEMO_TIMER = re.compile(r"• (\S+): ([-+0-9.eE]+|nan|inf)s \([^()]*\)")
_NEMO_PREFIX = "timing/train/"
_NEMO_E2E = re.compile(r"- E2E \(Tokens/sec\): ([-+0-9.eE]+|nan|inf)$")
NEMO_E2E_KEY = "console:e2e_tokens_per_sec"  # (the printed per-group rate: no metric key)
_HALLMARKS = (
    (OPENRLHF, re.compile(rb"Global step -?\d+: \{")),
    (SLIME, re.compile(rb"\bperf -?\d+: \{")),
    (ROLL, re.compile(rb"metrics_tag: \{")),
    (AREAL, re.compile(rb"Train step -?\d+/\d+ done\.")),
    (NEMO_RL, re.compile(rb"\xe2\x8f\xb1\xef\xb8\x8f  Timing:|=+ Step -?\d+/\d+ =+")),
)
_ROLL_JSONL = re.compile(rb'^\s*\{\s*"(?:global_)?step"\s*:\s*-?\d+\s*,\s*"metrics"\s*:\s*\{')


def detect(head: bytes) -> str | None:
    """The framework whose per-step output the first bytes of an input hold, or None."""
    found = [(m.start(), name) for name, rx in _HALLMARKS if (m := rx.search(head))]
    if found:
        return min(found)[1]
    return ROLL if _ROLL_JSONL.match(head) else None


class FrameworkConsoleReader:
    """Splits one framework's printed output into verl records (see the module's text)."""

    def __init__(
        self,
        max_line: int = MAX_LINE_BYTES,
        framework: str | None = None,
        forwarded_elsewhere: re.Pattern[str] | None = None,
    ):
        self.max_line = max_line
        self.framework = framework
        # the classes whose lines Ray forwards into this input but are read from their own
        # stream (a driver log holds its trainer actors' output): skipped here
        self.elsewhere = forwarded_elsewhere
        self.rejected: Counter[str] = Counter()
        self.records = 0
        self._translator = Translator(framework) if framework else None
        self._partial = bytearray()
        self._skipping = False
        self._block: dict[str, Any] | None = None  # an AReaL table or NeMo-RL block
        self._block_step: int | None = None
        self._areal_step: int | None = None
        self._nemo_step: int | None = None
        self._rows = 0

    @property
    def pending_bytes(self) -> int:
        return len(self._partial)

    @property
    def identity(self) -> None:
        """The job's names as its output prints them: none of these frameworks prints them
        in a form read here (the console source names the job from its submission)."""
        return None

    def reset(self) -> None:
        """Forget a partial line and a half-read block (the input started over)."""
        self._partial.clear()
        self._skipping = False
        self._block = self._block_step = None

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if not chunk:
            return
        lines = chunk.split(b"\n")
        tail = lines.pop()
        for i, line in enumerate(lines):
            if i == 0 and self._skipping:
                self._skipping = False
                continue
            if i == 0 and self._partial:
                joined = len(self._partial) + len(line)
                line, fits = bytes(self._partial) + line, joined <= self.max_line
                self._partial.clear()
                if not fits:
                    self.rejected[TOO_LONG] += 1
                    continue
            if len(line) > self.max_line:
                self.rejected[TOO_LONG] += 1
                continue
            yield from self._line(line)
        if tail and not self._skipping:
            if len(self._partial) + len(tail) > self.max_line:
                self._partial.clear()
                self._skipping = True
                self.rejected[TOO_LONG] += 1
            else:
                self._partial += tail

    def finish(self) -> Iterator[Record]:
        """The input has ended: a block being read is complete; an unfinished line that
        would be a step line is counted, never parsed; held steps come out."""
        if self._partial and detect(bytes(self._partial)) is not None:
            self.rejected[INCOMPLETE] += 1
        self._partial.clear()
        self._skipping = False
        yield from self._close_block()
        if self._translator is not None:
            for record in self._translator.finish():
                self.records += 1
                yield record

    # -- one line ---------------------------------------------------------------------------
    def _line(self, raw: bytes) -> Iterator[Record]:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if "\r" in text:
            text = text.rpartition("\r")[2]
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        m = _PREFIX.match(text)
        if m and self.elsewhere is not None and m.group("ray") and _names(self.elsewhere, m):
            return
        text = (text[m.end() :] if m else text).rstrip()
        if self._block is not None:
            if self._block_line(text):
                return
            yield from self._close_block()
        for name, rx in _DICT_LINES.items():
            if (m := rx.search(text)) is not None:
                yield from self._dict_step(name, m.group(1), m.group(2))
                return
        if (m := _ROLL.search(text)) is not None:
            yield from self._roll(m.group(1))
        elif text.startswith("{") and self.framework == ROLL:
            yield from self._roll(text)
        elif (m := _AREAL_STEP.search(text)) is not None:
            if self._claim(AREAL):
                self._areal_step = self._int_step(m.group(1))
        elif (m := _AREAL_STATS.search(text)) is not None and self._areal_step is not None:
            self._open(self._areal_step + int(m.group(1)) - 1 if len(m.group(1)) < 6 else None)
        elif (m := _NEMO_STEP.search(text)) is not None:
            if self._claim(NEMO_RL):
                self._nemo_step = self._int_step(m.group(1))
        elif _NEMO_TIMING in text and self._nemo_step is not None and self._claim(NEMO_RL):
            self._open(self._nemo_step)

    def _claim(self, name: str) -> bool:
        """Whether a line of framework `name` is this job's (the first seen decides)."""
        if self.framework is None:
            self.framework = name
            self._translator = Translator(name)
        if self.framework != name:
            self.rejected[FOREIGN_STEP] += 1
            return False
        return True

    def _int_step(self, digits: str) -> int | None:
        if len(digits) > 20 or not -MAX_STEP <= int(digits) <= MAX_STEP:
            self.rejected[BAD_STEP] += 1
            return None
        return int(digits)

    def _emit(self, step: int, raw: dict[str, Any]) -> Iterator[Record]:
        assert self._translator is not None
        for record in self._translator.feed(step, raw):
            self.records += 1
            yield record

    def _dict_step(self, name: str, digits: str, literal: str) -> Iterator[Record]:
        if not self._claim(name):
            return
        step = self._int_step(digits)
        if step is None:
            return
        raw = _python_dict(literal)
        if raw is None:
            self.rejected[BAD_STEP_LINE] += 1
            return
        yield from self._emit(step, raw)

    def _roll(self, text: str) -> Iterator[Record]:
        if not self._claim(ROLL):
            return
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        step = obj.get("step", obj.get("global_step")) if isinstance(obj, dict) else None
        if type(step) is not int:
            self.rejected[BAD_STEP_LINE] += 1
            return
        assert isinstance(obj, dict)
        if not -MAX_STEP <= step <= MAX_STEP:
            self.rejected[BAD_STEP] += 1
            return
        metrics = obj.get("metrics", obj)
        if not isinstance(metrics, dict) or len(metrics) > MAX_KEYS:
            self.rejected[BAD_STEP_LINE] += 1
            return
        yield from self._emit(step, metrics)

    # -- AReaL's table, NeMo-RL's timing block ------------------------------------------------
    def _open(self, step: int | None) -> None:
        self._block, self._block_step, self._rows = {}, step, 0

    def _block_line(self, text: str) -> bool:
        """Read one line of the open block; False when the line is not part of it."""
        assert self._block is not None
        self._rows += 1
        if self._rows > MAX_TABLE_ROWS:
            return False
        if self.framework == AREAL:  # (up to 3 lines before it: the logger's own)
            if not self._block and "│" not in text and not text.startswith("╒"):
                return self._rows <= 3
            return _areal_row(text, self._block)
        if (m := _NEMO_TOTAL.search(text)) is not None:
            self._block[_NEMO_PREFIX + "total_step_time"] = _float(m.group(1))
            return True
        if (m := _NEMO_TIMER.search(text)) is not None:
            self._block[_NEMO_PREFIX + m.group(1)] = _float(m.group(2))
            return True
        if (m := _NEMO_E2E.search(text)) is not None:
            self._block[NEMO_E2E_KEY] = _float(m.group(1))
            return True
        # the performance block after it belongs to the step; other text ends it
        return not text or text.lstrip().startswith(("•", "-", "🔍"))

    def _close_block(self) -> Iterator[Record]:
        block, step = self._block, self._block_step
        self._block = self._block_step = None
        if block is not None and step is not None and block:
            if len(block) > MAX_KEYS:
                self.rejected[BAD_STEP_LINE] += 1
                return
            yield from self._emit(step, block)


def _names(classes: re.Pattern[str], prefix: re.Match[str]) -> bool:
    """Whether Ray's prefix names a class of `classes` (or a dotted name ending in one)."""
    cls = prefix.group("cls")
    return bool(cls) and bool(classes.fullmatch(cls) or classes.fullmatch(cls.rpartition(".")[2]))


def _areal_row(text: str, block: dict[str, Any]) -> bool:
    """A line of tabulate's fancy_grid: a rule (`╒═╤`, `├─┼`) or a row `│ k │ v │ ...`;
    the bottom rule `╘` ends it."""
    cut = text.find("│")
    if cut < 0:
        return bool(text) and text.lstrip()[:1] in ("╒", "├", "╞") and not text.startswith("╘")
    cells = [c.strip() for c in text[cut:].strip("│ ").split("│")]
    for key, value in zip(cells[0::2], cells[1::2], strict=False):
        if key:
            block[key] = _float(value)
    return True


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _python_dict(text: str) -> dict[str, Any] | None:
    """A printed Python dict of metrics (str keys), or None when it is none."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None
    if not isinstance(value, dict) or len(value) > MAX_KEYS:
        return None
    return {k: v for k, v in value.items() if isinstance(k, str)}
