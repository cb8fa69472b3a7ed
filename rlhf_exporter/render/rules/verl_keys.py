"""verl's own names that the runbooks point at: the config keys to change per verdict and
reason, the metric keys that confirm a verdict in the job's log, and what an operator must
know about those keys (engine and version variants, keys that must move together, keys that
exist but do nothing, evidence a trainer mode does not log).

Every configuration key named here, in the generated runbooks and alerts, in docs/ and in the
chart exists in verl 0.9.1's generated configuration and is neither dead nor deprecated;
tests/test_verl_config_keys.py reads the verl wheel's YAML files to enforce it. A key that
only an older verl reads is listed in OLDER_KEYS and is named with its version next to it.
"""

from __future__ import annotations

from collections.abc import Mapping

# The evidence caveats are advice texts (shown by `diagnose`, `/` and the runbooks): they live
# in diagnosis/advice.py and are re-exported here next to the keys they qualify.
from ...diagnosis.advice import CAVEATS_BY_VERDICT, EVIDENCE_CAVEATS, caveats

__all__ = [
    "CAVEATS_BY_VERDICT",
    "DEAD_KEYS",
    "ENGINE_VARIANTS",
    "EVIDENCE_CAVEATS",
    "MOVE_TOGETHER",
    "OLDER_KEYS",
    "VERL_EVIDENCE_KEYS",
    "VERL_KEYS",
    "caveats",
]

# verl configuration keys to change, per verdict and reason (verl 0.9.1). Where FSDP and
# Megatron differ, both are listed; LOOK_AT (diagnosis/advice.py) says which is which.
VERL_KEYS: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("rollout", "preemption"): (
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
    ),
    ("rollout", "tool_calls"): (
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        "actor_rollout_ref.rollout.agent.num_workers",
    ),
    ("rollout", "reward_in_loop"): (
        "reward.custom_reward_function.path",
        "reward.reward_manager.name",
        "reward.num_workers",
        "actor_rollout_ref.rollout.agent.num_workers",
    ),
    ("rollout", "long_tail"): (
        "data.max_response_length",
        "actor_rollout_ref.rollout.response_length",
        "async_training.partial_rollout",
    ),
    ("rollout", "kv_pressure"): (
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    ),
    ("rollout", "queueing"): (
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    ),
    ("rollout", "replica_imbalance"): (
        "actor_rollout_ref.rollout.agent.num_workers",
        "actor_rollout_ref.rollout.data_parallel_size",
    ),
    ("rollout", "generation"): (
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.agent.num_workers",
    ),
    ("update", "compute_bound"): (
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
        "data.train_batch_size",
        "actor_rollout_ref.rollout.n",
    ),
    ("update", "low_mfu"): (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.actor.megatron.param_offload",
        "actor_rollout_ref.actor.megatron.optimizer_offload",
    ),
    ("update", "mfu_unknown"): (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    ),
    ("logprob", "compute_bound"): (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "trainer.n_gpus_per_node",
    ),
    ("logprob", "low_mfu"): (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "actor_rollout_ref.ref.megatron.param_offload",
    ),
    ("logprob", "mfu_unknown"): (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    ),
    ("sync", "weight_sync"): (
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    ),
    ("reward", "reward_model"): (
        "reward.reward_model.rollout.max_num_seqs",
        "reward.reward_model.rollout.max_num_batched_tokens",
        "reward.reward_model.rollout.tensor_model_parallel_size",
        "reward.reward_model.rollout.gpu_memory_utilization",
        "reward.reward_model.enable_resource_pool",
        "reward.reward_model.n_gpus_per_node",
        "reward.reward_model.nnodes",
        "reward.num_workers",
    ),
    ("checkpoint", "checkpoint"): (
        "trainer.save_freq",
        "actor_rollout_ref.actor.checkpoint.save_contents",
        "actor_rollout_ref.actor.checkpoint.async_save",
    ),
    ("other", "untimed"): ("trainer.balance_batch", "data.train_batch_size"),
    ("other", "driver_compute"): ("algorithm.adv_estimator", "trainer.balance_batch"),
}

# verl metric keys (the `file` logger's data) that confirm each verdict, beyond its timers.
VERL_EVIDENCE_KEYS: Mapping[str, tuple[str, ...]] = {
    "rollout": (
        "timing_s/agent_loop/num_preempted/max",
        "timing_s/agent_loop/slowest/tool_calls",
        "timing_s/agent_loop/slowest/compute_score",
        "timing_s/agent_loop/generate_sequences/max",
        "timing_s/agent_loop/generate_sequences/mean",
        "response_length/max",
        "response_length/mean",
        "response/aborted_ratio",
        "fully_async/processing_time/max",
        "fully_async/processing_time/avg",
    ),
    "update": ("perf/mfu/actor", "perf/mfu/critic"),
    "logprob": ("perf/mfu/actor_infer",),
    "sync": (),
    "reward": (),
    "other": ("timing_s/step",),
}

# The same knob under FSDP and under Megatron (verl 0.9.1 `_generated_ppo_trainer.yaml` vs
# `_generated_ppo_megatron_trainer.yaml`): name both wherever one is named.
ENGINE_VARIANTS: Mapping[str, str] = {
    "actor_rollout_ref.actor.fsdp_config.param_offload": (
        "actor_rollout_ref.actor.megatron.param_offload"
    ),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": (
        "actor_rollout_ref.actor.megatron.optimizer_offload"
    ),
    "actor_rollout_ref.ref.fsdp_config.param_offload": "actor_rollout_ref.ref.megatron.param_offload",
}

# Keys that must be set together: (key, must equal key, why). The verl source behind each
# "why" here and below: docs/verl-support.md, "Verified in verl source".
MOVE_TOGETHER: tuple[tuple[str, str, str], ...] = (
    (
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "enforced: verl asserts they are equal; its config interpolates one from the other",
    ),
    (
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "interpolated from the actor's by default, not enforced: only the rollout's is asserted",
    ),
)

# Keys that only an older verl reads: key -> (verl versions that read it, what replaces it in
# verl 0.9.1). Name such a key only with its version next to it ("0.6", "0.7").
OLDER_KEYS: Mapping[str, tuple[str, str]] = {
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": (
        "0.6",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    ),
    "actor_rollout_ref.nccl_timeout": (
        "0.6-0.7",
        "none: 0.8+ starts its process groups with PyTorch's default timeout",
    ),
}

# Keys that verl 0.9.1's configuration still contains but that do nothing or are deprecated
# (a key or a prefix ending in "."): never name them as something to change.
DEAD_KEYS: Mapping[str, str] = {
    "reward_model.": (
        "legacy; only fully-async copies it to reward.* (migrate_legacy_reward_impl); "
        "main_ppo and one-step-off ignore it"
    ),
    "custom_reward_function.": (
        "legacy; only fully-async copies it to reward.custom_reward_function; main_ppo and "
        "one-step-off ignore it"
    ),
    "actor_rollout_ref.nccl_timeout": (
        "read by nothing in 0.8+: its workers pass timeout_second=None"
    ),
    "actor_rollout_ref.rollout.over_sample_rate": (
        "read by nothing in 0.7.1+: only declared in the rollout config"
    ),
}
