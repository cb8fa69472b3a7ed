"""One alert per decision-table row, the regression alert and the throughput alert."""

from __future__ import annotations

from ...diagnosis import GROUPS, REASONS
from ...diagnosis.advice import LOOK_AT, REASON_MEANING, VERDICT_MEANING
from .model import BOUND_ALERTS, JOB_ARGS, JOB_MATCH, JOB_NAME, Alert, Runbook, _num, _tq
from .verl_keys import VERL_EVIDENCE_KEYS, VERL_KEYS


class DecisionAlerts:
    """Mixed into `Rules`: what the decision table says about a job over the window."""

    def _reason_block(self, verdict: str) -> str:
        top = f'topk(1, {self.reasons}{{verdict="{verdict}",{JOB_MATCH}}})'
        branches = []
        for i, reason in enumerate(REASONS[verdict]):
            kw = "if" if i == 0 else "else if"
            look = LOOK_AT.get((verdict, reason), "")
            text = f": {REASON_MEANING[reason]}." + (f" Look next at: {look}." if look else "")
            branches.append(f'{{{{ {kw} eq $r "{reason}" }}}}{text}')
        chain = "".join(branches) + "{{ else }}.{{ end }}"
        return (
            "{{ with query (printf `" + top + "` " + JOB_ARGS + ") }}"
            '{{ $top := first . }}{{ $r := label "reason" $top }}'
            "Dominant reason: {{ $r }}, in {{ value $top | humanizePercentage }} of these steps"
            + chain
            + "{{ else }}Dominant reason: none counted in the window.{{ end }}"
        )

    def _reason_annotation(self, verdict: str) -> str:
        top = f'topk(1, {self.reasons}{{verdict="{verdict}",{JOB_MATCH}}})'
        return (
            "{{ with query (printf `" + top + "` " + JOB_ARGS + ") }}"
            '{{ . | first | label "reason" }}{{ else }}none{{ end }}'
        )

    def _evidence(self, verdict: str) -> list[str]:
        w = self.window
        out = [
            f"the {verdict} window took "
            + _tq(f'{self.share}{{group="{verdict}",{JOB_MATCH}}}', "humanizePercentage")
            + " of step time"
        ]
        mfu_threshold = f"{self.th.mfu_compute_bound:.0%}"
        if verdict == "rollout":
            gen = 'rlhf_agent_loop_seconds{part="generate_sequences",stat="%s",' + JOB_MATCH + "}"
            out.append(
                "agent-loop generate_sequences max/mean "
                + _tq(
                    f"{gen % ('max', '%s', '%s')} / ignoring (stat) {gen % ('mean', '%s', '%s')}",
                    'printf "%.1f"',
                    args=f"{JOB_ARGS} {JOB_ARGS}",
                )
                + f" (long tail at >= {_num(self.th.long_tail_generate_ratio)})"
            )
            out.append(
                "most preemptions of one sample "
                + _tq(f"rlhf_agent_loop_preempted_max{{{JOB_MATCH}}}", "humanize")
            )
        elif verdict in ("update", "logprob"):
            stage = "actor" if verdict == "update" else "actor_infer"
            out.append(
                f"last step's MFU (perf/mfu/{stage}) "
                + _tq(f'rlhf_mfu_ratio{{stage="{stage}",{JOB_MATCH}}}', "humanizePercentage")
                + f" (compute-bound at >= {mfu_threshold}, 0 means unknown)"
            )
        elif verdict == "other":
            out.append(
                "untimed driver time is "
                + _tq(
                    f"increase(rlhf_untimed_seconds_total{{{JOB_MATCH}}}[{w}])"
                    f' / increase(rlhf_group_seconds_total{{group="other",{JOB_MATCH}}}[{w}])',
                    "humanizePercentage",
                )
                + f" of the other window (untimed at >= {self.th.untimed_fraction:.0%})"
            )
        return out

    def bound_alert(self, verdict: str) -> Alert:
        name = BOUND_ALERTS[verdict]
        w, frac = self.window, self.a["bound_fraction"]
        description = "\n".join(
            [
                f"{{{{ $value | humanizePercentage }}}} of the classified steps of {JOB_NAME} in the last {w} "
                f"were {verdict}-bound: {VERDICT_MEANING[verdict]}.",
                self._reason_block(verdict),
                "Evidence: " + "; ".join(self._evidence(verdict)) + ".",
            ]
        )
        timers = [f"timing_s/{t}" for t in self.th.document["groups"][verdict]]
        confirm = [
            f'{self.verdicts}{{project="P", experiment="E"}}',
            f'{self.reasons}{{verdict="{verdict}", project="P", experiment="E"}}',
            f'{self.share}{{project="P", experiment="E"}}',
        ]
        if verdict in ("update", "logprob"):
            confirm.append('rlhf_mfu_ratio{project="P", experiment="E"}')
        if verdict == "rollout":
            confirm.append(
                'rlhf_agent_loop_seconds{project="P", experiment="E", part="generate_sequences"}'
            )
        checks = [
            "`rlhf-exporter diagnose --summary <verl root>/P/E.jsonl`: the same table, "
            "step by step, from the job's log"
        ]
        change = []
        for reason in REASONS[verdict]:
            keys = ", ".join(f"`{k}`" for k in VERL_KEYS.get((verdict, reason), ()))
            look = LOOK_AT.get((verdict, reason), "")
            change.append(
                f"`{reason}` ({REASON_MEANING[reason]}): look at {look}"
                + (f"; {keys}" if keys else "")
            )
        return Alert(
            name=name,
            expr=f'{self.verdicts}{{verdict="{verdict}"}} >= {_num(frac)}',
            for_=self.dur("bound_for"),
            severity="info",
            category="bottleneck",
            summary=(
                f"{JOB_NAME} is {verdict}-bound in {{{{ $value | humanizePercentage }}}} "
                "of its steps"
            ),
            description=description,
            annotations={"reason": self._reason_annotation(verdict)},
            runbook=Runbook(
                meaning=(
                    f"At least {_num(frac * 100)}% of the job's classified steps over the last {w} had the "
                    f"verdict `{verdict}`: the window that made the training loop wait longest was "
                    f"{VERDICT_MEANING[verdict]}. The alert's `reason` annotation is the dominant "
                    f"reason among those steps; the description shows the evidence and where to "
                    f"look next."
                ),
                confirm=confirm,
                verl_keys=[*timers, *VERL_EVIDENCE_KEYS[verdict]],
                change=change,
                checks=checks,
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
            for_=self.dur("regression_for"),
            severity="warning",
            category="regression",
            summary=f"{JOB_NAME}: the {{{{ $labels.group }}}} window regressed",
            description=(
                f"{{{{ $value | humanize }}}} steps of {JOB_NAME} in the last {w} were a regression of the "
                "{{ $labels.group }} window: it costs more seconds per token than the job's own baseline, "
                "and more tokens per step do not explain it (a workload shift never counts here).\n"
                "Last step's cost "
                + _tq(cost, 'printf "%.3g"', args)
                + " s/token against a baseline of "
                + _tq(base, 'printf "%.3g"', args)
                + " s/token."
            ),
            runbook=Runbook(
                meaning=(
                    "Steps of the job were labelled `regression` of group g (decision table §4): the "
                    "step got slower and the group that added the most seconds costs more per token "
                    "than the median of the job's recent steps. A workload shift (every window grew "
                    "with the token count) is counted apart and never fires this alert. A lasting "
                    f"regression is labelled for about half of `change.baseline_steps` steps, then "
                    f"becomes the job's new normal: the alert resolves {w} later even if nothing was "
                    "fixed, so compare the step time with the time before the alert."
                ),
                confirm=[
                    f'{self.regressions}{{project="P", experiment="E"}}',
                    'rlhf_group_cost_seconds_per_token{project="P", experiment="E"}',
                    'rlhf_baseline_group_cost_seconds_per_token{project="P", experiment="E"}',
                    f'{self.changes}{{project="P", experiment="E"}}',
                ],
                verl_keys=[
                    "the regressed group's `timing_s/<timer>` keys",
                    "perf/total_num_tokens",
                    "timing_s/step",
                ],
                change=[
                    "What changed in the job or its cluster when the alert started (image, verl "
                    "version, node, config)? Then, by regressed group:",
                    *change,
                ],
            ),
        )

    def throughput_alert(self) -> Alert:
        w, ratio, ref = (
            self.window,
            self.a["throughput_drop_ratio"],
            self.dur("throughput_reference"),
        )
        return Alert(
            name="RLHFJobThroughputBelowBaseline",
            expr=(
                f"{self.tokens_rate}\n  < {_num(ratio)} * max_over_time(rlhf_baseline_tokens_per_second[{ref}])\n"
                f'unless ignoring (kind)\n  increase(rlhf_change_steps_total{{kind="workload_shift"}}[{w}]) > 0'
            ),
            for_=self.dur("throughput_drop_for"),
            severity="warning",
            category="throughput",
            summary=f"{JOB_NAME} runs far below its own baseline throughput",
            description=(
                f"{JOB_NAME} processed {{{{ $value | humanize }}}} tokens per second of step time over the last "
                f"{w}, below {ratio:.0%} of its best baseline over {ref} ("
                + _tq(
                    f"max_over_time(rlhf_baseline_tokens_per_second{{{JOB_MATCH}}}[{ref}])",
                    "humanize",
                )
                + " tokens/s), and no step of the window was a workload shift."
            ),
            runbook=Runbook(
                meaning=(
                    f"The job's tokens per second of step time over {w} fell below "
                    f"{_num(ratio)} x the best value of its own baseline (median K/S' of recent steps) "
                    f"over the last {ref}, and no step in the window was a workload shift. "
                    "The exporter's baseline follows the job within about ten steps, so this alert "
                    "compares with the best recent baseline instead."
                ),
                confirm=[
                    f'{self.tokens_rate}{{project="P", experiment="E"}}',
                    f'max_over_time(rlhf_baseline_tokens_per_second{{project="P", experiment="E"}}[{ref}])',
                    f'{self.regressions}{{project="P", experiment="E"}}',
                    f'{self.verdicts}{{project="P", experiment="E"}}',
                ],
                verl_keys=["perf/throughput", "perf/total_num_tokens", "timing_s/step"],
                change=[
                    "Find the group that grew: the verdict and regression recording rules above, or "
                    "`rlhf-exporter diagnose` on the job's log. Then follow that group's bound-alert "
                    "section of this runbook."
                ],
            ),
        )

    def decision_alerts(self) -> list[Alert]:
        return [self.bound_alert(v) for v in BOUND_ALERTS] + [
            self.regression_alert(),
            self.throughput_alert(),
        ]
