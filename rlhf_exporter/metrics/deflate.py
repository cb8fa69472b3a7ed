"""The deflate and CRC-32 that the gzip /metrics body is made with.

Two backends write the same kind of stream (raw deflate, each segment ended by a full
flush: byte-aligned, no reference to anything before it), which every gzip reader inflates:

- `isal`: Intel's ISA-L through PyPI `isal` (a dependency on x86_64 and aarch64): at 1,000
  jobs its level 1 deflates a body's changed segments in about half of zlib's time, 3 %
  smaller, and its CRC-32 runs about 6x faster (figures in bench/HISTORY.md);
- `zlib`: the standard library's, wherever `isal` does not import.

`DEFAULT` is the first that imports. The exposition's property tests run on both.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Compressor(Protocol):
    def compress(self, data: bytes, /) -> bytes: ...
    def flush(self, mode: int = ..., /) -> bytes: ...


@dataclass(frozen=True)
class Deflate:
    name: str
    _new: Callable[[int], Compressor]
    crc32: Callable[[bytes, int], int]  # (data, running CRC) -> CRC
    full_flush: int
    max_level: int

    def compressor(self, level: int) -> Compressor:
        """A raw-deflate compressor at `level` (capped at the backend's highest)."""
        return self._new(min(level, self.max_level))

    def segment(self, c: Compressor, data: bytes) -> bytes:
        """`data` deflated into a segment that refers to nothing before it."""
        return c.compress(data) + c.flush(self.full_flush)


def _zlib() -> Deflate:
    return Deflate(
        "zlib",
        lambda level: zlib.compressobj(level, zlib.DEFLATED, -15),
        zlib.crc32,
        zlib.Z_FULL_FLUSH,
        9,
    )


def _isal() -> Deflate | None:
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return Deflate(
        "isal",
        lambda level: isal_zlib.compressobj(level, isal_zlib.DEFLATED, -15),
        isal_zlib.crc32,
        isal_zlib.Z_FULL_FLUSH,
        3,
    )


BACKENDS: dict[str, Deflate] = {d.name: d for d in (_isal(), _zlib()) if d is not None}
DEFAULT: Deflate = next(iter(BACKENDS.values()))
