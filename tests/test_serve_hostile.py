"""Issue 12: hostile and broken input against a real `serve` process.

Each test is one repro from the issue: a bad name, a number too big for a float, key floods,
a push squatting a name, slow and aborted connections, SIGHUP, a same-prefix rewrite that
grew, a restart over a stalled job. After each, /metrics answers for every other job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time

import pytest

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from tests.support.procs import exporter_cmd
from tests.support.serve import Exporter

TOKEN = "hostile-token"


def good_lines(n: int = 4, seed: int = 0) -> bytes:
    return b"".join(encode(r) for r in records([(REGIMES["sync_bound"], n - 1)], seed=seed))


def errors(exp: Exporter, reason: str, collector: str = "verl") -> float:
    return exp.value("rlhf_exporter_record_errors_total", collector=collector, reason=reason) or 0.0


def promtool_ok(text: str) -> None:
    if not shutil.which("promtool"):
        return
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr  # parses, and no lint finding


def rss_bytes(exp: Exporter) -> int:
    for line in open(f"/proc/{exp.popen.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def threads(exp: Exporter) -> int:
    for line in open(f"/proc/{exp.popen.pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads")


@pytest.fixture()
def exp(tmp_path):
    with Exporter(tmp_path, env={"RLHF_EXPORTER_PUSH_TOKEN": TOKEN}) as e:
        (e.verl_root / "ok").mkdir()
        (e.verl_root / "ok" / "job.jsonl").write_bytes(good_lines(4))
        e.wait_for(lambda: e.value("rlhf_steps_total", project="ok", experiment="job") == 4)
        yield e


def healthy(exp: Exporter) -> None:
    """The healthy job still exports, and every endpoint answers."""
    text = exp.metrics_text()
    assert 'rlhf_steps_total{experiment="job",project="ok"} 4.0' in text
    assert exp.value("rlhf_exporter_collector_up", collector="verl") == 1.0
    assert exp.get("/").status_code == 200
    assert exp.get("/api/v1/jobs").status_code == 200
    promtool_ok(text)


def test_names_that_are_not_utf8_never_break_metrics(exp):
    root = os.fsencode(exp.verl_root)
    bad_dir = root + b"/proj\xff"
    os.mkdir(bad_dir)
    with open(bad_dir + b"/e.jsonl", "wb") as f:
        f.write(good_lines(2))
    (exp.verl_root / "p2").mkdir()
    (exp.verl_root / "p2" / "e.jsonl").write_bytes(
        b'{"step":1,"data":{"timing_s/\\udc80":1.0,"timing_s/step":2.0}}\n'
    )
    exp.wait_for(lambda: exp.value("rlhf_steps_total", project="proj\ufffd") == 2)
    exp.wait_for(lambda: exp.value("rlhf_steps_total", project="p2") == 1)
    assert exp.value("rlhf_phase_duration_seconds", project="p2", phase="\ufffd") == 1.0
    assert errors(exp, "label_not_utf8") == 2  # the directory once, the key once
    jobs = exp.get("/api/v1/jobs").json()["jobs"]
    assert {j["project"] for j in jobs} == {"ok", "proj\ufffd", "p2"}
    healthy(exp)


def test_numbers_too_big_for_a_float_are_dropped_and_counted(exp):
    huge = "1" + "0" * 400
    (exp.verl_root / "big").mkdir()
    (exp.verl_root / "big" / "step.jsonl").write_text(f'{{"step":{huge},"data":{{}}}}\n')
    lines = [encode(r).decode() for r in records([(REGIMES["sync_bound"], 9)], seed=3)]
    lines[1] = lines[1].replace('"timing_s/gen":', f'"perf/huge":{huge},"timing_s/gen":', 1)
    lines[2] = lines[2].replace('"timing_s/gen":', '"perf/inf":1e400,"timing_s/gen":', 1)
    (exp.verl_root / "big" / "data.jsonl").write_text("".join(lines))
    exp.wait_for(lambda: exp.value("rlhf_steps_total", experiment="data") == 10)
    exp.wait_for(lambda: errors(exp, "bad_step") == 1)
    assert errors(exp, "bad_number") == 2
    # every valid record counted: 4 (ok) + 10 (data); the huge step is not a record
    assert exp.value("rlhf_exporter_records_total", collector="verl") == 14
    healthy(exp)


def test_unknown_timer_and_mfu_floods_are_capped_and_counted(exp):
    data = {f"timing_s/flood{i}": 1.0 for i in range(30_000)}
    data.update({f"perf/mfu/x{i}": 0.5 for i in range(1000)})
    data["timing_s/step"] = 5.0
    (exp.verl_root / "flood").mkdir()
    (exp.verl_root / "flood" / "t.jsonl").write_text(json.dumps({"step": 1, "data": data}) + "\n")
    exp.wait_for(lambda: exp.value("rlhf_steps_total", project="flood") == 1)
    assert len(exp.series("rlhf_phase_duration_seconds", project="flood")) == 32
    assert errors(exp, "too_many_timers") == 30_000 - 32
    assert errors(exp, "unknown_mfu_stage") == 1000
    assert exp.series("rlhf_mfu_ratio", project="flood") == {}
    healthy(exp)


def test_pushing_the_same_step_again_keeps_its_keys_bounded(exp):
    job = {"project": "pushed", "experiment": "same-step"}
    for i in range(20):
        data = {f"actor/extra{i}_{k}": 1.0 for k in range(500)}
        data["timing_s/step"] = 3.0
        r = exp.push({**job, "step": 1, "data": data}, token=TOKEN)
        assert r.status_code == 200, r.text
    # 1024 keys kept of the 20 * 500 + 1 distinct ones sent: the rest dropped and counted
    assert errors(exp, "too_many_keys", "push") == 20 * 500 + 1 - 1024
    assert exp.value("rlhf_steps_total", **job) == 1
    healthy(exp)


def test_push_caps_jobs_per_client(tmp_path):
    with Exporter(
        tmp_path, "--push-max-jobs-per-client", "3", env={"RLHF_EXPORTER_PUSH_TOKEN": TOKEN}
    ) as e:
        plan = [{"step": 1, "data": {"timing_s/step": 1.0}}]
        codes = [
            e.push({"project": "junk", "experiment": f"j{i}", "records": plan}, token=TOKEN)
            for i in range(5)
        ]
        assert [c.status_code for c in codes] == [200, 200, 200, 429, 429]
        assert errors(e, "too_many_jobs_per_client", "push") == 2
        # an existing job of that client still takes records
        again = e.push({"project": "junk", "experiment": "j0", "records": plan}, token=TOKEN)
        assert again.status_code == 200


def test_push_without_token_on_a_non_loopback_address_is_refused(tmp_path):
    out = subprocess.run(
        exporter_cmd("serve", "--listen", "0.0.0.0:1", "--no-ray", "--no-nvml"),
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXPORTER_")},
    )
    assert out.returncode == 2, out.stderr
    assert "--push-allow-anonymous" in out.stderr


def _slow_connections(exp: Exporter, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        socks.append(s)
    return socks


def test_connections_are_capped_and_slow_ones_closed(tmp_path):
    with Exporter(tmp_path, "--http-max-connections", "8", "--http-read-timeout", "1") as e:
        base = threads(e)
        socks = _slow_connections(e, 200)
        time.sleep(0.3)
        assert threads(e) <= base + 8 + 1
        # beyond the cap: 503 at once
        s = socket.create_connection(("127.0.0.1", e.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 503")
        s.close()
        # the slow ones are closed by the read deadline; then scrapes are served again
        e.wait_for(lambda: e.get("/metrics").status_code == 200, timeout=10)
        for s in socks:
            s.close()
        # a body shorter than its Content-Length holds a connection for the deadline only
        s = socket.create_connection(("127.0.0.1", e.port), timeout=10)
        s.sendall(b"POST /api/v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        t0 = time.monotonic()
        s.settimeout(10)
        while s.recv(4096):
            pass
        assert time.monotonic() - t0 < 4
        s.close()


def test_aborted_connections_are_logged_once_in_json(tmp_path):
    with Exporter(tmp_path, "--log-format", "json") as e:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", e.port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHo")
            s.close()  # RST
        assert e.get("/metrics").status_code == 200
        time.sleep(0.5)
        lines = [x for x in e.output().splitlines() if x.strip()]
        objs = [json.loads(x) for x in lines]  # every line is JSON: no raw traceback
        aborted = [o for o in objs if o["msg"].startswith("HTTP connection from")]
        assert 1 <= len(aborted) <= 2  # once per kind (ConnectionResetError, maybe BrokenPipe)
        assert all(o["level"] == "warning" and "reason" in o for o in aborted), aborted


def test_sighup_is_logged_and_ignored(exp):
    exp.popen.send_signal(signal.SIGHUP)
    exp.wait_for(lambda: "SIGHUP" in exp.output())
    time.sleep(0.3)
    assert exp.alive()
    healthy(exp)


def test_a_rewrite_that_keeps_the_first_line_and_grew_is_a_new_run(exp):
    path = exp.verl_root / "ok" / "job.jsonl"
    old = path.read_bytes()
    first = old.split(b"\n", 1)[0] + b"\n"
    newer = [encode(r) for r in records([(REGIMES["rollout_long_tail"], 6)], seed=9)]
    new = first + b"".join(newer[1:])
    assert len(new) > len(old)
    with open(path, "r+b") as f:  # same inode, same first line, longer: one write
        f.write(new)
    exp.wait_for(lambda: exp.value("rlhf_run", project="ok", experiment="job") == 1)
    exp.wait_for(lambda: exp.value("rlhf_exporter_records_total", collector="verl") == 4 + 1 + 6)


def test_a_restart_keeps_the_last_step_time_of_a_stalled_job(tmp_path):
    root = tmp_path / "verl"
    (root / "p").mkdir(parents=True)
    path = root / "p" / "e.jsonl"
    path.write_bytes(good_lines(3))
    stalled = time.time() - 7200
    os.utime(path, (stalled, stalled))
    with Exporter(tmp_path) as e:
        e.wait_for(lambda: e.value("rlhf_steps_total", project="p") == 3)
        assert abs(e.value("rlhf_last_step_timestamp_seconds", project="p") - stalled) < 1
