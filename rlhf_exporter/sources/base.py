"""The interface every source implements, and a background poller most of them share."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from ..diagnosis import Thresholds
from ..join.board import WindowBoard
from ..join.names import JobNames
from ..join.ports import WALL, ActorPids, Engines, JobClock, JobFacts, TrainerActors
from ..metrics.snapshot import Problem, Sample, Snapshot
from ..settings import Settings

log = logging.getLogger(__name__)
_EMPTY: Mapping[str, int] = MappingProxyType({})

Clock = Callable[[], float]
"""Wall time in seconds (`time.time`); injectable, so a test can drive a simulated day."""

DEPENDENCY_MISSING = "dependency_missing"
LOG_EVERY = 60.0  # seconds: a source's same failure reason is warned about at most this often
MAX_PROBLEMS = 20  # set-up problems a source lists at once (Problems); more are counted


@dataclass(frozen=True)
class Context:
    """What every source's `from_settings` gets besides the settings: the thresholds, the
    clock, and the ports to the other parts (rlhf_exporter/join/ports.py), each None when the
    settings leave that part out. `commands/serve.py` builds it; no source wires another."""

    thresholds: Thresholds
    clock: Clock = time.time
    extra_roots: tuple[Path, ...] = ()  # more verl roots (the demo's)
    # Ray's actors by PID (NVML matches GPU processes to them; engine discovery)
    ray: ActorPids | None = None
    facts: JobFacts | None = None  # what Ray says about verl jobs (their states)
    trainers: TrainerActors | None = None  # verl's trainer actors (the console source)
    # the window board: jobs post step timelines, NVML joins GPU time, workers fetch it
    windows: WindowBoard | None = None
    engines: Engines | None = None  # the engines' evidence over a step's rollout
    names: JobNames | None = None  # which source owns a job's name (a file wins it)
    # the clock the jobs under `extra_roots` place their steps on and the engines stamp their
    # reads on: the wall's, or the demo job's (rlhf_exporter/demo/clock.py)
    job_clock: JobClock = WALL


class Source(Protocol):
    """One input of the sidecar. `snapshot()` never waits: slow work runs in `start()`'s
    thread (or in the request that brings the data, for push)."""

    name: str

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> Source | None:
        """The source the settings ask for, or None when they turn it off."""
        ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def snapshot(self) -> Snapshot: ...

    def jobs(self) -> tuple[dict[str, Any], ...]:
        """The verl jobs this source exports (summaries for the landing page); () if none."""
        ...

    def describe(self) -> str:
        """One line for the startup log: what the source watches, and how often."""
        ...


class SourceError(Exception):
    """A collection failed; `reason` is a short label value (`timeout`, `http_500`, ...).

    `attempted=False`: the source did not try again (it waits before a retry), so the
    failure is not counted again in `rlhf_exporter_collector_errors_total`."""

    def __init__(self, reason: str, message: str, attempted: bool = True):
        super().__init__(message)
        self.reason = reason
        self.attempted = attempted


class PollResult(NamedTuple):
    samples: tuple[Sample, ...]
    records: int | None = None
    record_errors: Mapping[str, int] | None = None
    down: str | None = None  # a reason: the poll ran, but the source is broken (`up` 0)
    parts: tuple[Sequence[Sample], ...] = ()  # per-job samples (not in `samples`)
    problems: tuple[Problem, ...] = ()  # set-up mistakes seen now (Problems.current())


class Problems:
    """A source's set-up problems (`Problem`), each under a key of the source's choosing (a
    root, a file): a problem is logged once, as a warning with its hint, when it appears or
    its statement changes, and once at info level when it clears; never once per poll.
    At most `limit` are kept (the first ones); those beyond are neither kept nor logged
    until a kept one clears."""

    def __init__(self, source: str, limit: int = MAX_PROBLEMS):
        self.source = source
        self.limit = limit
        self._now: dict[str, Problem] = {}
        self._current: tuple[Problem, ...] = ()

    def set(self, key: str, kind: str, message: str, hint: str) -> None:
        problem = Problem(self.source, kind, message, hint)
        if self._now.get(key) == problem:
            return
        if key not in self._now and len(self._now) >= self.limit:
            return
        self._now[key] = problem
        self._current = tuple(self._now.values())
        log.warning(
            "%s (%s): %s",
            message,
            kind,
            hint,
            extra={"collector": self.source, "reason": kind, "problem": key},
        )

    def clear(self, key: str, why: str = "") -> None:
        problem = self._now.pop(key, None)
        if problem is None:
            return
        self._current = tuple(self._now.values())
        log.info(
            "%s (%s): resolved%s",
            problem.message,
            problem.kind,
            f" ({why})" if why else "",
            extra={"collector": self.source, "reason": problem.kind, "problem": key},
        )

    def __contains__(self, key: str) -> bool:
        return key in self._now

    def current(self) -> tuple[Problem, ...]:
        """The problems now (the same tuple while none appears or clears)."""
        return self._current


class UnavailableSource:
    """A source this build or host cannot run (an optional dependency is missing): it is
    exported as a down collector with its reason, never silently absent."""

    def __init__(self, name: str, reason: str, message: str, clock: Clock = time.time):
        self.name = name
        self.reason = reason
        self.message = message
        self._snapshot = Snapshot(
            name, False, errors=MappingProxyType({reason: 1}), created=clock()
        )

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> Source | None:
        return None  # only made by the sidecar, for a source that cannot be imported

    def start(self) -> None:
        log.warning(
            "%s source unavailable (%s): %s",
            self.name,
            self.reason,
            self.message,
            extra={"collector": self.name, "reason": self.reason},
        )

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def jobs(self) -> tuple[dict[str, Any], ...]:
        return ()

    def describe(self) -> str:
        return f"{self.name} (unavailable: {self.reason})"


class PollingSource:
    """Calls `poll()` every `interval` seconds in a daemon thread and keeps the snapshot.

    - A failed poll (a `SourceError`, or any exception) sets `up` to 0, drops the samples
      (never serve stale series) and counts the reason. Each distinct problem is logged
      once, and so is the recovery; a problem that comes back within `LOG_EVERY` seconds
      of its last warning (a source flapping between two answers) is logged at debug
      level only, so a flapping input cannot flood the log.
    - A poll still running after `stale_after` seconds (a hung library or server) makes
      `snapshot()` report the source down, without waiting for it.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        stale_after: float | None = None,
        wall: Clock = time.time,
    ):
        self.name = name
        self.wall = wall  # wall time for last_success (the injectable clock)
        self.interval = interval
        self.stale_after = stale_after if stale_after is not None else max(3 * interval, 10.0)
        self._snapshot = Snapshot(name, created=wall())
        self._errors: dict[str, int] = {}
        self._problem: str | None = None
        self._poll_started: float | None = None  # monotonic, while a poll runs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one poll at a time (thread vs. poll_once in tests)
        self._warned_at: dict[str, float] = {}  # failure reason -> monotonic time of its warning
        self._problem_warned = False  # the current problem was warned: its recovery is told
        # called after each poll of the source's thread (serve: the exposition's wake)
        self.after_poll: list[Callable[[], None]] = []

    # -- to implement -------------------------------------------------------------------
    def poll(self) -> PollResult:
        """Do the slow work and return the series. Raise SourceError on failure."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds (called once the thread has ended)."""

    def jobs(self) -> tuple[dict[str, Any], ...]:
        return ()

    def describe(self) -> str:
        return f"{self.name} (every {self.interval:g}s)"

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"source-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            for fn in self.after_poll:
                try:
                    fn()
                except Exception:  # a listener's bug never stops the polls
                    log.exception("%s: a listener of its polls failed", self.name)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    # -- one collection -----------------------------------------------------------------
    def poll_once(self) -> Snapshot:
        with self._lock:
            self._poll_started = start = time.monotonic()
            try:
                result = self.poll()
            except SourceError as exc:
                self._failed(exc.reason, str(exc), time.monotonic() - start, exc.attempted)
            except Exception as exc:  # a bug or an unexpected library error: keep serving
                self._failed(
                    "exception",
                    f"{type(exc).__name__}: {exc}",
                    time.monotonic() - start,
                    exc_info=True,
                )
            else:
                self._succeeded(result, time.monotonic() - start)
            finally:
                self._poll_started = None
            return self._snapshot

    def _succeeded(self, result: PollResult, duration: float) -> None:
        last_success: float | None = self.wall()
        if result.down is not None:  # ran, but broken: up 0, the problem counted once
            if self._problem != result.down:
                self._errors[result.down] = self._errors.get(result.down, 0) + 1
                self._problem = result.down
            last_success = self._snapshot.last_success
        elif self._problem is not None:
            # a recovery is told where its failure was (a flapping source's are both quiet)
            log.log(
                logging.INFO if self._problem_warned else logging.DEBUG,
                "%s source recovered",
                self.name,
                extra={"collector": self.name},
            )
            self._problem = None
        self._snapshot = Snapshot(
            self.name,
            result.down is None,
            duration,
            last_success,
            MappingProxyType(dict(self._errors)),
            result.records,
            MappingProxyType(dict(result.record_errors)) if result.record_errors else _EMPTY,
            tuple(result.samples),
            self.wall(),
            parts=tuple(result.parts),
            problems=result.problems,
        )

    def _failed(
        self,
        reason: str,
        message: str,
        duration: float,
        attempted: bool = True,
        exc_info: bool = False,
    ) -> None:
        if attempted:  # one count per attempt, not per poll of a source waiting to retry
            self._errors[reason] = self._errors.get(reason, 0) + 1
        if self._problem != reason:
            now = time.monotonic()
            if len(message) > 500:  # a value from the input never floods the log
                message = message[:500] + "..."
            again = now - self._warned_at.get(reason, -LOG_EVERY) < LOG_EVERY
            if not again:
                self._warned_at[reason] = now
            log.log(
                logging.DEBUG if again else logging.WARNING,
                "%s source failed (%s): %s",
                self.name,
                reason,
                message,
                exc_info=exc_info and not again,
                extra={"collector": self.name, "reason": reason},
            )
            self._problem = reason
            self._problem_warned = not again
        old = self._snapshot
        self._snapshot = replace(
            old,
            up=False,
            duration=duration,
            rest=(),
            parts=(),
            errors=MappingProxyType(dict(self._errors)),
            created=self.wall(),
        )

    # -- scrape path: no waiting ----------------------------------------------------------
    def snapshot(self) -> Snapshot:
        snap = self._snapshot
        started = self._poll_started
        if started is not None and time.monotonic() - started > self.stale_after:
            return replace(snap, up=False, rest=(), parts=())
        return snap
