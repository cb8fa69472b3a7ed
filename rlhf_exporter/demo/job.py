"""The `serve --demo` feed: a simulated verl job writing real verl-format records, fast.

A background thread plays a scenario (rlhf_exporter/demo/scenario.py: by default every scripted
incident in turn) into `<root>/demo/<experiment>.jsonl`, one step every `step_seconds`,
exactly as verl's file logger does (one unbuffered write per record). At the end it starts
over like a restarted verl job: the file is truncated and the steps begin again at 0, so the
exporter shows a new run. The verl source watches the file like any other job; the current
`phase` drives the simulated GPUs and Ray actors (rlhf_exporter/demo/devices.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..diagnosis.thresholds import Thresholds
from .clock import DemoClock
from .scenario import ActorLife, Phase, play, scenario
from .simulator import encode

log = logging.getLogger(__name__)

PROJECT = "demo"
EXPERIMENT = "grpo-simulated"


class DemoJob:
    def __init__(
        self,
        root: str | Path,
        step_seconds: float = 0.7,
        seed: int = 0,
        project: str = PROJECT,
        experiment: str = EXPERIMENT,
        scenario_name: str = "all",
        th: Thresholds | None = None,
    ):
        self.root = Path(root)
        self.project, self.experiment = project, experiment
        self.path = self.root / project / f"{experiment}.jsonl"
        self.project, self.experiment = project, experiment  # the demo GPUs' job labels
        self.step_seconds = step_seconds
        self.seed = seed
        self.phases = scenario(scenario_name)  # KeyError for an unknown name
        self.phase: Phase = self.phases[0]  # read by the demo devices source
        self.rollout = ActorLife()  # the simulated rollout actor's deaths and restarts
        # (wall time its record is due, record) of the last few steps scheduled: once due,
        # the simulated GPUs play the step's windows (rlhf_exporter/demo/devices.py)
        self.upcoming: deque[tuple[float, dict[str, Any]]] = deque(maxlen=16)
        self.written = 0  # records written, all loops
        if th is None:
            from ..thresholds_file import load_thresholds

            th = load_thresholds()
        # the job's clock, at its records' pace: its step windows and the engines' reads are
        # placed on it (rlhf_exporter/demo/clock.py)
        self.clock = DemoClock(th)
        self.loops = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="demo-job", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_run(self.seed + self.loops)
                self.loops += 1
        except OSError as exc:  # the temp root vanished, a full disk: the demo just ends
            log.warning("demo job stopped: %s", exc, extra={"path": str(self.path)})

    def timeline(self, seed: int) -> Iterator[tuple[float, dict[str, Any] | None]]:
        """One run, in order: (wait, record): wait `wait` steps' time, then write `record`
        (`None`: nothing, the phase's pause). The current `phase` and `rollout` change as the
        run enters each phase, before its wait. The thread below plays it on the wall clock;
        a test plays it on a simulated one (tests/test_demo_alerts.py)."""
        for phase, record in play(self.phases, seed):
            if phase is not self.phase:
                self.rollout.enter(phase)
                self.phase = phase
            if record is None:  # the phase's pause: validation running, or a stall
                yield phase.pause, None
            else:
                yield (1.0 if record["step"] else 0.0), record

    def story(self) -> str:
        """The incident now playing, in words, from the scenario table that drives it (the
        pages' demo banner): its name, its place in the loop and the one after it."""
        phases, phase = self.phases, self.phase
        i = next((k for k, p in enumerate(phases) if p is phase), 0)
        after = phases[(i + 1) % len(phases)]
        then = "then the loop starts over as a new run" if i + 1 == len(phases) else after.name
        return f"now playing {i + 1} of {len(phases)}: {phase.name} (next: {then})"

    def schedule(self, due: float, record: dict[str, Any], start: float | None = None) -> None:
        """The step whose record is written at wall time `due` runs now, from `start` (its
        players call this before they wait: the thread below, and tests/test_demo_alerts.py);
        the job clock runs it from `start` (one step's time before `due` unless given)."""
        self.upcoming.append((due, record))
        self.clock.step(
            due - self.step_seconds if start is None else start, due, self.phase, record
        )

    def _one_run(self, seed: int) -> None:
        # "wb" truncates, as verl does on every (re)start; buffering=0: one write per record
        with open(self.path, "wb", buffering=0) as f:
            for wait, record in self.timeline(seed):
                if record is not None:
                    now = time.time()
                    self.schedule(now + wait * self.step_seconds, record, start=now)
                if wait and self._stop.wait(wait * self.step_seconds):
                    return
                if record is not None:
                    f.write(encode(record))
                    self.written += 1
