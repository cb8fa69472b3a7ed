"""Stacks of a stalled job, through Ray's dashboard.

Every `stacks_interval` the source reads the jobs the verl and push sources export. A running
job past its stall limit (diagnosis/stall.py: the limit `RLHFJobStalled` reads) gets a stack
round: for each of its live processes that the Ray source knows (its driver, then its ALIVE
actors by role; at most `stacks_max_processes`), one

    GET /worker/traceback?pid=PID&node_id=NODE&native=1[&subprocesses=1]

on the Ray dashboard, which has the node's agent run `py-spy dump` on the process and answers
its text (200), or why not: 403 "Profiling is disabled" (the head lacks
RAY_DASHBOARD_ENABLE_PROFILING=1), 404 (no such endpoint), 401/403 (token auth), or 500 with
py-spy's own words (not installed, no ptrace permission, the process is gone). Rollout
servers are asked with `subprocesses=1`: a vLLM server's engine core is a child process.
Each answer is read up to `stacks_max_bytes`, each thread kept to `stacks_max_frames`
frames, each request bounded by `stacks_timeout`; diagnosis/stacks.py folds them into where
each role waits. The round is taken again at most every `stacks_every` while the stall
lasts, and forgotten when the job steps (or ends). A reason that holds for the whole cluster
(profiling off, no endpoint, no token) ends the round at its first answer: it is said once.

Series: `rlhf_job_stalled_in{project, experiment, role, where}` (processes per role and
wait), `rlhf_job_stacks_unread{project, experiment, reason}` and
`rlhf_exporter_stack_reads_total{outcome}`. The rounds themselves (folded answer, full
stacks) are for the job view and `GET /api/v1/jobs/<p>/<e>/stacks` (`round_of`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

import orjson

from ..diagnosis import stacks
from ..diagnosis.stacks import ProcessStack, StackRound
from ..diagnosis.stall import StallLimit
from ..join.ports import JobProcess, JobProcesses
from ..metrics.snapshot import Sample
from ..settings import Settings
from . import http
from .base import Clock, Context, PollingSource, PollResult
from .ray import RaySource, resolve_address

log = logging.getLogger(__name__)

WHY: Mapping[str, str] = MappingProxyType(
    {
        "profiling_disabled": "Ray's dashboard has stack traces turned off: start the Ray head "
        "with RAY_DASHBOARD_ENABLE_PROFILING=1 (Ray 2.60 answers 403 without it)",
        "no_endpoint": "this Ray dashboard has no /worker/traceback endpoint (HTTP 404): a Ray "
        "without the dashboard's reporter module (`ray[default]`)",
        "unauthorized": "Ray's dashboard wants a token it did not get (HTTP 401/403): set the "
        "exporter's Ray token",
        "no_py_spy": "py-spy is not installed where Ray's agent runs (the Ray container of "
        "the node): `pip install py-spy` there (ray[default] brings it)",
        "no_permission": "py-spy may not read the process: the Ray container needs the "
        "SYS_PTRACE capability (or to run as root); see docs/runbooks.md#where-it-hangs",
        "no_process": "the process ended before py-spy read it",
        "no_agent": "Ray's dashboard does not know the node's agent (the node is gone or starting)",
        "timeout": "no answer within stacks_timeout",
        "unreachable": "Ray's dashboard did not answer (connection failed)",
        "http_error": "Ray's dashboard answered with an error",
        "not_read": "over stacks_max_processes: not read",
        "no_processes": "Ray lists no live process of this job (is it tied to a Ray job? "
        "docs/job-states.md)",
    }
)
"""Why a process's stack is missing: the panel's words, once per round."""
CLUSTER_WIDE = frozenset({"profiling_disabled", "no_endpoint", "unauthorized", "unreachable"})
OUTCOMES = ("ok", "stopped", *WHY, "jobs_over_limit")  # stopped: where="stopped", no stack
STOPPED = "state T (stopped): py-spy cannot suspend it to read its stack"
MAX_TASKS = 2000  # RUNNING tasks of a job read to name what a ray.get waits on
TASKS_BYTES = 4 << 20  # bytes of that answer read at most (a truncated one is not used)
ERROR_BYTES = 16 << 10  # of a refusal's body read at most (Ray's words and py-spy's stderr)
SUBPROCESS_ROLES = frozenset({"rollout"})  # a vLLM / SGLang server's engine runs in a child
# py-spy's refusals that a moment may clear (a thread or child exiting while it attaches):
# read once more, until one such second read fails too in the round (then none is retried)
RETRIED = frozenset({"no_permission", "no_process", "http_error"})
RETRY_PAUSE = 0.2  # seconds before that second read


def read_error(status: int, body: str) -> str:
    """A WHY key from Ray's answer that is not a stack (Ray 2.60's wording, reporter_head.py
    and profile_manager.py), or "stopped": py-spy found the process stopped."""
    low = body.lower()
    if status == 403 and "profiling is disabled" in low:
        return "profiling_disabled"
    if status in (401, 403):
        return "unauthorized"
    if status == 404:
        return "no_endpoint"
    if "py-spy is not installed" in low:
        return "no_py_spy"
    # py-spy 0.4 on a SIGSTOPped process: "Failed to suspend process ... unexpected waitpid
    # result PtraceEvent(Pid(N), SIGSTOP, 128)": its ptrace attach finds it already stopped
    # (told apart before "ptrace" below: no capability would help). The refusal is the
    # answer: nothing runs in a stopped process (SIGSTOP, a debugger) until SIGCONT
    if "failed to suspend process" in low and "sigstop" in low and "permission" not in low:
        return "stopped"
    if "permission" in low or "operation not permitted" in low or "ptrace" in low:
        return "no_permission"
    if "check that the process is running" in low or "no such process" in low:
        return "no_process"
    if "failed to get agent address" in low:
        return "no_agent"
    return "http_error"


def keep_frames(text: str, max_frames: int) -> str:
    """The stack text with each thread cut to its innermost `max_frames` frames."""
    out, kept = [], 0
    for line in text.splitlines():
        if line.startswith(("Thread ", "Process ")):
            kept = 0
        elif line.startswith("    "):
            kept += 1
            if kept > max_frames:
                if kept == max_frames + 1:
                    out.append("    ...")
                continue
        out.append(line)
    return "\n".join(out)


class StackSource(PollingSource):
    retry_pause = RETRY_PAUSE

    def __init__(
        self,
        address: str,
        ray: JobProcesses | None,
        jobs_fns: Sequence[Callable[[], Iterable[Mapping[str, Any]]]],
        limit: StallLimit,
        *,
        interval: float = 15.0,
        every: float = 300.0,
        timeout: float = 10.0,
        max_processes: int = 64,
        max_jobs: int = 8,
        max_frames: int = 48,
        max_bytes: int = 64 << 10,
        native: bool = True,
        headers: Callable[[], Mapping[str, str]] | None = None,
        clock: Clock = time.time,
    ):
        # a round may take max_processes x timeout: never reported stale for it
        stale = interval + max_jobs * max_processes * timeout + 10
        super().__init__("stacks", interval, stale_after=stale, wall=clock)
        self.address = address.rstrip("/")
        self.ray = ray
        self.jobs_fns = list(jobs_fns)
        self.limit = limit
        self.every = every
        self.timeout = timeout
        self.max_processes = max_processes
        self.max_jobs = max_jobs
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.native = native
        self._headers = headers
        self._clock = clock
        # Ray's refusals are told apart by their body (read_error): read up to ERROR_BYTES
        self._http = http.Client(timeout=timeout, max_bytes=max_bytes)
        self._reads = dict.fromkeys(OUTCOMES, 0)
        self._warned: set[str] = set()
        # read by the HTTP thread: replaced whole
        self._rounds: Mapping[tuple[str, str], StackRound] = MappingProxyType({})

    @classmethod
    def from_settings(cls, settings: Any, context: Context) -> StackSource | None:
        return None  # built by the sidecar, which holds the Ray source and the job sources

    def describe(self) -> str:
        return (
            f"stacks (stalled jobs' stacks via {self.address}/worker/traceback; checked every "
            f"{self.interval:g}s, again every {self.every:g}s)"
        )

    def close(self) -> None:
        self._http.close()

    def round_of(self, project: str, experiment: str) -> StackRound | None:
        return self._rounds.get((project, experiment))

    # -- one poll ---------------------------------------------------------------------------
    def poll(self) -> PollResult:
        now = self._clock()
        jobs = [j for fn in self.jobs_fns for j in fn()]
        sole = len(jobs) == 1
        rounds: dict[tuple[str, str], StackRound] = {}
        over = 0
        for job in jobs:
            key = (str(job.get("project")), str(job.get("experiment")))
            stalled = self.limit.job_stalled_for(job, now)
            if stalled is None or job.get("state") != "running":
                continue  # stepping, finished or failed: its stacks are forgotten
            last = job.get("last_step_time")
            old = self._rounds.get(key)
            if old is not None and old.last_step_time == last and now - old.taken_at < self.every:
                rounds[key] = old
                continue
            if len(rounds) >= self.max_jobs:
                over += 1
                continue
            job_id = str(job.get("ray_job_id") or "")  # the console source's jobs carry it
            rounds[key] = self._round(key, float(last or 0.0), stalled, sole, job_id)
        if over:
            self._reads["jobs_over_limit"] += over
        self._rounds = MappingProxyType(rounds)
        return PollResult(tuple(self._samples(rounds.values())))

    def _round(
        self, key: tuple[str, str], last: float, stalled: float, sole: bool, job_id: str = ""
    ) -> StackRound:
        started = time.monotonic()
        ray = self.ray
        procs = ray.job_processes(*key, sole=sole, job_id=job_id) if ray is not None else ()
        taken: list[ProcessStack] = []
        stop = ""  # a cluster-wide reason: the rest of the round is not asked
        retry = True  # until a second read fails too
        for i, proc in enumerate(procs):
            label = f"{proc.class_name.rsplit('.', 1)[-1]} {proc.name or proc.pid}".strip()
            if i >= self.max_processes:
                taken.append(
                    ProcessStack(proc.role, label, proc.pid, proc.node_id, None, "not_read")
                )
                self._reads["not_read"] += 1
                continue
            if stop:
                taken.append(ProcessStack(proc.role, label, proc.pid, proc.node_id, None, stop))
                continue
            got = self._read(proc, label)
            if retry and got.error in RETRIED:
                time.sleep(self.retry_pause)
                got = self._read(proc, label)
                retry = not got.error
            if got.error in CLUSTER_WIDE:
                stop = got.error
            taken.append(got)
        if any(p.wait is not None and p.wait.where in ("ray_get", "ray_wait") for p in taken):
            taken = self._name_awaited(key, sole, taken, job_id)
        seen = [stacks.Seen(p.role, p.label, p.wait, p.error) for p in taken]
        why = ""
        if not procs:
            why = WHY["no_processes"]
            self._reads["no_processes"] += 1
        elif all(p.wait is None for p in taken):
            why = WHY[taken[0].error] + (f" ({taken[0].message})" if taken[0].message else "")
        if why:
            self._warn_once(why, "stacks of %s/%s: %s", key[0], key[1], why)
        return StackRound(
            key[0], key[1], self._clock(), stalled, last, tuple(taken), stacks.fold(seen), why,
            time.monotonic() - started,
        )  # fmt: skip

    def _name_awaited(
        self, key: tuple[str, str], sole: bool, taken: list[ProcessStack], known: str = ""
    ) -> list[ProcessStack]:
        """What each process in ray.get waits on: the job's unfinished tasks from Ray's state
        API (one request; a task's children are what it awaits). The awaited task need not
        run: one sent to a stopped or busy worker is SUBMITTED_TO_WORKER (the real verl
        job's TaskRunner awaits such a WorkerDict task), so a process is tied to the tasks
        RUNNING on it, and every unfinished task names its parent's wait. Without an answer
        the waits stay as the stacks say."""
        if self.ray is None:
            return taken
        job_id = self.ray.ray_job_id(*key, sole=sole, job_id=known)
        params = [("filter_keys", "state"), ("filter_predicates", "!="), ("filter_values", "FINISHED"),
                  ("filter_keys", "state"), ("filter_predicates", "!="), ("filter_values", "FAILED"),
                  ("filter_keys", "job_id"), ("filter_predicates", "="), ("filter_values", job_id),
                  ("detail", "1"), ("limit", str(MAX_TASKS))]  # fmt: skip
        status, body, truncated, error = self._fetch("/api/v0/tasks", params, TASKS_BYTES)
        tasks: list[tuple[int, str, str, str]] | None = None
        if status == 200:
            try:
                rows = orjson.loads(body)["data"]["result"]["result"]
                # (pid it runs on, or 0 when not running; task, parent, name)
                tasks = [(int(r.get("worker_pid") or 0) if r.get("state") == "RUNNING" else 0,
                          str(r["task_id"]), str(r["parent_task_id"]), str(r["name"]))
                         for r in rows]  # fmt: skip
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                tasks = None
        if not tasks or truncated:
            self._warn_once(f"tasks {status} {error}", "Ray's tasks of %s/%s unread (HTTP %s%s): "
                            "ray.get waits are not named", key[0], key[1], status, error)  # fmt: skip
            return taken
        drivers = [p.pid for p in taken if p.label.startswith("driver ")]
        names = stacks.awaited(tasks, drivers)
        return [
            replace(p, wait=stacks.on(p.wait, names.get(p.pid, ()))) if p.wait else p for p in taken
        ]

    def _read(self, proc: JobProcess, label: str) -> ProcessStack:
        params = {
            "pid": str(proc.pid),
            "node_id": proc.node_id,
            "native": "1" if self.native else "0",
        }
        if proc.role in SUBPROCESS_ROLES:
            params["subprocesses"] = "1"
        status, body, truncated, error = self._fetch("/worker/traceback", params)
        base = (proc.role, label, proc.pid, proc.node_id)
        if error:
            self._reads[error] += 1
            return ProcessStack(*base, None, error, body[:300])
        if status != 200:
            why = read_error(status, body)
            self._reads[why] += 1
            if why == "stopped":  # where it hangs, said by py-spy's refusal (Ray's words kept)
                wait = stacks.Wait("stopped", STOPPED)
                return ProcessStack(*base, wait, message=_message(body), text=body)
            return ProcessStack(*base, None, why, _message(body))
        self._reads["ok"] += 1
        wait = stacks.classify(stacks.parse(body))  # the whole answer read (max_bytes)
        text = keep_frames(body, self.max_frames)  # what is kept and shown
        return ProcessStack(*base, wait, text=text, truncated=truncated)

    def _fetch(
        self, path: str, params: Mapping[str, str] | Sequence[tuple[str, str]],
        max_bytes: int | None = None,
    ) -> tuple[int, str, bool, str]:  # fmt: skip
        """The one HTTP call, on the shared client (sources/http.py; the Ray token sent as
        the Ray source sends it): (status, body text up to max_bytes, or a refusal's up to
        ERROR_BYTES, truncated, error key: a WHY key, "" when Ray answered)."""
        headers = dict(self._headers()) if self._headers else {}
        url = f"{self.address}{path}?{urlencode(params)}"
        try:
            got = self._http.request(
                url, max_bytes=max_bytes, headers=headers, error_bytes=ERROR_BYTES, truncate=True
            )
        except http.HttpFailure as exc:
            error = exc.reason if exc.reason in (http.TIMEOUT, http.UNREACHABLE) else "http_error"
            return exc.status or 0, str(exc)[:200], False, error
        return got.status, got.body.decode("utf-8", "replace"), got.truncated, ""

    def _samples(self, rounds: Iterable[StackRound]) -> Iterable[Sample]:
        for r in rounds:
            j = (r.project, r.experiment)
            for fold in r.folds:
                # a role's groups differ by detail too (the driver's two ray.get): one
                # series per (role, where), their processes summed
                counts: dict[str, int] = {}
                for g in fold.groups:
                    counts[g.where] = counts.get(g.where, 0) + g.count
                for where, n in counts.items():
                    yield Sample("rlhf_job_stalled_in", j + (fold.role, where), float(n))
            unread = r.unread()
            if not r.processes:
                unread["no_processes"] = 1
            for reason, n in sorted(unread.items()):
                yield Sample("rlhf_job_stacks_unread", j + (reason,), float(n))
        for outcome, n in self._reads.items():
            yield Sample("rlhf_exporter_stack_reads_total", (outcome,), float(n))

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < 64:
            self._warned.add(key)
            log.warning(message, *args, extra={"collector": self.name})


def _message(body: str) -> str:
    """Ray's or py-spy's words, short: py-spy's first line on stderr when Ray quotes it,
    else the first line that says something."""
    _, mark, stderr = body.partition("=== stderr ===")
    for line in (stderr if mark else body).splitlines():
        line = line.strip()
        if line and not line.startswith(("===", "Failed to execute")):
            return line[:300]
    return body.strip()[:300]


def build(settings: Settings, ray: RaySource | None,
          jobs_fns: Sequence[Callable[[], Any]], context: Context,
          headers: Callable[[], Mapping[str, str]] | None = None) -> StackSource | None:  # fmt: skip
    """The sidecar's stacks source, when stacks are on and Ray's actors are read."""
    if not settings.stacks or ray is None or not settings.ray_actors:
        return None
    return StackSource(
        resolve_address(settings.ray_address),
        ray,
        jobs_fns,
        StallLimit.of(context.thresholds.alerts),
        interval=settings.stacks_interval,
        every=settings.stacks_every,
        timeout=settings.stacks_timeout,
        max_processes=settings.stacks_max_processes,
        max_jobs=settings.stacks_max_jobs,
        max_frames=settings.stacks_max_frames,
        max_bytes=settings.stacks_max_bytes,
        native=settings.stacks_native,
        headers=headers,
        clock=context.clock,
    )
