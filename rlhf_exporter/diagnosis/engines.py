"""Engine evidence: what the rollout engines did during a step's rollout window, and the
rollout reason it adds (the engine-evidence contract; docs/decision-table.md, docs/engines.md).

Pure: samples and spans in, numbers and a reason out. The engine source
(rlhf_exporter/sources/engines.py) keeps each replica's recent samples; the sidecar calls
`measure()` with a step's rollout spans (`rollout_spans(timeline)`) and `refine()` decides.

Sampling model (the contract's §2): a sample of replica r at time t_i stands for
(t_{i-1}, t_i], the time since r's previous sample, but for at most `engine.max_sample_gap`
seconds (a replica unread for longer is missing there, never assumed unchanged). At each
instant the sums over replicas use each replica's latest sample. Counters (tokens,
preemptions) grow over (t_{i-1}, t_i] evenly; a counter that goes down was reset (the
engine restarted) and its new value is the increase. A counter absent from a sample with
stats and present in the next one appeared there, at its first use (SGLang creates its
counters then, vLLM at start): it grew from 0. Tokens per replica: SGLang's decoded tokens
(`realtime_tokens_total{mode="decode"}`, every decode step) where the replica has them, else
the generated-tokens counter (SGLang's grows only when a request finishes), else SGLang's
`gen_throughput` gauge integrated over the covered time.

Decisions where the contract is silent (docs/decision-table.md, "Engine evidence"):
- a replica is *alive* in W when one of its answers (with or without engine series) covers
  part of W; a replica that answers without engine series (`disable_log_stats=True`) or
  stops answering during W (it died) leaves its part of W uncovered, so the evidence is
  not usable and the log's rules apply;
- the shares and means are over the part of W where every alive replica is covered (the
  jointly covered time), so a missing replica never reads as an idle one;
- W is measured only when its place in time is known to within `engine.max_placement_error`
  of its length: verl logs durations, and the untimed remainder R is spread over the step
  (diagnosis/timeline.py), so W's edges are uncertain by up to R. A real V1 job's first
  step has R 10-14 s beside a 6-12 s `gen`: its W was placed 10 s before the engine's
  requests ran, and read "0 running" there.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

ROLLOUT = "rollout"
ENGINE_REASONS = ("preemption", "kv_pressure", "queueing", "long_tail", "replica_imbalance")
"""The rollout reasons engine evidence can give, in the order they are tested."""


class EngineSample(NamedTuple):
    """One read of one replica. None: the engine did not export that series."""

    t: float
    running: float | None = None
    waiting: float | None = None
    kv: float | None = None  # KV-cache usage, 0-1
    preempted: float | None = None  # counter: preemptions (vLLM) / retractions (SGLang)
    tokens: float | None = None  # counter: generated tokens
    throughput: float | None = None  # gauge: generated tokens per second (SGLang)
    decode_tokens: float | None = None  # counter: decoded tokens, every step (SGLang)

    @property
    def has_stats(self) -> bool:
        return self.running is not None


class EngineLimits(NamedTuple):
    """The `engine:` section of the thresholds file."""

    min_coverage: float = 0.8
    max_sample_gap: float = 3.0
    preemptions_min: float = 0.0
    kv_full: float = 0.95
    kv_pressure_share: float = 0.5
    kv_free: float = 0.90
    queueing_share: float = 0.5
    long_tail_running_ratio: float = 0.10
    long_tail_share: float = 0.30
    imbalance_ratio: float = 1.5
    max_placement_error: float = 0.5

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> EngineLimits:
        """From the merged thresholds document (`Thresholds.document`)."""
        section = doc.get("engine") or {}
        return cls(**{k: float(section[k]) for k in cls._fields if k in section})


class EngineEvidence(NamedTuple):
    window_seconds: float  # |W|
    coverage: float  # the least-covered alive replica's share of W covered by samples
    usable: bool
    replicas: int  # alive replicas
    covered_seconds: float  # the part of W where every alive replica is covered
    peak_running: float
    running_mean: float
    waiting_mean: float
    kv_max: float
    preemptions: float
    tokens: Mapping[str, float]  # generated tokens per replica over W
    kv_max_by_replica: Mapping[str, float]
    imbalance: float | None
    kv_pressure_share: float
    queueing_share: float
    long_tail_share: float

    def numbers(self) -> dict[str, float | None]:
        """The evidence as the reason's numbers (`engine_*` keys)."""
        return {
            "engine_window_seconds": self.window_seconds,
            "engine_coverage": self.coverage,
            "engine_replicas": float(self.replicas),
            "engine_peak_running": self.peak_running,
            "engine_running_mean": self.running_mean,
            "engine_waiting_mean": self.waiting_mean,
            "engine_kv_max": self.kv_max,
            "engine_preemptions": self.preemptions,
            "engine_imbalance": self.imbalance,
            "engine_kv_pressure_share": self.kv_pressure_share,
            "engine_queueing_share": self.queueing_share,
            "engine_long_tail_share": self.long_tail_share,
        }


def rollout_spans(intervals: Iterable[Any], group: str = ROLLOUT) -> list[tuple[float, float]]:
    """W: the union of a timeline's intervals of `group` (Interval: timer, group, start,
    end), merged and ordered. Whatever timers the rollout group holds (`gen`,
    `generate_sequences`, `wait_for_enough_samples`, ...), the timeline's groups decide."""
    spans = sorted((iv[2], iv[3]) for iv in intervals if iv[1] == group and iv[3] > iv[2])
    out: list[tuple[float, float]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _overlap(a: float, b: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


def _span_start(t: float, spans: Sequence[tuple[float, float]]) -> float | None:
    """The start of the span of W that holds instant t (its end included), or None."""
    for s, e in spans:
        if s < t <= e:
            return s
    return None


def _counter_increase(
    samples: Sequence[EngineSample], field: str, spans: Sequence[tuple[float, float]]
) -> float | None:
    """The counter's increase over the spans (pro rata inside each sample interval)."""
    total, seen = 0.0, False
    for prev, cur in itertools.pairwise(samples):
        c0, c1 = getattr(prev, field), getattr(cur, field)
        if c1 is None or cur.t <= prev.t:
            continue
        if c0 is None:
            if not prev.has_stats:
                continue  # the engine's first answer with stats: its counters' past is unknown
            c0 = 0.0  # the counter's first use: created at it, from 0
        seen = True
        inc = c1 - c0 if c1 >= c0 else c1  # a reset: the new value is the increase
        part = _overlap(prev.t, cur.t, spans)
        if part > 0.0:
            total += inc * part / (cur.t - prev.t)
    return total if seen else None


def measure(
    spans: Sequence[tuple[float, float]],
    replicas: Mapping[str, Sequence[EngineSample]],
    lim: EngineLimits,
    prefill: Collection[str] = (),
    placement_error: float = 0.0,
) -> EngineEvidence | None:
    """The evidence over W (`spans`, merged) from each replica's samples (time order).
    None when W is empty, when no replica answered during it, or when W's place in time is
    uncertain by more than `engine.max_placement_error` of its length (`placement_error`:
    the timeline's bound, `Timeline.error_seconds`). `prefill`: the prefill peers of
    disaggregated replicas, whose tokens (about one per request) stay out of the imbalance."""
    window = sum(b - a for a, b in spans)
    if window <= 0.0 or not spans or placement_error > lim.max_placement_error * window:
        return None
    pieces = _pieces(spans, replicas, lim.max_sample_gap)
    if not pieces:
        return None
    coverage = 1.0
    for own in pieces.values():
        covered = sum(_overlap(a, b, spans) for a, b, s in own if s.has_stats)
        coverage = min(coverage, covered / window)
    w = _sweep(spans, pieces, lim)
    tail = sum(d for d, r in w.segments if r <= lim.long_tail_running_ratio * w.peak)
    tail = tail if w.peak else 0.0
    preempted, tokens, kv_by = _per_replica(spans, replicas, pieces)
    generating = [v for k, v in tokens.items() if k not in prefill]
    mean = sum(generating) / len(generating) if generating else 0.0
    imbalance = max(generating) / mean if mean > 0 else None
    share = 1.0 / w.joint if w.joint > 0 else 0.0
    return EngineEvidence(
        window_seconds=window,
        coverage=coverage,
        usable=coverage >= lim.min_coverage and w.joint > 0,
        replicas=len(pieces),
        covered_seconds=w.joint,
        peak_running=w.peak,
        running_mean=w.run_sum * share,
        waiting_mean=w.wait_sum * share,
        kv_max=w.kv_top,
        preemptions=preempted,
        tokens=tokens,
        kv_max_by_replica=kv_by,
        imbalance=imbalance,
        kv_pressure_share=w.kv_full * share,
        queueing_share=w.queue * share,
        long_tail_share=tail * share,
    )


Pieces = dict[str, list[tuple[float, float, EngineSample]]]
"""Per replica that answered during W: (start, end, sample) pieces overlapping W."""


def _pieces(
    spans: Sequence[tuple[float, float]],
    replicas: Mapping[str, Sequence[EngineSample]],
    gap: float,
) -> Pieces:
    """Each sample stands for the time since the one before (at most `gap` seconds)."""
    pieces: Pieces = {}
    for name, samples in replicas.items():
        own = []
        prev_t: float | None = None
        for s in samples:
            # a gauge read at s.t says how the engine was at s.t: it stands for the time
            # since the replica's previous read only inside the span of W holding s.t. A read
            # after W ended (or between two of its spans) says nothing about W: a 0.2 s
            # rollout between two reads 1 s apart is uncovered, not "0 running"
            start = _span_start(s.t, spans)
            if prev_t is not None and s.t > prev_t and start is not None:
                a = max(prev_t, s.t - gap, start)
                if a < s.t:
                    own.append((a, s.t, s))
            prev_t = s.t
        if own:
            pieces[name] = own
    return pieces


class _Sweep(NamedTuple):
    joint: float  # seconds of W every replica covered with stats
    run_sum: float  # running requests x seconds
    wait_sum: float
    peak: float  # running requests, the most at once
    kv_top: float
    kv_full: float  # seconds with the KV cache full and requests waiting
    queue: float  # seconds with requests waiting and the KV cache free
    segments: list[tuple[float, float]]  # (duration, running) for the long-tail share


def _sweep(spans: Sequence[tuple[float, float]], pieces: Pieces, lim: EngineLimits) -> _Sweep:
    """A sweep over the elementary segments of W: each replica's latest covering sample."""
    lo, hi = spans[0][0], spans[-1][1]
    edges = {x for a, b in spans for x in (a, b)}
    for own in pieces.values():
        for a, b, _ in own:
            edges.update(x for x in (a, b) if lo < x < hi)
    cuts = sorted(edges)
    names = list(pieces)
    idx = dict.fromkeys(names, 0)
    joint = run_sum = wait_sum = peak = kv_top = 0.0
    kv_full = queue = 0.0
    segments: list[tuple[float, float]] = []
    span_i = 0
    for x0, x1 in itertools.pairwise(cuts):
        mid = (x0 + x1) / 2
        while span_i < len(spans) and spans[span_i][1] <= mid:
            span_i += 1
        if span_i >= len(spans) or spans[span_i][0] > mid:
            continue  # between two spans of W
        running = waiting = 0.0
        kv = 0.0
        complete = True
        for name in names:
            own = pieces[name]
            i = idx[name]
            while i < len(own) and own[i][1] <= mid:
                i += 1
            idx[name] = i
            if i >= len(own) or own[i][0] > mid or not own[i][2].has_stats:
                complete = False
                break
            s = own[i][2]
            running += s.running or 0.0
            waiting += s.waiting or 0.0
            kv = max(kv, s.kv or 0.0)
        if not complete:
            continue
        d = x1 - x0
        joint += d
        run_sum += running * d
        wait_sum += waiting * d
        peak = max(peak, running)
        kv_top = max(kv_top, kv)
        if kv >= lim.kv_full and waiting > 0:
            kv_full += d
        if waiting > 0 and kv < lim.kv_free:
            queue += d
        segments.append((d, running))
    return _Sweep(joint, run_sum, wait_sum, peak, kv_top, kv_full, queue, segments)


def _per_replica(
    spans: Sequence[tuple[float, float]],
    replicas: Mapping[str, Sequence[EngineSample]],
    pieces: Pieces,
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Preemptions over W (all replicas), and per replica its generated tokens and its
    highest KV cache usage."""
    tokens: dict[str, float] = {}
    kv_by: dict[str, float] = {}
    preempted = 0.0
    for name in pieces:
        samples = replicas[name]
        inc = _counter_increase(samples, "preempted", spans)
        preempted += inc or 0.0
        got = _counter_increase(samples, "decode_tokens", spans)
        if got is None:
            got = _counter_increase(samples, "tokens", spans)
        if got is None:  # SGLang without the counter: integrate gen_throughput
            got = sum(
                (s.throughput or 0.0) * _overlap(a, b, spans)
                for a, b, s in pieces[name]
                if s.throughput is not None
            )
        tokens[name] = got
        kvs = [s.kv for _, _, s in pieces[name] if s.kv is not None]
        if kvs:
            kv_by[name] = max(kvs)
    return preempted, tokens, kv_by


def reason(ev: EngineEvidence, lim: EngineLimits) -> str | None:
    """The contract's §3: the first engine reason that holds, or None (the log decides)."""
    if not ev.usable:
        return None
    if ev.preemptions > lim.preemptions_min:
        return "preemption"
    if ev.kv_pressure_share >= lim.kv_pressure_share:
        return "kv_pressure"
    if ev.queueing_share >= lim.queueing_share:
        return "queueing"
    if ev.peak_running > 0 and ev.long_tail_share >= lim.long_tail_share:
        return "long_tail"
    if ev.imbalance is not None and ev.imbalance >= lim.imbalance_ratio:
        return "replica_imbalance"
    return None


def refine(
    verdict: str,
    log_reason: str | None,
    evidence: Mapping[str, float | None],
    ev: EngineEvidence | None,
    lim: EngineLimits,
) -> tuple[str | None, dict[str, float | None]]:
    """A step's reason and evidence with the engines' evidence: for a `rollout` verdict with
    usable evidence, the engine reason when one holds; otherwise the log's, unchanged."""
    out = dict(evidence)
    if verdict != ROLLOUT or ev is None:
        return log_reason, out
    out.update(ev.numbers())
    found = reason(ev, lim)
    return (found if found is not None else log_reason), out
