"""The `push` source: verl records POSTed to `/api/v1/records`, for jobs that cannot share a file.

Body (JSON, UTF-8), one of:

    {"project": "P", "experiment": "E", "records": [{"step": 1, "data": {...}}, ...]}
    {"project": "P", "experiment": "E", "step": 1, "data": {...}}

- `project`, `experiment`: non-empty strings of at most 200 characters, no control
  characters, not `.` or `..`; they become the job's labels.
- `records`: a non-empty list of verl records, applied in order; `step` is an integer >= 0,
  `data` an object (verl's flat metric dict, exactly as the `file` logger writes it).
- No other top-level or record keys are accepted (a typo is an error, not silently ignored).

Answers (JSON): 200 `{"accepted": N, "project", "experiment", "step", "run", "verdict"}`;
400 bad JSON or schema, 401 missing or wrong `Authorization: Bearer TOKEN` (when a token is
set), 409 a job of that name is read from a file (a file job always wins its name: a pushed
job is dropped when a file of its name appears), 411 no Content-Length, 413 body over the
limit, 429 too many pushed jobs (`push_max_jobs` in all, `push_max_jobs_per_client` per
client: the token's holders together when a token is set, else per address, every loopback
address one client), or too many failed authentications (`auth_throttled`, see
rlhf_exporter/auth.py: the token is then not compared). Every rejection is all-or-nothing: it changes no job,
and is counted in `rlhf_exporter_record_errors_total{collector="push",reason}`.
A pushed job that receives nothing for `job_expiry` seconds stops being exported.
Push is not polled, so it publishes no `rlhf_exporter_collector_last_success_timestamp_seconds`
(a start time that never moves would page as a stale collector).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from ..auth import AuthGuard, client_key
from ..diagnosis import Record, Thresholds
from ..job.limits import DEFAULT_LIMITS, MAX_STEP, Limits, limits_from_settings
from ..job.state import Job
from ..join.names import JobNames
from ..join.ports import Engines, JobFacts, StepWindows
from ..metrics.snapshot import Sample, Snapshot
from ..settings import Settings
from .base import Clock, Context
from .job_maker import JobMaker

log = logging.getLogger(__name__)

NAME = "push"
PATH = "/api/v1/records"
PUSHED_NAME_CHARS = 200  # a pushed job's project or experiment
MAX_JOBS = 1000
MAX_JOBS_PER_CLIENT = 100
BODY_KEYS = frozenset({"project", "experiment", "records", "step", "data"})
RECORD_KEYS = frozenset({"step", "data"})

# record_errors reasons
UNAUTHORIZED = "unauthorized"
TOO_LARGE = "too_large"
NO_LENGTH = "length_required"
INVALID_JSON = "invalid_json"
BAD_SCHEMA = "bad_schema"
CONFLICT = "job_conflict"
TOO_MANY_JOBS = "too_many_jobs"
TOO_MANY_JOBS_PER_CLIENT = "too_many_jobs_per_client"
JOB_DISPLACED = "job_displaced"  # a pushed job dropped because a file of its name appeared


class Answer(NamedTuple):
    status: int
    body: dict[str, Any]


class Rejected(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass
class _Pushed:
    job: Job
    last_push: float
    client: str = ""


def _label(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise Rejected(400, BAD_SCHEMA, f"'{key}' must be a non-empty string")
    if len(value) > PUSHED_NAME_CHARS:
        raise Rejected(400, BAD_SCHEMA, f"'{key}' is longer than {PUSHED_NAME_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise Rejected(400, BAD_SCHEMA, f"'{key}' contains control characters")
    if value in (".", ".."):  # its job page's link would resolve to another path
        raise Rejected(400, BAD_SCHEMA, f"'{key}' must not be '.' or '..'")
    return value


def _record(obj: Any, where: str) -> Record:
    if not isinstance(obj, dict):
        raise Rejected(
            400, BAD_SCHEMA, f"{where}: a record must be an object with 'step' and 'data'"
        )
    extra = set(obj) - RECORD_KEYS
    if extra:
        raise Rejected(
            400, BAD_SCHEMA, f"{where}: unknown key(s) {', '.join(sorted(map(str, extra)))}"
        )
    step = obj.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise Rejected(400, BAD_SCHEMA, f"{where}: 'step' must be an integer in 0..2**53")
    data = obj.get("data")
    if type(data) is not dict:
        raise Rejected(400, BAD_SCHEMA, f"{where}: 'data' must be an object")
    return Record(step, data)


def parse_body(raw: bytes) -> tuple[str, str, list[Record]]:
    """Validate a push body completely; raises Rejected, changes nothing."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Rejected(400, INVALID_JSON, f"body is not valid JSON (UTF-8): {exc}") from None
    if not isinstance(body, dict):
        raise Rejected(
            400, BAD_SCHEMA, "body must be a JSON object with project, experiment and records"
        )
    extra = set(body) - BODY_KEYS
    if extra:
        raise Rejected(
            400,
            BAD_SCHEMA,
            f"unknown key(s) {', '.join(sorted(map(str, extra)))}; "
            f"expected project, experiment and records (or step and data)",
        )
    project, experiment = _label(body, "project"), _label(body, "experiment")
    if "records" in body:
        if "step" in body or "data" in body:
            raise Rejected(
                400, BAD_SCHEMA, "give either 'records' or one record's 'step' and 'data', not both"
            )
        items = body["records"]
        if not isinstance(items, list) or not items:
            raise Rejected(
                400, BAD_SCHEMA, "'records' must be a non-empty list of {step, data} objects"
            )
        records = [_record(item, f"records[{i}]") for i, item in enumerate(items)]
    elif "step" in body or "data" in body:
        records = [_record({"step": body.get("step"), "data": body.get("data")}, "body")]
    else:
        raise Rejected(
            400, BAD_SCHEMA, "missing 'records' (or a single record's 'step' and 'data')"
        )
    return project, experiment, records


class PushSource(JobMaker):
    """Jobs fed by HTTP pushes. Not polled: each accepted push publishes a new snapshot."""

    name = NAME

    def __init__(
        self,
        th: Thresholds,
        max_bytes: int = 1 << 20,
        token: str | None = None,
        job_expiry: float = 86400.0,
        limits: Limits = DEFAULT_LIMITS,
        max_jobs: int = MAX_JOBS,
        max_jobs_per_client: int = MAX_JOBS_PER_CLIENT,
        clock: Clock = time.time,
        total_steps: int | None = None,
        windows: StepWindows | None = None,
        guard: AuthGuard | None = None,
        *,
        engines: Engines | None = None,
        facts: JobFacts | None = None,
        names: JobNames | None = None,
    ):
        self.th = th
        self.clock = clock
        self.total_steps = total_steps
        self.windows = windows  # where its jobs post step timelines (the WindowBoard)
        self.engines = engines  # what its jobs ask for engine evidence (the engine source)
        # what Ray says about a job (RaySource.job_fact), when Ray is read
        self.facts = facts
        self.max_bytes = max_bytes
        self.guard = guard or AuthGuard(token, NAME)
        self.job_expiry = job_expiry
        # jobs the verl files export: never export one twice (a new file displaces a push)
        self.names = names
        if names is not None:
            names.yields(self)
        self.limits = limits
        self.max_jobs = max_jobs
        self.max_jobs_per_client = max_jobs_per_client
        self._per_client: Counter[str] = Counter()
        self._jobs: dict[tuple[str, str], _Pushed] = {}
        self._rejected: Counter[str] = Counter()
        self._records = 0
        self._lock = threading.Lock()
        self._next_expiry = float("inf")
        self._facts_seen = 0
        self._snapshot = self._build()

    # -- Source interface -------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> PushSource | None:
        if not settings.push:
            return None
        return cls(
            context.thresholds,
            settings.push_max_bytes,
            settings.push_token,
            settings.job_expiry,
            limits=limits_from_settings(settings),
            max_jobs=settings.push_max_jobs,
            max_jobs_per_client=settings.push_max_jobs_per_client,
            clock=context.clock,
            total_steps=settings.total_steps,
            windows=context.windows,
            guard=AuthGuard(
                settings.push_token, NAME, settings.auth_fail_rate, settings.auth_fail_rate_total
            ),
            engines=context.engines,
            facts=context.facts,
            names=context.names,
        )

    def start(self) -> None:
        with self._lock:
            self._publish()

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def snapshot(self) -> Snapshot:
        stale = self._facts_version() != self._facts_seen  # Ray's facts changed
        if (stale or self.clock() >= self._next_expiry) and self._lock.acquire(blocking=False):
            try:  # a pushed job expired: publish without it (never waits on a push)
                self._publish()
            finally:
                self._lock.release()
        return self._snapshot

    def jobs(self) -> tuple[dict[str, Any], ...]:
        with self._lock:
            return tuple({**p.job.summary(), "source": "push"} for p in self._live(self.clock()))

    def _facts_version(self) -> int:
        return self.facts.facts_version if self.facts is not None else 0

    def has_job(self, project: str, experiment: str) -> bool:
        return (project, experiment) in self._jobs

    def displace(self, project: str, experiment: str) -> bool:
        """A file of this job appeared: drop the pushed job (the file wins its name; later
        pushes get 409). Returns whether there was one."""
        with self._lock:
            pushed = self._jobs.pop((project, experiment), None)
            if pushed is None:
                return False
            self._rejected.update(pushed.job.take_drops())
            self._per_client[pushed.client] -= 1
            self._rejected[JOB_DISPLACED] += 1
            self._publish()
            return True

    # -- the endpoint ---------------------------------------------------------------------
    def handle(
        self,
        authorization: str | None,
        content_length: str | None,
        read: Callable[[int], bytes],
        client: str = "",
    ) -> Answer:
        """One POST: check the token, then the size, then the body; apply it all or nothing."""
        try:
            self._authorize(authorization, client)
            length = self._length(content_length)
            raw = read(length)
            if len(raw) != length:
                raise Rejected(400, INVALID_JSON, f"body ended after {len(raw)} of {length} bytes")
            project, experiment, records = parse_body(raw)
            return self._apply(project, experiment, records, client)
        except Rejected as exc:
            with self._lock:
                self._rejected[exc.reason] += 1
                self._publish()
            log.debug("push rejected (%s): %s", exc.reason, exc, extra={"reason": exc.reason})
            return Answer(exc.status, {"error": str(exc), "reason": exc.reason})

    def _authorize(self, authorization: str | None, client: str) -> None:
        denied = self.guard.check(authorization, client)
        if denied is not None:
            raise Rejected(denied.status, denied.reason, denied.message)

    def _length(self, content_length: str | None) -> int:
        if content_length is None:
            raise Rejected(411, NO_LENGTH, "a Content-Length header is required")
        try:
            length = int(content_length)
        except ValueError:
            raise Rejected(400, INVALID_JSON, f"bad Content-Length {content_length!r}") from None
        if length < 0:
            raise Rejected(400, INVALID_JSON, f"bad Content-Length {content_length!r}")
        if length > self.max_bytes:
            raise Rejected(
                413,
                TOO_LARGE,
                f"body of {length} bytes is over the limit of {self.max_bytes} "
                f"(push_max_bytes); send fewer records per request",
            )
        return length

    def _apply(
        self, project: str, experiment: str, records: list[Record], client: str = ""
    ) -> Answer:
        now = self.clock()
        key = (project, experiment)
        # whose jobs count against push_max_jobs_per_client: the token's holders together
        # when a token is set, else the client's address (every loopback address is one)
        client = "token" if self.guard.required else client_key(client)
        with self._lock:  # checked under the lock: a file's displace() cannot slip between
            if self.names is not None and self.names.taken(project, experiment):
                raise Rejected(
                    409,
                    CONFLICT,
                    f"job {project}/{experiment} is already read from a verl file or its printed steps",
                )
            pushed = self._jobs.get(key)
            if pushed is None:
                self._expire(now)
                if len(self._jobs) >= self.max_jobs:
                    raise Rejected(
                        429, TOO_MANY_JOBS, f"already {self.max_jobs} pushed jobs (push_max_jobs)"
                    )
                if self._per_client[client] >= self.max_jobs_per_client:
                    raise Rejected(
                        429,
                        TOO_MANY_JOBS_PER_CLIENT,
                        f"client {client or '?'} already pushes {self.max_jobs_per_client} jobs "
                        "(push_max_jobs_per_client)",
                    )
                job = self.new_job(project, experiment)
                pushed = self._jobs[key] = _Pushed(job, now, client)
                self._per_client[client] += 1
                log.info(
                    "new pushed job %s/%s",
                    project,
                    experiment,
                    extra={"project": project, "experiment": experiment},
                )
            accepted = pushed.job.feed(records, now)
            pushed.last_push = now
            self._records += accepted
            self._publish()
            job = pushed.job
            return Answer(
                200,
                {
                    "accepted": accepted,
                    "project": project,
                    "experiment": experiment,
                    "step": job.step,
                    "run": job.run,
                    "verdict": job.verdict,
                },
            )

    # -- snapshots ------------------------------------------------------------------------
    def _live(self, now: float) -> list[_Pushed]:
        return [p for p in self._jobs.values() if now - p.last_push <= self.job_expiry]

    def _publish(self) -> None:
        self._snapshot = self._build()

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._jobs.items() if now - p.last_push > self.job_expiry]:
            pushed = self._jobs.pop(key)  # expired: forget it (a new push starts it afresh)
            self._rejected.update(pushed.job.take_drops())
            self._per_client[pushed.client] -= 1
            if self._per_client[pushed.client] <= 0:
                del self._per_client[pushed.client]

    def _build(self) -> Snapshot:
        now = self.clock()
        self._expire(now)
        parts: list[Sequence[Sample]] = []
        self._facts_seen = self._facts_version()
        sole = len(self._jobs) == 1
        for p in self._jobs.values():
            try:
                if self.facts is not None:
                    p.job.set_ray(self.facts.job_fact(p.job.project, p.job.experiment, sole))
                p.job.tick(now)  # a held step complete without a new push (its S, an end)
                part = p.job.samples()
                self._rejected.update(p.job.take_drops())  # what it dropped, by reason
                parts.append(part)
            except Exception:  # never lets one job remove the others' series
                self._rejected["internal_error"] += 1
                log.warning("push: building the series of a job failed (a bug)", exc_info=True)
        # the jobs' samples are referenced (parts), never copied into one flat tuple
        rest = (Sample("rlhf_exporter_jobs", (NAME,), float(len(self._jobs))),)
        # the next moment the snapshot changes by itself: a job expires, or a held step's
        # S passes (Job.tick)
        self._next_expiry = min(
            (p.last_push + self.job_expiry for p in self._jobs.values()), default=float("inf")
        )
        dues = [due for p in self._jobs.values() if (due := p.job.due) is not None]
        self._next_expiry = min([self._next_expiry, *dues])
        return Snapshot(
            NAME,
            True,
            0.0,
            None,  # not polled: no last success (see the module docstring)
            MappingProxyType({}),
            self._records,
            MappingProxyType(dict(self._rejected)),
            rest,
            now,
            parts=tuple(parts),
        )

    def describe(self) -> str:
        auth = "token required" if self.guard.required else "no token"
        return f"push (POST {PATH}, {auth}, max {self.max_bytes} bytes)"
