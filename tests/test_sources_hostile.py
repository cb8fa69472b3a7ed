"""Hostile engine pages and target lists, Ray Jobs API answers and declared job ends never
crash a source, stay within their bounds and keep the good records.

Each test replays one hostile input against the real sources, over real sockets and
files on 127.0.0.1 (the HTTP client itself: tests/test_http_client.py; property tests:
tests/test_sources_hostile_property.py; memory and scrape-time figures: bench/hostile_sources.py).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.lifecycle import END_GRACE, RayFact
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import EngineSource, parse
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.raw_http import Conn, RawServer, answer
from tests.support.ray_state import RayStateApi

TH = load_thresholds(None)
RUNNING = "vllm:num_requests_running"


def page(running: float = 2.0, waiting: float = 1.0, kv: float = 0.5, tokens: float = 100.0,
         preempted: float = 0.0) -> bytes:  # fmt: skip
    return (
        f'# TYPE {RUNNING} gauge\n{RUNNING}{{engine="0"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
        f'vllm:generation_tokens_total{{engine="0"}} {tokens}\n'
        f'vllm:num_preemptions_total{{engine="0"}} {preempted}\n'
    ).encode()


def serving(body_of) -> RawServer:
    """An engine answering `body_of()` on a kept-alive connection."""

    def script(conn: Conn) -> None:
        while conn.request():
            if not conn.send(answer(body_of(), headers={"Content-Type": "text/plain"})):
                return

    return RawServer(script)


def up_of(source: EngineSource) -> dict[str, float]:
    return {s.labels[0]: s.value for s in source.poll().samples if s.name == "rlhf_engine_up"}


# -- engine pages ------------------------------------------------------------------------------
def test_a_page_of_70k_label_sets_reads_at_most_max_series_per_family() -> None:
    lines = [f"# TYPE {RUNNING} gauge"] + [
        f'{RUNNING}{{engine="0",model_name="m",x="{i}"}} 1' for i in range(70_000)
    ]
    body = ("\n".join(lines) + "\n").encode() + page()[len(f"# TYPE {RUNNING} gauge\n") :]
    read = parse(body, 1.0, max_series=256)
    assert read.error is None and read.sample is not None
    assert read.sample.running == 256.0  # the first 256 series, not 70,000
    assert read.dropped["engine_series_dropped"] == 70_000 + 1 - 256
    assert read.sample.kv == 0.5 and read.sample.waiting == 1.0  # the other families kept


def test_values_that_no_engine_has_are_dropped_and_counted() -> None:
    huge = b"".join(f'{RUNNING}{{engine="{i}"}} 1e308\n'.encode() for i in range(8))
    read = parse(huge + page()[page().index(b"vllm:num_requests_waiting") :], 1.0)
    assert read.sample is not None and read.sample.running is None  # never +Inf
    assert read.dropped["engine_bad_value"] == 8
    for bad in (b"-1", b"NaN", b"+Inf", b"1.5"):
        read = parse(page() + b'vllm:kv_cache_usage_perc{engine="1"} ' + bad + b"\n", 1.0)
        assert read.sample is not None and read.sample.kv == 0.5, bad  # the good one kept
        assert read.dropped["engine_bad_value"] == 1, bad


def test_counters_flipping_between_0_and_1e18_credit_nothing_and_never_go_back() -> None:
    flips = iter([0.0, 1e18, 0.0, 1e15, 0.0, -1e18, 50.0, 80.0] * 3)
    value = [0.0]

    def body() -> bytes:
        return page(tokens=value[0], preempted=value[0])

    now = [1000.0]
    with serving(body) as engine:
        source = EngineSource(Targets(static=[engine.url]), clock=lambda: now[0],
                              active=lambda: True)  # fmt: skip
        for v in flips:
            value[0] = v
            source.poll()
            now[0] += 1.0
        ring = next(iter(source.samples_over([(0.0, 1e9)]).values()))
        errors = source.error_counts()
        source.close()
    tokens = [s.tokens for s in ring if s.tokens is not None]
    assert all(b >= a for a, b in itertools.pairwise(tokens))  # never backwards
    assert tokens[-1] - tokens[0] < 1000  # only the real increases (50 -> 80, resets)
    assert errors["engine_counter_jump"] == 6  # 1e15 in a second, tokens and preemptions
    assert errors["engine_bad_value"] == 12  # +-1e18: past 2**53, or negative


def test_a_slow_engine_does_not_hold_the_others() -> None:
    """Headers trickled a byte per 0.1 s for 6 s: each byte within the socket's timeout."""

    def trickle(conn: Conn) -> None:
        conn.request()
        raw = answer(page())
        if conn.trickle(raw[:60], every=0.1):
            conn.send(raw[60:])

    with serving(page) as good, RawServer(trickle) as slow:
        source = EngineSource(Targets(static=[good.url, slow.url]), timeout=0.5,
                              active=lambda: True)  # fmt: skip
        up = up_of(source)
        slow.wait_done()
        errors = source.error_counts()
        source.close()
    assert up == {good.url[7:]: 1.0, slow.url[7:]: 0.0}
    assert errors["engine_timeout"] == 1 and slow.cut == 1
    # cut off at its deadline (0.5 s: ~5 bytes), not after most of the trickle was waited for
    assert slow.sent < 30


def test_an_engine_redirect_or_encoded_page_is_refused() -> None:
    with serving(page) as other:

        def redirect(conn: Conn) -> None:
            while conn.request():
                conn.send(answer(b"", "302 Found", {"Location": other.url + "/metrics"}))

        def encoded(conn: Conn) -> None:
            while conn.request():
                conn.send(answer(gzip.compress(page()), headers={"Content-Encoding": "gzip"}))

        with RawServer(redirect) as r, RawServer(encoded) as e:
            source = EngineSource(Targets(static=[r.url, e.url]), active=lambda: True)
            assert set(up_of(source).values()) == {0.0}
            errors = source.error_counts()
            source.close()
        assert other.connections == 0
    assert errors["engine_redirect"] == 1 and errors["engine_encoded"] == 1
    assert errors["engine_bad_http"] == 0  # every known reason is there from 0


def test_replica_churn_keeps_at_most_max_replicas(tmp_path: Path) -> None:
    sd = tmp_path / "targets.json"
    now = [1000.0]
    with serving(page) as engine:
        source = EngineSource(Targets(file_sd=str(sd), reread=0.0), max_replicas=4,
                              active=lambda: True, clock=lambda: now[0])  # fmt: skip
        for round_ in range(8):
            now[0] += 1.0
            groups = [{"targets": [f"{engine.url}/metrics?r={round_}-{i}"],
                       "labels": {"replica": f"r{round_}-{i}"}} for i in range(4)]  # fmt: skip
            sd.write_text(json.dumps(groups))
            os.utime(sd, (round_ + 1, round_ + 1))
            assert len(up_of(source)) <= 4
        rings = source.samples_over([(0.0, 1e12)])
        errors = source.error_counts()
        source.close()
    assert len(rings) <= 4 and errors["engine_replicas_evicted"] >= 24


# -- target lists ------------------------------------------------------------------------------
def alias_bomb(n: int = 200, m: int = 200) -> str:
    """n distinct targets, referenced by m groups: n x m targets from a ~30 KB file."""
    targets = ", ".join(f'"10.0.{i // 250}.{i % 250}:8000"' for i in range(n))
    return f"- {{targets: &t [{targets}]}}\n" + "- {targets: *t}\n" * m


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    errors: Counter[str] = Counter()
    sd = tmp_path / "targets.yaml"
    sd.write_text(alias_bomb())
    assert Targets(file_sd=str(sd)).current(errors) == []
    prom = tmp_path / "prometheus.yml"
    prom.write_text(
        "scrape_configs:\n- job_name: rollout\n  static_configs:\n"
        '  - targets: &t ["10.0.0.1:1", "10.0.0.2:2"]\n' + "  - targets: *t\n" * 50
    )
    assert Targets(prometheus_file=str(prom)).current(errors) == []
    assert errors["engine_target_file_alias"] == 2


def test_targets_are_capped_while_the_list_is_built(tmp_path: Path) -> None:
    sd = tmp_path / "targets.json"
    sd.write_text(json.dumps([{"targets": [f"10.1.{i // 250}.{i % 250}:1" for i in range(5000)]}]))
    errors: Counter[str] = Counter()
    t = Targets(file_sd=str(sd))
    assert len(t.current(errors, 8)) == 8
    assert errors["engine_too_many_replicas"] == 5000 - 8
    assert sum(len(f.targets) for f in t._files.values()) == 8  # never more held


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "too_large"])
def test_a_target_list_that_is_no_small_regular_file_is_refused(tmp_path: Path, kind) -> None:
    path = tmp_path / "targets.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait forever
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")  # st_size 0, endless
    else:
        path.write_text("# pad\n" * 200_000)
    errors: Counter[str] = Counter()
    got: list = []
    reader = threading.Thread(
        target=lambda: got.append(Targets(file_sd=str(path)).current(errors)), daemon=True
    )
    reader.start()
    reader.join(30)
    assert got == [[]], "the engine source is blocked by the target list"
    want = {"fifo": "not_regular", "dev_zero": "not_regular", "too_large": "too_large"}[kind]
    assert errors[f"engine_target_file_{want}"] == 1


def test_a_list_rewritten_with_the_same_bytes_is_not_parsed_again(tmp_path: Path,
                                                                   monkeypatch) -> None:  # fmt: skip
    from rlhf_exporter.sources import engine_targets

    parsed = []
    real = engine_targets.load_document
    monkeypatch.setattr(engine_targets, "load_document", lambda raw: parsed.append(1) or real(raw))
    sd = tmp_path / "targets.yaml"
    body = "".join(f"- targets: ['10.2.0.{i % 250}:{1000 + i}']\n" for i in range(3000))
    t = Targets(file_sd=str(sd), reread=0.0)
    for second in range(5):  # rewritten every second, the same bytes
        sd.write_text(body)
        os.utime(sd, (second + 1, second + 1))
        assert len(t.current(Counter(), 64)) == 64
    assert len(parsed) == 1
    sd.write_text(body.replace("10.2.0.0:1000", "10.3.0.0:1000"))
    t.current(Counter(), 64)
    assert len(parsed) == 2  # changed bytes are read


def test_outside_labels_are_cleaned_and_cut(tmp_path: Path) -> None:
    sd = tmp_path / "targets.json"
    sd.write_text(json.dumps([{"targets": ["10.0.0.9:1"],
                               "labels": {"replica": "r\n" + "x" * 1_000_000,
                                          "engine": "e" * 5000}}]))  # fmt: skip
    (target,) = Targets(file_sd=str(sd)).current(Counter())
    assert len(target.name) <= 120 and "\n" not in target.name and len(target.engine) <= 120
    with RayStateApi() as api:
        api.hostile["/api/version"] = (200, {}, json.dumps(
            {"ray_version": "2.60\x00" + "v" * 1_000_000, "session_name": "s"}).encode())  # fmt: skip
        snap = RaySource(api.url, node_ips=["127.0.0.1"]).poll_once()
    (info,) = [s for s in snap.samples if s.name == "rlhf_ray_cluster_info"]
    assert len(info.labels[0]) <= 120 and "\x00" not in info.labels[0]


def test_only_ray_worker_pids_get_their_ports_probed() -> None:
    """A (fake) Ray answer naming this test's PID as a rollout server: never probed."""
    with serving(page) as engine:

        class FakeRay:
            def pid_actors(self):
                from rlhf_exporter.sources.ray import ActorProcess

                return {os.getpid(): ActorProcess("vLLMHttpServer", "rollout", "vllm_server_0_0")}

        errors: Counter[str] = Counter()
        assert Targets(ray=FakeRay()).current(errors) == []
        assert errors["engine_not_a_ray_worker"] == 1 and engine.connections == 0


# -- Ray answers -------------------------------------------------------------------------------
def test_a_ray_answer_of_a_million_objects_is_refused_before_it_is_parsed() -> None:
    flood = b'{"result": true, "msg": "", "data": {"result": {"result": [' + b"{}," * 1_000_000
    flood += b'{}], "total": 1, "num_after_truncation": 1}}}'
    with RayStateApi() as api:
        api.hostile["/api/v0/nodes"] = (200, {}, flood)
        snap = RaySource(api.url, node_ips=["127.0.0.1"]).poll_once()
    assert not snap.up and snap.errors["too_many_elements"] == 1


def test_a_gzip_ray_answer_or_a_redirect_is_refused() -> None:
    with RayStateApi() as api, RayStateApi() as other:
        version = json.dumps({"ray_version": "2.60.0", "session_name": "s"}).encode()
        api.hostile["/api/version"] = (200, {"Content-Encoding": "gzip"}, gzip.compress(version))
        assert RaySource(api.url, node_ips=["127.0.0.1"]).poll_once().errors["encoded"] == 1
        api.hostile["/api/version"] = (302, {"Location": other.url + "/api/version"}, b"")
        snap = RaySource(api.url, node_ips=["127.0.0.1"]).poll_once()
    assert not snap.up and snap.errors["redirect"] == 1


def test_a_ray_head_trickling_headers_is_cut_at_the_timeout() -> None:
    def script(conn: Conn) -> None:
        conn.request()
        raw = answer(b'{"ray_version": "2.60.0", "session_name": "s"}')
        if conn.trickle(raw[:50], every=0.1):
            conn.send(raw[50:])

    with RawServer(script) as head:
        snap = RaySource(head.url, timeout=1.0, node_ips=["127.0.0.1"]).poll_once()
        head.wait_done()
    assert not snap.up and snap.errors["timeout"] == 1 and head.cut == 1


# -- declared ends -----------------------------------------------------------------------------
def test_a_ray_end_does_not_outrank_a_job_that_still_steps() -> None:
    now = [10_000.0]
    job = Job("p", "e", TH, clock=lambda: now[0])
    job.feed([Record(1, {"timing_s/step": 2.0})])
    # another submission's metadata names this job; it ended at 10,000 s
    job.set_ray(RayFact("SUCCEEDED", "raysubmit_other", "", 10_000.0))
    assert job.state == "finished"  # nothing says otherwise yet
    now[0] += END_GRACE + 60
    job.feed([Record(2, {"timing_s/step": 2.0})])
    assert job.state == "running"  # it stepped after that end: the end is not its own
    assert job.drops == {"ray_end_ignored": 1}
    now[0] += 3600  # and when it stalls now, it stays running (the stall alert pages)
    assert job.state == "running"


def test_a_finished_file_older_than_the_run_or_beside_a_stepping_job_is_ignored(
    tmp_path: Path,
) -> None:
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    log = root / "p" / "e.jsonl"
    finished = root / "p" / "e.finished"
    finished.write_text("")
    old = time.time() - 3600
    os.utime(finished, (old, old))  # left from an earlier run
    write_jsonl(log, DEMO_PLAN[:3])  # the rerun truncated and wrote the log
    now = [time.time() + 30]
    src = VerlFileSource(TH, [root], interval=1.0, clock=lambda: now[0])
    snap = src.poll_once()
    now[0] += 30
    snap = src.poll_once()
    (summary,) = src.jobs()
    assert summary["state"] == "running"
    now[0] += 30
    snap = src.poll_once()
    assert snap.record_errors["finished_file_ignored"] == 1


def test_a_total_steps_fifo_does_not_blind_the_verl_source(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    for name in ("a", "b"):
        write_jsonl(root / "p" / f"{name}.jsonl", DEMO_PLAN[:3])
    os.mkfifo(root / "p" / "a.total_steps")  # nobody writes it: open() would wait for ever
    now = [time.time() + 100]
    src = VerlFileSource(TH, [root], interval=1.0, clock=lambda: now[0])
    snaps: list = []

    def polls() -> None:
        for _ in range(3):
            snaps.append(src.poll_once())
            now[0] += 30

    poller = threading.Thread(target=polls, daemon=True)
    poller.start()
    poller.join(60)
    assert len(snaps) == 3, "the verl source is blocked by a FIFO"
    assert {j["experiment"] for j in src.jobs()} == {"a", "b"}
    assert snaps[-1].record_errors["bad_total_steps"] >= 1


def test_wanted_lines_are_found_exactly_and_in_bounds() -> None:
    from rlhf_exporter.sources.engines import wanted_lines

    waiting = "vllm:num_requests_waiting"
    by_reason = "".join(f'{waiting}_by_reason{{r="{i}"}} 7\n' for i in range(5000))
    body = (f'{waiting}{{e="first"}} 1\n' + by_reason + f"{waiting} 2\n" + by_reason
            + "".join(f'{waiting}{{e="{i}"}} 3\n' for i in range(20))).encode()  # fmt: skip
    # `..._by_reason` is a wanted family of its own (vLLM's capacity waits): its lines are
    # capped and counted on their own, never taken for `vllm:num_requests_waiting`
    lines, excess = wanted_lines(body, max_series=10)
    exact = [line for line in lines if not line.startswith(f"{waiting}_by_reason".encode())]
    assert exact[0] == b'vllm:num_requests_waiting{e="first"} 1' and len(exact) == 10
    assert len(lines) - len(exact) == 10
    assert excess == (22 - 10) + (10000 - 10)  # every line is read or counted
    lines, excess = wanted_lines(body, max_series=100)
    exact = [line for line in lines if not line.startswith(f"{waiting}_by_reason".encode())]
    assert len(exact) == 22 and len(lines) == 122 and excess == 10000 - 100


def test_class_names_from_ray_are_cut_and_never_doubled() -> None:
    with RayStateApi() as api:
        api.alive("a1", "K" * 200 + "One", pid=11)
        api.alive("a2", "K" * 200 + "Two\n", pid=12)
        snap = RaySource(api.url, per_class=True, node_ips=["127.0.0.1"]).poll_once()
    rows = [s for s in snap.samples if s.name == "rlhf_ray_actors_by_class"]
    assert all(len(s.labels[0]) <= 120 for s in rows)
    alive = [s for s in rows if s.labels[1] == "ALIVE"]
    assert len(alive) == 1 and alive[0].value == 2.0  # one series, both counted
    assert len({s.labels for s in rows}) == len(rows)  # no label set twice


def test_a_jobs_api_entry_naming_a_stepping_job_does_not_end_it(tmp_path: Path) -> None:
    """Anyone who can submit to the cluster can name another job in `--metadata-json`: an end
    of that submission two minutes before the job's latest steps is not the job's end."""
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    write_jsonl(root / "p" / "e.jsonl", DEMO_PLAN[:3])  # stepping now
    with RayStateApi() as api:
        api.submit("raysubmit_other", "x", "y", job_id="03000000")
        api.jobs["raysubmit_other"]["metadata"] = {"project": "p", "experiment": "e"}
        api.end("raysubmit_other", "SUCCEEDED", end_ms=int((time.time() - 120) * 1000))
        ray = RaySource(api.url, node_ips=["127.0.0.1"])
        ray.poll_once()
        src = VerlFileSource(TH, [root], interval=1.0, facts=ray.facts())
        src.poll_once()
        (summary,) = src.jobs()
        snap = src.poll_once()
    assert summary["state"] == "running"
    assert snap.record_errors["ray_end_ignored"] == 1
