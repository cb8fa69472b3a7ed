"""GPU health: a lost GPU, uncorrectable memory errors, bad XIDs, throttling.

Their own file, `alerts/gpu-health.rules.yaml`: a recording group (the throttled share of a
job's step windows, summed across its nodes) and an alerting group, one function per alert
with its runbook beside it. Every GPU series carries the job its node serves (`project`,
`experiment`: rlhf_exporter/sources/nvml.py), so the alerts name the job, and
alerts/alertmanager.example.yaml inhibits a job's stall page while one of its GPUs is lost.
Which XID codes page and which are ignorable: rlhf_exporter/diagnosis/xid.py and
docs/dcgm-exporter.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...diagnosis.xid import BAD_GPU, DEGRADED, regex
from .model import (
    NODES,
    Alert,
    Context,
    _num,
    alert_prose,
    duration,
    fragment,
    runbook,
    shared_prose,
)

GPU_HEALTH_FILE = "alerts/gpu-health.rules.yaml"
THROTTLED = "rlhf_window_gpu_throttled_seconds_total"
TOTAL = "rlhf_window_gpu_seconds_total"
DRAIN = " ".join(shared_prose("Drain a bad GPU"))
GPU = {"gpu": fragment("shared", "a GPU"), "serving": fragment("shared", "serving a job")}
"""Which GPU an alert names, and the job it serves, as every GPU health alert's text says it."""


def words(codes: frozenset[int]) -> str:
    """{94, 63, 92} -> '63, 92 or 94'."""
    *most, last = (str(c) for c in sorted(codes))
    return f"{', '.join(most)} or {last}" if most else last


def throttled(ctx: Context) -> str:
    return f"project_experiment_group_gpu_role:rlhf_window_gpu_throttled:ratio_rate{ctx.window}"


# The error counters that page (a lost GPU, a bad-GPU XID, uncorrectable ECC), and the labels
# that say which error: the fleet's "GPUs with errors" reads one record per GPU of them.
LOST_GPU = 'rlhf_gpu_errors_total{reason="gpu_is_lost"}'
BAD_XID = f'rlhf_gpu_xid_errors_total{{xid=~"{regex(BAD_GPU)}"}}'
UNCORRECTED_ECC = 'rlhf_gpu_ecc_errors_total{error="uncorrected", scope="volatile"}'
ERRORS = (LOST_GPU, BAD_XID, UNCORRECTED_ECC)
WHICH_ERROR = "reason, xid, error, scope"


def with_errors_window(ctx: Context) -> str:
    """Four rounds of the group: consecutive rounds overlap by three, so two scrapes up to
    three rounds apart always fall in one window (an error is never between two)."""
    return duration(4 * ctx.secs("gpu_interval"))


def with_errors(ctx: Context) -> str:
    return f"instance_uuid:rlhf_gpu_with_errors:max_increase{with_errors_window(ctx)}"


def records(ctx: Context) -> list[dict[str, str]]:
    w = ctx.window
    e = with_errors_window(ctx)
    grew = "\n  or ".join(f"increase({c}[{e}]) > 0" for c in ERRORS)
    return [
        {  # the throttled share of the job's GPU-seconds in each window group, every node
            "record": throttled(ctx),
            "expr": (
                f"sum without ({NODES}) (increase({THROTTLED}[{w}]))\n"
                f"/ (sum without ({NODES}) (increase({TOTAL}[{w}])) > 0)"
            ),
        },
        {  # one series per GPU with errors now, none for a healthy one (the fleet table
            # reads these over its range, not every GPU's counters)
            "record": with_errors(ctx),
            "expr": (
                f"max without ({WHICH_ERROR}) (\n  {grew}\n  or rlhf_gpu_row_remap_failed == 1\n)"
            ),
        },
    ]


def _lost(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
    text = alert_prose("RLHFGPULost", {**GPU, "window": w})
    return Alert(
        name="RLHFGPULost",
        expr=f"increase({LOST_GPU}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPULost",
            [
                'increase(rlhf_gpu_errors_total{reason="gpu_is_lost", project="P", experiment="E"}[1h])',
                'increase(rlhf_gpu_xid_errors_total{project="P", experiment="E"}[1h])',
            ],
            {"drain": DRAIN},
        ),
    )


def _uncorrectable_ecc(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
    text = alert_prose("RLHFGPUUncorrectableECC", {**GPU, "window": w})
    return Alert(
        name="RLHFGPUUncorrectableECC",
        expr=f"increase({UNCORRECTED_ECC}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPUUncorrectableECC",
            [
                'rlhf_gpu_ecc_errors_total{error="uncorrected", project="P", experiment="E"}',
                'rlhf_gpu_row_remap_pending{project="P", experiment="E"}',
            ],
            {"drain": DRAIN},
        ),
    )


def _row_remap_failed(ctx: Context) -> Alert:
    text = alert_prose("RLHFGPURowRemapFailed", GPU)
    return Alert(
        name="RLHFGPURowRemapFailed",
        expr="rlhf_gpu_row_remap_failed == 1",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPURowRemapFailed",
            ['rlhf_gpu_remapped_rows{project="P", experiment="E"}'],
            {"drain": DRAIN},
        ),
    )


def _bad_xid(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
    text = alert_prose("RLHFGPUBadXid", {**GPU, "window": w})
    return Alert(
        name="RLHFGPUBadXid",
        expr=f"increase({BAD_XID}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPUBadXid",
            ['increase(rlhf_gpu_xid_errors_total{project="P", experiment="E"}[1h])'],
            {"drain": DRAIN, "codes": ", ".join(str(c) for c in sorted(BAD_GPU))},
        ),
    )


def _degraded(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
    text = alert_prose("RLHFGPUNeedsReset", {**GPU, "window": w, "degraded_codes": words(DEGRADED)})
    return Alert(
        name="RLHFGPUNeedsReset",
        expr=(
            "rlhf_gpu_row_remap_pending == 1\n"
            "or rlhf_gpu_retired_pages_pending == 1\n"
            f'or sum without (xid) (increase(rlhf_gpu_xid_errors_total{{xid=~"{regex(DEGRADED)}"}}[{w}]) > 0)'
        ),
        for_="0s",
        severity="warning",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPUNeedsReset",
            [
                'rlhf_gpu_row_remap_pending{project="P", experiment="E"}',
                'rlhf_gpu_ecc_errors_total{project="P", experiment="E"}',
            ],
        ),
    )


def _throttled(ctx: Context) -> Alert:
    ratio = float(ctx.a["gpu_throttle_ratio"])
    text = alert_prose("RLHFGPUThrottledInWindow", {"window": ctx.window, "threshold": _num(ratio)})
    return Alert(
        name="RLHFGPUThrottledInWindow",
        expr=f'{throttled(ctx)}{{group=~"rollout|update"}} >= {_num(ratio)}',
        for_=ctx.dur("gpu_throttle_for"),
        severity="warning",
        category="gpu",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFGPUThrottledInWindow",
            [
                f'{throttled(ctx)}{{project="P", experiment="E"}}',
                'rate(rlhf_gpu_throttle_seconds_total{project="P", experiment="E"}[30m])',
                'rlhf_gpu_temperature_celsius{project="P", experiment="E"}',
            ],
        ),
    )


ALERTS: tuple[Callable[[Context], Alert], ...] = (
    _lost,
    _uncorrectable_ecc,
    _row_remap_failed,
    _bad_xid,
    _degraded,
    _throttled,
)


def alerts(ctx: Context) -> list[Alert]:
    return [make(ctx) for make in ALERTS]


def groups(ctx: Context) -> list[dict[str, Any]]:
    base = ctx.a["runbook_url"]
    every = ctx.dur("gpu_interval")  # every GPU's counters over [1h]: not every 15 s
    return [
        {"name": "rlhf-exporter.gpu-health.recording", "interval": every, "rules": records(ctx)},
        {
            "name": "rlhf-exporter.gpu-health",
            "interval": every,
            "rules": [a.rule(base) for a in alerts(ctx)],
        },
    ]
