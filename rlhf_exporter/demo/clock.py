"""The demo job's clock: the time its records describe, at their pace (a `JobClock`).

`serve --demo` writes one step every 0.7 s of wall time whose record says it took ~95 s. On
the wall clock those steps' windows would overlap ~135-fold (the placer anchors each at its
record's arrival), and no engine could be in phase with them. On this clock they lie end to
end: the step scheduled at wall time `start` and written at `due` runs, on the job clock,
from where the clock stood at `start` for as long as its record says (its `timing_s/step`,
and validation after it), the clock running evenly in between. Between steps (a phase's
pause: validation, a stall) it runs on at the last step's pace, so a stalled job's time
passes on it too.

Four parts read it, each through the one port (rlhf_exporter/join/ports.py `JobClock`):
the verl source's jobs anchor each record's arrival at `at(arrival)` (so the demo job's
step windows are placed where its records say, end to end) and export their last step's
time `aged` on it (the wall instant as far before now as the step lies before now on this
clock: Prometheus's `time() - rlhf_last_step_timestamp_seconds` is then the stall the pages
judge on this clock, and RLHFJobStalled fires in the demo's stall), the engine source
stamps its reads at `at(now)`, and the simulated engines (rlhf_exporter/demo/engines.py)
serve the state of the step running at `at(now)` (`current`). Nothing else changes: the
records, the step counters and the job's own last step time (its summary's) stay the wall's.

Bounded: the last KEEP steps' segments (an instant before them is extrapolated back at the
oldest one's pace). Thread-safe: the demo thread steps it, the sources read it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..diagnosis.engines import rollout_spans
from ..diagnosis.thresholds import Thresholds
from ..diagnosis.timeline import after_step_seconds, rebuild
from ..diagnosis.windows import separated_trainer, split, timers
from .scenario import Phase

KEEP = 64  # segments kept (a few seconds of demo; reads and arrivals are recent)
Span = tuple[float, float]


class Segment(NamedTuple):
    """One step on both clocks: wall [wall, wall_end] runs job [job, job_end]."""

    wall: float
    wall_end: float
    job: float
    job_end: float
    phase: Phase
    rollout: tuple[Span, ...]  # the step's rollout windows, on the job clock

    @property
    def pace(self) -> float:
        """Job seconds per wall second."""
        return (self.job_end - self.job) / (self.wall_end - self.wall)

    def at(self, wall: float) -> float:
        return self.job + (wall - self.wall) * self.pace


class DemoClock:
    """The demo job's `JobClock` (see the module docstring)."""

    def __init__(self, th: Thresholds):
        self.th = th
        self._lock = threading.Lock()
        self._segments: deque[Segment] = deque(maxlen=KEEP)

    def step(self, start: float, due: float, phase: Phase, record: Mapping[str, Any]) -> None:
        """The step of `record`, scheduled at wall time `start`, written at `due`."""
        data = record.get("data") or {}
        seconds = data.get("timing_s/step")
        if not isinstance(seconds, int | float) or seconds <= 0:
            return  # step 0 (validation only): no step time passes
        all_timers = timers(data)
        sep = separated_trainer(all_timers, data, self.th)
        windows = split(float(seconds), all_timers, self.th, sep)
        with self._lock:
            if self._segments:
                start = max(start, self._segments[-1].wall_end)
            if due <= start:
                return
            job = self._at(start)
            job_end = job + windows.step_seconds + after_step_seconds(all_timers, windows, self.th)
            tl = rebuild(int(record.get("step", 0)), windows, all_timers, job_end, self.th)
            spans = tuple(rollout_spans(tl.intervals))
            self._segments.append(Segment(start, due, job, job_end, phase, spans))

    def at(self, wall: float) -> float:
        """Wall time `wall` on the job clock (the wall's own before the first step)."""
        with self._lock:
            return self._at(wall)

    def aged(self, wall: float, now: float) -> float:
        """`now`, less the time from `wall` to `now` on the job clock."""
        with self._lock:
            return now - (self._at(now) - self._at(wall))

    def current(self, wall: float) -> tuple[float, Segment | None]:
        """(`wall` on the job clock, the step running then; None between steps)."""
        with self._lock:
            t = self._at(wall)
            for seg in reversed(self._segments):
                if seg.wall <= wall <= seg.wall_end:
                    return t, seg
                if seg.wall_end < wall:
                    break
            return t, None

    def _at(self, wall: float) -> float:
        segments = self._segments
        if not segments:
            return wall
        for seg in reversed(segments):
            if seg.wall <= wall:  # in it, or after it at its pace (a pause, the present)
                return seg.at(wall)
        return segments[0].at(wall)  # before the oldest kept: back at its pace
