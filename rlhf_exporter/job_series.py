"""One verl job's exposition: its catalog series (the "verl steps" section) and the
summary the landing page and the job view show, read from the `Job`'s state. `samples()`
is cached until the job changes, so a scrape with nothing new costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

from .diagnosis import (
    CHANGES,
    COST_GROUPS,
    GROUPS,
    REASONS,
    VERDICTS,
    StepDiagnosis,
    StreamDiagnoser,
    Thresholds,
    history,
)
from .diagnosis.advice import missing_evidence
from .diagnosis.change import STEADY
from .diagnosis.engines import EngineEvidence
from .diagnosis.episodes import Episode, episodes
from .diagnosis.values import AGENT_LOOP, TIMER_PREFIX, num
from .job_history import StepHistory
from .lifecycle import STATES
from .metrics.catalog import BY_NAME, LEGACY_STEADY
from .metrics.snapshot import Row, Sample, pack
from .records import (
    FULLY_ASYNC_PREFIX,
    IDLE_SUFFIX,
    MAX_LABEL_CHARS,
    MFU_PREFIX,
    NON_ABORTED_PREFIX,
    Limits,
    clean_label,
)

GIB = float(1 << 30)  # verl's *_memory_*_gb are torch bytes / 2**30

# every job's (verdict, reason) counter keys: one set of tuples, not one per job (issue 37)
REASON_KEYS = tuple((v, r) for v in VERDICTS for r in REASONS[v])
RESPONSE_STATS = ("mean", "max", "min")
AGENT_PARTS = ("generate_sequences", "tool_calls", "compute_score")
AGENT_STATS = ("min", "max", "mean")
MEMORY_KEYS = {  # metric -> verl keys, newest spelling first (before 0.8: no actor/ prefix)
    "rlhf_memory_max_allocated_bytes": (
        "actor/perf/max_memory_allocated_gb",
        "perf/max_memory_allocated_gb",
    ),
    "rlhf_memory_max_reserved_bytes": (
        "actor/perf/max_memory_reserved_gb",
        "perf/max_memory_reserved_gb",
    ),
}
ABORTED_KEY = "response/aborted_ratio"
PROCESSING_PREFIX = "fully_async/processing_time/"
PROCESSING_STATS = frozenset({"avg", "max", "min", "tp50", "tp95", "tp99"})
RESOURCE_KEYS = {  # verl key -> `side` label (fully-async dynamic resources, verl 0.9.1)
    "dynamic_resource/rollout_resource_utilization": "rollout",
    "dynamic_resource/train_resource_utilization": "train",
}


def _agent_key(key: str) -> str | None:
    """`agent_loop/...` with verl's `timing_s/` prefix removed, or None."""
    if key.startswith(TIMER_PREFIX):
        key = key[len(TIMER_PREFIX) :]
    return key[len(AGENT_LOOP) :] if key.startswith(AGENT_LOOP) else None


def extra_values(data: Mapping[str, Any]) -> dict[tuple[str, tuple[str, ...]], float]:
    """The per-record gauges that are read straight from verl keys (not the decision table):
    throughput, MFU, response length (and without aborted samples, the aborted share), agent
    loop, memory, fully-async idle ratios, per-sample processing time and dynamic resource
    utilization. Label values come from fixed sets (stat, side), so each series is bounded.
    Keys map (metric name, extra label values) to the value."""
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for key, raw in data.items():
        value = num(raw)
        if value is None:
            continue
        if key == "perf/throughput":
            out["rlhf_throughput_tokens_per_gpu_second", ()] = value
        elif key.startswith(MFU_PREFIX):
            stage = key[len(MFU_PREFIX) :]
            if stage and len(stage) <= MAX_LABEL_CHARS:
                out["rlhf_mfu_ratio", (stage,)] = value
        elif key.startswith("response_length/"):
            stat = key[len("response_length/") :]
            if stat in RESPONSE_STATS:
                out["rlhf_response_length_tokens", (stat,)] = value
        elif key.startswith(NON_ABORTED_PREFIX):
            stat = key[len(NON_ABORTED_PREFIX) :]
            if stat in RESPONSE_STATS:
                out["rlhf_response_length_non_aborted_tokens", (stat,)] = value
        elif key == ABORTED_KEY:
            if value <= 1.0:  # a share: anything else is no verl value
                out["rlhf_response_aborted_ratio", ()] = value
        elif key.startswith(PROCESSING_PREFIX):
            stat = key[len(PROCESSING_PREFIX) :]
            if stat in PROCESSING_STATS:
                out["rlhf_fully_async_processing_seconds", (stat,)] = value
        elif key in RESOURCE_KEYS:
            if value <= 1.0:
                out["rlhf_dynamic_resource_utilization_ratio", (RESOURCE_KEYS[key],)] = value
        elif key.startswith(FULLY_ASYNC_PREFIX) and key.endswith(IDLE_SUFFIX):
            component = key[len(FULLY_ASYNC_PREFIX) : -len(IDLE_SUFFIX)]
            if component and len(component) <= MAX_LABEL_CHARS:
                out["rlhf_fully_async_idle_ratio", (component,)] = value
        else:
            agent = _agent_key(key)
            if agent is None:
                continue
            part, _, stat = agent.partition("/")
            if part == "slowest":
                if stat in AGENT_PARTS:
                    out["rlhf_agent_loop_slowest_seconds", (stat,)] = value
                elif stat == "response_length":
                    out["rlhf_agent_loop_slowest_response_length_tokens", ()] = value
            elif part in AGENT_PARTS and stat in AGENT_STATS:
                out["rlhf_agent_loop_seconds", (part, stat)] = value
            elif part == "num_preempted" and stat == "max":
                out["rlhf_agent_loop_preempted_max", ()] = value
    for metric, keys in MEMORY_KEYS.items():
        for key in keys:
            value = num(data.get(key))
            if value is not None:
                out[metric, ()] = value * GIB
                break
    return out


class JobSeries:
    """The exposition half of `Job` (rlhf_exporter/jobs.py), which holds these attributes."""

    labels: tuple[str, str]
    project: str
    experiment: str
    _th: Thresholds
    limits: Limits
    _samples: Sequence[Sample] | None
    _history: StepHistory
    _episodes: tuple[Sequence[history.StepPoint], tuple[Episode, ...]]
    _extra: dict[tuple[str, tuple[str, ...]], float]
    _evidence_seen: set[str]
    _shape: set[str]
    _engine_windows: dict[str, int]
    _engine_preemptions: float
    step: int | None
    steps: int
    last_step_time: float | None
    between_steps_max: float
    state_since: float
    step_seconds: float
    untimed_seconds: float
    tokens: float
    group_seconds: dict[str, float]
    verdict_steps: dict[str, int]
    reason_steps: dict[tuple[str, str], int]
    change_steps: dict[str, int]
    regression_steps: dict[str, int]
    last: StepDiagnosis | None
    _diagnoser: StreamDiagnoser
    engine: EngineEvidence | None
    engine_step: int | None

    @property
    def run(self) -> int:
        raise NotImplementedError

    @property
    def state(self) -> str:
        raise NotImplementedError

    @property
    def state_signal(self) -> str:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    def samples(self) -> Sequence[Sample]:
        """Every series of the job, label values in catalog order; cached until new input.
        Packed (metrics/snapshot.py: a job with the same series as another shares their
        names and label values; its values are one array), never a tuple of `Sample`s."""
        if self._samples is None:
            self._samples = pack(self.labels, self._build())
        return self._samples

    def _build(self) -> Iterable[Row]:
        if self.step is not None:
            yield ("rlhf_step", (), float(self.step))
        yield ("rlhf_run", (), float(self.run))
        yield ("rlhf_steps_total", (), float(self.steps))
        if self.last_step_time is not None:
            yield ("rlhf_last_step_timestamp_seconds", (), self.last_step_time)
            yield ("rlhf_between_steps_max_seconds", (), self.between_steps_max)
        state = self.state
        yield ("rlhf_job_finished", (), 1.0 if state == "finished" else 0.0)
        for name in STATES:
            yield ("rlhf_job_state", (name,), 1.0 if name == state else 0.0)
        yield ("rlhf_job_state_timestamp_seconds", (), self.state_since)
        yield ("rlhf_step_seconds_total", (), self.step_seconds)
        yield ("rlhf_untimed_seconds_total", (), self.untimed_seconds)
        yield ("rlhf_tokens_total", (), self.tokens)
        for group in GROUPS:
            yield ("rlhf_group_seconds_total", (group,), self.group_seconds[group])
        last = self.last
        for verdict in VERDICTS:
            hit = last is not None and last.verdict == verdict
            yield ("rlhf_bottleneck", (verdict,), 1.0 if hit else 0.0)
            yield ("rlhf_bottleneck_steps_total", (verdict,), float(self.verdict_steps[verdict]))
        for (verdict, reason), n in self.reason_steps.items():
            yield ("rlhf_bottleneck_reason_steps_total", (verdict, reason), float(n))
        for kind in CHANGES:
            hit = last is not None and last.change.change == kind
            # one value per kind at a time, never both: the deprecated setting swaps it
            shown = LEGACY_STEADY if kind == STEADY and self.limits.legacy_change_none else kind
            yield ("rlhf_change", (shown,), 1.0 if hit else 0.0)
            yield ("rlhf_change_steps_total", (shown,), float(self.change_steps[kind]))
        for group in COST_GROUPS:
            yield ("rlhf_regression_steps_total", (group,), float(self.regression_steps[group]))
        if last is not None:
            yield from self._last_step(last)
        if self.engine is not None:
            yield from self._engine_samples(self.engine)
        for (name, extra), value in sorted(self._extra.items()):
            yield (name, extra, value)

    def _engine_samples(self, ev: EngineEvidence) -> Iterable[Row]:
        yield ("rlhf_engine_evidence_usable", (), 1.0 if ev.usable else 0.0)
        for usable, n in self._engine_windows.items():
            yield ("rlhf_engine_windows_total", (usable,), float(n))
        yield ("rlhf_engine_window_seconds", (), ev.window_seconds)
        yield ("rlhf_engine_coverage_ratio", (), ev.coverage)
        yield ("rlhf_engine_replicas", (), float(ev.replicas))
        yield ("rlhf_engine_running_requests_peak", (), ev.peak_running)
        yield ("rlhf_engine_running_requests_mean", (), ev.running_mean)
        yield ("rlhf_engine_waiting_requests_mean", (), ev.waiting_mean)
        yield ("rlhf_engine_kv_cache_usage_max_ratio", (), ev.kv_max)
        yield ("rlhf_engine_window_preemptions", (), ev.preemptions)
        yield ("rlhf_engine_preemptions", (), ev.preemptions)  # deprecated (issue 38)
        yield ("rlhf_engine_preemptions_total", (), self._engine_preemptions)
        if ev.imbalance is not None:
            yield ("rlhf_engine_imbalance_ratio", (), ev.imbalance)
        for condition, share in (
            ("kv_pressure", ev.kv_pressure_share),
            ("queueing", ev.queueing_share),
            ("long_tail", ev.long_tail_share),
        ):
            yield ("rlhf_engine_window_share_ratio", (condition,), share)
        for replica, tokens in sorted(ev.tokens.items()):
            label, _ = clean_label(replica[:MAX_LABEL_CHARS])
            yield ("rlhf_engine_replica_generated_tokens", (label,), tokens)
        for replica, kv in sorted(ev.kv_max_by_replica.items()):
            label, _ = clean_label(replica[:MAX_LABEL_CHARS])
            yield ("rlhf_engine_replica_kv_cache_usage_max_ratio", (label,), kv)

    def _last_step(self, d: StepDiagnosis) -> Iterable[Row]:
        w = d.windows
        yield ("rlhf_step_duration_seconds", (), w.step_seconds)
        yield ("rlhf_untimed_duration_seconds", (), w.untimed_seconds)
        phases = dict(d.timers)
        for _outer, rest in self._th.split_timers.values():  # e.g. verl 0.6's weight load
            if rest in w.counted:
                phases.setdefault(rest, w.counted[rest])
        for phase, seconds in sorted(phases.items()):
            if (
                phase != "step" and len(phase) <= MAX_LABEL_CHARS
            ):  # step: rlhf_step_duration_seconds
                yield ("rlhf_phase_duration_seconds", (phase,), seconds)
        for group in GROUPS:
            yield ("rlhf_group_duration_seconds", (group,), w.group_seconds[group])
            yield ("rlhf_group_share_ratio", (group,), w.shares[group])
        for reason in REASONS[d.verdict]:
            yield (
                "rlhf_bottleneck_reason",
                (d.verdict, reason),
                1.0 if reason == d.reason else 0.0,
            )
        if d.tokens is not None:
            yield ("rlhf_step_tokens", (), d.tokens)
        point, base = d.change.point, d.change.baseline
        if point is not None:
            for group in COST_GROUPS:
                yield ("rlhf_group_cost_seconds_per_token", (group,), point.costs[group])
        if base is not None:
            for group in COST_GROUPS:
                yield ("rlhf_baseline_group_cost_seconds_per_token", (group,), base.costs[group])
            yield ("rlhf_baseline_step_duration_seconds", (), base.busy_seconds)
            yield ("rlhf_baseline_tokens_per_second", (), base.tokens_per_second)

    def episodes(self, kept: Sequence[history.StepPoint] | None = None) -> tuple[Episode, ...]:
        """The change episodes of the kept steps (rlhf_exporter/diagnosis/episodes.py),
        computed once per new step, when a page first asks (`kept`: of that history)."""
        if kept is None:
            kept = self._history  # replaced whole by the source's thread: read once
        cached = self._episodes
        if cached[0] is not kept:
            cached = (kept, tuple(episodes(kept)))
            if kept is self._history:
                self._episodes = cached
        return cached[1]

    def summary(self) -> dict[str, Any]:
        """What the landing page shows for this job."""
        d = self.last
        out: dict[str, Any] = {
            "project": self.project,
            "experiment": self.experiment,
            "step": self.step,
            "run": self.run,
            "history": self._history,  # StepPoints (the job view; not in /api/v1/jobs)
            # Episodes of the history (the job view), computed when a page first reads them:
            # a summary is built at every step, a page is drawn far less often (issue 37)
            "episodes": LazyEpisodes(self, self._history),
            "steps": self.steps,
            "verdict": d.verdict if d else None,
            "reason": d.reason if d else None,
            "change": d.change.change if d else None,
            "regressed": d.change.regressed if d else None,
            "step_seconds": d.windows.step_seconds if d else None,
            "last_step_time": self.last_step_time,
            # what the stall limit reads (diagnosis/stall.py), as rlhf_baseline_step_duration_
            # seconds and rlhf_between_steps_max_seconds export them
            "baseline_step_seconds": (
                d.change.baseline.busy_seconds if d and d.change.baseline is not None else None
            ),
            "between_steps_max": self.between_steps_max,
            # the pages' "warming up" (no baseline yet: N of min_baseline_steps usable steps
            # of this run); the series and `change` keep their values
            "baseline_ready": bool(d and d.change.baseline is not None),
            "baseline_steps": len(self._diagnoser.baseline),
            "baseline_needed": self._th.min_baseline_steps,
            "finished": self.finished,
            "state": self.state,
            "state_signal": self.state_signal,
            "cannot_show": missing_evidence(self._evidence_seen | self._shape),
        }
        if self.engine is not None:  # a sidecar without engines: the summary as before
            out["engine"] = _engine_summary(self.engine, self.engine_step)
        return out


class LazyEpisodes(Sequence[Episode]):
    """A job's change episodes of one history, computed on first use (see `summary`)."""

    __slots__ = ("_job", "_kept")

    def __init__(self, job: JobSeries, kept: Sequence[history.StepPoint]):
        self._job, self._kept = job, kept

    def _all(self) -> tuple[Episode, ...]:
        return self._job.episodes(self._kept)

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, i: int) -> Episode: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Episode, ...]: ...
    def __getitem__(self, i: int | slice) -> Episode | tuple[Episode, ...]:
        return self._all()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyEpisodes):
            other = other._all()
        return self._all() == other

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def _engine_summary(ev: EngineEvidence, step: int | None) -> dict[str, Any]:
    """The engine evidence for `/` and the job view."""
    return {
        "step": step,
        "usable": ev.usable,
        "coverage": ev.coverage,
        "replicas": ev.replicas,
        "peak_running": ev.peak_running,
        "waiting_mean": ev.waiting_mean,
        "kv_max": ev.kv_max,
        "preemptions": ev.preemptions,
        "imbalance": ev.imbalance,
        "kv_pressure_share": ev.kv_pressure_share,
        "queueing_share": ev.queueing_share,
        "long_tail_share": ev.long_tail_share,
    }


def verl_metric_names() -> frozenset[str]:
    """The catalog's "verl steps" names (a test checks `Job` can emit each of them)."""
    return frozenset(n for n, m in BY_NAME.items() if m.section == "verl steps")
