"""A synthetic verl job: records in the exact shape verl's `file` logger writes.

Each `Regime` fixes the job's shape (seconds per million tokens for each timer, tokens per
step, MFU, agent-loop spread); `records()` adds a few percent of noise and yields one
`{"step", "data"}` dict per step, as verl's FileLogger would. Pure and deterministic for a
given seed: it does no I/O (the demo job and `write_jsonl` do that).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

N_GPUS = 16
REFERENCE_TOKENS = 3.0e6
PER_STEP_TIMERS = frozenset({"update_weights"})
"""Timers whose seconds do not grow with the batch: weight sync moves the model, not tokens.
Their `cost` is seconds per million tokens of a REFERENCE_TOKENS batch."""


@dataclass(frozen=True)
class Regime:
    name: str
    # seconds per million tokens, per verl timer (gen, old_log_prob, ref, adv, update_actor, ...)
    cost: Mapping[str, float]
    tokens: float = REFERENCE_TOKENS  # perf/total_num_tokens per step
    untimed: float = 0.6  # seconds per million tokens outside any timer
    mfu_actor: float = 0.42
    mfu_infer: float = 0.35
    gen_tail: float = 1.3  # agent-loop generate_sequences max / mean
    response_mean: float = 900.0
    v0: bool = True  # legacy trainer: agent-loop stats and perf/mfu/actor_infer
    preempted: int = 0
    extra: Mapping[str, float] = field(default_factory=dict)  # more data keys, verbatim


BASE_COST = {
    "gen": 8.0,
    "old_log_prob": 2.4,
    "ref": 1.6,
    "adv": 0.3,
    "update_actor": 4.0,
    "update_weights": 1.0,
}

REGIMES: dict[str, Regime] = {
    "rollout_long_tail": Regime("rollout_long_tail", {**BASE_COST, "gen": 22.0}, gen_tail=3.2),
    "rollout_generation": Regime("rollout_generation", {**BASE_COST, "gen": 20.0}, gen_tail=1.2),
    "update_low_mfu": Regime(
        "update_low_mfu", {**BASE_COST, "gen": 5.0, "update_actor": 16.0}, mfu_actor=0.14
    ),
    "update_compute_bound": Regime(
        "update_compute_bound", {**BASE_COST, "gen": 5.0, "update_actor": 16.0}, mfu_actor=0.48
    ),
    "sync_bound": Regime("sync_bound", {**BASE_COST, "gen": 4.0, "update_weights": 14.0}),
    "balanced": Regime(
        "balanced",
        {**BASE_COST, "gen": 6.0, "old_log_prob": 4.5, "update_actor": 5.0, "update_weights": 3.0},
        untimed=2.0,
    ),
    "other_untimed": Regime("other_untimed", {**BASE_COST, "gen": 3.0}, untimed=20.0),
}


def shifted(regime: Regime, factor: float) -> Regime:
    """The same job with `factor` x the tokens per step: a workload shift."""
    return replace(
        regime,
        name=f"{regime.name}+workload",
        tokens=regime.tokens * factor,
        response_mean=regime.response_mean * factor,
    )


def regressed(regime: Regime, timer: str, factor: float) -> Regime:
    """The same job with one timer `factor` x as costly for the same work: a regression."""
    return replace(
        regime,
        name=f"{regime.name}+slow_{timer}",
        cost={**regime.cost, timer: regime.cost[timer] * factor},
    )


def step_data(regime: Regime, step: int, rng: random.Random, noise: float = 0.03) -> dict[str, Any]:
    """One step's `data`, in verl's key names and nesting quirks."""

    def jitter(x: float) -> float:
        return x * (1.0 + rng.uniform(-noise, noise))

    millions = regime.tokens / 1e6
    tokens = int(jitter(regime.tokens))
    data: dict[str, Any] = {}
    total = 0.0
    for timer, per_m in regime.cost.items():
        scale = REFERENCE_TOKENS / 1e6 if timer in PER_STEP_TIMERS else millions
        seconds = jitter(per_m * scale)
        data[f"timing_s/{timer}"] = seconds
        total += seconds
    step_s = total + jitter(regime.untimed * millions)
    data["timing_s/step"] = step_s
    if regime.v0:
        data["timing_s/start_profile"] = 0.0004
        data["timing_s/stop_profile"] = 0.0003
    data["perf/total_num_tokens"] = tokens
    data["perf/time_per_step"] = step_s
    data["perf/throughput"] = tokens / (step_s * N_GPUS)
    data["perf/mfu/actor"] = jitter(regime.mfu_actor)
    resp = jitter(regime.response_mean)
    data["response_length/mean"] = resp
    data["response_length/max"] = min(resp * regime.gen_tail * 1.1, 8192.0)
    data["response_length/min"] = resp * 0.1
    data["response_length/clip_ratio"] = 0.01
    data["actor/perf/max_memory_allocated_gb"] = jitter(62.0)
    data["actor/perf/max_memory_reserved_gb"] = 70.0
    data["critic/score/mean"] = jitter(0.7)
    data["training/global_step"] = step
    if regime.v0:
        data["perf/mfu/actor_infer"] = jitter(regime.mfu_infer)
        gen = data.get("timing_s/gen", 0.0)
        gmax = gen * 0.96
        gmean = gmax / jitter(regime.gen_tail)
        prefix = "timing_s/agent_loop/"
        data.update(
            {
                prefix + "generate_sequences/max": gmax,
                prefix + "generate_sequences/mean": gmean,
                prefix + "generate_sequences/min": gmean * 0.3,
                prefix + "tool_calls/max": 0.0,
                prefix + "tool_calls/mean": 0.0,
                prefix + "tool_calls/min": 0.0,
                prefix + "num_preempted/max": regime.preempted,
                prefix + "num_preempted/mean": regime.preempted / 4,
                prefix + "num_preempted/min": 0,
                prefix + "slowest/generate_sequences": gmax,
                prefix + "slowest/tool_calls": 0.0,
                prefix + "slowest/compute_score": 0.02 * gmax,
                prefix + "slowest/num_preempted": regime.preempted,
                prefix + "slowest/prompt_length": 512,
                prefix + "slowest/response_length": data["response_length/max"],
            }
        )
    data.update(regime.extra)
    return data


def records(
    plan: list[tuple[Regime, int]], seed: int = 0, first_step: int = 1, validation: bool = True
) -> Iterator[dict[str, Any]]:
    """Records for a job that runs each (regime, n_steps) of `plan` in turn.

    Step 0 carries only the initial validation, as verl logs it.
    """
    rng = random.Random(seed)
    if validation:
        yield {"step": 0, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.41}}
    step = first_step
    for regime, n in plan:
        for _ in range(n):
            yield {"step": step, "data": step_data(regime, step, rng)}
            step += 1


def encode(record: Mapping[str, Any]) -> bytes:
    """One record as verl 0.9's FileLogger writes it: orjson, then a newline."""
    return orjson.dumps(record) + b"\n"


def write_jsonl(path: str | os.PathLike[str], plan: list[tuple[Regime, int]], seed: int = 0) -> int:
    """Write a whole simulated log; returns the number of records."""
    n = 0
    with open(path, "wb") as f:
        for record in records(plan, seed):
            f.write(encode(record))
            n += 1
    return n


DEMO_PLAN: list[tuple[Regime, int]] = [
    (REGIMES["rollout_long_tail"], 12),
    (REGIMES["update_low_mfu"], 12),
    (REGIMES["sync_bound"], 12),
    (shifted(REGIMES["sync_bound"], 1.6), 8),
    (regressed(REGIMES["sync_bound"], "update_actor", 3.0), 8),
]
"""The demo job's regimes: rollout-bound (long tail), update-bound (low MFU), sync-bound,
a workload shift, then a regression of update."""
