"""verl's own names that the runbooks point at: the config keys to change per verdict and
reason, and the metric keys that confirm a verdict in the job's log."""

from __future__ import annotations

from collections.abc import Mapping

# verl configuration keys to change, per verdict and reason (verl 0.9; older releases keep
# update_weights_bucket_megabytes directly under actor_rollout_ref.rollout).
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
        "custom_reward_function.path",
        "reward_model.reward_manager",
        "actor_rollout_ref.rollout.agent.num_workers",
    ),
    ("rollout", "long_tail"): (
        "data.max_response_length",
        "actor_rollout_ref.rollout.over_sample_rate",
        "async_training.partial_rollout",
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
        "reward_model.micro_batch_size_per_gpu",
        "reward_model.use_dynamic_bsz",
        "reward_model.forward_max_token_len_per_gpu",
    ),
    ("checkpoint", "checkpoint"): (
        "trainer.save_freq",
        "actor_rollout_ref.actor.checkpoint.save_contents",
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
    ),
    "update": ("perf/mfu/actor", "perf/mfu/critic"),
    "logprob": ("perf/mfu/actor_infer",),
    "sync": (),
    "reward": (),
    "other": ("timing_s/step",),
}
