"""A Ray dashboard's state API on 127.0.0.1, answering from a cluster a test scripts.

    with RayStateApi() as api:
        api.alive("a1", "WorkerDict", pid=101)
        source = RaySource(api.url, node_ips=["127.0.0.1"])
        api.kill("a1", "WORKER_DIED")       # the next poll sees it DEAD

It answers the requests `rlhf_exporter.sources.ray.RaySource` makes (the same JSON envelope, the
same `filter_keys`/`filter_values` query), over real HTTP, so the source's own request,
parsing and counting code runs. Keep-alive (HTTP/1.1) keeps thousands of polls cheap.

The Jobs API (`GET /api/jobs/`) answers the shape a real Ray 2.60 head gives
(tests/test_job_state.py checks the source against a real head):

    api.submit("raysubmit_1", "p", "e", job_id="02000000")   # RUNNING, its entrypoint names p/e
    api.alive("a2", "WorkerDict", pid=102, job_id="02000000")
    api.end("raysubmit_1", "FAILED")
    api.restart_head()     # a new session: no actors, no jobs (GCS without fault tolerance)
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit


def _envelope(result: Any) -> dict:
    return {"result": True, "msg": "", "data": {"result": result}}


class RayStateApi:
    def __init__(self) -> None:
        self.session = "session_sim_1"
        self.rows: dict[str, dict] = {}  # actor_id -> row (state, class_name, ...)
        self.pending: dict[str, int] = {}
        self.jobs: dict[str, dict] = {}  # submission_id -> Jobs API entry
        self.clock: Callable[[], float] = time.time  # Ray's clock (a simulated day's own)
        # path -> (status, headers, body) answered verbatim: a hostile head's answers
        self.hostile: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.jobs_api = True  # False: answer /api/jobs/ with 404 (a dashboard without it)
        # GET /worker/traceback (issue 39): pid -> (status, text); None: no such endpoint
        self.stacks: dict[int, tuple[int, str]] | None = None
        # pid -> answers given first, one per request, before stacks[pid]'s
        self.stacks_first: dict[int, list[tuple[int, str]]] = {}
        self.stack_requests: list[dict[str, str]] = []
        self.authorization: list[tuple[str, str]] = []  # (path, Authorization) of every GET
        self.tasks: list[dict] | None = None  # GET /api/v0/tasks rows; None: 404
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- the cluster ------------------------------------------------------------------------
    def alive(self, actor_id: str, class_name: str, pid: int = 0, job_id: str = "01000000") -> None:
        with self._lock:
            self.rows[actor_id] = {
                "actor_id": actor_id,
                "class_name": class_name,
                "state": "ALIVE",
                "num_restarts": "0",
                "pid": pid,
                "node_id": "n1",
                "job_id": job_id,
            }

    def kill(self, actor_id: str, reason: str = "WORKER_DIED", message: str = "") -> None:
        with self._lock:
            row = self.rows[actor_id]
            row["state"] = "DEAD"
            context = {"reason": reason}
            if message:
                context["error_message"] = message
            row["death_cause"] = {"actor_died_error_context": context}

    def submit(
        self, submission_id: str, project: str, experiment: str, job_id: str, start_ms: int = 1
    ) -> None:
        """A `ray job submit` of verl's main_ppo for <project>/<experiment>, RUNNING."""
        with self._lock:
            self.jobs[submission_id] = {
                "type": "SUBMISSION",
                "job_id": job_id,
                "submission_id": submission_id,
                "status": "RUNNING",
                "entrypoint": "python3 -m verl.trainer.main_ppo "
                f"trainer.project_name={project} trainer.experiment_name={experiment}",
                "message": "Job is currently running.",
                "error_type": None,
                "start_time": start_ms,
                "end_time": None,
                "metadata": {},
                "driver_exit_code": None,
            }

    def end(self, submission_id: str, status: str, end_ms: int | None = None) -> None:
        """The submission ends: SUCCEEDED (the driver exits 0), FAILED or STOPPED, at
        `end_ms` (default: now by `self.clock`, as Ray stamps it)."""
        if end_ms is None:
            end_ms = int(self.clock() * 1000)
        with self._lock:
            entry = self.jobs[submission_id]
            entry.update(status=status, end_time=end_ms,
                         driver_exit_code=0 if status == "SUCCEEDED" else 1)  # fmt: skip

    def normal_end(self, submission_id: str) -> None:
        """A real shutdown (Ray 2.60, measured): the driver's actors die OWNER_DIED or
        OUT_OF_SCOPE, Ray's JobSupervisor WORKER_DIED with an intended exit, the job
        SUCCEEDED."""
        with self._lock:
            job_id = self.jobs[submission_id]["job_id"]
            mine = [a for a, r in self.rows.items() if r.get("job_id") == job_id]
        for i, actor in enumerate(mine):
            self.kill(actor, "OWNER_DIED" if i == 0 else "OUT_OF_SCOPE")
        self.alive("supervisor-" + submission_id, "JobSupervisor", job_id="01000000")
        self.kill(
            "supervisor-" + submission_id,
            "WORKER_DIED",
            "Worker exit type: INTENDED_USER_EXIT Worker exit detail: exit_actor() is called.",
        )
        self.end(submission_id, "SUCCEEDED")

    def restart_head(self) -> None:
        """The head (GCS) restarts without fault tolerance: a new session knows nothing."""
        with self._lock:
            self.session = self.session + "_restarted"
            self.rows.clear()
            self.jobs.clear()

    def _answer(self, path: str, query: dict) -> Any:
        state = dict(zip(query.get("filter_keys", []), query.get("filter_values", []))).get("state")
        with self._lock:
            rows = [dict(r) for r in self.rows.values()]
        if path == "/api/jobs/":
            if not self.jobs_api:
                return None
            with self._lock:
                return [dict(j) for j in self.jobs.values()]
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
        if path == "/api/v0/tasks" and self.tasks is not None:
            keys, ops = query.get("filter_keys", []), query.get("filter_predicates", [])
            filters = list(zip(keys, ops, query.get("filter_values", [])))
            picked = [t for t in self.tasks
                      if all((t.get(k) == v) == (op == "=") for k, op, v in filters)]  # fmt: skip
            return _envelope({"total": len(self.tasks), "num_after_truncation": len(picked),
                              "num_filtered": len(picked), "result": picked})  # fmt: skip
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
                api.authorization.append((url.path, self.headers.get("Authorization", "")))
                if url.path == "/worker/traceback" and api.stacks is not None:
                    query = {k: v[0] for k, v in parse_qs(url.query).items()}
                    api.stack_requests.append(query)
                    pid = int(query.get("pid", "0"))
                    first = api.stacks_first.get(pid)
                    status, text = first.pop(0) if first else api.stacks.get(pid, (500, "no pid"))
                    raw = text.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                if url.path in api.hostile:
                    status, headers, raw = api.hostile[url.path]
                    self.send_response(status)
                    for k, v in {"Content-Length": str(len(raw)), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(raw)
                    return
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
