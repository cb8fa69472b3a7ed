"""What the landing page and the job view show of one job: its summary (a dict, read from
the job's status, counts and packed history) and its change episodes, computed when a page
first reads them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

from ..diagnosis import Thresholds, history
from ..diagnosis.advice import missing_evidence
from ..diagnosis.engines import EngineEvidence
from ..diagnosis.episodes import Episode, episodes
from ..frameworks.tables import cannot_show as framework_gaps
from .counts import EngineCounts, StepCounts
from .series import JobStatus

Episodes = Callable[[Sequence[history.StepPoint]], tuple[Episode, ...]]


def job_summary(
    labels: tuple[str, str],
    status: JobStatus,
    counts: StepCounts,
    engines: EngineCounts,
    kept: Sequence[history.StepPoint],
    episodes: Episodes,
    baseline_steps: int,
    th: Thresholds,
    evidence: set[str],
    framework: str | None = None,
) -> dict[str, Any]:
    """What the landing page shows for this job (`kept`: its history; `episodes` computes
    a history's episodes; `baseline_steps`: the usable steps this run's baseline holds;
    `evidence`: what the job's keys have shown; `framework`: whose output they were read
    from, when known)."""
    d = counts.last
    base = d.change.baseline if d else None
    out: dict[str, Any] = {
        "project": labels[0],
        "experiment": labels[1],
        "step": status.step,
        "run": status.run,
        "history": kept,  # StepPoints (the job view; not in /api/v1/jobs)
        # Episodes of the history (the job view), computed when a page first reads them:
        # a summary is built at every step, a page is drawn far less often
        "episodes": LazyEpisodes(episodes, kept),
        "steps": status.steps,
        "verdict": d.verdict if d else None,
        "reason": d.reason if d else None,
        "change": d.change.change if d else None,
        "regressed": d.change.regressed if d else None,
        "step_seconds": d.windows.step_seconds if d else None,
        "last_step_time": status.last_step_time,
        # what the stall limit reads (diagnosis/stall.py), as rlhf_baseline_step_duration_
        # seconds and rlhf_between_steps_max_seconds export them
        "baseline_step_seconds": base.busy_seconds if base is not None else None,
        "between_steps_max": status.between_steps_max,
        # the pages' "warming up" (no baseline yet: N of min_baseline_steps usable steps
        # of this run); the series and `change` keep their values
        "baseline_ready": base is not None,
        "baseline_steps": baseline_steps,
        "baseline_needed": th.min_baseline_steps,
        "finished": status.state == "finished",
        "state": status.state,
        "state_signal": status.state_signal,
        "cannot_show": missing_evidence(evidence, framework_gaps(framework)),
    }
    if engines.last is not None:  # a sidecar without engines: the summary as before
        out["engine"] = _engine_summary(engines.last, engines.step)
    return out


class EpisodeCache:
    """A job's change episodes (rlhf_exporter/diagnosis/episodes.py) of each history, computed
    once, when a page first asks: the last two histories asked for are kept (the job's current
    one and the one a page may still be drawing). Replaced whole, never changed in place."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: tuple[tuple[Sequence[history.StepPoint], tuple[Episode, ...]], ...] = ()

    def of(self, kept: Sequence[history.StepPoint]) -> tuple[Episode, ...]:
        cached = self._kept
        for points, found in cached:
            if points is kept:
                return found
        found = tuple(episodes(kept))
        self._kept = ((kept, found), *cached[:1])
        return found


class LazyEpisodes(Sequence[Episode]):
    """A job's change episodes of one history, computed on first use (see `job_summary`)."""

    __slots__ = ("_episodes", "_kept")

    def __init__(self, episodes: Episodes, kept: Sequence[history.StepPoint]):
        self._episodes, self._kept = episodes, kept

    def _all(self) -> tuple[Episode, ...]:
        return self._episodes(self._kept)

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, i: int) -> Episode: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Episode, ...]: ...
    def __getitem__(self, i: int | slice) -> Episode | tuple[Episode, ...]:
        return self._all()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyEpisodes):
            other = other._all()
        return self._all() == other

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def _engine_summary(ev: EngineEvidence, step: int | None) -> dict[str, Any]:
    """The engine evidence for `/` and the job view."""
    return {
        "step": step,
        "usable": ev.usable,
        "coverage": ev.coverage,
        "replicas": ev.replicas,
        "peak_running": ev.peak_running,
        "waiting_mean": ev.waiting_mean,
        "kv_max": ev.kv_max,
        "preemptions": ev.preemptions,
        "imbalance": ev.imbalance,
        "kv_pressure_share": ev.kv_pressure_share,
        "queueing_share": ev.queueing_share,
        "long_tail_share": ev.long_tail_share,
    }
