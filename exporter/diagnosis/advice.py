"""What each verdict and reason means, and where to look next (the table's last column).

Shown by `diagnose`, the landing page and the runbooks; written once, here.
"""

from __future__ import annotations

from collections.abc import Mapping

VERDICT_MEANING: Mapping[str, str] = {
    "rollout": "the trainer waits for rollout samples (gen)",
    "reward": "a colocated reward model scores the batch (reward)",
    "logprob": "training-side inference (old_log_prob, ref, values)",
    "update": "the optimizer step (update_actor, update_critic)",
    "sync": "new weights go back to the rollout engines (update_weights, param_sync)",
    "checkpoint": "saving a checkpoint (save_checkpoint)",
    "other": "driver work outside the named windows (adv, data movement, untimed)",
    "balanced": "no single window dominates",
    "unknown": "the step has no usable timing_s/step",
}

REASON_MEANING: Mapping[str, str] = {
    "preemption": "rollout requests were preempted (agent_loop/num_preempted/max > 0)",
    "tool_calls": "the slowest sample spent its time in tool calls",
    "reward_in_loop": "the slowest sample spent its time in compute_score",
    "long_tail": "a few long samples hold the batch (max >> mean)",
    "generation": "generation itself is slow, evenly across samples",
    "compute_bound": "MFU is high: the work itself is large",
    "low_mfu": "MFU is low: the GPUs are under-used",
    "mfu_unknown": "MFU is not reported (0 or missing)",
    "weight_sync": "pushing weights to the rollout engines",
    "reward_model": "the reward model",
    "checkpoint": "checkpoint saving",
    "untimed": "time outside any timer: data movement, batching, serialization",
    "driver_compute": "timed driver work such as adv",
}

LOOK_AT: Mapping[tuple[str, str], str] = {
    ("rollout", "preemption"): "KV-cache pressure: rollout gpu_memory_utilization, max_num_seqs",
    ("rollout", "tool_calls"): "tool latency and concurrency",
    (
        "rollout",
        "reward_in_loop",
    ): "reward function / reward workers (reward.*, not reward_model.*)",
    ("rollout", "long_tail"): "response length cap; partial rollout (fully-async only)",
    ("rollout", "generation"): "rollout engine throughput, TP size, concurrency",
    ("update", "compute_bound"): "more GPUs or fewer tokens",
    ("update", "low_mfu"): (
        "micro-batch size, dynamic bsz, offload (FSDP: fsdp_config.*_offload; "
        "Megatron: megatron.*_offload), communication"
    ),
    ("update", "mfu_unknown"): "actor MFU (perf/mfu/actor) unknown: profile update_actor",
    ("logprob", "compute_bound"): "log-prob micro-batch size; more GPUs or fewer tokens",
    ("logprob", "low_mfu"): (
        "log-prob micro-batch size; rollout.log_prob_use_dynamic_bsz must equal "
        "actor.use_dynamic_bsz"
    ),
    ("logprob", "mfu_unknown"): (
        "log-prob micro-batch size (the V1 trainer never logs perf/mfu/actor_infer)"
    ),
    ("sync", "weight_sync"): (
        "checkpoint-engine backend and bucket size "
        "(on verl 0.6: actor_rollout_ref.rollout.update_weights_bucket_megabytes)"
    ),
    ("reward", "reward_model"): "reward model servers: placement, batch, TP",
    ("checkpoint", "checkpoint"): "save frequency, async checkpointing",
    ("other", "untimed"): "data movement, controller",
    ("other", "driver_compute"): "driver work such as adv",
}

CHANGE_MEANING: Mapping[str, str] = {
    "none": "in line with the job's recent steps",
    "workload_shift": "slower because there were more tokens; every window's cost per token held",
    "regression": "a window costs more per token than the job's baseline",
}


def look_at(verdict: str, reason: str | None) -> str:
    """The table's last column for a verdict and reason ('' when there is none)."""
    if reason is None:
        return ""
    return LOOK_AT.get((verdict, reason), "")
