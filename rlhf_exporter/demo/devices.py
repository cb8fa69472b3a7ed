"""Simulated GPUs and Ray actors for the demo job, published like every source: `Snapshot`s.

`DemoDevices` is a `PollingSource` (collector `demo`) whose poll reads the demo job's current
phase (rlhf_exporter/demo/scenario.py) and returns the catalog's GPU and Ray series, so the GPU
and Ray panels, and the alerts on them, have data in `serve --demo`. The real NVML and Ray
sources are not involved. Everything it publishes says it is simulated: the GPUs are named
"rlhf-exporter demo (simulated)" with `GPU-demo-...` UUIDs, and the Ray cluster's
`ray_version` is `demo` and its `session_name` `demo-simulated`.

GPU time by step window (docs/gpu-windows.md): with the sidecar's `WindowBoard` (`serve`
passes it here instead of to NVML in the demo), each poll feeds a `WindowJoiner`, as
`NvmlSource` does, with every simulated GPU's timestamped samples (one per `SAMPLE_PERIOD`
at most) and its role, and exports the joiner's `rlhf_window_gpu_*` counters. In a
`separated` phase the first half of the GPUs roll out and the rest train; each sample's
utilization follows the window the demo job's current step is in (the step's windows rebuilt
from the record it will write, `DemoJob.upcoming`, ending when it is due): the trainer's GPUs
idle in `rollout` windows (waiting for samples), the rollout's idle outside them when the
phase says `rollout_waits`. Between steps, and in colocated phases, every GPU is at the
phase's `gpu_busy`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..diagnosis.gpujoin import COLOCATED, ROLLOUT, TRAINER
from ..diagnosis.thresholds import Thresholds
from ..diagnosis.timeline import Timeline, rebuild
from ..diagnosis.windows import separated_trainer, split, timers
from ..gpuwindows.board import WindowJoiner
from ..metrics.snapshot import Sample
from ..sources.base import Clock, Context, PollingSource, PollResult
from ..sources.ray import STATES
from ..sources.roles import ROLES
from .scenario import IDLE, ROLLOUT_PENDING, ROLLOUT_RESTARTING, Phase

NAME = "demo"
GPU_NAME = "rlhf-exporter demo (simulated)"
ACTORS = {"trainer": 8, "rollout": 8, "agent_loop": 4, "reward": 1, "driver": 1}
MEMORY_TOTAL = 80 * (1 << 30)
DEATH_REASON = "WORKER_DIED"
SAMPLE_PERIOD = 1.0  # seconds between a simulated GPU's utilization samples, at least
MAX_SAMPLES = 900  # samples per GPU and poll at most (NVML's buffer is bounded too)


class DemoDevices(PollingSource):
    def __init__(
        self,
        job: Any,
        n_gpus: int = 8,
        interval: float = 1.0,
        seed: int = 0,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        windows: Any = None,
        th: Thresholds | None = None,
    ):
        super().__init__(NAME, interval, wall=wall)
        self.job = job  # a DemoJob: its `phase` and `rollout` say what the devices do
        self.n_gpus = n_gpus
        self._rng = random.Random(seed)
        self._busy = [0.0] * n_gpus
        self._samples = 0
        self._clock = clock  # the busy seconds' clock (a test's simulated one)
        self._last = clock()
        # GPU time by step window (rlhf_exporter/gpuwindows/board.py): None when the sidecar keeps none
        self.joiner = WindowJoiner(windows) if windows is not None else None
        if self.joiner is not None and th is None:
            from ..config import load_thresholds

            th = load_thresholds()
        self.th = th
        self._truths: dict[tuple[float, int], Timeline] = {}  # the demo job's steps, rebuilt

    @classmethod
    def from_settings(cls, settings: Any, context: Context) -> DemoDevices | None:
        """The demo's simulated devices, when `serve --demo` runs a demo job."""
        if context.demo is None:
            return None
        return cls(context.demo, windows=context.windows, th=context.thresholds)

    def jobs(self) -> tuple:
        """No verl job of its own: the demo job is read from its file like any other."""
        return ()

    def describe(self) -> str:
        return f"demo (simulated: {self.n_gpus} GPUs, Ray actors)"

    def _steps(self) -> list[Timeline]:
        """The demo job's latest steps in time: each ends when its record is due."""
        out = []
        for due, record in tuple(getattr(self.job, "upcoming", ())):
            key = (due, record["step"])
            tl = self._truths.get(key)
            data = record["data"]
            if tl is None and self.th is not None and data.get("timing_s/step"):
                all_timers = timers(data)
                sep = separated_trainer(all_timers, data, self.th)
                windows = split(float(data["timing_s/step"]), all_timers, self.th, sep)
                tl = self._truths[key] = rebuild(record["step"], windows, all_timers, due, self.th)
            if tl is not None:
                out.append(tl)
        for key in list(self._truths)[:-8]:
            del self._truths[key]
        return out

    def role(self, i: int, phase: Phase) -> str:
        """GPU `i`'s role: separated, the first half roll out and the rest train."""
        if not phase.separated:
            return COLOCATED
        return ROLLOUT if i < max(1, self.n_gpus // 2) else TRAINER

    def _busy_at(self, role: str, phase: Phase, t: float, steps: list[Timeline]) -> float:
        """The utilization a GPU of `role` has at wall time `t`, noise aside."""
        if role == COLOCATED:
            return phase.gpu_busy
        group = next((g for tl in steps if (g := tl.group_at(t)) is not None), None)
        if group is None:  # between steps (the demo's accelerated gaps)
            return phase.gpu_busy
        if role == TRAINER:
            return IDLE if group == "rollout" else phase.gpu_busy
        return IDLE if phase.rollout_waits and group != "rollout" else phase.gpu_busy

    def poll(self) -> PollResult:
        now = self._clock()
        dt, self._last = now - self._last, now
        wall = self.wall()
        phase, life = self.job.phase, self.job.rollout
        self._samples += 1
        # the samples since the last poll, evenly spread, each covering the time since the
        # one before it (as NVML's buffered samples do)
        n = min(MAX_SAMPLES, max(1, round(dt / SAMPLE_PERIOD)))
        span = dt / n
        times = [wall - dt + (k + 1) * span for k in range(n)]
        steps = self._steps() if phase.separated else []
        out: list[Sample] = [Sample("rlhf_ray_cluster_info", ("demo", "demo-simulated"), 1.0)]
        for i in range(self.n_gpus):
            gpu, uuid = str(i), f"GPU-demo-{i:04d}-0000-0000-0000-000000000000"
            key = (gpu, uuid)
            role = self.role(i, phase)
            ratios = [
                min(
                    1.0,
                    max(0.0, self._busy_at(role, phase, t, steps) + self._rng.uniform(-0.03, 0.03)),
                )
                for t in times
            ]
            util = ratios[-1]
            self._busy[i] += sum(ratios) * span
            if self.joiner is not None:
                self.joiner.add_samples(gpu, role, zip(times, ratios))
            if role == COLOCATED:  # the trainer and a rollout engine share every GPU
                memory = [("trainer", MEMORY_TOTAL * 0.45 * util), ("rollout", MEMORY_TOTAL * 0.2)]
            elif role == ROLLOUT:  # the rollout engine's weights and KV cache
                memory = [("rollout", MEMORY_TOTAL * 0.6)]
            else:
                memory = [("trainer", MEMORY_TOTAL * (0.2 + 0.6 * util))]
            out += [
                Sample("rlhf_gpu_info", (gpu, uuid, GPU_NAME, "demo"), 1.0),
                Sample("rlhf_gpu_utilization_ratio", key, util),
                Sample("rlhf_gpu_busy_seconds_total", key, self._busy[i]),
                Sample("rlhf_gpu_samples_total", key, float(self._samples)),
                Sample("rlhf_gpu_memory_used_bytes", key, MEMORY_TOTAL * (0.2 + 0.7 * util)),
                Sample("rlhf_gpu_memory_total_bytes", key, float(MEMORY_TOTAL)),
                Sample("rlhf_gpu_power_watts", key, 90.0 + 600.0 * util),
                Sample("rlhf_gpu_temperature_celsius", key, 35.0 + 40.0 * util),
                Sample("rlhf_gpu_sm_clock_hertz", key, 1.98e9),
                *(Sample("rlhf_gpu_role_memory_bytes", (*key, r), v) for r, v in memory),
            ]
        if self.joiner is not None:
            self.joiner.join(wall)
            out += self.joiner.samples()
        # the rollout actor that died: RESTARTING, then (its replacement) PENDING_CREATION
        away = {"RESTARTING": ROLLOUT_RESTARTING, "PENDING_CREATION": ROLLOUT_PENDING}
        for role in ROLES:
            n = ACTORS.get(role, 0)
            for state in STATES:
                value = 0
                if state == "ALIVE":
                    value = n - (life.state in away.values() if role == "rollout" else 0)
                elif state in away and role == "rollout":
                    value = int(life.state == away[state])
                out.append(Sample("rlhf_ray_actors", (role, state), float(value)))
        out.append(Sample("rlhf_ray_actor_restarts_total", ("rollout",), float(life.restarts)))
        deaths = float(life.deaths)  # a worker death: a failure (rlhf_exporter/lifecycle.py)
        out.append(Sample("rlhf_ray_actor_deaths_total", ("rollout", DEATH_REASON), deaths))
        out.append(Sample("rlhf_ray_actor_failures_total", ("rollout", DEATH_REASON), deaths))
        return PollResult(tuple(out))
