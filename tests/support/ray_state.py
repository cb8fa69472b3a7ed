"""A Ray dashboard's state API on 127.0.0.1, answering from a cluster a test scripts.

    with RayStateApi() as api:
        api.alive("a1", "WorkerDict", pid=101)
        source = RaySource(api.url, node_ips=["127.0.0.1"])
        api.kill("a1", "WORKER_DIED")       # the next poll sees it DEAD

It answers the requests `rlhf_exporter.sources.ray.RaySource` makes (the same JSON envelope, the
same `filter_keys`/`filter_values` query), over real HTTP, so the source's own request,
parsing and counting code runs. Keep-alive (HTTP/1.1) keeps thousands of polls cheap.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit


def _envelope(result: Any) -> dict:
    return {"result": True, "msg": "", "data": {"result": result}}


class RayStateApi:
    def __init__(self) -> None:
        self.session = "session_sim_1"
        self.rows: dict[str, dict] = {}  # actor_id -> row (state, class_name, ...)
        self.pending: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- the cluster ------------------------------------------------------------------------
    def alive(self, actor_id: str, class_name: str, pid: int = 0) -> None:
        with self._lock:
            self.rows[actor_id] = {
                "actor_id": actor_id,
                "class_name": class_name,
                "state": "ALIVE",
                "num_restarts": "0",
                "pid": pid,
                "node_id": "n1",
            }

    def kill(self, actor_id: str, reason: str = "WORKER_DIED") -> None:
        with self._lock:
            row = self.rows[actor_id]
            row["state"] = "DEAD"
            row["death_cause"] = {"actor_died_error_context": {"reason": reason}}

    def _answer(self, path: str, query: dict) -> Any:
        state = dict(zip(query.get("filter_keys", []), query.get("filter_values", []))).get("state")
        with self._lock:
            rows = [dict(r) for r in self.rows.values()]
        if path == "/api/version":
            return {"version": "4", "ray_version": "2.60.0", "session_name": self.session}
        if path == "/api/v0/nodes":
            node = {"node_id": "n1", "node_ip": "127.0.0.1", "state": "ALIVE"}
            return _envelope(
                {"total": 1, "num_after_truncation": 1, "num_filtered": 1, "result": [node]}
            )
        if path == "/api/v0/actors/summarize":
            counts: dict[str, int] = {}
            if state == "PENDING_CREATION":
                counts = dict(self.pending)
            else:
                for r in rows:
                    if r["state"] == state:
                        counts[r["class_name"]] = counts.get(r["class_name"], 0) + 1
            summary = {c: {"class_name": c, "state_counts": {state: n}} for c, n in counts.items()}
            return _envelope(
                {
                    "total": len(rows),
                    "num_after_truncation": len(rows),
                    "num_filtered": sum(counts.values()),
                    "result": {"node_id_to_summary": {"cluster": {"summary": summary}}},
                }
            )
        if path == "/api/v0/actors":
            picked = [r for r in rows if r["state"] == state]
            return _envelope(
                {
                    "total": len(rows),
                    "num_after_truncation": len(rows),
                    "num_filtered": len(picked),
                    "result": picked,
                }
            )
        return None

    # -- the server ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> RayStateApi:
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()  # headers and body are two writes: no Nagle delay between
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                body = api._answer(url.path, parse_qs(url.query))
                data = json.dumps(body).encode() if body is not None else b"not found"
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
