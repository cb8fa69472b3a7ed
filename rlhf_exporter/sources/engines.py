"""The rollout engines' own `/metrics` (vLLM, SGLang), sampled for the engine evidence.

Each poll reads every rollout replica's `/metrics` (in parallel, each bounded by
`--engine-timeout` and `--engine-max-bytes`), keeps the handful of series the evidence needs
(diagnosis/engines.py) and appends one `EngineSample` to the replica's ring (the last
`--engine-ring` samples). It polls every `--engine-interval` seconds (1 s) while a job steps
or an engine is busy, and every `--engine-idle-interval` otherwise.

Only the lines of the wanted families are handed to prometheus_client's text parser: an
engine's page is mostly histograms nobody here reads, and parsing them would cost more than
the rest of the sidecar.

Targets (discovery: rlhf_exporter/sources/engine_targets.py): verl's rollout servers among the
Ray source's actors on this node (their listening port found in /proc), verl's Prometheus
config file (`rollout.prometheus.file`), a file-based target list, static targets.

What the bounds drop is counted in `rlhf_exporter_record_errors_total{collector="engines"}`:
`engine_too_many_replicas`, `engine_body_too_large`, `engine_timeout`, `engine_unreachable`,
`engine_http_error`, `engine_parse_error`, `engine_no_stats` (a replica that answers without
engine series: vLLM with `disable_log_stats=True`, or no /metrics route at all, HTTP 404:
SGLang without `enable_metrics`).
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ..diagnosis.engines import EngineEvidence, EngineLimits, EngineSample, measure
from ..metrics.snapshot import Sample
from .base import Clock, Context, PollingSource, PollResult
from .engine_targets import Target, Targets

log = logging.getLogger(__name__)

# sample name in the text format -> (EngineSample field, how replicas' series combine)
FAMILIES: Mapping[str, tuple[str, str]] = {
    # vLLM 0.12 .. 0.33 (vllm/v1/metrics/loggers.py)
    "vllm:num_requests_running": ("running", "sum"),
    "vllm:num_requests_waiting": ("waiting", "sum"),
    "vllm:num_requests_waiting_by_reason": ("waiting_capacity", "sum"),  # SELECT: capacity
    "vllm:kv_cache_usage_perc": ("kv", "max"),
    "vllm:gpu_cache_usage_perc": ("kv", "max"),  # before vLLM 0.10
    "vllm:num_preemptions_total": ("preempted", "sum"),
    "vllm:generation_tokens_total": ("tokens", "sum"),
    # SGLang 0.5 (sglang/srt/observability/metrics_collector.py)
    "sglang:num_running_reqs": ("running", "sum"),
    "sglang:num_queue_reqs": ("waiting", "sum"),
    "sglang:token_usage": ("kv", "max"),
    "sglang:num_retracted_requests_total": ("preempted", "sum"),
    "sglang:generation_tokens_total": ("tokens", "sum"),
    "sglang:realtime_tokens_total": ("decode_tokens", "sum"),  # SELECT: decode
    "sglang:gen_throughput": ("throughput", "sum"),
}
SELECT: Mapping[str, tuple[str, str]] = {
    # vLLM >= 0.2x: the waits for scheduling capacity alone; num_requests_waiting also counts
    # requests deferred by the LoRA budget or a KV transfer, which no engine room would help
    "vllm:num_requests_waiting_by_reason": ("reason", "capacity"),
    # SGLang: decoded tokens, every decode step (generation_tokens_total grows only when a
    # request finishes, crediting a window with whole requests)
    "sglang:realtime_tokens_total": ("mode", "decode"),
}
"""Families of which only the series with this label value are read."""
_HOW = {field: how for field, how in FAMILIES.values()}
PRIORITY_GAUGES = frozenset({"running", "waiting", "waiting_capacity", "kv", "throughput"})
"""Gauges: with priority scheduling SGLang writes their total under `priority=""`."""
PER_RANK = "tp_rank"
"""SGLang's schedulers label their series with their TP rank. Every rank counts each
retraction (scheduler.py `increment_retracted_reqs`; the gauges come from the stats rank
only, or from each rank with `enable_metrics_for_all_schedulers`): the ranks of one
data-parallel group describe the same batch, so a replica's value is the maximum over
`tp_rank` within each group of its other labels, then combined over the groups."""
# the lines handed to the parser: each wanted family's TYPE line and samples (no HELP: the
# parser does not need it); a name must be followed by `{` or a space, so that
# `vllm:num_requests_waiting_by_reason` is not taken for `vllm:num_requests_waiting`
_WANTED: tuple[bytes, ...] = tuple(
    p
    for name in FAMILIES
    for p in (name.encode() + b"{", name.encode() + b" ", b"# TYPE " + name.encode() + b" ")
)


def wanted_lines(body: bytes) -> list[bytes]:
    return [line for line in body.split(b"\n") if line.startswith(_WANTED)]


ENGINES = ("vllm", "sglang", "trtllm")

TOO_MANY = "engine_too_many_replicas"
TOO_LARGE = "engine_body_too_large"
TIMEOUT = "engine_timeout"
UNREACHABLE = "engine_unreachable"
HTTP_ERROR = "engine_http_error"
PARSE_ERROR = "engine_parse_error"
NO_STATS = "engine_no_stats"


class Read(NamedTuple):
    sample: EngineSample | None
    engine: str  # vllm / sglang / "" (unknown)
    error: str | None


class FetchError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def fetch(
    url: str,
    timeout: float,
    max_bytes: int,
    conns: dict[str, http.client.HTTPConnection] | None = None,
) -> bytes:
    """GET `url` within `timeout` seconds in all, at most `max_bytes` bytes. With `conns`, the
    connection is kept alive there for the next read (engines serve HTTP/1.1), and a kept
    connection the engine closed meanwhile is replaced once."""
    kept = conns.pop(url, None) if conns is not None else None
    try:
        return _get(url, timeout, max_bytes, kept, conns)
    except FetchError as exc:
        if kept is None or exc.reason != UNREACHABLE:
            raise
        return _get(url, timeout, max_bytes, None, conns)  # the kept one had gone stale


def _get(
    url: str,
    timeout: float,
    max_bytes: int,
    conn: http.client.HTTPConnection | None,
    conns: dict[str, http.client.HTTPConnection] | None,
) -> bytes:
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    if conn is None:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout)
    keep = False
    try:
        conn.request("GET", parts.path or "/metrics", headers={"Accept": "text/plain"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read(max_bytes)
            # 404: the server has no /metrics route (SGLang without enable_metrics): no stats
            raise FetchError(NO_STATS if resp.status == 404 else HTTP_ERROR)
        chunks, size = [], 0
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise FetchError(TOO_LARGE)
            if time.monotonic() > deadline:
                raise FetchError(TIMEOUT)
            chunks.append(chunk)
            if resp.length == 0:  # read1 would not notice the end of a sized body by itself
                break
        resp.close()  # done with this response: the connection can send the next request
        keep = conns is not None and not resp.will_close
        return b"".join(chunks)
    except TimeoutError:
        raise FetchError(TIMEOUT) from None
    except (OSError, http.client.HTTPException):
        raise FetchError(UNREACHABLE) from None
    finally:
        if keep and conns is not None:
            conns[url] = conn
        else:
            conn.close()


def parse(body: bytes, t: float) -> Read:
    """The engine's page -> one EngineSample (series of one family combined: `combine`)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = wanted_lines(body)
    if not lines:
        return Read(EngineSample(t), "", NO_STATS)
    series: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    engine = ""
    try:
        text = b"\n".join(lines).decode("utf-8", "replace") + "\n"
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                spec = FAMILIES.get(s.name)
                if spec is None:
                    continue
                engine = engine or s.name.split(":", 1)[0]
                v = float(s.value)
                if v != v or v in (float("inf"), float("-inf")):
                    continue
                pick = SELECT.get(s.name)
                if pick is not None and s.labels.get(pick[0]) != pick[1]:
                    continue
                series.setdefault(spec[0], []).append((s.labels, v))
    except Exception:  # the parser raises ValueError and others on a broken page
        return Read(None, engine, PARSE_ERROR)
    values = {
        field: combine(got, _HOW[field], field in PRIORITY_GAUGES) for field, got in series.items()
    }
    if "waiting_capacity" in values:  # what `queueing` means: waits for capacity
        values["waiting"] = values.pop("waiting_capacity")
    if "running" not in values:
        return Read(EngineSample(t), engine, NO_STATS)
    return Read(EngineSample(t, **values), engine, None)


def combine(series: Sequence[tuple[Mapping[str, str], float]], how: str, gauge: bool) -> float:
    """One replica's value of one family from its series: summed (`how` "sum": engines of a
    data-parallel server) or the maximum ("max": KV usage). SGLang's TP ranks count once
    (PER_RANK); with priority scheduling a gauge's total is the `priority=""` series, beside
    one series per priority that must not be added to it (metrics_collector.py
    `_log_gauge_queue_count`; counters are split by priority, never totalled, so they add)."""
    if len(series) == 1:
        return series[0][1]
    if gauge and any(labels.get("priority") for labels, _ in series):
        series = [(labels, v) for labels, v in series if not labels.get("priority")] or series
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, v in series:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != PER_RANK))
        groups[key] = max(groups[key], v) if key in groups else v
    return max(groups.values()) if how == "max" else sum(groups.values())


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
        workers: int = 8,
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
        self._clock = clock
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
        self._busy = False  # an engine had running or waiting requests at the last read
        self._result = PollResult(())
        self._conns: dict[str, http.client.HTTPConnection] = {}  # kept alive per target URL

    @classmethod
    def from_settings(cls, settings: Any, context: Context) -> EngineSource | None:
        if not settings.engines:
            return None
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
            limits=EngineLimits.from_document(context.thresholds.document),
            clock=context.clock,
        )

    def describe(self) -> str:
        return (
            f"engines ({self.targets.describe()}; every {self.fast:g}s while a job steps, "
            f"{self.idle_interval:g}s idle)"
        )

    def set_active(self, active: Callable[[], bool]) -> None:
        """Whether a job steps now (the sidecar's jobs): sample at `interval` while it does."""
        self._active = active

    def error_counts(self) -> dict[str, int]:
        """What the bounds dropped so far, by reason (also in the snapshot's record_errors)."""
        return dict(self._errors)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- one poll ---------------------------------------------------------------------------
    def _due(self, now: float) -> bool:
        if self._last_scrape is None:
            return True
        period = self.fast if (self._busy or self._active()) else self.idle_interval
        return now - self._last_scrape >= period - 0.05 * self.fast

    def poll(self) -> PollResult:
        now = self._clock()
        if not self._due(now):
            return self._result
        self._last_scrape = now
        found = self.targets.current(self._errors)
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
                if read.sample is None:
                    self._up[name] = False
                    continue
                self._up[name] = True
                self._last_seen[name] = read.sample.t
                ring = self._rings.get(name)
                if ring is None:
                    ring = self._rings[name] = deque(maxlen=self.ring)
                ring.append(read.sample)
                self._engine[name] = read.engine or target.engine or self._engine.get(name, "")
                if target.role == "prefill":
                    self._prefill.add(name)
                s = read.sample
                if (s.running or 0.0) > 0 or (s.waiting or 0.0) > 0:
                    busy = True
            self._forget(now, {t.name for t in found})
            urls = {t.url for t in found}
            for url in [u for u in self._conns if u not in urls]:  # a target gone: its socket too
                self._conns.pop(url).close()
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
            body = fetch(target.url, self.timeout, self.max_bytes, self._conns)
        except FetchError as exc:
            if exc.reason == NO_STATS:  # it answers, without engine series: alive, no stats
                return Read(EngineSample(self._clock()), target.engine, NO_STATS)
            return Read(None, target.engine, exc.reason)
        return parse(body, self._clock())

    def _forget(self, now: float, current: set[str]) -> None:
        """A replica no longer a target keeps its ring for as long as the ring spans (its
        last windows may still be joined), then goes."""
        keep_for = self.ring * self.fast
        for name in list(self._rings):
            if name not in current:
                self._up.pop(name, None)
                if now - self._last_seen.get(name, now) > keep_for:
                    for d in (self._rings, self._engine, self._last_seen):
                        d.pop(name, None)
                    self._prefill.discard(name)

    def _samples(self) -> Iterable[Sample]:
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

    def evidence(self, spans: Sequence[tuple[float, float]]) -> EngineEvidence | None:
        with self._rings_lock:
            prefill = set(self._prefill)
        return measure(spans, self.samples_over(spans), self.limits, prefill)
