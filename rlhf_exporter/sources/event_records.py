"""The events of one TensorBoard event file, read incrementally, damage counted.

An event file is a TFRecord stream: per record an 8-byte little-endian length, the masked
CRC-32C of those 8 bytes, the serialized `Event`, and the masked CRC-32C of the event. The
checksums are TensorBoard's own (`masked_crc32c` of its record reader) and each event is
decoded by TensorBoard's `event_pb2`: no protobuf is parsed here. TensorBoard's
`EventFileLoader` stops at the first damaged record and says nothing (a truncated or corrupt
record ends its reading, silently); this reader counts the damage and reads on:

- `corrupt_event`: a record whose checksum fails or whose bytes are no `Event` (bytes
  flipped, cut out or slipped in). The reader goes on at the next offset where a header's
  checksum holds (bytes cut from or added to a record leave its length wrong, so it is
  not trusted to skip). One damaged stretch counts once, however many bytes it spans.
- `truncated_event`: the input ended inside a record (`end()`: the file will not grow).

A record still being written is held until its bytes arrive, never counted by a poll. A
damaged stretch longer than MAX_DAMAGE_BYTES is no event file at all: reading it ends there
(`NotEventFile`), which bounds the work a hostile file can cost.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CORRUPT_EVENT = "corrupt_event"
TRUNCATED_EVENT = "truncated_event"
REASONS = (CORRUPT_EVENT, TRUNCATED_EVENT)

HEADER_BYTES = 12  # the length (8) and its masked CRC-32C (4)
FOOTER_BYTES = 4  # the event's masked CRC-32C
MAX_EVENT_BYTES = 1 << 24  # a longer length is damage (a scalar event is ~100 bytes)
READ_BYTES = 1 << 22  # bytes read from the file at a time
MAX_DAMAGE_BYTES = 1 << 20  # one damaged stretch looked through at most
# a header's length below MAX_EVENT_BYTES has its five high bytes zero: where to look first
_HIGH_ZEROS = b"\x00" * 5
_NONZERO = re.compile(rb"[^\x00]")


class NotEventFile(ValueError):
    """More than MAX_DAMAGE_BYTES in a row hold no record."""


class EventRecords:
    """One event file's events, from where the last `read()` stopped."""

    def __init__(
        self,
        path: Path,
        crc: Callable[[bytes], int],
        decode: Callable[[bytes], Any],
        rejected: Counter[str],
    ):
        self.path = path
        self._crc = crc  # TensorBoard's masked_crc32c
        self._decode = decode  # event_pb2.Event.FromString
        self.rejected = rejected  # its reader's, shared
        self.offset = 0  # bytes of the file read into `_buf` so far
        self._buf = b""  # bytes read but not yet consumed
        self._damaged = False  # inside a damaged stretch (counted once)
        self._skipped = 0  # bytes of the damaged stretch looked through so far

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def read(self) -> Iterator[Any]:
        """The events appended since the last read (OSError when the file cannot be read)."""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            while chunk := f.read(READ_BYTES):
                self.offset += len(chunk)
                self._buf += chunk
                yield from self._records()

    def end(self) -> None:
        """The file will not grow: bytes left of an unfinished record are counted."""
        if self._buf and not self._damaged:
            self.rejected[TRUNCATED_EVENT] += 1
        self._buf = b""

    def _records(self) -> Iterator[Any]:
        buf, at = self._buf, 0
        while len(buf) - at >= HEADER_BYTES:
            length = self._length(buf, at)
            if length is None:  # no header here: find the next one
                at = self._skip(buf, at)
                continue
            end = at + HEADER_BYTES + length + FOOTER_BYTES
            if end > len(buf):
                break  # still being written (or cut short: `end`)
            data = buf[at + HEADER_BYTES : end - FOOTER_BYTES]
            event = self._event(data, buf[end - FOOTER_BYTES : end])
            if event is None:  # its length may be what was damaged: look from the next byte
                at = self._skip(buf, at)
                continue
            at = end
            self._damaged, self._skipped = False, 0
            yield event
        self._buf = buf[at:]

    def _length(self, buf: bytes, at: int) -> int | None:
        """The length of the record at `at` when its header's checksum holds, else None."""
        header = buf[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", buf[at + 8 : at + HEADER_BYTES])
        if length > MAX_EVENT_BYTES or self._crc(header) != crc:
            return None
        return int(length)

    def _event(self, data: bytes, footer: bytes) -> Any:
        """The event of a record whose length held, or None when its bytes are damaged."""
        if self._crc(data) != struct.unpack("<I", footer)[0]:
            return None
        try:
            return self._decode(data)
        except Exception:  # checksums hold, yet no Event: damage all the same
            return None

    def _resync(self, buf: bytes, at: int, stop: int) -> int:
        """The first offset from `at` where a header's checksum holds; when none is in
        `buf` yet, the first offset a header could still start at once more bytes come;
        `stop` when none is before it (looked no further)."""
        if len(buf) - HEADER_BYTES >= stop:
            buf = buf[: stop + HEADER_BYTES - 1]
        last = len(buf) - HEADER_BYTES
        while at <= last:
            high = buf.find(_HIGH_ZEROS, at + 3, last + 8)
            if high < 0:
                break
            at = high - 3
            if buf[at : at + 3] == b"\x00\x00\x00":  # a run of zeros: skip past it
                nonzero = _NONZERO.search(buf, at)
                at = max(at + 1, (nonzero.start() if nonzero else len(buf)) - 2)
                continue
            if self._length(buf, at) is not None:
                return at
            at += 1
        return max(at, len(buf) - HEADER_BYTES + 1)

    def _skip(self, buf: bytes, at: int) -> int:
        """Past damage at `at`: counted once per stretch, to the next header's offset."""
        if not self._damaged:
            self._damaged = True
            self.rejected[CORRUPT_EVENT] += 1
        after = self._resync(buf, at + 1, at + 1 + MAX_DAMAGE_BYTES - self._skipped)
        self._skipped += after - at
        if self._skipped > MAX_DAMAGE_BYTES:
            raise NotEventFile(f"{self._skipped} bytes without a record")
        return after
