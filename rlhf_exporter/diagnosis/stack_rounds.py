"""A stalled job's stacks folded across each role's processes ("2 of 2 trainer in collective
(all_reduce)"), and one stack round as the job view and the API show it. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .stack_vocabulary import RANK, WAITING, Wait


@dataclass(frozen=True)
class Seen:
    """One process of the job as the collector saw it: its stack's wait, or why not."""

    role: str
    label: str  # "vLLMHttpServer vllm_server_0_0", "WorkerDict 3", "driver"
    wait: Wait | None = None
    error: str = ""  # why there is no stack (WHY), when wait is None


@dataclass(frozen=True)
class Group:
    where: str
    detail: str
    count: int
    labels: tuple[str, ...]


@dataclass(frozen=True)
class RoleFold:
    role: str
    total: int
    groups: tuple[Group, ...]  # most processes first, then most telling
    unread: tuple[tuple[str, int], ...] = field(default=())  # (why, processes) without stack

    @property
    def where(self) -> str:
        """The role's answer: where most of its read processes wait (`unknown` if none)."""
        return self.groups[0].where if self.groups else "unknown"

    def text(self, max_groups: int = 3) -> str:
        parts = []
        for g in self.groups[:max_groups]:
            detail = f" ({g.detail})" if g.detail else ""
            who = g.labels[0] if g.count == 1 and self.total > 1 else f"{g.count} of {self.total}"
            parts.append(f"{who} in {g.where}{detail}" if self.total > 1 else f"{g.where}{detail}")
        if len(self.groups) > max_groups:
            parts.append(f"{len(self.groups) - max_groups} more")
        for why, n in self.unread:
            parts.append(f"{n} of {self.total} unread ({why})")
        if not parts:
            return f"{self.role}: nothing read"
        return f"{self.role}: " + "; ".join(parts)


def fold(seen: Iterable[Seen]) -> tuple[RoleFold, ...]:
    """Each role's processes, grouped by (where, detail) of their waits."""
    by_role: dict[str, list[Seen]] = {}
    for s in seen:
        by_role.setdefault(s.role, []).append(s)
    out = []
    for role, items in by_role.items():
        groups: dict[tuple[str, str], list[str]] = {}
        unread: dict[str, int] = {}
        for s in items:
            if s.wait is None:
                unread[s.error or "unknown"] = unread.get(s.error or "unknown", 0) + 1
            else:
                groups.setdefault((s.wait.where, s.wait.detail), []).append(s.label)
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), RANK[kv[0][0]], kv[0][1]))
        out.append(
            RoleFold(
                role,
                len(items),
                tuple(Group(w, d, len(ls), tuple(sorted(ls))) for (w, d), ls in ordered),
                tuple(sorted(unread.items())),
            )
        )
    return tuple(sorted(out, key=lambda r: (r.where in WAITING, RANK[r.where], r.role)))


def answer(folds: Sequence[RoleFold]) -> str:
    """The short answer: each role's text, most telling role first."""
    return "; ".join(f.text(max_groups=2) for f in folds) if folds else ""


# -- one stack round of a stalled job (what the job view and the API show) -----------------


@dataclass(frozen=True)
class ProcessStack:
    role: str
    label: str  # "vLLMHttpServer vllm_server_0_0", "driver raysubmit_..."
    pid: int
    node_id: str
    wait: Wait | None
    error: str = ""  # why there is no stack (a reason of rlhf_job_stacks_unread)
    message: str = ""  # Ray's or py-spy's words (short), when there is no stack
    text: str = ""  # the stack kept (bounded)
    truncated: bool = False


@dataclass(frozen=True)
class StackRound:
    """One stack round of a stalled job: what the job view and the API show."""

    project: str
    experiment: str
    taken_at: float  # wall time
    stalled_for: float  # seconds without a step when taken
    last_step_time: float
    processes: tuple[ProcessStack, ...]
    folds: tuple[RoleFold, ...]
    why: str = ""  # one sentence when no stack could be read (sources/stacks.py WHY)
    seconds: float = 0.0  # how long the round took

    @property
    def answer(self) -> str:
        return answer(self.folds)

    def unread(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.processes:
            if p.wait is None:
                out[p.error] = out.get(p.error, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "experiment": self.experiment,
            "taken_at": self.taken_at,
            "stalled_for_seconds": self.stalled_for,
            "last_step_time": self.last_step_time,
            "answer": self.answer,
            "why": self.why,
            "seconds": self.seconds,
            "roles": [
                {"role": f.role, "where": f.where, "text": f.text(), "processes": f.total,
                 "groups": [{"where": g.where, "detail": g.detail, "count": g.count,
                             "processes": list(g.labels)} for g in f.groups],
                 "unread": dict(f.unread)}
                for f in self.folds
            ],
            "processes": [
                {"role": p.role, "label": p.label, "pid": p.pid, "node_id": p.node_id,
                 "where": p.wait.where if p.wait else None,
                 "detail": p.wait.detail if p.wait else "", "task": p.wait.task if p.wait else "",
                 "error": p.error, "message": p.message, "stack": p.text,
                 "truncated": p.truncated}
                for p in self.processes
            ],
        }  # fmt: skip
