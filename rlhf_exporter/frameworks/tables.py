"""What each framework logs per step, as data: its windows, the decision-table timer each
counts as, which windows nest inside others, its step total, and its work measures.

`translate.py` turns a framework's step into a verl-keyed record with these tables, so the
decision table and its contract rules apply unchanged. docs/frameworks.md says where each key
comes from in the framework's own source.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

VERL = "verl"
OPENRLHF = "openrlhf"
AREAL = "areal"
NEMO_RL = "nemo_rl"
SLIME = "slime"
ROLL = "roll"


class Window(NamedTuple):
    """One timer of the framework, in seconds."""

    key: str  # the framework's key, as its metrics dict (and TensorBoard) spells it
    # the verl timer it counts as (windows of one timer add up); None: a container, its own
    # rest untimed
    timer: str | None
    inside: str | None = None  # the key of the window it runs inside (taken out of that one)


class Framework(NamedTuple):
    """How one framework's step reads as verl's."""

    name: str
    # keys under these prefixes are timers: a timer not in `windows` is unnamed (clipped,
    # decision table section 2), one in `not_windows` is no window of the step
    timer_prefixes: tuple[str, ...]
    windows: tuple[Window, ...]
    # the step total's key; None: the windows run one after another, S is their sum
    step_total: str | None
    not_windows: frozenset[str] = frozenset()
    # verl key -> the framework's key for the same value (tokens, lengths, MFU, GPUs)
    values: Mapping[str, str] = MappingProxyType({})
    # K (perf/total_num_tokens) as the product of these keys, when no key holds it
    tokens_product: tuple[str, ...] = ()
    # keys whose value measured the step before the one it is logged with
    lagged: frozenset[str] = frozenset()
    # the prefix a TensorBoard tag carries that the metrics dict does not (stripped)
    tensorboard_prefix: str = ""
    # added to a TensorBoard event's step to number it as the console does
    tensorboard_step_offset: int = 0
    # the Ray actor classes whose stdout holds its printed steps (serve's console route);
    # none where its driver prints them
    actor_classes: tuple[str, ...] = ()
    # a key under `timer_prefixes` is a timer only when it ends so (slime's perf/ also
    # holds rates and counts)
    timer_suffix: str = ""
    # what its output cannot show, in its own keys: (the verl key that would supply it, one
    # of diagnosis.advice.DECIDES, or None when nothing can; the words), listed while the
    # job has not shown that key (advice.missing_evidence)
    cannot_show: tuple[tuple[str | None, str], ...] = ()


def _values(**pairs: str) -> Mapping[str, str]:
    return MappingProxyType({k.replace("__", "/"): v for k, v in pairs.items()})


TABLES: Mapping[str, Framework] = MappingProxyType(
    {
        OPENRLHF: Framework(
            name=OPENRLHF,
            timer_prefixes=("timing/",),
            windows=(
                Window("timing/generation", "gen"),
                # the experience maker: reference and policy log-probs, reward, advantages
                Window("timing/make_experience", "old_log_prob"),
                Window("timing/ppo_train", "update_actor"),
                Window("timing/broadcast", "update_weights"),
            ),
            step_total="timing/step_total",
            values=_values(response_length__mean="rollout/response_length_mean"),
            # the step's samples x their mean prompt + response length (the actor's status)
            tokens_product=("rollout/num_samples", "total_length"),
            tensorboard_prefix="train/",
            # the PPO trainer actor; the async trainer's training actor
            actor_classes=("PPOTrainer", "TrainingActor"),
            cannot_show=(
                (
                    None,
                    "the split of OpenRLHF's timing/make_experience into reward model, critic "
                    "values and reference and actor log-probs: one window, counted as logprob",
                ),
                (
                    None,
                    "the untimed remainder (other/untimed): the synchronous trainer's "
                    "timing/step_total is the sum of its timing/* windows",
                ),
                (
                    "perf/mfu/actor",
                    "OpenRLHF logs no MFU: timing/ppo_train's reason is mfu_unknown",
                ),
                (
                    "perf/mfu/actor_infer",
                    "OpenRLHF logs no MFU: timing/make_experience's reason is mfu_unknown",
                ),
                (
                    "response_length/max",
                    "OpenRLHF logs mean lengths only (rollout/response_length_mean, "
                    "total_length), no longest response",
                ),
            ),
        ),
        AREAL: Framework(
            name=AREAL,
            timer_prefixes=("timeperf/",),
            windows=(
                Window("timeperf/rollout", "gen"),
                Window("timeperf/recompute_logp", "old_log_prob"),
                Window("timeperf/ref_logp", "ref"),
                # distillation's teacher: another frozen model's log-probs, beside the reference
                Window("timeperf/teacher_logp", "ref"),
                Window("timeperf/critic_values", "values"),
                Window("timeperf/train_step", "update_actor"),
                Window("timeperf/critic_train_step", "update_critic"),
                Window("timeperf/update_weights", "update_weights"),
                Window("timeperf/compute_advantage", "adv"),
                Window("timeperf/save", "save_checkpoint"),
                Window("timeperf/checkpoint_for_recover", "save_checkpoint"),
            ),
            step_total=None,
            not_windows=frozenset(("timeperf/eval",)),
            # its TensorBoard step is the 0-based global step; it prints global step + 1
            tensorboard_step_offset=1,
            # the actor's token-count denominator, summed over the batch (ppo/actor.py)
            values=_values(perf__total_num_tokens="ppo_actor/n_tokens"),
            cannot_show=(
                (
                    None,
                    "the untimed remainder (other/untimed): AReaL times no whole step, so the "
                    "step's time is the sum of its timeperf/* windows",
                ),
                (
                    "perf/mfu/actor",
                    "AReaL logs no MFU: timeperf/train_step's reason is mfu_unknown",
                ),
                (
                    "perf/mfu/actor_infer",
                    "AReaL logs no MFU: timeperf/recompute_logp's and timeperf/ref_logp's "
                    "reason is mfu_unknown",
                ),
                (
                    "response_length/max",
                    "AReaL logs the longest sequence with its prompt (ppo_actor/seq_len/max), "
                    "no longest response",
                ),
            ),
        ),
        NEMO_RL: Framework(
            name=NEMO_RL,
            timer_prefixes=("timing/train/",),
            windows=(
                Window("timing/train/generation", "gen"),
                Window("timing/train/exposed_generation", "gen"),
                Window("timing/train/policy_and_reference_logprobs", "old_log_prob"),
                Window("timing/train/logprob_inference_prep", "old_log_prob"),
                Window("timing/train/policy_training", "update_actor"),
                Window("timing/train/training_prep", "update_actor"),
                Window("timing/train/prepare_for_generation/total", None),
                Window(
                    "timing/train/prepare_for_generation/transfer_and_update_weights",
                    "update_weights",
                    inside="timing/train/prepare_for_generation/total",
                ),
                Window("timing/train/reward_calculation", "reward"),
                Window("timing/train/checkpointing", "save_checkpoint"),
                # async GRPO: the refit bubble holds the weight transfer
                Window("timing/train/idle/refit_bubble", None),
                Window(
                    "timing/train/weight_sync",
                    "update_weights",
                    inside="timing/train/idle/refit_bubble",
                ),
            ),
            step_total="timing/train/total_step_time",
            # a rate logged with the timers; and timers nested in a named window
            not_windows=frozenset(
                (
                    "timing/train/valid_tokens_per_sec_per_gpu",
                    "timing/train/idle/buffer_starvation",
                    "timing/train/recompute_kv_scales",
                )
            ),
            values=_values(perf__total_num_tokens="train/total_num_tokens"),
            # its printed steps hold no token count: E2E tokens/s (per group) x the step time
            tokens_product=("console:e2e_tokens_per_sec", "timing/train/total_step_time"),
            cannot_show=(
                (
                    "perf/mfu/actor",
                    "NeMo-RL's training FLOPs utilization (performance/train_fp_utilization, "
                    "when the policy reports its FLOPs) is not read: policy_training's reason "
                    "is mfu_unknown",
                ),
                (
                    "perf/mfu/actor_infer",
                    "NeMo-RL reports no FLOPs utilization of policy_and_reference_logprobs",
                ),
                (
                    "response_length/max",
                    "NeMo-RL logs mean lengths only (mean_gen_tokens_per_sample), no longest "
                    "response",
                ),
            ),
        ),
        SLIME: Framework(
            name=SLIME,
            timer_prefixes=("perf/",),
            windows=(
                Window("perf/rollout_time", "gen"),
                Window("perf/log_probs_time", "old_log_prob"),
                Window("perf/ref_log_probs_time", "ref"),
                Window("perf/actor_train_time", "update_actor"),
                Window("perf/update_weights_time", "update_weights"),
                Window("perf/save_model_time", "save_checkpoint"),
            ),
            step_total="perf/step_time",
            # the two parts of perf/step_time
            not_windows=frozenset(("perf/train_wait_time", "perf/train_time")),
            # slime logs no token count: its trainer's tokens/s times its train time is one
            tokens_product=("perf/actor_train_tok_per_s", "perf/actor_train_time"),
            timer_suffix="_time",
            cannot_show=(
                (
                    "perf/mfu/actor",
                    "slime logs no MFU, only perf/actor_train_tflops: perf/actor_train_time's "
                    "reason is mfu_unknown",
                ),
                (
                    "perf/mfu/actor_infer",
                    "slime logs no MFU, only perf/log_probs_tflops and perf/ref_log_probs_tflops",
                ),
                (
                    "response_length/max",
                    "slime's rollout/response_len/max is not read as the longest response",
                ),
            ),
        ),
        ROLL: Framework(
            name=ROLL,
            timer_prefixes=("time/",),
            windows=(
                Window("time/step_generate", "gen"),
                Window("time/old_log_probs", "old_log_prob"),
                Window("time/ref_log_probs_values", "ref"),
                Window("time/step_train", "update_actor"),
                Window("time/step_model_update", "update_weights"),
            ),
            step_total="time/step_total",
            # the pipeline logs the step's total with the next step's metrics
            lagged=frozenset(("time/step_total",)),
            cannot_show=(
                (
                    "perf/total_num_tokens",
                    "ROLL's RLVR pipeline logs no token count per step: every step's change "
                    "is none",
                ),
                (
                    None,
                    "the run's last step: ROLL logs a step's time/step_total with the next "
                    "step's metrics, so the last one is never timed",
                ),
                ("perf/mfu/actor", "ROLL logs no MFU: time/step_train's reason is mfu_unknown"),
                (
                    "perf/mfu/actor_infer",
                    "ROLL logs no MFU: time/old_log_probs' and time/ref_log_probs_values' reason "
                    "is mfu_unknown",
                ),
            ),
        ),
    }
)

ACTOR_FRAMEWORKS: Mapping[str, str] = MappingProxyType(
    {c: fw.name for fw in TABLES.values() for c in fw.actor_classes}
)
"""The framework by the Ray actor class that prints its steps."""

FRAMEWORKS = (VERL, *TABLES)
"""Every framework read, verl first (its records are verl's own: the identity)."""


def cannot_show(framework: str | None) -> tuple[tuple[str | None, str], ...] | None:
    """What a job read from `framework`'s output cannot show (its table's words); None for
    verl's own records and an unknown framework (verl's lines apply)."""
    fw = TABLES.get(framework) if framework is not None else None
    return fw.cannot_show if fw is not None else None
