"""The demo's scripted incidents: what the simulated job, its GPUs and its Ray actors do, and when.

A scenario is a list of `Phase`s. Each phase fixes the job's shape (a simulator `Regime`) for
a number of steps, how busy the simulated GPUs are, what the rollout actor is doing, and an
optional pause (no record, for a number of steps' time) after it. `serve --demo` runs `all`;
`--demo-scenario NAME` runs one incident between steady steps. The timeline of `all`, at the
default 0.7 s per step:

| # | phase | steps | what shows |
|---|---|---|---|
| 1 | steady, rollout-bound (long tail) | 15 | rollout verdict, `long_tail` reason; busy GPUs |
| 2 | separated: the trainer starved (same records as 1) | 15 | half the GPUs roll out, half train; trainer GPUs idle in `rollout` windows, waiting for samples (`rlhf_window_gpu_*`; RLHFTrainerStarved) |
| 3 | sync-bound | 10 | sync verdict, `weight_sync`; the bottleneck moved (RLHFJobSyncBound); sync costlier per token than the job's baseline (RLHFJobRegression) |
| 4 | update-bound, low MFU | 12 | update verdict, `low_mfu` (RLHFJobUpdateBound) |
| 5 | separated: rollout over-provisioned (same records as 4) | 15 | rollout GPUs idle outside `rollout` windows, while the trainer works (RLHFRolloutOverprovisioned) |
| 6 | stall: no step | 1, then 420 steps' pause | the last step's age grows on the demo's clock (demo/clock.py: ~95 s of the job's time a step) past the stall limit within ~7 steps' time: `/` and the job page say `stalled`, and where it hangs (the trainer's ranks in two different collectives, read from the simulated Ray dashboard's stacks, demo/dashboard.py, by the real stacks source); the job exports its last step's time aged on that clock, so Prometheus's stall budget agrees and RLHFJobStalled fires about 3.3 minutes into each loop, until the job steps again about 5.7 minutes in |
| 7 | workload shift (1.6x tokens) | 8 | `workload_shift` markers; no regression |
| 8 | regression: update_actor 2.5x per token | 8 | `regression` markers naming `update` (RLHFJobRegression) |
| 9 | checkpoint (a long save_checkpoint) | 2 | checkpoint verdict |
| 10 | long validation (`timing_s/testing` 240 s) | 1, then 2 steps' pause | a late step; validation is outside the step |
| 11 | rollout actor dies, its replacement waits for resources, it restarts | 6 + 9 + 6 | `rlhf_ray_actors` RESTARTING, then PENDING_CREATION; the deaths and restarts counters (RLHFRayActorsDied, RLHFRayActorsPending, RLHFRayActorsRestarting); back to rollout-bound after the update-bound phases, rollout costlier per token than the job's baseline (RLHFJobRegression) |
| 12 | GPUs idle while steps progress | 15 | `rlhf_gpu_utilization_ratio` ~0.04 (RLHFGPUsIdleWhileStepping) |
| 13 | the bottleneck moves, each time costing throughput: rollout (slower generation), a colocated reward model, log-prob inference (low MFU), driver overhead (untimed) | 14 each | each verdict and its regression markers (RLHFJobRolloutBound, RLHFJobRewardBound, RLHFJobLogprobBound, RLHFJobDriverOverheadBound; RLHFJobRegression of each group); the last two halve the throughput (RLHFJobThroughputBelowBaseline) |

179 steps and 422 steps' time of pauses: about 7 minutes per loop at 0.7 s a step, 4.9 of
them the stall (faster with `--demo-step-seconds`, whose stall is then too short for
RLHFJobStalled's 2 minutes of `for:`); then the log starts over as a restarted verl job (a
new run). The pages' demo banner names the phase now playing from this table
(`DemoJob.story`). The stall comes after the first five incidents: early enough to page
within the live demo's first five minutes, late enough that at 4 simulated minutes a step
(tests/test_demo_alerts.py: the stall's pause is then 28 hours) the bound alerts after it
still have the 6 hours of reference steps they compare with.

The alerts named above keep their real windows and `for:` (15 minutes for the bound alerts),
so the live demo is too quick for most of them: tests/test_demo_alerts.py plays this
timeline at 4 simulated minutes a step through the exporter and promtool, and checks that
each fires in its incident and that no other alert fires. The exporter's own alerts
(collector down or stale, exporter down or absent) are about infrastructure: that test
injects them. RLHFJobStalled fires in the live demo too: tests/test_demo_stall_alert.py plays
it at 0.7 s a step and checks that the alert and `/` say stalled at the same instants, within
the first five minutes, and which other alerts the live demo's pace lets fire.

The separated phases (2 and 5) change only the simulated GPUs (rlhf_exporter/demo/devices.py):
the verl records are those of the phase before, so no other alert moves. In every phase the
simulated GPUs work in phase with each step's windows (rollout GPUs busy in `gen`, trainer
GPUs in the training windows, both idle in untimed time, colocated ones alternating), played
on the demo's own clock at the records' pace and joined like NVML's samples, so the job
view's "GPU time by step window and role" and "who waits on whom" show each incident within
a minute of the live demo (tests/test_demo.py plays both at 0.7 s a step).

The simulated rollout engines (rlhf_exporter/demo/engines.py: two vLLM replicas over HTTP,
read by the real engine source) follow each step's rollout windows on the demo job's clock
(rlhf_exporter/demo/clock.py): a long tail in the rollout-bound phases (1, 2, 12), the
engines' `queueing` while the rollout actor is dead or pending (11: the log alone cannot say
it), `preemption` in the slower generation of 13, steady elsewhere; so the Engines row and
the engine reasons show within a minute (tests/test_demo_engines.py).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .simulator import BASE_COST, REGIMES, Regime, regressed, shifted, step_data

BUSY, IDLE = 0.88, 0.04  # GPU utilization ratios
ROLLOUT_ALIVE, ROLLOUT_RESTARTING, ROLLOUT_RESTARTED = "alive", "restarting", "restarted"
ROLLOUT_PENDING = "pending"  # its replacement waits for resources (PENDING_CREATION)


LONG_TAIL, PREEMPTION, QUEUEING, STEADY_ENGINES = "long_tail", "preemption", "queueing", "steady"
ENGINE_BEHAVIOURS = (LONG_TAIL, PREEMPTION, QUEUEING, STEADY_ENGINES)


@dataclass(frozen=True)
class Phase:
    name: str
    regime: Regime
    steps: int
    gpu_busy: float = BUSY
    rollout: str = ROLLOUT_ALIVE  # the rollout actor: alive, restarting (died), restarted
    # a separated job: half the simulated GPUs roll out, half train (else both share each GPU,
    # colocated); the trainer's GPUs idle in `rollout` windows (waiting for samples)
    separated: bool = False
    rollout_waits: bool = False  # separated: rollout GPUs idle outside `rollout` windows
    pause: float = 0.0  # no record for this many steps' time after the phase's steps
    extra: Mapping[str, float] = field(default_factory=dict)  # added to every step's data
    # what the simulated rollout engines do in the step's rollout windows
    # (rlhf_exporter/demo/engines.py): "" follows the regime (a long tail where its
    # agent-loop spread says so, else steady), or one of ENGINE_BEHAVIOURS
    engine: str = ""
    # its job's processes hang (the stall): the simulated Ray dashboard's stacks say where
    # (rlhf_exporter/demo/dashboard.py); else they wait between tasks
    hangs: bool = False

    @property
    def engines(self) -> str:
        """What the simulated engines do in this phase's rollout windows."""
        if self.engine:
            return self.engine
        return LONG_TAIL if self.regime.gen_tail >= 2.0 else STEADY_ENGINES


STEADY = REGIMES["rollout_long_tail"]
UPDATE = REGIMES["update_low_mfu"]
CHECKPOINT = replace(
    STEADY, name="checkpoint", cost={**BASE_COST, "gen": 8.0, "save_checkpoint": 40.0}
)
# the bottleneck moves: each new bottleneck costs throughput (seconds per million tokens up by
# a third or more over the job's usual ~27-32), so it is worth a notification (the bound
# alerts' "costs" clause), and the last one halves it (below the baseline)
ROLLOUT_SLOW = replace(STEADY, name="rollout_slow", cost={**BASE_COST, "gen": 36.0})
REWARD = Regime("reward_model", {**BASE_COST, "gen": 6.0, "reward": 34.0})
LOGPROB = Regime(
    "logprob_low_mfu",
    {**BASE_COST, "gen": 6.0, "old_log_prob": 30.0, "ref": 24.0},
    mfu_infer=0.12,
)
OTHER = Regime("driver_untimed", {**BASE_COST, "gen": 5.0}, untimed=60.0)
STALL_PAUSE = 420
"""The stall's pause, in steps' time: 4.9 minutes of wall time at the demo's 0.7 s a step.
Its limit is passed within seconds on the demo job's clock; then RLHFJobStalled's 2 minutes
of `for:` pass, and it fires for a minute or more, with rules evaluated as often as every
15 s (the example Prometheus) or as rarely as every minute (Prometheus's default)."""
VALIDATION = {"timing_s/testing": 240.0, "val-core/openai/gsm8k/reward/mean@1": 0.63}

INCIDENTS: dict[str, list[Phase]] = {
    "workload_shift": [Phase("workload shift: 1.6x tokens per step", shifted(UPDATE, 1.6), 8)],
    "regression": [
        Phase("regression: update_actor 2.5x per token", regressed(UPDATE, "update_actor", 2.5), 8)
    ],
    "checkpoint": [Phase("checkpoint", CHECKPOINT, 2)],
    "long_validation": [
        Phase("long validation (240 s of testing)", STEADY, 1, pause=2, extra=VALIDATION)
    ],
    "actor_restart": [
        # one engine fewer: the requests queue for the others (the engines' `queueing`)
        Phase(
            "rollout actor died: restarting", STEADY, 6, rollout=ROLLOUT_RESTARTING, engine=QUEUEING
        ),
        # longer than alerts.pending_for (30 min) at the demo test's 4 simulated min a step
        Phase(
            "its replacement waits for resources",
            STEADY,
            9,
            rollout=ROLLOUT_PENDING,
            engine=QUEUEING,
        ),
        Phase("rollout actor restarted", STEADY, 6, rollout=ROLLOUT_RESTARTED),
    ],
    "bottleneck_moves": [
        # slower generation: the KV cache is full, the engines preempt (`preemption`)
        Phase(
            "the bottleneck moves: rollout, slower generation",
            ROLLOUT_SLOW,
            14,
            engine=PREEMPTION,
        ),
        Phase("the bottleneck moves: a colocated reward model", REWARD, 14),
        Phase("the bottleneck moves: log-prob inference, low MFU", LOGPROB, 14),
        Phase("the bottleneck moves: driver overhead, untimed", OTHER, 14),
    ],
    "gpus_idle": [Phase("GPUs idle while steps progress", STEADY, 15, gpu_busy=IDLE)],
    # separated (rollout and trainer GPUs apart): the same records as the phases around them,
    # only the GPUs differ, so no other alert moves (rlhf_exporter/demo/devices.py)
    "trainer_starved": [
        Phase("separated: the trainer starved, waiting for samples", STEADY, 15, separated=True)
    ],
    "rollout_overprovisioned": [
        Phase(
            "separated: rollout over-provisioned, idle while the trainer works",
            UPDATE,
            15,
            separated=True,
            rollout_waits=True,
        )
    ],
    "stall": [
        Phase("stall: the job stopped writing steps", STEADY, 1, pause=STALL_PAUSE, hangs=True)
    ],
}


def _all() -> list[Phase]:
    out = [
        Phase("steady: rollout-bound, long tail", STEADY, 15),
        *INCIDENTS["trainer_starved"],
        Phase("sync-bound: weights to the rollout engines", REGIMES["sync_bound"], 10),
        Phase("update-bound, low MFU", UPDATE, 12),
        *INCIDENTS["rollout_overprovisioned"],
        *INCIDENTS["stall"],  # it pages within the live demo's first five minutes
    ]
    for name in (
        "workload_shift",
        "regression",
        "checkpoint",
        "long_validation",
        "actor_restart",
        "gpus_idle",
        "bottleneck_moves",
    ):
        out += INCIDENTS[name]
    return out


def scenario(name: str) -> list[Phase]:
    """The phases of a scenario: `all`, or one incident between steady steps."""
    if name == "all":
        return _all()
    if name not in INCIDENTS:
        raise KeyError(name)
    base = UPDATE if name in ("workload_shift", "regression", "rollout_overprovisioned") else STEADY
    return [
        Phase("steady", base, 12),
        *INCIDENTS[name],
        Phase("steady again", base, 10),
    ]


NAMES = ("all", *INCIDENTS)


class ActorLife:
    """The rollout actor across phases: entering a `restarting` phase is a death, leaving it
    for `restarted` a restart. Counted when the phase changes, so a poll that misses a short
    phase still sees the counters move."""

    def __init__(self) -> None:
        self.state = ROLLOUT_ALIVE
        self.deaths = 0
        self.restarts = 0

    def enter(self, phase: Phase) -> None:
        if phase.rollout == ROLLOUT_RESTARTING and self.state != ROLLOUT_RESTARTING:
            self.deaths += 1
        dying = (ROLLOUT_RESTARTING, ROLLOUT_PENDING)
        if phase.rollout == ROLLOUT_RESTARTED and self.state in dying:
            self.restarts += 1
        self.state = phase.rollout


def play(phases: list[Phase], seed: int = 0) -> Iterator[tuple[Phase, dict[str, Any] | None]]:
    """(phase, record) in order, step 0 (the initial validation) first; `None` for a
    phase's pause. Pure: the demo job does the writing and the waiting."""
    rng = random.Random(seed)
    yield phases[0], {"step": 0, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.41}}
    step = 1
    for phase in phases:
        regime = replace(phase.regime, extra={**phase.regime.extra, **phase.extra})
        for _ in range(phase.steps):
            yield phase, {"step": step, "data": step_data(regime, step, rng)}
            step += 1
        if phase.pause:
            yield phase, None
