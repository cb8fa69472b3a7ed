"""The request handler: each path's answer (see the package's docstring), and
`make_server`, which binds it to the endpoints."""

from __future__ import annotations

import logging
import socket
from http.server import BaseHTTPRequestHandler
from typing import Any

import orjson

from .. import __version__
from ..sources.push import PATH as PUSH_PATH
from ..view import docs_pages
from ..view.pages import doc_page
from .connections import Server
from .endpoints import JOBS_API, Endpoints
from .page_cache import HOST_MARK, clean_host
from .pages import job_view, landing_page, with_host

log = logging.getLogger("rlhf_exporter.server")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"rlhf-exporter/{__version__}"
    timeout = 30  # seconds a connection may idle or trickle before it is closed
    endpoints: Endpoints  # set on the subclass made by make_server
    server: Server
    chunked = False  # the request came with a Transfer-Encoding (never read)

    def setup(self) -> None:
        super().setup()
        # per socket operation (reads and writes); the whole request has a deadline (Server)
        self.connection.settimeout(self.server.read_timeout)
        # Headers and body go out in two writes; without this, a kept-alive connection
        # (Prometheus keeps them) waits ~40 ms per request on Nagle + delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        # the request line and headers must arrive within read_timeout (also the idle time
        # of a kept-alive connection before its next request)
        self.server.arm(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.disarm(self.connection)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.disarm(self.connection)  # headers read: the handler takes over
        if not ok:
            return False
        # No chunked bodies here, and no GET bodies: a body framed two ways (TE and CL) is
        # how requests are smuggled past a proxy. A POST with Transfer-Encoding is answered
        # as one without a length (411, counted) and a GET's body is never read; either way
        # the connection closes after the answer, so those bytes are never parsed as the
        # next request.
        self.chunked = self.headers.get("Transfer-Encoding") is not None
        if self.chunked or (
            self.command != "POST" and self.headers.get("Content-Length", "0").strip() != "0"
        ):
            self.close_connection = True
        return True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(
        self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, orjson.dumps(obj) + b"\n", "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        ep = self.endpoints
        if path == "/metrics":
            want_gzip = accepts_gzip(self.headers.get("Accept-Encoding"))
            body, content_type, gzipped = ep.exposition.render(
                self.headers.get("Accept"), want_gzip
            )
            self._send(200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else None)
        elif path == "/healthz":
            self._text(200, "ok\n")
        elif path == "/readyz":
            why = ep.not_ready()
            if why is None:
                self._text(200, "ready\n")
            else:
                self._text(503, f"not ready: {why}\n")
        elif path == "/api/v1/status":
            self._json(200, ep.status())
        elif path == "/" or path.startswith("/jobs/"):
            host = clean_host(self.headers.get("Host"))
            mark = HOST_MARK if host else None

            def render() -> tuple[int, bytes]:
                if path == "/":
                    return 200, landing_page(ep, mark)
                return job_view(ep, path, mark)

            status, page = ep.pages.get((path, host is not None), render)
            self._send(status, with_host(page, host), "text/html; charset=utf-8")
        elif path == "/api/v1/jobs":  # the view's step history and episodes stay out of the JSON
            jobs = [
                {k: v for k, v in j.items() if k not in ("history", "episodes", "stacks")}
                for j in ep.jobs()
            ]
            self._json(200, {"jobs": jobs})
        elif path.startswith(JOBS_API):  # read-only, exposed as the job view is
            self._json(*ep.stacks_json(path))
        elif path == "/api/v1/windows" and ep.windows_api is not None:
            status, body = ep.windows_api.handle(
                self.headers.get("Authorization"), self.client_address[0]
            )
            self._send(status, body, "application/json", _auth_headers(status))
        elif path == "/runbooks" or path.startswith(("/docs", "/grafana/")):
            self._docs(path)
        elif path == PUSH_PATH:
            self._json(405, {"error": f"use POST {PUSH_PATH}"})
        else:
            self._text(
                404, "not found: try /, /metrics, /healthz, /readyz, /api/v1/status, /docs/\n"
            )

    def _docs(self, path: str) -> None:
        """The shipped runbooks, docs and dashboards (rlhf_exporter/view/docs_pages.py)."""
        if path.startswith("/grafana/"):
            body = docs_pages.dashboard(path[len("/grafana/") :])
            if body is None:
                self._text(404, "no such dashboard: see /docs/\n")
            else:
                self._send(200, body, "application/json")
            return
        if path in ("/docs", "/docs/"):
            html = docs_pages.docs_index()
        else:
            name = "runbooks" if path == "/runbooks" else path[len("/docs/") :].removesuffix(".md")
            found = docs_pages.doc_html(name) if docs_pages.valid_name(name) else None
            if found is None:
                self._text(404, "no such doc: see /docs/\n")
                return
            html = '<p><a href="/">All jobs</a> · <a href="/docs/">Docs</a></p>' + found
        self._send(200, doc_page(html).encode(), "text/html; charset=utf-8")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        push = self.endpoints.push
        if path != PUSH_PATH or push is None:
            self.close_connection = True  # the body is left unread
            what = "push is disabled (--no-push)" if path == PUSH_PATH else "not found"
            self._json(404, {"error": what})
            return
        read_bytes = 0

        def read(n: int) -> bytes:
            nonlocal read_bytes
            chunks, left = [], n
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            read_bytes = n - left
            return b"".join(chunks)

        length = None if self.chunked else self.headers.get("Content-Length")
        self.server.arm(self.connection)  # the whole body within read_timeout
        try:
            answer = push.handle(
                self.headers.get("Authorization"), length, read, self.client_address[0]
            )
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        finally:
            self.server.disarm(self.connection)
        if length is None or read_bytes != _int(length):
            self.close_connection = True  # an unread (rejected) body: do not reuse the connection
        body = orjson.dumps(answer.body) + b"\n"
        self._send(answer.status, body, "application/json", _auth_headers(answer.status))


def accepts_gzip(header: str | None) -> bool:
    """Whether Accept-Encoding allows gzip: `gzip` (or `x-gzip`) with a weight above 0, or
    `*` above 0 where gzip is not named (RFC 9110 12.5.3)."""
    star = None
    for entry in (header or "").split(",")[:32]:
        coding, *params = (t.strip() for t in entry.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            return q > 0
        if coding == "*":
            star = q > 0
    return bool(star)


def _auth_headers(status: int) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": 'Bearer realm="rlhf-exporter"'}
    if status == 429:
        return {"Retry-After": "1"}
    return None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_server(
    listen: str,
    endpoints: Endpoints,
    max_connections: int = Server.max_connections,
    read_timeout: float = Server.read_timeout,
) -> Server:
    host, port = parse_listen(listen)
    handler = type("BoundHandler", (Handler,), {"endpoints": endpoints})
    attrs: dict[str, Any] = {"max_connections": max_connections, "read_timeout": read_timeout}
    if ":" in host:
        attrs["address_family"] = socket.AF_INET6
    server: Server = type("BoundServer", (Server,), attrs)((host, port), handler)
    return server
