"""A job's stall limit: how long it may go without a step before `RLHFJobStalled` counts it
stalled. Pure. The one definition the exporter's own readers use (the job view's "stalled"
tag, the stacks collector's trigger); the recording rule
`project_experiment:rlhf_job_stall_budget:ratio` (render/rules/recording.py) writes the same
formula in PromQL from the same `StallLimit.of(alerts)`, and tests/test_stall_limit.py checks
that Prometheus and this module agree:

    limit = max(stall_factor x baseline step time, stall_min) + longest between-steps work

`stall_min` alone before a baseline exists; "between-steps work" is the run's longest
validation plus checkpoint (`rlhf_between_steps_max_seconds`), 0 before one is seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .thresholds import seconds


@dataclass(frozen=True)
class StallLimit:
    factor: float = 3.0  # alerts.stall_factor
    minimum: float = 600.0  # alerts.stall_min, seconds

    @classmethod
    def of(cls, alerts: Mapping[str, Any], scale: float = 1.0) -> StallLimit:
        """From the thresholds' `alerts` section (time-scaled as the rules are, for tests)."""
        factor = float(alerts.get("stall_factor", cls.factor))
        minimum = seconds(alerts.get("stall_min", cls.minimum))
        return cls(factor * scale, minimum * scale)

    def seconds(self, baseline_step: float | None, between_steps: float | None = None) -> float:
        """The limit for a job with this baseline step time (None: none yet) and longest
        between-steps work."""
        base = self.minimum
        if baseline_step is not None and baseline_step == baseline_step:
            base = max(self.factor * baseline_step, self.minimum)
        extra = between_steps if between_steps is not None and between_steps > 0 else 0.0
        return base + extra

    def stalled_for(
        self,
        last_step_time: float | None,
        now: float,
        baseline_step: float | None = None,
        between_steps: float | None = None,
    ) -> float | None:
        """Seconds since the last step when that is past the limit (the job is stalled),
        else None. A job that never stepped is never stalled (the rule has no series)."""
        if last_step_time is None:
            return None
        age = now - last_step_time
        return age if age > self.seconds(baseline_step, between_steps) else None

    def job_stalled_for(self, job: Mapping[str, Any], now: float) -> float | None:
        """The same, for a job's summary (`Job.summary()`)."""
        return self.stalled_for(
            job.get("last_step_time"),
            now,
            job.get("baseline_step_seconds"),
            job.get("between_steps_max"),
        )
