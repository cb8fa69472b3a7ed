"""One rollout engine's `/metrics` page (vLLM, SGLang) read into one `EngineSample`: the
bounded GET (sources/http.py's client: one deadline, identity encoding, no redirect), the
sample lines of the wanted families only (`wanted_lines`, `parse`: an engine's page is
mostly histograms nobody here reads; at most `max_series` samples per family and page),
values made sane (gauges finite, >= 0 and at most MAX_GAUGE, the KV share within [0, 1];
`CounterGuard`: a counter that goes backwards is a reset, an increase beyond MAX_RATE per
second is dropped), and a replica's series combined into its value (`combine`)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from ..diagnosis.engines import EngineSample
from . import http

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
PER_RANK = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
"""SGLang's schedulers label their series with their ranks. Every TP rank counts each
retraction (scheduler.py `increment_retracted_reqs`; the gauges come from the stats rank
only, or from each rank with `enable_metrics_for_all_schedulers`): the ranks of one
data-parallel group describe the same batch. `moe_ep_rank` is a function of `tp_rank`
(data_parallel_controller.py), so with expert parallelism it differs between the same
group's TP ranks. Every pipeline stage runs the same scheduler loop over the same
micro-batches (scheduler_pp_mixin.py `event_loop_pp`: each stage ingests the requests the
previous one forwards, schedules, retracts and processes every batch's result) and each
stage's `attn_tp_rank` 0 is a stats rank (`is_stats_logging_rank` ignores `pp_rank`), so
its counters and gauges repeat per stage. A replica's value is therefore the maximum over
these rank labels within each group of its other labels (`dp_rank`, `priority`, ...), then
combined over the groups."""
# the lines read: each wanted family's samples; a name must be followed by `{` or a space, so
# that `vllm:num_requests_waiting_by_reason` is not taken for `vllm:num_requests_waiting`
_WANTED: tuple[bytes, ...] = tuple(
    p for name in FAMILIES for p in (name.encode() + b"{", name.encode() + b" ")
)
GAUGES = frozenset({"running", "waiting", "waiting_capacity", "throughput"})
COUNTERS = frozenset({"preempted", "tokens", "decode_tokens"})
MAX_SERIES = 256  # default of --engine-max-series: samples read per family and page
MAX_GAUGE = 1e9  # requests or tokens/s of one series: more is no engine's (engine_bad_value)
MAX_COUNTER = float(2**53)  # a counter's value: beyond, floats no longer count by one
# the most a counter may grow per second of one replica; a larger jump is dropped
# (engine_counter_jump) and the counter goes on from its new value
MAX_RATE: Mapping[str, float] = {"tokens": 1e7, "decode_tokens": 1e7, "preempted": 1e5}


_NAMES: tuple[bytes, ...] = tuple(name.encode() for name in FAMILIES)


def wanted_lines(body: bytes, max_series: int = MAX_SERIES) -> tuple[list[bytes], int]:
    """(the sample lines of the wanted families, at most `max_series` per family; how many
    more there were). Found by searching the page for each family's name at a line start
    (C speed, a few milliseconds for 4 MiB), never by splitting it into its lines: a page of
    70,000 label sets becomes at most 12 x `max_series` small strings, and the excess is
    counted, not copied. A name must be followed by `{` or a space, so that
    `vllm:num_requests_waiting_by_reason` is not taken for `vllm:num_requests_waiting`."""
    out: list[bytes] = []
    excess = 0
    present = {p for p in (b"vllm:", b"sglang:") if body.startswith(p) or b"\n" + p in body}
    for name in _NAMES:
        if name[: name.index(b":") + 1] not in present:
            continue  # one search for the engine's prefix spares its families' searches
        needle = b"\n" + name
        taken = skipped = 0
        pos = 0 if body.startswith(name) else body.find(needle)
        while pos >= 0:
            start = pos + 1 if pos or body[:1] == b"\n" else 0
            end = body.find(b"\n", start)
            after = body[start + len(name) : start + len(name) + 1]
            if after in (b"{", b" "):
                if taken == max_series:  # the rest of this family, counted, not read
                    excess += body.count(needle + b"{", pos) + body.count(needle + b" ", pos)
                    break
                out.append(body[start:] if end < 0 else body[start:end])
                taken += 1
            else:
                skipped += 1  # another name that starts with this one (`..._by_reason`)
                if skipped > max_series:  # many of them: search the exact name from here
                    lines, more = _exact(body, name, pos, max_series - taken)
                    out += lines
                    excess += more
                    break
            pos = -1 if end < 0 else body.find(needle, end)
    return out, excess


def _exact(body: bytes, name: bytes, pos: int, n: int) -> tuple[list[bytes], int]:
    """(at most `n` lines of exactly `name` from `pos` on, how many more there are)."""
    out: list[bytes] = []
    total = 0
    for needle in (b"\n" + name + b"{", b"\n" + name + b" "):
        total += body.count(needle, pos)
        at = body.find(needle, pos)
        while at >= 0 and len(out) < n:
            end = body.find(b"\n", at + 1)
            out.append(body[at + 1 :] if end < 0 else body[at + 1 : end])
            at = -1 if end < 0 else body.find(needle, end)
    return out, total - len(out)


ENGINES = ("vllm", "sglang", "trtllm")

TOO_MANY = "engine_too_many_replicas"
TOO_LARGE = "engine_body_too_large"
TIMEOUT = "engine_timeout"
UNREACHABLE = "engine_unreachable"
HTTP_ERROR = "engine_http_error"
PARSE_ERROR = "engine_parse_error"
NO_STATS = "engine_no_stats"
SERIES_DROPPED = "engine_series_dropped"  # samples of one family over --engine-max-series
BAD_VALUE = "engine_bad_value"  # NaN, infinite, negative, a KV share outside [0, 1], huge
COUNTER_JUMP = "engine_counter_jump"  # a counter growing faster than MAX_RATE
REPLICAS_EVICTED = "engine_replicas_evicted"  # gone replicas' rings over --engine-max-replicas
# a failed read, by the HTTP client's reason (sources/http.py): engine_<reason>
FETCH_REASONS: Mapping[str, str] = {
    r: {http.TOO_LARGE: TOO_LARGE}.get(r, f"engine_{r}") for r in http.REASONS
}
KNOWN: tuple[str, ...] = (
    *FETCH_REASONS.values(),
    TOO_MANY,
    PARSE_ERROR,
    NO_STATS,
    SERIES_DROPPED,
    BAD_VALUE,
    COUNTER_JUMP,
    REPLICAS_EVICTED,
)
"""Every reason the engine source counts (record_errors, exported from 0)."""


class Read(NamedTuple):
    sample: EngineSample | None
    engine: str  # vllm / sglang / "" (unknown)
    error: str | None
    dropped: Mapping[str, int] = MappingProxyType({})  # values/series left out, by reason


class FetchError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def client(timeout: float, max_bytes: int, keep_alive: bool = True) -> http.Client:
    """The engines' HTTP client: Prometheus text, kept alive (engines serve HTTP/1.1)."""
    return http.Client(
        timeout=timeout, max_bytes=max_bytes, accept="text/plain", keep_alive=keep_alive
    )


def fetch(url: str, timeout: float, max_bytes: int, via: http.Client | None = None) -> bytes:
    """GET `url` within `timeout` seconds in all (connect, headers, body), at most
    `max_bytes` bytes; a FetchError with an engine reason otherwise."""
    c = via or client(timeout, max_bytes, keep_alive=False)
    try:
        return c.get(url, timeout=timeout, max_bytes=max_bytes)
    except http.HttpFailure as exc:
        if exc.status == 404:  # no /metrics route (SGLang without enable_metrics): no stats
            raise FetchError(NO_STATS) from None
        raise FetchError(FETCH_REASONS.get(exc.reason, HTTP_ERROR)) from None
    finally:
        if via is None:
            c.close()


def _value(line: bytes) -> tuple[bytes, bytes, float]:
    """(name, label text, value) of one sample line `name{labels} value [timestamp]`;
    ValueError when it is not one. The label text is parsed only where it matters
    (`labels`)."""
    brace = line.find(b"{")
    if brace >= 0:
        close = line.rfind(b"}")
        if close < brace:
            raise ValueError("unclosed labels")
        name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
    else:
        name, _, rest = line.partition(b" ")
        labels = b""
    words = rest.split()
    if not 1 <= len(words) <= 2 or len(words[0]) > 64:
        raise ValueError("not `value [timestamp]`")
    return name, labels, float(words[0])


_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def labels(text: bytes) -> dict[str, str]:
    """The label pairs of a sample's `{...}` text (escapes kept as written: only the
    values of `priority`, `tp_rank` and SELECT's labels are compared, never shown)."""
    return {k.decode(): v.decode("utf-8", "replace") for k, v in _LABEL.findall(text)}


def _sane(field: str, v: float) -> bool:
    if not math.isfinite(v) or v < 0:
        return False
    if field == "kv":
        return v <= 1.0
    return v <= (MAX_COUNTER if field in COUNTERS else MAX_GAUGE)


def parse(body: bytes, t: float, max_series: int = MAX_SERIES) -> Read:
    """The engine's page -> one EngineSample (series of one family combined per FAMILIES).

    Only the wanted families' sample lines are read, by a small parser of that one line
    shape, and at most `max_series` samples of each family (the rest are counted,
    engine_series_dropped). A line that is not a sample makes the page a parse error (as in
    Prometheus); a value that is not finite, negative, a KV share outside [0, 1] or beyond
    MAX_GAUGE / MAX_COUNTER is left out (engine_bad_value)."""
    lines, excess = wanted_lines(body, max_series)
    if not lines:
        return Read(EngineSample(t), "", NO_STATS)
    series: dict[str, list[tuple[bytes, float]]] = {}
    dropped: Counter[str] = Counter()
    if excess:
        dropped[SERIES_DROPPED] = excess
    engine = ""
    for line in lines:
        try:
            name, text, v = _value(line)
        except ValueError:
            return Read(None, engine, PARSE_ERROR)
        family = name.decode()
        field, _how = FAMILIES[family]
        engine = engine or family.split(":", 1)[0]
        if not _sane(field, v):
            dropped[BAD_VALUE] += 1
            continue
        pick = SELECT.get(family)
        if pick is not None and labels(text).get(pick[0]) != pick[1]:
            continue
        series.setdefault(field, []).append((text, v))
    values = {
        field: combine(
            [(labels(text), v) for text, v in got] if len(got) > 1 else [({}, got[0][1])],
            _HOW[field],
            field in PRIORITY_GAUGES,
        )
        for field, got in series.items()
    }
    if "waiting_capacity" in values:  # what `queueing` means: waits for capacity
        values["waiting"] = values.pop("waiting_capacity")
    if "running" not in values:
        return Read(EngineSample(t), engine, NO_STATS, MappingProxyType(dict(dropped)))
    return Read(EngineSample(t, **values), engine, None, MappingProxyType(dict(dropped)))


class CounterGuard:
    """One replica's counters made sane across reads: a counter that goes backwards was
    reset (its new value is the increase, as Prometheus counts it); an increase beyond
    MAX_RATE per second is dropped (counted) and the counter goes on from its new value.
    What comes out never decreases."""

    def __init__(self) -> None:
        self._raw: dict[str, tuple[float, float]] = {}  # field -> (last raw value, its time)
        self._out: dict[str, float] = {}  # field -> the sane cumulative value

    def check(self, sample: EngineSample, dropped: Counter[str]) -> EngineSample:
        fixed: dict[str, float] = {}
        for field in COUNTERS:
            raw = getattr(sample, field)
            if raw is None:
                continue
            last = self._raw.get(field)
            self._raw[field] = (raw, sample.t)
            if last is None:
                self._out[field] = raw
                continue
            increase = raw - last[0] if raw >= last[0] else raw  # backwards: a reset
            bound = MAX_RATE[field] * max(1.0, sample.t - last[1])
            if increase > bound:
                dropped[COUNTER_JUMP] += 1
                increase = 0.0
            self._out[field] = self._out[field] + increase
            if self._out[field] != raw:
                fixed[field] = self._out[field]
        return sample._replace(**fixed) if fixed else sample


def combine(series: Sequence[tuple[Mapping[str, str], float]], how: str, gauge: bool) -> float:
    """One replica's value of one family from its series: summed (`how` "sum": engines of a
    data-parallel server) or the maximum ("max": KV usage). SGLang's TP, PP and EP ranks
    count once (PER_RANK); with priority scheduling a gauge's total is the `priority=""` series, beside
    one series per priority that must not be added to it (metrics_collector.py
    `_log_gauge_queue_count`; counters are split by priority, never totalled, so they add)."""
    if len(series) == 1:
        return series[0][1]
    if gauge and any(labels.get("priority") for labels, _ in series):
        series = [(labels, v) for labels, v in series if not labels.get("priority")] or series
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, v in series:
        key = tuple(sorted((k, x) for k, x in labels.items() if k not in PER_RANK))
        groups[key] = max(groups[key], v) if key in groups else v
    return max(groups.values()) if how == "max" else sum(groups.values())
