"""Ray's Jobs API (`GET /api/jobs/` on the dashboard) tied to verl jobs.

Each entry (a `ray job submit` submission, or a plain driver) has a `status` (PENDING,
RUNNING, STOPPED, SUCCEEDED, FAILED), an `entrypoint`, `metadata`, a Ray `job_id` (the
driver's, which every actor row of the state API also carries) and start/end times in ms.

How a submission is tied to the verl log it writes (`project`, `experiment`), first match:
1. `metadata` keys `project` and `experiment` (`ray job submit --metadata-json`);
2. the entrypoint's Hydra overrides `trainer.project_name=...` and
   `trainer.experiment_name=...` (verl's own keys: the file logger writes
   `<project_name>/<experiment_name>.jsonl`), `+`/`++` prefixes and quotes allowed;
3. when the exporter exports exactly one job (a sidecar of one RayJob) and no entry is tied
   by 1 or 2, the newest entry (by start time) is that job's.

The newest tied entry wins. A RUNNING or PENDING entry that a restarted head (a new
`session_name`) no longer lists is LOST: without GCS fault tolerance the driver died with
the head. At most `MAX_JOBS` tied jobs are remembered (oldest first out, counted).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from ..lifecycle import ACTIVE_STATUSES, LOST, RayFact

MAX_JOBS = 2000  # verl jobs whose Ray facts are remembered (across head restarts)
MAX_ENTRIES = 10_000  # Jobs API entries read per poll (the rest are ignored, counted)
_STATUSES = frozenset({"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"})
MAX_ENTRYPOINT = 65536  # characters of an entrypoint read
# a shell word: unquoted runs, '...' and "..." (with backslash escapes), glued together
_WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'?|"(?:[^"\\]|\\.)*"?|\\.?)+""", re.S)
_OVERRIDE = re.compile(r"^\+{0,2}trainer\.(project_name|experiment_name)=(.*)$", re.S)


def tie(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    """(project, experiment) that this Jobs API entry's verl run writes, or None."""
    meta = entry.get("metadata")
    if isinstance(meta, Mapping):
        p, e = meta.get("project"), meta.get("experiment")
        if isinstance(p, str) and isinstance(e, str) and p and e:
            return p, e
    entrypoint = entry.get("entrypoint")
    if not isinstance(entrypoint, str) or "trainer." not in entrypoint:
        return None
    if "project_name" not in entrypoint or "experiment_name" not in entrypoint:
        return None
    return _tie_entrypoint(entrypoint[:MAX_ENTRYPOINT])


_memo: dict[str, tuple[str, str] | None] = {}


def _tie_entrypoint(entrypoint: str) -> tuple[str, str] | None:
    """The Hydra overrides' (project, experiment) of one entrypoint, remembered: the Jobs
    API lists the same entrypoints at every poll (at most 2 x MAX_ENTRIES remembered)."""
    if entrypoint in _memo:
        return _memo[entrypoint]
    # the shell's words, split by one regular expression (shlex, in pure Python, took 4 ms
    # for a 5 KB entrypoint: 10,000 such submissions held a Ray poll for 16 s and more);
    # only the few words that name trainer.* are unquoted by shlex
    quoted = any(q in entrypoint for q in "'\"\\")
    split = _WORD.findall(entrypoint) if quoted else entrypoint.split()
    words = [w for w in split if "trainer." in w]
    if quoted:  # an unbalanced quote swallows the rest: the words between blanks first
        words = [w for w in entrypoint.split() if "trainer." in w] + words
    found: dict[str, str] = {}
    for raw in words:
        try:
            word = "".join(shlex.split(raw)) if any(q in raw for q in "'\"\\") else raw
        except ValueError:  # an unbalanced quote: the word as written
            word = raw
        m = _OVERRIDE.match(word)
        if m:
            value = m[2].strip().strip("'\"")
            if value:
                found[m[1]] = value  # the last override wins, as in Hydra
    result = None
    if "project_name" in found and "experiment_name" in found:
        result = found["project_name"], found["experiment_name"]
    if len(_memo) >= 2 * MAX_ENTRIES:
        _memo.clear()
    _memo[entrypoint] = result
    return result


def _seconds(ms: Any) -> float | None:
    return ms / 1000.0 if isinstance(ms, int | float) and ms > 0 else None


def _entry_fact(entry: Mapping[str, Any]) -> RayFact | None:
    status = entry.get("status")
    if not isinstance(status, str) or status not in _STATUSES:  # a list is no status
        return None
    ident = entry.get("submission_id") or entry.get("job_id") or ""
    end = _seconds(entry.get("end_time"))
    since = end if end is not None and status not in ACTIVE_STATUSES else None
    return RayFact(str(status), str(ident)[:128], "", since or _seconds(entry.get("start_time")))


class JobBook:
    """The Ray facts of verl jobs, kept across polls and Ray head restarts (poll thread
    only; `facts()` returns a new mapping each time)."""

    def __init__(self, max_jobs: int = MAX_JOBS):
        self.max_jobs = max_jobs
        self._tied: dict[tuple[str, str], tuple[RayFact, str]] = {}  # -> (fact, ray job id)
        self._newest: tuple[RayFact, str] | None = None  # the newest entry, when untied
        self._failures: dict[str, str] = {}  # Ray job id -> first failure reason
        # Ray job id -> (its submission's fact, submission id, what it names): the console
        # source's jobs take their state from their own submission (replaced whole per poll)
        self._by_job: dict[str, tuple[RayFact, str, tuple[str, str] | None]] = {}
        self.dropped = 0  # tied jobs forgotten over max_jobs
        self.ignored = 0  # entries over MAX_ENTRIES or with an unknown status

    def session_changed(self) -> None:
        """The head restarted: what was running there is gone with it."""
        for key, (fact, job_id) in list(self._tied.items()):
            if fact.status in ACTIVE_STATUSES:
                self._tied[key] = (fact._replace(status=LOST), job_id)
        if self._newest is not None and self._newest[0].status in ACTIVE_STATUSES:
            self._newest = (self._newest[0]._replace(status=LOST), self._newest[1])
        self._failures.clear()  # Ray job ids restart with the new head

    def failed_actor(self, job_id: str, reason: str) -> None:
        if job_id and job_id not in self._failures and len(self._failures) < self.max_jobs:
            self._failures[job_id] = reason

    def update(self, entries: Iterable[Any]) -> dict[str, int]:
        """Read one Jobs API listing; returns entries by status."""
        by_status: dict[str, int] = {}
        newest: tuple[float, RayFact, str, bool] | None = None
        best: dict[tuple[str, str], tuple[float, RayFact, str]] = {}
        by_job: dict[str, tuple[RayFact, str, tuple[str, str] | None]] = {}
        for i, entry in enumerate(entries):
            if i >= MAX_ENTRIES:
                self.ignored += 1
                continue
            if not isinstance(entry, Mapping):
                continue
            fact = _entry_fact(entry)
            if fact is None:
                self.ignored += 1
                continue
            by_status[fact.status] = by_status.get(fact.status, 0) + 1
            start = _seconds(entry.get("start_time")) or 0.0
            job_id = str(entry.get("job_id") or "")
            key = tie(entry)
            if job_id:
                by_job[job_id] = (fact, str(entry.get("submission_id") or "")[:128], key)
            if newest is None or start >= newest[0]:
                newest = (start, fact, job_id, key is None)
            if key is not None and (key not in best or start >= best[key][0]):
                best[key] = (start, fact, job_id)
        self._by_job = by_job
        for key, (_, fact, job_id) in best.items():
            self._tied.pop(key, None)  # re-inserted: the most recently seen is kept longest
            self._tied[key] = (fact, job_id)
        while len(self._tied) > self.max_jobs:
            del self._tied[next(iter(self._tied))]
            self.dropped += 1
        if newest is not None:  # the newest entry stands for a sole job only when untied
            self._newest = (newest[1], newest[2]) if newest[3] else None
        return by_status

    def _with_failure(self, fact: RayFact, job_id: str) -> RayFact:
        reason = self._failures.get(job_id, "") if job_id else ""
        return fact._replace(failure=reason) if reason else fact

    def job_ids(self) -> tuple[dict[tuple[str, str], str], str]:
        """(the Ray job id of each tied job, the newest untied entry's ('' when none)): the
        actors of a verl job are those whose `job_id` is its driver's."""
        tied = {k: j for k, (_, j) in self._tied.items() if j}
        return tied, self._newest[1] if self._newest is not None else ""

    def facts(self) -> tuple[dict[tuple[str, str], RayFact], RayFact | None]:
        """(tied facts by (project, experiment), the newest entry's fact for a sole job)."""
        tied = {k: self._with_failure(f, j) for k, (f, j) in self._tied.items()}
        newest = self._with_failure(*self._newest) if self._newest is not None else None
        return tied, newest

    def submission(self, job_id: str) -> tuple[RayFact, str, tuple[str, str] | None] | None:
        """(the fact, the submission id, the (project, experiment) it names) of the Jobs API
        entry whose driver has Ray job id `job_id`; None when the API does not list it."""
        hit = self._by_job.get(job_id)
        if hit is None:
            return None
        return self._with_failure(hit[0], job_id), hit[1], hit[2]
