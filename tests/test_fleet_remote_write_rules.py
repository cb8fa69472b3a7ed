"""The remote-write lag record and RLHFRemoteWriteBehind (alerts/remote-write.rules.yaml),
run by promtool: a Prometheus whose store stopped taking samples pages after the limit and
its `for:`, one that keeps up, catches up in time or has not sent yet does not; vmagent's
pending bytes over its send rate likewise; two clusters' senders with the same address stay
two alerts. The fleet dashboard draws the record with the alert's limit."""

from __future__ import annotations

import json

import pytest
import yaml

from rlhf_exporter.render import repo_root, rules
from rlhf_exporter.render.addresses import FLEET_PATH
from rlhf_exporter.render.rules import remotewrite
from tests.support.promtool import run_rule_tests, without_annotations

ADDRESS = "10.0.0.7:9090"
URL = "http://vm.example:8428/api/v1/write"
HIGHEST = "prometheus_remote_storage_highest_timestamp_in_seconds"
SENT = "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"


def prom(cluster: str) -> str:
    return f'cluster="{cluster}", job="prometheus", instance="{ADDRESS}"'


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


@pytest.fixture
def rule_files(tmp_path, thresholds):
    groups = rules.rule_groups(thresholds)
    return without_annotations(
        tmp_path, {remotewrite.REMOTE_WRITE_FILE: groups[remotewrite.REMOTE_WRITE_FILE]}
    )


def behind(cluster: str, url: str = URL) -> dict:
    return {
        "exp_labels": {
            "alertname": "RLHFRemoteWriteBehind",
            "severity": "warning",
            "category": "store",
            "cluster": cluster,
            "job": "prometheus",
            "instance": ADDRESS,
            "remote_name": "vm",
            "url": url,
        }
    }


def test_a_prometheus_whose_store_stopped_pages_after_its_limit_and_for(tmp_path, rule_files):
    """Cluster a's queue stops sending at minute 10 (the store down): its lag grows 60 s a
    minute, passes 120 s at minute 12 and pages 5 minutes later. Cluster b (the same address)
    keeps up 5 s behind: never. The store back at minute 20: a's queue catches up in one
    minute, and the alert resolves."""
    queue = 'remote_name="vm", url="' + URL + '"'
    run_rule_tests(
        tmp_path,
        rule_files,
        [
            {
                "interval": "1m",
                "input_series": [
                    series(HIGHEST, prom("a"), "600+60x40"),
                    series(SENT, f"{prom('a')}, {queue}", "595+60x10 1195x10 2395+60x20"),
                    series(HIGHEST, prom("b"), "600+60x40"),
                    series(SENT, f"{prom('b')}, {queue}", "595+60x40"),
                ],
                "promql_expr_test": [
                    {
                        "expr": remotewrite.LAG,
                        "eval_time": "15m",
                        "exp_samples": [
                            {"labels": f"{remotewrite.LAG}{{{prom(c)}, {queue}}}", "value": v}
                            for c, v in (("a", 305), ("b", 5))
                        ],
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "16m", "alertname": "RLHFRemoteWriteBehind", "exp_alerts": []},
                    {
                        "eval_time": "18m",
                        "alertname": "RLHFRemoteWriteBehind",
                        "exp_alerts": [behind("a")],
                    },
                    {"eval_time": "22m", "alertname": "RLHFRemoteWriteBehind", "exp_alerts": []},
                ],
            },
            {
                "interval": "1m",
                "input_series": [  # a queue that has sent nothing yet: no lag, no page
                    series(HIGHEST, prom("a"), "600+60x20"),
                    series(SENT, f"{prom('a')}, {queue}", "0x20"),
                ],
                "promql_expr_test": [
                    {"expr": remotewrite.LAG, "eval_time": "10m", "exp_samples": []}
                ],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "RLHFRemoteWriteBehind", "exp_alerts": []}
                ],
            },
        ],
    )


def test_a_vmagent_whose_store_stopped_pages_and_one_that_sends_does_not(tmp_path, rule_files):
    """vmagent: pending bytes over the bytes per second sent in the last 5 minutes. Cluster
    c sends 10 kB/s with 20 kB pending (2 s); cluster d's store stops at minute 10: its
    pending bytes grow and its send rate falls to 0, so its lag passes any limit. The
    record drops the buffer's `path`: one series per sender and store."""
    pending = "vmagent_remotewrite_pending_data_bytes"
    sent = "vmagent_remotewrite_bytes_sent_total"

    def agent(cluster: str) -> str:
        return f'cluster="{cluster}", job="vmagent", instance="{ADDRESS}", url="1:secret-url"'

    path = 'path="/buffer/persistent-queue/1_ABC"'
    run_rule_tests(
        tmp_path,
        rule_files,
        [
            {
                "interval": "1m",
                "input_series": [
                    series(pending, f"{agent('c')}, {path}", "20000x30"),
                    series(sent, agent("c"), "0+600000x30"),
                    series(pending, f"{agent('d')}, {path}", "20000x10 20000+600000x20"),
                    series(sent, agent("d"), "0+600000x10 6000000x20"),
                ],
                "promql_expr_test": [
                    {
                        "expr": remotewrite.LAG,
                        "eval_time": "8m",
                        "exp_samples": [
                            {"labels": f"{remotewrite.LAG}{{{agent(c)}}}", "value": 2}
                            for c in ("c", "d")
                        ],
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "RLHFRemoteWriteBehind", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "RLHFRemoteWriteBehind",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "RLHFRemoteWriteBehind",
                                    "severity": "warning",
                                    "category": "store",
                                    "cluster": "d",
                                    "job": "vmagent",
                                    "instance": ADDRESS,
                                    "url": "1:secret-url",
                                }
                            }
                        ],
                    },
                ],
            }
        ],
    )


def test_the_committed_rules_carry_severity_for_summary_and_runbook(thresholds):
    doc = yaml.safe_load((repo_root() / remotewrite.REMOTE_WRITE_FILE).read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert [a["alert"] for a in alerts] == ["RLHFRemoteWriteBehind"]
    (alert,) = alerts
    assert alert["labels"]["severity"] == "warning"
    assert alert["for"] == "5m"
    assert "behind" in alert["annotations"]["summary"]
    assert alert["annotations"]["runbook_url"].endswith("#rlhfremotewritebehind")
    runbooks = (repo_root() / "docs" / "runbooks.md").read_text()
    assert "## RLHFRemoteWriteBehind" in runbooks


def test_the_fleet_dashboard_draws_the_lag_with_the_alerts_limit():
    doc = json.loads((repo_root() / FLEET_PATH).read_text())
    panels = [q for p in doc["panels"] for q in (p, *p.get("panels", []))]
    (panel,) = [p for p in panels if p["title"] == "Remote-write lag per sender"]
    (target,) = panel["targets"]
    assert remotewrite.LAG in target["expr"]
    assert 'cluster=~"$cluster"' in target["expr"]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert remotewrite.LAG_LIMIT_S in [s["value"] for s in steps]
