"""How one job's end is known, and the state it decides (rlhf_exporter/lifecycle.py): what
Ray says, the rlhf_job_finished marker its log may hold, a `.finished` file beside its log,
and its total steps. An end the job stepped past is outgrown: ignored, counted once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..lifecycle import ENDED_STATUSES, LOST, UNKNOWN, RayFact, end_outgrown, job_state


class EndSignals:
    """The end signals of one job, and its state with when it was entered (`since`)."""

    def __init__(self, clock: Callable[[], float], total_steps: int | None = None):
        self._clock = clock
        self.total_steps = total_steps
        self.marker = False  # this run logged rlhf_job_finished
        self.file = False  # a `<experiment>.finished` file lies beside its log
        self.file_at: float | None = None  # its modification time
        self.ray: RayFact | None = None  # what Ray's Jobs API and death causes say
        self._ray_end_at: float | None = None  # when Ray's end happened (or was first seen)
        self.ignored: Counter[str] = Counter()  # ends the job outgrew (sources count them)
        self._ignored_seen: set[tuple[str, object]] = set()  # each ignored end counted once
        self.state = (UNKNOWN, "none")  # (state, the signal it came from)
        self.since: float = clock()  # when the job entered its current state

    def declared(self, step: int | None, last_step_time: float | None) -> bool:
        """The job reached the end verl shows (its step reached its total steps), logged the
        rlhf_job_finished marker in this run, or has a `.finished` file beside its log."""
        reached = self.total_steps is not None and step is not None and step >= self.total_steps
        return reached or self.marker or self.file_holds(last_step_time)

    def file_holds(self, last_step_time: float | None) -> bool:
        """A `.finished` file counts unless the job stepped after it was written (a file
        left from an earlier run, or put beside a job that still steps)."""
        if not self.file:
            return False
        if end_outgrown(self.file_at, last_step_time):
            self._ignore("finished_file_ignored", self.file_at)
            return False
        return True

    def _ignore(self, reason: str, which: object) -> None:
        key = (reason, which)
        if key not in self._ignored_seen and len(self._ignored_seen) < 64:
            self._ignored_seen.add(key)
            self.ignored[reason] += 1

    def refresh(self, step: int | None, last_step_time: float | None) -> bool:
        """Decide the state again; whether it changed."""
        ray = self.ray
        outgrown = (
            ray is not None
            and ray.status in ENDED_STATUSES
            and end_outgrown(self._ray_end_at, last_step_time)
        )
        if outgrown and ray is not None:
            self._ignore("ray_end_ignored", (ray.submission, ray.status))
        state = job_state(
            stepped=step is not None,
            declared_finished=self.declared(step, last_step_time),
            ray=ray,
            ray_end_outgrown=outgrown,
        )
        changed = state[0] != self.state[0]
        if changed:
            self.since = self._clock()
        self.state = state
        return changed

    def set_ray(self, fact: RayFact | None) -> bool:
        """What Ray says about this job now (None: nothing ties a submission to it);
        whether it changed."""
        if fact == self.ray:
            return False
        old, self.ray = self.ray, fact
        if fact is None or fact.status not in ENDED_STATUSES:
            self._ray_end_at = None
        elif old is None or (old.status, old.submission) != (fact.status, fact.submission):
            # Ray's end time, unless it lies ahead (then when it was first seen); a LOST
            # submission's time is its start: it ended when the exporter saw it LOST
            seen = self._clock()
            since = fact.since if fact.status != LOST else None
            self._ray_end_at = min(since, seen) if since is not None else seen
        return True

    def set_file(self, present: bool, at: float | None) -> bool:
        """Whether a `.finished` file lies beside the log, and its modification time;
        whether that changed."""
        if present == self.file and at == self.file_at:
            return False
        self.file = present
        self.file_at = at if present else None
        return True
