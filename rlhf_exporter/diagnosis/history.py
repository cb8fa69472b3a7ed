"""A job's last steps, compact: what the job view draws (step anatomy, verdict strip, markers).

`StepPoint` keeps only what a picture needs (a few hundred bytes per step), so the sidecar
can hold the last `HISTORY_STEPS` steps of every job, and `diagnose --html` every step of a
log. Both build points with `point()` from the decision table's `StepDiagnosis`.
"""

from __future__ import annotations

from typing import NamedTuple

from . import GROUPS, StepDiagnosis

HISTORY_STEPS = 60  # steps the sidecar keeps per job (the job view's default N)


class StepPoint(NamedTuple):
    run: int
    step: int
    verdict: str
    reason: str | None
    step_seconds: float
    group_seconds: tuple[float, ...]  # in GROUPS order; `other` includes the untimed remainder
    untimed_seconds: float
    change: str
    regressed: str | None
    tokens: float | None
    tokens_per_gpu_second: float | None  # verl's perf/throughput, when it logs it
    response_length: float | None = None  # verl's response_length/mean, when it logs it
    longest_response: float | None = None  # verl's response_length/max, when it logs it

    def seconds(self) -> dict[str, float]:
        return dict(zip(GROUPS, self.group_seconds))


def point(
    d: StepDiagnosis,
    tokens_per_gpu_second: float | None = None,
    response_length: float | None = None,
    longest_response: float | None = None,
) -> StepPoint:
    w = d.windows
    return StepPoint(
        d.run,
        d.step,
        d.verdict,
        d.reason,
        w.step_seconds,
        tuple(map(w.group_seconds.__getitem__, GROUPS)),
        w.untimed_seconds,
        d.change.change,
        d.change.regressed,
        d.tokens,
        tokens_per_gpu_second,
        response_length,
        longest_response,
    )
