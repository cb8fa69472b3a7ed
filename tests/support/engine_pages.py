"""The engines' own /metrics pages (tests/fixtures/engine_pages, written by
scripts/engine-pages.py from vLLM 0.33.0's and SGLang 0.5.23's metric code), served over
127.0.0.1 one page at a time, for the real scraper to read.

Each fixture holds, per replica, its page at every sample time, the rollout spans W and the
scripted truth (what the script made the engines do, computed without the pages).
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "engine_pages"


def names() -> list[str]:
    return sorted(p.name.removesuffix(".json.gz") for p in FIXTURES.glob("*.json.gz"))


@dataclass
class Fixture:
    name: str
    doc: dict[str, Any]

    @property
    def times(self) -> list[float]:
        return list(self.doc["times"])

    @property
    def spans(self) -> list[tuple[float, float]]:
        return [(a, b) for a, b in self.doc["spans"]]

    @property
    def truth(self) -> dict[str, Any]:
        return dict(self.doc["truth"])

    @property
    def replicas(self) -> list[str]:
        return sorted(self.doc["pages"])

    def page(self, replica: str, k: int) -> bytes:
        got = self.doc["pages"][replica]
        lines = got["lines"]
        return "\n".join(lines[i] for i in got["pages"][k]).encode()

    def pages(self, replica: str) -> Iterator[bytes]:
        for k in range(len(self.times)):
            yield self.page(replica, k)


def load(name: str) -> Fixture:
    with gzip.open(FIXTURES / f"{name}.json.gz") as f:
        return Fixture(name, json.load(f))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves
    served: PageServer
    replica: str

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = self.served.current.get(self.replica, b"")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class PageServer:
    """One 127.0.0.1 port per replica; `show(k)` makes each serve its page k."""

    fixture: Fixture
    current: dict[str, bytes] = field(default_factory=dict)
    servers: dict[str, ThreadingHTTPServer] = field(default_factory=dict)

    def __enter__(self) -> PageServer:
        for name in self.fixture.replicas:
            handler = type("H", (_Handler,), {"served": self, "replica": name})
            srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            srv.daemon_threads = True
            threading.Thread(
                target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
            ).start()
            self.servers[name] = srv
        return self

    def __exit__(self, *exc: Any) -> None:
        for srv in self.servers.values():
            srv.shutdown()
            srv.server_close()

    def show(self, k: int) -> None:
        self.current = {n: self.fixture.page(n, k) for n in self.fixture.replicas}

    def url(self, replica: str) -> str:
        return f"http://127.0.0.1:{self.servers[replica].server_address[1]}/metrics"

    def targets_file(self, path: Path) -> Path:
        """A file_sd list naming each replica as the fixture does."""
        doc = [
            {"targets": [self.url(n).split("/")[2]], "labels": {"replica": n}}
            for n in self.fixture.replicas
        ]
        path.write_text(json.dumps(doc))
        return path
