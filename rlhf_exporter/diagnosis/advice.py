"""What each verdict and reason means, and where to look next (the table's last column).

Shown by `diagnose`, the landing page and the runbooks; written once, here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from .values import TIMER_PREFIX, num

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
    "preemption": "rollout requests were preempted (the engines' preemption or retraction "
    "counters grew during the rollout window, or agent_loop/num_preempted/max > 0)",
    "kv_pressure": "the engines' KV cache was full while requests waited",
    "queueing": "requests waited while the engines' KV cache had room",
    "replica_imbalance": "one rollout replica generated far more tokens than the others",
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
    "untimed": "time outside any timer: data movement, batching, serialization (on a V1 job's "
    "first step: waiting for its agent loop workers to start, a warm-up)",
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
    ("rollout", "kv_pressure"): (
        "KV-cache room: rollout gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, "
        "or more rollout replicas (a smaller tensor_model_parallel_size)"
    ),
    ("rollout", "queueing"): (
        "too few replicas or a low max_num_seqs: the engine had room (raise max_num_seqs, or "
        "a smaller tensor_model_parallel_size for more replicas)"
    ),
    ("rollout", "replica_imbalance"): (
        "one slow node or an uneven load: the replica's node and GPUs, per-replica batch "
        "(agent.num_workers), data_parallel_size"
    ),
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
    ("checkpoint", "checkpoint"): "save frequency, async checkpointing (Megatron only)",
    ("other", "untimed"): "data movement, controller",
    ("other", "driver_compute"): "driver work such as adv",
}

CHANGE_MEANING: Mapping[str, str] = {
    "steady": "in line with the job's recent steps (also before a baseline exists)",
    "workload_shift": "slower because the work grew (tokens, sequence length, longest response); "
    "no window costs more than its work explains",
    "regression": "a window costs more than its work explains, against the job's own baseline",
}


def look_at(verdict: str, reason: str | None) -> str:
    """The table's last column for a verdict and reason ('' when there is none)."""
    if reason is None:
        return ""
    return LOOK_AT.get((verdict, reason), "")


# Evidence a verl version or trainer mode does not log: where a reason cannot fire or a metric
# misleads (docs/verl-support.md has the table by version and mode). Shown next to a verdict
# and reason by the runbooks, `/` and `diagnose`; never a guess presented as a measurement.
EVIDENCE_CAVEATS: Mapping[str, str] = {
    "v1_rollout_reasons": (
        "On verl's V1 trainer (the default since 0.9.0) the log has no agent_loop/* metrics: "
        "the rollout reasons preemption, tool_calls and reward_in_loop cannot fire from the log "
        "alone, so a V1 rollout step is long_tail or generation."
    ),
    "v1_logprob_mfu": (
        "On verl's V1 trainer the log has no perf/mfu/actor_infer: the logprob reason is "
        "always mfu_unknown there, which is a missing measurement, not a low MFU."
    ),
    "fully_async_idle_ratio": (
        "fully_async/rollouter/idle_ratio is the time since the last fully drained pause "
        "divided by the version window (verl issue #6693, unfixed in 0.9.1): earlier pauses "
        "count as active and work after a resume as idle, so it is not the rollouter's idle "
        "share. The decision table never reads it; "
        'rlhf_fully_async_idle_ratio{component="rollouter"} passes it through as verl logs it.'
    ),
    "unreported_preemptions": (
        "verl writes agent_loop/num_preempted = -1 when the rollout engine does not report "
        "preemptions, and none of the engines verl 0.7.1-0.9.1 pins does (vLLM, SGLang, "
        "TRT-LLM): -1 is missing, so the preemption reason cannot fire from the log; the "
        "engine's own vllm:num_preemptions_total or sglang:num_retracted_requests_total is "
        "the signal."
    ),
}

# The rollout reasons only the sidecar can give: they need the rollout engines' own metrics
# (engine evidence, docs/engines.md), which a log never holds. `diagnose` says so.
SIDECAR_REASONS: tuple[str, ...] = ("kv_pressure", "queueing", "replica_imbalance")
SIDECAR_NOTE = (
    "kv_pressure, queueing and replica_imbalance (and preemption and long_tail from the "
    "engines on V1 and fully-async) need the sidecar: `rlhf-exporter serve` reads the vLLM / "
    "SGLang /metrics during each rollout window (docs/engines.md); a log alone cannot show them"
)

# Which caveat belongs under which verdict and reason (None: every reason of the verdict).
CAVEATS_BY_VERDICT: Mapping[tuple[str, str | None], tuple[str, ...]] = {
    ("rollout", "preemption"): ("unreported_preemptions", "v1_rollout_reasons"),
    ("rollout", "tool_calls"): ("v1_rollout_reasons",),
    ("rollout", "reward_in_loop"): ("v1_rollout_reasons",),
    ("logprob", "mfu_unknown"): ("v1_logprob_mfu",),
    ("rollout", None): ("fully_async_idle_ratio",),
}

# verl configuration traps: a setting that is silently ignored, named in the runbooks' "What
# to change" of the reasons it concerns and in docs/verl-support.md (file:line there).
CONFIG_TRAPS: Mapping[str, str] = {
    "legacy_reward_keys": (
        "Trap: verl 0.9.1 migrates the legacy reward_model.* and custom_reward_function.* keys "
        "to reward.* only in fully-async (fully_async_main.py); under main_ppo (the V1 and the "
        "legacy trainer) and one-step-off they are silently ignored (0.7.1 and 0.8.0 migrate "
        "them in main_ppo, 0.8.0's one-step-off does not). Set the reward.* keys instead: "
        "`reward.reward_model.rollout.max_num_seqs`, "
        "`reward.reward_model.rollout.tensor_model_parallel_size`, "
        "`reward.reward_model.enable_resource_pool`, `reward.reward_model.n_gpus_per_node`, "
        "`reward.num_workers`, `reward.reward_manager.name`, "
        "`reward.custom_reward_function.path`."
    ),
}
CONFIG_TRAPS_BY_REASON: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("reward", "reward_model"): ("legacy_reward_keys",),
    ("rollout", "reward_in_loop"): ("legacy_reward_keys",),
}


def config_traps(verdict: str, reason: str) -> tuple[str, ...]:
    """The configuration-trap texts that concern a verdict and reason."""
    return tuple(CONFIG_TRAPS[n] for n in CONFIG_TRAPS_BY_REASON.get((verdict, reason), ()))


# The verl key (in the `file` logger's data) each reason's evidence needs. A job whose log has
# never shown it cannot get that reason: verl 0.6, the V1 trainer and fully-async lack some.
REASON_EVIDENCE: Mapping[tuple[str, str], str] = {
    ("rollout", "preemption"): "timing_s/agent_loop/num_preempted/max",
    ("rollout", "tool_calls"): "timing_s/agent_loop/slowest/tool_calls",
    ("rollout", "reward_in_loop"): "timing_s/agent_loop/slowest/compute_score",
    ("logprob", "compute_bound"): "perf/mfu/actor_infer",
    ("logprob", "low_mfu"): "perf/mfu/actor_infer",
}
UNRELIABLE_KEYS: Mapping[str, str] = {
    "fully_async/rollouter/idle_ratio": EVIDENCE_CAVEATS["fully_async_idle_ratio"],
}

# Values verl writes for "not reported": such a value is missing, and is no evidence that the
# key was seen. `agent_loop/num_preempted/*` is -1 when the engine does not report preemptions;
# MFU is 0 on a GPU verl does not know (its flops counter's device peak is inf): the verl
# sources are cited in docs/verl-support.md, "Verified in verl source".
# Any other value that is not a usable number (null, NaN, a negative) is missing too.
NOT_REPORTED: Mapping[str, float] = {
    "timing_s/agent_loop/num_preempted/max": -1.0,
    "perf/mfu/actor_infer": 0.0,
}
_NOT_REPORTED_NOTE: Mapping[str, str] = {
    "timing_s/agent_loop/num_preempted/max": " (or only -1: the engine does not report preemptions)",
    "perf/mfu/actor_infer": " (or only 0: verl does not know the GPU's peak FLOPS)",
}

# What the decision table reads each of these verl keys for. Another framework's table says
# in its own words which of them its output lacks (frameworks/tables.py, `cannot_show`).
DECIDES: Mapping[str, str] = {
    "perf/total_num_tokens": "change (a regression or a workload shift)",
    "perf/mfu/actor": "update/compute_bound and update/low_mfu",
    "perf/mfu/actor_infer": "logprob/compute_bound and logprob/low_mfu",
    "response_length/max": "rollout/long_tail",
}

# The keys missing_evidence() looks at: a job needs to remember only which of these it has seen.
EVIDENCE_KEYS: frozenset[str] = (
    frozenset(REASON_EVIDENCE.values()) | frozenset(UNRELIABLE_KEYS) | frozenset(DECIDES)
)
_SPELLINGS: tuple[tuple[str, str], ...] = tuple(
    (key, key.removeprefix(TIMER_PREFIX)) for key in sorted(EVIDENCE_KEYS)
)


_UNSEEN: dict[frozenset[str], tuple[tuple[str, str], ...]] = {}


def _unseen_spellings(seen: AbstractSet[str]) -> tuple[tuple[str, str], ...]:
    """_SPELLINGS less the keys in `seen` (memoized: a log shows its keys within its first
    records, so a run meets a handful of `seen` sets; at most 2^len(EVIDENCE_KEYS))."""
    key = frozenset(seen) & EVIDENCE_KEYS
    spellings = _UNSEEN.get(key)
    if spellings is None:
        spellings = _UNSEEN[key] = tuple(s for s in _SPELLINGS if s[0] not in key)
    return spellings


def reported(key: str, value: Any) -> bool:
    """Whether `value`, logged under evidence key `key`, is evidence: a usable number other
    than verl's "not reported" value for that key."""
    x = num(value)
    return x is not None and x != NOT_REPORTED.get(key)


def shown_evidence(data: Mapping[str, Any], seen: AbstractSet[str] = frozenset()) -> frozenset[str]:
    """The EVIDENCE_KEYS that one record's data reports (agent-loop keys in either spelling,
    the prefixed one winning, as the decision table reads them). A key whose value is missing
    or verl's "not reported" value is not shown: it must not silence missing_evidence().
    Keys in `seen` (already shown by earlier records) are not looked at again."""
    out = []
    for key, plain in _unseen_spellings(seen):
        if key in data:
            if reported(key, data[key]):
                out.append(key)
        elif plain != key and plain in data and reported(key, data[plain]):
            out.append(key)
    return frozenset(out)


def caveats(verdict: str, reason: str | None = None) -> tuple[str, ...]:
    """The caveat texts that apply to a verdict (and reason), in a stable order."""
    names = [*CAVEATS_BY_VERDICT.get((verdict, None), ())]
    if reason is not None:
        names += CAVEATS_BY_VERDICT.get((verdict, reason), ())
    return tuple(EVIDENCE_CAVEATS[n] for n in dict.fromkeys(names))


# What a job's keys say it does: a reason it has no use for is not "cannot show". A job
# without the agent loop cannot compute a reward inside it; one that never calls a tool has
# no tool calls to be slow. Its first SHAPE_RECORDS records are looked at (verl writes the
# same keys every step).
AGENT_LOOP, TOOLS = "agent loop", "tools"
SHAPE_RECORDS = 64
NEEDS: Mapping[tuple[str, str], str] = {
    ("rollout", "tool_calls"): TOOLS,
    ("rollout", "reward_in_loop"): AGENT_LOOP,
}


def job_shape(data: Mapping[str, Any]) -> frozenset[str]:
    """AGENT_LOOP when a record has agent-loop keys, TOOLS when it has tool-call keys."""
    out = set()
    for key in data:
        if "agent_loop/" in key:
            out.add(AGENT_LOOP)
            if "tool_calls" in key:
                out.add(TOOLS)
                break
    return frozenset(out)


def missing_evidence(
    keys: Iterable[str], gaps: Iterable[tuple[str | None, str]] | None = None
) -> tuple[str, ...]:
    """For a job whose log has shown the verl `keys` (what `shown_evidence()` found in its
    records so far: reported values only; and its `job_shape()`), one line per reason that
    applies to it (NEEDS) and it cannot get because the
    evidence is never logged or never reported, and per key it logs that misleads. For `/`,
    the runbooks' readers and `diagnose`: what the job's verdicts cannot say.

    `gaps`: a job read from another framework's output, whose table says what it lacks in
    its own words, each as (the DECIDES key that would supply it, or None: nothing can, the
    words): one line per gap whose key the job has not shown; verl's lines are not its."""
    seen = set(keys)
    if gaps is not None:
        return tuple(
            words if key is None else f"{DECIDES[key]} cannot be seen: {words}"
            for key, words in gaps
            if key is None or key not in seen
        )
    out = []
    for (verdict, reason), key in REASON_EVIDENCE.items():
        need = NEEDS.get((verdict, reason))
        if key not in seen and (need is None or need in seen):
            out.append(
                f"{verdict}/{reason} cannot be seen: this job's log has no {key}"
                + _NOT_REPORTED_NOTE.get(key, "")
            )
    out += [text for key, text in UNRELIABLE_KEYS.items() if key in seen]
    return tuple(out)
