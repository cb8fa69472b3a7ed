"""The one bounded HTTP client of the sidecar: every outbound read goes through it.

Ray's state and Jobs APIs (sources/ray.py), the rollout engines' `/metrics`
(sources/engines.py, sources/engine_targets.py) and the head's windows API read by a worker
(sources/remote_windows.py) all `GET` here. What answers may be hostile (an engine page, a Ray
head anyone on the cluster can submit jobs to), so one read is bounded in every way:

- **one wall-clock deadline** over connect, the status line, the headers and the body: every
  `recv` waits at most for what is left of it, so a server that trickles a byte at a time
  (headers, a chunk-size line, an error body) is cut off at the deadline, not per byte;
- **a cap on the decoded body** (`max_bytes`), checked against `Content-Length` before
  reading and while reading a chunked or close-delimited body, and a cap on the header
  block (`MAX_HEADER_BYTES`);
- **identity encoding only**: `Accept-Encoding: identity` is sent, and an answer with a
  `Content-Encoding` (or a `Transfer-Encoding` other than chunked) is refused (`encoded`),
  so a small gzip body can never expand past the cap;
- **no redirects**: a 3xx is refused (`redirect`), so a token or a query never leaves the
  configured address and another port's answer never becomes this one's;
- HTTP/1.1 keep-alive on request (`keep_alive=True`, the engines polled every second).

Two options of `request` for a caller that must read what a refusal says or keep the head of
a long answer (the stacks source, sources/stacks.py: Ray answers 403/500 with its reason in
the body, and a py-spy dump may run past its cap): `error_bytes=N` returns a non-200 answer
that is no redirect, its body cut at N bytes, instead of failing with `http_error`; and
`truncate=True` cuts a 200 body at `max_bytes` (`Answer.truncated`) instead of refusing it
as `too_large`. Either way no more than the cap is read, within the same deadline.

Every failure is an `HttpFailure` whose `reason` is one of `REASONS`; its message holds no
byte of the answer. Callers count the reasons (initialised at 0) under their own prefix.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

TIMEOUT = "timeout"  # the deadline passed (connect, headers or body)
UNREACHABLE = "unreachable"  # refused, reset, no route, a name that does not resolve
REDIRECT = "redirect"  # a 3xx answer: not followed
HTTP_ERROR = "http_error"  # any other status than 200 (`HttpFailure.status` says which)
ENCODED = "encoded"  # a Content-Encoding or Transfer-Encoding that is not identity/chunked
TOO_LARGE = "too_large"  # body over max_bytes, or headers over MAX_HEADER_BYTES
BAD_HTTP = "bad_http"  # not HTTP/1.x: a broken status line, header, length or chunk
REASONS: tuple[str, ...] = (
    TIMEOUT,
    UNREACHABLE,
    REDIRECT,
    HTTP_ERROR,
    ENCODED,
    TOO_LARGE,
    BAD_HTTP,
)
"""The vocabulary of failed reads, the same for every source (each counted from 0)."""

MAX_HEADER_BYTES = 64 << 10  # status line and headers together
MAX_CHUNK_LINE = 1024  # a chunk-size line (with extensions), and each trailer line
MAX_INTERIM = 4  # 1xx answers skipped before the real one
RECV = 1 << 16


class HttpFailure(Exception):
    """A read that did not give a 200 answer within its bounds."""

    def __init__(self, reason: str, message: str, status: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.status = status


class _Conn(NamedTuple):
    sock: socket.socket
    key: tuple[str, str, int]


class _Reader:
    """Reads one answer from a socket, every wait bounded by the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, what: str):
        self.sock = sock
        self.deadline = deadline
        self.what = what
        self.buf = bytearray()
        self.eof = False

    def fill(self) -> bool:
        """Receive more into buf; False at the end of the stream."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HttpFailure(TIMEOUT, f"{self.what}: no whole answer in time")
        try:
            self.sock.settimeout(left)
            data = self.sock.recv(RECV)
        except TimeoutError:  # socket.timeout
            raise HttpFailure(TIMEOUT, f"{self.what}: no whole answer in time") from None
        except OSError as exc:
            raise HttpFailure(UNREACHABLE, f"{self.what}: {_os_words(exc)}") from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def line(self, limit: int) -> bytes:
        """One CRLF- (or LF-) terminated line, without its end."""
        start = 0
        while True:
            nl = self.buf.find(b"\n", start)
            if nl >= 0:
                if nl > limit:
                    raise HttpFailure(BAD_HTTP, f"{self.what}: a line over {limit} bytes")
                out = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                return out[:-1] if out.endswith(b"\r") else out
            if len(self.buf) > limit:
                raise HttpFailure(BAD_HTTP, f"{self.what}: a line over {limit} bytes")
            start = len(self.buf)
            if not self.fill():
                raise HttpFailure(BAD_HTTP, f"{self.what}: the answer ended early")

    def head(self) -> bytes:
        """The status line and headers, up to the empty line."""
        start = 0
        while True:
            end = self.buf.find(b"\r\n\r\n", start)
            size = 4
            if end < 0:
                end = self.buf.find(b"\n\n", start)
                size = 2
            if end >= 0:
                out = bytes(self.buf[:end])
                del self.buf[: end + size]
                return out
            if len(self.buf) > MAX_HEADER_BYTES:
                raise HttpFailure(TOO_LARGE, f"{self.what}: headers over {MAX_HEADER_BYTES} bytes")
            start = max(0, len(self.buf) - 3)
            if not self.fill():
                raise HttpFailure(
                    UNREACHABLE if not self.buf else BAD_HTTP,
                    f"{self.what}: closed before the answer's headers",
                )

    def exactly(self, n: int) -> bytes:
        """The next `n` bytes. A large body is received straight into its own buffer (no
        buffer growing per chunk: an engine page of 4 MiB is one allocation and one copy)."""
        if len(self.buf) >= n:
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        body = bytearray(n)
        have = len(self.buf)
        body[:have] = self.buf
        self.buf.clear()
        view = memoryview(body)
        while have < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise HttpFailure(TIMEOUT, f"{self.what}: no whole answer in time")
            try:
                self.sock.settimeout(left)
                got = self.sock.recv_into(view[have:], min(n - have, 1 << 20))
            except TimeoutError:
                raise HttpFailure(TIMEOUT, f"{self.what}: no whole answer in time") from None
            except OSError as exc:
                raise HttpFailure(UNREACHABLE, f"{self.what}: {_os_words(exc)}") from None
            if not got:
                raise HttpFailure(BAD_HTTP, f"{self.what}: the body ended early")
            have += got
        view.release()
        return bytes(body)


class Answer(NamedTuple):
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    truncated: bool = False  # cut at the cap (`truncate=True`, or an error body)


class Client:
    """GET with every bound above. Thread-safe: each read has its own socket (a kept-alive
    one is taken out of the pool while in use)."""

    def __init__(
        self,
        *,
        timeout: float,
        max_bytes: int,
        accept: str = "*/*",
        headers: Mapping[str, str] | None = None,
        keep_alive: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.accept = accept
        self.headers = dict(headers or {})
        self.keep_alive = keep_alive
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], socket.socket] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for sock in idle.values():
            _close(sock)

    def forget(self, keep: set[tuple[str, str, int]]) -> None:
        """Close kept-alive connections to addresses not in `keep`."""
        with self._lock:
            gone = [k for k in self._idle if k not in keep]
            socks = [self._idle.pop(k) for k in gone]
        for sock in socks:
            _close(sock)

    def get(
        self,
        url: str,
        *,
        timeout: float | None = None,
        max_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """The body of a 200 answer to `GET url`; an HttpFailure otherwise."""
        return self.request(url, timeout=timeout, max_bytes=max_bytes, headers=headers).body

    def request(
        self,
        url: str,
        *,
        timeout: float | None = None,
        max_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        error_bytes: int = 0,
        truncate: bool = False,
    ) -> Answer:
        """The answer to `GET url`: a 200 one (its body cut at the cap with `truncate`), or
        with `error_bytes` > 0 any other non-redirect one, its body cut at `error_bytes`;
        an HttpFailure otherwise."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpFailure(BAD_HTTP, f"not an http(s) URL: {url[:200]!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise HttpFailure(BAD_HTTP, f"bad port in {url[:200]!r}") from None
        key = (parts.scheme, parts.hostname, port)
        what = f"GET {parts.scheme}://{parts.netloc}{parts.path}"[:300]
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        cap = self.max_bytes if max_bytes is None else max_bytes
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {parts.netloc}",
            f"Accept: {self.accept}",
            "Accept-Encoding: identity",
            "User-Agent: rlhf-exporter",
            f"Connection: {'keep-alive' if self.keep_alive else 'close'}",
        ]
        for name, value in {**self.headers, **(headers or {})}.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise HttpFailure(BAD_HTTP, f"{what}: a header with a line break")
            lines.append(f"{name}: {value}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        bounds = _Bounds(cap, error_bytes, truncate)
        kept = self._take(key)
        if kept is not None:
            try:
                return self._exchange(_Conn(kept, key), raw, deadline, bounds, what)
            except HttpFailure as exc:
                if exc.reason not in (UNREACHABLE, BAD_HTTP) or time.monotonic() >= deadline:
                    raise
                # the kept connection had gone stale (closed by the server): one fresh try
        sock = self._connect(key, deadline, what)
        return self._exchange(_Conn(sock, key), raw, deadline, bounds, what)

    # -- internals ---------------------------------------------------------------------------
    def _take(self, key: tuple[str, str, int]) -> socket.socket | None:
        if not self.keep_alive:
            return None
        with self._lock:
            return self._idle.pop(key, None)

    def _put(self, conn: _Conn) -> None:
        with self._lock:
            old = self._idle.get(conn.key)
            self._idle[conn.key] = conn.sock
        if old is not None:
            _close(old)

    def _connect(self, key: tuple[str, str, int], deadline: float, what: str) -> socket.socket:
        scheme, host, port = key
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpFailure(TIMEOUT, f"{what}: no connection in time")
        try:
            sock = socket.create_connection((host, port), timeout=left)
        except TimeoutError:
            raise HttpFailure(TIMEOUT, f"{what}: no connection in time") from None
        except OSError as exc:
            raise HttpFailure(UNREACHABLE, f"{what}: {_os_words(exc)}") from None
        if scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            try:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except TimeoutError:
                _close(sock)
                raise HttpFailure(TIMEOUT, f"{what}: no TLS handshake in time") from None
            except (OSError, ssl.SSLError) as exc:
                _close(sock)
                raise HttpFailure(UNREACHABLE, f"{what}: TLS: {_os_words(exc)}") from None
        return sock

    def _exchange(
        self, conn: _Conn, raw: bytes, deadline: float, bounds: _Bounds, what: str
    ) -> Answer:
        keep = False
        try:
            try:
                conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
                conn.sock.sendall(raw)
            except TimeoutError:
                raise HttpFailure(TIMEOUT, f"{what}: request not sent in time") from None
            except OSError as exc:
                raise HttpFailure(UNREACHABLE, f"{what}: {_os_words(exc)}") from None
            reader = _Reader(conn.sock, deadline, what)
            status, version, headers = _read_head(reader, what)
            if 300 <= status < 400:
                raise HttpFailure(REDIRECT, f"{what}: HTTP {status}: not followed", status)
            if status != 200 and bounds.error_bytes <= 0:
                raise HttpFailure(HTTP_ERROR, f"{what}: HTTP {status}", status)
            if status == 200:
                cap, cut = bounds.cap, bounds.truncate
            else:
                cap, cut = bounds.error_bytes, True
            body, delimited, truncated = _read_body(reader, headers, cap, what, cut)
            keep = (
                self.keep_alive
                and status == 200
                and delimited
                and not truncated
                and version == "HTTP/1.1"
                and "close" not in headers.get("connection", "").lower()
                and not reader.buf
            )
            return Answer(status, headers, body, truncated)
        finally:
            if keep:
                self._put(conn)
            else:
                _close(conn.sock)


def _read_head(reader: _Reader, what: str) -> tuple[int, str, dict[str, str]]:
    for _ in range(MAX_INTERIM + 1):
        block = reader.head().decode("latin-1")
        first, _, rest = block.partition("\n")
        words = first.strip().split(" ", 2)
        if len(words) < 2 or words[0] not in ("HTTP/1.1", "HTTP/1.0") or not words[1].isdigit():
            raise HttpFailure(BAD_HTTP, f"{what}: not an HTTP/1.x status line")
        status = int(words[1])
        if not 100 <= status <= 599:
            raise HttpFailure(BAD_HTTP, f"{what}: status {status} out of range")
        if 100 <= status < 200:
            continue  # 100 Continue and friends: the answer follows
        headers: dict[str, str] = {}
        for line in rest.split("\n"):
            line = line.rstrip("\r")
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpFailure(BAD_HTTP, f"{what}: a malformed header line")
            name = name.lower()
            value = value.strip()
            framing = name in ("content-length", "transfer-encoding")
            if framing and name in headers and headers[name] != value:
                raise HttpFailure(BAD_HTTP, f"{what}: conflicting {name} headers")
            headers[name] = value
        return status, words[0], headers
    raise HttpFailure(BAD_HTTP, f"{what}: more than {MAX_INTERIM} interim answers")


class _Bounds(NamedTuple):
    cap: int  # a 200 body's bytes at most
    error_bytes: int  # > 0: another answer's body is returned, cut at this
    truncate: bool  # a 200 body over the cap is cut, not refused


def _read_body(
    reader: _Reader, headers: Mapping[str, str], cap: int, what: str, cut: bool = False
) -> tuple[bytes, bool, bool]:
    """(the decoded body, whether its end was delimited: the connection may be reused,
    whether it was cut at `cap`). Without `cut`, a body over `cap` is `too_large`."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise HttpFailure(ENCODED, f"{what}: Content-Encoding {encoding[:40]!r} refused")
    transfer = headers.get("transfer-encoding", "").strip().lower()
    if transfer:
        if transfer != "chunked":
            raise HttpFailure(ENCODED, f"{what}: Transfer-Encoding {transfer[:40]!r} refused")
        body, whole = _chunked(reader, cap, what, cut)
        return body, whole, not whole
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or len(length) > 18:
            raise HttpFailure(BAD_HTTP, f"{what}: bad Content-Length")
        n = int(length)
        if n > cap:
            if cut:
                return reader.exactly(cap), False, True
            raise HttpFailure(TOO_LARGE, f"{what}: answer of {n} bytes, over {cap}")
        return reader.exactly(n), True, False
    while len(reader.buf) <= cap:  # delimited by the end of the connection
        if not reader.fill():
            return bytes(reader.buf), False, False
    if cut:
        return bytes(reader.buf[:cap]), False, True
    raise HttpFailure(TOO_LARGE, f"{what}: answer over {cap} bytes")


def _chunked(reader: _Reader, cap: int, what: str, cut: bool = False) -> tuple[bytes, bool]:
    """(the decoded body, whether it was read whole: False when cut at `cap`)."""
    out = bytearray()
    while True:
        size_line = reader.line(MAX_CHUNK_LINE).split(b";", 1)[0].strip()
        try:
            if not size_line or len(size_line) > 16:
                raise ValueError
            size = int(size_line, 16)
        except ValueError:
            raise HttpFailure(BAD_HTTP, f"{what}: a bad chunk size") from None
        if size == 0:
            for _ in range(64):  # trailers, up to the empty line
                if not reader.line(MAX_CHUNK_LINE):
                    return bytes(out), True
            raise HttpFailure(BAD_HTTP, f"{what}: too many trailer lines")
        if len(out) + size > cap:
            if cut:
                out += reader.exactly(cap - len(out))
                return bytes(out), False
            raise HttpFailure(TOO_LARGE, f"{what}: answer over {cap} bytes")
        out += reader.exactly(size)
        if reader.line(MAX_CHUNK_LINE):
            raise HttpFailure(BAD_HTTP, f"{what}: a chunk without its line end")


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _os_words(exc: BaseException) -> str:
    """The operating system's words ('Connection refused'), never a byte of an answer."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__
