"""Issue 17's rules with promtool: the idle GPU-seconds records (summed across a job's
nodes), the balance ratios, the GPU-move estimate, and RLHFTrainerStarved /
RLHFRolloutOverprovisioned firing and not firing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlhf_exporter.render import rules
from rlhf_exporter.render.rules import gpuwindows
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.promtool import run_rule_tests, without_annotations

REPO = Path(__file__).resolve().parent.parent
HEAD = {"job": "rlhf-exporter", "instance": "h:9", "project": "p", "experiment": "e"}
WORKER = {**HEAD, "instance": "w:9"}
JOB = {"job": "rlhf-exporter", "project": "p", "experiment": "e"}


def _series(metric: str, per_minute: float, labels: dict, **extra: str) -> dict:
    lab = {**labels, **extra}
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in lab.items()) + "}",
        "values": f"0+{per_minute:g}x90",
    }


def _job(side_gpus: dict[str, int], busy: dict[tuple[str, str], float], nodes: dict) -> list:
    """Window counters per minute: each side's GPUs spend 40 s of a minute in `rollout`
    windows and 20 s in `update` ones, busy the given share of it; `nodes[role]`: the
    sidecar (head or worker) whose NVML sees that side."""
    out = [_series("rlhf_step_seconds_total", 60, HEAD)]
    for role, n in side_gpus.items():
        for group, secs in (("rollout", 40), ("update", 20)):
            total = n * secs
            labels = {**nodes[role], "group": group, "gpu_role": role}
            out.append(_series(gpuwindows.TOTAL, total, labels))
            out.append(_series(gpuwindows.BUSY, total * busy[group, role], labels))
    return out


def _alert(name: str) -> dict:
    return {"exp_labels": {"severity": "info", "category": "bottleneck", **JOB}}


# 2 rollout GPUs (on the worker), 6 trainer GPUs (on the head): the trainer waits in `gen`
STARVED = _job(
    {"rollout": 2, "trainer": 6},
    {
        ("rollout", "rollout"): 0.875,  # shares exact in binary: exact expected values
        ("update", "rollout"): 0.875,  # fully-async: the rollout keeps generating
        ("rollout", "trainer"): 0.03125,
        ("update", "trainer"): 0.9375,
    },
    {"rollout": WORKER, "trainer": HEAD},
)
# 6 rollout GPUs, 2 trainer GPUs: the rollout is done early and idles while the trainer works
OVER = _job(
    {"rollout": 6, "trainer": 2},
    {
        ("rollout", "rollout"): 0.92,
        ("update", "rollout"): 0.03,
        ("rollout", "trainer"): 0.90,
        ("update", "trainer"): 0.95,
    },
    {"rollout": WORKER, "trainer": HEAD},
)
EVEN = _job(
    {"rollout": 4, "trainer": 4},
    {
        ("rollout", "rollout"): 0.9,
        ("update", "rollout"): 0.85,
        ("rollout", "trainer"): 0.85,
        ("update", "trainer"): 0.9,
    },
    {"rollout": HEAD, "trainer": HEAD},
)


def _case(series: list, at: str, firing: str | None, move: float | None) -> dict:
    th = load_thresholds()
    ctx = rules.Context(th)
    alerts = []
    for name in ("RLHFTrainerStarved", "RLHFRolloutOverprovisioned"):
        exp = [_alert(name)] if name == firing else []
        alerts.append({"eval_time": at, "alertname": name, "exp_alerts": exp})
    exprs = []
    if move is not None:
        exprs.append(
            {
                "expr": gpuwindows.move(ctx),
                "eval_time": at,
                "exp_samples": [{"labels": gpuwindows.move(ctx) + _labels(JOB), "value": move}],
            }
        )
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": alerts,
        "promql_expr_test": exprs,
    }


def _labels(lab: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}"


def _run(tmp_path: Path, tests: list) -> None:
    groups = rules.rule_groups(load_thresholds())[gpuwindows.GPU_WINDOWS_FILE]
    files = without_annotations(tmp_path, {gpuwindows.GPU_WINDOWS_FILE: groups})
    run_rule_tests(tmp_path, files, tests)


def test_promtool_firing_and_not_firing(tmp_path):
    # 8 GPUs; B_rollout = 2 x 60 x 0.875 = 105 and B_trainer = 6 x (40 x 0.03125 + 20 x
    # 0.9375) = 120 GPU-seconds a minute: 8 x 105 / 225 = 3.7 rollout GPUs, 2 now: move +2
    tests = [
        _case(STARVED, "10m", None, None),  # not yet for 15m
        _case(STARVED, "60m", "RLHFTrainerStarved", 2),
        # B_rollout = 6 x (40 x 0.92 + 20 x 0.03) = 224.4, B_trainer = 2 x (36 + 19) = 110:
        # 8 x 224.4 / 334.4 = 5.4 rollout GPUs, 6 now: move -1
        _case(OVER, "60m", "RLHFRolloutOverprovisioned", -1),
        _case(EVEN, "60m", None, 0),
    ]
    _run(tmp_path, tests)


def test_promtool_idle_records_sum_a_jobs_nodes_and_the_fleet(tmp_path):
    ctx = rules.Context(load_thresholds())
    at = "60m"
    # over 30m on the worker (rollout GPUs): rollout group 2 x 40 x 30 = 2400 GPU-seconds at
    # 87.5 % busy; the head's trainer GPUs in rollout windows: 6 x 40 x 30 at 3.125 % busy
    want_job = {
        ("rollout", "rollout"): 2 * 40 * 30 * 0.125,
        ("rollout", "trainer"): 6 * 40 * 30 * 0.96875,
    }
    exprs = [
        {
            "expr": f'{gpuwindows.job_idle(ctx)}{{group="rollout"}}',
            "eval_time": at,
            "exp_samples": [
                {
                    "labels": gpuwindows.job_idle(ctx)
                    + _labels({**JOB, "group": g, "gpu_role": r}),
                    "value": v,
                }
                for (g, r), v in want_job.items()
            ],
        },
        {
            "expr": f'{gpuwindows.fleet_idle(ctx)}{{group="rollout"}}',
            "eval_time": at,
            "exp_samples": [
                {
                    "labels": gpuwindows.fleet_idle(ctx) + _labels({"group": g, "gpu_role": r}),
                    "value": v,
                }
                for (g, r), v in want_job.items()
            ],
        },
        {  # idle = available - busy, per target
            "expr": (
                f'{gpuwindows.idle(ctx)}{{instance="w:9",group="update"}}'
                f' - on () (increase({gpuwindows.TOTAL}{{instance="w:9",group="update"}}[30m])'
                f' - on () increase({gpuwindows.BUSY}{{instance="w:9",group="update"}}[30m]))'
            ),
            "eval_time": at,
            "exp_samples": [{"labels": "{}", "value": 0}],
        },
    ]
    _run(tmp_path, [{"interval": "1m", "input_series": STARVED, "promql_expr_test": exprs}])


def test_committed_rule_file_lints_and_is_in_the_chart():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    path = REPO / gpuwindows.GPU_WINDOWS_FILE
    out = subprocess.run(
        [promtool, "check", "rules", "--lint=all", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    chart = REPO / "helm/rlhf-exporter/files/alerts" / path.name
    assert chart.read_text() == path.read_text()
    runbooks = (REPO / "docs/runbooks.md").read_text()
    for name in ("RLHFTrainerStarved", "RLHFRolloutOverprovisioned"):
        assert f"## {name}" in runbooks
        assert "rollout.n_gpus_per_node" in runbooks
