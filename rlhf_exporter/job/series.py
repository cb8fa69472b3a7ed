"""Where a job's families are exposed: the catalog's "verl steps" series of one job, read
from its status and counts. `EXTRA_SERIES` is the table of the gauges read straight from
verl keys (not the decision table): which key feeds which metric, with which label values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..diagnosis import CHANGES, COST_GROUPS, GROUPS, REASONS, VERDICTS, StepDiagnosis, Thresholds
from ..diagnosis.change import STEADY
from ..diagnosis.engines import EngineEvidence
from ..diagnosis.timeline import FULLY_ASYNC_PREFIX
from ..diagnosis.values import AGENT_LOOP, TIMER_PREFIX, num
from ..lifecycle import STATES
from ..metrics.catalog import BY_NAME, LEGACY_STEADY
from ..metrics.snapshot import Row
from .cleaning import clean_label
from .counts import EngineCounts, StepCounts
from .limits import KEY_LABEL_CHARS, Limits
from .record_keys import (
    ABORTED_KEY,
    AGENT_PARTS,
    AGENT_STATS,
    GIB,
    IDLE_SUFFIX,
    MEMORY_KEYS,
    MFU_PREFIX,
    NON_ABORTED_PREFIX,
    PROCESSING_PREFIX,
    PROCESSING_STATS,
    RESOURCE_KEYS,
    RESPONSE_PREFIX,
    RESPONSE_STATS,
    THROUGHPUT_KEY,
)

Series = tuple[str, tuple[str, ...]]  # a metric name and its label values past the job's


class Extra(NamedTuple):
    """What one verl key feeds: a metric with these label values; `share`: the value is a
    ratio, and one over 1 is no verl value (dropped)."""

    metric: str
    labels: tuple[str, ...] = ()
    share: bool = False


FRAMEWORK_INFO = "rlhf_job_framework_info"


def _agent_loop(key: str, extra: Extra) -> list[tuple[str, Extra]]:
    """An agent-loop key under both its spellings: with verl's `timing_s/` prefix or not."""
    return [(AGENT_LOOP + key, extra), (TIMER_PREFIX + AGENT_LOOP + key, extra)]


def _extra_series() -> dict[str, Extra]:
    """Every verl key with a fixed name that feeds a series, and what it feeds. Label values
    come from fixed sets (stat, side, part), so each series is bounded."""
    rows: list[tuple[str, Extra]] = [
        (THROUGHPUT_KEY, Extra("rlhf_throughput_tokens_per_gpu_second")),
        (ABORTED_KEY, Extra("rlhf_response_aborted_ratio", share=True)),
    ]
    for stat in RESPONSE_STATS:
        rows.append((RESPONSE_PREFIX + stat, Extra("rlhf_response_length_tokens", (stat,))))
        rows.append(
            (NON_ABORTED_PREFIX + stat, Extra("rlhf_response_length_non_aborted_tokens", (stat,)))
        )
    for stat in sorted(PROCESSING_STATS):
        rows.append(
            (PROCESSING_PREFIX + stat, Extra("rlhf_fully_async_processing_seconds", (stat,)))
        )
    for key, side in RESOURCE_KEYS.items():
        rows.append((key, Extra("rlhf_dynamic_resource_utilization_ratio", (side,), share=True)))
    for part in AGENT_PARTS:
        rows += _agent_loop(f"slowest/{part}", Extra("rlhf_agent_loop_slowest_seconds", (part,)))
        for stat in AGENT_STATS:
            rows += _agent_loop(f"{part}/{stat}", Extra("rlhf_agent_loop_seconds", (part, stat)))
    rows += _agent_loop(
        "slowest/response_length", Extra("rlhf_agent_loop_slowest_response_length_tokens")
    )
    rows += _agent_loop("num_preempted/max", Extra("rlhf_agent_loop_preempted_max"))
    return dict(rows)


EXTRA_SERIES = _extra_series()
# keys named by a job (its MFU stages, its fully-async components): prefix, suffix, metric;
# a key under a prefix of EXTRA_SERIES' own (processing_time) is not one of these
NAMED_SERIES = (
    (MFU_PREFIX, "", "rlhf_mfu_ratio"),
    (FULLY_ASYNC_PREFIX, IDLE_SUFFIX, "rlhf_fully_async_idle_ratio"),
)


def _named(key: str) -> Series | None:
    """The series of a key that names its own label value, if it is one."""
    if key.startswith(PROCESSING_PREFIX):
        return None
    for prefix, suffix, metric in NAMED_SERIES:
        if key.startswith(prefix) and key.endswith(suffix):
            name = key[len(prefix) : len(key) - len(suffix)]
            if name and len(name) <= KEY_LABEL_CHARS:
                return metric, (name,)
            return None
    return None


def extra_values(data: Mapping[str, Any]) -> dict[Series, float]:
    """The per-record gauges read straight from verl keys (`EXTRA_SERIES`, `NAMED_SERIES`
    and the memory keys, newest spelling first): (metric name, extra label values) -> value."""
    out: dict[Series, float] = {}
    for key, raw in data.items():
        value = num(raw)
        if value is None:
            continue
        extra = EXTRA_SERIES.get(key)
        if extra is not None:
            if not extra.share or value <= 1.0:
                out[extra.metric, extra.labels] = value
            continue
        named = _named(key)
        if named is not None:
            out[named] = value
    for metric, keys in MEMORY_KEYS.items():
        for key in keys:
            value = num(data.get(key))
            if value is not None:
                out[metric, ()] = value * GIB
                break
    return out


class JobStatus(NamedTuple):
    """Where a job stands now, as its series and its summary read it."""

    step: int | None
    run: int
    steps: int
    last_step_time: float | None
    between_steps_max: float
    state: str
    state_signal: str
    state_since: float
    # the last step's time as its job clock ages it (join/ports.py `JobClock.aged`), exported
    # instead of `last_step_time`: None for a real job (the wall's own)
    last_step_aged: float | None = None


def series_rows(
    status: JobStatus,
    counts: StepCounts,
    engines: EngineCounts,
    extra: Mapping[Series, float],
    th: Thresholds,
    limits: Limits,
) -> Iterable[Row]:
    """Every series of one job (the job's own labels left out), in catalog label order."""
    yield from _status_rows(status)
    yield from _count_rows(counts, limits)
    if counts.last is not None:
        yield from _last_step(counts.last, th)
    if engines.last is not None:
        yield from _engine_rows(engines.last, engines)
    for (name, labels), value in sorted(extra.items()):
        yield (name, labels, value)


def _status_rows(status: JobStatus) -> Iterable[Row]:
    if status.step is not None:
        yield ("rlhf_step", (), float(status.step))
    yield ("rlhf_run", (), float(status.run))
    yield ("rlhf_steps_total", (), float(status.steps))
    if status.last_step_time is not None:
        aged = status.last_step_aged
        yield (
            "rlhf_last_step_timestamp_seconds",
            (),
            status.last_step_time if aged is None else aged,
        )
        yield ("rlhf_between_steps_max_seconds", (), status.between_steps_max)
    state = status.state
    yield ("rlhf_job_finished", (), 1.0 if state == "finished" else 0.0)
    for name in STATES:
        yield ("rlhf_job_state", (name,), 1.0 if name == state else 0.0)
    yield ("rlhf_job_state_timestamp_seconds", (), status.state_since)


def _count_rows(counts: StepCounts, limits: Limits) -> Iterable[Row]:
    yield ("rlhf_step_seconds_total", (), counts.step_seconds)
    yield ("rlhf_untimed_seconds_total", (), counts.untimed_seconds)
    yield ("rlhf_tokens_total", (), counts.tokens)
    for group in GROUPS:
        yield ("rlhf_group_seconds_total", (group,), counts.group_seconds[group])
    last = counts.last
    for verdict in VERDICTS:
        hit = last is not None and last.verdict == verdict
        yield ("rlhf_bottleneck", (verdict,), 1.0 if hit else 0.0)
        yield ("rlhf_bottleneck_steps_total", (verdict,), float(counts.verdict_steps[verdict]))
    for (verdict, reason), n in counts.reason_steps.items():
        yield ("rlhf_bottleneck_reason_steps_total", (verdict, reason), float(n))
    for kind in CHANGES:
        hit = last is not None and last.change.change == kind
        # one value per kind at a time, never both: the deprecated setting swaps it
        shown = LEGACY_STEADY if kind == STEADY and limits.legacy_change_none else kind
        yield ("rlhf_change", (shown,), 1.0 if hit else 0.0)
        yield ("rlhf_change_steps_total", (shown,), float(counts.change_steps[kind]))
    for group in COST_GROUPS:
        yield ("rlhf_regression_steps_total", (group,), float(counts.regression_steps[group]))


def _engine_rows(ev: EngineEvidence, engines: EngineCounts) -> Iterable[Row]:
    yield ("rlhf_engine_evidence_usable", (), 1.0 if ev.usable else 0.0)
    for usable, n in engines.windows.items():
        yield ("rlhf_engine_windows_total", (usable,), float(n))
    yield ("rlhf_engine_window_seconds", (), ev.window_seconds)
    yield ("rlhf_engine_coverage_ratio", (), ev.coverage)
    yield ("rlhf_engine_replicas", (), float(ev.replicas))
    yield ("rlhf_engine_running_requests_peak", (), ev.peak_running)
    yield ("rlhf_engine_running_requests_mean", (), ev.running_mean)
    yield ("rlhf_engine_waiting_requests_mean", (), ev.waiting_mean)
    yield ("rlhf_engine_kv_cache_usage_max_ratio", (), ev.kv_max)
    yield ("rlhf_engine_window_preemptions", (), ev.preemptions)
    yield ("rlhf_engine_preemptions", (), ev.preemptions)  # deprecated
    yield ("rlhf_engine_preemptions_total", (), engines.preemptions)
    if ev.imbalance is not None:
        yield ("rlhf_engine_imbalance_ratio", (), ev.imbalance)
    for condition, share in (
        ("kv_pressure", ev.kv_pressure_share),
        ("queueing", ev.queueing_share),
        ("long_tail", ev.long_tail_share),
    ):
        yield ("rlhf_engine_window_share_ratio", (condition,), share)
    for replica, tokens in sorted(ev.tokens.items()):
        label, _ = clean_label(replica[:KEY_LABEL_CHARS])
        yield ("rlhf_engine_replica_generated_tokens", (label,), tokens)
    for replica, kv in sorted(ev.kv_max_by_replica.items()):
        label, _ = clean_label(replica[:KEY_LABEL_CHARS])
        yield ("rlhf_engine_replica_kv_cache_usage_max_ratio", (label,), kv)


def _last_step(d: StepDiagnosis, th: Thresholds) -> Iterable[Row]:
    w = d.windows
    yield ("rlhf_step_duration_seconds", (), w.step_seconds)
    yield ("rlhf_untimed_duration_seconds", (), w.untimed_seconds)
    phases = dict(d.timers)
    for _outer, rest in th.split_timers.values():  # e.g. verl 0.6's weight load
        if rest in w.counted:
            phases.setdefault(rest, w.counted[rest])
    for phase, seconds in sorted(phases.items()):
        # step: rlhf_step_duration_seconds
        if phase != "step" and len(phase) <= KEY_LABEL_CHARS:
            yield ("rlhf_phase_duration_seconds", (phase,), seconds)
    for group in GROUPS:
        yield ("rlhf_group_duration_seconds", (group,), w.group_seconds[group])
        yield ("rlhf_group_share_ratio", (group,), w.shares[group])
    for reason in REASONS[d.verdict]:
        yield ("rlhf_bottleneck_reason", (d.verdict, reason), 1.0 if reason == d.reason else 0.0)
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


def verl_metric_names() -> frozenset[str]:
    """The catalog's "verl steps" names (a test checks `Job` can emit each of them)."""
    return frozenset(n for n, m in BY_NAME.items() if m.section == "verl steps")
