"""`rlhf-exporter serve` as a process: settings, --help, logs, --demo, shutdown, readiness."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests
import yaml
from prometheus_client import generate_latest

from rlhf_exporter import options, settings
from rlhf_exporter.demo.simulator import REGIMES, encode, write_jsonl
from rlhf_exporter.metrics.families import families
from rlhf_exporter.server import Endpoints, make_server
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support.procs import exporter_cmd, free_port
from tests.support.serve import Exporter


def test_help_documents_every_setting():
    out = subprocess.run(
        exporter_cmd("serve", "--help"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0
    for option in options.OPTIONS:
        assert settings.flag(option) in out.stdout, option.name
        assert settings.env_name(option) in out.stdout, option.name
    for endpoint in (
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/records",
        "--config",
        str(options.DEFAULT_PORT),
    ):
        assert endpoint in out.stdout


def test_sigterm_stops_within_5_seconds(tmp_path):
    exp = Exporter(tmp_path, "--demo", "--demo-step-seconds", "0.05")
    try:
        exp.wait_for(lambda: (exp.value("rlhf_steps_total", project="demo") or 0) > 2)
        requests.get(exp.url + "/metrics", timeout=5)
        started = time.monotonic()
        os.kill(exp.popen.pid, signal.SIGTERM)
        rc = exp.popen.wait(5)
        assert time.monotonic() - started < 5
        assert rc == 0
        assert "shutting down" in exp.output() and "stopped" in exp.output()
        with pytest.raises(requests.ConnectionError):
            requests.get(exp.url + "/healthz", timeout=2)
    finally:
        exp.terminate()


def test_demo_shows_changing_diagnoses(tmp_path):
    with Exporter(tmp_path, "--demo", "--demo-step-seconds", "0.03") as exp:
        lab = {"project": "demo", "experiment": "grpo-simulated"}
        # one full pass of the plan, then the restart (truncation) starts run 1
        exp.wait_for(
            lambda: (exp.value("rlhf_run", **lab) or 0) >= 1,
            timeout=30,
            what="the demo's second run",
        )
        for verdict in ("rollout", "update", "sync"):
            assert exp.value("rlhf_bottleneck_steps_total", verdict=verdict, **lab) > 0, verdict
        assert (
            exp.value(
                "rlhf_bottleneck_reason_steps_total", verdict="rollout", reason="long_tail", **lab
            )
            > 0
        )
        assert (
            exp.value(
                "rlhf_bottleneck_reason_steps_total", verdict="update", reason="low_mfu", **lab
            )
            > 0
        )
        assert exp.value("rlhf_change_steps_total", kind="workload_shift", **lab) > 0
        assert exp.value("rlhf_change_steps_total", kind="regression", **lab) > 0
        assert "grpo-simulated" in exp.get("/").text
        assert "demo" in exp.output()


def test_config_file_env_and_flags(tmp_path):
    log = tmp_path / "p" / "job.jsonl"
    log.parent.mkdir()
    write_jsonl(log, [(REGIMES["sync_bound"], 3)])
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "verl_file": [str(log)],
                "project": "from-config",
                "experiment": "from-config",
                "verl_interval": 0.2,
            }
        )
    )
    # environment beats the file; a flag beats the environment
    env = {"RLHF_EXPORTER_EXPERIMENT": "from-env", "RLHF_EXPORTER_PROJECT": "from-env"}
    with Exporter(
        tmp_path,
        "--config",
        str(config),
        "--project",
        "from-flag",
        "--verl-root",
        str(tmp_path / "none"),
        env=env,
    ) as exp:
        exp.wait_for(
            lambda: exp.value("rlhf_steps_total", project="from-flag", experiment="from-env") == 4
        )


def test_bad_settings_exit_2_with_a_clear_message(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("verl_rot: /x\n")
    out = subprocess.run(
        exporter_cmd("serve", "--config", str(config)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "unknown setting 'verl_rot'" in out.stderr
    out = subprocess.run(
        exporter_cmd("serve", "--listen", "nowhere"), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "HOST:PORT" in out.stderr


def test_port_in_use_exits_1(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            exporter_cmd("serve", "--listen", f"127.0.0.1:{port}", "--no-ray", "--no-nvml"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1 and "cannot listen" in out.stderr


def test_json_logs(tmp_path):
    (tmp_path / "verl" / "p").mkdir(parents=True)
    (tmp_path / "verl" / "p" / "e.jsonl").write_bytes(b"garbage\n")
    with Exporter(tmp_path, "--log-format", "json") as exp:
        exp.wait_for(lambda: "invalid_json" in exp.output())
    lines = [json.loads(line) for line in exp.output().splitlines() if line.strip()]
    assert all({"ts", "level", "msg"} <= set(obj) for obj in lines)
    assert any(obj.get("reason") == "invalid_json" and obj.get("project") == "p" for obj in lines)


def test_readyz_waits_for_a_first_successful_collection(tmp_path, thresholds):
    """In process: a real verl source that has not polled yet, a real server."""
    (tmp_path / "p").mkdir()
    write_jsonl(tmp_path / "p" / "e.jsonl", [(REGIMES["balanced"], 2)])
    source = VerlFileSource(thresholds, [tmp_path])
    port = free_port()
    server = make_server(
        f"127.0.0.1:{port}", Endpoints([source.snapshot], [source.jobs], None, [source.snapshot])
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        assert requests.get(url + "/healthz", timeout=5).status_code == 200
        r = requests.get(url + "/readyz", timeout=5)
        assert r.status_code == 503 and "not ready" in r.text
        assert (
            'rlhf_exporter_collector_up{collector="verl"} 0.0'
            in requests.get(url + "/metrics", timeout=5).text
        )
        source.poll_once()
        assert requests.get(url + "/readyz", timeout=5).status_code == 200
        assert (
            requests.post(url + "/api/v1/records", data=b"{}", timeout=5).status_code == 404
        )  # no push
    finally:
        server.shutdown()
        server.server_close()


def test_cached_exposition_equals_a_full_render(tmp_path, thresholds):
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "e.jsonl"
    write_jsonl(path, [(REGIMES["rollout_long_tail"], 5)])
    source = VerlFileSource(thresholds, [tmp_path])
    endpoints = Endpoints([source.snapshot])

    class Full:
        def collect(self):
            return iter(families([source.snapshot()]))

    for step in range(3):
        source.poll_once()
        body, _, _ = endpoints.exposition.render()
        assert body == generate_latest(Full())
        source.poll_once()  # nothing new: health series change, job series are reused
        again, _, _ = endpoints.exposition.render()
        assert again == generate_latest(Full())
        with open(path, "ab") as f:
            f.write(encode({"step": 100 + step, "data": {"timing_s/step": 3.0}}))
    assert b'rlhf_step{experiment="e",project="p"} 101.0' in again


def test_verl_file_labels_default_to_its_path(tmp_path):
    log = tmp_path / "elsewhere" / "my-proj" / "my-exp.jsonl"
    log.parent.mkdir(parents=True)
    write_jsonl(log, [(REGIMES["sync_bound"], 2)])
    with Exporter(tmp_path, "--verl-file", str(log)) as exp:
        exp.wait_for(
            lambda: exp.value("rlhf_steps_total", project="my-proj", experiment="my-exp") == 3
        )
        assert exp.value("rlhf_exporter_jobs", collector="verl") == 1
