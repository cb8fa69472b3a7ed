"""A real TCP server on 127.0.0.1 whose every answer is a script of raw bytes and pauses:
headers trickled a byte at a time, a chunk-size line that never ends, a gzip body, a 302.
Hostile-input tests of the HTTP client (rlhf_exporter/sources/http.py) and its users."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable


class Conn:
    """One accepted connection, as a script sees it."""

    def __init__(self, sock: socket.socket, server: RawServer):
        self.sock = sock
        self.server = server
        self.closed_early = False  # the client closed while the script still wrote
        self.sent = 0  # bytes sent so far

    def request(self) -> bytes:
        """Read one request's head (up to the empty line); b'' when the client closed."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return b""
            if not data:
                return b""
            buf += data
        self.server.requests.append(buf)
        return buf

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            self.sent += len(data)
            self.server.sent = max(self.server.sent, self.sent)
            return True
        except OSError:
            self.closed_early = True
            self.server.cut += 1
            return False

    def trickle(self, data: bytes, every: float = 0.05) -> bool:
        """Send `data` a byte at a time, `every` seconds apart (stops once the client left or
        the server is stopped)."""
        for i in range(len(data)):
            if self.server.stopping.is_set() or not self.send(data[i : i + 1]):
                return False
            time.sleep(every)
        return True


def answer(body: bytes, status: str = "200 OK", headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class RawServer:
    def __init__(self, script: Callable[[Conn], None]):
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.cut = 0  # connections the client closed while the script was still writing
        self.done = 0  # scripts that have ended
        self.sent = 0  # the most bytes one connection was sent
        self._done = threading.Condition()
        self.stopping = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            try:
                self.script(Conn(sock, self))
            except OSError:
                pass
        with self._done:
            self.done += 1
            self._done.notify_all()

    def wait_done(self, n: int = 1, timeout: float = 30.0) -> bool:
        """Wait until `n` scripts have ended (a script ends early once the client left)."""
        with self._done:
            return self._done.wait_for(lambda: self.done >= n, timeout)

    def close(self) -> None:
        self.stopping.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
