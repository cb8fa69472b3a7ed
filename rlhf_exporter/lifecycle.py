"""A verl job's state (running, finished, failed, unknown) from the systems that know it.

Pure: no I/O. The Ray source turns Ray's Jobs API and actor death causes into one `RayFact`
per verl job; `Job` combines it with what the job's own log says. In order of trust:

1. Ray's Jobs API: the submission's status. SUCCEEDED and STOPPED (`ray job stop`, a user's
   decision) are `finished`, FAILED is `failed`; LOST (a submission that was RUNNING when
   the Ray head restarted and that the new head no longer lists: its driver died with it)
   is `failed`.
2. The death causes of the submission's actors: a worker, node, OOM, creation or runtime-env
   failure (`FAILURE_REASONS`) makes the job `failed` while its submission still reads
   RUNNING (the driver has not noticed yet). A normal end (OWNER_DIED, OUT_OF_SCOPE,
   REF_DELETED, RAY_KILL by the driver at shutdown, a worker's intended exit) is no failure.
3. What the job declared: its step reached its total steps (`--total-steps`, or per job in
   a `<experiment>.total_steps` file beside its log), it logged `rlhf_job_finished: 1`, or a
   `<experiment>.finished` file appeared beside its log: `finished`.
An end (1's SUCCEEDED, STOPPED, FAILED or LOST, or 3's `.finished` file) never outranks a
log that is still growing: a job that stepped more than END_GRACE seconds after the end was
said to happen (Ray's end time, or when the exporter first saw it; the `.finished` file's
modification time) is not ended by it (`end_outgrown`), so a Jobs API entry naming a job
that still steps, or a `.finished` file left from an earlier run, cannot silence its stall
alert. The sources count each ignored end (`ray_end_ignored`, `finished_file_ignored`).
4. Otherwise a job that stepped, or whose submission is PENDING/RUNNING, is `running`, and
   anything else `unknown`. `stalled` is no exporter state: Prometheus decides it from the
   stall budget (recording rule `project_experiment_state:rlhf_job_state:max`).
"""

from __future__ import annotations

from typing import NamedTuple

RUNNING, FINISHED, FAILED, UNKNOWN = "running", "finished", "failed", "unknown"
STATES = (RUNNING, FINISHED, FAILED, UNKNOWN)
"""The exporter's states (`rlhf_job_state{state}`), in catalog order."""

FINISHED_STATUSES = frozenset({"SUCCEEDED", "STOPPED"})
FAILED_STATUSES = frozenset({"FAILED", "LOST"})
ACTIVE_STATUSES = frozenset({"PENDING", "RUNNING"})
LOST = "LOST"  # not Ray's: a RUNNING submission the restarted head no longer lists
ENDED_STATUSES = FINISHED_STATUSES | FAILED_STATUSES
END_GRACE = 30.0
"""Seconds a job may still step after its end (clock skew between the Ray head and the log's
filesystem, a last record flushed late): a step later than that outranks the end."""

FAILURE_REASONS = frozenset(
    {
        "WORKER_DIED",
        "NODE_DIED",
        "OUT_OF_MEMORY",
        "CREATION_TASK_FAILED",
        "RUNTIME_ENV_FAILED",
        "UNSCHEDULABLE",
    }
)
"""Actor death reasons that mean something broke. OWNER_DIED, OUT_OF_SCOPE, REF_DELETED and
RAY_KILL are what a normal shutdown gives (measured on Ray 2.60: a driver's end leaves its
actors OWNER_DIED, OUT_OF_SCOPE or REF_DELETED)."""

INTENDED_EXITS = ("INTENDED_USER_EXIT", "INTENDED_SYSTEM_EXIT")
"""A WORKER_DIED whose message says one of these is a clean exit (`exit_actor()`): Ray's own
JobSupervisor actors die that way at every normal job end."""


def is_failure(reason: str, message: str = "", class_name: str = "") -> bool:
    """Whether an actor death with this reason (and Ray's error message) is a failure."""
    if reason not in FAILURE_REASONS or class_name == "JobSupervisor":
        return False
    return not any(word in message for word in INTENDED_EXITS)


class RayFact(NamedTuple):
    """What Ray says about one verl job's submission."""

    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED, or LOST
    submission: str = ""  # submission_id (or the Ray job id of a plain driver)
    failure: str = ""  # the first failure-cause death of its actors ('' when none)
    since: float | None = None  # when the status began (Ray's start or end time, seconds)


def end_outgrown(end_at: float | None, last_step: float | None) -> bool:
    """Whether the job stepped more than END_GRACE seconds after an end said to happen at
    `end_at` (then that end is not the job's)."""
    return end_at is not None and last_step is not None and last_step > end_at + END_GRACE


def job_state(
    *,
    stepped: bool,
    declared_finished: bool,
    ray: RayFact | None = None,
    ray_end_outgrown: bool = False,
) -> tuple[str, str]:
    """The job's state and the signal it came from (`ray_job`, `actor_death`, `declared`,
    `steps`, `none`). `ray_end_outgrown`: the job stepped after Ray's end (end_outgrown),
    which then does not count; `declared_finished` is already judged so by the caller."""
    if ray is not None and ray_end_outgrown and ray.status in ENDED_STATUSES:
        ray = ray._replace(status="RUNNING")  # what it says about actor deaths still holds
    if ray is not None:
        if ray.status in FINISHED_STATUSES:
            return FINISHED, "ray_job"
        if ray.status in FAILED_STATUSES:
            return FAILED, "ray_job"
        if ray.failure:
            return FAILED, "actor_death"
    if declared_finished:
        return FINISHED, "declared"
    if stepped:
        return RUNNING, "steps"
    if ray is not None and ray.status in ACTIVE_STATUSES:
        return RUNNING, "ray_job"
    return UNKNOWN, "none"
