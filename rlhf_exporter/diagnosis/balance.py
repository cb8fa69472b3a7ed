"""Who waits on whom in the separated and async trainers, from GPU busy time by window.

Input: busy and available GPU-seconds per (group, GPU role), summed over any range (the
counters `rlhf_window_gpu_busy_seconds_total` / `rlhf_window_gpu_seconds_total`, or
`GpuWindowJoin.counters()`). Pure, no I/O.

- The trainer's idle share: idle trainer GPU-seconds / trainer GPU-seconds, over every window;
  `starved_idle`: the part of it spent in `rollout` windows (`gen`, `wait_for_enough_samples`,
  `switch_wait`): the trainer waiting for samples.
- The rollout's idle share, and `overprovisioned_idle`: the part spent outside `rollout`
  windows (the trainer computing, syncing, while rollout GPUs have nothing to do).
- Verdict (thresholds `balance.*` in rlhf_exporter/thresholds.yaml): `trainer_starved` when
  starved_idle >= trainer_starved_idle, `rollout_overprovisioned` when overprovisioned_idle
  >= rollout_overprovisioned_idle; both: the larger excess over its threshold wins; neither:
  `balanced`; a side with fewer than min_gpu_seconds (or a colocated job: no sides): None.

The GPU-move estimate (first order). Assumptions:
1. each side's work is its busy GPU-seconds B (utilization x time is the work done);
2. each side's speed scales linearly with its GPU count (no fixed per-step costs, no
   parallelism granularity: tensor-parallel sizes are the operator's rounding);
3. the two sides' GPUs are interchangeable, and the total N stays the same;
4. the pipeline is balanced when each side needs the same time: B_r / n_r = B_t / n_t.
Then n_r = N x B_r / (B_r + B_t), and `move_to_rollout` = round(n_r - N_r) (negative: move
that many GPUs from rollout to the trainer). GPU counts per side are available GPU-seconds /
the range's wall seconds, so the caller passes the wall seconds the counters cover.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

ROLLOUT_GROUP = "rollout"
TRAINER_STARVED, ROLLOUT_OVERPROVISIONED, BALANCED = (
    "trainer_starved",
    "rollout_overprovisioned",
    "balanced",
)


class Balance(NamedTuple):
    verdict: str | None  # trainer_starved, rollout_overprovisioned, balanced; None: no sides
    trainer_idle: float  # share of the trainer's GPU-seconds idle
    rollout_idle: float
    starved_idle: float  # trainer idle during rollout windows / trainer GPU-seconds
    overprovisioned_idle: float  # rollout idle outside rollout windows / rollout GPU-seconds
    trainer_idle_seconds: float  # evidence: idle GPU-seconds on each side
    rollout_idle_seconds: float
    trainer_gpus: float  # mean GPUs on each side over the range
    rollout_gpus: float
    move_to_rollout: int  # the first-order estimate (negative: to the trainer)


def _side(
    counters: Mapping[tuple[str, str], tuple[float, float]], role: str
) -> tuple[float, float, float, float]:
    """(busy, available, idle while rolling out, idle outside rollout) GPU-seconds of a role."""
    busy = total = idle_in_rollout = idle_outside = 0.0
    for (group, r), (b, a) in counters.items():
        if r != role:
            continue
        busy += b
        total += a
        if group == ROLLOUT_GROUP:
            idle_in_rollout += a - b
        else:
            idle_outside += a - b
    return busy, total, idle_in_rollout, idle_outside


def balance(
    counters: Mapping[tuple[str, str], tuple[float, float]],
    wall_seconds: float,
    limits: Mapping[str, Any],
) -> Balance | None:
    """`counters`: (group, gpu_role) -> (busy, available) GPU-seconds; `wall_seconds`: the
    time they cover; `limits`: the thresholds document's `balance` section. None when the
    job has no separate rollout and trainer GPUs."""
    rb, rt, _r_in, r_out = _side(counters, "rollout")
    tb, tt, t_in, _t_out = _side(counters, "trainer")
    if rt <= 0.0 or tt <= 0.0 or wall_seconds <= 0.0:
        return None
    n_r, n_t = rt / wall_seconds, tt / wall_seconds
    starved = t_in / tt
    over = r_out / rt
    move = 0
    if rb + tb > 0.0:
        move = round((n_r + n_t) * rb / (rb + tb) - n_r)
    verdict: str | None = BALANCED
    if min(rt, tt) < float(limits["min_gpu_seconds"]):
        verdict = None
    else:
        excess = {
            TRAINER_STARVED: starved - float(limits["trainer_starved_idle"]),
            ROLLOUT_OVERPROVISIONED: over - float(limits["rollout_overprovisioned_idle"]),
        }
        worst = max(excess, key=excess.__getitem__)
        if excess[worst] >= 0.0:
            verdict = worst
    return Balance(
        verdict,
        (tt - tb) / tt,
        (rt - rb) / rt,
        starved,
        over,
        tt - tb,
        rt - rb,
        n_t,
        n_r,
        move,
    )
