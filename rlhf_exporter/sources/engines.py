"""The rollout engines' own `/metrics` (vLLM, SGLang), sampled for the engine evidence.

Each poll reads every rollout replica's `/metrics` (in parallel, each bounded by
`--engine-timeout` and `--engine-max-bytes`), keeps the handful of series the evidence needs
(diagnosis/engines.py) and appends one `EngineSample` to the replica's ring (the last
`--engine-ring` samples). It polls every `--engine-interval` seconds (1 s) while a job steps,
an engine is busy or a verl rollout server's Ray actor lives on this node (a job runs here,
its first step included), and every `--engine-idle-interval` otherwise.

Reads go through the sidecar's bounded HTTP client (sources/http.py): one deadline over
connect, headers and body per target, identity encoding, no redirects. The reads run in a
small thread pool, so a slow replica costs its own deadline and never holds the others.

Only the sample lines of the wanted families are read (sources/engine_page.py), by a small
parser of that one line shape (`parse`): an engine's page is mostly histograms nobody here
reads. At most `--engine-max-series` samples per family and page are read (a page of 70,000
label sets costs one split, not 70,000 parsed samples). Values are made sane: gauges finite and >= 0 (and at
most MAX_GAUGE), the KV share within [0, 1], a counter that goes backwards is a reset and an
increase beyond MAX_RATE per second is dropped (`CounterGuard`).

Targets (discovery: rlhf_exporter/sources/engine_targets.py): verl's rollout servers among the
Ray source's actors on this node (their listening port found in /proc), verl's Prometheus
config file (`rollout.prometheus.file`), a file-based target list, static targets.

What the bounds drop is counted in `rlhf_exporter_record_errors_total{collector="engines"}`:
`engine_too_many_replicas`, `engine_body_too_large`, `engine_timeout`, `engine_unreachable`,
`engine_http_error`, `engine_redirect`, `engine_encoded`, `engine_too_large` is
`engine_body_too_large`, `engine_bad_http` (the client's reasons, `engine_` first),
`engine_parse_error`, `engine_no_stats` (a replica that answers without engine series:
vLLM with `disable_log_stats=True`, or no /metrics route at all, HTTP 404: SGLang without
`enable_metrics`), `engine_series_dropped`, `engine_bad_value`,
`engine_counter_jump`, `engine_replicas_evicted` (the rings of gone replicas beyond
`--engine-max-replicas`). Every reason is exported from 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..diagnosis.engines import EngineEvidence, EngineLimits, EngineSample, measure
from ..join.ports import WALL, JobClock
from ..metrics.snapshot import Sample
from ..settings import Settings
from .base import Clock, Context, PollingSource, PollResult
from .engine_page import (
    FAMILIES,
    KNOWN,
    MAX_COUNTER,
    MAX_GAUGE,
    MAX_SERIES,
    NO_STATS,
    PARSE_ERROR,
    REPLICAS_EVICTED,
    TIMEOUT,
    TOO_MANY,
    CounterGuard,
    FetchError,
    Read,
    client,
    fetch,
    parse,
    wanted_lines,
)
from .engine_targets import Target, Targets

log = logging.getLogger(__name__)

__all__ = [  # the page's reading, as the source's importers know it
    "ENGINE_ACTIVE",
    "FAMILIES",
    "KNOWN",
    "MAX_COUNTER",
    "MAX_GAUGE",
    "MAX_SERIES",
    "NO_STATS",
    "PARSE_ERROR",
    "REPLICAS_EVICTED",
    "TIMEOUT",
    "TOO_MANY",
    "CounterGuard",
    "EngineSource",
    "FetchError",
    "Read",
    "client",
    "fetch",
    "parse",
    "wanted_lines",
]

ENGINE_ACTIVE = 600.0  # seconds after a job's last step during which its engines are read at 1 Hz


class EngineSource(PollingSource):
    def __init__(
        self,
        targets: Targets,
        *,
        interval: float = 1.0,
        idle_interval: float = 15.0,
        timeout: float = 0.5,
        max_bytes: int = 1 << 20,
        max_replicas: int = 64,
        ring: int = 900,
        limits: EngineLimits | None = None,
        active: Callable[[], bool] | None = None,
        clock: Clock = time.time,
        workers: int = 16,
        max_series: int = MAX_SERIES,
        job_clock: JobClock = WALL,
    ):
        super().__init__("engines", min(interval, idle_interval), wall=clock)
        self.targets = targets
        self.fast = interval
        self.idle_interval = idle_interval
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_replicas = max_replicas
        self.ring = ring
        self.limits = limits or EngineLimits()
        self._active = active or (lambda: False)
        self._clock = clock  # wall time: when a read is due
        # the reads' timestamps: the clock the jobs place their steps on (join/ports.py), so
        # a step's rollout window and the samples inside it are on one clock (the wall's, or
        # the demo job's)
        self._job_clock = job_clock
        self._workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._rings_lock = threading.Lock()
        self._rings: dict[str, deque[EngineSample]] = {}
        self._engine: dict[str, str] = {}
        self._prefill: set[str] = set()  # prefill peers of disaggregated replicas
        self._up: dict[str, bool] = {}
        self._last_seen: dict[str, float] = {}
        self._errors: Counter[str] = Counter()
        self._last_scrape: float | None = None
        self._was_active = False  # a job stepped within ENGINE_ACTIVE at the last check
        self._busy = False  # an engine had running or waiting requests at the last read
        self._result = PollResult(())
        self.max_series = max_series
        self._http = client(timeout, max_bytes)  # one deadline per target, kept alive
        self._guards: dict[str, CounterGuard] = {}  # per replica: its counters made sane
        self._parse_lock = threading.Lock()
        self._errors.update(dict.fromkeys(KNOWN, 0))

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> EngineSource | None:
        """The engine source, when engine scraping is on and a window board keeps the
        sidecar's steps: it samples at `engine_interval` while a job stepped in the last
        ENGINE_ACTIVE seconds."""
        board = context.windows
        if not settings.engines or board is None:
            return None
        clock, job_clock = context.clock, context.job_clock
        targets = Targets(
            static=settings.engine_target or (),
            file_sd=settings.engine_targets_file,
            prometheus_file=settings.engine_prometheus_file,
            ray=context.ray,
            probe_timeout=settings.engine_timeout,
        )
        return cls(
            targets,
            interval=settings.engine_interval,
            idle_interval=settings.engine_idle_interval,
            timeout=settings.engine_timeout,
            max_bytes=settings.engine_max_bytes,
            max_replicas=settings.engine_max_replicas,
            ring=settings.engine_ring,
            max_series=settings.engine_max_series,
            limits=EngineLimits.from_document(context.thresholds.document),
            active=lambda: bool(board.active_jobs(job_clock.at(clock()) - ENGINE_ACTIVE)),
            clock=clock,
            job_clock=job_clock,
        )

    def describe(self) -> str:
        return (
            f"engines ({self.targets.describe()}; every {self.fast:g}s while a job steps, "
            f"{self.idle_interval:g}s idle)"
        )

    def error_counts(self) -> dict[str, int]:
        """What the bounds dropped so far, by reason (also in the snapshot's record_errors)."""
        return dict(self._errors)

    def close(self) -> None:
        self._http.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- one poll ---------------------------------------------------------------------------
    def _due(self, now: float) -> bool:
        active = self._active()
        if active and not self._was_active:
            # a job began stepping: its servers serve now, so one whose port was not found
            # during the idle polls (its backoff grown to PROBE_RETRY) is probed again at
            # once; else a short job's rollouts could all end before the next probe (the
            # real V1 job of tests/test_real_verl.py: its last two steps 6 s after its first
            # record, its server up ~23 s)
            self.targets.probe_soon()
        self._was_active = active
        if self._last_scrape is None:
            return True
        # a verl rollout server's actor alive on this node: its job runs (its first step
        # too, before any record), so its engines are read fast
        fast = self._busy or active or self.targets.ray_servers > 0
        period = self.fast if fast else self.idle_interval
        return now - self._last_scrape >= period - 0.05 * self.fast

    def poll(self) -> PollResult:
        now = self._clock()
        if not self._due(now):
            return self._result
        self._last_scrape = now
        found = self.targets.current(self._errors, self.max_replicas)
        if len(found) > self.max_replicas:
            self._errors[TOO_MANY] += len(found) - self.max_replicas
            found = found[: self.max_replicas]
        reads = self.read_all(found)
        busy = False
        with self._rings_lock:
            for target, read in zip(found, reads, strict=True):
                name = target.name
                if read.error is not None:
                    self._errors[read.error] += 1
                self._errors.update(read.dropped)
                if read.sample is None:
                    self._up[name] = False
                    continue
                self._up[name] = True
                self._last_seen[name] = read.sample.t
                ring = self._rings.get(name)
                if ring is None:
                    ring = self._rings[name] = deque(maxlen=self.ring)
                guard = self._guards.setdefault(name, CounterGuard())
                ring.append(guard.check(read.sample, self._errors))
                self._engine[name] = read.engine or target.engine or self._engine.get(name, "")
                if target.role == "prefill":
                    self._prefill.add(name)
                s = read.sample
                if (s.running or 0.0) > 0 or (s.waiting or 0.0) > 0:
                    busy = True
            self._forget(self._stamp(), {t.name for t in found})
        self._http.forget({_address(t.url) for t in found})  # a target gone: its socket too
        self._busy = busy
        self._result = PollResult(tuple(self._samples()), record_errors=dict(self._errors))
        return self._result

    def read_all(self, found: Sequence[Target]) -> list[Read]:
        if not found:
            return []
        if len(found) == 1:
            return [self._read(found[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="engine-scrape")
        return list(self._pool.map(self._read, found))

    def _read(self, target: Target) -> Read:
        try:
            body = fetch(target.url, self.timeout, self.max_bytes, self._http)
        except FetchError as exc:
            if exc.reason == NO_STATS:  # it answers, without engine series: alive, no stats
                return Read(EngineSample(self._stamp()), target.engine, NO_STATS)
            return Read(None, target.engine, exc.reason)
        # the reads wait on their sockets in parallel; the pages are parsed one at a time, so
        # that eight big pages do not crowd the scrapes' thread out of the interpreter lock
        with self._parse_lock:
            return parse(body, self._stamp(), self.max_series)

    def _stamp(self) -> float:
        """Now, on the jobs' clock: a read's timestamp."""
        return self._job_clock.at(self._clock())

    def _forget(self, now: float, current: set[str]) -> None:
        """A replica no longer a target keeps its ring for as long as the ring spans (its
        last windows may still be joined), then goes."""
        keep_for = self.ring * self.fast
        for name in list(self._rings):
            if name not in current:
                self._up.pop(name, None)
                if now - self._last_seen.get(name, now) > keep_for:
                    self._drop_ring(name)
        for name in list(self._up):
            if name not in current:
                self._up.pop(name, None)
        # replica churn: the gone replicas' rings, oldest first, leave once there are more
        # rings than --engine-max-replicas (the current replicas' are kept)
        gone = sorted(
            (n for n in self._rings if n not in current), key=lambda n: self._last_seen.get(n, 0.0)
        )
        for name in gone[: max(0, len(self._rings) - self.max_replicas)]:
            self._drop_ring(name)
            self._errors[REPLICAS_EVICTED] += 1

    def _drop_ring(self, name: str) -> None:
        for d in (self._rings, self._engine, self._last_seen, self._guards):
            d.pop(name, None)
        self._prefill.discard(name)

    def _samples(self) -> Iterable[Sample]:
        # names from outside (a target file, an answer) are cleaned and cut at the source
        for name, up in sorted(self._up.items()):
            yield Sample("rlhf_engine_up", (name, self._engine.get(name, "")), 1.0 if up else 0.0)

    # -- the join's half: read from another thread ------------------------------------------
    def samples_over(
        self, spans: Sequence[tuple[float, float]]
    ) -> dict[str, tuple[EngineSample, ...]]:
        """Each replica's samples that may cover `spans` (one before, one after)."""
        if not spans:
            return {}
        lo, hi = spans[0][0] - self.limits.max_sample_gap, spans[-1][1]
        out: dict[str, tuple[EngineSample, ...]] = {}
        with self._rings_lock:
            rings = {k: tuple(v) for k, v in self._rings.items()}
        for name, ring in rings.items():
            picked: list[EngineSample] = []
            before: EngineSample | None = None
            for s in ring:
                if s.t < lo:
                    before = s
                    continue
                picked.append(s)
                if s.t > hi:
                    break
            if picked:
                out[name] = ((before,) if before else ()) + tuple(picked)
        return out

    def evidence(
        self, spans: Sequence[tuple[float, float]], placement_error: float = 0.0
    ) -> EngineEvidence | None:
        with self._rings_lock:
            prefill = set(self._prefill)
        return measure(spans, self.samples_over(spans), self.limits, prefill, placement_error)


def _address(url: str) -> tuple[str, str, int]:
    """The client's connection key of a target URL."""
    from urllib.parse import urlsplit

    p = urlsplit(url)
    try:
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError:
        port = 0
    return (p.scheme, p.hostname or "", port)
