"""The Ray source against a REAL Ray head (started here, on 127.0.0.1, always stopped), and
against a fake HTTP server for what Ray cannot be made to do on demand (500, invalid JSON,
a hang past the timeout).

One head serves the whole module (live actors cost ~50 MB each: a dozen here); the last
test stops it mid-run under a real `serve` process and starts a new one on the same port.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import logging
import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from rlhf_exporter import settings
from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl
from rlhf_exporter.metrics.families import families
from rlhf_exporter.sources.base import Context
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.ray import RaySource, death_reason, resolve_address
from rlhf_exporter.sources.roles import RoleMap
from rlhf_exporter.thresholds_file import ConfigError, load_thresholds
from tests.support.fake_pynvml import FakeClock, FakeGpu, make_module
from tests.support.procs import free_port, wait_until
from tests.support.serve import Exporter


def values(snapshot, name):
    return {s.labels: s.value for s in snapshot.samples if s.name == name}


def actors_gauge(snapshot):
    return values(snapshot, "rlhf_ray_actors")


# -- no server needed -------------------------------------------------------------------------
def test_address_resolution():
    assert resolve_address(None, {}) == "http://127.0.0.1:8265"
    assert resolve_address("head:8265", {}) == "http://head:8265"
    assert resolve_address(None, {"RAY_DASHBOARD_ADDRESS": "http://d:1/"}) == "http://d:1"
    assert resolve_address(None, {"RAY_ADDRESS": "http://j:8265"}) == "http://j:8265"
    # a GCS address, `auto` or ray:// is not the dashboard
    assert resolve_address(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == "http://127.0.0.1:8265"
    assert resolve_address(None, {"RAY_ADDRESS": "auto"}) == "http://127.0.0.1:8265"
    assert resolve_address("http://x:1", {"RAY_DASHBOARD_ADDRESS": "http://d:1"}) == "http://x:1"


def test_death_reasons():
    def ctx(reason):
        return {"death_cause": {"actor_died_error_context": {"reason": reason}}}

    assert death_reason(ctx("RAY_KILL")) == "RAY_KILL"
    assert death_reason(ctx("NODE_DIED")) == "NODE_DIED"
    assert death_reason(ctx("SOME_FUTURE_REASON")) == "SOME_FUTURE_REASON"
    assert death_reason(ctx("<script>" * 20)) == "OTHER"  # labels stay bounded
    assert (
        death_reason({"death_cause": {"oom_context": {"error_message": "killed"}}})
        == "OUT_OF_MEMORY"
    )
    assert (
        death_reason({"death_cause": {"creation_task_failure_context": {}}})
        == "CREATION_TASK_FAILED"
    )
    assert death_reason({"death_cause": None}) == "UNKNOWN"
    assert death_reason({}) == "UNKNOWN"


def test_roles_defaults_and_override_file(tmp_path):
    default = RoleMap.default()
    expect = {
        "create_colocated_worker_cls.<locals>.WorkerDict": "trainer",
        "WorkerDict": "trainer",
        "ActorRolloutRefWorker": "trainer",
        "TrainingWorker": "trainer",
        "DetachActorWorker": "trainer",
        "FullyAsyncTrainer": "trainer",
        "vLLMHttpServer": "rollout",
        "SGLangHttpServer": "rollout",
        "TRTLLMHttpServer": "rollout",
        "CheckpointEngineWorker": "rollout",
        "FullyAsyncRollouter": "rollout",
        "AgentLoopWorker": "agent_loop",
        "AgentLoopWorkerTQ": "agent_loop",
        "RewardLoopWorker": "reward",
        "TaskRunner": "driver",
        "TaskRunnerV1": "driver",
        "MessageQueue": "other",
        "SomethingElse": "other",
    }
    assert {c: default.role(c) for c in expect} == expect
    f = tmp_path / "roles.yaml"
    f.write_text(
        "- {role: rollout, pattern: 'My.*Server'}\n- {role: reward, pattern: WorkerDict}\n"
    )
    custom = RoleMap.from_file(str(f))
    assert custom.role("MyFancyServer") == "rollout"
    assert custom.role("WorkerDict") == "reward"  # the file's rules come first
    assert custom.role("vLLMHttpServer") == "rollout"  # the defaults still apply after
    f.write_text("roles:\n  - {role: other, pattern: '.*'}\n")
    assert (
        RoleMap.from_file(str(f)).role("vLLMHttpServer") == "other"
    )  # a catch-all ends the defaults
    for text, message in [
        ("- {role: trainers, pattern: X}\n", "unknown role 'trainers'"),
        ("- {role: trainer, pattern: '('}\n", "invalid regular expression"),
        ("- {role: trainer}\n", "needs 'role' and one of 'pattern'"),
        ("- {role: trainer, pattern: X, colour: red}\n", "unknown key(s) ['colour']"),
        ("role: trainer\n", "expected a list"),
        ("- [a, b]\n", "rule 1: expected a mapping"),
        ("- {role: trainer, pattern: ''}\n", "non-empty string"),
    ]:
        f.write_text(text)
        with pytest.raises(ConfigError) as err:
            RoleMap.from_file(str(f))
        assert message in str(err.value) and str(f) in str(err.value)


def test_from_settings(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_DASHBOARD_ADDRESS", raising=False)
    s = dataclasses.replace(  # the real, typed Settings
        settings.resolve(None, {}),
        ray=True,
        ray_address=None,
        ray_interval=7.0,
        ray_timeout=2.0,
        ray_actors=False,
        ray_per_class=True,
        ray_roles=None,
    )
    src = RaySource.from_settings(s, Context(load_thresholds()))
    assert (src.address, src.interval, src.timeout, src.actors, src.per_class) == (
        "http://127.0.0.1:8265",
        7.0,
        2.0,
        False,
        True,
    )
    assert "PIDs only" in src.describe()
    s = dataclasses.replace(s, ray=False)
    assert RaySource.from_settings(s, Context(load_thresholds())) is None


# -- a fake state API: bad answers, and exact bookkeeping -------------------------------------
def envelope(result):
    return {"result": True, "msg": "", "data": {"result": result}}


class FakeState:
    """A canned state API; `mode` makes it misbehave."""

    def __init__(self):
        self.mode = "ok"
        self.session = "session_fake_1"
        self.live = []  # rows: {actor_id, class_name, state, num_restarts, pid, node_id}
        self.dead = []  # rows with death_cause
        self.pending = {}  # class -> count
        self.release = threading.Event()
        self.requests = 0

    def answer(self, path, query):
        state = dict(zip(query.get("filter_keys", []), query.get("filter_values", []))).get("state")
        if path == "/api/version":
            return {"version": "4", "ray_version": "2.60.0", "session_name": self.session}
        if path == "/api/v0/nodes":
            return envelope(
                {
                    "total": 1,
                    "num_after_truncation": 1,
                    "num_filtered": 1,
                    "result": [{"node_id": "n1", "node_ip": "127.0.0.1", "state": "ALIVE"}],
                }
            )
        if path == "/api/v0/actors/summarize":
            if state == "DEAD":
                counts = {}
                for r in self.dead:
                    counts[r["class_name"]] = counts.get(r["class_name"], 0) + 1
            elif state == "PENDING_CREATION":
                counts = dict(self.pending)
            else:
                counts = {}
            summary = {c: {"class_name": c, "state_counts": {state: n}} for c, n in counts.items()}
            return envelope(
                {
                    "total": 5,
                    "num_after_truncation": 5,
                    "num_filtered": sum(counts.values()),
                    "result": {"node_id_to_summary": {"cluster": {"summary": summary}}},
                }
            )
        if path == "/api/v0/actors":
            rows = self.dead if state == "DEAD" else [r for r in self.live if r["state"] == state]
            return envelope(
                {"total": 5, "num_after_truncation": 5, "num_filtered": len(rows), "result": rows}
            )
        return None


@pytest.fixture
def fake_state():
    state = FakeState()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            from urllib.parse import parse_qs, urlsplit

            state.requests += 1
            url = urlsplit(self.path)
            mode = state.mode
            if mode == "hang":
                state.release.wait(5)  # far past the source's timeout, bounded
            if mode == "500":
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"Internal Server Error")
                return
            body = state.answer(url.path, parse_qs(url.query))
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(body).encode()
            if mode == "invalid_json":
                data = data[: len(data) // 2]
            elif mode == "ray_error" and url.path != "/api/version":
                data = json.dumps({"result": False, "msg": "GCS unavailable", "data": {}}).encode()
            elif mode == "bad_shape" and url.path != "/api/version":
                data = json.dumps({"result": True, "data": {"result": [1, 2]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except OSError:
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def test_bad_answers_are_counted_dropped_logged_once_and_recovered(fake_state, caplog):
    src = RaySource(fake_state.url, interval=60, timeout=0.3, node_ips=["127.0.0.1"])
    caplog.set_level(logging.INFO, logger="rlhf_exporter")
    snap = src.poll_once()
    assert snap.up and actors_gauge(snap)
    for mode, reason in [
        ("500", "http_error"),  # the HTTP client's vocabulary (sources/http.py)
        ("invalid_json", "invalid_json"),
        ("ray_error", "ray_error"),
        ("bad_shape", "bad_response"),
        ("hang", "timeout"),
    ]:
        fake_state.mode = mode
        for _ in range(2):
            started = time.monotonic()
            snap = src.poll_once()
            assert time.monotonic() - started < 2.0  # bounded by the timeout, not the server
            assert not snap.up and snap.samples == (), mode  # dropped, never stale
        assert snap.errors[reason] == 2, (mode, snap.errors)
    fake_state.release.set()
    fake_state.mode = "ok"
    snap = src.poll_once()
    assert snap.up and actors_gauge(snap)
    failures = [r for r in caplog.records if "ray source failed" in r.getMessage()]
    assert [r.reason for r in failures] == [
        "http_error",
        "invalid_json",
        "ray_error",
        "bad_response",
        "timeout",
    ]
    assert all(not r.exc_info for r in failures)  # one line each, no traceback
    assert sum("ray source recovered" in r.getMessage() for r in caplog.records) == 1


def test_connection_refused_is_down_not_a_crash():
    src = RaySource(f"http://127.0.0.1:{free_port()}", interval=60, timeout=0.5)
    snap = src.poll_once()
    counted = {k: n for k, n in snap.errors.items() if n}
    assert not snap.up and counted == {"unreachable": 1} and snap.samples == ()
    assert snap.errors["timeout"] == 0  # every known reason is exported from 0


def test_restart_and_death_bookkeeping(fake_state):
    s = fake_state

    def row(aid, cls, state, restarts="0", pid=0):
        return {
            "actor_id": aid,
            "class_name": cls,
            "state": state,
            "num_restarts": restarts,
            "pid": pid,
            "node_id": "n1",
        }

    s.live = [
        row("a1", "WorkerDict", "ALIVE", "2", 11),
        row("a2", "vLLMHttpServer", "ALIVE", "0", 12),
        row("a3", "AgentLoopWorker", "RESTARTING", "1"),
    ]
    s.dead = [dict(row("d0", "TaskRunner", "DEAD"), death_cause=None)]
    s.pending = {"vLLMHttpServer": 3}
    src = RaySource(s.url, interval=60, timeout=2, node_ips=["127.0.0.1"], per_class=True)
    snap = src.poll_once()
    # the first poll is the baseline: what happened before is not counted, series start at 0
    assert values(snap, "rlhf_ray_actor_restarts_total") == {
        (r,): 0.0
        for r in ("trainer", "rollout", "agent_loop", "reward", "teacher", "driver", "other")
    }
    assert values(snap, "rlhf_ray_actor_deaths_total") == {("driver", "UNKNOWN"): 0.0}
    gauge = actors_gauge(snap)
    assert gauge[("trainer", "ALIVE")] == 1 and gauge[("rollout", "PENDING_CREATION")] == 3
    assert gauge[("agent_loop", "RESTARTING")] == 1 and gauge[("driver", "DEAD")] == 1
    assert gauge[("reward", "ALIVE")] == 0 and len(gauge) == 7 * 5
    assert values(snap, "rlhf_ray_actors_by_class")[("vLLMHttpServer", "PENDING_CREATION")] == 3
    assert src.pid_roles() == {11: "trainer", 12: "rollout"}
    assert values(snap, "rlhf_ray_cluster_info") == {("2.60.0", "session_fake_1"): 1.0}
    # restarts grow (strings), an actor dies, a new one appears already restarted once
    s.live = [
        row("a1", "WorkerDict", "ALIVE", "3", 11),
        row("a3", "AgentLoopWorker", "ALIVE", "2", 13),
        row("a4", "RewardLoopWorker", "ALIVE", "1", 14),
    ]
    s.dead.append(
        dict(
            row("a2", "vLLMHttpServer", "DEAD"),
            death_cause={"actor_died_error_context": {"reason": "RAY_KILL"}},
        )
    )
    snap = src.poll_once()
    restarts = values(snap, "rlhf_ray_actor_restarts_total")
    assert (restarts[("trainer",)], restarts[("agent_loop",)], restarts[("reward",)]) == (1, 1, 1)
    assert values(snap, "rlhf_ray_actor_deaths_total") == {
        ("driver", "UNKNOWN"): 0.0,
        ("rollout", "RAY_KILL"): 1.0,
    }
    # nothing changes: nothing is counted twice, and the DEAD list is not fetched again
    before = s.requests
    snap = src.poll_once()
    assert values(snap, "rlhf_ray_actor_deaths_total")[("rollout", "RAY_KILL")] == 1.0
    assert values(snap, "rlhf_ray_actor_restarts_total")[("trainer",)] == 1
    assert s.requests - before == 8  # version, nodes, 3 summaries, ALIVE, RESTARTING, jobs
    # a new session (Ray restarted): its deaths are new, the counters keep growing
    s.session = "session_fake_2"
    s.dead = [
        dict(
            row("x1", "WorkerDict", "DEAD"),
            death_cause={"actor_died_error_context": {"reason": "NODE_DIED"}},
        )
    ]
    s.live = []
    snap = src.poll_once()
    deaths = values(snap, "rlhf_ray_actor_deaths_total")
    assert deaths[("trainer", "NODE_DIED")] == 1 and deaths[("rollout", "RAY_KILL")] == 1
    assert values(snap, "rlhf_ray_cluster_info") == {("2.60.0", "session_fake_2"): 1.0}


def test_pids_only_mode_exports_no_actor_series(fake_state):
    fake_state.live = [
        {
            "actor_id": "a1",
            "class_name": "WorkerDict",
            "state": "ALIVE",
            "pid": 77,
            "node_id": "n1",
        },
        {
            "actor_id": "a2",
            "class_name": "WorkerDict",
            "state": "ALIVE",
            "pid": 78,
            "node_id": "elsewhere",
        },
    ]
    src = RaySource(fake_state.url, interval=60, timeout=2, actors=False, node_ips=["127.0.0.1"])
    snap = src.poll_once()
    assert snap.up and {s.name for s in snap.samples} == {"rlhf_ray_cluster_info"}
    # node_id is filtered by the (fake) dashboard in real life; the source filters again
    assert src.pid_roles() == {77: "trainer"}
    other = RaySource(fake_state.url, interval=60, timeout=2, actors=False, node_ips=["10.9.9.9"])
    assert other.poll_once().up and other.pid_roles() == {}  # not this node: no PIDs, no guess


# -- the real Ray head -------------------------------------------------------------------------
try:  # only the tests marked `ray` use it; tests/conftest.py skips them where Ray is missing
    import ray
except ImportError:
    ray = None
from tests.support.ray_head import RayHead, connected_head, verl_actor_classes  # noqa: E402


@pytest.fixture(scope="module")
def head():
    with connected_head("rlhf-exporter-tests") as h:
        yield h


@pytest.fixture(scope="module")
def cluster(head):
    classes = verl_actor_classes()
    actors = {"WorkerDict": [classes["WorkerDict"].remote() for _ in range(2)]}
    for name, cls in classes.items():  # one of each other verl actor
        if name != "WorkerDict":
            actors[name] = [cls.remote()]
    pids = {
        name: ray.get([a.pid.remote() for a in group], timeout=120)
        for name, group in actors.items()
    }
    return SimpleNamespace(classes=classes, actors=actors, pids=pids, head=head)


def _source(head, **kwargs):
    return RaySource(head.dashboard_url, interval=60, timeout=10, **kwargs)


@pytest.mark.ray
@pytest.mark.slow
def test_real_actors_by_role_and_state(cluster):
    src = _source(cluster.head, per_class=True)
    snap = src.poll_once()
    assert snap.up, snap.errors
    gauge = actors_gauge(snap)
    assert gauge[("trainer", "ALIVE")] == 2
    assert (
        gauge[("rollout", "ALIVE")],
        gauge[("agent_loop", "ALIVE")],
        gauge[("driver", "ALIVE")],
        gauge[("reward", "ALIVE")],
        gauge[("other", "ALIVE")],
    ) == (1, 1, 1, 1, 1)
    by_class = values(snap, "rlhf_ray_actors_by_class")
    assert any(
        c.endswith("<locals>.WorkerDict") and n == 2
        for (c, st), n in by_class.items()
        if st == "ALIVE"
    )
    ((ray_version, session),) = values(snap, "rlhf_ray_cluster_info")
    assert ray_version == ray.__version__ and session.startswith("session_")
    # PIDs on this node, with their roles (for the GPU source)
    roles = src.pid_roles()
    for name, role in [
        ("WorkerDict", "trainer"),
        ("vLLMHttpServer", "rollout"),
        ("TaskRunner", "driver"),
    ]:
        for pid in cluster.pids[name]:
            assert roles[pid] == role
    # rendered: every family comes from the catalog, labels are role/state, never an actor id
    text = "".join(str(f) for f in families([snap]))
    assert "actor_id" not in text
    # the GPU worker pod mode: PIDs only, no actor series
    pids_only = _source(cluster.head, actors=False)
    snap = pids_only.poll_once()
    assert snap.up and {s.name for s in snap.samples} == {"rlhf_ray_cluster_info"}
    assert pids_only.pid_roles() == roles


@pytest.mark.ray
@pytest.mark.slow
def test_real_kill_is_a_death_with_its_reason(cluster):
    victim = cluster.classes["RewardLoopWorker"].remote()
    ray.get(victim.pid.remote(), timeout=60)
    crasher = cluster.classes["AgentLoopWorker"].remote()
    ray.get(crasher.pid.remote(), timeout=60)
    src = _source(cluster.head)
    base = src.poll_once()
    before = values(base, "rlhf_ray_actor_deaths_total")
    ray.kill(victim)
    crasher.exit.remote()
    snap = wait_until(lambda: _deaths_seen(src, before), 60, 0.5, what="two deaths counted")
    deaths = values(snap, "rlhf_ray_actor_deaths_total")
    assert deaths[("reward", "RAY_KILL")] - before.get(("reward", "RAY_KILL"), 0) == 1
    assert deaths[("agent_loop", "WORKER_DIED")] - before.get(("agent_loop", "WORKER_DIED"), 0) == 1
    assert actors_gauge(snap)[("reward", "DEAD")] >= 1
    # a source started after the deaths does not count them, but shows the series at 0
    late = _source(cluster.head).poll_once()
    assert values(late, "rlhf_ray_actor_deaths_total")[("reward", "RAY_KILL")] == 0


def _deaths_seen(src, before):
    snap = src.poll_once()
    deaths = values(snap, "rlhf_ray_actor_deaths_total")
    grown = sum(deaths.values()) - sum(before.values())
    return snap if grown >= 2 else None


@pytest.mark.ray
@pytest.mark.slow
def test_real_restart_counts(cluster):
    cls = cluster.classes["vLLMHttpServer"].options(max_restarts=2)
    actor = cls.remote()
    first = ray.get(actor.pid.remote(), timeout=60)
    src = _source(cluster.head)
    src.poll_once()
    ray.kill(actor, no_restart=False)
    wait_until(lambda: ray.get(actor.pid.remote(), timeout=30) != first, 60, 0.5, what="restarted")
    snap = src.poll_once()
    assert values(snap, "rlhf_ray_actor_restarts_total")[("rollout",)] == 1
    assert values(snap, "rlhf_ray_actor_deaths_total").get(("rollout", "RAY_KILL"), 0) == 0
    ray.kill(actor)  # no more restarts


@pytest.mark.ray
@pytest.mark.slow
def test_real_gpu_memory_by_role_from_actor_pids(cluster, monkeypatch):
    """NVML (fake) reports processes whose PIDs are the real actors', a child of the rollout
    actor, this test process and a PID that does not exist: roles come only from verified
    actor processes, the rest is `unknown`."""
    child = ray.get(cluster.actors["vLLMHttpServer"][0].spawn_child.remote(), timeout=30)
    ray_src = _source(cluster.head, actors=False)
    assert ray_src.poll_once().up
    trainer, rollout = cluster.pids["WorkerDict"][0], cluster.pids["vLLMHttpServer"][0]
    gpus = [
        FakeGpu(0, processes=[(trainer, 40 << 30), (child, 30 << 30)]),
        FakeGpu(1, processes=[(rollout, 1 << 30), (os.getpid(), 2 << 30), (2**22 + 7, 3 << 30)]),
    ]
    clock = FakeClock()
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
    src = NvmlSource(1.0, ray=ray_src, roles=True, clock=clock)
    clock.advance(1.0)
    snap = src.poll_once()
    got = {
        (labels[0], labels[2]): v
        for labels, v in values(snap, "rlhf_gpu_role_memory_bytes").items()
    }
    assert got == {
        ("0", "trainer"): 40 << 30,
        ("0", "rollout"): 30 << 30,
        ("0", "unknown"): 0,
        ("1", "rollout"): 1 << 30,
        ("1", "unknown"): 5 << 30,
    }


@pytest.mark.ray
@pytest.mark.slow
def test_real_thousand_pending_actors(cluster):
    cls = cluster.classes["TaskRunner"].options(resources={"nonexistent": 1})
    cluster.pending = [cls.remote() for _ in range(1000)]
    src = _source(cluster.head, per_class=True)

    def counted():
        snap = src.poll_once()
        return snap if actors_gauge(snap).get(("driver", "PENDING_CREATION")) == 1000 else None

    snap = wait_until(counted, 60, 0.5, what="1,000 PENDING_CREATION actors")
    assert snap.up and actors_gauge(snap)[("driver", "ALIVE")] == 1
    started = time.perf_counter()
    src.poll_once()
    assert time.perf_counter() - started < 5.0  # one poll stays cheap (bench/ray_poll.py measures)


@pytest.mark.ray
@pytest.mark.slow
def test_serve_with_ray_down_and_back(cluster, tmp_path):
    """Last in this module: stop Ray under a real `serve`; up goes 0, actor series go, the
    verl metrics keep being served; start Ray again on the same port: it recovers."""
    head = cluster.head
    with Exporter(
        tmp_path,
        "--ray",
        "--ray-address",
        head.dashboard_url,
        "--ray-interval",
        "0.5",
        "--ray-timeout",
        "2",
    ) as exp:
        (exp.verl_root / "proj").mkdir()
        write_jsonl(exp.verl_root / "proj" / "exp1.jsonl", DEMO_PLAN[:1])
        exp.wait_for(
            lambda: exp.value("rlhf_exporter_collector_up", collector="ray") == 1.0, 30, "ray up"
        )
        exp.wait_for(
            lambda: (exp.value("rlhf_ray_actors", role="trainer", state="ALIVE") or 0) >= 2,
            30,
            "actors served",
        )
        steps = exp.wait_for(
            lambda: exp.value("rlhf_steps_total", project="proj"), 30, "verl steps"
        )
        (old_session,) = [dict(k)["session_name"] for k in exp.series("rlhf_ray_cluster_info")]
        ray.shutdown()  # the driver first: a driver whose GCS vanishes may end this process
        head.stop()
        exp.wait_for(
            lambda: exp.value("rlhf_exporter_collector_up", collector="ray") == 0.0, 30, "ray down"
        )
        assert exp.value("rlhf_ray_actors") is None  # dropped, not served stale
        assert exp.value("rlhf_steps_total", project="proj") == steps  # verl keeps being served
        assert exp.alive()
        again = RayHead(dashboard_port=head.dashboard_port)
        try:
            exp.wait_for(
                lambda: exp.value("rlhf_exporter_collector_up", collector="ray") == 1.0,
                60,
                "ray recovered",
            )
            (session,) = [dict(k)["session_name"] for k in exp.series("rlhf_ray_cluster_info")]
            assert session != old_session
            assert exp.value("rlhf_ray_actors", role="trainer", state="ALIVE") == 0
        finally:
            again.stop()
    log = exp.log_path.read_text()
    failed = [line for line in log.splitlines() if "ray source failed" in line]
    assert 1 <= len(failed) <= 3, log  # once per distinct problem, not once per 0.5 s poll
    assert "ray source recovered" in log and "Traceback" not in log


def test_truncated_and_malformed_rows(fake_state, caplog):
    """A truncated answer (more than 10,000 rows) is logged once and the DEAD list is read
    every poll; rows with missing or odd fields are counted as well as they can be, never a crash."""
    s = fake_state
    s.live = [
        {"actor_id": "a1", "class_name": None, "state": "ALIVE", "num_restarts": "x", "pid": "NaN"},
        {"actor_id": "a2", "class_name": "WorkerDict", "state": "ALIVE", "num_restarts": None},
        {"state": "ALIVE"},
    ]
    original = s.answer

    def truncated(path, query):
        body = original(path, query)
        if body and path.startswith("/api/v0/actors"):
            body["data"]["result"]["total"] = 50_000  # Ray saw more than it returned
        return body

    s.answer = truncated
    caplog.set_level(logging.WARNING, logger="rlhf_exporter")
    src = RaySource(s.url, interval=60, timeout=2, node_ips=["127.0.0.1"])
    for _ in range(3):
        snap = src.poll_once()
        assert snap.up, snap.errors
    gauge = actors_gauge(snap)
    assert gauge[("trainer", "ALIVE")] == 1 and gauge[("other", "ALIVE")] == 2
    assert src.pid_roles() == {}  # no usable PID
    warnings = [r.getMessage() for r in caplog.records if "lower bounds" in r.getMessage()]
    assert len(warnings) == len(set(warnings)) >= 1  # once per query, not once per poll
    before = s.requests
    src.poll_once()
    assert s.requests - before == 9  # the DEAD list is read every poll while truncated
