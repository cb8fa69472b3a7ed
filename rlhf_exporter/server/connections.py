"""The HTTP server's connections: at most `max_connections` at once (beyond: 503), a
deadline on each request's headers and POST body, and failures logged once per kind."""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("rlhf_exporter.server")

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
