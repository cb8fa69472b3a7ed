"""HTTP for `serve`, and nothing else: /metrics, /healthz, /readyz, /, the push endpoint.

- `GET /metrics`: the sources' current snapshots in Prometheus text format (OpenMetrics when
  the scraper asks for it; gzip when accepted). The exposition is cached per job and per
  metric family (exporter/metrics/exposition.py): a scrape re-encodes only the jobs whose
  series changed, and one that finds nothing new re-serves the same bytes; it never waits
  on a source.
- `GET /healthz`: 200 while the process serves HTTP (liveness).
- `GET /readyz`: 200 once a source has collected successfully at least once (or when only
  the push endpoint is configured); 503 before (readiness).
- `GET /`: a small page with each job's current verdict; `GET /api/v1/jobs` the same as JSON.
- `POST /api/v1/records`: verl records for jobs that cannot share a file (see
  exporter/sources/push.py for the body and the answers).
"""

from __future__ import annotations

import html
import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from . import __version__
from .diagnosis.advice import look_at
from .metrics.exposition import Exposition
from .metrics.snapshot import Snapshot
from .sources.push import PATH as PUSH_PATH
from .sources.push import PushSource

log = logging.getLogger(__name__)

SnapshotFn = Callable[[], Snapshot]
EXPOSITION_WARM_INTERVAL = 0.25  # seconds: encode new job series off the scrape path
JobsFn = Callable[[], Iterable[dict]]


@dataclass
class Endpoints:
    """What the server serves; `serve` builds it from the active sources."""

    snapshot_fns: Sequence[SnapshotFn]
    jobs_fns: Sequence[JobsFn] = ()
    push: PushSource | None = None
    ready_fns: Sequence[SnapshotFn] = ()  # sources whose first success makes /readyz 200
    sources_text: str = ""
    exposition: Exposition = field(init=False)

    def __post_init__(self) -> None:
        self.exposition = Exposition(self.snapshot_fns, warm_interval=EXPOSITION_WARM_INTERVAL)

    def ready(self) -> bool:
        if not self.ready_fns:
            return True
        return any(fn().last_success is not None for fn in self.ready_fns)

    def jobs(self) -> list[dict]:
        out: list[dict] = []
        for fn in self.jobs_fns:
            out.extend(fn())
        return sorted(out, key=lambda j: (j["project"], j["experiment"]))


def landing_page(endpoints: Endpoints) -> bytes:
    now = time.time()
    rows = []
    for job in endpoints.jobs():
        age = "" if job.get("last_step_time") is None else f"{now - job['last_step_time']:.0f}s ago"
        verdict = job.get("verdict") or "-"
        reason = job.get("reason") or ""
        change = job.get("change") or "-"
        if job.get("regressed"):
            change += f" ({job['regressed']})"
        hint = look_at(job["verdict"], job.get("reason")) if job.get("verdict") else ""
        cells = [
            job["project"],
            job["experiment"],
            job.get("step"),
            job.get("run"),
            verdict,
            reason,
            change,
            age,
            hint,
        ]
        rows.append(
            "<tr>"
            + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in cells)
            + "</tr>"
        )
    table = (
        (
            "<table><tr><th>project</th><th>experiment</th><th>step</th><th>run</th><th>verdict</th>"
            "<th>reason</th><th>change</th><th>last step</th><th>look at next</th></tr>"
            + "".join(rows)
            + "</table>"
        )
        if rows
        else "<p>No verl job seen yet.</p>"
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>rlhf-exporter</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left;vertical-align:top}}
tr:nth-child(even){{background:#f4f4f4}}</style></head>
<body><h1>rlhf-exporter {html.escape(__version__)}</h1>
<p>Where the throughput of verl RLHF jobs goes: each job's last step, the window the loop waited on
longest (verdict), why (reason), and whether a slowdown is a workload shift or a regression.</p>
{table}
<p>Sources: {html.escape(endpoints.sources_text)}</p>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a> ·
<a href="/api/v1/jobs">/api/v1/jobs</a> · POST {PUSH_PATH}</p>
</body></html>
"""
    return page.encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"rlhf-exporter/{__version__}"
    timeout = 30  # seconds a connection may idle or trickle before it is closed
    endpoints: Endpoints  # set on the subclass made by make_server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, a kept-alive connection
        # (Prometheus keeps them) waits ~40 ms per request on Nagle + delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str, extra: dict | None = None) -> None:
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
            want_gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
            body, content_type, gzipped = ep.exposition.render(
                self.headers.get("Accept"), want_gzip
            )
            self._send(200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else None)
        elif path == "/healthz":
            self._text(200, "ok\n")
        elif path == "/readyz":
            if ep.ready():
                self._text(200, "ready\n")
            else:
                self._text(503, "not ready: no source has collected successfully yet\n")
        elif path == "/":
            self._send(200, landing_page(ep), "text/html; charset=utf-8")
        elif path == "/api/v1/jobs":
            self._json(200, {"jobs": ep.jobs()})
        elif path == PUSH_PATH:
            self._json(405, {"error": f"use POST {PUSH_PATH}"})
        else:
            self._text(404, "not found: try /, /metrics, /healthz, /readyz\n")

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

        length = self.headers.get("Content-Length")
        try:
            answer = push.handle(self.headers.get("Authorization"), length, read)
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        if length is None or read_bytes != _int(length):
            self.close_connection = True  # an unread (rejected) body: do not reuse the connection
        extra = (
            {"WWW-Authenticate": 'Bearer realm="rlhf-exporter"'} if answer.status == 401 else None
        )
        body = orjson.dumps(answer.body) + b"\n"
        self._send(answer.status, body, "application/json", extra)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many scrapers connecting at once must not be refused


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_server(listen: str, endpoints: Endpoints) -> Server:
    host, port = parse_listen(listen)
    handler = type("BoundHandler", (Handler,), {"endpoints": endpoints})
    server_cls = Server
    if ":" in host:
        server_cls = type("Server6", (Server,), {"address_family": socket.AF_INET6})
    return server_cls((host, port), handler)
