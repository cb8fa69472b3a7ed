"""One verl job, as the sidecar keeps it: records in, catalog series out.

A `Job` feeds every record, cleaned (rlhf_exporter/records.py: what hostile or broken input
loses, counted), to a `StreamDiagnoser` and keeps the job's state: its counters, its runs,
its lifecycle (rlhf_exporter/lifecycle.py) and its engine evidence; its exposition (the
catalog's "verl steps" series and its summary) is `JobSeries` (rlhf_exporter/job_series.py).
Its counters only ever grow: a restart (the step number going down), a truncated or
replaced file (`new_run()`) or a resume start a new run and a new baseline, and the counters
carry on. A record that still makes ingestion fail is dropped and counted
(`internal_error`); it never stops the records after it, nor any other job. A job that writes
a step in two records has its steps held until complete (decision table v5,
diagnosis/steps.py): the next step's first record, `tick()` (its sources call it as they
publish) once the step's S has passed or the job has ended, or `new_run()` release it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .diagnosis import (
    CHANGES,
    COST_GROUPS,
    GROUPS,
    VERDICTS,
    Record,
    StepDiagnosis,
    StreamDiagnoser,
    Thresholds,
    history,
)
from .diagnosis.advice import EVIDENCE_KEYS, SHAPE_RECORDS, job_shape, shown_evidence
from .diagnosis.engines import EngineEvidence, refine, rollout_spans
from .diagnosis.episodes import Episode
from .diagnosis.timeline import Placer, Timeline
from .diagnosis.values import TIMER_PREFIX, num
from .job_history import StepHistory
from .job_series import REASON_KEYS, JobSeries, extra_values
from .join.ports import WALL, Engines, JobClock, StepWindows
from .lifecycle import (
    ENDED_STATUSES,
    FAILED,
    FINISHED,
    LOST,
    UNKNOWN,
    RayFact,
    end_outgrown,
    job_state,
)
from .metrics.snapshot import Sample
from .records import (
    DEFAULT_LIMITS,
    INTERNAL_ERROR,
    LATE_RECORD,
    Limits,
    RecordCleaner,
    clean_label,
)

# timers that run between two steps' records, outside timing_s/step (verl-stream.md: testing
# always; save_checkpoint in 0.6.x and the separated trainers; counted in any version)
BETWEEN_STEPS = (TIMER_PREFIX + "testing", TIMER_PREFIX + "save_checkpoint")
FINISHED_KEY = "rlhf_job_finished"  # a record key a job may log at its end (value 1)

log = logging.getLogger(__name__)


class Job(JobSeries):
    """The state of one verl job (`project`, `experiment`) across all its runs."""

    def __init__(
        self,
        project: str,
        experiment: str,
        th: Thresholds,
        limits: Limits = DEFAULT_LIMITS,
        rejected: Counter[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        total_steps: int | None = None,
        windows: StepWindows | None = None,
        engines: Engines | None = None,
        job_clock: JobClock = WALL,
    ):
        # what ingestion drops is counted here (a source passes its record_errors counter)
        self.rejected: Counter[str] = Counter() if rejected is None else rejected
        project, bad_p = clean_label(project)
        experiment, bad_e = clean_label(experiment)
        self._cleaner = RecordCleaner(project, experiment, th, limits, self.rejected)
        bad = bad_p or bad_e
        if bad:
            self._drop(bad)
        self.project = project
        self.experiment = experiment
        self.labels = (project, experiment)
        self._th = th
        self.limits = limits
        self._diagnoser = StreamDiagnoser(th)
        self._run_base = 0  # runs before the current diagnoser (explicit new_run calls)
        self._clock = clock
        self.total_steps = total_steps
        self._windows = windows  # a WindowBoard: each classified step's timeline goes there
        # the engine source: a step's rollout window joins the engines' samples through it
        self._engines = engines if windows is not None else None
        self._placer = Placer(th)  # places steps in time (fully-async: shifted sub-steps)
        self._job_clock = job_clock  # the clock the placer anchors arrivals on (join/ports.py)
        self._arrival = 0.0  # when the record being fed was read
        # the batch's last trainer record (classified or held at its S, or fully-async's
        # empty one) not yet known to be followed by another record: the placer's anchor
        self._open: Record | None = None
        self._own: StepDiagnosis | None = None  # its diagnosis, awaiting its placement
        # a held step's trainer record and its arrival (None: unknown), until it is classified
        self._held: tuple[Record, float | None] | None = None
        self.between_steps_max = 0.0  # this run's longest testing + save_checkpoint
        self.finished_marker = False  # this run logged rlhf_job_finished
        self.finished_file = False  # a `<experiment>.finished` file lies beside its log
        self.finished_file_at: float | None = None  # its modification time
        self._ray_end_at: float | None = None  # when Ray's end happened (or was first seen)
        self.ends_ignored: Counter[str] = Counter()  # ends the job outgrew (sources count them)
        self._ignored_seen: set[tuple[str, object]] = set()  # each ignored end counted once
        self.ray: RayFact | None = None  # what Ray's Jobs API and death causes say (set_ray)
        self._state = (UNKNOWN, "none")
        self.state_since: float = clock()  # when the job entered its current state
        self._evidence_seen: set[str] = set()  # EVIDENCE_KEYS the log has shown
        self._shape: set[str] = set()  # what its keys say it does (advice.job_shape)
        self._shape_left = SHAPE_RECORDS  # records still to look at for it
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
        self.reason_steps = dict.fromkeys(REASON_KEYS, 0)  # keys shared by every job
        self.change_steps = dict.fromkeys(CHANGES, 0)
        self.regression_steps = dict.fromkeys(COST_GROUPS, 0)
        self._extra: dict[tuple[str, tuple[str, ...]], float] = {}
        self._samples: Sequence[Sample] | None = None
        self._history = StepHistory()  # the last steps, for the job view (packed)
        # the change episodes of `_history`, computed when first shown after a step
        self._episodes: tuple[Sequence[history.StepPoint], tuple[Episode, ...]] = ((), ())
        # engine evidence (diagnosis/engines.py): the last measured rollout window's
        self.engine: EngineEvidence | None = None
        self.engine_step: int | None = None
        self._engine_windows = {"true": 0, "false": 0}
        self._engine_preemptions = 0.0

    @property
    def run(self) -> int:
        return self._run_base + max(self._diagnoser.run, 0)

    @property
    def declared_finished(self) -> bool:
        """The job reached the end verl shows (its step reached its total steps), logged the
        rlhf_job_finished marker in this run, or has a `.finished` file beside its log."""
        reached = (
            self.total_steps is not None and self.step is not None and self.step >= self.total_steps
        )
        return reached or self.finished_marker or self._finished_file_holds()

    def _finished_file_holds(self) -> bool:
        """A `.finished` file counts unless the job stepped after it was written (a file
        left from an earlier run, or put beside a job that still steps)."""
        if not self.finished_file:
            return False
        if end_outgrown(self.finished_file_at, self.last_step_time):
            self._ignored("finished_file_ignored", self.finished_file_at)
            return False
        return True

    def _ignored(self, reason: str, which: object) -> None:
        key = (reason, which)
        if key not in self._ignored_seen and len(self._ignored_seen) < 64:
            self._ignored_seen.add(key)
            self.ends_ignored[reason] += 1

    @property
    def state(self) -> str:
        """running, finished, failed or unknown (see rlhf_exporter.lifecycle)."""
        return self._refresh_state()[0]

    @property
    def state_signal(self) -> str:
        """Which signal the state came from (ray_job, actor_death, declared, steps, none)."""
        return self._refresh_state()[1]

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def _refresh_state(self) -> tuple[str, str]:
        outgrown = (
            self.ray is not None
            and self.ray.status in ENDED_STATUSES
            and end_outgrown(self._ray_end_at, self.last_step_time)
        )
        if outgrown and self.ray is not None:
            self._ignored("ray_end_ignored", (self.ray.submission, self.ray.status))
        state = job_state(
            stepped=self.step is not None,
            declared_finished=self.declared_finished,
            ray=self.ray,
            ray_end_outgrown=outgrown,
        )
        if state[0] != self._state[0]:
            self.state_since = self._clock()
            self._samples = None
        self._state = state
        return state

    def set_ray(self, fact: RayFact | None) -> None:
        """What Ray says about this job now (None: nothing ties a submission to it)."""
        if fact != self.ray:
            old, self.ray = self.ray, fact
            if fact is None or fact.status not in ENDED_STATUSES:
                self._ray_end_at = None
            elif old is None or (old.status, old.submission) != (fact.status, fact.submission):
                # Ray's end time, unless it lies ahead (then when it was first seen); a LOST
                # submission's time is its start: it ended when the exporter saw it LOST
                seen = self._clock()
                since = fact.since if fact.status != LOST else None
                self._ray_end_at = min(since, seen) if since is not None else seen
            self._samples = None
            self._refresh_state()

    def set_finished_file(self, present: bool, at: float | None = None) -> None:
        """Whether a `.finished` file lies beside the log, and its modification time."""
        if present != self.finished_file or at != self.finished_file_at:
            self.finished_file = present
            self.finished_file_at = at if present else None
            self._samples = None
            self._refresh_state()

    def set_total_steps(self, total: int | None) -> None:
        if total != self.total_steps:
            self.total_steps = total
            self._samples = None
            self._refresh_state()

    @property
    def verdict(self) -> str | None:
        return self.last.verdict if self.last else None

    def new_run(self) -> None:
        """The input started over (a truncated or replaced file): whatever step comes next
        opens a new run with a fresh baseline. Counters carry on."""
        if self._diagnoser.run >= 0:
            held = self._diagnoser.close()  # complete: nothing of its run comes any more
            if held is not None:
                self._settle(held)
            self._run_base += self._diagnoser.run + 1
            self._diagnoser = StreamDiagnoser(self._th, self._diagnoser.holds)
            self._run_reset()
            self._samples = None

    def _run_reset(self) -> None:
        self._placer.reset()
        self._extra.clear()
        self.between_steps_max = 0.0
        self.finished_marker = False

    def feed(self, records: Iterable[Record], now: float | None = None) -> int:
        """Ingest records in order; returns how many."""
        n = 0
        self._arrival = self._clock() if now is None else now
        self._open = None
        self._release(self._arrival)  # a held step complete before these records came
        for record in records:
            try:
                diag = self._diagnoser
                clean = self._cleaner.clean(record, diag.step if diag.run >= 0 else None)
                if clean is None:
                    continue
                event = self._diagnoser.feed(clean, self._arrival)
                self._placed(None)  # an earlier record of the batch was followed by this one
                if event.released and event.diagnosis is not None:
                    self._settle(event.diagnosis)  # before the new record's run and values
                if event.late:
                    self._drop(LATE_RECORD)
                if event.new_run:
                    self._run_reset()
                if event.timed or not clean.data:  # where the placer anchors (below)
                    self._open = clean
                if event.new_step:
                    self.steps += 1
                    self.last_step_time = self._arrival
                self.step = clean.step
                self._extra.update(extra_values(clean.data))
                self._between_steps(clean.data)
                self._remember_evidence(clean.data)
                if event.diagnosis is not None and not event.released:
                    self._own = event.diagnosis
                    if self._engines is None:
                        self._classified(event.diagnosis)
                n += 1
            except Exception:  # a bug or an input no check foresaw: drop this record only
                self._drop(INTERNAL_ERROR, exc_info=True)
                self._samples = None
        if n:
            self.records += n
            self._samples = None
        try:
            # GPU windows: only the batch's last record has a known arrival time (the file's
            # mtime, or the push); earlier records of a backlog were written before it
            self._placed(self._job_clock.at(self._arrival))  # the wall's, but for the demo
            self._release(self._arrival)
        except Exception:
            self._drop(INTERNAL_ERROR, exc_info=True)
            self._samples = None
        return n

    def _placed(self, arrival: float | None) -> None:
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

    def _place(self, d: StepDiagnosis, record: Record, arrival: float | None) -> None:
        """Place a classified step in time (the placer's anchor: its trainer record, which
        arrived at `arrival`); with engine evidence, its reason waits for its timeline."""
        engines = self._engines
        if arrival is None:
            self._placer.unplaced(record.data)  # followed by another record: arrival unknown
        elif self._windows is not None:
            timelines = self._placer.place(d.step, d.windows, d.timers, record.data, arrival)
            if engines is not None and timelines:
                d = self._with_engines(d, timelines, engines)
            for timeline in timelines:
                self._windows.post(self.labels, timeline)
        if engines is not None:
            self._classified(d)

    def _settle(self, d: StepDiagnosis) -> None:
        """A held step is complete: place it at its trainer record's arrival and count it."""
        held, self._held = self._held, None
        if self._engines is None:
            self._classified(d)
        if held is not None:
            self._place(d, *held)
        elif self._engines is not None:
            self._classified(d)
        self._samples = None

    def _release(self, now: float) -> None:
        """Release a held step whose S has passed since its S record arrived, or any held
        step once the job has ended."""
        diagnoser = self._diagnoser
        if diagnoser.due is None:
            return
        d = diagnoser.release(now)
        if d is None and self._ended():
            d = diagnoser.close()
        if d is not None:
            self._settle(d)

    def _ended(self) -> bool:
        """Whether the job has ended, for a held step: finished or failed, but not by its
        step reaching its total steps alone (declared at the last step's S record, before its
        second record: that step waits for its S)."""
        state, signal = self._refresh_state()
        if state not in (FINISHED, FAILED):
            return False
        return signal != "declared" or self.finished_marker or self._finished_file_holds()

    @property
    def due(self) -> float | None:
        """When the held step (decision table v5: the job writes steps in two records) is
        released without another record (its S record's arrival + S), or None."""
        return self._diagnoser.due

    def tick(self, now: float | None = None) -> bool:
        """Release a held step that is complete without another record: its S has passed by
        `now` since its S record arrived, or the job has ended (finished or failed). Sources
        call it as they publish. Returns whether a step was classified."""
        if self._diagnoser.due is None:
            return False
        try:
            before = self.last
            self._release(self._clock() if now is None else now)
            return self.last is not before
        except Exception:
            self._drop(INTERNAL_ERROR, exc_info=True)
            self._samples = None
            return False

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
            self._drop(INTERNAL_ERROR, exc_info=True)
            return d
        if ev is None:
            return d
        self.engine, self.engine_step = ev, d.step
        self._engine_windows["true" if ev.usable else "false"] += 1
        if ev.usable:
            self._engine_preemptions += ev.preemptions
        limits = engines.limits
        reason, evidence = refine(
            d.verdict, d.reason, d.evidence, ev if ev.usable else None, limits
        )
        if not ev.usable:
            evidence.update(ev.numbers())
        return d._replace(reason=reason, evidence=evidence)

    def _remember_evidence(self, data: Mapping[str, Any]) -> None:
        """Which of the keys the reasons need this job's log has reported (either spelling of
        agent-loop keys; verl's "not reported" values such as a -1 preemption count are not
        evidence): what it has never reported, its verdicts cannot say."""
        if len(self._evidence_seen) < len(EVIDENCE_KEYS):
            self._evidence_seen |= shown_evidence(data)
        if self._shape_left > 0:
            self._shape_left -= 1
            self._shape |= job_shape(data)

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

    def _drop(self, reason: str, n: int = 1, exc_info: bool = False) -> None:
        self._cleaner.drop(reason, n, exc_info)

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
        tpgs = self._extra.get(("rlhf_throughput_tokens_per_gpu_second", ()))
        response = self._extra.get(("rlhf_response_length_tokens", ("mean",)))
        longest = self._extra.get(("rlhf_response_length_tokens", ("max",)))
        # replaced whole, never changed in place: a page being drawn keeps a consistent history
        self._history = self._history.appended(history.point(d, tpgs, response, longest))
