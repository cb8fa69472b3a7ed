"""The Prometheus rules (alerts/*.rules.yaml) and their runbooks (docs/runbooks.md).

Generated from the thresholds file's `alerts:` section, the decision table's verdicts and
reasons, the metric catalog and the "look at next" texts of `diagnosis.advice`: no threshold,
metric name or advice is typed twice. `rlhf-exporter render rules` writes the files;
`render --check` fails when the committed ones are stale.

Recording rules follow the `level:metric:operations` convention (Prometheus docs,
kubernetes-mixin). The level names the labels a series is kept by, beyond the scrape target's
own labels (`job`, `instance`, and `cluster`/`namespace`/`pod` where Prometheus adds them):

| name (default window 30m) | value |
|---|---|
| `project_experiment_group:rlhf_group_share:ratio_rate30m` | share of step time per group |
| `project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate30m` | fraction of classified steps per verdict |
| `project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:ratio_rate30m` | fraction of a verdict's steps per reason |
| `project_experiment:rlhf_steps:rate30m` | steps per second |
| `project_experiment_group:rlhf_regression_steps:increase30m` | steps that regressed group g |
| `project_experiment_kind:rlhf_change_steps:ratio_rate30m` | fraction of steps per change kind |
| `project_experiment:rlhf_tokens_per_step_second:ratio_rate30m` | tokens per second of step time |
| `instance_gpu:rlhf_gpu_busy:ratio_rate30m` | busy ratio per GPU |
| `instance:rlhf_gpu_busy:ratio_rate30m` | mean busy ratio of an exporter's GPUs |

The suffix follows the configured window (`alerts.window`). Rules never aggregate across
scrape targets (they use `without`), so the target labels survive for routing and joins.

`rule_groups(thresholds, scale)` scales every window and `for:` by `scale` (and the stall
test's step-time term with them): the live test runs the same rules 200 times faster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import yaml

from ..diagnosis import GROUPS, REASONS, Thresholds
from ..diagnosis.advice import LOOK_AT, REASON_MEANING, VERDICT_MEANING

ORDER = 20
RECORDING_FILE = "alerts/recording.rules.yaml"
DECISION_FILE = "alerts/decision-table.rules.yaml"
OPERATIONS_FILE = "alerts/operations.rules.yaml"
RUNBOOKS_FILE = "docs/runbooks.md"

BOUND_ALERTS: Mapping[str, str] = {
    "rollout": "RLHFJobRolloutBound",
    "reward": "RLHFJobRewardBound",
    "logprob": "RLHFJobLogprobBound",
    "update": "RLHFJobUpdateBound",
    "sync": "RLHFJobSyncBound",
    "other": "RLHFJobDriverOverheadBound",
}
"""One alert per row of the decision table. `checkpoint`, `balanced` and `unknown` have none."""
assert set(BOUND_ALERTS) == set(GROUPS) - {"checkpoint"}

SEVERITIES = ("critical", "warning", "info")
"""critical pages; warning goes to chat at any hour; info (bottlenecks) in working hours."""

# verl configuration keys to change, per verdict and reason (verl 0.9; older releases keep
# update_weights_bucket_megabytes directly under actor_rollout_ref.rollout).
VERL_KEYS: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("rollout", "preemption"): ("actor_rollout_ref.rollout.gpu_memory_utilization",
                                "actor_rollout_ref.rollout.max_num_seqs",
                                "actor_rollout_ref.rollout.max_num_batched_tokens"),
    ("rollout", "tool_calls"): ("actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
                                "actor_rollout_ref.rollout.multi_turn.tool_config_path",
                                "actor_rollout_ref.rollout.agent.num_workers"),
    ("rollout", "reward_in_loop"): ("custom_reward_function.path",
                                    "reward_model.reward_manager",
                                    "actor_rollout_ref.rollout.agent.num_workers"),
    ("rollout", "long_tail"): ("data.max_response_length",
                               "actor_rollout_ref.rollout.over_sample_rate",
                               "async_training.partial_rollout"),
    ("rollout", "generation"): ("actor_rollout_ref.rollout.tensor_model_parallel_size",
                                "actor_rollout_ref.rollout.max_num_batched_tokens",
                                "actor_rollout_ref.rollout.max_num_seqs",
                                "actor_rollout_ref.rollout.agent.num_workers"),
    ("update", "compute_bound"): ("trainer.n_gpus_per_node", "trainer.nnodes",
                                  "data.train_batch_size", "actor_rollout_ref.rollout.n"),
    ("update", "low_mfu"): ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                            "actor_rollout_ref.actor.use_dynamic_bsz",
                            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                            "actor_rollout_ref.actor.fsdp_config.param_offload",
                            "actor_rollout_ref.actor.fsdp_config.optimizer_offload"),
    ("update", "mfu_unknown"): ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                                "actor_rollout_ref.actor.use_dynamic_bsz",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
    ("logprob", "compute_bound"): ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                                   "trainer.n_gpus_per_node"),
    ("logprob", "low_mfu"): ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                             "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                             "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                             "actor_rollout_ref.ref.fsdp_config.param_offload"),
    ("logprob", "mfu_unknown"): ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                                 "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"),
    ("sync", "weight_sync"): ("actor_rollout_ref.rollout.checkpoint_engine.backend",
                              "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"),
    ("reward", "reward_model"): ("reward_model.micro_batch_size_per_gpu",
                                 "reward_model.use_dynamic_bsz",
                                 "reward_model.forward_max_token_len_per_gpu"),
    ("checkpoint", "checkpoint"): ("trainer.save_freq",
                                   "actor_rollout_ref.actor.checkpoint.save_contents"),
    ("other", "untimed"): ("trainer.balance_batch", "data.train_batch_size"),
    ("other", "driver_compute"): ("algorithm.adv_estimator", "trainer.balance_batch"),
}

# verl metric keys (the `file` logger's data) that confirm each verdict, beyond its timers.
VERL_EVIDENCE_KEYS: Mapping[str, tuple[str, ...]] = {
    "rollout": ("timing_s/agent_loop/num_preempted/max", "timing_s/agent_loop/slowest/tool_calls",
                "timing_s/agent_loop/slowest/compute_score",
                "timing_s/agent_loop/generate_sequences/max", "timing_s/agent_loop/generate_sequences/mean",
                "response_length/max", "response_length/mean"),
    "update": ("perf/mfu/actor", "perf/mfu/critic"),
    "logprob": ("perf/mfu/actor_infer",),
    "sync": (),
    "reward": (),
    "other": ("timing_s/step",),
}

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(text: str) -> float:
    """'10m' -> 600.0 (the thresholds file's duration syntax)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w)", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def duration(secs: float) -> str:
    """600.0 -> '10m'; fractions of a second become milliseconds ('1500ms')."""
    ms = round(secs * 1000)
    if ms <= 0:
        return "0s"
    for unit, size in (("h", 3600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _num(x: float) -> str:
    return f"{x:g}"


# ---------------------------------------------------------------------------------------------
# Go-template helpers for annotations (Prometheus expands them at each evaluation).

JOB_MATCH = 'project="%s",experiment="%s"'
JOB_ARGS = "$labels.project $labels.experiment"


def _tq(expr: str, fmt: str, args: str = JOB_ARGS, default: str = "n/a") -> str:
    """The first value of PromQL `expr` (its %s filled from `args`), formatted, or `default`."""
    return ("{{ with query (printf `" + expr + "` " + args + ") }}"
            "{{ . | first | value | " + fmt + " }}{{ else }}" + default + "{{ end }}")


JOB_NAME = "{{ $labels.project }}/{{ $labels.experiment }}"


# ---------------------------------------------------------------------------------------------

@dataclass
class Runbook:
    meaning: str
    confirm: list[str]  # PromQL, with P and E for the job's project and experiment
    verl_keys: list[str]  # verl metric keys to read in the job's log (or prose starting "the ")
    change: list[str]  # what to change: verl config keys and other actions (markdown)
    checks: list[str] = field(default_factory=list)  # more ways to confirm (markdown)


@dataclass
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    category: str
    summary: str
    description: str
    runbook: Runbook
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def rule(self, runbook_base: str) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, "category": self.category, **self.labels},
            "annotations": {"summary": self.summary, "description": self.description,
                            **self.annotations, "runbook_url": runbook_url(runbook_base, self.name)},
        }


def runbook_url(base: str, alert: str) -> str:
    return f"{base}#{anchor(alert)}"


def anchor(alert: str) -> str:
    """The runbook section's anchor (GitHub's anchor of a `## Name` heading)."""
    return alert.lower()


class Rules:
    """Every rule, for one thresholds document and one time scale."""

    def __init__(self, th: Thresholds, scale: float = 1.0):
        if scale <= 0:
            raise ValueError("scale must be positive")
        self.th = th
        self.a = th.alerts
        self.scale = scale
        self.window = self.dur("window")
        w = self.window
        self.share = f"project_experiment_group:rlhf_group_share:ratio_rate{w}"
        self.verdicts = f"project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate{w}"
        self.reasons = f"project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:ratio_rate{w}"
        self.step_rate = f"project_experiment:rlhf_steps:rate{w}"
        self.regressions = f"project_experiment_group:rlhf_regression_steps:increase{w}"
        self.changes = f"project_experiment_kind:rlhf_change_steps:ratio_rate{w}"
        self.tokens_rate = f"project_experiment:rlhf_tokens_per_step_second:ratio_rate{w}"
        self.gpu_busy = f"instance_gpu:rlhf_gpu_busy:ratio_rate{w}"
        self.gpus_busy = f"instance:rlhf_gpu_busy:ratio_rate{w}"

    def dur(self, key: str) -> str:
        return duration(seconds(self.a[key]) * self.scale)

    def secs(self, key: str) -> float:
        return seconds(self.a[key]) * self.scale

    # -- recording rules ----------------------------------------------------------------------

    def recording(self) -> list[dict[str, str]]:
        w = self.window

        def ratio(numerator: str, label: str) -> str:
            return (f"{numerator}\n/ ignoring ({label}) group_left ()\n"
                    f"(sum without ({label}) ({numerator}) > 0)")

        return [
            {"record": self.share,
             "expr": ratio(f"increase(rlhf_group_seconds_total[{w}])", "group")},
            {"record": self.verdicts,
             "expr": ratio(f"increase(rlhf_bottleneck_steps_total[{w}])", "verdict")},
            {"record": self.reasons,
             "expr": ratio(f"increase(rlhf_bottleneck_reason_steps_total[{w}])", "reason")},
            {"record": self.step_rate, "expr": f"rate(rlhf_steps_total[{w}])"},
            {"record": self.regressions, "expr": f"increase(rlhf_regression_steps_total[{w}])"},
            {"record": self.changes,
             "expr": ratio(f"increase(rlhf_change_steps_total[{w}])", "kind")},
            {"record": self.tokens_rate,
             "expr": f"rate(rlhf_tokens_total[{w}])\n/ (rate(rlhf_step_seconds_total[{w}]) > 0)"},
            {"record": self.gpu_busy, "expr": f"rate(rlhf_gpu_busy_seconds_total[{w}])"},
            {"record": self.gpus_busy,
             "expr": f"avg without (gpu, uuid) (rate(rlhf_gpu_busy_seconds_total[{w}]))"},
        ]

    # -- decision-table alerts ----------------------------------------------------------------

    def _reason_block(self, verdict: str) -> str:
        top = (f"topk(1, {self.reasons}{{verdict=\"{verdict}\",{JOB_MATCH}}})")
        branches = []
        for i, reason in enumerate(REASONS[verdict]):
            kw = "if" if i == 0 else "else if"
            look = LOOK_AT.get((verdict, reason), "")
            text = f": {REASON_MEANING[reason]}." + (f" Look next at: {look}." if look else "")
            branches.append(f'{{{{ {kw} eq $r "{reason}" }}}}{text}')
        chain = "".join(branches) + "{{ else }}.{{ end }}"
        return ("{{ with query (printf `" + top + "` " + JOB_ARGS + ") }}"
                "{{ $top := first . }}{{ $r := label \"reason\" $top }}"
                "Dominant reason: {{ $r }}, in {{ value $top | humanizePercentage }} of these steps"
                + chain + "{{ else }}Dominant reason: none counted in the window.{{ end }}")

    def _reason_annotation(self, verdict: str) -> str:
        top = f"topk(1, {self.reasons}{{verdict=\"{verdict}\",{JOB_MATCH}}})"
        return ("{{ with query (printf `" + top + "` " + JOB_ARGS + ") }}"
                "{{ . | first | label \"reason\" }}{{ else }}none{{ end }}")

    def _evidence(self, verdict: str) -> list[str]:
        w = self.window
        out = [f"the {verdict} window took "
               + _tq(f'{self.share}{{group="{verdict}",{JOB_MATCH}}}', "humanizePercentage")
               + " of step time"]
        mfu_threshold = f"{self.th.mfu_compute_bound:.0%}"
        if verdict == "rollout":
            gen = 'rlhf_agent_loop_seconds{part="generate_sequences",stat="%s",' + JOB_MATCH + "}"
            out.append("agent-loop generate_sequences max/mean "
                       + _tq(f"{gen % ('max', '%s', '%s')} / ignoring (stat) {gen % ('mean', '%s', '%s')}",
                             'printf "%.1f"', args=f"{JOB_ARGS} {JOB_ARGS}")
                       + f" (long tail at >= {_num(self.th.long_tail_generate_ratio)})")
            out.append("most preemptions of one sample "
                       + _tq(f"rlhf_agent_loop_preempted_max{{{JOB_MATCH}}}", "humanize"))
        elif verdict in ("update", "logprob"):
            stage = "actor" if verdict == "update" else "actor_infer"
            out.append(f"last step's MFU (perf/mfu/{stage}) "
                       + _tq(f'rlhf_mfu_ratio{{stage="{stage}",{JOB_MATCH}}}', "humanizePercentage")
                       + f" (compute-bound at >= {mfu_threshold}, 0 means unknown)")
        elif verdict == "other":
            out.append("untimed driver time is "
                       + _tq(f"increase(rlhf_untimed_seconds_total{{{JOB_MATCH}}}[{w}])"
                             f" / increase(rlhf_group_seconds_total{{group=\"other\",{JOB_MATCH}}}[{w}])",
                             "humanizePercentage")
                       + f" of the other window (untimed at >= {self.th.untimed_fraction:.0%})")
        return out

    def bound_alert(self, verdict: str) -> Alert:
        name = BOUND_ALERTS[verdict]
        w, frac = self.window, self.a["bound_fraction"]
        description = "\n".join([
            f"{{{{ $value | humanizePercentage }}}} of the classified steps of {JOB_NAME} in the last {w} "
            f"were {verdict}-bound: {VERDICT_MEANING[verdict]}.",
            self._reason_block(verdict),
            "Evidence: " + "; ".join(self._evidence(verdict)) + ".",
        ])
        timers = [f"timing_s/{t}" for t in self.th.document["groups"][verdict]]
        confirm = [
            f'{self.verdicts}{{project="P", experiment="E"}}',
            f'{self.reasons}{{verdict="{verdict}", project="P", experiment="E"}}',
            f'{self.share}{{project="P", experiment="E"}}',
        ]
        if verdict in ("update", "logprob"):
            confirm.append('rlhf_mfu_ratio{project="P", experiment="E"}')
        if verdict == "rollout":
            confirm.append('rlhf_agent_loop_seconds{project="P", experiment="E", part="generate_sequences"}')
        checks = ["`rlhf-exporter diagnose --summary <verl root>/P/E.jsonl`: the same table, "
                  "step by step, from the job's log"]
        change = []
        for reason in REASONS[verdict]:
            keys = ", ".join(f"`{k}`" for k in VERL_KEYS.get((verdict, reason), ()))
            look = LOOK_AT.get((verdict, reason), "")
            change.append(f"`{reason}` ({REASON_MEANING[reason]}): look at {look}" + (f"; {keys}" if keys else ""))
        return Alert(
            name=name,
            expr=f'{self.verdicts}{{verdict="{verdict}"}} >= {_num(frac)}',
            for_=self.dur("bound_for"), severity="info", category="bottleneck",
            summary=(f"{JOB_NAME} is {verdict}-bound in {{{{ $value | humanizePercentage }}}} "
                     "of its steps"),
            description=description,
            annotations={"reason": self._reason_annotation(verdict)},
            runbook=Runbook(
                meaning=(f"At least {_num(frac * 100)}% of the job's classified steps over the last {w} had the "
                         f"verdict `{verdict}`: the window that made the training loop wait longest was "
                         f"{VERDICT_MEANING[verdict]}. The alert's `reason` annotation is the dominant "
                         f"reason among those steps; the description shows the evidence and where to "
                         f"look next."),
                confirm=confirm,
                verl_keys=[*timers, *VERL_EVIDENCE_KEYS[verdict]],
                change=change, checks=checks,
            ),
        )

    def regression_alert(self) -> Alert:
        w, n = self.window, self.a["regression_min_steps"]
        cost = 'rlhf_group_cost_seconds_per_token{group="%s",' + JOB_MATCH + "}"
        base = 'rlhf_baseline_group_cost_seconds_per_token{group="%s",' + JOB_MATCH + "}"
        args = "$labels.group " + JOB_ARGS
        change = []
        for group in (g for g in GROUPS if g != "checkpoint"):
            keys = sorted({k for (v, _), ks in VERL_KEYS.items() if v == group for k in ks})
            change.append(f"`{group}`: " + ", ".join(f"`{k}`" for k in keys))
        return Alert(
            name="RLHFJobRegression",
            expr=f"{self.regressions} >= {_num(n)}",
            for_=self.dur("regression_for"), severity="warning", category="regression",
            summary=f"{JOB_NAME}: the {{{{ $labels.group }}}} window regressed",
            description=(
                f"{{{{ $value | humanize }}}} steps of {JOB_NAME} in the last {w} were a regression of the "
                "{{ $labels.group }} window: it costs more seconds per token than the job's own baseline, "
                "and more tokens per step do not explain it (a workload shift never counts here).\n"
                "Last step's cost " + _tq(cost, 'printf "%.3g"', args) + " s/token against a baseline of "
                + _tq(base, 'printf "%.3g"', args) + " s/token."),
            runbook=Runbook(
                meaning=("Steps of the job were labelled `regression` of group g (decision table §4): the "
                         "step got slower and the group that added the most seconds costs more per token "
                         "than the median of the job's recent steps. A workload shift (every window grew "
                         "with the token count) is counted apart and never fires this alert. A lasting "
                         f"regression is labelled for about half of `change.baseline_steps` steps, then "
                         f"becomes the job's new normal: the alert resolves {w} later even if nothing was "
                         "fixed, so compare the step time with the time before the alert."),
                confirm=[f'{self.regressions}{{project="P", experiment="E"}}',
                         'rlhf_group_cost_seconds_per_token{project="P", experiment="E"}',
                         'rlhf_baseline_group_cost_seconds_per_token{project="P", experiment="E"}',
                         f'{self.changes}{{project="P", experiment="E"}}'],
                verl_keys=["the regressed group's `timing_s/<timer>` keys", "perf/total_num_tokens", "timing_s/step"],
                change=["What changed in the job or its cluster when the alert started (image, verl "
                        "version, node, config)? Then, by regressed group:", *change],
            ),
        )

    def throughput_alert(self) -> Alert:
        w, ratio, ref = self.window, self.a["throughput_drop_ratio"], self.dur("throughput_reference")
        return Alert(
            name="RLHFJobThroughputBelowBaseline",
            expr=(f"{self.tokens_rate}\n  < {_num(ratio)} * max_over_time(rlhf_baseline_tokens_per_second[{ref}])\n"
                  f"unless ignoring (kind)\n  increase(rlhf_change_steps_total{{kind=\"workload_shift\"}}[{w}]) > 0"),
            for_=self.dur("throughput_drop_for"), severity="warning", category="throughput",
            summary=f"{JOB_NAME} runs far below its own baseline throughput",
            description=(
                f"{JOB_NAME} processed {{{{ $value | humanize }}}} tokens per second of step time over the last "
                f"{w}, below {ratio:.0%} of its best baseline over {ref} ("
                + _tq(f"max_over_time(rlhf_baseline_tokens_per_second{{{JOB_MATCH}}}[{ref}])", "humanize")
                + " tokens/s), and no step of the window was a workload shift."),
            runbook=Runbook(
                meaning=(f"The job's tokens per second of step time over {w} fell below "
                         f"{_num(ratio)} x the best value of its own baseline (median K/S' of recent steps) "
                         f"over the last {ref}, and no step in the window was a workload shift. "
                         "The exporter's baseline follows the job within about ten steps, so this alert "
                         "compares with the best recent baseline instead."),
                confirm=[f'{self.tokens_rate}{{project="P", experiment="E"}}',
                         f'max_over_time(rlhf_baseline_tokens_per_second{{project="P", experiment="E"}}[{ref}])',
                         f'{self.regressions}{{project="P", experiment="E"}}',
                         f'{self.verdicts}{{project="P", experiment="E"}}'],
                verl_keys=["perf/throughput", "perf/total_num_tokens", "timing_s/step"],
                change=["Find the group that grew: the verdict and regression recording rules above, or "
                        "`rlhf-exporter diagnose` on the job's log. Then follow that group's bound-alert "
                        "section of this runbook."],
            ),
        )

    # -- operational alerts -------------------------------------------------------------------

    def stalled_alert(self) -> Alert:
        factor = self.a["stall_factor"] * self.scale
        floor = self.secs("stall_min")
        limit = (f"clamp_min({_num(factor)} * rlhf_baseline_step_duration_seconds, {_num(floor)})\n"
                 f"    or 0 * rlhf_last_step_timestamp_seconds + {_num(floor)}")
        expr = (f"(time() - rlhf_last_step_timestamp_seconds)\n  > (\n    {limit}\n  )\n"
                "and on (job, instance) up == 1\n"
                "unless on (job, instance) (\n"
                "  count by (job, instance) (rlhf_ray_actors)\n"
                "  unless on (job, instance) (rlhf_ray_actors{state=\"ALIVE\"} > 0)\n)")
        stall_min, f_ = self.a["stall_min"], self.a["stall_factor"]
        return Alert(
            name="RLHFJobStalled", expr=expr, for_=self.dur("stall_for"), severity="critical",
            category="job",
            summary=f"{JOB_NAME} has made no step for {{{{ $value | humanizeDuration }}}}",
            description=(
                f"No new step of {JOB_NAME} for {{{{ $value | humanizeDuration }}}} (limit: "
                f"max({_num(f_)} x its baseline step time of "
                + _tq(f"rlhf_baseline_step_duration_seconds{{{JOB_MATCH}}}", "humanizeDuration", default="unknown")
                + f", {stall_min})) while its exporter {{{{ $labels.instance }}}} is up. "
                "An NCCL hang ends in ActorDiedError only after actor_rollout_ref.nccl_timeout (600 s)."),
            runbook=Runbook(
                meaning=(f"The exporter is up and still exports the job, but no new step arrived for longer "
                         f"than max({_num(f_)} x the job's baseline step time, {stall_min}). This is the "
                         "main page: a hung collective (NCCL) blocks every rank silently. A job that "
                         "finished does not page once the exporter stops exporting it (a sidecar ends with "
                         "its job; a shared exporter drops it after `--job-expiry`), and where the exporter "
                         "watches Ray, a cluster with no ALIVE actor left means the job ended: no page. "
                         "A shared exporter without Ray access cannot tell a finished job from a hung one "
                         "until `--job-expiry`: silence the alert for the job, or give the exporter Ray."),
                confirm=['time() - rlhf_last_step_timestamp_seconds{project="P", experiment="E"}',
                         'rlhf_baseline_step_duration_seconds{project="P", experiment="E"}',
                         'rlhf_ray_actors{state!="ALIVE"}'],
                checks=["`rlhf_gpu_utilization_ratio`: near 100% on every GPU of a hung NCCL "
                        "collective, near 0% on an idle wait"],
                verl_keys=["the last line of the job's `file` logger JSONL (its `step`)",
                           "the driver's stdout (TaskRunner) for the last timer printed"],
                change=["`ray stack` / py-spy dump on the driver and a worker: a frame in an NCCL "
                        "collective or in `ray.get` tells which side waits.",
                        "`actor_rollout_ref.nccl_timeout` (seconds): lower it so a hung collective "
                        "fails fast instead of holding the GPUs.",
                        "`trainer.save_freq` and `trainer.resume_mode=auto`: lose less work when the job "
                        "must be restarted."],
            ),
        )

    def _counter_increase(self, metric: str, window: str, without: str | None = None) -> str:
        """Increase over `window`, counting a series that appeared within it from 0 (a counter
        that starts at its first event would otherwise lose that event)."""
        inner = f"({metric} unless {metric} offset {window})\n  or increase({metric}[{window}])"
        if without:
            return f"sum without ({without}) (\n  {inner}\n) > 0"
        return f"(\n  {inner}\n) > 0"

    def actors_died_alert(self) -> Alert:
        win = self.dur("actors_window")
        return Alert(
            name="RLHFRayActorsDied",
            expr=self._counter_increase("rlhf_ray_actor_deaths_total", win, "reason"),
            for_=self.dur("actors_dead_for"), severity="critical", category="ray",
            summary="{{ $value | humanize }} Ray actors of role {{ $labels.role }} died on {{ $labels.instance }}",
            description=(
                f"{{{{ $value | humanize }}}} actors of role {{{{ $labels.role }}}} became DEAD in the last {win} "
                "on the Ray cluster that {{ $labels.instance }} watches. Deaths by reason: "
                "{{ with query (printf `increase(rlhf_ray_actor_deaths_total{role=\"%s\",instance=\"%s\"}"
                f"[{win}])` $labels.role $labels.instance) }}}}{{{{ range . }}}}{{{{ .Labels.reason }}}}={{{{ .Value | humanize }}}} "
                "{{ end }}{{ else }}n/a{{ end }}."),
            runbook=Runbook(
                meaning=("Ray reported actors of the job's cluster as DEAD: a worker crashed, ran out of "
                         "memory, lost its node, or an NCCL timeout ended it. A verl job usually fails "
                         "with it."),
                confirm=[f"increase(rlhf_ray_actor_deaths_total[{win}])",
                         'rlhf_ray_actors{state="DEAD"}'],
                checks=["`ray list actors --filter state=DEAD --detail` (their death_cause)"],
                verl_keys=["the driver's stderr: ActorDiedError, OOM, NCCL watchdog messages"],
                change=["OOM: `actor_rollout_ref.rollout.gpu_memory_utilization`, "
                        "`actor_rollout_ref.actor.fsdp_config.param_offload`, "
                        "`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`.",
                        "Resume: `trainer.resume_mode=auto` restarts from the last checkpoint "
                        "(`trainer.save_freq`)."],
            ),
        )

    def actors_restarting_alert(self) -> Alert:
        win = self.dur("actors_window")
        return Alert(
            name="RLHFRayActorsRestarting",
            expr=self._counter_increase("rlhf_ray_actor_restarts_total", win),
            for_=self.dur("actors_restarting_for"), severity="warning", category="ray",
            summary="Ray actors of role {{ $labels.role }} restarted on {{ $labels.instance }}",
            description=(f"{{{{ $value | humanize }}}} restarts of Ray actors of role {{{{ $labels.role }}}} in "
                         f"the last {win} on the cluster that {{{{ $labels.instance }}}} watches. A restarted "
                         "verl worker loses its state: the step in flight is lost or repeated."),
            runbook=Runbook(
                meaning="Ray restarted actors (their `num_restarts` grew): they crashed and Ray brought them back.",
                confirm=[f"increase(rlhf_ray_actor_restarts_total[{win}])",
                         'rlhf_ray_actors{state="RESTARTING"}'],
                verl_keys=["the driver's and the worker's logs around the restart"],
                change=["Find why the actor crashed (OOM, node loss): the same keys as "
                        "[RLHFRayActorsDied](#rlhfrayactorsdied)."],
            ),
        )

    def actors_pending_alert(self) -> Alert:
        return Alert(
            name="RLHFRayActorsPending",
            expr='rlhf_ray_actors{state="PENDING_CREATION"} > 0',
            for_=self.dur("pending_for"), severity="warning", category="ray",
            summary="{{ $value | humanize }} Ray actors of role {{ $labels.role }} cannot be placed",
            description=(f"{{{{ $value | humanize }}}} actors of role {{{{ $labels.role }}}} have been in "
                         f"PENDING_CREATION for {self.a['pending_for']} on the cluster that "
                         "{{ $labels.instance }} watches: Ray cannot find the resources they ask for."),
            runbook=Runbook(
                meaning="Actors wait for resources (GPUs, memory, a placement group) that no node offers.",
                confirm=['rlhf_ray_actors{state="PENDING_CREATION"}'],
                checks=["`ray status` (pending demands)",
                        "`kubectl get pods` of the RayCluster (Pending worker pods)"],
                verl_keys=[],
                change=["`trainer.n_gpus_per_node` and `trainer.nnodes` must match the cluster's GPU nodes; "
                        "`actor_rollout_ref.rollout.tensor_model_parallel_size` must divide them."],
            ),
        )

    def gpus_idle_alert(self) -> Alert:
        w, ratio = self.window, self.a["gpu_idle_ratio"]
        return Alert(
            name="RLHFGPUsIdleWhileStepping",
            expr=(f"{self.gpus_busy} < {_num(ratio)}\n"
                  f"and on (job, instance)\n  sum by (job, instance) ({self.step_rate}) > 0"),
            for_=self.dur("gpu_idle_for"), severity="warning", category="gpu",
            summary="GPUs on {{ $labels.instance }} are busy {{ $value | humanizePercentage }} of the time while steps progress",
            description=(f"The GPUs that {{{{ $labels.instance }}}} watches were busy {{{{ $value | humanizePercentage }}}} "
                         f"of the last {w} (below {ratio:.0%}) while its verl jobs kept making steps: the loop "
                         "waits on something other than these GPUs."),
            runbook=Runbook(
                meaning=(f"The mean NVML busy ratio of an exporter's GPUs over {w} is below {_num(ratio)} while "
                         "the jobs it exports make steps: most of the step time is spent off these GPUs "
                         "(CPU reward, tools, data movement, a remote rollout)."),
                confirm=[f"{self.gpu_busy}", f'{self.verdicts}{{project="P", experiment="E"}}'],
                verl_keys=["the job's `timing_s/*` (which window is long)"],
                change=["Follow the bound alert of the job's verdict. Idle GPUs in a rollout-bound job: "
                        "`actor_rollout_ref.rollout.agent.num_workers`, "
                        "`actor_rollout_ref.rollout.multi_turn.max_parallel_calls`; in a driver-bound "
                        "job: `trainer.balance_batch`."],
            ),
        )

    def collector_down_alert(self) -> Alert:
        return Alert(
            name="RLHFExporterCollectorDown",
            expr="rlhf_exporter_collector_up == 0",
            for_=self.dur("collector_down_for"), severity="warning", category="exporter",
            summary="Collector {{ $labels.collector }} of {{ $labels.instance }} is down",
            description=("The {{ $labels.collector }} collector of the exporter {{ $labels.instance }} has failed "
                         f"every collection for {self.a['collector_down_for']} (up {{{{ $value }}}}); its series are missing. "
                         "Errors by reason: {{ with query (printf "
                         "`rlhf_exporter_collector_errors_total{collector=\"%s\",instance=\"%s\"}` "
                         "$labels.collector $labels.instance) }}{{ range . }}{{ .Labels.reason }}={{ .Value | humanize }} "
                         "{{ end }}{{ else }}none counted{{ end }}."),
            runbook=Runbook(
                meaning=("A source of the exporter (verl files, push, Ray, NVML) fails. Its series are "
                         "dropped, so alerts that need them (stalled, actors, GPUs) cannot fire."),
                confirm=['rlhf_exporter_collector_up == 0', "rlhf_exporter_collector_errors_total"],
                checks=["the exporter's log: one line per problem"],
                verl_keys=[],
                change=["verl: `trainer.logger` must include `\"file\"`, and `VERL_FILE_LOGGER_ROOT` must be "
                        "the volume the exporter reads as `--verl-root`.",
                        "ray: the exporter's Ray address and dashboard port; nvml: the NVIDIA driver "
                        "mounted into the exporter's container."],
            ),
        )

    def collector_stale_alert(self) -> Alert:
        after = self.secs("collector_stale_after")
        return Alert(
            name="RLHFExporterCollectorStale",
            expr=f"time() - rlhf_exporter_collector_last_success_timestamp_seconds > {_num(after)}",
            for_=self.dur("collector_down_for"), severity="warning", category="exporter",
            summary="Collector {{ $labels.collector }} of {{ $labels.instance }} last succeeded {{ $value | humanizeDuration }} ago",
            description=("The {{ $labels.collector }} collector of {{ $labels.instance }} last succeeded "
                         f"{{{{ $value | humanizeDuration }}}} ago (limit {self.a['collector_stale_after']}): "
                         "what it exports is old."),
            runbook=Runbook(
                meaning=("A collector that once succeeded has not succeeded since. A collector that never "
                         "succeeded has no last-success series: only RLHFExporterCollectorDown covers it."),
                confirm=["time() - rlhf_exporter_collector_last_success_timestamp_seconds",
                         "rlhf_exporter_collector_duration_seconds"],
                verl_keys=[],
                change=["As for [RLHFExporterCollectorDown](#rlhfexportercollectordown); a poll that hangs "
                        "(a slow Ray dashboard, a stuck NFS mount) shows here first."],
            ),
        )

    def exporter_down_alert(self) -> Alert:
        sel = self.a["exporter_selector"]
        return Alert(
            name="RLHFExporterDown",
            expr=f"up{{{sel}}} == 0",
            for_=self.dur("exporter_down_for"), severity="warning", category="exporter",
            summary="Prometheus cannot scrape the exporter {{ $labels.instance }}",
            description=("Prometheus has failed to scrape {{ $labels.instance }} (job {{ $labels.job }}) for "
                         f"{self.a['exporter_down_for']} (up {{{{ $value }}}}): the jobs it watches are not monitored, and their "
                         "stall alerts cannot fire."),
            runbook=Runbook(
                meaning="A scrape target of the exporter is down: the process, its pod or the network.",
                confirm=[f"up{{{sel}}}"], checks=["Prometheus' `/targets` page: the scrape error"],
                verl_keys=[],
                change=["The exporter's pod and log; `--listen` must be reachable from Prometheus "
                        "(the default 127.0.0.1 is not: use the chart, which listens on the pod IP)."],
            ),
        )

    def exporter_absent_alert(self) -> Alert:
        sel = self.a["exporter_selector"]
        return Alert(
            name="RLHFExporterAbsent",
            expr=f"absent(up{{{sel}}})",
            for_=self.dur("exporter_down_for"), severity="warning", category="exporter",
            summary="Prometheus scrapes no rlhf-exporter at all",
            description=(f"No target matching up{{{sel}}} has existed for {self.a['exporter_down_for']}: no verl "
                         "job is monitored and no alert of this file can fire."),
            runbook=Runbook(
                meaning=("Prometheus has no exporter target: the exporter is not deployed, or service "
                         "discovery (ServiceMonitor, scrape config) does not find it, or the scrape job is "
                         "named differently from `alerts.exporter_selector`."),
                confirm=[f"up{{{sel}}}"], checks=["Prometheus' `/service-discovery` page"],
                verl_keys=[],
                change=["The chart's ServiceMonitor labels must match the Prometheus' selector; set "
                        "`alerts.exporter_selector` in the thresholds file to the scrape job's name and "
                        "run `rlhf-exporter render rules`. Where exporters run only as sidecars of jobs, "
                        "silence this alert while no job runs."],
            ),
        )

    # -- groups -------------------------------------------------------------------------------

    def decision_alerts(self) -> list[Alert]:
        return ([self.bound_alert(v) for v in BOUND_ALERTS]
                + [self.regression_alert(), self.throughput_alert()])

    def operations_alerts(self) -> list[Alert]:
        return [self.stalled_alert(), self.actors_died_alert(), self.actors_restarting_alert(),
                self.actors_pending_alert(), self.gpus_idle_alert(), self.collector_down_alert(),
                self.collector_stale_alert(), self.exporter_down_alert(), self.exporter_absent_alert()]

    def alerts(self) -> list[Alert]:
        return self.decision_alerts() + self.operations_alerts()

    def groups(self) -> dict[str, list[dict[str, Any]]]:
        base = self.a["runbook_url"]
        return {
            RECORDING_FILE: [{"name": "rlhf-exporter.recording", "rules": self.recording()}],
            DECISION_FILE: [{"name": "rlhf-exporter.decision-table",
                             "rules": [a.rule(base) for a in self.decision_alerts()]}],
            OPERATIONS_FILE: [{"name": "rlhf-exporter.operations",
                               "rules": [a.rule(base) for a in self.operations_alerts()]}],
        }


def rule_groups(thresholds: Thresholds, scale: float = 1.0) -> dict[str, list[dict[str, Any]]]:
    """{relative path: [rule groups]}; `scale` < 1 shortens every window and `for:`."""
    return Rules(thresholds, scale).groups()


# ---------------------------------------------------------------------------------------------
# YAML output

class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100000)


HEADER = ("# Generated by `rlhf-exporter render rules` from exporter/thresholds.yaml (alerts:).\n"
          "# Do not edit: change the thresholds file and run the command again.\n")


def rule_files(thresholds: Thresholds, scale: float = 1.0) -> dict[str, str]:
    return {path: HEADER + dump({"groups": groups})
            for path, groups in rule_groups(thresholds, scale).items()}


# ---------------------------------------------------------------------------------------------
# docs/runbooks.md

def runbooks_markdown(thresholds: Thresholds) -> str:
    r = Rules(thresholds)
    out = ["# Runbooks",
           "",
           "<!-- Generated by `rlhf-exporter render rules` from exporter/render/rules.py, "
           "exporter/thresholds.yaml and exporter/diagnosis/advice.py. Do not edit. -->",
           "",
           "One section per alert of `alerts/*.rules.yaml`; each alert's `runbook_url` points at its "
           "section. In the queries, `P` and `E` stand for the job's `project` and `experiment` labels. "
           "Severity `critical` pages; `warning` goes to chat at any hour; `info` (which window a job "
           "waits on) goes to the owning team's chat in working hours "
           "(`alerts/alertmanager.example.yaml`). Thresholds live in `exporter/thresholds.yaml` "
           "(`alerts:`); change them there and run `rlhf-exporter render rules`.",
           "",
           "## Recording rules",
           "",
           f"Per job, over `alerts.window` ({r.window}), kept by the scrape target's labels:",
           "",
           "| record | expression |",
           "|---|---|"]
    for rec in r.recording():
        expr = rec["expr"].replace("\n", " ").replace("|", "\\|")
        out.append(f"| `{rec['record']}` | `{expr}` |")
    out += ["", "## Alerts", "", "| alert | severity | for | |", "|---|---|---|---|"]
    alerts = r.alerts()
    for a in alerts:
        out.append(f"| [{a.name}](#{anchor(a.name)}) | {a.severity} | {a.for_} | {a.category} |")
    for a in alerts:
        rb = a.runbook
        out += ["", f"## {a.name}", "",
                f"Severity `{a.severity}`, fires after `{a.for_}`.", "",
                "**Meaning.** " + rb.meaning, "",
                "**Rule.**", "", "```promql", a.expr, "```", "",
                "**Confirm.**", ""]
        out += [f"- `{q}`" for q in rb.confirm] + [f"- {c}" for c in rb.checks]
        if rb.verl_keys:
            out += ["- in verl's log and output: " + ", ".join(
                k if k.startswith("the ") else f"`{k}`" for k in rb.verl_keys)]
        out += ["", "**What to change.**", ""]
        out += [f"- {c}" for c in rb.change]
    return "\n".join(out) + "\n"


def targets(thresholds: Thresholds) -> dict[str, str]:
    return {**rule_files(thresholds), RUNBOOKS_FILE: runbooks_markdown(thresholds)}
