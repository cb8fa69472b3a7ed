"""Simulated GPUs and Ray actors for the demo job, published like every source: `Snapshot`s.

`DemoDevices` is a `PollingSource` (collector `demo`) whose poll reads the demo job's current
phase (exporter/demo/scenario.py) and returns the catalog's GPU and Ray series, so the GPU
and Ray panels, and the alerts on them, have data in `serve --demo`. The real NVML and Ray
sources are not involved. Everything it publishes says it is simulated: the GPUs are named
"rlhf-exporter demo (simulated)" with `GPU-demo-...` UUIDs, and the Ray cluster's
`ray_version` is `demo` and its `session_name` `demo-simulated`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..metrics.snapshot import Sample
from ..sources.base import Clock, Context, PollingSource, PollResult
from ..sources.ray import STATES
from ..sources.roles import ROLES
from .scenario import ROLLOUT_PENDING, ROLLOUT_RESTARTING

NAME = "demo"
GPU_NAME = "rlhf-exporter demo (simulated)"
ACTORS = {"trainer": 8, "rollout": 8, "agent_loop": 4, "reward": 1, "driver": 1}
MEMORY_TOTAL = 80 * (1 << 30)
DEATH_REASON = "WORKER_DIED"


class DemoDevices(PollingSource):
    def __init__(
        self,
        job: Any,
        n_gpus: int = 8,
        interval: float = 1.0,
        seed: int = 0,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ):
        super().__init__(NAME, interval, wall=wall)
        self.job = job  # a DemoJob: its `phase` and `rollout` say what the devices do
        self.n_gpus = n_gpus
        self._rng = random.Random(seed)
        self._busy = [0.0] * n_gpus
        self._samples = 0
        self._clock = clock  # the busy seconds' clock (a test's simulated one)
        self._last = clock()

    @classmethod
    def from_settings(cls, settings: Any, context: Context) -> DemoDevices | None:
        """The demo's simulated devices, when `serve --demo` runs a demo job."""
        return cls(context.demo) if context.demo is not None else None

    def jobs(self) -> tuple:
        """No verl job of its own: the demo job is read from its file like any other."""
        return ()

    def describe(self) -> str:
        return f"demo (simulated: {self.n_gpus} GPUs, Ray actors)"

    def poll(self) -> PollResult:
        now = self._clock()
        dt, self._last = now - self._last, now
        phase, life = self.job.phase, self.job.rollout
        self._samples += 1
        out: list[Sample] = [Sample("rlhf_ray_cluster_info", ("demo", "demo-simulated"), 1.0)]
        for i in range(self.n_gpus):
            gpu, uuid = str(i), f"GPU-demo-{i:04d}-0000-0000-0000-000000000000"
            key = (gpu, uuid)
            util = min(1.0, max(0.0, phase.gpu_busy + self._rng.uniform(-0.03, 0.03)))
            self._busy[i] += util * dt
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
                # colocated verl: the trainer and a rollout engine share every GPU
                Sample("rlhf_gpu_role_memory_bytes", (*key, "trainer"), MEMORY_TOTAL * 0.45 * util),
                Sample("rlhf_gpu_role_memory_bytes", (*key, "rollout"), MEMORY_TOTAL * 0.2),
            ]
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
        out.append(
            Sample("rlhf_ray_actor_deaths_total", ("rollout", DEATH_REASON), float(life.deaths))
        )
        return PollResult(tuple(out))
