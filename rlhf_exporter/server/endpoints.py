"""What the server serves (`Endpoints`, built by `serve` from the active sources): the
exposition, readiness, the status and jobs JSON, and a job's stacks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from .. import __version__
from ..diagnosis.stacks import StackRound
from ..job.windows_wire import WindowsApi
from ..join.board import WindowJoiner
from ..metrics.exposition import Exposition
from ..metrics.snapshot import Problem, SnapshotFn
from ..sources.push import PushSource
from ..view.pages import source_state
from .page_cache import PageCache

EXPOSITION_WARM_INTERVAL = 0.25  # seconds: encode new job series off the scrape path
JobsFn = Callable[[], Iterable[dict[str, Any]]]


@dataclass
class Endpoints:
    """What the server serves; `serve` builds it from the active sources."""

    snapshot_fns: Sequence[SnapshotFn]
    jobs_fns: Sequence[JobsFn] = ()
    push: PushSource | None = None
    ready_fns: Sequence[SnapshotFn] = ()  # sources whose first collection makes /readyz 200
    sources_text: str = ""
    alerts: Mapping[str, Any] = field(default_factory=dict)  # thresholds' alerts: the job view
    demo: bool = False  # the job view labels its data as simulated
    # the demo: the incident now playing, in words (the pages' demo banner), and its job on
    # its own clock (project, experiment, wall -> job time), where its stall is judged
    demo_story: Callable[[], str] | None = None
    demo_clock: tuple[str, str, Callable[[float], float]] | None = None
    pages: PageCache = field(default_factory=lambda: PageCache())  # the job view's pages
    windows_api: WindowsApi | None = None  # GET /api/v1/windows (job/windows_wire.py): or None
    # the NVML source's WindowJoiner: GPU time by window in the job view
    window_view: WindowJoiner | None = None
    balance_limits: Mapping[str, Any] = field(default_factory=dict)  # thresholds' balance:
    # a stalled job's last stack round (sources/stacks.py), None when stacks are off
    stacks_of: Callable[[str, str], StackRound | None] | None = None
    # why no source can ever see a verl job (nor a GPU): /readyz answers 503 with it
    blind: Problem | None = None
    exposition: Exposition = field(init=False)

    def __post_init__(self) -> None:
        guards = [getattr(x, "guard", None) for x in (self.push, self.windows_api)]
        self.exposition = Exposition(
            self.snapshot_fns,
            warm_interval=EXPOSITION_WARM_INTERVAL,
            sample_fns=[g.samples for g in guards if g is not None],
        )

    def ready(self) -> bool:
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why `/readyz` answers 503 (one line), or None when it answers 200."""
        if self.blind is not None:
            return f"{self.blind.message}: {self.blind.hint}"
        if not self.ready_fns:
            return None
        if any(s.last_success is not None or s.errors for s in (f() for f in self.ready_fns)):
            return None
        return "no source has finished a first collection yet"

    def status(self) -> dict[str, Any]:
        """`GET /api/v1/status`: readiness, each source's health, and the set-up problems."""
        snaps = [fn() for fn in self.snapshot_fns]
        problems = [self.blind] if self.blind is not None else []
        problems += [p for s in snaps for p in s.problems]
        why = self.not_ready()
        return {
            "version": __version__,
            "ready": why is None,
            "not_ready": why,
            "sources": [
                {
                    "source": s.collector,
                    "state": source_state(s),
                    "up": s.up,
                    "last_success": s.last_success,
                    "errors": dict(s.errors),
                    "record_errors": dict(s.record_errors),
                    "records": s.records,
                }
                for s in snaps
            ],
            "problems": [p.to_json() for p in problems],
        }

    def jobs(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for fn in self.jobs_fns:
            out.extend(fn())
        if self.stacks_of is not None:  # the job view's "where it hangs"
            stacks_of = self.stacks_of
            out = [_with_stacks(j, stacks_of(j["project"], j["experiment"])) for j in out]
        return sorted(out, key=lambda j: (j["project"], j["experiment"]))

    def stacks_json(self, path: str) -> tuple[int, dict[str, Any]]:
        """`GET /api/v1/jobs/<project>/<experiment>/stacks`: the job's last stack round."""
        parts = path[len(JOBS_API) :].split("/")
        if len(parts) != 3 or parts[2] != "stacks":
            return 404, {"error": "not found: /api/v1/jobs/<project>/<experiment>/stacks"}
        project, experiment = (unquote(p) for p in parts[:2])
        job = next((j for j in self.jobs() if (j["project"], j["experiment"]) ==
                    (project, experiment)), None)  # fmt: skip
        if job is None:
            return 404, {"error": f"no job {project}/{experiment}"}
        found = job.get("stacks")
        note = (
            "stacks are off (--no-stacks, or Ray's actors are not read)"
            if self.stacks_of is None
            else "no stack round: the job is not stalled (stacks are taken past its stall "
            "limit and forgotten once it steps)"
        )
        out: dict[str, Any] = {"project": project, "experiment": experiment}
        out["round"] = found.to_json() if isinstance(found, StackRound) else None
        if out["round"] is None:
            out["note"] = note
        return 200, out


JOBS_API = "/api/v1/jobs/"


def _with_stacks(job: dict[str, Any], found: StackRound | None) -> dict[str, Any]:
    return {**job, "stacks": found} if found is not None else job
