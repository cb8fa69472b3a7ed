"""The GPU, engine and job-state series of a fleet's history (issue 37), for the dashboard bench.

tests/support/fleet_history.py replays the verl logs through the real exporter; these series
need GPUs, engines and a Ray cluster behind each job, so they are written here instead, with
the real exporter's names, label sets and label values (the NVML source's XID codes, ECC
kinds, throttle reasons and remap causes; the decision table's groups; the engine window's
conditions), one value per 15 s scrape, per job:

- one job in `GPU_EVERY` (and the detailed ones) has `GPUS` GPUs behind an NVML sidecar
  (colocated, verl's default; the other jobs' GPU metrics would come from elsewhere, such as
  dcgm-exporter, and are no series of ours): busy seconds at the job's own utilization, the
  health series a rule or the fleet dashboard reads (XID counts from 0, one job in 100 with
  an XID 48 at a random moment; ECC counters, a corrected error now and then; remapped rows,
  remap pending / failed, power-cap throttle seconds), and the step windows' GPU, busy and
  throttled seconds per decision-table group;
- the first `detailed` jobs (the job dashboard shows one) also every other GPU reading
  (info, memory, power, temperature, SM clock, role memory) and the engines' window series
  (2 replicas, new values once a step, ~60 s);
- job states with transitions: a job in 10 finishes or fails at a random hour (its state
  series switch there, `rlhf_job_state_timestamp_seconds` with them), a job in 50 is
  `unknown` for 20 minutes (its exporter lost Ray) and then running again.

Values follow the job's own random draw; query cost depends on the series and samples,
which are the real exporter's count.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlhf_exporter.diagnosis.thresholds import GROUPS
from rlhf_exporter.sources.nvml_readings import ALERTED_XIDS, ECC, ECC_SCOPES, THROTTLE_REASONS

from .simday import JOB, SCRAPE

GPUS = 8
GPU_EVERY = 20  # one job in this many has GPU sidecars (NVML): 50 jobs, 400 GPUs of 1,000
STATES = ("running", "finished", "failed", "unknown")
STATE_NAMES = frozenset({"rlhf_job_state", "rlhf_job_state_timestamp_seconds"})
CONDITIONS = ("kv_pressure", "queueing", "long_tail")
REPLICAS = 2
Labels = dict[str, str]


def _fmt(v: float) -> str:
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else f"{v:.6g}"


def _labels(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


@dataclass
class JobPlan:
    """One job's draw: its utilization, its groups' shares, its state changes."""

    index: int
    project: str
    experiment: str
    instance: str
    start: float
    end: float

    def __post_init__(self) -> None:
        rng = random.Random(self.index)
        self.util = rng.uniform(0.55, 0.95)
        weights = [rng.uniform(0.2, 1.0) if g != "checkpoint" else 0.02 for g in GROUPS]
        self.shares = {g: w / sum(weights) for g, w in zip(GROUPS, weights, strict=True)}
        self.xid_at = rng.uniform(self.start, self.end) if self.index % 100 == 42 else None
        self.ecc_every = rng.choice((0, 0, 0, 3 * 3600, 7 * 3600))
        self.states: list[tuple[float, str]] = [(self.start - 3600, "running")]
        if self.index % 10 == 3:
            at = self.start + rng.uniform(2, 22) * 3600
            self.states.append((at, "finished" if self.index % 20 == 3 else "failed"))
        elif self.index % 50 == 7:
            at = self.start + rng.uniform(2, 20) * 3600
            self.states += [(at, "unknown"), (at + 1200, "running")]
        self.rng = rng

    @property
    def job(self) -> Labels:
        return {
            "job": JOB,
            "instance": self.instance,
            "project": self.project,
            "experiment": self.experiment,
        }

    def state(self, t: float) -> tuple[str, float]:
        current = self.states[0]
        for change in self.states:
            if change[0] <= t:
                current = change
        return current[1], current[0]

    def transitions(self) -> bool:
        return len(self.states) > 1


def _gpu_series(plan: JobPlan, g: int, t0: float, detailed: bool) -> Iterator[tuple]:
    """(name, labels, value at t) of one GPU."""
    gpu = {**plan.job, "gpu": str(g), "uuid": f"GPU-{plan.index:04d}-{g}"}
    role = {**gpu, "gpu_role": "colocated"}
    u = min(plan.util * (0.97 + 0.005 * g), 0.99)
    yield "rlhf_gpu_busy_seconds_total", gpu, lambda t: (t - t0) * u
    xid_at = plan.xid_at if g == 0 else None
    for code in ALERTED_XIDS:
        at = xid_at if code == 48 else None
        yield (
            "rlhf_gpu_xid_errors_total",
            {**role, "xid": str(code)},
            lambda t, at=at: float(at is not None and t >= at),
        )
    every = plan.ecc_every
    for error, _ in ECC:
        for scope, _ in ECC_SCOPES:
            base = 3.0 if scope == "aggregate" and error == "corrected" else 0.0
            grows = every and error == "corrected"
            yield (
                "rlhf_gpu_ecc_errors_total",
                {**role, "error": error, "scope": scope},
                lambda t, b=base, grows=grows: b + ((t - t0) // every if grows else 0),
            )
    for cause in ("correctable", "uncorrectable"):
        yield "rlhf_gpu_remapped_rows", {**role, "cause": cause}, lambda t: 0.0
    yield "rlhf_gpu_row_remap_pending", role, lambda t: 0.0
    yield "rlhf_gpu_row_remap_failed", role, lambda t: 0.0
    for reason in THROTTLE_REASONS:
        share = 0.04 if reason == "power_cap" else 0.0
        yield (
            "rlhf_gpu_throttle_seconds_total",
            {**role, "reason": reason},
            lambda t, s=share: (t - t0) * s,
        )
    if not detailed:
        return
    info = {**gpu, "name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15"}
    yield "rlhf_gpu_info", info, lambda t: 1.0
    yield "rlhf_gpu_memory_total_bytes", gpu, lambda t: 85899345920.0
    yield "rlhf_gpu_memory_used_bytes", gpu, lambda t: 6.1e10 + 8e9 * ((t // 60) % 7) / 7
    yield "rlhf_gpu_power_watts", gpu, lambda t: 300 + 350 * u + 20 * ((t // 15) % 3)
    yield "rlhf_gpu_temperature_celsius", gpu, lambda t: 48 + 25 * u + (t // 60) % 4
    yield "rlhf_gpu_sm_clock_hertz", gpu, lambda t: 1.98e9 - 1.2e8 * ((t // 120) % 2)
    for r in ("rollout", "trainer"):
        yield (
            "rlhf_gpu_role_memory_bytes",
            {**gpu, "role": r},
            lambda t, r=r: (3.4e10 if r == "rollout" else 2.6e10) + 1e9 * ((t // 60) % 3),
        )


def _window_series(plan: JobPlan, t0: float) -> Iterator[tuple]:
    for group, share in plan.shares.items():
        lab = {**plan.job, "group": group, "gpu_role": "colocated"}
        busy = min(plan.util * (1.1 if group in ("update", "logprob") else 0.8), 0.99)
        seconds = GPUS * share
        yield "rlhf_window_gpu_seconds_total", lab, lambda t, s=seconds: (t - t0) * s
        yield (
            "rlhf_window_gpu_busy_seconds_total",
            lab,
            lambda t, s=seconds, b=busy: (t - t0) * s * b,
        )
        yield (
            "rlhf_window_gpu_throttled_seconds_total",
            lab,
            lambda t, s=seconds: (t - t0) * s * 0.01,
        )


def _engine_series(plan: JobPlan) -> Iterator[tuple]:
    """The engines' window series: a new value once a step (about a minute)."""

    def per_step(lo: float, hi: float, salt: int):
        return lambda t: lo + (hi - lo) * random.Random(int(t // 60) * 31 + salt).random()

    j = plan.job
    yield "rlhf_engine_running_requests_peak", j, per_step(200, 256, 1)
    yield "rlhf_engine_running_requests_mean", j, per_step(90, 180, 2)
    yield "rlhf_engine_waiting_requests_mean", j, per_step(0, 40, 3)
    yield "rlhf_engine_kv_cache_usage_max_ratio", j, per_step(0.6, 1.0, 4)
    preempted = lambda t: float(int(t // 60) % 9 == 0)  # noqa: E731
    yield "rlhf_engine_window_preemptions", j, preempted
    yield "rlhf_engine_preemptions", j, preempted  # deprecated (issue 38), still served
    yield "rlhf_engine_imbalance_ratio", j, per_step(1.0, 1.4, 5)
    yield "rlhf_engine_coverage_ratio", j, per_step(0.95, 1.0, 6)
    for k, c in enumerate(CONDITIONS):
        yield "rlhf_engine_window_share_ratio", {**j, "condition": c}, per_step(0, 0.3, 7 + k)
    for r in range(REPLICAS):
        rep = {**j, "replica": str(r)}
        yield "rlhf_engine_replica_generated_tokens", rep, per_step(4e5, 6e5, 20 + r)
        yield "rlhf_engine_replica_kv_cache_usage_max_ratio", rep, per_step(0.6, 1.0, 30 + r)


def _state_series(plan: JobPlan) -> Iterator[tuple]:
    for s in STATES:
        yield (
            "rlhf_job_state",
            {**plan.job, "state": s},
            lambda t, s=s: float(plan.state(t)[0] == s),
        )
    yield "rlhf_job_state_timestamp_seconds", plan.job, lambda t: plan.state(t)[1]


def plans(jobs: int, start: float, end: float) -> list[JobPlan]:
    from .fleet_history import job_names

    return [JobPlan(i, p, e, inst, start, end) for i, (p, e, inst) in enumerate(job_names(jobs))]


def series(plan: JobPlan, t0: float, detailed: bool, gpu_every: int) -> Iterator[tuple]:
    """Every new series of one job: (name, labels, value at t). GPUs on every `gpu_every`-th
    job (and the detailed ones); the job-state series only for a job whose state changes
    (the others' are the real exporter's, in the history already)."""
    if detailed or plan.index % gpu_every == 0:
        for g in range(GPUS):
            yield from _gpu_series(plan, g, t0, detailed)
        yield from _window_series(plan, t0)
    if detailed:
        yield from _engine_series(plan)
    if plan.transitions():
        yield from _state_series(plan)


def write_openmetrics(
    path: Path,
    jobs: list[JobPlan],
    t0: float,
    window: tuple[float, float],
    detailed: int = 10,
    gpu_every: int = GPU_EVERY,
) -> int:
    """The new series' samples in [window) at the 15 s scrapes from `t0`, as OpenMetrics (each
    series' samples together, in time order). Returns the number of samples written."""
    lo, hi = window
    first = t0 + max(0, -(-(lo - t0) // SCRAPE)) * SCRAPE
    stamps = [first + k * SCRAPE for k in range(int((hi - first + SCRAPE - 1) // SCRAPE))]
    stamps = [t for t in stamps if lo <= t < hi]
    samples = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 24) as f:
        for plan in jobs:
            for name, labels, value in series(plan, t0, plan.index < detailed, gpu_every):
                head = f"{name}{{{_labels(labels)}}} "
                f.write("".join(f"{head}{_fmt(value(t))} {_fmt(t)}\n" for t in stamps))
                samples += len(stamps)
        f.write("# EOF\n")
    return samples
