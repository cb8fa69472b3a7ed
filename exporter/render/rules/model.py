"""The pieces every rule is made of: files, alert names, durations, annotation templates,
and the Alert and Runbook records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...diagnosis import GROUPS

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
    return (
        "{{ with query (printf `" + expr + "` " + args + ") }}"
        "{{ . | first | value | " + fmt + " }}{{ else }}" + default + "{{ end }}"
    )


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
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                **self.annotations,
                "runbook_url": runbook_url(runbook_base, self.name),
            },
        }


def runbook_url(base: str, alert: str) -> str:
    return f"{base}#{anchor(alert)}"


def anchor(alert: str) -> str:
    """The runbook section's anchor (GitHub's anchor of a `## Name` heading)."""
    return alert.lower()
