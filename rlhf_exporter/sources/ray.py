"""Ray actors by role and state, read from Ray's state API over HTTP (the dashboard port).

The sidecar's bounded HTTP client (sources/http.py, by sources/ray_state_api.py), never
`import ray`: a sidecar must not pin the cluster's Ray version or pay its import cost. Each
request has one deadline of --ray-timeout over connect, headers and body, follows no
redirect, takes no encoded answer and at most MAX_BODY bytes; an answer that would parse into
more than MAX_CONTAINERS objects and lists is refused before it is parsed
(`too_many_elements`). Labels from an answer
(`ray_version`, `session_name`) are cleaned and cut (sources/labels.py). One poll (default
every 15 s):

    GET /api/version                                   ray_version, session_name
    GET /api/v0/actors/summarize?state=PENDING_CREATION  per-class counts (server-side filter)
    GET /api/v0/actors/summarize?state=DEPENDENCIES_UNREADY, ...?state=DEAD
    GET /api/v0/actors?state=ALIVE&detail=1            num_restarts, pid, node_id
    GET /api/v0/actors?state=RESTARTING&detail=1
    GET /api/v0/actors?state=DEAD&detail=1             only when the DEAD counts changed
    GET /api/v0/nodes?state=ALIVE                      which Ray node is this host (GPU PIDs)
    GET /api/jobs/                                     Jobs API: each submission's status

The Jobs API and the actors' death causes tell each verl job's state (`job_fact()`, read by
the verl and push sources; see rlhf_exporter.lifecycle and sources/ray_jobs.py). A dashboard
without the Jobs API (HTTP 404) is logged once; the actor series stay.

Every actor query filters on `state` because that filter is applied inside the GCS: the API
returns at most 10,000 rows with no pagination, and Ray keeps up to 100,000 dead actors, so
an unfiltered query would let the dead crowd out the living. A truncated answer is logged
once (its counts are then lower bounds).

Restarts are the growth of each actor's `num_restarts` (a string in the JSON); deaths are
actors first seen DEAD, by the reason in `death_cause`. Both count from the first poll on:
what was already dead or restarted then is not counted, but its series start at 0.
With `--no-ray-actors` (GPU worker pods) only this node's ALIVE actors are read, for the
NVML source's PID -> role match, and no actor series are exported (no double counting).
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from ..join.ports import ActorProcess, JobFacts, JobProcess, TrainerActor
from ..lifecycle import RayFact, is_failure
from ..metrics.snapshot import Sample
from ..settings import Settings
from . import http
from .base import Clock, Context, PollingSource, PollResult, SourceError
from .labels import outside_label
from .ray_jobs import JobBook
from .ray_state_api import DEFAULT_ADDRESS, StateApi, as_count
from .ray_state_api import resolve_address as resolve_address  # the setting's reader, for all
from .ray_token import RayToken
from .roles import ROLES, TRAINER_CLASSES, RoleMap

log = logging.getLogger(__name__)

KNOWN_ERRORS = (*http.REASONS, "too_many_elements", "invalid_json", "bad_response", "ray_error")
STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
SUMMARIZED = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "DEAD")  # counts only
LISTED = ("ALIVE", "RESTARTING")  # rows with detail: restarts and PIDs
MAX_CLASSES = 500  # per-class series kept at most (opt-in breakdown)
MAX_TRAINERS = 1000  # verl trainer actors published to the console source at most
MAX_DEAD_REMEMBERED = 120_000  # Ray keeps up to 100,000 dead actors
FORGET_AFTER_POLLS = 40  # a live actor unseen this long leaves the restart bookkeeping
KNOWN_REASONS = frozenset(
    {
        "WORKER_DIED",
        "OWNER_DIED",
        "NODE_DIED",
        "RAY_KILL",
        "OUT_OF_SCOPE",
        "REF_DELETED",
        "UNSPECIFIED",
        "OUT_OF_MEMORY",
        "CREATION_TASK_FAILED",
        "RUNTIME_ENV_FAILED",
        "UNSCHEDULABLE",
        "UNKNOWN",
    }
)
_REASON_SHAPE = re.compile(r"[A-Z][A-Z0-9_]{0,39}")
_CONTEXT_REASONS = (  # death_cause is a oneof; these contexts carry no reason enum
    ("oom_context", "OUT_OF_MEMORY"),
    ("creation_task_failure_context", "CREATION_TASK_FAILED"),
    ("runtime_env_failed_context", "RUNTIME_ENV_FAILED"),
    ("actor_unschedulable_context", "UNSCHEDULABLE"),
)


MAX_JOB_PROCESSES = 4096  # live processes remembered per Ray job (the stacks source reads few)


def death_reason(row: Mapping[str, Any]) -> str:
    """A short, bounded label from an actor's `death_cause`."""
    cause = row.get("death_cause")
    if not isinstance(cause, Mapping) or not cause:
        return "UNKNOWN"
    context = cause.get("actor_died_error_context")
    if isinstance(context, Mapping):
        reason = context.get("reason")
        if isinstance(reason, str) and reason:
            reason = reason.upper()
            if reason in KNOWN_REASONS or _REASON_SHAPE.fullmatch(reason):
                return reason
            return "OTHER"
        return "UNSPECIFIED"
    for key, name in _CONTEXT_REASONS:
        if key in cause:
            return name
    return "UNKNOWN"


def local_addresses() -> frozenset[str]:
    """This host's IPv4 addresses (all interfaces, from /proc/net/fib_trie), plus what the
    hostname resolves to. Used to find which Ray node runs here."""
    found = {"127.0.0.1"}
    try:
        lines = open("/proc/net/fib_trie", encoding="ascii", errors="replace").read().splitlines()
        for previous, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                found.add(previous.split()[-1])
    except OSError:
        pass
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return frozenset(found)


class RaySource(PollingSource):
    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        interval: float = 15.0,
        timeout: float = 5.0,
        actors: bool = True,
        per_class: bool = False,
        roles: RoleMap | None = None,
        node_ips: Iterable[str] | None = None,
        stale_after: float | None = None,
        clock: Clock = time.time,
        token: RayToken | None = None,
    ):
        super().__init__("ray", interval, stale_after, wall=clock)
        self.token = token  # sent as `Authorization: Bearer` (Ray's token authentication)
        self.address = address.rstrip("/")
        self._api = StateApi(address, timeout, token, self._warn_once)  # Ray's state API
        self.timeout = timeout
        self.actors = actors
        self.per_class = per_class
        self.roles = roles or RoleMap.default()
        self.node_ips = frozenset(node_ips) if node_ips else local_addresses()
        self._errors.update(dict.fromkeys(KNOWN_ERRORS, 0))
        # bookkeeping between polls (only the poll thread touches it)
        self._polls = 0
        self._session: str | None = None
        self._baseline = True  # the first poll of the exporter: count nothing, start at 0
        self._restarts: dict[str, tuple[int, int]] = {}  # actor_id -> (num_restarts, poll no.)
        self._restarts_total: dict[str, int] = {role: 0 for role in ROLES}
        self._dead_seen: dict[str, None] = {}  # insertion-ordered set of actor ids
        self._dead_counts: dict[str, int] | None = None
        self._deaths_total: dict[tuple[str, str], int] = {}
        self._failures_total: dict[tuple[str, str], int] = {}
        self._book = JobBook()
        self._jobs_by_status: dict[str, int] = {}
        # read by the verl and push sources from their threads: replaced whole
        self._facts: tuple[Mapping[tuple[str, str], RayFact], RayFact | None] = ({}, None)
        self.facts_version = 0  # grows whenever the facts change
        self._warned: set[str] = set()
        # read by the stacks source from its thread: replaced whole, never mutated
        self._job_ids: tuple[Mapping[tuple[str, str], str], str] = ({}, "")
        self._job_procs: Mapping[str, tuple[JobProcess, ...]] = MappingProxyType({})
        self._drivers: Mapping[str, JobProcess] = MappingProxyType({})
        # read by the console source from its thread: replaced whole, never mutated
        self._trainers: Mapping[str, TrainerActor] = MappingProxyType({})
        self._trainer_rows: list[Mapping[str, Any]] = []
        self.trainers_seen = False
        # read by the NVML source from its own thread: replaced whole, never mutated
        self._pids: Mapping[int, ActorProcess] = MappingProxyType({})
        self._pids_at: float | None = None
        self._pids_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> RaySource | None:
        if not settings.ray:
            return None
        node_ip = settings.ray_node_ip
        return cls(
            resolve_address(settings.ray_address),
            interval=settings.ray_interval,
            timeout=settings.ray_timeout,
            actors=settings.ray_actors,
            per_class=settings.ray_per_class,
            roles=RoleMap.from_file(settings.ray_roles),
            node_ips=[node_ip] if node_ip else None,
            clock=context.clock,
            token=RayToken.resolve(settings.ray_token, settings.ray_token_file),
        )

    def describe(self) -> str:
        mode = "actors" if self.actors else "PIDs only"
        auth = f", token from {self.token.where}" if self.token is not None else ""
        return f"ray ({self.address}, every {self.interval:g}s, {mode}{auth})"

    def close(self) -> None:
        self._api.close()

    # -- for the NVML source ----------------------------------------------------------------
    def pid_actors(self, max_age: float | None = None) -> Mapping[int, ActorProcess]:
        """ALIVE actors' worker PIDs on this node, from the last successful poll (empty when
        that is older than `max_age` seconds)."""
        with self._pids_lock:
            pids, at = self._pids, self._pids_at
        if at is None or (max_age is not None and time.monotonic() - at > max_age):
            return MappingProxyType({})
        return pids

    def job_fact(self, project: str, experiment: str, sole: bool = False) -> RayFact | None:
        """What Ray says about the verl job (project, experiment): its tied submission, or,
        for the exporter's `sole` job, the newest untied one (sources/ray_jobs.py)."""
        tied, newest = self._facts
        fact = tied.get((project, experiment))
        if fact is None and sole:
            return newest
        return fact

    def facts(self) -> JobFacts | None:
        """The port the verl and push sources read their jobs' states from (`job_fact`,
        `facts_version`); None on a GPU worker's source, which reads PIDs only (no jobs)."""
        return self if self.actors else None

    def job_processes(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> tuple[JobProcess, ...]:
        """The live processes of the verl job (project, experiment) as of the last poll: its
        driver first, then its ALIVE actors by role (tied as `job_fact` ties it)."""
        job_id = self.ray_job_id(project, experiment, sole, job_id)
        if not job_id:
            return ()
        driver = self._drivers.get(job_id)
        return ((driver,) if driver else ()) + self._job_procs.get(job_id, ())

    # -- for the console source ----------------------------------------------------------
    def trainer_actors(self) -> Mapping[str, TrainerActor]:
        """The ALIVE verl trainer actors (the ones that print a job's steps), by actor id."""
        return self._trainers

    def submission_fact(self, job_id: str) -> RayFact | None:
        """The state of the submission whose driver has Ray job id `job_id`."""
        hit = self._book.submission(job_id)
        return hit[0] if hit is not None else None

    def _publish_trainers(self) -> None:
        trainers = {}
        for row in self._trainer_rows[:MAX_TRAINERS]:
            actor_id, job_id = row.get("actor_id"), row.get("job_id")
            if not isinstance(actor_id, str) or not isinstance(job_id, str):
                continue
            hit = self._book.submission(job_id)
            trainers[actor_id] = TrainerActor(
                actor_id[:64],
                str(row.get("class_name") or "")[:200],
                job_id[:64],
                hit[1] if hit is not None else "",
                hit[2] if hit is not None else None,
            )
        self._trainers = MappingProxyType(trainers)
        self._trainer_rows = []
        self.trainers_seen = True

    def ray_job_id(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> str:
        """The Ray job id of the verl job ('' when untied), as `job_processes` ties it; the
        one its source knows (`job_id`: the console source reads it by Ray job) first."""
        if job_id:
            return job_id
        tied, newest = self._job_ids
        return tied.get((project, experiment)) or (newest if sole else "")

    def pid_roles(self, max_age: float | None = None) -> dict[int, str]:
        return {pid: actor.role for pid, actor in self.pid_actors(max_age).items()}

    # -- one poll ---------------------------------------------------------------------------
    def poll(self) -> PollResult:
        version = self._api.get("/api/version")
        if not isinstance(version, Mapping):
            raise SourceError("bad_response", "/api/version: not a JSON object")
        ray_version = outside_label(version.get("ray_version") or "unknown")
        session = outside_label(version.get("session_name") or "unknown")
        if self._session is not None and session != self._session:
            log.info(
                "Ray session changed from %s to %s: a new cluster",
                self._session,
                session,
                extra={"collector": self.name},
            )
            self._restarts.clear()
            self._dead_seen.clear()
            self._dead_counts = None
            self._book.session_changed()
        local_nodes = self._local_nodes()
        samples: list[Sample] = [Sample("rlhf_ray_cluster_info", (ray_version, session), 1.0)]
        if self.actors:
            samples += self._poll_actors(local_nodes)
            samples += self._poll_jobs()
            self._publish_trainers()
        else:
            rows = []
            for node in sorted(
                local_nodes
            ):  # node_id is filtered in the dashboard, state in the GCS
                rows += self._api.list("actors", "ALIVE", False, (("node_id", node),))[0]
            self._publish_pids(rows, local_nodes)
        self._session = session
        self._baseline = False
        self._polls += 1
        return PollResult(tuple(samples))

    def _local_nodes(self) -> set[str]:
        rows, _ = self._api.list("nodes", "ALIVE", False)
        nodes = {str(r.get("node_id")) for r in rows if r.get("node_ip") in self.node_ips}
        if not nodes:
            self._warn_once(
                "no local node",
                "no ALIVE Ray node has one of this host's addresses "
                "(%s): GPU memory cannot be matched to actors (role unknown)",
                ", ".join(sorted(self.node_ips)),
            )
        return nodes

    def _publish_pids(self, rows: Iterable[Mapping[str, Any]], local_nodes: set[str]) -> None:
        pids = {}
        for row in rows:
            pid = as_count(row.get("pid"))
            if pid > 0 and row.get("node_id") in local_nodes:
                name = str(row.get("class_name") or "")
                actor = _actor_name(row)
                pids[pid] = ActorProcess(name, self.roles.role(name, actor), actor)
        with self._pids_lock:
            self._pids = MappingProxyType(pids)
            self._pids_at = time.monotonic()

    def _poll_actors(self, local_nodes: set[str]) -> list[Sample]:
        by_class: dict[tuple[str, str], int] = {}
        for state in SUMMARIZED:
            counts, truncated = self._api.summary(state)
            for name, n in counts.items():
                by_class[name, state] = by_class.get((name, state), 0) + n
            if state == "DEAD":
                dead_counts, dead_truncated = counts, truncated
        live_rows = []
        by_role = {(role, state): 0 for role in ROLES for state in STATES}
        for state in LISTED:
            rows, _ = self._api.list("actors", state, True)
            for row in rows:
                name = str(row.get("class_name") or "")
                by_class[name, state] = by_class.get((name, state), 0) + 1
                # listed actors carry their name: a reward or teacher server is told apart
                # from a rollout server of the same class (summarized states cannot be)
                key = (self.roles.role(name, _actor_name(row)), state)
                by_role[key] = by_role.get(key, 0) + 1
            live_rows += rows
        self._count_restarts(live_rows)
        if dead_truncated or dead_counts != self._dead_counts:
            rows, _ = self._api.list("actors", "DEAD", True)
            self._count_deaths(rows)
            self._dead_counts = dead_counts
        self._publish_pids((r for r in live_rows if r.get("state") == "ALIVE"), local_nodes)
        self._publish_job_processes(live_rows)
        self._trainer_rows = [
            r for r in live_rows
            if r.get("state") == "ALIVE"
            and TRAINER_CLASSES.fullmatch(str(r.get("class_name") or "").rpartition(".")[2])
        ]  # fmt: skip

        for (name, state), n in by_class.items():
            if state in LISTED:
                continue
            key = (self.roles.role(name), state)
            by_role[key] = by_role.get(key, 0) + n
        samples = [Sample("rlhf_ray_actors", key, float(n)) for key, n in by_role.items()]
        if self.per_class:
            kept = sorted(by_class.items())
            if len({name for name, _ in by_class}) > MAX_CLASSES:
                self._warn_once(
                    "classes",
                    "more than %d actor classes: the per-class breakdown keeps the first %d",
                    MAX_CLASSES,
                    MAX_CLASSES,
                )
                names = sorted({name for name, _ in by_class})[:MAX_CLASSES]
                kept = [kv for kv in kept if kv[0][0] in set(names)]
            shown: dict[tuple[str, str], int] = {}  # class names from the answer, cleaned and
            for (name, state), n in kept:  # cut (two cut alike are summed, never doubled)
                key = (outside_label(name), state)
                shown[key] = shown.get(key, 0) + n
            samples += [Sample("rlhf_ray_actors_by_class", k, float(n)) for k, n in shown.items()]
        samples += [
            Sample("rlhf_ray_actor_restarts_total", (role,), float(n))
            for role, n in self._restarts_total.items()
        ]
        samples += [
            Sample("rlhf_ray_actor_deaths_total", key, float(n))
            for key, n in sorted(self._deaths_total.items())
        ]
        samples += [
            Sample("rlhf_ray_actor_failures_total", key, float(n))
            for key, n in sorted(self._failures_total.items())
        ]
        return samples

    def _publish_job_processes(self, rows: Iterable[Mapping[str, Any]]) -> None:
        by_job: dict[str, list[JobProcess]] = {}
        for row in rows:
            pid, node, job = as_count(row.get("pid")), row.get("node_id"), row.get("job_id")
            name = str(row.get("class_name") or "")
            if row.get("state") != "ALIVE" or pid <= 0 or not isinstance(node, str):
                continue
            if not isinstance(job, str) or name == "JobSupervisor":  # Ray's own actor
                continue
            kept = by_job.setdefault(job, [])
            if len(kept) < MAX_JOB_PROCESSES:
                actor = _actor_name(row)
                kept.append(JobProcess(self.roles.role(name, actor), name, actor, pid, node))
        order = {role: i for i, role in enumerate(ROLES)}
        self._job_procs = MappingProxyType(
            {
                job: tuple(sorted(procs, key=lambda p: (order.get(p.role, 99), p.name, p.pid)))
                for job, procs in by_job.items()
            }
        )

    def _count_restarts(self, rows: list[Mapping[str, Any]]) -> None:
        poll = self._polls
        for row in rows:
            actor_id = str(row.get("actor_id"))
            n = as_count(row.get("num_restarts"))
            previous = self._restarts.get(actor_id)
            seen = previous[0] if previous else 0
            if n > seen and (previous is not None or not self._baseline):
                role = self.roles.role(str(row.get("class_name") or ""), _actor_name(row))
                self._restarts_total[role] = self._restarts_total.get(role, 0) + n - seen
            self._restarts[actor_id] = (max(n, seen), poll)
        stale = [a for a, (_, at) in self._restarts.items() if poll - at > FORGET_AFTER_POLLS]
        for actor_id in stale:
            del self._restarts[actor_id]

    def _poll_jobs(self) -> list[Sample]:
        """The Jobs API's entries: each verl job's submission status, and counts by status."""
        try:
            entries = self._api.get("/api/jobs/")
            if not isinstance(entries, list):
                raise SourceError("bad_response", "/api/jobs/: not a list")
        except SourceError as exc:
            # the actor series do not depend on it: keep them, and the jobs' last facts
            # (a failed job stays failed); logged once per reason, counted as jobs_api_<reason>
            # in rlhf_exporter_collector_errors_total
            reason = "jobs_api_" + exc.reason  # rlhf_exporter_collector_errors_total{reason}
            self._errors[reason] = self._errors.get(reason, 0) + 1
            self._warn_once(f"jobs api {exc.reason}", "Ray's Jobs API unusable (%s): job "
                            "states keep their last Ray facts", exc)  # fmt: skip
            return [Sample("rlhf_ray_jobs", (s,), float(n))
                    for s, n in sorted(self._jobs_by_status.items())]  # fmt: skip
        self._jobs_by_status = self._book.update(entries)
        self._job_ids = self._book.job_ids()
        self._drivers = MappingProxyType(_drivers(entries))
        facts = self._book.facts()
        if facts != self._facts:
            self._facts = facts
            self.facts_version += 1
        return [
            Sample("rlhf_ray_jobs", (status,), float(n))
            for status, n in sorted(self._jobs_by_status.items())
        ]

    def _count_deaths(self, rows: list[Mapping[str, Any]]) -> None:
        for row in rows:
            actor_id = str(row.get("actor_id"))
            if actor_id in self._dead_seen:
                continue
            self._dead_seen[actor_id] = None
            self._restarts.pop(actor_id, None)
            role = self.roles.role(str(row.get("class_name") or ""), _actor_name(row))
            key = (role, death_reason(row))
            self._deaths_total[key] = self._deaths_total.get(key, 0) + (0 if self._baseline else 1)
            cause = row.get("death_cause")
            context = cause.get("actor_died_error_context") if isinstance(cause, Mapping) else None
            message = context.get("error_message") if isinstance(context, Mapping) else None
            if is_failure(key[1], message if isinstance(message, str) else "",
                          str(row.get("class_name") or "")):  # fmt: skip
                n = self._failures_total.get(key, 0)
                self._failures_total[key] = n + (0 if self._baseline else 1)
                self._book.failed_actor(str(row.get("job_id") or ""), key[1])
        excess = len(self._dead_seen) - MAX_DEAD_REMEMBERED
        if excess > 0:
            for actor_id in list(self._dead_seen)[:excess]:
                del self._dead_seen[actor_id]

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args, extra={"collector": self.name})


def _drivers(entries: Iterable[Any]) -> dict[str, JobProcess]:
    """Each running Jobs API entry's driver process (`driver_info.pid` on
    `driver_node_id`), by Ray job id."""
    out: dict[str, JobProcess] = {}
    for entry in itertools.islice(entries, 10_000):
        if not isinstance(entry, Mapping) or entry.get("status") != "RUNNING":
            continue
        info, node, job = entry.get("driver_info"), entry.get("driver_node_id"), entry.get("job_id")
        if not isinstance(info, Mapping) or not isinstance(job, str):
            continue
        pid = as_count(info.get("pid"))
        if pid > 0 and isinstance(node, str) and node:
            ident = str(entry.get("submission_id") or job)[:128]
            out[job] = JobProcess("driver", "driver", ident, pid, node)
    return out


def _actor_name(row: Mapping[str, Any]) -> str:
    """The actor's name in a state-API row ('' when unnamed)."""
    name = row.get("name")
    return name if isinstance(name, str) else ""
