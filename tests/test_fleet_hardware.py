"""The dashboard bench's GPU, engine and job-state history (tests/support/fleet_hardware.py,
issue 37) is the real exporter's series: catalog names and label sets, every such series a
dashboard or rule reads, one job state at a time, and valid OpenMetrics for promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict

import pytest

from rlhf_exporter.metrics.catalog import BY_NAME
from tests.support import fleet_hardware
from tests.support.fleet_history import dashboard_metrics
from tests.support.simday import rule_metrics

START, END = 1_796_068_800, 1_796_068_800 + 24 * 3600
TARGET = {"job", "instance"}  # what Prometheus adds


def _series(jobs: int = 40, detailed: int = 10) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = defaultdict(list)
    for plan in fleet_hardware.plans(jobs, START, END):
        for name, labels, _ in fleet_hardware.series(
            plan, START, plan.index < detailed, fleet_hardware.GPU_EVERY
        ):
            out[name].append(labels)
    return out


def test_every_series_is_the_catalogs_with_its_labels():
    for name, label_sets in _series().items():
        assert name in BY_NAME, name
        want = set(BY_NAME[name].labels) | TARGET
        for labels in label_sets:
            assert set(labels) == want, (name, sorted(labels))
    xids = {
        lab["xid"]
        for lab in _series()["rlhf_gpu_xid_errors_total"]
        if lab["experiment"] == "exp0000"
    }
    assert xids == {str(x) for x in fleet_hardware.ALERTED_XIDS}  # as the NVML source exports


def test_every_gpu_engine_and_state_series_a_dashboard_or_rule_reads_is_written():
    read = {
        n
        for n in dashboard_metrics() | rule_metrics()
        if n in BY_NAME and re.match(r"rlhf_(gpu_|engine_|window_gpu_|job_state)", n)
    }
    # the readings only pre-A100 GPUs have (this history's GPUs remap rows instead)
    pre_a100 = {"rlhf_gpu_retired_pages", "rlhf_gpu_retired_pages_pending"}
    # a GPU's NVML errors: none on a healthy fleet
    assert read - pre_a100 - {"rlhf_gpu_errors_total"} <= set(_series())


def test_one_state_at_a_time_and_some_jobs_change_state():
    plans = fleet_hardware.plans(1000, START, END)
    changing = [p for p in plans if p.transitions()]
    assert 100 <= len(changing) <= 150
    assert {s for p in changing for _, s in p.states} == set(fleet_hardware.STATES)
    for plan in changing[:20]:
        states = [s for s in fleet_hardware._state_series(plan)]
        for t in range(START, END, 900):
            assert sum(v(t) for name, _, v in states if name == "rlhf_job_state") == 1.0
        since = next(v for name, _, v in states if name == "rlhf_job_state_timestamp_seconds")
        assert since(END) == plan.states[-1][0]  # the last change's time


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
def test_promtool_reads_a_window_of_it(tmp_path):
    plans = fleet_hardware.plans(21, START, END)
    path = tmp_path / "w.om"
    n = fleet_hardware.write_openmetrics(path, plans, START, (START, START + 600))
    assert n > 0 and path.read_text().endswith("# EOF\n")
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
