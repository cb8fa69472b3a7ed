"""The interface every source implements, and a background poller most of them share."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple, Protocol

from ..metrics.snapshot import Sample, Snapshot

log = logging.getLogger(__name__)
_EMPTY: Mapping[str, int] = MappingProxyType({})


class Source(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def snapshot(self) -> Snapshot: ...


class SourceError(Exception):
    """A collection failed; `reason` is a short label value (`timeout`, `http_500`, ...)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PollResult(NamedTuple):
    samples: tuple[Sample, ...]
    records: int | None = None
    record_errors: Mapping[str, int] | None = None
    parts: tuple[tuple[Sample, ...], ...] = ()  # per-job groups at the front of samples


class PollingSource:
    """Calls `poll()` every `interval` seconds in a daemon thread and keeps the snapshot.

    - A failed poll (a `SourceError`, or any exception) sets `up` to 0, drops the samples
      (never serve stale series) and counts the reason. Each distinct problem is logged
      once, and so is the recovery.
    - A poll still running after `stale_after` seconds (a hung library or server) makes
      `snapshot()` report the source down, without waiting for it.
    """

    def __init__(self, name: str, interval: float, stale_after: float | None = None):
        self.name = name
        self.interval = interval
        self.stale_after = stale_after if stale_after is not None else max(3 * interval, 10.0)
        self._snapshot = Snapshot(name)
        self._errors: dict[str, int] = {}
        self._problem: str | None = None
        self._poll_started: float | None = None  # monotonic, while a poll runs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one poll at a time (thread vs. poll_once in tests)

    # -- to implement -------------------------------------------------------------------
    def poll(self) -> PollResult:
        """Do the slow work and return the series. Raise SourceError on failure."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds (called once the thread has ended)."""

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
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    # -- one collection -----------------------------------------------------------------
    def poll_once(self) -> Snapshot:
        with self._lock:
            self._poll_started = start = time.monotonic()
            try:
                result = self.poll()
            except SourceError as exc:
                self._failed(exc.reason, str(exc), time.monotonic() - start)
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
        if self._problem is not None:
            log.info("%s source recovered", self.name, extra={"collector": self.name})
            self._problem = None
        self._snapshot = Snapshot(
            self.name,
            True,
            duration,
            time.time(),
            MappingProxyType(dict(self._errors)),
            result.records,
            MappingProxyType(dict(result.record_errors)) if result.record_errors else _EMPTY,
            tuple(result.samples),
            parts=tuple(result.parts),
        )

    def _failed(self, reason: str, message: str, duration: float, exc_info: bool = False) -> None:
        self._errors[reason] = self._errors.get(reason, 0) + 1
        if self._problem != reason:
            log.warning(
                "%s source failed (%s): %s",
                self.name,
                reason,
                message,
                exc_info=exc_info,
                extra={"collector": self.name, "reason": reason},
            )
            self._problem = reason
        old = self._snapshot
        self._snapshot = replace(
            old,
            up=False,
            duration=duration,
            samples=(),
            parts=(),
            errors=MappingProxyType(dict(self._errors)),
            created=time.time(),
        )

    # -- scrape path: no waiting ----------------------------------------------------------
    def snapshot(self) -> Snapshot:
        snap = self._snapshot
        started = self._poll_started
        if started is not None and time.monotonic() - started > self.stale_after:
            return replace(snap, up=False, samples=(), parts=())
        return snap
