"""Issue 23's GPU health rules with promtool: a firing and a quiet case for each alert
(lost GPU, uncorrectable ECC, failed row remap, bad XID, reset pending, throttled in a
window), the throttled-share record summed across a job's nodes, and the Alertmanager
inhibition of a job's stall page by its lost GPU (amtool/alertmanager: tests/test_rules.py
checks the file's syntax; here the rule itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlhf_exporter.diagnosis.xid import APPLICATION, BAD_GPU, DEGRADED, LOST
from rlhf_exporter.render import rules
from rlhf_exporter.render.rules import gpuhealth
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.promtool import run_rule_tests, without_annotations

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parent.parent
JOB = {"job": "rlhf-exporter", "project": "p", "experiment": "e"}
WORKER = {**JOB, "instance": "w1:9", "pod": "w1"}
GPU = {**WORKER, "gpu": "3", "uuid": "GPU-3", "gpu_role": "trainer"}
ALERTS = [a.__name__ for a in gpuhealth.ALERTS]


def series(metric: str, values: str, labels: dict, **extra: str) -> dict:
    lab = {**labels, **extra}
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in lab.items()) + "}",
        "values": values,
    }


def firing(name: str, severity: str, labels: dict) -> dict:
    return {"exp_labels": {"severity": severity, "category": "gpu", **labels}}


def case(series_: list, at: str, name: str, *expected: dict) -> dict:
    return {
        "interval": "1m",
        "input_series": series_,
        "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": list(expected)}],
    }


def run(tmp_path: Path, tests: list) -> None:
    groups = rules.rule_groups(load_thresholds())[gpuhealth.GPU_HEALTH_FILE]
    files = without_annotations(tmp_path, {gpuhealth.GPU_HEALTH_FILE: groups})
    run_rule_tests(tmp_path, files, tests)


def test_lost_gpu(tmp_path):
    lost = series("rlhf_gpu_errors_total", "_x10 1+60x30", GPU, reason="gpu_is_lost")
    other = series("rlhf_gpu_errors_total", "0+60x40", GPU, reason="timeout")
    run(
        tmp_path,
        [
            case(
                [lost],
                "20m",
                "RLHFGPULost",
                firing("RLHFGPULost", "critical", {**GPU, "reason": "gpu_is_lost"}),
            ),
            case([lost], "5m", "RLHFGPULost"),  # not yet lost
            case([other], "20m", "RLHFGPULost"),  # another NVML error is not a lost GPU
            # lost once and back: active for gpu_health_window, then quiet
            case(
                [series("rlhf_gpu_errors_total", "0x10 3x200", GPU, reason="gpu_is_lost")],
                "20m",
                "RLHFGPULost",
                firing("RLHFGPULost", "critical", {**GPU, "reason": "gpu_is_lost"}),
            ),
            case(
                [series("rlhf_gpu_errors_total", "0x10 3x200", GPU, reason="gpu_is_lost")],
                "100m",
                "RLHFGPULost",
            ),
        ],
    )


def test_uncorrectable_ecc(tmp_path):
    def ecc(error: str, values: str) -> dict:
        return series("rlhf_gpu_ecc_errors_total", values, GPU, error=error, scope="volatile")

    want = {**GPU, "error": "uncorrected", "scope": "volatile"}
    run(
        tmp_path,
        [
            case(
                [ecc("uncorrected", "0x10 1x30")],
                "15m",
                "RLHFGPUUncorrectableECC",
                firing("RLHFGPUUncorrectableECC", "critical", want),
            ),
            case(
                [ecc("corrected", "0+5x40"), ecc("uncorrected", "0x40")],
                "30m",
                "RLHFGPUUncorrectableECC",
            ),
            # a driver reload resets the volatile counter: not an error
            case([ecc("uncorrected", "4x10 0x30")], "20m", "RLHFGPUUncorrectableECC"),
        ],
    )


def test_row_remap_failed(tmp_path):
    run(
        tmp_path,
        [
            case(
                [series("rlhf_gpu_row_remap_failed", "0x5 1x10", GPU)],
                "10m",
                "RLHFGPURowRemapFailed",
                firing("RLHFGPURowRemapFailed", "critical", GPU),
            ),
            case(
                [series("rlhf_gpu_row_remap_failed", "0x15", GPU)], "10m", "RLHFGPURowRemapFailed"
            ),
        ],
    )


@pytest.mark.parametrize("xid", sorted(BAD_GPU))
def test_bad_xid_pages(tmp_path, xid):
    s = series("rlhf_gpu_xid_errors_total", "0x10 1x20", GPU, xid=str(xid))
    run(
        tmp_path,
        [
            case(
                [s],
                "15m",
                "RLHFGPUBadXid",
                firing("RLHFGPUBadXid", "critical", {**GPU, "xid": str(xid)}),
            )
        ],
    )


def test_application_lost_and_other_xids_never_page_as_bad_xid(tmp_path):
    quiet = [
        series("rlhf_gpu_xid_errors_total", "0+3x30", GPU, xid=x)
        for x in [str(c) for c in sorted(APPLICATION | DEGRADED | LOST)] + ["other"]
    ]
    run(tmp_path, [case(quiet, "20m", "RLHFGPUBadXid")])


def test_needs_reset(tmp_path):
    want = firing("RLHFGPUNeedsReset", "warning", GPU)
    run(
        tmp_path,
        [
            case(
                [series("rlhf_gpu_row_remap_pending", "0x5 1x10", GPU)],
                "10m",
                "RLHFGPUNeedsReset",
                want,
            ),
            case(
                [series("rlhf_gpu_retired_pages_pending", "1x10", GPU)],
                "5m",
                "RLHFGPUNeedsReset",
                want,
            ),
            case(
                [series("rlhf_gpu_xid_errors_total", "0x5 1x10", GPU, xid="63")],
                "10m",
                "RLHFGPUNeedsReset",
                want,
            ),
            case(
                [
                    series("rlhf_gpu_row_remap_pending", "0x15", GPU),
                    series("rlhf_gpu_retired_pages_pending", "0x15", GPU),
                    series("rlhf_gpu_xid_errors_total", "0+1x15", GPU, xid="13"),
                ],
                "10m",
                "RLHFGPUNeedsReset",
            ),
        ],
    )


def _windows(throttled_update: float, throttled_rollout: float) -> list[dict]:
    """Two worker nodes, 4 trainer GPUs each: 40 GPU-s of `update` and 80 of `rollout` a
    minute per node; the first node throttled the given shares, the second never."""
    out = []
    for node, factor in (("w1", 1.0), ("w2", 0.0)):
        labels = {**JOB, "instance": f"{node}:9", "pod": node, "gpu_role": "trainer"}
        for group, total, share in (
            ("update", 40, throttled_update),
            ("rollout", 80, throttled_rollout),
        ):
            out.append(series(gpuhealth.TOTAL, f"0+{total}x90", labels, group=group))
            out.append(
                series(gpuhealth.THROTTLED, f"0+{total * share * factor:g}x90", labels, group=group)
            )
    return out


def test_throttled_in_window_names_the_window(tmp_path):
    ctx = rules.Context(load_thresholds())
    # node 1 throttled 60 % of its update windows, node 2 never: the job's share is 30 %
    hot = _windows(0.6, 0.0)
    want = firing(
        "RLHFGPUThrottledInWindow", "warning", {**JOB, "group": "update", "gpu_role": "trainer"}
    )
    record = {
        "expr": f'{gpuhealth.throttled(ctx)}{{group="update"}}',
        "eval_time": "60m",
        "exp_samples": [
            {
                "labels": gpuhealth.throttled(ctx)
                + '{experiment="e",gpu_role="trainer",group="update",job="rlhf-exporter",project="p"}',
                "value": 0.3,
            }
        ],
    }
    run(
        tmp_path,
        [
            {**case(hot, "60m", "RLHFGPUThrottledInWindow", want), "promql_expr_test": [record]},
            case(hot, "12m", "RLHFGPUThrottledInWindow"),  # not for gpu_throttle_for yet
            case(_windows(0.3, 0.0), "60m", "RLHFGPUThrottledInWindow"),  # 15 %: below 0.2
        ],
    )
    # throttling outside the rollout and update windows (here: `rollout` only counts when
    # the group is rollout or update; a `reward` window's throttling never fires)
    labels = {**JOB, "instance": "w1:9", "pod": "w1", "gpu_role": "trainer"}
    reward = [
        series(gpuhealth.TOTAL, "0+40x90", labels, group="reward"),
        series(gpuhealth.THROTTLED, "0+40x90", labels, group="reward"),
    ]
    run(tmp_path, [case(reward, "60m", "RLHFGPUThrottledInWindow")])


def test_every_health_alert_has_a_case_here():
    text = Path(__file__).read_text()
    for a in gpuhealth.alerts(rules.Context(load_thresholds())):
        assert text.count(f'"{a.name}"') >= 2, a.name  # a firing and a quiet case at least


def test_alertmanager_inhibits_a_jobs_stall_page_while_its_gpu_is_lost():
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.example.yaml").read_text())
    (rule,) = [
        r for r in config["inhibit_rules"] if 'alertname="RLHFGPULost"' in r["source_matchers"]
    ]
    assert rule["target_matchers"] == ['alertname="RLHFJobStalled"']
    assert set(rule["equal"]) == {"cluster", "namespace", "project", "experiment"}


def test_gpus_with_errors_counts_each_sick_gpu_wherever_its_error_falls(tmp_path):
    """The fleet table's "GPUs with errors" reads a per-GPU record over its range, not every
    GPU's counters (issue 37). The record runs every `alerts.gpu_interval` (promtool runs it
    every 1m, that interval) over four of them. Scrapes every 25 s fall out of step with the
    rounds (a record over one round would lose a jump between two: here it did): an XID
    between any two scrapes is counted (one job per position of the jump over 3 minutes), a
    row remap that failed for two scrapes too, an error before the range and a healthy GPU
    not; healthy GPUs read 0."""
    th = load_thresholds()
    ctx = rules.Context(th)
    assert ctx.dur("gpu_interval") == "1m"  # the promtool interval below
    from rlhf_exporter.render.dashboards.context import DashboardContext
    from rlhf_exporter.render.dashboards.gpuhealth import gpus_with_errors_query
    from tests.support import grafana_vars

    def gpu(job: str, g: int) -> dict:
        lab = {**JOB, "project": job, "instance": "w1:9", "pod": "w1"}
        return {**lab, "gpu": str(g), "uuid": f"GPU-{job}-{g}", "gpu_role": "trainer"}

    def jump(at: int, n: int = 80) -> str:  # 0 until scrape `at`, then 1 (25 s scrapes)
        return f"0x{at - 1} 1x{n - at}" if at > 0 else f"1x{n - 1}"

    inputs, want = [], {}
    for k in range(8):  # the jump at scrape 48 + k (20m + 25k s)
        g = gpu(f"j{k}", 0)
        inputs += [series("rlhf_gpu_xid_errors_total", jump(48 + k), g, xid="48"),
                   series("rlhf_gpu_xid_errors_total", "0x79", g, xid="63"),
                   series("rlhf_gpu_info", "1x79", gpu(f"j{k}", 0)),
                   series("rlhf_gpu_info", "1x79", gpu(f"j{k}", 1))]  # fmt: skip
        want[f"j{k}"] = 1
    sick = [gpu("sick", g) for g in range(4)]
    inputs += [
        series("rlhf_gpu_errors_total", jump(56), sick[0], reason="gpu_is_lost"),
        series("rlhf_gpu_row_remap_failed", "0x59 1x1 0x17", sick[1]),  # two scrapes of it
        series("rlhf_gpu_ecc_errors_total", jump(64), sick[2], error="uncorrected", scope="volatile"),
        series("rlhf_gpu_ecc_errors_total", "0+1x79", sick[3], error="corrected", scope="volatile"),
        series("rlhf_gpu_xid_errors_total", jump(10), sick[3], xid="48"),  # before the range
        series("rlhf_gpu_xid_errors_total", "0+1x79", sick[3], xid="13"),  # an application's
    ]  # fmt: skip
    inputs += [series("rlhf_gpu_info", "1x79", g) for g in sick]
    want["sick"] = 3
    inputs += [series("rlhf_gpu_info", "1x79", gpu("healthy", g)) for g in range(2)]
    want["healthy"] = 0
    query = grafana_vars.substitute(gpus_with_errors_query(DashboardContext.of(th)), range_="10m")
    check = {
        "expr": query,
        "eval_time": "29m",  # the range (19m, 29m]: every jump but the one at 250 s
        "exp_samples": [
            {"labels": f'{{project="{p}", experiment="e"}}', "value": n} for p, n in want.items()
        ],
    }
    groups = rules.rule_groups(th)[gpuhealth.GPU_HEALTH_FILE]
    files = without_annotations(tmp_path, {gpuhealth.GPU_HEALTH_FILE: groups})
    run_rule_tests(
        tmp_path, files, [{"interval": "25s", "input_series": inputs, "promql_expr_test": [check]}]
    )
