"""Discovery of a job's rollout replicas without addresses (issue 29, done-when 3).

On a REAL Ray head: actors named as verl 0.9.1 names its servers, each serving a simulated
engine page on a port of its own process (and listening on a second port that is no HTTP
server, as vLLM's ZMQ sockets do). The Ray source lists this node's actors with their PIDs;
the engine targets find each rollout replica's port through /proc. Reward and teacher
servers, and a replica's node-rank-1 server, are not scraped.

Also without Ray: verl's Prometheus config file, a file_sd list, static targets, and the
/proc reader on this test's own listening socket.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections import Counter

import pytest

from rlhf_exporter.sources import engine_targets
from rlhf_exporter.sources.engine_targets import (
    Targets,
    listening_ports,
    rollout_replica,
)
from rlhf_exporter.sources.engines import EngineSource
from tests.support.procs import wait_until
from tests.support.sim_engine import Replica, page, scenario

ROLLOUT = [
    "vllm_server_0_0",
    "vllm_server_1_0",
    "vllm_server_2_0",
    "trtllm_server_5",  # TRT-LLM: one server per replica, no node rank
    "sglang_server_4_0",  # the prefill peer of replica 4 (disaggregated) ...
    "sglang_server_decode_4_0",  # ... and its two decode servers
    "sglang_server_decode_4_1",
]
NOT_ROLLOUT = [
    "vllm_server_reward_0_0",
    "vllm_server_teacher_0_0",
    "vllm_server_1_1",  # node rank 1 of replica 1: only node rank 0 serves HTTP
    "trtllm_server_reward_0",
]


def test_rollout_replica_names_of_verl_0_9_1() -> None:
    """Each name format verl 0.9.1 gives its rollout servers (site-packages/verl/...)."""
    # workers/rollout/vllm_rollout/vllm_async_server.py:1365-1371 and :1485-1487 (prefix "vllm_"):
    # f"{prefix}server_{self.replica_rank}_{node_rank}{self.name_suffix}"
    assert rollout_replica("vllm_server_3_0") == ("vllm", 3, 0, "")
    assert rollout_replica("vllm_server_3_1") == ("vllm", 3, 1, "")  # node rank 1: not scraped
    # workers/rollout/sglang_rollout/async_sglang_server.py:843:
    # f"sglang_server_{self.replica_rank}_{node_rank}{self.name_suffix}"
    assert rollout_replica("sglang_server_12_1") == ("sglang", 12, 1, "")
    # workers/rollout/trtllm_rollout/trtllm_async_server.py:632-633:
    # f"trtllm_server_{self.replica_rank}{self.name_suffix}" (looked up by
    # trtllm_rollout.py:379 as f"trtllm_server_{self.replica_rank}")
    assert rollout_replica("trtllm_server_0") == ("trtllm", 0, 0, "")
    assert rollout_replica("trtllm_server_7") == ("trtllm", 7, 0, "")
    # workers/rollout/vllm_rollout/vllm_pd_replica.py:154 (prefill) and :185 (decode):
    # f"vllm_server_{self.replica_rank}_0{self.name_suffix}",
    # f"vllm_server_decode_{self.replica_rank}_{i}{self.name_suffix}"
    assert rollout_replica("vllm_server_2_0") == ("vllm", 2, 0, "")
    assert rollout_replica("vllm_server_decode_2_1") == ("vllm", 2, 0, "decode")
    # workers/rollout/sglang_rollout/sglang_pd_replica.py:136 and :163:
    # f"sglang_server_{self.replica_rank}_0", f"sglang_server_decode_{self.replica_rank}_{i}"
    assert rollout_replica("sglang_server_decode_0_0") == ("sglang", 0, 0, "decode")
    # workers/rollout/replica.py:120: self.name_suffix = f"_{name_suffix}" if name_suffix else ""
    assert rollout_replica("vllm_server_1_0_policy") == ("vllm", 1, 0, "")
    assert rollout_replica("trtllm_server_1_policy") == ("trtllm", 1, 0, "")
    for name in (
        # vllm_async_server.py:1367/1369, async_sglang_server.py:839/841,
        # trtllm_async_server.py:635: reward and teacher servers
        "vllm_server_reward_0_0",
        "vllm_server_teacher_0_0_Qwen_Qwen2.5-7B",
        "sglang_server_reward_1_0",
        "sglang_server_teacher_1_0",
        "trtllm_server_reward_0",
        "rollout_reward_colocate_0CheckpointEngineWorker_0:0",
        "vllm_server_",
        "trtllm_server_",
        "",
    ):
        assert rollout_replica(name) is None, name


def test_listening_ports_of_this_process() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in listening_ports(os.getpid())
    assert listening_ports(2**22 + 12345) == []  # no such process: nothing, no error


def test_verl_prometheus_file_file_sd_and_static(tmp_path) -> None:
    prom = tmp_path / "prometheus.yml"
    prom.write_text(
        "global:\n  scrape_interval: 10s\nscrape_configs:\n"
        "- job_name: ray\n  file_sd_configs:\n  - files: [/tmp/ray/prom_metrics_service_discovery.json]\n"
        "- job_name: rollout\n  metrics_path: /metrics\n  static_configs:\n"
        "  - targets: ['10.0.0.5:41001', '10.0.0.6:41002']\n"
    )
    sd = tmp_path / "engines.json"
    sd.write_text(json.dumps([{"targets": ["10.0.0.7:8000"], "labels": {"replica": "r7"}}]))
    t = Targets(
        static=["http://10.0.0.8:9000/metrics", "10.0.0.5:41001"],
        file_sd=str(sd),
        prometheus_file=str(prom),
        reread=0.0,  # every change read at once (the default waits FILE_REREAD seconds)
    )
    errors: Counter[str] = Counter()
    got = {x.name: x.url for x in t.current(errors)}
    assert got == {
        "10.0.0.5:41001": "http://10.0.0.5:41001/metrics",
        "10.0.0.6:41002": "http://10.0.0.6:41002/metrics",
        "r7": "http://10.0.0.7:8000/metrics",
        "10.0.0.8:9000": "http://10.0.0.8:9000/metrics",
    }
    sd.write_text("{not json")  # broken: counted, the targets from it are gone
    os.utime(sd, (1, 1))
    assert "r7" not in {x.name for x in t.current(errors)}
    assert errors["engine_bad_target_file"] == 1


def _server_class(class_name: str):
    """An actor class that serves a given /metrics body from its own process, and listens on
    a second port that answers nothing (vLLM's ZMQ-like sockets)."""
    import ray

    class Server:
        def pid(self) -> int:
            return os.getpid()

        def serve(self, body: bytes) -> tuple[int, int]:
            import threading
            from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

            class H(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *a) -> None:
                    pass

            self.mute = socket.socket()
            self.mute.bind(("127.0.0.1", 0))
            self.mute.listen()  # never accepted: a probe must time out and move on
            self.httpd = ThreadingHTTPServer(("0.0.0.0", 0), H)
            threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
            return self.httpd.server_address[1], self.mute.getsockname()[1]

    Server.__name__ = Server.__qualname__ = class_name
    return ray.remote(num_cpus=0)(Server)


@pytest.mark.ray
@pytest.mark.slow
def test_discovery_on_a_real_ray_head_finds_every_rollout_replica_and_no_other(
    monkeypatch,
) -> None:
    import ray

    from rlhf_exporter.sources.ray import RaySource
    from tests.support.ray_head import connected_head

    replicas, _ = scenario("healthy")
    body = page(replicas[0], 0.0, [])
    with connected_head("rlhf-exporter-engines") as head:
        classes = {
            e: _server_class(c)
            for e, c in (
                ("vllm", "vLLMHttpServer"),
                ("sglang", "SGLangHttpServer"),
                ("trtllm", "TRTLLMHttpServer"),
            )
        }
        cls = classes["vllm"]
        actors = {
            name: classes[name.split("_", 1)[0]].options(name=name).remote()
            for name in ROLLOUT + NOT_ROLLOUT
        }
        ports = dict(
            zip(actors, ray.get([a.serve.remote(body) for a in actors.values()]), strict=True)
        )
        pids = dict(zip(actors, ray.get([a.pid.remote() for a in actors.values()]), strict=True))
        assert len(set(pids.values())) == len(actors)  # one worker process per server
        ray_src = RaySource(head.dashboard_url, interval=60, timeout=10)
        wait_until(
            lambda: ray_src.poll_once().up and len(ray_src.pid_actors()) >= len(actors),
            60,
            0.5,
            what="the Ray source lists the servers",
        )
        targets = Targets(ray=ray_src, probe_timeout=0.5)
        errors: Counter[str] = Counter()
        found: dict[str, engine_targets.Target] = {}
        polls = 0
        while set(found) != set(ROLLOUT) and polls < 4:  # at most MAX_PROBES new PIDs a poll
            found = {t.name: t for t in targets.current(errors)}
            polls += 1
        assert set(found) == set(ROLLOUT), found
        assert polls == -(-len(ROLLOUT) // engine_targets.MAX_PROBES)  # each probed once
        for name in ROLLOUT:
            http_port, mute_port = ports[name]
            assert found[name].url.endswith(f":{http_port}/metrics"), (found[name], mute_port)
            assert found[name].engine == name.split("_", 1)[0]
        assert found["sglang_server_4_0"].role == "prefill"  # it has decode peers
        assert found["sglang_server_decode_4_1"].role == "decode"
        assert found["vllm_server_0_0"].role == ""
        assert not errors
        # a server whose HTTP server is not up yet (vLLM loads the model first): not a target,
        # counted, and found once it listens and PROBE_RETRY has passed
        late = cls.options(name="vllm_server_3_0").remote()
        wait_until(
            lambda: (
                "vllm_server_3_0"
                in {a.name for a in (ray_src.poll_once() and ray_src.pid_actors()).values()}
            ),
            60,
            0.5,
            what="the Ray source lists the late server",
        )
        assert "vllm_server_3_0" not in {t.name for t in targets.current(errors)}
        assert errors["engine_port_not_found"] == 1
        late_port, _ = ray.get(late.serve.remote(body))
        monkeypatch.setattr(engine_targets, "PROBE_RETRY", 0.0)
        again = {t.name: t for t in targets.current(errors)}
        assert again["vllm_server_3_0"].url.endswith(f":{late_port}/metrics")
        ray.kill(late)
        wait_until(
            lambda: (
                "vllm_server_3_0"
                not in {a.name for a in (ray_src.poll_once() and ray_src.pid_actors()).values()}
            ),
            60,
            0.5,
            what="the late server leaves",
        )
        # the engine source reads them: every replica up, with its engine series
        source = EngineSource(targets, interval=1.0, active=lambda: True)
        snap = source.poll_once()
        up = {s.labels: s.value for s in snap.series() if s.name == "rlhf_engine_up"}
        assert up == {(name, "vllm"): 1.0 for name in ROLLOUT}
        # a replica that goes away is no longer a target; the others stay
        ray.kill(actors["vllm_server_2_0"])
        wait_until(
            lambda: (
                "vllm_server_2_0"
                not in {a.name for a in (ray_src.poll_once() and ray_src.pid_actors()).values()}
            ),
            60,
            0.5,
            what="the killed server leaves the Ray source's list",
        )
        assert {t.name for t in targets.current(errors)} == set(ROLLOUT) - {"vllm_server_2_0"}
        source.close()


def test_a_replica_that_answers_without_stats_counts_as_no_stats() -> None:
    from tests.support.sim_engine import EngineSim, SimClock

    clock = SimClock(10.0)
    r = Replica("vllm", scenario("healthy")[0][0].profile, stats=False)
    with EngineSim([r], [(0.0, 100.0)], clock) as sim:
        source = EngineSource(Targets(static=sim.urls()), active=lambda: True, clock=clock)
        snap = source.poll_once()
        source.close()
    assert snap.record_errors.get("engine_no_stats") == 1
    up = {s.labels: s.value for s in snap.series() if s.name == "rlhf_engine_up"}
    assert list(up.values()) == [1.0]  # it answers: up, but its windows are not usable


def test_sglang_without_enable_metrics_reads_as_no_stats_not_as_a_missing_port() -> None:
    """SGLang adds its /metrics route only with enable_metrics (sglang 0.5.23
    srt/utils/common.py `add_prometheus_middleware`, called by verl 0.9.1
    async_sglang_server.py:472-475 when server_args.enable_metrics): its server answers 404.
    That replica answers without stats (engine_no_stats), as vLLM with disable_log_stats."""
    import subprocess
    import sys
    from types import SimpleNamespace

    # the server is a process titled as Ray titles its workers (`ray::...`): discovery probes
    # only Ray workers' ports
    code = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_error(404)\n"
        "    def log_message(self, *a): pass\n"
        "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n"
        "print(s.server_address[1], flush=True)\n"
        "s.serve_forever()\n"
    )
    proc = subprocess.Popen(
        ["bash", "-c", 'exec -a "ray::SGLangHttpServer" "$0" -c "$1"', sys.executable, code],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        ray = SimpleNamespace(
            pid_actors=lambda: {proc.pid: SimpleNamespace(name="sglang_server_0_0")}
        )
        targets = Targets(ray=ray, probe_timeout=1.0)
        errors: Counter[str] = Counter()
        (found,) = targets.current(errors)
        assert found.url == f"http://127.0.0.1:{port}/metrics"
        assert not errors  # not engine_port_not_found
        source = EngineSource(targets, active=lambda: True)
        snap = source.poll_once()
        source.close()
    finally:
        proc.kill()
        proc.wait()
    assert snap.record_errors.get("engine_no_stats") == 1
    assert not snap.record_errors.get("engine_http_error")  # known reasons are served at 0
    up = {s.labels: s.value for s in snap.series() if s.name == "rlhf_engine_up"}
    assert up == {("sglang_server_0_0", "sglang"): 1.0}


def test_a_server_still_loading_is_probed_again_soon(monkeypatch) -> None:
    """Issue 32: a real vLLM server listens tens of seconds after its actor is ALIVE. Probes
    that find no port are retried after 1, 2, 4, ... s (at most PROBE_RETRY apart), not a
    fixed 30 s, which missed a short real job's whole rollout."""
    from types import SimpleNamespace

    actor = SimpleNamespace(name="vllm_server_0_0")
    ray = SimpleNamespace(pid_actors=lambda: {4242: actor})
    targets = engine_targets.Targets(ray=ray)
    clock = [100.0]
    listening_at = 103.5  # the server's HTTP port opens 3.5 s after the first probe
    probes: list[float] = []

    def probe(pid: int) -> str | None:
        probes.append(clock[0])
        return "http://127.0.0.1:9/metrics" if clock[0] >= listening_at else None

    monkeypatch.setattr(engine_targets.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(targets, "_probe", probe)
    # PID 4242 stands for a Ray worker here (the `ray::` title check has tests of its own)
    monkeypatch.setattr(engine_targets, "_ray_worker", lambda pid, proc="/proc": True)
    found = []
    errors: Counter[str] = Counter()
    while clock[0] <= 110.0 and not found:
        found = targets.current(errors)
        clock[0] += 0.5
    assert found and found[0].url == "http://127.0.0.1:9/metrics"
    assert probes == [100.0, 101.0, 103.0, 107.0]  # 1, 2, 4 s apart
    assert errors[engine_targets.PORT_NOT_FOUND] == 3


def test_a_job_that_begins_stepping_has_its_servers_probed_at_once(monkeypatch) -> None:
    """CI, issue 32: while a server loads its model its probe backoff grows to PROBE_RETRY;
    when a job begins stepping its servers serve, so the source probes a server without a
    port at its first poll, not after the grown backoff (the real V1 job's last two steps
    took 6 s: a wait of up to PROBE_RETRY could miss both rollouts)."""
    from types import SimpleNamespace

    actor = SimpleNamespace(name="vllm_server_0_0")
    ray = SimpleNamespace(pid_actors=lambda: {4242: actor})
    targets = engine_targets.Targets(ray=ray)
    clock = [1000.0]
    listening = [False]
    probes: list[float] = []

    def probe(pid: int) -> str | None:
        probes.append(clock[0])
        return "http://127.0.0.1:9/metrics" if listening[0] else None

    monkeypatch.setattr(engine_targets.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(targets, "_probe", probe)
    monkeypatch.setattr(engine_targets, "_ray_worker", lambda pid, proc="/proc": True)
    active = [False]
    source = EngineSource(
        targets, interval=1.0, idle_interval=15.0, active=lambda: active[0],
        clock=lambda: clock[0],
    )  # fmt: skip
    try:
        for _ in range(120):  # two minutes of polls (the server's actor alive: 1 s apart)
            source.poll()
            clock[0] += 1.0
        polled, last = clock[0] - 1.0, probes[-1]
        gaps = [b - a for a, b in itertools.pairwise(probes)]
        assert gaps[:4] == [1.0, 2.0, 4.0, 8.0] and set(gaps[4:]) == {engine_targets.PROBE_RETRY}
        listening[0] = True
        active[0] = True  # the job's first step ended: it steps now
        clock[0] = polled + 1.0
        assert clock[0] < last + engine_targets.PROBE_RETRY  # before the backoff's next probe
        source.poll()
        assert probes[-1] == clock[0], probes
        assert source.targets.current(Counter())[0].url == "http://127.0.0.1:9/metrics"
    finally:
        source.close()


def test_a_live_rollout_server_is_read_fast_before_its_job_logs_a_step(monkeypatch) -> None:
    """Issue 32: verl's rollout server actors live only while their job runs, so while Ray
    lists one alive on this node the engines are read at the fast interval, before the job's
    first record (the board knows the job only then: the real V1 job's second rollout began
    as its first record was written, and a 1 s verl poll plus a probe could miss it). When
    the actor is gone, the idle interval again."""
    from types import SimpleNamespace

    alive = {4242: SimpleNamespace(name="vllm_server_0_0")}
    ray = SimpleNamespace(pid_actors=lambda: dict(alive))
    targets = engine_targets.Targets(ray=ray)
    monkeypatch.setattr(targets, "_probe", lambda pid: None)  # still loading: no port yet
    monkeypatch.setattr(engine_targets, "_ray_worker", lambda pid, proc="/proc": True)
    clock = [5000.0]
    source = EngineSource(targets, interval=1.0, idle_interval=15.0, clock=lambda: clock[0])
    try:
        source.poll()  # the first poll: Ray lists the server, its port not found yet
        assert targets.ray_servers == 1
        assert source._due(clock[0] + 1.0)  # no step logged, yet read every second
        alive.clear()  # the job ended: its actors are gone
        clock[0] += 1.0
        source.poll()
        assert targets.ray_servers == 0
        assert not source._due(clock[0] + 1.0) and source._due(clock[0] + 15.0)
        # a reward server is no rollout replica: it does not make the reads fast
        alive[77] = SimpleNamespace(name="vllm_server_reward_0_0")
        clock[0] += 15.0
        source.poll()
        assert targets.ray_servers == 0 and not source._due(clock[0] + 1.0)
    finally:
        source.close()
