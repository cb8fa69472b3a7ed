"""examples/kube-prometheus-stack/agent-values.yaml: the values a cluster of the fleet copies.

Parsed and checked against what the live outage test runs (tests/test_fleet_outage_live.py
builds cluster b's agent-mode Prometheus from this file's remoteWrite), and the translated
remote_write checked by `promtool check config`."""

from __future__ import annotations

import subprocess

import yaml

from tests.support.prometheus import binary
from tests.test_fleet_outage_live import EXAMPLE, OPERATOR_KEYS, example_remote_write


def values() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_the_example_runs_an_agent_that_remote_writes_with_its_cluster():
    prom = values()["prometheus"]
    spec = prom["prometheusSpec"]
    assert prom["agentMode"] is True
    assert spec["externalLabels"]["cluster"]  # every rule and dashboard keeps clusters apart by it
    assert spec["replicaExternalLabelNameClear"] is True  # an HA pair deduplicates in the store
    assert prom["serviceMonitor"]["selfMonitor"] is True  # RLHFRemoteWriteBehind's inputs
    (rw,) = spec["remoteWrite"]
    assert rw["url"].endswith("/api/v1/write")
    assert set(rw) | set(rw["queueConfig"]) <= set(OPERATOR_KEYS), rw


def test_the_live_test_runs_the_examples_remote_write(tmp_path):
    """Every setting of the example's remoteWrite reaches the Prometheus configuration the
    outage test starts (the URL replaced by the test's store), and promtool accepts it."""
    rw = example_remote_write("http://127.0.0.1:8428")
    example = values()["prometheus"]["prometheusSpec"]["remoteWrite"][0]["queueConfig"]
    assert {OPERATOR_KEYS[k]: v for k, v in example.items()} == rw["queue_config"]
    assert rw["url"] == "http://127.0.0.1:8428/api/v1/write"
    config = {
        "global": {"external_labels": values()["prometheus"]["prometheusSpec"]["externalLabels"]},
        "scrape_configs": [
            {"job_name": "rlhf-exporter", "static_configs": [{"targets": ["127.0.0.1:9400"]}]}
        ],
        "remote_write": [rw],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [binary("promtool"), "check", "config", "--agent", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
