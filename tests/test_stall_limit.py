"""The stall limit has one definition (rlhf_exporter/diagnosis/stall.py): the exporter's own
readers (the job view, the stacks collector of issue 39) and Prometheus' recording rule
`project_experiment:rlhf_job_stall_budget:ratio` agree on it, evaluated by promtool."""

from __future__ import annotations

import pytest

from rlhf_exporter.diagnosis.stall import StallLimit
from rlhf_exporter.render import rules
from tests.support.promtool import run_rule_tests, without_annotations

AGE = 1800.0  # seconds since each job's last step at the evaluation time
JOBS = {  # experiment -> (baseline step seconds or None, between-steps max or None)
    "base_under_min": (100.0, None),
    "base_over_min_with_validation": (400.0, 600.0),
    "no_baseline_yet": (None, None),
    "long_checkpoint": (250.0, 150.0),
}


def test_python_and_prometheus_agree_on_the_stall_budget(tmp_path, thresholds):
    limit = StallLimit.of(thresholds.alerts)
    groups = rules.rule_groups(thresholds)
    lifecycle = {
        rel: [g for g in gs if g["name"] == "rlhf-exporter.lifecycle"] for rel, gs in groups.items()
    }
    files = without_annotations(tmp_path, {k: v for k, v in lifecycle.items() if v})
    series, expected = [], []
    for exp, (base, between) in JOBS.items():
        labels = f'project="p", experiment="{exp}", job="rlhf", instance="x"'
        series.append({"series": f"rlhf_last_step_timestamp_seconds{{{labels}}}", "values": "0x40"})
        if base is not None:
            series.append({"series": f"rlhf_baseline_step_duration_seconds{{{labels}}}",
                           "values": f"{base}x40"})  # fmt: skip
        if between is not None:
            series.append({"series": f"rlhf_between_steps_max_seconds{{{labels}}}",
                           "values": f"{between}x40"})  # fmt: skip
        ratio = AGE / limit.seconds(base, between)
        expected.append({"labels": f"project_experiment:rlhf_job_stall_budget:ratio{{{labels}}}",
                         "value": ratio})  # fmt: skip
        stalled = limit.stalled_for(0.0, AGE, base, between)
        assert (stalled is not None) == (ratio > 1)
    run_rule_tests(tmp_path, files, [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{
            "expr": "project_experiment:rlhf_job_stall_budget:ratio",
            "eval_time": "30m",
            "exp_samples": expected,
        }],
    }])  # fmt: skip


@pytest.mark.parametrize(
    "base, between, want",
    [(None, None, 600.0), (100.0, None, 600.0), (400.0, 0.0, 1200.0), (400.0, 30.0, 1230.0),
     (float("nan"), None, 600.0)],
)  # fmt: skip
def test_limit(base, between, want):
    assert StallLimit(3.0, 600.0).seconds(base, between) == want
    assert StallLimit.of({"stall_factor": 3, "stall_min": "10m"}) == StallLimit(3.0, 600.0)
    assert StallLimit(3.0, 600.0).stalled_for(None, 1e9) is None  # never stepped: no stall
