"""From verl records to diagnosed steps: merging records by step, runs, and the baseline.

Two ways to walk a job, one set of rules:
- `BatchDiagnoser` (offline `diagnose`) merges a step's records completely, then classifies;
- `StreamDiagnoser` (the sidecar) classifies when the record holding `timing_s/step`
  arrives, with what the step has so far. verl writes a step's timers in that record, so
  both agree on every verl mode but one: the fully-async recipe of verl <= 0.7 writes
  `param_sync` in a second record of the step. Once a job has shown a record of a step after
  the one with its `timing_s/step`, the stream holds each later step until it is complete
  (the next step's first record, its own S elapsed, or the job's end) and classifies the
  merged step then, in the batch's order (the two share the baseline's rules); a record that
  comes after its step was classified is `late` (decision table v5, section 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .change import Baseline, Change, contract_change
from .thresholds import Thresholds
from .values import num, positive
from .verdict import Verdict, decide
from .windows import Windows, split, step_timers

STEP_KEY = "timing_s/step"
TOKENS_KEY = "perf/total_num_tokens"


class Record(NamedTuple):
    """One line of verl's file logger: `{"step": int, "data": {...}}`."""

    step: int
    data: Mapping[str, Any]


class StepDiagnosis(NamedTuple):
    """Everything the decision table says about one step."""

    run: int
    step: int
    verdict: str
    reason: str | None
    windows: Windows
    change: Change
    evidence: Mapping[str, float | None]
    tokens: float | None  # K
    timers: Mapping[str, float]  # every usable timer of the step, counted or not

    @property
    def shares(self) -> Mapping[str, float]:
        return self.windows.shares

    def to_json(self) -> dict[str, Any]:
        """The contract's `diagnose --format jsonl` object (plus `run`)."""
        return {
            "step": self.step,
            "run": self.run,
            "verdict": self.verdict,
            "reason": self.reason,
            # 4 decimals, half up (shares are >= 0); twice as fast as round() per value
            "shares": {g: int(s * 1e4 + 0.5) / 1e4 for g, s in self.windows.shares.items()},
            "change": contract_change(self.change.change),  # `none`, as §4 and §5 write it
            "regressed": self.change.regressed,
        }


def classify(
    run: int, step: int, data: Mapping[str, Any], baseline: Baseline, th: Thresholds
) -> StepDiagnosis | None:
    """Diagnose one step from its (merged) data, or None when it has no usable S."""
    step_seconds = positive(data.get(STEP_KEY))
    if step_seconds is None:
        return None
    all_timers, separated = step_timers(data, th)  # separated: windows.separated_trainer()
    batches = num(data.get(th.generation_batches_key))  # DAPO's n (v4)
    windows = split(step_seconds, all_timers, th, separated, batches)
    verdict: Verdict = decide(windows, data, th)
    tokens = positive(data.get(TOKENS_KEY))
    change = baseline.judge(windows, tokens, data, batches)
    return StepDiagnosis(
        run,
        step,
        verdict.verdict,
        verdict.reason,
        windows,
        change,
        verdict.evidence,
        tokens,
        all_timers,
    )


class _Walker:
    """Shared bookkeeping: the current run, its baseline, and the current step's data."""

    def __init__(self, th: Thresholds):
        self.th = th
        self.run = -1
        self.step: int | None = None
        self.data: Mapping[str, Any] = {}
        self.baseline = Baseline(th)

    def _advance(self, record: Record) -> str:
        """Place `record`; say whether it opened a new run, a new step, or continued one."""
        if self.step is None or record.step < self.step:
            self.run += 1
            self.baseline = Baseline(self.th)
            kind = "run"
        elif record.step > self.step:
            kind = "step"
        else:
            self.data = {**self.data, **record.data}  # a later value replaces an earlier one
            return "same"
        self.step = record.step
        self.data = record.data  # never mutated: merging makes a new dict
        return kind


class BatchDiagnoser(_Walker):
    """Feed records in file order; get each step's diagnosis once the step is complete."""

    def feed(self, record: Record) -> StepDiagnosis | None:
        run, step, data, baseline = self.run, self.step, self.data, self.baseline
        if self._advance(record) == "same" or step is None:
            return None
        return classify(run, step, data, baseline, self.th)

    def close(self) -> StepDiagnosis | None:
        """The last step, once the input has ended."""
        if self.step is None:
            return None
        step, self.step = self.step, None
        return classify(self.run, step, self.data, self.baseline, self.th)

    def diagnose(self, records: Iterable[Record]) -> Iterable[StepDiagnosis]:
        for record in records:
            result = self.feed(record)
            if result is not None:
                yield result
        result = self.close()
        if result is not None:
            yield result


class StreamEvent(NamedTuple):
    """What one record did to a job, for the sidecar."""

    record: Record
    new_run: bool  # the record opened a new run (restart / resume)
    new_step: bool  # the record opened a new step (counted in rlhf_steps_total)
    # the step this record classified: its own, or the held step it completed (`released`)
    diagnosis: StepDiagnosis | None
    released: bool = False  # `diagnosis` is a held earlier step, completed by this record
    timed: bool = False  # the first record of its step with a usable S (classified or held)
    late: bool = False  # a record of a step classified before it came (`late_record`)


class StreamDiagnoser(_Walker):
    """Feed records as they arrive; a step is classified by the record holding its S, or,
    once the job writes steps in two records (`holds`), when the step is complete."""

    def __init__(self, th: Thresholds, holds: bool = False):
        super().__init__(th)
        self.holds = holds  # a record of a step came after the one with its S: hold steps
        self._timed = False  # the current step's S record has come
        self._classified = False  # the current step was classified
        self.due: float | None = None  # the held step is complete by then (arrival + S)

    def feed(self, record: Record, now: float = 0.0) -> StreamEvent:
        """Place one record that arrived at `now` (the clock `release` is given)."""
        released = None
        if self.due is not None and record.step != self.step:
            released = self._release()  # its run and baseline, before the record moves on
        kind = self._advance(record)
        if kind != "same":
            self._timed = self._classified = False
        late = False
        if kind == "same" and self._timed:  # a second record of a step after its S
            self.holds = True
            late = self._classified
        timed = False
        if not self._timed and STEP_KEY in record.data:
            seconds = positive(self.data.get(STEP_KEY))
            timed = self._timed = seconds is not None
            if seconds is not None and self.holds:
                self.due = now + seconds
            elif seconds is not None:
                diagnosis = classify(self.run, record.step, self.data, self.baseline, self.th)
                self._classified = True
                return StreamEvent(record, kind == "run", kind != "same", diagnosis, timed=True)
        new = (kind == "run", kind != "same")
        return StreamEvent(record, *new, released, released is not None, timed, late)

    def release(self, now: float) -> StepDiagnosis | None:
        """The held step, classified, once its S has passed since its S record came."""
        if self.due is None or now < self.due:
            return None
        return self._release()

    def close(self) -> StepDiagnosis | None:
        """The held step, classified: the job ended or its input started over."""
        return self._release() if self.due is not None else None

    def _release(self) -> StepDiagnosis | None:
        self.due = None
        self._classified = True
        if self.step is None:
            return None
        return classify(self.run, self.step, self.data, self.baseline, self.th)
