"""One verl job, as the sidecar keeps it: records in, catalog series out.

A `Job` feeds every record, cleaned (job/cleaning.py: what hostile or broken input loses,
counted), to a `StreamDiagnoser` (where a verdict is decided: rlhf_exporter/diagnosis/) and
keeps the job's state: its counts (job/counts.py), its runs, its end signals
(job/end_signals.py), its packed history and its engine evidence. Its series
(job/series.py) and its summary (job/summary.py) are read from that state.
Its counters only ever grow: a restart (the step number going down), a truncated or
replaced file (`new_run()`) or a resume start a new run and a new baseline, and the counters
carry on. A record that still makes ingestion fail is dropped and counted
(`internal_error`); it never stops the records after it, nor any other job. A job that writes
a step in two records has its steps held until complete (decision table v5,
diagnosis/steps.py): the next step's first record, `tick()` (its sources call it as they
publish) once the step's S has passed or the job has ended, or `new_run()` release it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

from ..diagnosis import Record, StepDiagnosis, StreamDiagnoser, Thresholds, history
from ..diagnosis.engines import EngineEvidence
from ..diagnosis.episodes import Episode
from ..diagnosis.values import num
from ..join.ports import WALL, Engines, JobClock, StepWindows
from ..lifecycle import FAILED, FINISHED, RayFact
from ..metrics.snapshot import Sample, pack
from .cleaning import INTERNAL_ERROR, LATE_RECORD, RecordCleaner, clean_label
from .counts import EngineCounts, KeysShown, StepCounts
from .end_signals import EndSignals
from .limits import DEFAULT_LIMITS, Limits
from .packed_history import StepHistory
from .placement import Placement
from .record_keys import BETWEEN_STEPS, FINISHED_KEY
from .series import FRAMEWORK_INFO, JobStatus, Series, extra_values, series_rows
from .summary import EpisodeCache, job_summary


class Job:
    """The state of one verl job (`project`, `experiment`) across all its runs."""

    def __init__(
        self,
        project: str,
        experiment: str,
        th: Thresholds,
        limits: Limits = DEFAULT_LIMITS,
        *,
        clock: Callable[[], float] = time.time,
        total_steps: int | None = None,
        windows: StepWindows | None = None,
        engines: Engines | None = None,
        job_clock: JobClock = WALL,
    ):
        project, bad_p = clean_label(project)
        experiment, bad_e = clean_label(experiment)
        self._cleaner = RecordCleaner(project, experiment, th, limits)
        if bad_p or bad_e:
            self._cleaner.drop(bad_p or bad_e or "")
        self.project, self.experiment = project, experiment
        self.labels = (project, experiment)
        self._th = th
        self.limits = limits
        self._diagnoser = StreamDiagnoser(th)
        self._run_base = 0  # runs before the current diagnoser (explicit new_run calls)
        self._clock = clock
        self._end = EndSignals(clock, total_steps)
        # where its steps go in time (`windows`: a WindowBoard) and meet the engines' evidence
        self._placement = Placement(
            self.labels, th, windows, engines, job_clock, self._classified, self._failed
        )
        self._arrival = 0.0  # when the record being fed was read
        self.between_steps_max = 0.0  # this run's longest testing + save_checkpoint
        self._keys = KeysShown()  # what its records' keys have shown (for `cannot_show`)
        self.records = 0
        self.step: int | None = None
        self.last_step_time: float | None = None
        # (last_step_time, it aged on the job clock by the last tick): what its series export
        self._aged: tuple[float, float] | None = None
        self.steps = 0
        self.counts = StepCounts()
        self._extra: dict[Series, float] = {}
        self._samples: Sequence[Sample] | None = None
        self._framework: str | None = None  # whose output its records were read from
        self._history = StepHistory()  # the last steps, for the job view (packed)
        # the change episodes of `_history`, computed when first shown after a step
        self._episodes = EpisodeCache()

    # -- what others read ------------------------------------------------------------------
    @property
    def run(self) -> int:
        return self._run_base + max(self._diagnoser.run, 0)

    @property
    def last(self) -> StepDiagnosis | None:
        return self.counts.last

    @property
    def verdict(self) -> str | None:
        last = self.counts.last
        return last.verdict if last else None

    @property
    def engine_counts(self) -> EngineCounts:
        """The engines' evidence over its rollout windows (diagnosis/engines.py)."""
        return self._placement.engine_counts

    @property
    def engine(self) -> EngineEvidence | None:
        """The engines' evidence over the last measured rollout window."""
        return self._placement.engine_counts.last

    @property
    def _job_clock(self) -> JobClock:
        return self._placement.job_clock

    @property
    def verdict_steps(self) -> dict[str, int]:
        return self.counts.verdict_steps

    @property
    def reason_steps(self) -> dict[tuple[str, str], int]:
        return self.counts.reason_steps

    @property
    def change_steps(self) -> dict[str, int]:
        return self.counts.change_steps

    @property
    def regression_steps(self) -> dict[str, int]:
        return self.counts.regression_steps

    @property
    def drops(self) -> Counter[str]:
        """What it dropped since its source last took them, by reason: input its cleaning
        stopped, and ends it outgrew (rlhf_exporter.lifecycle)."""
        return self._cleaner.dropped + self._end.ignored

    def take_drops(self) -> Counter[str]:
        """`drops`, handed over once: its source adds them to its record errors."""
        taken: Counter[str] = Counter()
        for counts in (self._cleaner.dropped, self._end.ignored):
            if counts:
                taken.update(counts)
                counts.clear()
        return taken

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

    @property
    def due(self) -> float | None:
        """When the held step (decision table v5: the job writes steps in two records) is
        released without another record (its S record's arrival + S), or None."""
        return self._diagnoser.due

    def status(self) -> JobStatus:
        """Where the job stands now (its state decided again)."""
        state, signal = self._refresh_state()
        return JobStatus(
            self.step,
            self.run,
            self.steps,
            self.last_step_time,
            self.between_steps_max,
            state,
            signal,
            self._end.since,
            self._aged[1] if self._aged and self._aged[0] == self.last_step_time else None,
        )

    def samples(self) -> Sequence[Sample]:
        """Every series of the job, label values in catalog order; cached until new input.
        Packed (metrics/snapshot.py: a job with the same series as another shares their
        names and label values; its values are one array), never a tuple of `Sample`s."""
        if self._samples is None:
            rows = series_rows(
                self.status(), self.counts, self.engine_counts, self._extra, self._th, self.limits
            )
            if self._framework is not None:
                rows = chain(rows, ((FRAMEWORK_INFO, (self._framework,), 1.0),))
            self._samples = pack(self.labels, rows)
        return self._samples

    def set_framework(self, framework: str | None) -> None:
        """The framework whose output the job's records were read from, as its source
        detected it (`rlhf_job_framework_info`); None until known."""
        if framework != self._framework:
            self._framework = framework
            self._samples = None

    def summary(self) -> dict[str, Any]:
        """What the landing page shows for this job."""
        return job_summary(
            self.labels,
            self.status(),
            self.counts,
            self.engine_counts,
            self._history,
            self._episodes.of,
            len(self._diagnoser.baseline),
            self._th,
            self._keys.shown(),
            self._framework,
        )

    def episodes(self, kept: Sequence[history.StepPoint] | None = None) -> tuple[Episode, ...]:
        """The change episodes of the kept steps (rlhf_exporter/diagnosis/episodes.py),
        computed once per history, when a page first asks (`kept`: of that history)."""
        return self._episodes.of(self._history if kept is None else kept)

    # -- what decides its state besides its records ----------------------------------------
    def _refresh_state(self) -> tuple[str, str]:
        if self._end.refresh(self.step, self.last_step_time):
            self._samples = None
        return self._end.state

    def _changed(self, changed: bool) -> None:
        if changed:
            self._samples = None
            self._refresh_state()

    def set_ray(self, fact: RayFact | None) -> None:
        """What Ray says about this job now (None: nothing ties a submission to it)."""
        self._changed(self._end.set_ray(fact))

    def set_finished_file(self, present: bool, at: float | None = None) -> None:
        """Whether a `.finished` file lies beside the log, and its modification time."""
        self._changed(self._end.set_file(present, at))

    def set_total_steps(self, total: int | None) -> None:
        changed = total != self._end.total_steps
        self._end.total_steps = total
        self._changed(changed)

    def new_run(self) -> None:
        """The input started over (a truncated or replaced file): whatever step comes next
        opens a new run with a fresh baseline. Counters carry on."""
        if self._diagnoser.run >= 0:
            held = self._diagnoser.close()  # complete: nothing of its run comes any more
            if held is not None:
                self._settled(held)
            self._run_base += self._diagnoser.run + 1
            self._diagnoser = StreamDiagnoser(self._th, self._diagnoser.holds)
            self._run_reset()
            self._samples = None

    def _run_reset(self) -> None:
        self._placement.reset()
        self._extra.clear()
        self.between_steps_max = 0.0
        self._end.marker = False

    # -- records in ------------------------------------------------------------------------
    def feed(self, records: Iterable[Record], now: float | None = None) -> int:
        """Ingest records in order; returns how many."""
        n = 0
        self._arrival = self._clock() if now is None else now
        self._placement.begin()
        self._release(self._arrival)  # a held step complete before these records came
        for record in records:
            try:
                n += self._feed_one(record)
            except Exception:  # a bug or an input no check foresaw: drop this record only
                self._cleaner.drop(INTERNAL_ERROR, exc_info=True)
                self._samples = None
        if n:
            self.records += n
            self._samples = None
        try:
            # GPU windows: only the batch's last record has a known arrival time (the file's
            # mtime, or the push); earlier records of a backlog were written before it
            placement = self._placement
            placement.placed(placement.job_clock.at(self._arrival))  # the wall's, but the demo's
            self._release(self._arrival)
        except Exception:
            self._cleaner.drop(INTERNAL_ERROR, exc_info=True)
            self._samples = None
        return n

    def _feed_one(self, record: Record) -> int:
        """One record of a batch, cleaned and diagnosed; 1 if it was kept, else 0."""
        diag = self._diagnoser
        clean = self._cleaner.clean(record, diag.step if diag.run >= 0 else None)
        if clean is None:
            return 0
        event = self._diagnoser.feed(clean, self._arrival)
        self._placement.placed(None)  # an earlier record of the batch was followed by this one
        if event.released and event.diagnosis is not None:
            self._settled(event.diagnosis)  # before the new record's run and values
        if event.late:
            self._cleaner.drop(LATE_RECORD)
        if event.new_run:
            self._run_reset()
        if event.timed or not clean.data:  # where the placer anchors (below)
            self._placement.anchor(clean)
        if event.new_step:
            self.steps += 1
            self.last_step_time = self._arrival
        self.step = clean.step
        self._extra.update(extra_values(clean.data))
        self._between_steps(clean.data)
        self._keys.remember(clean.data)
        if event.diagnosis is not None and not event.released:
            self._placement.classified(event.diagnosis)
        return 1

    def _between_steps(self, data: Mapping[str, Any]) -> None:
        outside = 0.0
        for key in BETWEEN_STEPS:
            value = num(data.get(key))
            if value is not None and value > 0:
                outside += value
        if outside > self.between_steps_max:
            self.between_steps_max = outside
        if num(data.get(FINISHED_KEY)):
            self._end.marker = True

    # -- steps counted -----------------------------------------------------------------------
    def _settled(self, d: StepDiagnosis) -> None:
        """A held step is complete: placed at its trainer record's arrival, and counted."""
        self._placement.settle(d)
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
            self._settled(d)

    def _ended(self) -> bool:
        """Whether the job has ended, for a held step: finished or failed, but not by its
        step reaching its total steps alone (declared at the last step's S record, before its
        second record: that step waits for its S)."""
        state, signal = self._refresh_state()
        if state not in (FINISHED, FAILED):
            return False
        end = self._end
        return signal != "declared" or end.marker or end.file_holds(self.last_step_time)

    def tick(self, now: float | None = None) -> bool:
        """Release a held step that is complete without another record: its S has passed by
        `now` since its S record arrived, or the job has ended (finished or failed). Sources
        call it as they publish; it ages the last step on the job clock too (`_age`). Returns
        whether a step was classified."""
        now = self._clock() if now is None else now
        self._age(now)
        if self._diagnoser.due is None:
            return False
        try:
            before = self.last
            self._release(now)
            return self.last is not before
        except Exception:
            self._cleaner.drop(INTERNAL_ERROR, exc_info=True)
            self._samples = None
            return False

    def _age(self, now: float) -> None:
        """The last step's time as its job clock ages it by `now` (join/ports.py
        `JobClock.aged`): the wall's own for a real job, so its series never change here."""
        last = self.last_step_time
        if last is None:
            return
        aged = (last, self._job_clock.aged(last, now))
        if aged != (self._aged or (last, last)):
            self._aged = aged
            self._samples = None

    def _failed(self) -> None:
        """A bug or an input no check foresaw (called in its `except`): counted, logged."""
        self._cleaner.drop(INTERNAL_ERROR, exc_info=True)

    def _classified(self, d: StepDiagnosis) -> None:
        self.counts.count(d)
        tpgs = self._extra.get(("rlhf_throughput_tokens_per_gpu_second", ()))
        response = self._extra.get(("rlhf_response_length_tokens", ("mean",)))
        longest = self._extra.get(("rlhf_response_length_tokens", ("max",)))
        # replaced whole, never changed in place: a page being drawn keeps a consistent history
        self._history = self._history.appended(history.point(d, tpgs, response, longest))
