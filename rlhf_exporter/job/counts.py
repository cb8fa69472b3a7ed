"""What a job's classified steps add up to (`StepCounts`), what the engines said over their
rollout windows (`EngineCounts`) and what its records' keys have shown (`KeysShown`): they
only ever grow, across runs, kept by `Job` (rlhf_exporter/job/state.py) and read by its
series and summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..diagnosis import CHANGES, COST_GROUPS, GROUPS, REASONS, VERDICTS, StepDiagnosis
from ..diagnosis.advice import EVIDENCE_KEYS, SHAPE_RECORDS, job_shape, shown_evidence
from ..diagnosis.engines import EngineEvidence

# every job's (verdict, reason) counter keys: one set of tuples, not one per job
REASON_KEYS = tuple((v, r) for v in VERDICTS for r in REASONS[v])


@dataclass(slots=True, eq=False)
class StepCounts:
    """The job's classified steps: their seconds, tokens and verdicts, and the last one."""

    last: StepDiagnosis | None = None
    step_seconds: float = 0.0
    untimed_seconds: float = 0.0
    tokens: float = 0.0
    group_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0.0))
    verdict_steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    reason_steps: dict[tuple[str, str], int] = field(
        default_factory=lambda: dict.fromkeys(REASON_KEYS, 0)
    )
    change_steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANGES, 0))
    regression_steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COST_GROUPS, 0))

    def count(self, d: StepDiagnosis) -> None:
        """One more classified step (it becomes the last)."""
        self.last = d
        self.step_seconds += d.windows.step_seconds
        self.untimed_seconds += d.windows.untimed_seconds
        for group, seconds in d.windows.group_seconds.items():
            self.group_seconds[group] += seconds
        self.verdict_steps[d.verdict] += 1
        if d.reason is not None:
            key = (d.verdict, d.reason)
            self.reason_steps[key] = self.reason_steps.get(key, 0) + 1
        self.change_steps[d.change.change] += 1
        if d.change.regressed is not None:
            self.regression_steps[d.change.regressed] += 1
        if d.tokens is not None:
            self.tokens += d.tokens


@dataclass(slots=True, eq=False)
class EngineCounts:
    """The engine evidence of the last measured rollout window, at `step`, and the windows
    measured so far (by whether their evidence was usable) with their preemptions."""

    last: EngineEvidence | None = None
    step: int | None = None
    windows: dict[str, int] = field(default_factory=lambda: {"true": 0, "false": 0})
    preemptions: float = 0.0

    def count(self, ev: EngineEvidence, step: int) -> None:
        self.last, self.step = ev, step
        self.windows["true" if ev.usable else "false"] += 1
        if ev.usable:
            self.preemptions += ev.preemptions


@dataclass(slots=True, eq=False)
class KeysShown:
    """Which of the keys the reasons need this job's log has reported (either spelling of
    agent-loop keys; verl's "not reported" values such as a -1 preemption count are not
    evidence), and what its first records' keys say it does (advice.job_shape): what it has
    never reported, its verdicts cannot say."""

    evidence: set[str] = field(default_factory=set)  # EVIDENCE_KEYS the log has shown
    shape: set[str] = field(default_factory=set)
    shape_left: int = SHAPE_RECORDS  # records still to look at for its shape

    def remember(self, data: Mapping[str, Any]) -> None:
        if len(self.evidence) < len(EVIDENCE_KEYS):
            self.evidence |= shown_evidence(data)
        if self.shape_left > 0:
            self.shape_left -= 1
            self.shape |= job_shape(data)

    def shown(self) -> set[str]:
        return self.evidence | self.shape
