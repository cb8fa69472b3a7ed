"""The submitted jobs whose driver logs the console source reads (docs/frameworks.md says why
this route).

AReaL, NeMo-RL and ROLL print their steps from the job's entrypoint (the driver), not from
an actor. Ray's job supervisor writes the entrypoint's stdout and stderr to
`job-driver-<submission id>.log` on the driver's node, and the state API streams that file
as it does an actor's stdout, by the driver's node and that file's name:
`GET /api/v0/logs/stream?node_id=N&filename=job-driver-ID.log&lines=-1` (the Jobs API entry
names the node, `driver_node_id`; Ray 2.60 answers 500 to `submission_id=ID`). So the console source lists the Jobs API's submissions
(`GET /api/jobs/`, every LIST_EVERY seconds at most), streams each running submission's
driver log, and detects the framework from what it prints (sources/framework_console.py),
never from a name.

A driver log also holds what the job's actors print (Ray forwards it, prefixed
`(Class pid=N)`): a line forwarded from a trainer actor whose own stdout the console source
reads (roles.TRAINER_CLASSES: verl's, OpenRLHF's) is read there, never twice; other actors'
lines (slime's rollout manager and trainer) are read here. Once a job's trainer actor is
read, its driver log is no longer read unless the driver printed a framework's steps itself.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..join.ports import Labels
from ..lifecycle import RayFact
from .base import SourceError
from .console_tails import ConsoleJob, Tail, close
from .framework_console import FrameworkConsoleReader
from .ray_jobs import tie
from .ray_state_api import StateApi
from .ray_token import RayToken

log = logging.getLogger(__name__)

JOBS_PATH = "/api/jobs/"
LIST_EVERY = 5.0  # seconds between two lists of the submissions, at least
MAX_ENTRIES = 10_000  # Jobs API entries read per list (the rest are ignored)
DRIVER_TAIL = "driver:"  # a driver log's key among a job's streams (actor ids never hold ':')
RUNNING = "RUNNING"
DRIVER_LOG = "job-driver-{}.log"  # Ray's job supervisor's file of the entrypoint's output
_SUBMISSION = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # an id that names a file, nothing else
_NODE = re.compile(r"[0-9a-fA-F]{8,128}")
_STATUSES = frozenset({"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"})


class Driver(NamedTuple):
    """One submission, as the Jobs API lists it."""

    submission_id: str
    node_id: str  # the node whose log directory holds its driver log
    job_id: str  # the driver's Ray job id ('' until the entrypoint connects to Ray)
    named: Labels | None  # (project, experiment) its metadata or overrides name
    fact: RayFact

    @property
    def key(self) -> str:
        """The console job it feeds: its Ray job id, else its submission id."""
        return self.job_id or self.submission_id

    @property
    def running(self) -> bool:
        return self.fact.status == RUNNING

    @property
    def log_file(self) -> dict[str, str]:
        """The state API's query for its driver log."""
        return {"node_id": self.node_id, "filename": DRIVER_LOG.format(self.submission_id)}


def _ms(value: Any) -> float | None:
    return value / 1000.0 if isinstance(value, int | float) and value > 0 else None


def parse(entries: Iterable[Any]) -> dict[str, Driver]:
    """The submissions (entries with a submission id, a known status and the node of their
    driver), by submission id; an id that is no plain name (a `/`, a space) is left out."""
    out: dict[str, Driver] = {}
    for entry in itertools.islice(entries, MAX_ENTRIES):
        if not isinstance(entry, Mapping):
            continue
        sid, status, job_id = entry.get("submission_id"), entry.get("status"), entry.get("job_id")
        node = entry.get("driver_node_id")
        if not isinstance(sid, str) or not _SUBMISSION.fullmatch(sid):
            continue
        if not isinstance(status, str) or status not in _STATUSES:
            continue
        if not isinstance(node, str) or not _NODE.fullmatch(node):
            continue
        running = status in ("PENDING", RUNNING)
        since = _ms(entry.get("start_time") if running else entry.get("end_time"))
        fact = RayFact(str(status), sid, "", since)
        job_id = job_id[:64] if isinstance(job_id, str) else ""
        out[sid] = Driver(sid, node, job_id, tie(entry), fact)
    return out


class DriverList:
    """The Jobs API's submissions, listed again every `every` seconds at most."""

    def __init__(self, address: str, timeout: float, token: RayToken | None, every: float):
        self.every = every
        self.drivers: dict[str, Driver] = {}
        self.listed = False  # a list was read (before, no driver is known to have ended)
        self._at: float | None = None
        self._warned: set[str] = set()
        self._api = StateApi(address, timeout, token, self._warn_once)

    def close(self) -> None:
        self._api.close()

    def refresh(self, mono: float) -> str | None:
        """List the submissions when `every` has passed; returns a failure's reason."""
        if self._at is not None and mono - self._at < self.every:
            return None
        self._at = mono
        try:
            entries = self._api.get(JOBS_PATH)
            if not isinstance(entries, list):
                raise SourceError("bad_response", f"{JOBS_PATH}: not a list")
        except SourceError as exc:  # the drivers known stay as they were
            self._warn_once(exc.reason, "console: Ray's Jobs API unusable (%s): driver logs "
                            "of new jobs are not read", exc)  # fmt: skip
            return exc.reason
        self.drivers, self.listed = parse(entries), True
        return None

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < 64:
            self._warned.add(key)
            log.warning(message, *args, extra={"collector": "console"})


def follow(
    jobs: dict[str, ConsoleJob], labels: dict[Labels, str], drivers: Mapping[str, Driver],
    mono: float,
) -> None:  # fmt: skip
    """The driver logs being read, as the latest list says: one whose submission ended or
    left the list is gone (read to its end, then closed); one that printed no framework's
    step is dropped once its job's trainer actor is read; a driver that connected to Ray
    has its job known by its Ray job id from then on."""
    for cj in list(jobs.values()):
        for key, tail in list(cj.tails.items()):
            if not tail.driver:
                continue
            d = drivers.get(tail.actor.submission_id)
            if d is not None:
                cj.driver_fact = d.fact
                if d.job_id and cj.job_id != d.job_id:
                    _rekey(jobs, labels, cj, d.job_id)
            if tail.gone_at is None and (d is None or not d.running):
                tail.gone_at = mono
            if len(cj.tails) > 1 and _undetected(tail):
                close(tail)
                del cj.tails[key]


def _rekey(jobs: dict[str, ConsoleJob], labels: dict[Labels, str], cj: ConsoleJob, to: str) -> None:
    other = jobs.get(to)
    if other is not None:  # its trainer's stream came first: the driver's joins that job
        if cj.job is None:
            del jobs[cj.job_id]
            other.tails.update(cj.tails)
            cj.tails = other.tails
        return
    del jobs[cj.job_id]
    if cj.job is not None and labels.get(cj.job.labels) == cj.job_id:
        labels[cj.job.labels] = to
    cj.job_id = to
    jobs[to] = cj


def _undetected(tail: Tail) -> bool:
    """A driver log in which no framework's step was seen (yet)."""
    return isinstance(tail.reader, FrameworkConsoleReader) and tail.reader.framework is None
