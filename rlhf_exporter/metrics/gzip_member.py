"""The gzip body: one gzip member whose deflate stream is cached segments joined, each
(chunk, family) deflated once with a full flush, so that it refers to nothing before it
(docs/exposition.md)."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from .chunks import Body
from .deflate import Deflate
from .negotiation import EOF, is_openmetrics

GZIP_LEVEL = 1  # zlib's level 4 cost 1.4x the CPU at 1,000 jobs for a 4 % smaller body
_GZ_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0
_DEFLATE_END = b"\x03\x00"  # an empty final block (fixed Huffman)

Header = Callable[[Body, str], bytes]  # a family's HELP/TYPE header in the body's format


class GzipMember:
    """Deflates segments (under the exposition's lock) and joins them into gzip bodies."""

    def __init__(self, deflate: Deflate, stats: Counter[str]):
        self._lib = deflate  # metrics/deflate.py: ISA-L's, else zlib's
        self._deflater = deflate.compressor(GZIP_LEVEL)  # raw deflate
        self._headers: dict[tuple[str, str], bytes] = {}  # (ctype, family) -> its segment
        self.stats = stats

    def forget(self, ctype: str) -> None:
        self._headers = {k: v for k, v in self._headers.items() if k[0] != ctype}

    def member(self, body: Body, plain: Iterable[bytes], header: Header) -> bytes:
        """The gzip member of this body, whose plain bytes are `plain`: its CRC-32 and
        length are the plain body's."""
        self.stats["gzip_bodies"] += 1
        crc = size = 0
        crc32 = self._lib.crc32
        for part in plain:
            crc = crc32(part, crc)  # no need to join the plain body for it
            size += len(part)
        parts = [_GZ_HEADER]
        parts.extend(self._segments(body, header))
        parts.append(_DEFLATE_END)
        parts.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(parts)

    def _deflate(self, data: bytes) -> bytes:
        self.stats["segments_deflated"] += 1
        return self._lib.segment(self._deflater, data)

    def _segments(self, body: Body, header: Header) -> Iterator[bytes]:
        ctype = body.ctype
        for name in body.names:
            key = (ctype, name)
            segment = self._headers.get(key)
            if segment is None:
                segment = self._headers[key] = self._deflate(header(body, name))
            yield segment
            for chunk in body.chunks:
                raw = chunk.raw.get(name)
                if raw is None:
                    continue
                segment = chunk.gz.get(name)
                if segment is None:
                    segment = chunk.gz[name] = self._deflate(raw)
                yield segment
        if is_openmetrics(ctype):
            segment = self._headers.get((ctype, ""))
            if segment is None:
                segment = self._headers[ctype, ""] = self._deflate(EOF)
            yield segment
