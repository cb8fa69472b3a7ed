"""A simulated Ray dashboard for `serve --demo`: where the demo job's processes wait.

A stalled job's stacks come from Ray's dashboard (rlhf_exporter/sources/stacks.py): for each
live process of the job, `GET /worker/traceback?pid=PID&node_id=NODE` answers the text of
`py-spy dump`, and `GET /api/v0/tasks` the job's unfinished tasks (what a `ray.get` waits
on). Here a real HTTP server on 127.0.0.1 (an ephemeral port) answers both for the demo
job's simulated processes (`PROCESSES`: its TaskRunner, 8 trainer ranks, 8 rollout servers,
4 agent loops and a reward loop, as the demo's Ray series count them), and the real stacks
source reads them (`DemoStacks`): it parses, classifies and folds them, and the job page's
"Where it hangs", `/` and `rlhf_job_stalled_in` show the answer. Nothing about the demo
reaches the fold.

The dumps follow the demo job's phase (rlhf_exporter/demo/scenario.py). In a phase that
`hangs` (the stall), the trainer hangs in `update_actor`: seven ranks wait in the
gradient's `all_reduce`, which rank 5 never joins (it still waits in the `all_gather` of a
forward pass: ranks in two different collectives, the classic NCCL hang); the TaskRunner
waits in `ray.get` on their `update_actor` tasks; the rollout servers, agent loops and
reward loop wait between tasks. In any other phase every process waits between tasks (the
source asks only past a job's stall limit).

The stall limit is judged on the demo job's clock (`OnJobClock`), as the pages judge it:
its records say ~95 s a step, written every 0.7 s, so its stall passes the limit within
seconds of wall time. The dumps are simulated text in py-spy's format: the file names are
verl's and torch's, the line numbers are not theirs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import orjson

from ..diagnosis.stall import StallLimit
from ..join.ports import WALL, JobClock, JobProcess
from ..settings import Settings
from ..sources.base import Clock, Context
from ..sources.stacks import StackSource
from .job import DemoJob

INTERVAL = 2.0  # seconds between the demo's stall checks (at most): it passes its limit in ~5 s
JOB_ID = "01000000"  # the demo job's Ray job id
DRIVER_TASK = "ffffffffffffffffffffffff" + JOB_ID  # Ray's driver task id for that job
RUN_TASK = "a3c1" + "0" * 20 + JOB_ID  # the TaskRunner's `run`, submitted by the driver
NODES = ("demo0000" * 7, "demo0001" * 7)  # two simulated nodes, 56 hex-like characters
ODD_RANK = 5  # the trainer rank that waits in another collective
PYTHON = "Python v3.11.7 (/usr/bin/python3.11)"


class Simulated(NamedTuple):
    """One simulated process: what the Ray source would list, and its stack's title."""

    role: str
    class_name: str
    name: str
    pid: int
    node_id: str
    task: str  # the Ray task it runs in a stall ("" between tasks)


def _processes() -> tuple[Simulated, ...]:
    out = [Simulated("driver", "TaskRunner", "task_runner", 4100, NODES[0], "TaskRunner.run")]
    out += [
        Simulated("trainer", "worker_class.<locals>.WorkerDict", "", 4200 + i, NODES[i // 4],
                  "WorkerDict.update_actor")
        for i in range(8)
    ]  # fmt: skip
    out += [
        Simulated("rollout", "vLLMHttpServer", f"vllm_server_{i}_0", 4300 + i, NODES[i // 4], "")
        for i in range(8)
    ]
    out += [
        Simulated("agent_loop", "AgentLoopWorker", f"agent_loop_worker_{i}", 4400 + i, NODES[0], "")
        for i in range(4)
    ]
    out.append(Simulated("reward", "RewardLoopWorker", "reward_loop_worker_0", 4500, NODES[1], ""))
    return tuple(out)


PROCESSES = _processes()
BY_PID = {p.pid: p for p in PROCESSES}

# frames, innermost first: py-spy's shape (`func (file:line)`)
MAIN_LOOP = (
    "    Worker.main_loop (ray/_private/worker.py:1069)\n"
    "    <module> (ray/_private/workers/default_worker.py:323)\n"
)
EXECUTOR = (
    "    FunctionActorManager._make_actor_method_executor.<locals>.actor_method_executor "
    "(ray/_private/function_manager.py:740)\n" + MAIN_LOOP
)
GC_THREAD = (
    'Thread {gc} (idle): "PythonGCThread"\n'
    "    Condition.wait (threading.py:327)\n"
    "    Event.wait (threading.py:629)\n"
    "    PythonGCThread.run (ray/_private/gc_collect_manager.py:29)\n"
    "    Thread._bootstrap_inner (threading.py:1045)\n"
    "    Thread._bootstrap (threading.py:1002)\n"
)
RAY_GET = (
    "    Worker.get_objects (ray/_private/worker.py:1007)\n"
    "    get (ray/_private/worker.py:3009)\n"
    "    client_mode_hook.<locals>.decorator.<locals>.wrapper "
    "(ray/_private/client_mode_hook.py:134)\n"
    "    func_generator.<locals>.func (verl/single_controller/ray/base.py:48)\n"
    "    RayPPOTrainer.fit (verl/trainer/ppo/ray_trainer.py:1290)\n"
    "    TaskRunner.run (verl/trainer/main_ppo.py:317)\n"
)
UPDATE = (
    "    DataParallelPPOActor.update_policy (verl/workers/actor/dp_actor.py:455)\n"
    "    ActorRolloutRefWorker.update_actor (verl/workers/fsdp_workers.py:860)\n"
    "    worker_class.<locals>.WorkerDict.update_actor (verl/single_controller/ray/base.py:721)\n"
)
ALL_REDUCE = (
    "    all_reduce (torch/distributed/distributed_c10d.py:2806)\n"
    "    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n"
    "    clip_grad_norm_ (torch/nn/utils/clip_grad.py:106)\n"
    "    DataParallelPPOActor._optimizer_step (verl/workers/actor/dp_actor.py:244)\n" + UPDATE
)
ALL_GATHER = (
    "    all_gather_into_tensor (torch/distributed/distributed_c10d.py:3709)\n"
    "    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n"
    "    gather_outputs_and_unpad (verl/utils/ulysses.py:213)\n"
    "    DataParallelPPOActor._forward_micro_batch (verl/workers/actor/dp_actor.py:178)\n" + UPDATE
)


def dump(p: Simulated, hangs: bool) -> str:
    """py-spy's dump of one simulated process: in the stall (`hangs`) as the module says,
    else waiting between tasks."""
    title = p.task if hangs and p.task else p.class_name.rsplit(".", 1)[-1]
    main = MAIN_LOOP
    if hangs and p.role == "driver":
        main = RAY_GET + EXECUTOR
    elif hangs and p.role == "trainer":
        main = (ALL_GATHER if p.pid - 4200 == ODD_RANK else ALL_REDUCE) + EXECUTOR
    return (
        f"Process {p.pid}: ray::{title}\n{PYTHON}\n\n"
        f'Thread {p.pid} (idle): "MainThread"\n{main}' + GC_THREAD.format(gc=p.pid + 50)
    )


def tasks(hangs: bool) -> bytes:
    """`GET /api/v0/tasks`'s answer: in the stall, the TaskRunner's `run` and the trainer
    ranks' `update_actor` tasks it awaits (RUNNING, on their processes)."""
    rows: list[dict[str, Any]] = []
    if hangs:
        rows.append({"task_id": RUN_TASK, "parent_task_id": DRIVER_TASK, "name": "TaskRunner.run",
                     "state": "RUNNING", "worker_pid": 4100})  # fmt: skip
        rows += [
            {"task_id": f"b{i:03d}" + "0" * 20 + JOB_ID, "parent_task_id": RUN_TASK,
             "name": "WorkerDict.update_actor", "state": "RUNNING", "worker_pid": p.pid}
            for i, p in enumerate(q for q in PROCESSES if q.role == "trainer")
        ]  # fmt: skip
    return orjson.dumps({"result": True, "data": {"result": {"total": len(rows), "result": rows}}})


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        hangs = self.server.job.phase.hangs
        if url.path == "/api/v0/tasks":
            self._send(200, tasks(hangs), "application/json")
        elif url.path == "/worker/traceback":
            pid = (query.get("pid") or [""])[0]
            found = BY_PID.get(int(pid)) if pid.isdigit() else None
            if found is None:  # py-spy's words for a process that is gone
                self._send(500, b"Failed to execute: check that the process is running", "")
            else:
                self._send(200, dump(found, hangs).encode(), "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype or "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the demo's dashboard logs nothing


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, job: DemoJob):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.job = job


class DemoProcesses:
    """The demo job's processes, as the Ray source lists a real job's (`JobProcesses`)."""

    def __init__(self, job: DemoJob):
        self.job = job

    def _ours(self, project: str, experiment: str) -> bool:
        return (project, experiment) == (self.job.project, self.job.experiment)

    def job_processes(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> Sequence[JobProcess]:
        if not self._ours(project, experiment):
            return ()
        return tuple(JobProcess(p.role, p.class_name, p.name, p.pid, p.node_id) for p in PROCESSES)

    def ray_job_id(
        self, project: str, experiment: str, sole: bool = False, job_id: str = ""
    ) -> str:
        return JOB_ID if self._ours(project, experiment) else ""


@dataclass(frozen=True)
class OnJobClock(StallLimit):
    """The stall limit, judged on a job's clock (the demo job's: the pages judge it so)."""

    clock: JobClock = WALL

    def job_stalled_for(self, job: Mapping[str, Any], now: float) -> float | None:
        at, last = self.clock.at, job.get("last_step_time")
        return self.stalled_for(
            None if last is None else at(float(last)),
            at(now),
            job.get("baseline_step_seconds"),
            job.get("between_steps_max"),
        )


class DemoStacks(StackSource):
    """The real stacks source, reading the simulated dashboard for the demo job only."""

    def __init__(
        self,
        job: DemoJob,
        jobs_fns: Sequence[Callable[[], Iterable[Mapping[str, Any]]]],
        limit: StallLimit,
        clock: Clock = time.time,
        **options: Any,
    ):
        self.job = job
        self._server: _Server | None = None  # bound when the source starts

        def demo_job() -> list[Mapping[str, Any]]:
            return [
                j
                for fn in jobs_fns
                for j in fn()
                if (j.get("project"), j.get("experiment")) == (job.project, job.experiment)
            ]

        base = OnJobClock(limit.factor, limit.minimum, job.clock)
        super().__init__(
            "http://127.0.0.1", DemoProcesses(job), [demo_job], base, clock=clock, **options
        )
        self._serving: threading.Thread | None = None

    @classmethod
    def for_job(
        cls,
        job: DemoJob,
        settings: Settings,
        jobs_fns: Sequence[Callable[[], Iterable[Mapping[str, Any]]]],
        context: Context,
    ) -> DemoStacks:
        """`serve --demo`'s stacks source, with the stacks settings (checked every
        INTERVAL at most)."""
        return cls(
            job,
            jobs_fns,
            StallLimit.of(context.thresholds.alerts),
            clock=context.clock,
            interval=min(settings.stacks_interval, INTERVAL),
            every=settings.stacks_every,
            timeout=settings.stacks_timeout,
            max_processes=settings.stacks_max_processes,
            max_frames=settings.stacks_max_frames,
            max_bytes=settings.stacks_max_bytes,
        )

    def describe(self) -> str:
        return "stacks (the demo's simulated Ray dashboard on 127.0.0.1: simulated stacks)"

    def start(self) -> None:
        """Binds the simulated dashboard (an ephemeral port), serves it, then polls."""
        if self._server is None:
            self._server = _Server(self.job)
            host, port = self._server.server_address[:2]
            self.address = f"http://{host!s}:{port}"
            self._serving = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="demo-dashboard",
                daemon=True,
            )
            self._serving.start()
        super().start()

    def close(self) -> None:
        super().close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server, self._serving = None, None
