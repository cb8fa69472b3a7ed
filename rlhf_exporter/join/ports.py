"""What a `Job` and the sources are handed, declared once (typed Protocols).

`commands/serve.py` builds the parts and hands each the ports it needs through the sources'
`Context`; no source sets an attribute on another.

- `StepWindows`: where a job posts each placed step's timeline (the `WindowBoard`, read by
  the NVML source's joiner and by worker sidecars).
- `Engines`: what a job asks for the rollout engines' evidence over its step's
  rollout window (the engine source, rlhf_exporter/sources/engines.py).
- `JobFacts`: what Ray says about a verl job (its submission's state, death causes), read by
  the verl and push sources for their jobs' states (the Ray source).
- `ActorPids`: Ray's actors by worker PID on this node (the NVML source's GPU roles, the
  engine source's discovery of rollout servers).
- `JobProcesses`: a verl job's live Ray processes and its Ray job id, read by the stacks
  source for a stalled job's stacks (the Ray source).
- `TrainerActors`: the verl trainer actors Ray runs (the actors that print a job's steps),
  each with the submission it belongs to, and that submission's state: read by the console
  source, which streams each one's stdout (the Ray source).
- `JobClock`: the clock a job's step windows and its engines' reads are placed on, and on
  which its last step ages: the wall clock (`WALL`), or the demo job's clock
  (rlhf_exporter/demo/clock.py), which runs at the pace its records describe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from ..diagnosis.engines import EngineEvidence, EngineLimits
from ..diagnosis.timeline import Timeline
from ..lifecycle import RayFact

Labels = tuple[str, str]
"""A job's (project, experiment)."""

Span = tuple[float, float]
"""A stretch of wall time, (start, end) in seconds."""


class JobClock(Protocol):
    """Where a wall-clock instant falls on the clock a job's steps are placed on: the
    placer anchors each record's arrival there, and the engine source stamps its reads
    there, so a step's rollout window and the engines' samples are on one clock."""

    def at(self, wall: float) -> float: ...

    def aged(self, wall: float, now: float) -> float:
        """The wall instant as far before `now` as `wall` lies before it on this clock: a
        job's last step time as it exports it, so that Prometheus's `time() - it` is the
        age its own clock gives the step (its stall, judged as the pages judge it)."""
        ...


class WallClock:
    """The wall clock itself: every real job's (the default)."""

    def at(self, wall: float) -> float:
        return wall

    def aged(self, wall: float, now: float) -> float:
        return wall


WALL = WallClock()


class StepWindows(Protocol):
    """Where a `Job` posts the timeline of each step it placed in time."""

    def post(self, labels: Labels, timeline: Timeline) -> None: ...


class Engines(Protocol):
    """What a `Job` asks for the engines' evidence over a step's rollout spans."""

    @property
    def limits(self) -> EngineLimits: ...

    def evidence(
        self, spans: Sequence[Span], placement_error: float = 0.0
    ) -> EngineEvidence | None:
        """None when no replica answered in the spans, or when their place in time is
        uncertain by more than `engine.max_placement_error` of their length
        (`placement_error`: the timelines' `error_seconds`)."""
        ...


class JobFacts(Protocol):
    """What Ray says about verl jobs; `facts_version` grows whenever that changes."""

    @property
    def facts_version(self) -> int: ...

    def job_fact(self, project: str, experiment: str, sole: bool = False) -> RayFact | None: ...


class ActorProcess(NamedTuple):
    """An ALIVE actor's worker process on this node."""

    class_name: str
    role: str
    name: str = ""  # the actor's name (verl's rollout servers: `vllm_server_<r>_<n>`)


class ActorPids(Protocol):
    """Ray's ALIVE actors on this node by worker PID, as of its last poll."""

    @property
    def interval(self) -> float: ...

    def pid_actors(self, max_age: float | None = None) -> Mapping[int, ActorProcess]: ...


class JobProcess(NamedTuple):
    """A live process of a Ray job: an ALIVE actor's worker, or the job's driver (what the
    stacks source asks Ray's dashboard for the stack of)."""

    role: str
    class_name: str
    name: str  # the actor's name ('' when unnamed), or the submission id of a driver
    pid: int
    node_id: str


class JobProcesses(Protocol):
    """What Ray says of a verl job's processes, as of its last poll (tied to the job as
    `JobFacts.job_fact` ties it; `sole`: the only job watched may take Ray's newest)."""

    def job_processes(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> Sequence[JobProcess]:
        """Its driver first, then its ALIVE actors by role; () when untied. `job_id`: the
        Ray job id its source already knows (the console source's), taken as it is."""
        ...

    def ray_job_id(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> str:
        """Its Ray job id ('' when untied; `job_id` when given)."""
        ...


class TrainerActor(NamedTuple):
    """A verl trainer actor (`TaskRunner`, `TaskRunnerV1`, `FullyAsyncTrainer`, ...): the
    actor whose stdout holds the job's printed steps."""

    actor_id: str
    class_name: str
    job_id: str  # the Ray job id of its driver
    submission_id: str  # the Jobs API's submission id ('' for a driver started by hand)
    named: Labels | None  # (project, experiment) the submission names (metadata, overrides)


class TrainerActors(Protocol):
    """Ray's ALIVE verl trainer actors as of its last poll, and each Ray job's own state."""

    @property
    def trainers_seen(self) -> bool:
        """Whether a poll has listed the actors yet (before, an empty list means nothing)."""
        ...

    def trainer_actors(self) -> Mapping[str, TrainerActor]:
        """By actor id."""
        ...

    def submission_fact(self, job_id: str) -> RayFact | None:
        """The state of the submission whose driver has Ray job id `job_id` (None when the
        Jobs API does not list it: a driver started by hand)."""
        ...
