"""Simulated GPUs and Ray actors for the demo job, published like every source: `Snapshot`s.

`DemoDevices` is a `PollingSource` (collector `demo`) whose poll reads the demo job's current
phase (rlhf_exporter/demo/scenario.py) and returns the catalog's GPU and Ray series, so the GPU
and Ray panels, and the alerts on them, have data in `serve --demo`. The real NVML and Ray
sources are not involved. Everything it publishes says it is simulated: the GPUs are named
"rlhf-exporter demo (simulated)" with `GPU-demo-...` UUIDs, and the Ray cluster's
`ray_version` is `demo` and its `session_name` `demo-simulated`.

GPU time by step window (docs/gpu-windows.md): the simulated GPUs work in phase with the
windows of the demo job's steps, as a real job's do. Each step the demo job has written
(`DemoJob.upcoming`, once its record is due) is played on a **demo clock**: its windows are
rebuilt from its record (`rebuild`) and laid end to end after the previous step's, and every
GPU gets one sample per window, busy (the phase's `gpu_busy`) or idle by its role:

| GPU role | busy in | idle in |
|---|---|---|
| colocated | rollout, reward, logprob, update, sync | other (untimed driver work), checkpoint |
| rollout (separated) | rollout; the training windows too, generating ahead, unless the phase says `rollout_waits` | other, checkpoint; with `rollout_waits` everything but rollout (RLHFRolloutOverprovisioned) |
| trainer (separated) | reward, logprob, update, sync | rollout (waiting for samples: RLHFTrainerStarved), other, checkpoint |

The samples and the steps go through this source's own `WindowJoiner`, as NVML's go through
the sidecar's, which exports the `rlhf_window_gpu_*` counters and feeds the job view's "GPU
time by step window and role" and "who waits on whom". The demo clock runs at the job's
pace, not the wall's: at 0.7 s a step each record still says its step took ~95 s, so steps
placed on the wall clock would overlap and only each one's last moments could be joined; on
the demo clock each step is joined whole, within a minute of the demo's start, and the
counters grow by the GPU-seconds the records describe (as the job's own step counters do,
~135x the wall's pace). In a separated phase the first half of the GPUs roll out and the rest
train. The per-GPU gauges (`rlhf_gpu_utilization_ratio`, and busy seconds on the wall clock)
are the mean of the steps played since the last poll, or the phase's `gpu_busy` between steps.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..diagnosis.gpujoin import COLOCATED, ROLLOUT, TRAINER
from ..diagnosis.thresholds import Thresholds
from ..diagnosis.timeline import Interval, Timeline, rebuild
from ..diagnosis.windows import separated_trainer, split, timers
from ..join.board import WindowBoard, WindowJoiner
from ..metrics.snapshot import Sample
from ..settings import Settings
from ..sources.base import Clock, Context, PollingSource, PollResult
from ..sources.ray import STATES
from ..sources.roles import ROLES
from .job import DemoJob
from .scenario import IDLE, ROLLOUT_PENDING, ROLLOUT_RESTARTING, Phase

NAME = "demo"
GPU_NAME = "rlhf-exporter demo (simulated)"
ACTORS = {"trainer": 8, "rollout": 8, "agent_loop": 4, "reward": 1, "driver": 1}
MEMORY_TOTAL = 80 * (1 << 30)
DEATH_REASON = "WORKER_DIED"
MAX_STEPS = 16  # steps played per poll at most (the demo job keeps this many due steps)
IDLE_GROUPS = frozenset({"other", "checkpoint"})  # no GPU work: driver, untimed, saving
TRAINING_GROUPS = frozenset({"reward", "logprob", "update", "sync"})


class DemoDevices(PollingSource):
    def __init__(
        self,
        job: DemoJob,
        n_gpus: int = 8,
        interval: float = 1.0,
        seed: int = 0,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        windows: WindowBoard | None = None,
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
        # GPU time by step window: this source's own board and joiner, on the demo clock
        # (None when the sidecar keeps no step windows: --no-gpu-windows)
        self.joiner = None
        if windows is not None:
            self.joiner = WindowJoiner(WindowBoard(keep=windows.keep))
        if self.joiner is not None and th is None:
            from ..thresholds_file import load_thresholds

            th = load_thresholds()
        self.th = th
        self.labels = (getattr(job, "project", "demo"), getattr(job, "experiment", "demo"))
        self._played = float("-inf")  # the due time of the last step played
        self._demo_clock: float | None = None  # where the next played step starts

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> DemoDevices | None:
        return None  # made by `serve --demo` for its demo job (`for_job`)

    @classmethod
    def for_job(cls, job: DemoJob, context: Context) -> DemoDevices:
        """The demo job's simulated devices (`serve --demo`)."""
        return cls(job, windows=context.windows, th=context.thresholds)

    def jobs(self) -> tuple[dict[str, Any], ...]:
        """No verl job of its own: the demo job is read from its file like any other."""
        return ()

    def describe(self) -> str:
        return f"demo (simulated: {self.n_gpus} GPUs, Ray actors)"

    def _due_steps(self, wall: float) -> list[tuple[float, dict[str, Any]]]:
        """The demo job's steps whose records are due and not played yet, oldest first."""
        due = sorted(
            (
                (d, r)
                for d, r in tuple(getattr(self.job, "upcoming", ()))
                if self._played < d <= wall
            ),
            key=lambda dr: dr[0],
        )[-MAX_STEPS:]
        if due:
            self._played = due[-1][0]
        return due

    def _timeline(self, record: dict[str, Any], start: float) -> Timeline | None:
        """The step's windows, rebuilt from its record and placed at `start`."""
        data = record["data"]
        if self.th is None or not data.get("timing_s/step"):
            return None
        all_timers = timers(data)
        sep = separated_trainer(all_timers, data, self.th)
        windows = split(float(data["timing_s/step"]), all_timers, self.th, sep)
        tl = rebuild(record["step"], windows, all_timers, 0.0, self.th)
        shift = start - tl.start
        return tl._replace(
            start=start,
            end=tl.end + shift,
            intervals=tuple(
                Interval(iv.timer, iv.group, iv.start + shift, iv.end + shift)
                for iv in tl.intervals
            ),
        )

    def role(self, i: int, phase: Phase) -> str:
        """GPU `i`'s role: separated, the first half roll out and the rest train."""
        if not phase.separated:
            return COLOCATED
        return ROLLOUT if i < max(1, self.n_gpus // 2) else TRAINER

    @staticmethod
    def busy_in(role: str, group: str, phase: Phase) -> float:
        """The utilization of a GPU of `role` during a window of `group` (noise aside)."""
        if group in IDLE_GROUPS:
            busy = False
        elif role == TRAINER:
            busy = group in TRAINING_GROUPS  # idle in `rollout`: waiting for samples
        elif role == ROLLOUT:
            busy = group == "rollout" or not phase.rollout_waits
        else:  # colocated: one GPU does both, in turn
            busy = True
        return phase.gpu_busy if busy else IDLE

    def _play(self, wall: float, phase: Phase) -> list[float] | None:
        """Play the steps due since the last poll on the demo clock: samples and steps into
        the joiner. Returns each GPU's mean utilization over them (None: no step)."""
        due = self._due_steps(wall)
        if not due or self.joiner is None:
            return None
        if self._demo_clock is None:
            self._demo_clock = wall
        busy = [0.0] * self.n_gpus
        seconds = 0.0
        for _, record in due:
            tl = self._timeline(record, self._demo_clock)
            if tl is None or tl.end <= tl.start:
                continue
            self._demo_clock = tl.end
            seconds += tl.end - tl.start
            for i in range(self.n_gpus):
                role = self.role(i, phase)
                samples = []
                for iv in tl.intervals:
                    ratio = self.busy_in(role, iv.group, phase) + self._rng.uniform(-0.03, 0.03)
                    ratio = min(1.0, max(0.0, ratio))
                    samples.append((iv.end, ratio))
                    busy[i] += ratio * (iv.end - iv.start)
                if tl.intervals and tl.intervals[-1].end < tl.end:
                    samples.append((tl.end, IDLE))
                self.joiner.add_samples(str(i), role, samples)
            self.joiner.board.post(self.labels, tl)
        if seconds <= 0.0:
            return None
        self.joiner.join(self._demo_clock)
        return [b / seconds for b in busy]

    def poll(self) -> PollResult:
        now = self._clock()
        dt, self._last = now - self._last, now
        wall = self.wall()
        phase, life = self.job.phase, self.job.rollout
        self._samples += 1
        played = self._play(wall, phase)
        out: list[Sample] = [Sample("rlhf_ray_cluster_info", ("demo", "demo-simulated"), 1.0)]
        for i in range(self.n_gpus):
            gpu, uuid = str(i), f"GPU-demo-{i:04d}-0000-0000-0000-000000000000"
            key = (gpu, uuid)
            role = self.role(i, phase)
            if played is not None:
                util = played[i]
            else:  # between steps: the phase's level
                util = min(1.0, max(0.0, phase.gpu_busy + self._rng.uniform(-0.03, 0.03)))
            self._busy[i] += util * dt
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
        # every GPU series carries the job its GPUs serve (as NvmlSource's do)
        job = (getattr(self.job, "project", ""), getattr(self.job, "experiment", ""))
        out = [
            Sample(s.name, (*s.labels, *job), s.value)
            for s in out
            if s.name.startswith("rlhf_gpu_")
        ] + [s for s in out if not s.name.startswith("rlhf_gpu_")]
        if self.joiner is not None:
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
