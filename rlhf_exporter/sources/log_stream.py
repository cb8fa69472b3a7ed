"""One long-lived `GET` whose body is read as it arrives: Ray's State API log stream.

`GET /api/v0/logs/stream?actor_id=...&lines=-1` answers with the actor's whole stdout file
from its first byte, then follows it for as long as the connection stays open (Ray sends the
body chunked, and keeps the file open on the actor's node). The console source
(sources/console.py) keeps one such stream per verl trainer actor and reads it without
waiting: `read(budget)` returns what has arrived, at most `budget` bytes, or `b""`.

Bounds, as in sources/http.py (whose connect, status line and header reading it shares):
one deadline over connect and headers, identity encoding only, no redirect, a cap on a
chunk-size line; the body is never held: what `read` returns is all that is kept. A stream
re-opened after a failure starts from the file's first byte again; `skip` drops the bytes
already delivered, so a reconnect never delivers a line twice (Ray's log files only grow).
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from . import http

RECV = 1 << 18
MAX_CHUNK_LINE = http.MAX_CHUNK_LINE


class StreamEnded(Exception):
    """The server ended the body (the last chunk, or the connection closed)."""


class LogStream:
    """A streamed answer to `GET url`, decoded incrementally (chunked or until close)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        skip: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.skip = skip  # body bytes to drop first (already delivered before a reconnect)
        self._ssl = ssl_context
        self._sock: socket.socket | None = None
        self._raw = bytearray()  # received, not yet decoded
        self._chunked = False
        self._left = 0  # bytes of the current chunk still to come (chunked)
        self._crlf = False  # a chunk's data ended: its CRLF comes next
        self._ended = False
        self._failure: Exception | None = None  # raised by the read after the one it cut

    def fileno(self) -> int:
        """The socket's, for select (-1 once closed)."""
        return self._sock.fileno() if self._sock is not None else -1

    @property
    def has_buffered(self) -> bool:
        """Bytes already received and not yet decoded (select would not see them)."""
        return bool(self._raw) or self._failure is not None

    def open(self) -> None:
        """Connect and read the answer's head (blocking, within `timeout`). A non-200
        answer closes the stream: `HttpFailure` with its status."""
        parts = urlsplit(self.url)
        client = http.Client(timeout=self.timeout, max_bytes=1, ssl_context=self._ssl)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise http.HttpFailure(http.BAD_HTTP, "bad port in the log stream URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise http.HttpFailure(http.BAD_HTTP, "not an http(s) URL")
        what = f"GET {parts.scheme}://{parts.netloc}{parts.path}"[:300]
        deadline = time.monotonic() + self.timeout
        sock = client._connect((parts.scheme, parts.hostname, port), deadline, what)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(self._request(parts.netloc, parts.path, parts.query))
            reader = http._Reader(sock, deadline, what)
            status, _version, headers = http._read_head(reader, what)
            if status != 200:
                kind = http.REDIRECT if 300 <= status < 400 else http.HTTP_ERROR
                raise http.HttpFailure(kind, f"{what}: HTTP {status}", status)
            self._framing(headers, what)
        except (OSError, http.HttpFailure) as exc:
            http._close(sock)
            if isinstance(exc, http.HttpFailure):
                raise
            raise http.HttpFailure(http.UNREACHABLE, f"{what}: {http._os_words(exc)}") from None
        self._raw = bytearray(reader.buf)
        sock.setblocking(False)
        self._sock = sock

    def _request(self, netloc: str, path: str, query: str) -> bytes:
        lines = [
            f"GET {path or '/'}{'?' + query if query else ''} HTTP/1.1",
            f"Host: {netloc}",
            "Accept: text/plain",
            "Accept-Encoding: identity",
            "User-Agent: rlhf-exporter",
            "Connection: close",
        ]
        for name, value in self.headers.items():
            if any(c in name + value for c in "\r\n"):
                raise http.HttpFailure(http.BAD_HTTP, "a header with a line break")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")

    def _framing(self, headers: Mapping[str, str], what: str) -> None:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        transfer = headers.get("transfer-encoding", "").strip().lower()
        if encoding not in ("", "identity") or transfer not in ("", "chunked"):
            raise http.HttpFailure(http.ENCODED, f"{what}: an encoded answer refused")
        self._chunked = transfer == "chunked"

    def read(self, budget: int) -> bytes:
        """What has arrived (at most `budget` bytes, after `skip`), without waiting; `b""`
        when nothing has. `StreamEnded` once the body is over; `HttpFailure` on a broken
        framing or connection. Either way the stream is then closed; bytes that arrived
        before the end are returned first, and the end is raised by the next read."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._sock is None:
            raise StreamEnded
        out = bytearray()
        try:
            while len(out) < budget:
                got = self._decode(budget - len(out))
                if got:
                    out += self._drop_skipped(got)
                elif self._ended or not self._receive(budget):
                    break
            if self._ended and not out:
                raise StreamEnded
        except (http.HttpFailure, StreamEnded) as exc:
            self.close()
            if not out:
                raise
            self._failure = exc
        return bytes(out)

    def _drop_skipped(self, got: bytes) -> bytes:
        if self.skip <= 0:
            return got
        cut = min(self.skip, len(got))
        self.skip -= cut
        return got[cut:]

    def _receive(self, budget: int) -> bool:
        """Move what the socket has into `_raw`, without waiting; whether anything came
        (the end of the connection counts: it ends the body)."""
        if self._sock is None:
            return False
        try:
            data = self._sock.recv(min(RECV, budget + MAX_CHUNK_LINE))
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            raise http.HttpFailure(http.UNREACHABLE, f"log stream: {http._os_words(exc)}") from None
        if not data:
            if self._chunked and (self._left or self._raw or not self._ended):
                raise http.HttpFailure(http.BAD_HTTP, "log stream: cut before its last chunk")
            self._ended = True
            return True
        self._raw += data
        return True

    def _decode(self, want: int) -> bytes:
        """Body bytes decoded from `_raw` (at most `want`)."""
        if not self._chunked:
            got = bytes(self._raw[:want])
            del self._raw[: len(got)]
            return got
        out = bytearray()
        while len(out) < want and not self._ended:
            if self._left:
                take = min(self._left, want - len(out), len(self._raw))
                if not take:
                    break
                out += self._raw[:take]
                del self._raw[:take]
                self._left -= take
                self._crlf = self._left == 0
                continue
            if not self._next_chunk():
                break
        return bytes(out)

    def _next_chunk(self) -> bool:
        """Read a chunk's CRLF and the next size line from `_raw`; False when incomplete."""
        nl = self._raw.find(b"\n", 0, MAX_CHUNK_LINE + 2)
        if nl < 0:
            if len(self._raw) > MAX_CHUNK_LINE + 2:
                raise http.HttpFailure(http.BAD_HTTP, "log stream: a chunk line too long")
            return False
        line = bytes(self._raw[:nl]).strip()
        del self._raw[: nl + 1]
        if self._crlf:
            self._crlf = False
            if line:
                raise http.HttpFailure(http.BAD_HTTP, "log stream: a chunk without its line end")
            return True
        size = line.split(b";", 1)[0].strip()
        try:
            if not size or len(size) > 16:
                raise ValueError
            self._left = int(size, 16)
        except ValueError:
            raise http.HttpFailure(http.BAD_HTTP, "log stream: a bad chunk size") from None
        if self._left == 0:
            self._ended = True
        return True

    def close(self) -> None:
        if self._sock is not None:
            http._close(self._sock)
            self._sock = None


def wait_readable(streams: Iterable[LogStream], timeout: float) -> set[int]:
    """The ids of the streams with something to read, waiting up to `timeout` seconds."""
    ready = {id(s) for s in streams if s.has_buffered}
    open_ = {s.fileno(): s for s in streams if s.fileno() >= 0}
    if ready or not open_:
        return ready
    try:
        readable, _, _ = select.select(list(open_), [], [], timeout)
    except (OSError, ValueError):
        return set()
    return {id(open_[fd]) for fd in readable}
