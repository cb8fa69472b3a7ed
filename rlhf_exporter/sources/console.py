"""The `console` source: every verl job on the Ray cluster, read from what it already prints.

verl's `console` logger (on by default) prints each step as `step:N - key:value - ...` on
the stdout of the job's trainer actor (`TaskRunner`, `TaskRunnerV1`, `FullyAsyncTrainer`,
...). Ray keeps that stdout in a file on the actor's node and serves it by actor id:
`GET /api/v0/logs/stream?actor_id=ID&lines=-1` streams the file from its first byte and
follows it (docs/serve.md#the-console-source says why this route). So no job needs a
change, a volume or a pusher: the head's sidecar finds each trainer actor through the Ray
source's poll, streams its stdout, turns the printed steps into the records the file logger
would have written (sources/console_reader.py), and feeds them to a `Job` like any source.
Other frameworks are read the same way: OpenRLHF's trainer actor by its class, and a
submitted job's driver log (AReaL, NeMo-RL and ROLL print their steps from the driver;
slime's two actors' lines reach it through Ray) by its submission id, the framework detected
from the text (sources/console_drivers.py, sources/framework_console.py); a framework that
prints each step in halves has them joined first (sources/console_join.py).

- One stream per trainer actor or driver log, at most `max_streams` (Ray's state API serves at most 100
  requests at once: `RAY_STATE_SERVER_MAX_HTTP_REQUEST`), each read without waiting, at
  most `stream_budget` bytes per poll and `poll_budget` in all; a line is bounded by
  `max_line`. A failed stream is opened again after a backoff (1 s doubling to
  `MAX_BACKOFF`), skipping the bytes already read: a reconnect never counts a step twice.
- A job is one Ray job id: its streams feed one `Job`. Its labels are what
  verl printed at start (`trainer.project_name`, `trainer.experiment_name` in its resolved
  config), else what its submission names (metadata, or the entrypoint's overrides), else
  (`unnamed`, its submission id or Ray job id).
- Its state is its own submission's (Ray job id -> Jobs API entry): another submission that
  merely names the same project and experiment never ends it.
- A job whose name a verl file holds is the file source's (the file is the exact record
  stream; the console source stops reading it); a second live job that prints the name of
  a job already read here is exported under `<experiment>@<submission>` (`name_claimed`).
- A sidecar that starts in the middle of a job reads the whole stdout again (the job's
  identity and history) before exporting it: a history is never shown half-read.
- Nothing a job prints is logged or exported as text: reasons are counted
  (`rlhf_exporter_record_errors_total{collector="console"}`), streams' failures too
  (`rlhf_exporter_collector_errors_total{collector="console",reason="stream_<reason>"}`,
  and `drivers_<reason>` for the list of submissions).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from ..diagnosis import Record, Thresholds
from ..frameworks import ACTOR_FRAMEWORKS, VERL
from ..job.cleaning import INTERNAL_ERROR, clean_label
from ..job.limits import DEFAULT_LIMITS, Limits, limits_from_settings
from ..job.state import Job
from ..join.names import JobNames
from ..join.ports import Engines, JobFacts, Labels, StepWindows, TrainerActor, TrainerActors
from ..lifecycle import ENDED_STATUSES
from ..metrics.snapshot import Sample
from ..settings import Settings
from . import http
from .base import Clock, Context, PollingSource, PollResult
from .console_drivers import DRIVER_TAIL, LIST_EVERY, Driver, DriverList, follow
from .console_join import HALVES, StepJoiner
from .console_reader import ConsoleReader
from .console_tails import ConsoleJob, Tail, close, drained, quiet, settle
from .framework_console import FrameworkConsoleReader
from .job_maker import JobMaker
from .log_stream import LogStream, StreamEnded, wait_readable
from .ray import resolve_address
from .ray_token import RayToken
from .roles import TRAINER_CLASSES

log = logging.getLogger(__name__)

NAME = "console"
STREAM_PATH = "/api/v0/logs/stream"
MAX_BACKOFF = 60.0  # seconds between two tries of a failing stream, at most
OPENS_PER_POLL = 4  # streams opened per poll at most (each may wait `timeout`)
CATCH_UP = 0.5  # of the interval, spent at most re-reading streams that have more
CATCH_UP_WAIT = 0.05  # seconds waited at most for their sockets between two such passes
FILE_PATH = "/api/v0/logs/file"
TAIL_KEEP = 4096  # last bytes of a stream kept, to compare with the file's last line
STALE = "stale"  # a stream that no longer follows its file (truncated in place): read anew
STALE_CHECKS = 1  # quiet streams compared with their files per poll, at most
UNNAMED = "unnamed"
NAME_CLAIMED = "name_claimed"  # a live job printed the name of another live job
TOO_MANY_STREAMS = "too_many_streams"  # a trainer actor over max_streams: not read
ENDED_FORGOTTEN = "ended_job_forgotten"  # an ended job dropped before job_expiry: over the bound
ENDED_KEPT = 4  # ended jobs kept per stream of max_streams, at most (the oldest go first)
OTHER_SUBMISSION_END = "ray_end_other_submission"


class ConsoleSource(PollingSource, JobMaker):
    def __init__(
        self,
        th: Thresholds,
        trainers: TrainerActors,
        address: str,
        *,
        token: RayToken | None = None,
        interval: float = 1.0,
        timeout: float = 5.0,
        max_streams: int = 50,
        max_line: int = 1 << 20,
        stream_budget: int = 8 << 20,
        poll_budget: int = 64 << 20,
        stale_after: float = 60.0,
        job_expiry: float = 86400.0,
        limits: Limits = DEFAULT_LIMITS,
        clock: Clock = time.time,
        total_steps: int | None = None,
        windows: StepWindows | None = None,
        engines: Engines | None = None,
        names: JobNames | None = None,
        facts: JobFacts | None = None,
        drivers_every: float = LIST_EVERY,
    ):
        super().__init__(NAME, interval, wall=clock)
        self.th, self.limits, self.clock = th, limits, clock
        self.total_steps, self.windows, self.engines = total_steps, windows, engines
        self.trainers = trainers
        self.address = address.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.max_streams = max_streams
        self.max_line = max_line
        self.stream_budget = stream_budget
        self.poll_budget = max(poll_budget, stream_budget)
        self.stale_after = stale_after
        self._http = http.Client(timeout=timeout, max_bytes=64 << 10)
        self._drivers = DriverList(self.address, timeout, token, drivers_every)
        self.job_expiry = job_expiry
        self.names = names
        self.facts = facts  # the jobs Ray ties by name: another submission's end is ignored
        if names is not None:
            names.yields(self)
        self._rejected: Counter[str] = Counter()
        self._errors.update({"stream_" + r: 0 for r in (*http.REASONS, "ended", STALE)})
        self._errors.update({"drivers_" + r: 0 for r in http.REASONS})
        self._jobs: dict[str, ConsoleJob] = {}  # by Ray job id
        self._labels: dict[Labels, str] = {}  # exported labels -> Ray job id
        self._over: set[str] = set()  # actor ids not read (over max_streams), counted once
        self._records = 0
        self._rotate = 0
        self._summaries: tuple[dict[str, Any], ...] = ()
        self._other_ends: set[tuple[str, str]] = set()  # (job id, other submission) counted
        self.stats: Counter[str] = Counter()  # backlog_hidden

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> ConsoleSource | None:
        trainers = context.trainers
        if not settings.console or trainers is None:
            return None
        return cls(
            context.thresholds,
            trainers,
            resolve_address(settings.ray_address),
            token=RayToken.resolve(settings.ray_token, settings.ray_token_file),
            interval=settings.console_interval,
            timeout=settings.ray_timeout,
            max_streams=settings.console_max_streams,
            max_line=settings.max_line_bytes,
            stream_budget=settings.console_stream_budget,
            job_expiry=settings.job_expiry,
            limits=limits_from_settings(settings),
            clock=context.clock,
            total_steps=settings.total_steps,
            windows=context.windows,
            engines=context.engines,
            names=context.names,
            facts=context.facts,
        )

    def describe(self) -> str:
        return (
            f"console (trainers' stdout and drivers' logs from Ray at {self.address}, "
            f"every {self.interval:g}s)"
        )

    def jobs(self) -> tuple[dict[str, Any], ...]:
        return self._summaries

    def close(self) -> None:
        for cj in self._jobs.values():
            for tail in cj.tails.values():
                close(tail)
        self._drivers.close()

    # -- the name a verl file takes -----------------------------------------------------------
    def displace(self, project: str, experiment: str) -> bool:
        """A verl file took this name: its job is the file source's from now on."""
        job_id = self._labels.pop((project, experiment), None)
        cj = self._jobs.get(job_id) if job_id is not None else None
        if cj is None:
            return False
        cj.yielded, cj.job = True, None
        for tail in cj.tails.values():
            close(tail)
        return True

    # -- one poll --------------------------------------------------------------------------
    def poll(self) -> PollResult:
        now, mono = self.clock(), time.monotonic()
        if self.trainers.trainers_seen:
            self._sync(self.trainers.trainer_actors(), now, mono)
        failed = self._drivers.refresh(mono)
        if failed is not None:
            self._errors["drivers_" + failed] = self._errors.get("drivers_" + failed, 0) + 1
        if self._drivers.listed:
            self._sync_drivers(self._drivers.drivers, now, mono)
        self._read_all(now, mono)
        return self._publish(now)

    def _sync(self, actors: Mapping[str, TrainerActor], now: float, mono: float) -> None:
        """Start a tail for each new trainer actor; mark the ones Ray no longer lists."""
        self._over = {k for k in self._over if k in actors or k.startswith(DRIVER_TAIL)}
        live = 0
        for known in self._jobs.values():
            for actor_id, tail in known.tails.items():
                if not tail.driver and actor_id not in actors and tail.gone_at is None:
                    tail.gone_at = mono
                live += tail.gone_at is None
        for actor_id, actor in actors.items():
            cj = self._jobs.get(actor.job_id)
            if cj is not None and actor_id in cj.tails:
                continue
            if live >= self.max_streams:
                if actor_id not in self._over:
                    self._over.add(actor_id)
                    self._rejected[TOO_MANY_STREAMS] += 1
                    log.warning("more than %d verl trainer actors: the console source does "
                                "not read the others (console_max_streams)", self.max_streams,
                                extra={"collector": NAME})  # fmt: skip
                continue
            if cj is None:
                cj = ConsoleJob(actor.job_id, actor.submission_id, actor.named, last_change=now)
                self._jobs[actor.job_id] = cj
            cj.tails[actor_id] = Tail(actor, self._reader(actor), heard_at=mono)
            cj.ended_at = None
            live += 1

    def _sync_drivers(self, drivers: Mapping[str, Driver], now: float, mono: float) -> None:
        """Start a tail for each running submission's driver log (sources/console_drivers.py)
        whose job has no stream yet, within `max_streams`; follow the ones already read."""
        follow(self._jobs, self._labels, drivers, mono)
        live = sum(t.gone_at is None for cj in self._jobs.values() for t in cj.tails.values())
        for d in drivers.values():
            known = self._jobs.get(d.key)
            key = DRIVER_TAIL + d.submission_id
            if not d.running or (known is not None and known.tails):
                continue
            if live >= self.max_streams:
                if key not in self._over:
                    self._over.add(key)
                    self._rejected[TOO_MANY_STREAMS] += 1
                continue
            cj = known or ConsoleJob(d.key, d.submission_id, d.named, last_change=now)
            self._jobs[d.key] = cj
            cj.driver_fact, cj.ended_at = d.fact, None
            actor = TrainerActor("", "", d.key, d.submission_id, d.named)
            reader = self._driver_reader()
            cj.tails[key] = Tail(actor, reader, heard_at=mono, driver=True, log_file=d.log_file)
            live += 1
        running = {DRIVER_TAIL + sid for sid, d in drivers.items() if d.running}
        self._over = {k for k in self._over if not k.startswith(DRIVER_TAIL) or k in running}

    def _reader(self, actor: TrainerActor) -> ConsoleReader | FrameworkConsoleReader:
        """verl's reader, or the reader of the framework whose actor class it is."""
        framework = ACTOR_FRAMEWORKS.get(actor.class_name.rpartition(".")[2])
        if framework is not None:
            return FrameworkConsoleReader(self.max_line, framework)
        return ConsoleReader(self.max_line)

    def _driver_reader(self) -> FrameworkConsoleReader:
        """A driver log's reader: the framework from the text; trainers' lines read apart."""
        return FrameworkConsoleReader(self.max_line, None, TRAINER_CLASSES)

    def _read_all(self, now: float, mono: float) -> None:
        tails = [(cj, t) for cj in self._jobs.values() if not cj.yielded for t in cj.tails.values()]
        if tails:  # start where the last poll's budget ran out, so no stream starves
            k = self._rotate % len(tails)
            tails = tails[k:] + tails[:k]
        left, opens = self.poll_budget, OPENS_PER_POLL
        busy: list[tuple[ConsoleJob, Tail]] = []  # streams that brought bytes: read again
        for i, (cj, tail) in enumerate(tails):
            if left <= 0:
                self._rotate += i
                break
            if tail.stream is None and (opens <= 0 or mono < tail.retry_at or drained(tail, mono)):
                continue
            opens -= tail.stream is None
            got = self._read_safely(cj, tail, min(self.stream_budget, left), now, mono)
            left -= got
            if got:
                busy.append((cj, tail))
        self._catch_up(busy, left, now, mono)
        settle([t for _, t in tails], mono)
        checks = STALE_CHECKS  # each may wait `timeout` for Ray
        for _, tail in tails:
            if checks > 0 and quiet(tail, mono, self.stale_after):
                checks -= 1
                self._check_stale(tail, mono)
        for cj in list(self._jobs.values()):
            self._retire(cj, now, mono)
        self._forget_oldest_ended()

    def _catch_up(
        self, busy: list[tuple[ConsoleJob, Tail]], left: int, now: float, mono: float
    ) -> None:
        """Streams with more to send (a backlog: a sidecar started in the middle of a long
        job) are read again, for at most CATCH_UP of the interval and the poll's budget, so a
        backlog is read as fast as Ray sends it, not `stream_budget` per interval. Between
        passes that found nothing, it waits on their sockets (CATCH_UP_WAIT at most)."""
        deadline = mono + CATCH_UP * self.interval
        while busy and left > 0 and time.monotonic() < deadline:
            again = []
            for cj, tail in busy:
                if tail.stream is None or left <= 0:
                    continue
                got = self._read_safely(cj, tail, min(self.stream_budget, left), now, mono)
                left -= got
                if got:
                    again.append((cj, tail))
            if not again:
                wait = min(CATCH_UP_WAIT, deadline - time.monotonic())
                streams = [t.stream for _, t in busy if t.stream is not None]
                ready = wait_readable(streams, wait) if wait > 0 else set()
                again = [
                    (cj, t) for cj, t in busy if t.stream is not None and id(t.stream) in ready
                ]
            busy = again

    def _check_stale(self, tail: Tail, mono: float) -> None:
        """Ray's stream follows the file at its offset: a file truncated in place (say, by
        `logrotate`'s copytruncate; Ray appends to it) is never read again, and its job would
        look stalled. So a quiet stream's last whole lines (TAIL_KEEP bytes at most) are
        compared with the file's last lines (`lines=N`); when two comparisons in a row differ
        and nothing came in between, the stream is read anew from the file's first byte
        (`stream_stale`)."""
        tail.checked_at = mono
        window = tail.last_bytes
        if tail.delivered > len(window):  # it starts inside a line: from the next one on
            cut = window.find(b"\n")
            window = window[cut + 1 :] if cut >= 0 else b""
        if not window:
            return  # one line longer than TAIL_KEEP: nothing to compare
        lines = window.count(b"\n") + (not window.endswith(b"\n"))
        query = urlencode({**_whose(tail), "lines": str(lines)})
        try:
            got = self._http.request(f"{self.address}{FILE_PATH}?{query}",
                                     headers=self._auth(), truncate=True)  # fmt: skip
        except http.HttpFailure:
            return  # Ray does not say: the stream stays as it is
        if got.status != 200 or got.truncated:
            return
        differs = got.body != window
        if not differs or not tail.suspect:
            tail.suspect = differs
            return
        close(tail)
        self._errors["stream_" + STALE] += 1
        log.warning("console: a verl trainer's stdout file no longer ends as its stream "
                    "(truncated in place?): reading it again from its first byte",
                    extra={"collector": NAME, "reason": STALE})  # fmt: skip
        tail.delivered, tail.last_bytes, tail.suspect = 0, b"", False
        tail.reader = self._driver_reader() if tail.driver else self._reader(tail.actor)
        tail.retry_at = mono

    def _read_safely(self, cj: ConsoleJob, tail: Tail, budget: int, now: float, mono: float) -> int:
        try:
            return self._read(cj, tail, budget, now, mono)
        except Exception:  # a bug: never lets one stream stop the others
            self._rejected[INTERNAL_ERROR] += 1
            log.error("console: reading a trainer's stdout failed (a bug)", exc_info=True,
                      extra={"collector": NAME, "reason": INTERNAL_ERROR})  # fmt: skip
            close(tail)
            tail.retry_at = mono + MAX_BACKOFF
            return 0

    def _read(self, cj: ConsoleJob, tail: Tail, budget: int, now: float, mono: float) -> int:
        """Read what one stream has (opening it first); returns the bytes read."""
        if tail.stream is None:
            tail.stream = LogStream(self._url(tail), timeout=self.timeout,
                                    headers=self._auth(), skip=tail.delivered)  # fmt: skip
            tail.opened_at, tail.got_any, tail.empty = mono, False, False
            try:
                tail.stream.open()
            except http.HttpFailure as exc:
                return self._stream_failed(tail, exc.reason, mono)
        try:
            chunk = tail.stream.read(budget)
        except StreamEnded:  # Ray ended it: a live actor's is opened again, as a failure's
            tail.stream = None
            tail.caught_up = True
            if tail.gone_at is not None:
                tail.retry_at = float("inf")
                return 0
            return self._stream_failed(tail, "ended", mono)
        except http.HttpFailure as exc:
            return self._stream_failed(tail, exc.reason, mono)
        tail.failures = 0
        tail.empty = not chunk
        if not chunk:
            return 0
        tail.got_any = True
        tail.delivered += len(chunk)
        tail.heard_at = mono
        tail.last_bytes = (tail.last_bytes + chunk[-TAIL_KEEP:])[-TAIL_KEEP:]
        tail.suspect = False
        self._feed(cj, tail, chunk, now)
        return len(chunk)

    def _stream_failed(self, tail: Tail, reason: str, mono: float) -> int:
        close(tail)
        self._errors["stream_" + reason] = self._errors.get("stream_" + reason, 0) + 1
        tail.failures += 1
        tail.retry_at = mono + min(MAX_BACKOFF, 2.0 ** (tail.failures - 1))
        if tail.failures == 1:
            log.warning("console: a verl trainer's stdout cannot be read from Ray (%s); "
                        "trying again with a backoff", reason,
                        extra={"collector": NAME, "reason": reason})  # fmt: skip
        return 0

    def _feed(self, cj: ConsoleJob, tail: Tail, chunk: bytes, now: float) -> None:
        self._take(cj, tail, tail.reader.feed(chunk), now)

    def _take(
        self, cj: ConsoleJob, tail: Tail, records: Iterable[Record], now: float, end: bool = False
    ) -> None:
        """Records read from one tail into the job (through its joiner, for a framework that
        prints each step in halves); `end`: the job's input ended, held steps come out."""
        batch: list[Record] = []
        for record in records:
            if cj.job is None and not cj.yielded:
                self._name(cj, tail)
            batch.append(record)
        framework = _framework(cj)
        if cj.joiner is None and framework in HALVES:
            cj.joiner = StepJoiner(framework)
        if cj.joiner is not None:
            batch = [*cj.joiner.feed(batch), *(cj.joiner.finish() if end else ())]
            self._rejected.update(cj.joiner.rejected)
            cj.joiner.rejected.clear()
        if batch and cj.job is not None:
            self._records += cj.job.feed(batch, now)
            cj.last_change = now
        rejected = tail.reader.rejected
        if rejected:
            self._rejected.update(rejected)
            rejected.clear()

    def _name(self, cj: ConsoleJob, tail: Tail) -> None:
        """Give the job its labels, from its first step on (see the module's docstring)."""
        ident = tail.reader.identity
        fallback = cj.submission_id or cj.job_id
        project = (ident.project if ident else None) or (cj.named[0] if cj.named else UNNAMED)
        experiment = (ident.experiment if ident else None) or (
            cj.named[1] if cj.named else fallback
        )
        labels = (clean_label(project[:200])[0], clean_label(experiment[:200])[0])
        if self.names is not None and self.names.file_holds(*labels):
            cj.yielded = True
            for t in cj.tails.values():
                close(t)
            return
        holder = self._jobs.get(self._labels.get(labels, ""))
        job = None
        if holder is not None and holder is not cj:
            if holder.ended_at is None:  # another live job prints this name
                self._rejected[NAME_CLAIMED] += 1
                labels = (labels[0], f"{labels[1]}@{fallback}"[:240])
            else:  # the same job submitted again: a new run of it, its counters carry on
                job, holder.job = holder.job, None
                del self._jobs[holder.job_id]
                if job is not None:
                    job.new_run()
        cj.job = job or self.new_job(*labels)
        self._labels[labels] = cj.job_id
        if self.names is not None:
            self.names.claim(*labels, by=self)

    def _retire(self, cj: ConsoleJob, now: float, mono: float) -> None:
        """Close the streams of actors Ray no longer lists once they went quiet; forget a
        job that ended `job_expiry` ago."""
        for tail in cj.tails.values():
            if tail.gone_at is not None and tail.stream is not None and drained(tail, mono):
                close(tail)
                tail.caught_up = True
        tails = cj.tails.values()
        if cj.ended_at is None and all(t.gone_at is not None and t.stream is None for t in tails):
            self._finish(cj, now)
            cj.ended_at = now
        if cj.ended_at is not None and now - max(cj.ended_at, cj.last_change) > self.job_expiry:
            del self._jobs[cj.job_id]
            if cj.job is not None:
                self._rejected.update(cj.job.take_drops())
                self._labels.pop(cj.job.labels, None)
                if self.names is not None:
                    self.names.unclaim(*cj.job.labels)

    def _finish(self, cj: ConsoleJob, now: float) -> None:
        """Every stream of the job has ended: what its readers and joiner hold comes out (a
        block the next line would have closed, a step held for a value logged with the next)."""
        if cj.yielded or not cj.tails:
            return
        for tail in cj.tails.values():
            if isinstance(tail.reader, FrameworkConsoleReader):
                self._take(cj, tail, tail.reader.finish(), now)
        if cj.joiner is not None:
            self._take(cj, next(iter(cj.tails.values())), (), now, end=True)

    def _forget_oldest_ended(self) -> None:
        """Ended jobs are kept `job_expiry`, and at most ENDED_KEPT x max_streams of them
        (many short jobs a day): the oldest ended go first, counted."""
        ended = [cj for cj in self._jobs.values() if cj.ended_at is not None]
        over = len(ended) - ENDED_KEPT * self.max_streams
        if over <= 0:
            return
        ended.sort(key=lambda cj: max(cj.ended_at or 0.0, cj.last_change))
        for cj in ended[:over]:
            del self._jobs[cj.job_id]
            self._rejected[ENDED_FORGOTTEN] += 1
            if cj.job is not None:
                self._rejected.update(cj.job.take_drops())
            if cj.job is not None and self._labels.get(cj.job.labels) == cj.job_id:
                del self._labels[cj.job.labels]
                if self.names is not None:
                    self.names.unclaim(*cj.job.labels)

    # -- export ----------------------------------------------------------------------------
    def _publish(self, now: float) -> PollResult:
        parts: list[Sequence[Sample]] = []
        summaries: list[dict[str, Any]] = []
        for cj in self._jobs.values():
            job = cj.job
            if job is not None:
                self._rejected.update(job.take_drops())  # what its cleaning dropped
            if job is None or cj.yielded:
                continue
            if not all(t.caught_up for t in cj.tails.values()):
                self.stats["backlog_hidden"] += 1  # a history is never shown half-read
                continue
            try:
                self._job_state(cj, job)
                job.tick(now)  # a held step complete without a new record (its S, an end)
                job.set_framework(_framework(cj))
                parts.append(job.samples())
            except Exception:
                self._rejected[INTERNAL_ERROR] += 1
                log.error("console: building a job's series failed (a bug); not exported",
                          exc_info=True, extra={"collector": NAME})  # fmt: skip
                continue
            source = f"console (Ray job {cj.submission_id or cj.job_id})"
            summary = {**job.summary(), "source": source, "ray_job_id": cj.job_id}
            summaries.append({**summary, "framework": _framework(cj)})
        self._summaries = tuple(summaries)
        jobs = Sample("rlhf_exporter_jobs", (NAME,), float(len(parts)))
        return PollResult((jobs,), self._records, dict(self._rejected), None, tuple(parts))

    def _job_state(self, cj: ConsoleJob, job: Job) -> None:
        """The job's state from its own submission (None for a driver started by hand)."""
        fact = self.trainers.submission_fact(cj.job_id) or cj.driver_fact
        job.set_ray(fact)
        named = self.facts.job_fact(*job.labels) if self.facts is not None else None
        own = fact.submission if fact is not None else cj.submission_id
        if named is not None and named.status in ENDED_STATUSES and named.submission != own:
            key = (cj.job_id, named.submission)
            if key not in self._other_ends and len(self._other_ends) < 4096:
                self._other_ends.add(key)  # another submission's end, never this job's
                self._rejected[OTHER_SUBMISSION_END] += 1
        self._rejected.update(job.take_drops())  # what it dropped, ends it outgrew too

    # -- HTTP ------------------------------------------------------------------------------
    def _url(self, tail: Tail) -> str:
        query = urlencode({**_whose(tail), "lines": "-1", "interval": "1"})
        return f"{self.address}{STREAM_PATH}?{query}"

    def _auth(self) -> dict[str, str] | None:
        return self.token.header() if self.token is not None else None


def _framework(cj: ConsoleJob) -> str:
    """The framework a job's trainer actors print as (verl's unless another's reader)."""
    for tail in cj.tails.values():
        if isinstance(tail.reader, FrameworkConsoleReader) and tail.reader.framework:
            return tail.reader.framework
    return VERL


def _whose(tail: Tail) -> dict[str, str]:
    """The log file's query: an actor's stdout by actor id, a driver's log by node and name."""
    return tail.log_file if tail.driver else {"actor_id": tail.actor.actor_id}
