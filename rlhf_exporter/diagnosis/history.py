"""A job's last steps, compact: what the job view draws (step anatomy, verdict strip, markers).

`StepPoint` keeps only what a picture needs (a few hundred bytes per step), so the sidecar
can hold the last `HISTORY_STEPS` steps of every job, and `diagnose --html` every step of a
log. Both build points with `point()` from the decision table's `StepDiagnosis`.
"""

from __future__ import annotations

from collections import Counter
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


MAX_DRAWN = 2000  # bars `diagnose --html` draws per run at most (then each bar is a mean)


class _Bin:
    """Consecutive steps of one run, summed: one bar of the report."""

    __slots__ = (
        "first",
        "groups",
        "last",
        "n",
        "n_tokens",
        "n_tput",
        "p",
        "reasons",
        "regressed",
        "seconds",
        "shift",
        "tokens",
        "tput",
        "untimed",
        "verdicts",
    )  # fmt: skip

    def __init__(self, p: StepPoint):
        self.first = self.last = p.step
        self.n = 0
        self.p = p  # the first step's point (run, change when nothing changed)
        self.seconds = self.untimed = self.tokens = self.tput = 0.0
        self.groups = [0.0] * len(GROUPS)
        self.verdicts: Counter[str] = Counter()
        self.reasons: Counter[tuple[str, str | None]] = Counter()
        self.regressed: str | None = None
        self.shift = False
        self.n_tokens = self.n_tput = 0
        self.add(p)

    def add(self, p: StepPoint) -> None:
        self.n += 1
        self.last = p.step
        self.seconds += p.step_seconds
        self.untimed += p.untimed_seconds
        for i, s in enumerate(p.group_seconds):
            self.groups[i] += s
        self.verdicts[p.verdict] += 1
        self.reasons[p.verdict, p.reason] += 1
        if p.regressed is not None and self.regressed is None:
            self.regressed = p.regressed
        self.shift = self.shift or p.change == "workload_shift"
        if p.tokens is not None:
            self.tokens += p.tokens
            self.n_tokens += 1
        if p.tokens_per_gpu_second is not None:
            self.tput += p.tokens_per_gpu_second
            self.n_tput += 1

    def merge(self, other: _Bin) -> None:
        self.n += other.n
        self.last = other.last
        self.seconds += other.seconds
        self.untimed += other.untimed
        self.groups = [a + b for a, b in zip(self.groups, other.groups, strict=True)]
        self.verdicts.update(other.verdicts)
        self.reasons.update(other.reasons)
        self.regressed = self.regressed or other.regressed
        self.shift = self.shift or other.shift
        self.tokens += other.tokens
        self.n_tokens += other.n_tokens
        self.tput += other.tput
        self.n_tput += other.n_tput

    def point(self) -> StepPoint:
        if self.n == 1:
            return self.p
        n = self.n
        verdict = self.verdicts.most_common(1)[0][0]
        reason = max(
            ((r, c) for (v, r), c in self.reasons.items() if v == verdict), key=lambda rc: rc[1]
        )[0]
        change = (
            "regression" if self.regressed else "workload_shift" if self.shift else self.p.change
        )
        return StepPoint(
            self.p.run,
            self.first,
            verdict,
            reason,
            self.seconds / n,
            tuple(s / n for s in self.groups),
            self.untimed / n,
            change,
            self.regressed,
            self.tokens / self.n_tokens if self.n_tokens else None,
            self.tput / self.n_tput if self.n_tput else None,
        )


class StepBins:
    """A run's steps for a picture, in bounded memory: every step while there are at most
    `limit`; past that, consecutive steps are merged two by two (again and again) so at
    most `limit` bars remain, each the mean of `width` steps (its verdict the most frequent,
    a regression or workload shift marked if any of its steps had one)."""

    def __init__(self, limit: int = MAX_DRAWN):
        self.limit = max(limit, 2)
        self.width = 1  # steps per bar
        self.steps = 0
        self._bins: list[_Bin] = []

    def add(self, p: StepPoint) -> None:
        self.steps += 1
        bins = self._bins
        if bins and bins[-1].n < self.width:
            bins[-1].add(p)
            return
        bins.append(_Bin(p))
        if len(bins) > self.limit:
            merged = []
            for i in range(0, len(bins), 2):
                b = bins[i]
                if i + 1 < len(bins):
                    b.merge(bins[i + 1])
                merged.append(b)
            self._bins = merged
            self.width *= 2

    def points(self) -> list[StepPoint]:
        return [b.point() for b in self._bins]
