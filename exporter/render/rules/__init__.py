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
| `project_experiment:rlhf_bottleneck_verdict:code` | the last step's verdict as a number (1 + its index in the decision table), for the fleet's verdict panels |

The suffix follows the configured window (`alerts.window`). Rules never aggregate across
scrape targets (they use `without`), so the target labels survive for routing and joins.

`rule_groups(thresholds, scale)` scales every window and `for:` by `scale` (and the stall
test's step-time term with them): the live test runs the same rules 200 times faster.
"""

from __future__ import annotations

from typing import Any

from ...diagnosis import Thresholds
from ...diagnosis.thresholds import seconds
from .decision import DecisionAlerts
from .model import (
    BOUND_ALERTS,
    DECISION_FILE,
    OPERATIONS_FILE,
    RECORDING_FILE,
    RUNBOOKS_FILE,
    SEVERITIES,
    Alert,
    Runbook,
    anchor,
    duration,
    runbook_url,
)
from .operations import OperationsAlerts
from .output import dump, runbooks_markdown
from .output import rule_files as _rule_files
from .recording import RecordingRules

ORDER = 20
__all__ = [
    "BOUND_ALERTS",
    "DECISION_FILE",
    "OPERATIONS_FILE",
    "RECORDING_FILE",
    "RUNBOOKS_FILE",
    "SEVERITIES",
    "Alert",
    "Rules",
    "Runbook",
    "anchor",
    "dump",
    "duration",
    "rule_files",
    "rule_groups",
    "runbook_url",
    "seconds",
    "targets",
]


class Rules(RecordingRules, DecisionAlerts, OperationsAlerts):
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
        self.reasons = (
            f"project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:ratio_rate{w}"
        )
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

    def alerts(self) -> list[Alert]:
        return self.decision_alerts() + self.operations_alerts()

    def groups(self) -> dict[str, list[dict[str, Any]]]:
        base = self.a["runbook_url"]
        return {
            RECORDING_FILE: [{"name": "rlhf-exporter.recording", "rules": self.recording()}],
            DECISION_FILE: [
                {
                    "name": "rlhf-exporter.decision-table",
                    "rules": [a.rule(base) for a in self.decision_alerts()],
                }
            ],
            OPERATIONS_FILE: [
                {
                    "name": "rlhf-exporter.operations",
                    "rules": [a.rule(base) for a in self.operations_alerts()],
                }
            ],
        }


def rule_groups(thresholds: Thresholds, scale: float = 1.0) -> dict[str, list[dict[str, Any]]]:
    """{relative path: [rule groups]}; `scale` < 1 shortens every window and `for:`."""
    return Rules(thresholds, scale).groups()


def rule_files(thresholds: Thresholds, scale: float = 1.0) -> dict[str, str]:
    return _rule_files(Rules(thresholds, scale))


def targets(thresholds: Thresholds) -> dict[str, str]:
    return {**rule_files(thresholds), RUNBOOKS_FILE: runbooks_markdown(Rules(thresholds))}
