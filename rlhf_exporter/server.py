"""HTTP for `serve`, and nothing else: /metrics, /healthz, /readyz, /, the push endpoint.

- `GET /metrics`: the sources' current snapshots in Prometheus text format (OpenMetrics when
  the scraper asks for it; gzip when accepted). The exposition is cached per job and per
  metric family (rlhf_exporter/metrics/exposition.py): a scrape re-encodes only the jobs whose
  series changed, and one that finds nothing new re-serves the same bytes; it never waits
  on a source.
- `GET /healthz`: 200 while the process serves HTTP (liveness).
- `GET /readyz`: 200 once a source has finished a first collection, successful or not (or
  when only the push endpoint is configured); 503 before (readiness). A source's health
  never makes the sidecar unready: that would take a KubeRay head pod out of its Service;
  a broken source is `rlhf_exporter_collector_up 0` instead. But an exporter whose settings
  give it no source that can ever see a verl job, nor a GPU (`Endpoints.blind`), answers 503
  for good, with one line naming the settings to add.
- `GET /api/v1/status`: the sources (state, last success, errors) and the set-up problems
  they see (a verl root one level off, a missing root, a file in another format, no source
  that can see a job), each with what to change (`Problem`).
- `GET /`: the job view (rlhf_exporter/view/): every job, who needs attention first, with
  sparklines, the sources' health and how to scrape; `GET /jobs/<project>/<experiment>` one
  job's step anatomy, verdict strip and markers; `GET /api/v1/jobs` the jobs as JSON;
  `GET /api/v1/jobs/<project>/<experiment>/stacks` a stalled job's stacks (issue 39).
- `POST /api/v1/records`: verl records for jobs that cannot share a file (see
  rlhf_exporter/sources/push.py for the body and the answers).

Hostile requests: the job view's pages are cached by path (bounded in bytes,
`page_cache_bytes`), never by `Host` (a checked Host is put into the cached page at serve
time); `Accept-Encoding` weights are honoured (`gzip;q=0` gets plain text); a request with
`Transfer-Encoding` (no chunked bodies here) or a GET with a body is answered and its
connection closed, so its body is never parsed as the next request; failed token checks on
push and `/api/v1/windows` are rate-limited and counted (rlhf_exporter/auth.py).

Connections are bounded (`Server`): at most `http_max_connections` are served at once (one
thread each, as `http.server.ThreadingHTTPServer` does); a connection beyond that gets a
503 and is closed. A connection must send a request's headers (and a POST its body) within
`http_read_timeout` seconds, idle kept-alive ones included, or it is shut down. A
connection the client aborts, or one that times out, is logged once per kind of failure (in
the configured log format), then at debug level; never as a raw traceback.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import orjson

from . import __version__
from .diagnosis.stacks import StackRound
from .join.board import WindowJoiner
from .metrics.exposition import Exposition
from .metrics.snapshot import Problem, SnapshotFn
from .sources.push import PATH as PUSH_PATH
from .sources.push import PushSource
from .view import docs_pages
from .view.pages import (
    Facts,
    Links,
    doc_page,
    index_page,
    job_page,
    not_found_page,
    source_state,
)
from .windows_api import WindowsApi

log = logging.getLogger(__name__)

EXPOSITION_WARM_INTERVAL = 0.25  # seconds: encode new job series off the scrape path
JobsFn = Callable[[], Iterable[dict[str, Any]]]


@dataclass
class Endpoints:
    """What the server serves; `serve` builds it from the active sources."""

    snapshot_fns: Sequence[SnapshotFn]
    jobs_fns: Sequence[JobsFn] = ()
    push: PushSource | None = None
    ready_fns: Sequence[SnapshotFn] = ()  # sources whose first collection makes /readyz 200
    sources_text: str = ""
    alerts: Mapping[str, Any] = field(default_factory=dict)  # thresholds' alerts: the job view
    demo: bool = False  # the job view labels its data as simulated
    # the demo: the incident now playing, in words (the pages' demo banner), and its job on
    # its own clock (project, experiment, wall -> job time), where its stall is judged
    demo_story: Callable[[], str] | None = None
    demo_clock: tuple[str, str, Callable[[float], float]] | None = None
    pages: PageCache = field(default_factory=lambda: PageCache())  # the job view's pages
    windows_api: WindowsApi | None = None  # GET /api/v1/windows (windows_api.py): None when off
    # the NVML source's WindowJoiner: GPU time by window in the job view
    window_view: WindowJoiner | None = None
    balance_limits: Mapping[str, Any] = field(default_factory=dict)  # thresholds' balance:
    # a stalled job's last stack round (sources/stacks.py), None when stacks are off
    stacks_of: Callable[[str, str], StackRound | None] | None = None
    # why no source can ever see a verl job (nor a GPU): /readyz answers 503 with it
    blind: Problem | None = None
    exposition: Exposition = field(init=False)

    def __post_init__(self) -> None:
        guards = [getattr(x, "guard", None) for x in (self.push, self.windows_api)]
        self.exposition = Exposition(
            self.snapshot_fns,
            warm_interval=EXPOSITION_WARM_INTERVAL,
            sample_fns=[g.samples for g in guards if g is not None],
        )

    def ready(self) -> bool:
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why `/readyz` answers 503 (one line), or None when it answers 200."""
        if self.blind is not None:
            return f"{self.blind.message}: {self.blind.hint}"
        if not self.ready_fns:
            return None
        if any(s.last_success is not None or s.errors for s in (f() for f in self.ready_fns)):
            return None
        return "no source has finished a first collection yet"

    def status(self) -> dict[str, Any]:
        """`GET /api/v1/status`: readiness, each source's health, and the set-up problems."""
        snaps = [fn() for fn in self.snapshot_fns]
        problems = [self.blind] if self.blind is not None else []
        problems += [p for s in snaps for p in s.problems]
        why = self.not_ready()
        return {
            "version": __version__,
            "ready": why is None,
            "not_ready": why,
            "sources": [
                {
                    "source": s.collector,
                    "state": source_state(s),
                    "up": s.up,
                    "last_success": s.last_success,
                    "errors": dict(s.errors),
                    "record_errors": dict(s.record_errors),
                    "records": s.records,
                }
                for s in snaps
            ],
            "problems": [p.to_json() for p in problems],
        }

    def jobs(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for fn in self.jobs_fns:
            out.extend(fn())
        if self.stacks_of is not None:  # the job view's "where it hangs"
            stacks_of = self.stacks_of
            out = [_with_stacks(j, stacks_of(j["project"], j["experiment"])) for j in out]
        return sorted(out, key=lambda j: (j["project"], j["experiment"]))

    def stacks_json(self, path: str) -> tuple[int, dict[str, Any]]:
        """`GET /api/v1/jobs/<project>/<experiment>/stacks`: the job's last stack round."""
        parts = path[len(JOBS_API) :].split("/")
        if len(parts) != 3 or parts[2] != "stacks":
            return 404, {"error": "not found: /api/v1/jobs/<project>/<experiment>/stacks"}
        project, experiment = (unquote(p) for p in parts[:2])
        job = next((j for j in self.jobs() if (j["project"], j["experiment"]) ==
                    (project, experiment)), None)  # fmt: skip
        if job is None:
            return 404, {"error": f"no job {project}/{experiment}"}
        found = job.get("stacks")
        note = (
            "stacks are off (--no-stacks, or Ray's actors are not read)"
            if self.stacks_of is None
            else "no stack round: the job is not stalled (stacks are taken past its stall "
            "limit and forgotten once it steps)"
        )
        out: dict[str, Any] = {"project": project, "experiment": experiment}
        out["round"] = found.to_json() if isinstance(found, StackRound) else None
        if out["round"] is None:
            out["note"] = note
        return 200, out


JOBS_API = "/api/v1/jobs/"


def _with_stacks(job: dict[str, Any], found: StackRound | None) -> dict[str, Any]:
    return {**job, "stacks": found} if found is not None else job


PAGE_CACHE_BYTES = 32 << 20  # bytes of rendered pages kept (page_cache_bytes)
# what a page says where the browser's Host goes: replaced at serve time, so the Host
# header never keys the cache (random Hosts cost no render and no memory)
HOST_MARK = "rlhf-exporter-host.invalid"
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]{2,45}\](?::[0-9]{1,5})?")


def clean_host(host: str | None) -> str | None:
    """The Host header when it is a host name or address with an optional port, else None
    (the page then names no host): nothing else of it reaches a page."""
    if host is None or not _HOST.fullmatch(host):
        return None
    return host


class PageCache:
    """Pages of the job view, kept for `ttl` seconds: a browser (or many) reloading `/` costs
    one render per second, so the pure-Python rendering does not compete with scrapes for
    the interpreter. The pages say "N s ago", so a second's staleness is invisible.

    Bounded in bytes (`max_bytes`, the `page_cache_bytes` setting): beyond, the least
    recently stored pages are evicted (counted in `stats["evicted"]`, rendered again when
    asked for); a page larger than the bound is served, not kept."""

    def __init__(self, ttl: float = 1.0, max_bytes: int = PAGE_CACHE_BYTES):
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._pages: OrderedDict[tuple[str, bool], tuple[float, int, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()  # renders, evicted

    @property
    def size(self) -> int:
        """Bytes of the pages kept."""
        return self._bytes

    def get(
        self, key: tuple[str, bool], render: Callable[[], tuple[int, bytes]]
    ) -> tuple[int, bytes]:
        now = time.monotonic()
        hit = self._pages.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1], hit[2]
        status, body = render()  # outside the lock: a slow render never holds up another
        self.stats["renders"] += 1
        with self._lock:
            old = self._pages.pop(key, None)
            if old is not None:
                self._bytes -= len(old[2])
            if len(body) <= self.max_bytes:
                self._pages[key] = (now, status, body)
                self._bytes += len(body)
            while self._bytes > self.max_bytes:
                _, (_, _, gone) = self._pages.popitem(last=False)
                self._bytes -= len(gone)
                self.stats["evicted"] += 1
        return status, body


def _with_host(page: bytes, host: str | None) -> bytes:
    return page.replace(HOST_MARK.encode(), host.encode()) if host else page


def _facts(endpoints: Endpoints, host: str | None) -> tuple[Facts, Links]:
    base = f"http://{host}" if host else ""
    facts = Facts.of(
        __version__,
        base,
        endpoints.sources_text,
        endpoints.demo,
        endpoints.alerts,
        story=endpoints.demo_story() if endpoints.demo_story is not None else "",
        clock=endpoints.demo_clock,
    )
    return facts, Links.of(endpoints.alerts.get("runbook_url", ""))  # else the served copies


def landing_page(endpoints: Endpoints, host: str | None = None) -> bytes:
    """`/`: every job, sorted by who needs attention (rendered from immutable state)."""
    snaps = [fn() for fn in endpoints.snapshot_fns]
    return index_page(endpoints.jobs(), snaps, *_facts(endpoints, host)).encode()


def job_view(endpoints: Endpoints, path: str, host: str | None = None) -> tuple[int, bytes]:
    """`/jobs/<project>/<experiment>`: (status, page)."""
    parts = path[len("/jobs/") :].split("/")
    if len(parts) != 2:
        return 404, not_found_page(path, "").encode()
    project, experiment = (unquote(p) for p in parts)
    for job in endpoints.jobs():
        if job["project"] == project and job["experiment"] == experiment:
            snaps = [fn() for fn in endpoints.snapshot_fns]
            joiner = endpoints.window_view
            windows = joiner.view.get((project, experiment)) if joiner is not None else None
            page = job_page(
                job,
                snaps,
                *_facts(endpoints, host),
                windows=windows,
                balance_limits=endpoints.balance_limits,
            )
            return 200, page.encode()
    return 404, not_found_page(project, experiment).encode()


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
            self._send(status, _with_host(page, host), "text/html; charset=utf-8")
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


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 43\r\n\r\n"
    b"too many connections (http_max_connections)"
)
_ABORTED = OSError  # the client went away, reset, or was too slow (socket errors)


class Server(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with a bound on connections and on how long a read may take.

    A bounded semaphore caps the connection threads (beyond the cap: 503, closed at once,
    from the accepting thread without reading the request). A watchdog thread shuts down a
    connection whose request headers (or POST body) did not arrive by its deadline: socket
    timeouts alone bound each read, not a client that trickles a byte at a time.
    """

    daemon_threads = True
    block_on_close = False  # stop() never waits on a slow client
    allow_reuse_address = True
    request_queue_size = 256  # many scrapers connecting at once must not be refused
    max_connections = 64
    read_timeout = 10.0

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._deadlines: dict[socket.socket, float] = {}
        self._deadline_lock = threading.Lock()
        self._logged: set[str] = set()
        self.refused = 0
        threading.Thread(target=self._watchdog, name="http-deadlines", daemon=True).start()

    # -- connection cap -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self._once("refused", "connection refused with 503: %d connections open "
                       "(http_max_connections)", self.max_connections)  # fmt: skip
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.disarm(request)
            self._slots.release()

    # -- read deadlines -------------------------------------------------------------------
    def arm(self, conn: socket.socket) -> None:
        with self._deadline_lock:
            self._deadlines[conn] = time.monotonic() + self.read_timeout

    def disarm(self, conn: socket.socket) -> None:
        with self._deadline_lock:
            self._deadlines.pop(conn, None)

    def _watchdog(self) -> None:
        tick = min(1.0, self.read_timeout / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._deadline_lock:
                late = [c for c, t in self._deadlines.items() if t <= now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                self._once("deadline", "closed a connection that did not send its request "
                           "within %gs (http_read_timeout)", self.read_timeout)  # fmt: skip
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # -- errors ---------------------------------------------------------------------------
    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback to stderr; log once per kind instead."""
        exc = sys.exc_info()[1]
        kind = type(exc).__name__
        if isinstance(exc, _ABORTED):
            self._once(kind, "HTTP connection from %s aborted: %s (%s)", client_address[0],
                       exc, kind)  # fmt: skip
        else:
            self._once(kind, "HTTP request from %s failed: %s: %s (a bug)", client_address[0],
                       kind, exc, error=True)  # fmt: skip

    def _once(self, kind: str, message: str, *args: Any, error: bool = False) -> None:
        first = kind not in self._logged
        self._logged.add(kind)
        if first:
            log.log(
                logging.ERROR if error else logging.WARNING,
                message + "; further ones of this kind are logged at debug level",
                *args,
                exc_info=error,  # a bug: its traceback, inside the configured log format
                extra={"reason": kind},
            )
        else:
            log.debug(message, *args, extra={"reason": kind})


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
