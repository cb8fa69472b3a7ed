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
from .model import JOB_NAME, NODES, Alert, Context, _num, duration, runbook, shared_prose

GPU_HEALTH_FILE = "alerts/gpu-health.rules.yaml"
THROTTLED = "rlhf_window_gpu_throttled_seconds_total"
TOTAL = "rlhf_window_gpu_seconds_total"
WHERE = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
SERVING = "serving " + JOB_NAME + " as {{ $labels.gpu_role }}"
DRAIN = " ".join(shared_prose("Drain a bad GPU"))


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
    return Alert(
        name="RLHFGPULost",
        expr=f"increase({LOST_GPU}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=f"{WHERE} is lost ({SERVING})",
        description=(
            f"NVML reports {WHERE} lost (NVMLError_GpuIsLost: it fell off the bus or stopped "
            f"answering) in the last {w}. {JOB_NAME} cannot make progress on it and will not "
            "recover by itself; its stall alert is inhibited while this one fires (the cause, "
            "not two pages)."
        ),
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
    return Alert(
        name="RLHFGPUUncorrectableECC",
        expr=f"increase({UNCORRECTED_ECC}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=f"{WHERE} had {{{{ $value }}}} uncorrectable ECC error(s) ({SERVING})",
        description=(
            f"{WHERE} reported uncorrectable (double-bit) ECC memory errors in the last {w}. "
            "The data in that memory is lost: the process that used it was killed or computes "
            f"on garbage, and {JOB_NAME} will not recover on this GPU without a reset."
        ),
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
    return Alert(
        name="RLHFGPURowRemapFailed",
        expr="rlhf_gpu_row_remap_failed == 1",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=f"{WHERE} failed to remap a memory row ({SERVING})",
        description=(
            f"{WHERE} could not remap a row with uncorrectable errors (no spare rows left): "
            f"the memory stays bad after a reset. {JOB_NAME} must move off this GPU; the GPU "
            "needs service."
        ),
        runbook=runbook(
            "RLHFGPURowRemapFailed",
            ['rlhf_gpu_remapped_rows{project="P", experiment="E"}'],
            {"drain": DRAIN},
        ),
    )


def _bad_xid(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
    return Alert(
        name="RLHFGPUBadXid",
        expr=f"increase({BAD_XID}[{w}]) > 0",
        for_="0s",
        severity="critical",
        category="gpu",
        summary=f"{WHERE} raised XID {{{{ $labels.xid }}}} ({SERVING})",
        description=(
            f"{WHERE} raised XID {{{{ $labels.xid }}}} in the last {w}: an XID that means a "
            f"bad GPU, memory or link (docs/dcgm-exporter.md). {JOB_NAME} will not recover on "
            "this GPU by itself."
        ),
        runbook=runbook(
            "RLHFGPUBadXid",
            ['increase(rlhf_gpu_xid_errors_total{project="P", experiment="E"}[1h])'],
            {"drain": DRAIN, "codes": ", ".join(str(c) for c in sorted(BAD_GPU))},
        ),
    )


def _degraded(ctx: Context) -> Alert:
    w = ctx.dur("gpu_health_window")
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
        summary=f"{WHERE} needs a reset at the next maintenance ({SERVING})",
        description=(
            f"{WHERE} has a row remap or page retirement waiting for a GPU reset, or raised "
            f"XID 63, 92 or 94 in the last {w}: it works, with degraded memory, until reset."
        ),
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
    return Alert(
        name="RLHFGPUThrottledInWindow",
        expr=f'{throttled(ctx)}{{group=~"rollout|update"}} >= {_num(ratio)}',
        for_=ctx.dur("gpu_throttle_for"),
        severity="warning",
        category="gpu",
        summary=(
            f"{JOB_NAME}: {{{{ $labels.gpu_role }}}} GPUs throttled {{{{ $value | humanizePercentage }}}} "
            "of the {{ $labels.group }} window"
        ),
        description=(
            f"The {{{{ $labels.gpu_role }}}} GPUs of {JOB_NAME} ran with their clocks held down "
            "by heat or hardware (thermal or hardware slowdown, power brake) for "
            f"{{{{ $value | humanizePercentage }}}} of their time in the job's "
            f"{{{{ $labels.group }}}} windows over the last {ctx.window} (threshold "
            f"{_num(ratio)}): that window runs slower than the GPUs can."
        ),
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
