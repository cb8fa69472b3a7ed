"""The fleet's recorded verdict code and hot verdict: the dashboards' numbers, checked by promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from rlhf_exporter.render.dashboards.style import verdict_codes
from rlhf_exporter.render.rules.recording import (
    VERDICT_CODE,
    VERDICT_CODES,
    VERDICT_HOT,
    verdict_code_expr,
)


def test_the_recorded_codes_are_the_dashboards_value_mappings():
    assert verdict_codes() == VERDICT_CODES


def test_promtool_records_the_hot_verdicts_code_per_job(tmp_path):
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    rules = {
        "groups": [
            {"name": "code", "rules": [{"record": VERDICT_CODE, "expr": verdict_code_expr()}]}
        ]
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    hot = {"a": "update", "b": "rollout"}
    series = []
    for exp, verdict in hot.items():
        for v in VERDICT_CODES:
            value = 1 if v == verdict else 0
            series.append(
                {
                    "series": f'rlhf_bottleneck{{project="p",experiment="{exp}",instance="x",verdict="{v}"}}',
                    "values": f"{value}x3",
                }
            )
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": VERDICT_CODE,
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": f'{VERDICT_CODE}{{project="p",experiment="{exp}",instance="x"}}',
                                "value": VERDICT_CODES[verdict],
                            }
                            for exp, verdict in hot.items()
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    out = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_records_one_hot_verdict_per_job_as_the_verdict_changes(tmp_path):
    """The fleet's jobs per verdict counts the hot record: one series per job at any time,
    the verdict it left gone at once (a rule's staleness marker), never counted twice."""
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    rules = {
        "groups": [
            {"name": "hot", "rules": [{"record": VERDICT_HOT, "expr": "rlhf_bottleneck == 1"}]}
        ]
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    # job a: update for 4 minutes, then rollout; job b: rollout throughout; job c: no verdict
    hot = {"a": ["update"] * 4 + ["rollout"] * 4, "b": ["rollout"] * 8, "c": [None] * 8}
    series = [
        {
            "series": f'rlhf_bottleneck{{project="p",experiment="{exp}",instance="x",verdict="{v}"}}',
            "values": " ".join("1" if h == v else "0" for h in hots),
        }
        for exp, hots in hot.items()
        for v in VERDICT_CODES
    ]
    count = f"count by (verdict) ({VERDICT_HOT})"
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": count,
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": '{verdict="update"}', "value": 1},
                            {"labels": '{verdict="rollout"}', "value": 1},
                        ],
                    },
                    {
                        "expr": count,
                        "eval_time": "5m",
                        "exp_samples": [{"labels": '{verdict="rollout"}', "value": 2}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    out = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
