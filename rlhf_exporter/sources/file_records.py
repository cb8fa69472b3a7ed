"""The records of one watched file, whatever wrote it: verl's file-logger JSONL, or another
framework's per-step lines (ROLL's JSON lines, or any framework's saved console output):
the first bytes decide (`framework_console.detect`), once, as `diagnose` decides."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from ..diagnosis import Record
from ..frameworks import VERL
from .framework_console import FrameworkConsoleReader, detect
from .verl_reader import MAX_LINE_BYTES, RecordReader

SNIFF_BYTES = 64 << 10  # bytes looked at before deciding, at most (a file shorter decides at once)


class FileRecordReader:
    """RecordReader's interface (feed, finish, reset, records, rejected, pending_bytes), over
    the reader the file's first bytes call for; `framework` says which (None: not yet)."""

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self.max_line = max_line
        self._reader: RecordReader | FrameworkConsoleReader | None = None
        self._head = b""
        self.framework: str | None = None
        self.rejected: Counter[str] = Counter()  # every reader's, ever (shared with each)
        self._records = 0  # records of the readers before the current one

    @property
    def records(self) -> int:
        return self._records + (self._reader.records if self._reader is not None else 0)

    @property
    def pending_bytes(self) -> int:
        held = self._reader.pending_bytes if self._reader is not None else 0
        return held + len(self._head)

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if self._reader is None:
            self._head += chunk
            if len(self._head) < SNIFF_BYTES and b"\n" not in self._head:
                return  # not one whole line yet
            self._choose(self._head)
            chunk, self._head = self._head, b""
        assert self._reader is not None
        yield from self._reader.feed(chunk)

    def _choose(self, head: bytes) -> None:
        framework = detect(head[:SNIFF_BYTES])
        if framework is None:
            self._reader, self.framework = RecordReader(self.max_line), VERL
        else:
            self._reader = FrameworkConsoleReader(self.max_line, framework)
            self.framework = framework
        self._reader.rejected = self.rejected

    def drain(self) -> Iterator[Record]:
        """The input has ended: what a framework's reader still held (its last step)."""
        if isinstance(self._reader, FrameworkConsoleReader):
            yield from self._reader.finish()

    def finish(self) -> None:
        """The input has ended: an unfinished last line is counted (what a framework's
        reader held is dropped: `drain` gives it)."""
        if self._reader is None and self._head:  # one line and no newline: cut short
            self._choose(self._head)
            assert self._reader is not None
            for _ in self._reader.feed(self._head):
                pass
            self._head = b""
        if isinstance(self._reader, FrameworkConsoleReader):
            for _ in self._reader.finish():
                pass
        elif self._reader is not None:
            self._reader.finish()

    def reset(self) -> None:
        """The file was truncated or replaced: it is sniffed again."""
        self._records = self.records
        self._reader, self._head, self.framework = None, b"", None
