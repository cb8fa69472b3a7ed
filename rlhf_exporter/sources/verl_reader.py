"""A streaming reader of verl's `file`-logger JSONL.

Feed it bytes as they arrive (a whole file, or what a tail just read); it yields the
complete records and counts every line it rejects, by reason. A line is a record only once
its trailing newline has arrived. One bad line never stops the lines after it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson

from ..diagnosis import Record

MAX_LINE_BYTES = 1 << 20

# Rejection reasons, as they appear in `rlhf_exporter_record_errors_total{reason}`.
TOO_LONG = "too_long"
NOT_UTF8 = "not_utf8"
INVALID_JSON = "invalid_json"
NOT_OBJECT = "not_object"
BAD_STEP = "bad_step"
BAD_DATA = "bad_data"
EMPTY = "empty_line"
INCOMPLETE = "incomplete_line"  # only when the input ends without a newline (see finish())
REASONS = (TOO_LONG, NOT_UTF8, INVALID_JSON, NOT_OBJECT, BAD_STEP, BAD_DATA, EMPTY, INCOMPLETE)


GZIP_MAGIC = b"\x1f\x8b"


def looks_gzip(head: bytes) -> bool:
    """Whether the first bytes of an input are gzip's magic number (a compressed log)."""
    return head.startswith(GZIP_MAGIC)


def _missing(_constant: str) -> None:
    return None


def parse_line(line: bytes) -> Record | str:
    """One line (without its newline) as a Record, or the reason it is rejected."""
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = _parse_slow(line)
        if isinstance(obj, str):
            return obj
    if type(obj) is not dict:
        return NOT_OBJECT
    step = obj.get("step")
    if type(step) is not int:
        return BAD_STEP
    data = obj.get("data")
    if type(data) is not dict:
        return BAD_DATA
    return Record(step, data)


def _parse_slow(line: bytes) -> Any:
    """What orjson refuses: bare NaN/Infinity (verl <= 0.7), huge ints, or real garbage."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8
    text = text.lstrip("\ufeff")  # a byte-order mark left by an editor
    if not text.strip():
        return EMPTY
    try:
        return json.loads(text, parse_constant=_missing)
    except (ValueError, RecursionError):
        return INVALID_JSON


class RecordReader:
    """Splits a byte stream into records; keeps the partial last line for the next feed.

    A line longer than `max_line` bytes is dropped as `too_long` without being buffered
    whole: the reader skips to the next newline.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self.max_line = max_line
        self.rejected: Counter[str] = Counter()
        self.records = 0
        self._partial = bytearray()
        self._skipping = False  # inside a line already known to be too long

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished last line held back until its newline arrives."""
        return len(self._partial)

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if not chunk:
            return
        lines = chunk.split(b"\n")
        tail = lines.pop()  # after the last newline: the start of an unfinished line
        if lines:
            if self._skipping:  # the rest of a line already counted as too long
                self._skipping = False
                del lines[0]
            elif self._partial:
                if len(self._partial) + len(lines[0]) > self.max_line:
                    self._reject(TOO_LONG)
                    del lines[0]
                else:
                    lines[0] = bytes(self._partial) + lines[0]
                self._partial.clear()
            max_line = self.max_line
            for line in lines:
                if len(line) > max_line:
                    self._reject(TOO_LONG)
                    continue
                result = parse_line(line)
                if isinstance(result, str):
                    self._reject(result)
                else:
                    self.records += 1
                    yield result
        if tail:
            self._hold(tail)

    def finish(self) -> None:
        """The input has ended: an unfinished last line is counted, never parsed."""
        if self._partial:  # (an over-long line was counted when it overflowed)
            self._reject(INCOMPLETE)
        self._partial.clear()
        self._skipping = False

    def reset(self) -> None:
        """Forget a partial line (the file was truncated or replaced)."""
        self._partial.clear()
        self._skipping = False

    def _hold(self, tail: bytes) -> None:
        if self._skipping:
            return
        if len(self._partial) + len(tail) > self.max_line:
            self._partial.clear()
            self._skipping = True
            self._reject(TOO_LONG)
            return
        self._partial += tail

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
