"""§3 of the decision table: the verdict (which window the loop waits on) and its reason."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .thresholds import GROUPS, Thresholds
from .values import agent_loop, num
from .windows import Windows

BALANCED = "balanced"
UNKNOWN = "unknown"
VERDICTS = GROUPS + (BALANCED, UNKNOWN)
"""Every verdict, groups first. The sidecar exports all of them, always."""

REASONS: Mapping[str, tuple[str, ...]] = {
    "rollout": (
        "preemption",
        "tool_calls",
        "reward_in_loop",
        "long_tail",
        "generation",
        # engine evidence only (diagnosis/engines.py; a sidecar with engine scraping)
        "kv_pressure",
        "queueing",
        "replica_imbalance",
    ),
    "reward": ("reward_model",),
    "logprob": ("compute_bound", "low_mfu", "mfu_unknown"),
    "update": ("compute_bound", "low_mfu", "mfu_unknown"),
    "sync": ("weight_sync",),
    "checkpoint": ("checkpoint",),
    "other": ("untimed", "driver_compute"),
    BALANCED: (),
    UNKNOWN: (),
}
"""The reasons each verdict can carry, in the order the table tests them."""


Evidence = dict[str, float | None]
Reasoned = tuple[str, Evidence]
"""A reason and the numbers it was decided on."""


class Verdict(NamedTuple):
    verdict: str
    reason: str | None
    evidence: Mapping[str, float | None]  # the numbers the reason was decided on


def decide(windows: Windows, data: Mapping[str, Any], th: Thresholds) -> Verdict:
    """The verdict and reason for one step whose windows are `windows`."""
    group, top, runner_up = _top_two(windows.shares)
    if top < th.min_share or top - runner_up < th.min_margin:
        return Verdict(BALANCED, None, {"top_share": top, "runner_up_share": runner_up})
    reason, evidence = _REASONERS[group](windows, data, th)
    return Verdict(group, reason, evidence)


def _top_two(shares: Mapping[str, float]) -> tuple[str, float, float]:
    """The largest share's group (the first in GROUPS order on a tie), it, and the runner-up."""
    best, top, second = GROUPS[0], shares[GROUPS[0]], float("-inf")
    for g in GROUPS[1:]:
        s = shares[g]
        if s > top:
            best, top, second = g, s, top
        elif s > second:
            second = s
    return best, top, second


def _rollout(w: Windows, data: Mapping[str, Any], th: Thresholds) -> Reasoned:
    preempted = agent_loop(data, "num_preempted/max")
    ev: dict[str, float | None] = {"num_preempted_max": preempted}
    if preempted is not None and preempted > th.preempted_max:
        return "preemption", ev
    gen = agent_loop(data, "slowest/generate_sequences")
    tool = agent_loop(data, "slowest/tool_calls")
    score = agent_loop(data, "slowest/compute_score")
    total = (gen or 0.0) + (tool or 0.0) + (score or 0.0)
    ev.update(slowest_generate_sequences=gen, slowest_tool_calls=tool, slowest_compute_score=score)
    if total > 0:
        if (tool or 0.0) >= th.tool_calls_fraction * total:
            return "tool_calls", ev
        if (score or 0.0) >= th.compute_score_fraction * total:
            return "reward_in_loop", ev
    gmax = agent_loop(data, "generate_sequences/max")
    gmean = agent_loop(data, "generate_sequences/mean")
    if gmax is not None and gmean is not None and gmean > 0:
        ev.update(generate_sequences_max=gmax, generate_sequences_mean=gmean)
        if gmax >= th.long_tail_generate_ratio * gmean:
            return "long_tail", ev
        return "generation", ev
    rmax = num(data.get("response_length/max"))
    rmean = num(data.get("response_length/mean"))
    ev.update(response_length_max=rmax, response_length_mean=rmean)
    if (
        rmax is not None
        and rmean is not None
        and rmean > 0
        and rmax >= th.long_tail_response_ratio * rmean
    ):
        return "long_tail", ev
    return "generation", ev


def _mfu_reason(mfu: float | None, th: Thresholds) -> Reasoned:
    if mfu is None or mfu == 0:
        return "mfu_unknown", {"mfu": mfu}
    if mfu >= th.mfu_compute_bound:
        return "compute_bound", {"mfu": mfu}
    return "low_mfu", {"mfu": mfu}


def _update(w: Windows, data: Mapping[str, Any], th: Thresholds) -> Reasoned:
    critic_heavier = w.counted.get("update_critic", 0.0) > w.counted.get("update_actor", 0.0)
    key = "perf/mfu/critic" if critic_heavier else "perf/mfu/actor"
    return _mfu_reason(num(data.get(key)), th)


def _logprob(w: Windows, data: Mapping[str, Any], th: Thresholds) -> Reasoned:
    return _mfu_reason(num(data.get("perf/mfu/actor_infer")), th)


def _other(w: Windows, data: Mapping[str, Any], th: Thresholds) -> Reasoned:
    other = w.group_seconds["other"]
    ev: Evidence = {"untimed_seconds": w.untimed_seconds, "other_seconds": other}
    if w.untimed_seconds >= th.untimed_fraction * other:
        return "untimed", ev
    return "driver_compute", ev


Reasoner = Callable[[Windows, Mapping[str, Any], Thresholds], Reasoned]


def _fixed(reason: str) -> Reasoner:
    return lambda w, data, th: (reason, {})


_REASONERS: Mapping[str, Reasoner] = {
    "rollout": _rollout,
    "reward": _fixed("reward_model"),
    "logprob": _logprob,
    "update": _update,
    "sync": _fixed("weight_sync"),
    "checkpoint": _fixed("checkpoint"),
    "other": _other,
}
