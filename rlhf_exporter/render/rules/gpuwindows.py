"""GPU time by step window: idle GPU-hours, and who waits on whom.

Their own file, `alerts/gpu-windows.rules.yaml`: a recording group (idle GPU-seconds per job,
window group and GPU role; summed across a job's nodes; fleet-wide; the two sides' idle
shares and the GPU-move estimate) and an alerting group, one function per alert with its
runbook beside it. The thresholds are the thresholds file's `balance:` section, the same
numbers `rlhf_exporter/diagnosis/balance.py` uses; the meaning and the estimate's assumptions are
in docs/gpu-windows.md.

Per-node results are summed with `without (instance, pod)`: a job's head and worker
sidecars are different scrape targets of one job, and every other label survives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .model import (
    JOB_MATCH,
    NODES,
    Alert,
    Context,
    _num,
    _tq,
    alert_prose,
    fragment,
    runbook,
    shared_prose,
)

GPU_WINDOWS_FILE = "alerts/gpu-windows.rules.yaml"
BUSY = "rlhf_window_gpu_busy_seconds_total"
TOTAL = "rlhf_window_gpu_seconds_total"


def _limits(ctx: Context) -> Any:
    return ctx.th.document["balance"]


# -- record names (they carry the window) ----------------------------------------------------
def idle(ctx: Context) -> str:
    return f"project_experiment_group_gpu_role:rlhf_window_gpu_idle_seconds:increase{ctx.window}"


def busy_ratio(ctx: Context) -> str:
    return f"project_experiment_group_gpu_role:rlhf_window_gpu_busy:ratio_rate{ctx.window}"


def job_idle(ctx: Context) -> str:
    return (
        f"project_experiment_group_gpu_role:rlhf_window_gpu_idle_seconds:sum_increase{ctx.window}"
    )


def fleet_idle(ctx: Context) -> str:
    return f"group_gpu_role:rlhf_window_gpu_idle_seconds:sum_increase{ctx.window}"


def sides(ctx: Context) -> str:
    return f"project_experiment_gpu_role:rlhf_window_gpu_seconds:sum_increase{ctx.window}"


def sides_busy(ctx: Context) -> str:
    return f"project_experiment_gpu_role:rlhf_window_gpu_busy_seconds:sum_increase{ctx.window}"


def starved(ctx: Context) -> str:
    return f"project_experiment:rlhf_trainer_starved_idle:ratio_rate{ctx.window}"


def overprovisioned(ctx: Context) -> str:
    return f"project_experiment:rlhf_rollout_overprovisioned_idle:ratio_rate{ctx.window}"


def move(ctx: Context) -> str:
    return f"project_experiment:rlhf_gpu_move_to_rollout:estimate{ctx.window}"


def records(ctx: Context) -> list[dict[str, str]]:
    w = ctx.window
    least = _num(float(_limits(ctx)["min_gpu_seconds"]))

    def both(first: str, other: str) -> str:  # `first`'s GPU-seconds, where both sides have enough
        return (
            f'{sides(ctx)}{{gpu_role="{first}"}} >= {least}\n'
            f'  and ignoring (gpu_role) {sides(ctx)}{{gpu_role="{other}"}} >= {least}'
        )

    steps = f"(max without ({NODES}) (increase(rlhf_step_seconds_total[{w}])) > 0)"
    t, b = sides(ctx), sides_busy(ctx)
    return [
        {"record": idle(ctx), "expr": f"increase({TOTAL}[{w}])\n- increase({BUSY}[{w}])"},
        {
            "record": busy_ratio(ctx),
            "expr": f"increase({BUSY}[{w}])\n/ (increase({TOTAL}[{w}]) > 0)",
        },
        {"record": job_idle(ctx), "expr": f"sum without ({NODES}) ({idle(ctx)})"},
        {"record": fleet_idle(ctx), "expr": f"sum by (cluster, group, gpu_role) ({idle(ctx)})"},
        {"record": t, "expr": f"sum without ({NODES}, group) (increase({TOTAL}[{w}]))"},
        {"record": b, "expr": f"sum without ({NODES}, group) (increase({BUSY}[{w}]))"},
        {  # trainer GPUs idle while the step waits for samples, over the trainer's GPU-seconds
            "record": starved(ctx),
            "expr": (
                f'sum without (group, gpu_role) ({job_idle(ctx)}{{gpu_role="trainer",group="rollout"}})\n'
                f"/ ignoring (gpu_role) (\n  {both('trainer', 'rollout')}\n)"
            ),
        },
        {  # rollout GPUs idle while the trainer works, over the rollout's GPU-seconds
            "record": overprovisioned(ctx),
            "expr": (
                f'sum without (group, gpu_role) ({job_idle(ctx)}{{gpu_role="rollout",group!="rollout"}})\n'
                f"/ ignoring (gpu_role) (\n  {both('rollout', 'trainer')}\n)"
            ),
        },
        {  # N x B_rollout / (B_rollout + B_trainer) - N_rollout (docs/gpu-windows.md)
            "record": move(ctx),
            "expr": (
                f'round(\n  sum without (gpu_role) ({t}{{gpu_role=~"rollout|trainer"}}) / {steps}\n'
                f'  * ignoring (gpu_role) (\n    {b}{{gpu_role="rollout"}}\n'
                f'    / ignoring (gpu_role) (sum without (gpu_role) ({b}{{gpu_role=~"rollout|trainer"}}) > 0)\n  )\n'
                f'  - ignoring (gpu_role) ({t}{{gpu_role="rollout"}} / ignoring (gpu_role) {steps})\n)'
            ),
        },
    ]


# -- alerts ----------------------------------------------------------------------------------
def _idle_hours(ctx: Context, side: str) -> str:
    q = f'sum without (group, gpu_role) ({job_idle(ctx)}{{{JOB_MATCH},gpu_role="{side}"}}) / 3600'
    return _tq(q, 'printf "%.1f"')


def _evidence(ctx: Context, threshold: str) -> dict[str, str]:
    """Both alerts' values: the window, the threshold, and the idle GPU-hours of each side
    with the estimate of GPUs to move (the shared `idle GPU-hours` sentence)."""
    idle = {
        "window": ctx.window,
        "trainer_idle": _idle_hours(ctx, "trainer"),
        "rollout_idle": _idle_hours(ctx, "rollout"),
        "move": _tq(f"{move(ctx)}{{{JOB_MATCH}}}", 'printf "%+.0f"'),
    }
    return {
        "window": ctx.window,
        "threshold": threshold,
        "idle_gpu_hours": fragment("shared", "idle GPU-hours", idle),
    }


def trainer_starved(ctx: Context) -> Alert:
    lim = _limits(ctx)
    th1, th2 = (
        _num(float(lim["trainer_starved_idle"])),
        _num(float(lim["rollout_overprovisioned_idle"])),
    )
    text = alert_prose("RLHFTrainerStarved", _evidence(ctx, th1))
    return Alert(
        name="RLHFTrainerStarved",
        expr=(
            f"{starved(ctx)} >= {th1}\n"
            f"unless ({overprovisioned(ctx)} - {th2} > {starved(ctx)} - {th1})"
        ),
        for_=ctx.dur("bound_for"),
        severity="info",
        category="bottleneck",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFTrainerStarved",
            [
                f'{starved(ctx)}{{project="P", experiment="E"}}',
                f'{job_idle(ctx)}{{project="P", experiment="E"}}',
                f'{move(ctx)}{{project="P", experiment="E"}}',
            ],
            {"threshold": th1},
            change=shared_prose("Size the GPU pools"),
        ),
    )


def rollout_overprovisioned(ctx: Context) -> Alert:
    lim = _limits(ctx)
    th1, th2 = (
        _num(float(lim["trainer_starved_idle"])),
        _num(float(lim["rollout_overprovisioned_idle"])),
    )
    text = alert_prose("RLHFRolloutOverprovisioned", _evidence(ctx, th2))
    return Alert(
        name="RLHFRolloutOverprovisioned",
        expr=(
            f"{overprovisioned(ctx)} >= {th2}\n"
            f"unless ({starved(ctx)} - {th1} >= {overprovisioned(ctx)} - {th2})"
        ),
        for_=ctx.dur("bound_for"),
        severity="info",
        category="bottleneck",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFRolloutOverprovisioned",
            [
                f'{overprovisioned(ctx)}{{project="P", experiment="E"}}',
                f'{job_idle(ctx)}{{project="P", experiment="E"}}',
                f'{move(ctx)}{{project="P", experiment="E"}}',
            ],
            {"threshold": th2},
            change=shared_prose("Size the GPU pools"),
        ),
    )


ALERTS: tuple[Callable[[Context], Alert], ...] = (trainer_starved, rollout_overprovisioned)


def alerts(ctx: Context) -> list[Alert]:
    return [make(ctx) for make in ALERTS]


def groups(ctx: Context) -> list[dict[str, Any]]:
    base = ctx.a["runbook_url"]
    every = ctx.dur("gpu_interval")  # every GPU's window counters over [30m]
    return [
        {"name": "rlhf-exporter.gpu-windows.recording", "interval": every, "rules": records(ctx)},
        {
            "name": "rlhf-exporter.gpu-windows",
            "interval": every,
            "rules": [a.rule(base) for a in alerts(ctx)],
        },
    ]
