"""Where a job's classified steps go in time: each step's timeline is placed at its trainer
record's arrival (diagnosis/timeline.py's `Placer`) and posted to the window board, and with
an engine source its reason waits for the engines' evidence over its rollout window.

Only the batch's last record has a known arrival (the file's modification time, or the
push); a record followed by another in the same batch is not placed. A step held until its
second record (decision table v5) is placed at its trainer record's arrival once complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..diagnosis import Record, StepDiagnosis, Thresholds
from ..diagnosis.engines import refine, rollout_spans
from ..diagnosis.timeline import Placer, Timeline
from ..join.ports import Engines, JobClock, StepWindows
from .counts import EngineCounts

Count = Callable[[StepDiagnosis], None]  # a classified step, counted by its job
Fail = Callable[[], None]  # a bug or an input no check foresaw, counted by its job


class Placement:
    """One job's steps placed in time (`windows`: the board they go to; without one, steps
    are counted at once and never placed)."""

    def __init__(
        self,
        labels: tuple[str, str],
        th: Thresholds,
        windows: StepWindows | None,
        engines: Engines | None,
        job_clock: JobClock,
        count: Count,
        fail: Fail,
    ):
        self._labels = labels
        self._windows = windows
        # the engine source: a step's rollout window joins the engines' samples through it
        self.engines = engines if windows is not None else None
        self.engine_counts = EngineCounts()
        self._placer = Placer(th)  # places steps in time (fully-async: shifted sub-steps)
        self.job_clock = job_clock  # the clock the placer anchors arrivals on (join/ports.py)
        self._count, self._fail = count, fail
        # the batch's last trainer record (classified or held at its S, or fully-async's
        # empty one) not yet known to be followed by another record: the placer's anchor
        self._open: Record | None = None
        self._own: StepDiagnosis | None = None  # its diagnosis, awaiting its placement
        # a held step's trainer record and its arrival (None: unknown), until it is classified
        self._held: tuple[Record, float | None] | None = None

    def begin(self) -> None:
        """A new batch of records: nothing of an earlier batch is open."""
        self._open = None

    def reset(self) -> None:
        """A new run: the placer starts over."""
        self._placer.reset()

    def anchor(self, record: Record) -> None:
        """The batch's newest trainer record (timed, or fully-async's empty one)."""
        self._open = record

    def classified(self, d: StepDiagnosis) -> None:
        """The open record's step is classified: counted now without engines, else once
        its timeline has met the engines' evidence."""
        self._own = d
        if self.engines is None:
            self._count(d)

    def placed(self, arrival: float | None) -> None:
        """The batch's open trainer record (one classified or held at its S, or fully-async's
        empty one) is known to have arrived at `arrival` (None: unknown, another record of
        the batch followed it): its step is placed in time, or waits for its diagnosis."""
        record, self._open = self._open, None
        if record is None:
            return
        own, self._own = self._own, None
        if own is not None:
            self._place(own, record, arrival)
        elif not record.data:  # fully-async's empty trainer record (verl 0.8.0)
            if arrival is None:
                self._placer.unplaced(record.data)
            elif self._windows is not None:
                self._placer.empty(arrival, record.step)
        else:  # held: placed once its step is complete
            self._held = (record, arrival)

    def settle(self, d: StepDiagnosis) -> None:
        """A held step is complete: place it at its trainer record's arrival and count it."""
        held, self._held = self._held, None
        if self.engines is None:
            self._count(d)
        if held is not None:
            self._place(d, *held)
        elif self.engines is not None:
            self._count(d)

    def _place(self, d: StepDiagnosis, record: Record, arrival: float | None) -> None:
        """Place a classified step in time (the placer's anchor: its trainer record, which
        arrived at `arrival`); with engine evidence, its reason waits for its timeline."""
        engines = self.engines
        if arrival is None:
            self._placer.unplaced(record.data)  # followed by another record: arrival unknown
        elif self._windows is not None:
            timelines = self._placer.place(d.step, d.windows, d.timers, record.data, arrival)
            if engines is not None and timelines:
                d = self._with_engines(d, timelines, engines)
            for timeline in timelines:
                self._windows.post(self._labels, timeline)
        if engines is not None:
            self._count(d)

    def _with_engines(
        self, d: StepDiagnosis, timelines: Sequence[Timeline], engines: Engines
    ) -> StepDiagnosis:
        """The step's reason and evidence with the engines' evidence over its rollout window
        (a `rollout` verdict's reason comes from the engines when usable and one holds); a
        fully-async record places several sub-steps: their rollout spans together."""
        try:
            spans = rollout_spans([iv for tl in timelines for iv in tl.intervals])
            error = max(tl.error_seconds for tl in timelines)
            ev = engines.evidence(spans, error) if spans else None
        except Exception:  # the engine side must never cost a step its diagnosis
            self._fail()
            return d
        if ev is None:
            return d
        self.engine_counts.count(ev, d.step)
        reason, evidence = refine(
            d.verdict, d.reason, d.evidence, ev if ev.usable else None, engines.limits
        )
        if not ev.usable:
            evidence.update(ev.numbers())
        return d._replace(reason=reason, evidence=evidence)
