"""What the verl sources (files and pushes) share to create a job: the `Job` of a
project/experiment built from the source's own thresholds, limits, clock, total steps and
window board. What a job drops, the source takes from it (`Job.take_drops`) into its own
record errors."""

from __future__ import annotations

from ..diagnosis import Thresholds
from ..job.limits import Limits
from ..job.state import Job
from ..join.ports import WALL, Engines, JobClock, StepWindows
from .base import Clock


class JobMaker:
    """Mixin of a source that creates `Job`s; the source sets these attributes."""

    th: Thresholds
    limits: Limits
    clock: Clock
    total_steps: int | None
    windows: StepWindows | None  # where its jobs post step timelines (the WindowBoard)
    engines: Engines | None  # what its jobs ask for engine evidence

    def new_job(self, project: str, experiment: str, job_clock: JobClock = WALL) -> Job:
        """`job_clock`: where the job places its steps (the wall's; the demo job's own)."""
        return Job(
            project,
            experiment,
            self.th,
            self.limits,
            clock=self.clock,
            total_steps=self.total_steps,
            windows=self.windows,
            engines=self.engines,
            job_clock=job_clock,
        )
