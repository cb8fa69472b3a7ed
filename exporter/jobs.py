"""One verl job, as the sidecar keeps it: records in, catalog series out.

A `Job` feeds every record to a `StreamDiagnoser` and keeps what the "verl steps" section of
the catalog needs. Its counters only ever grow: a restart (the step number going down), a
truncated or replaced file (`new_run()`) or a resume start a new run and a new baseline, and
the counters carry on. `samples()` is cached until the next record, so a scrape with
nothing new costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .diagnosis import (
    CHANGES,
    COST_GROUPS,
    GROUPS,
    REASONS,
    VERDICTS,
    Record,
    StepDiagnosis,
    StreamDiagnoser,
    Thresholds,
)
from .diagnosis.values import AGENT_LOOP, TIMER_PREFIX, num
from .metrics.catalog import BY_NAME
from .metrics.snapshot import Sample

GIB = float(1 << 30)  # verl's *_memory_*_gb are torch bytes / 2**30

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
MFU_PREFIX = "perf/mfu/"
FULLY_ASYNC_PREFIX = "fully_async/"
IDLE_SUFFIX = "/idle_ratio"
MAX_LABEL_CHARS = 120  # a verl key used as a label value (phase, stage, component)
# timers that run between two steps' records, outside timing_s/step (verl-stream.md: testing
# always; save_checkpoint in 0.6.x and the separated trainers; counted in any version)
BETWEEN_STEPS = (TIMER_PREFIX + "testing", TIMER_PREFIX + "save_checkpoint")
FINISHED_KEY = "rlhf_job_finished"  # a record key a job may log at its end (value 1)


def _agent_key(key: str) -> str | None:
    """`agent_loop/...` with verl's `timing_s/` prefix removed, or None."""
    if key.startswith(TIMER_PREFIX):
        key = key[len(TIMER_PREFIX) :]
    return key[len(AGENT_LOOP) :] if key.startswith(AGENT_LOOP) else None


def extra_values(data: Mapping[str, Any]) -> dict[tuple[str, tuple[str, ...]], float]:
    """The per-record gauges that are read straight from verl keys (not the decision table):
    throughput, MFU, response length, agent loop, memory, fully-async idle ratios.
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


class Job:
    """The state of one verl job (`project`, `experiment`) across all its runs."""

    def __init__(
        self,
        project: str,
        experiment: str,
        th: Thresholds,
        clock: Callable[[], float] = time.time,
        total_steps: int | None = None,
    ):
        self.project = project
        self.experiment = experiment
        self.labels = (project, experiment)
        self._th = th
        self._diagnoser = StreamDiagnoser(th)
        self._run_base = 0  # runs before the current diagnoser (explicit new_run calls)
        self._clock = clock
        self.total_steps = total_steps
        self.between_steps_max = 0.0  # this run's longest testing + save_checkpoint
        self.finished_marker = False  # this run logged rlhf_job_finished
        self.records = 0
        self.step: int | None = None
        self.last_step_time: float | None = None
        self.last: StepDiagnosis | None = None
        self.steps = 0
        self.step_seconds = 0.0
        self.untimed_seconds = 0.0
        self.tokens = 0.0
        self.group_seconds = dict.fromkeys(GROUPS, 0.0)
        self.verdict_steps = dict.fromkeys(VERDICTS, 0)
        self.reason_steps = {(v, r): 0 for v in VERDICTS for r in REASONS[v]}
        self.change_steps = dict.fromkeys(CHANGES, 0)
        self.regression_steps = dict.fromkeys(COST_GROUPS, 0)
        self._extra: dict[tuple[str, tuple[str, ...]], float] = {}
        self._samples: tuple[Sample, ...] | None = None

    @property
    def run(self) -> int:
        return self._run_base + max(self._diagnoser.run, 0)

    @property
    def finished(self) -> bool:
        """The job reached the end verl shows (its step reached --total-steps), or it
        logged the rlhf_job_finished marker in this run."""
        reached = (
            self.total_steps is not None and self.step is not None and self.step >= self.total_steps
        )
        return reached or self.finished_marker

    @property
    def verdict(self) -> str | None:
        return self.last.verdict if self.last else None

    def new_run(self) -> None:
        """The input started over (a truncated or replaced file): whatever step comes next
        opens a new run with a fresh baseline. Counters carry on."""
        if self._diagnoser.run >= 0:
            self._run_base += self._diagnoser.run + 1
            self._diagnoser = StreamDiagnoser(self._th)
            self._run_reset()
            self._samples = None

    def _run_reset(self) -> None:
        self._extra.clear()
        self.between_steps_max = 0.0
        self.finished_marker = False

    def feed(self, records: Iterable[Record], now: float | None = None) -> int:
        """Ingest records in order; returns how many."""
        n = 0
        for record in records:
            event = self._diagnoser.feed(record)
            n += 1
            if event.new_run:
                self._run_reset()
            if event.new_step:
                self.steps += 1
                self.last_step_time = self._clock() if now is None else now
            self.step = record.step
            self._extra.update(extra_values(record.data))
            self._between_steps(record.data)
            if event.diagnosis is not None:
                self._classified(event.diagnosis)
        if n:
            self.records += n
            self._samples = None
        return n

    def _between_steps(self, data: Mapping[str, Any]) -> None:
        outside = 0.0
        for key in BETWEEN_STEPS:
            value = num(data.get(key))
            if value is not None and value > 0:
                outside += value
        if outside > self.between_steps_max:
            self.between_steps_max = outside
        if num(data.get(FINISHED_KEY)):
            self.finished_marker = True

    def _classified(self, d: StepDiagnosis) -> None:
        self.last = d
        self.step_seconds += d.windows.step_seconds
        self.untimed_seconds += d.windows.untimed_seconds
        for group, seconds in d.windows.group_seconds.items():
            self.group_seconds[group] += seconds
        self.verdict_steps[d.verdict] += 1
        if d.reason is not None:
            self.reason_steps[d.verdict, d.reason] = (
                self.reason_steps.get((d.verdict, d.reason), 0) + 1
            )
        self.change_steps[d.change.change] += 1
        if d.change.regressed is not None:
            self.regression_steps[d.change.regressed] += 1
        if d.tokens is not None:
            self.tokens += d.tokens

    # -- scrape side ----------------------------------------------------------------------
    def samples(self) -> tuple[Sample, ...]:
        """Every series of the job, label values in catalog order; cached until new input."""
        if self._samples is None:
            self._samples = tuple(self._build())
        return self._samples

    def _build(self) -> Iterable[Sample]:
        j = self.labels
        if self.step is not None:
            yield Sample("rlhf_step", j, float(self.step))
        yield Sample("rlhf_run", j, float(self.run))
        yield Sample("rlhf_steps_total", j, float(self.steps))
        if self.last_step_time is not None:
            yield Sample("rlhf_last_step_timestamp_seconds", j, self.last_step_time)
            yield Sample("rlhf_between_steps_max_seconds", j, self.between_steps_max)
        yield Sample("rlhf_job_finished", j, 1.0 if self.finished else 0.0)
        yield Sample("rlhf_step_seconds_total", j, self.step_seconds)
        yield Sample("rlhf_untimed_seconds_total", j, self.untimed_seconds)
        yield Sample("rlhf_tokens_total", j, self.tokens)
        for group in GROUPS:
            yield Sample("rlhf_group_seconds_total", j + (group,), self.group_seconds[group])
        last = self.last
        for verdict in VERDICTS:
            hit = last is not None and last.verdict == verdict
            yield Sample("rlhf_bottleneck", j + (verdict,), 1.0 if hit else 0.0)
            yield Sample(
                "rlhf_bottleneck_steps_total", j + (verdict,), float(self.verdict_steps[verdict])
            )
        for (verdict, reason), n in self.reason_steps.items():
            yield Sample("rlhf_bottleneck_reason_steps_total", j + (verdict, reason), float(n))
        for kind in CHANGES:
            hit = last is not None and last.change.change == kind
            yield Sample("rlhf_change", j + (kind,), 1.0 if hit else 0.0)
            yield Sample("rlhf_change_steps_total", j + (kind,), float(self.change_steps[kind]))
        for group in COST_GROUPS:
            yield Sample(
                "rlhf_regression_steps_total", j + (group,), float(self.regression_steps[group])
            )
        if last is not None:
            yield from self._last_step(last)
        for (name, extra), value in sorted(self._extra.items()):
            yield Sample(name, j + extra, value)

    def _last_step(self, d: StepDiagnosis) -> Iterable[Sample]:
        j = self.labels
        w = d.windows
        yield Sample("rlhf_step_duration_seconds", j, w.step_seconds)
        yield Sample("rlhf_untimed_duration_seconds", j, w.untimed_seconds)
        for phase, seconds in sorted(d.timers.items()):
            if (
                phase != "step" and len(phase) <= MAX_LABEL_CHARS
            ):  # step: rlhf_step_duration_seconds
                yield Sample("rlhf_phase_duration_seconds", j + (phase,), seconds)
        for group in GROUPS:
            yield Sample("rlhf_group_duration_seconds", j + (group,), w.group_seconds[group])
            yield Sample("rlhf_group_share_ratio", j + (group,), w.shares[group])
        for reason in REASONS[d.verdict]:
            yield Sample(
                "rlhf_bottleneck_reason",
                j + (d.verdict, reason),
                1.0 if reason == d.reason else 0.0,
            )
        if d.tokens is not None:
            yield Sample("rlhf_step_tokens", j, d.tokens)
        point, base = d.change.point, d.change.baseline
        if point is not None:
            for group in COST_GROUPS:
                yield Sample("rlhf_group_cost_seconds_per_token", j + (group,), point.costs[group])
        if base is not None:
            for group in COST_GROUPS:
                yield Sample(
                    "rlhf_baseline_group_cost_seconds_per_token", j + (group,), base.costs[group]
                )
            yield Sample("rlhf_baseline_step_duration_seconds", j, base.busy_seconds)
            yield Sample("rlhf_baseline_tokens_per_second", j, base.tokens_per_second)

    def summary(self) -> dict[str, Any]:
        """What the landing page shows for this job."""
        d = self.last
        return {
            "project": self.project,
            "experiment": self.experiment,
            "step": self.step,
            "run": self.run,
            "steps": self.steps,
            "verdict": d.verdict if d else None,
            "reason": d.reason if d else None,
            "change": d.change.change if d else None,
            "regressed": d.change.regressed if d else None,
            "step_seconds": d.windows.step_seconds if d else None,
            "last_step_time": self.last_step_time,
            "finished": self.finished,
        }


def verl_metric_names() -> frozenset[str]:
    """The catalog's "verl steps" names (a test checks `Job` can emit each of them)."""
    return frozenset(n for n, m in BY_NAME.items() if m.section == "verl steps")
