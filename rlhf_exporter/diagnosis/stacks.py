"""Where a stalled job waits, from `py-spy dump` text of its processes (issue 39). Pure.

`parse(text)` reads py-spy's dump (as Ray's dashboard serves it, `GET /worker/traceback`):

    Process 18481: /usr/bin/python worker.py
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 18481 (idle): "MainThread"
        poll (libc.so.6)                          <- a native frame (--native)
        SocketIO.readinto (socket.py:706)         <- a Python frame, innermost first
        <module> (http_scene.py:5)

`classify(process)` names where one process waits, in the fixed vocabulary `WHERE`, and the
frame that says so; `fold(...)` folds that across each role's processes ("2 of 2 trainer
in collective (all_reduce)"). Only Python frames are shown by default; Ray's `native=1` adds
the C frames under them, which alone tell a `time.sleep`, a socket `recv` or a lock's
acquire from plain user code (without them those read as the user's function, `idle`).

Which thread speaks for a process: the threads running a Ray task (an `actor_method_executor`
or `function_executor` frame); else the main thread when it says something (a job's driver
script); else those running an asyncio loop (an async actor: its coroutines' awaits are on
no thread's stack, so it reads `event_loop`); else the main thread.
Among several, the one whose `where` ranks first in `WHERE`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

WHERE: tuple[str, ...] = (
    "stopped",  # the process is stopped (state T: SIGSTOP, a debugger): py-spy cannot read it
    "checkpoint_save",  # a frame named *save_checkpoint*, or torch.save
    "collective",  # torch.distributed (gloo, NCCL): all_reduce, barrier, broadcast, ...
    "engine_generate",  # a vLLM / SGLang generate call
    "engine_step",  # a vLLM / SGLang engine step (scheduler, model forward)
    "ray_get",  # ray.get: waiting on another task's result
    "ray_wait",  # ray.wait
    "network",  # a socket or HTTP read (a remote service that does not answer)
    "io_read",  # a file or pipe read
    "io_write",  # a file or pipe write
    "lock",  # a lock, condition, event or queue
    "sleep",  # time.sleep / asyncio.sleep
    "event_loop",  # an asyncio loop waiting (an async actor: awaits are on no stack)
    "no_task",  # a Ray worker waiting for its next task
    "running",  # on CPU in code no rule names
    "unknown",  # idle in code no rule names, or no stack
)
"""The fixed vocabulary, most telling first (`rlhf_job_stalled_in{where}`)."""

MEANING: dict[str, tuple[str, str]] = {
    "stopped": (
        "no stack: the process is stopped (state T), and Ray's py-spy, which suspends a "
        "process to read it, refuses a stopped one ('Failed to suspend process')",
        "nothing runs in it until it gets SIGCONT: a `kill -STOP`, a debugger attached, a "
        "frozen cgroup. Find who stopped it, or `kill -CONT` the PID named; the roles waiting "
        "on it are listed after it",
    ),
    "checkpoint_save": (
        "saving a checkpoint (a frame named like verl's `_save_checkpoint`, or `torch.save`)",
        "the checkpoint storage is slow, full or hung (an NFS or object-store mount): check its "
        "free space and throughput; a save slower than the longest seen this run is what paged",
    ),
    "collective": (
        "in a `torch.distributed` collective (NCCL, gloo): `all_reduce`, `barrier`, ...",
        "a peer rank is missing: dead, elsewhere (another collective, a Python error), or its "
        "GPU is lost. The role's odd process out ('1 of N in ...') is the suspect; check the GPU "
        "alerts and the ranks' logs (NCCL_DEBUG=INFO). It ends only at the NCCL timeout",
    ),
    "engine_generate": (
        "in a vLLM / SGLang `generate` call",
        "the rollout engine does not finish requests: its engine core is wedged or died; check "
        "the engine's log and its /metrics (running and waiting requests)",
    ),
    "engine_step": (
        "in the engine core's step (scheduler, model forward)",
        "a forward that does not return: a GPU hang or a tensor-parallel collective inside the "
        "engine; check the GPU alerts and the engine's log",
    ),
    "ray_get": (
        "in `ray.get`: waiting for another task's result",
        "not where it hangs, but who waits: the role it waits on is listed first (the "
        "process's task and caller are named); follow it",
    ),
    "ray_wait": ("in `ray.wait`: waiting for other tasks", "as ray_get: follow the awaited role"),
    "network": (
        "in a socket or HTTP read or connect",
        "a remote service (a reward model server, a sandbox, an API) does not answer: check "
        "it and its client's timeout",
    ),
    "io_read": (
        "in a file or pipe read",
        "data loading from a slow or hung filesystem (NFS, FUSE), or a pipe nobody writes: "
        "check the mount",
    ),
    "io_write": (
        "in a file or pipe write",
        "a full or hung filesystem, or a pipe nobody reads (a logger's consumer died)",
    ),
    "lock": (
        "waiting on a lock, condition, event or queue",
        "another thread of the same process holds it or never signals: a deadlock or a "
        "producer that died; the full stack's other threads tell which",
    ),
    "sleep": (
        "in `time.sleep` / `asyncio.sleep`",
        "a polling loop waiting for something that does not come (a retry, a file, a peer): "
        "the function named says what",
    ),
    "event_loop": (
        "an asyncio loop with nothing ready (an async actor: verl's servers and agent loops)",
        "its coroutines wait, and py-spy shows no coroutine's stack: read the roles it serves "
        "and its log",
    ),
    "no_task": (
        "a Ray worker between tasks",
        "idle, not hanging: it waits for work that someone upstream does not send",
    ),
    "running": (
        "on CPU in the code named",
        "busy: a livelock, a busy wait or a very slow step; compare the next round's stacks "
        "(taken again every stacks_every) to see whether it moves",
    ),
    "unknown": (
        "idle in the code named, which no rule names (or no stack)",
        "usually a C call seen without native frames: the function named is where it waits; "
        "keep stacks_native on",
    ),
}
"""What each `where` means and what to do (docs/runbooks.md#where-it-hangs)."""

RANK = {w: i for i, w in enumerate(WHERE)}
WAITING = frozenset({"ray_get", "ray_wait", "event_loop", "no_task", "unknown"})
"""Waits on other processes, or none: a role in one of these is seldom where the job hangs,
so `fold` puts the roles in any other wait first (the rollout's lock before the driver's
ray.get on it)."""
MAX_THREADS = 256  # threads read per process
MAX_FRAMES = 128  # frames kept per thread (innermost first)
MAX_LINE = 512  # characters of a frame line read


@dataclass(frozen=True)
class Frame:
    func: str
    file: str  # "socket.py:706" for Python frames, "libc.so.6" or "selectmodule.c:1598" for C
    native: bool

    def __str__(self) -> str:
        return f"{self.func} ({self.file})"


@dataclass(frozen=True)
class Thread:
    tid: int
    status: str  # idle, active, active+gil, ...
    name: str
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class Process:
    pid: int
    command: str
    threads: tuple[Thread, ...]


@dataclass(frozen=True)
class Wait:
    """Where one process waits: `where` from WHERE, `detail` the frame that says so and
    the code that called it (short, bounded), `thread` the thread that speaks for it."""

    where: str
    detail: str = ""
    thread: str = ""
    task: str = ""  # the Ray task the process runs, from its title (`ray::Class.method`)


_PROCESS = re.compile(r"Process (\d+): ?(.*)")
_THREAD = re.compile(r'Thread (0x[0-9a-fA-F]+|\d+) \(([\w+-]+)\)(?:: "(.*)")?')
_FRAME = re.compile(r"\s+(\S.*?) \(([^()]*)\)\s*")
_PY_FILE = re.compile(r".*\.py:\d+")


def parse(text: str) -> tuple[Process, ...]:
    """py-spy dump text -> its processes (several with --subprocesses). Never raises: what
    is not py-spy's shape is skipped."""
    processes: list[Process] = []
    pid, command = 0, ""
    threads: list[Thread] = []
    current: tuple[int, str, str] | None = None
    frames: list[Frame] = []

    def close_thread() -> None:
        nonlocal current, frames
        if current is not None and len(threads) < MAX_THREADS:
            threads.append(Thread(current[0], current[1], current[2], tuple(frames)))
        current, frames = None, []

    def close_process() -> None:
        nonlocal threads
        close_thread()
        if threads or pid:
            processes.append(Process(pid, command, tuple(threads)))
        threads = []

    for raw in text.splitlines():
        line = raw[:MAX_LINE]
        m = _PROCESS.fullmatch(line)
        if m:
            close_process()
            pid, command = int(m[1][:12]), m[2][:200]
            continue
        m = _THREAD.fullmatch(line)
        if m:
            close_thread()
            tid = int(m[1], 16) if m[1].startswith("0x") else int(m[1][:20])
            current = (tid, m[2], (m[3] or "")[:80])
            continue
        m = _FRAME.fullmatch(line) if current is not None else None
        if m and len(frames) < MAX_FRAMES:
            where = m[2]
            frames.append(Frame(m[1][:200], where[:200], not _PY_FILE.fullmatch(where)))
    close_process()
    return tuple(processes)


# -- what each frame says ------------------------------------------------------------------

COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "scatter",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "wait",
        "init_process_group",
        "new_group",
    }
)
ENGINE_STEP = frozenset(
    {
        "step",
        "step_with_batch_queue",
        "execute_model",
        "sample_tokens",
        "run_busy_loop",
        "_process_engine_step",
        "event_loop_normal",
        "event_loop_overlap",
        "forward",
        "forward_batch_generation",
        "collective_rpc",
    }
)
ENGINE_IDLE = frozenset({"_process_input_queue", "dequeue"})
"""vLLM v1 waiting for work: the engine core blocks in `_process_input_queue` only while it
has no request (core.py: `while not self.has_work()`), its workers in the shared-memory
queue's `dequeue` for the core's next call (worker_busy_loop). Idle, not stepping."""
_ENGINE_LOOPS = frozenset({"run_busy_loop", "worker_busy_loop"})  # around idle and steps
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Child processes that only serve their parent (a vLLM server's resource tracker waits in
a pipe `read` for its whole life): never the one that speaks for a server."""
_ENGINE_FILE = re.compile(r"(?:.*/)?(?:vllm|sglang|tensorrt_llm)/.*")
_NET_FILES = ("socket.py", "ssl.py", "http/client.py", "urllib3/", "httpx/", "httpcore/")
_NET_NATIVE = ("recv", "recvfrom", "recvmsg", "sock_recv", "sock_recv_into", "sock_connect",
               "sock_accept", "connect", "accept", "accept4", "SSL_read")  # fmt: skip
_LOCK_FUNCS = ("Condition.wait", "Event.wait", "Queue.get", "Queue.put", "Semaphore.acquire",
               "Barrier.wait", "Thread.join", "_wait_for_tstate_lock")  # fmt: skip
_LOCK_NATIVE = ("lock_PyThread_acquire_lock", "PyThread_acquire_lock_timed", "rlock_acquire",
                "pthread_cond_wait", "pthread_mutex_lock", "__futex_abstimed_wait_common")  # fmt: skip
_EXECUTORS = ("actor_method_executor", "function_executor")


def _short(func: str) -> str:
    """`Class.method` -> `method` (py-spy prints qualified names on Python 3.11+)."""
    return func.rsplit(".", 1)[-1]


def _path(frame: Frame) -> str:
    return frame.file.rsplit(":", 1)[0]


def _in(frame: Frame, *parts: str) -> bool:
    path = _path(frame)
    return any(path == p or path.startswith(p) or f"/{p}" in path for p in parts)


def _frame_where(frame: Frame) -> str | None:
    """The WHERE a single frame says, or None."""
    func, short = frame.func, _short(frame.func)
    if frame.native:
        if "gloo::" in func or "nccl" in func.lower() or "c10d::" in func:
            return "collective"
        if func in ("time_sleep", "clock_nanosleep", "nanosleep", "pysleep"):
            return "sleep"
        if func in _NET_NATIVE:
            return "network"
        if func in ("_io_FileIO_readinto", "_io__Buffered_read", "read", "pread64", "readv"):
            return "io_read"
        if func in ("_io_FileIO_write", "_io__Buffered_write", "write", "pwrite64", "writev"):
            return "io_write"
        if func in _LOCK_NATIVE:
            return "lock"
        return None  # an epoll alone is no asyncio loop: gRPC's threads wait in one too
    if "save_checkpoint" in short or (short == "save" and _in(frame, "torch/serialization.py")):
        return "checkpoint_save"
    if _in(frame, "torch/distributed/") and short in COLLECTIVES:
        return "collective"
    if _ENGINE_FILE.fullmatch(_path(frame)):
        if "generate" in short:
            return "engine_generate"
        if short in ENGINE_STEP:
            return "engine_step"
    if _in(frame, "ray/_private/worker.py"):
        if short in ("get", "get_objects"):
            return "ray_get"
        if short == "wait":
            return "ray_wait"
        if short == "main_loop":
            return "no_task"
    if _in(frame, *_NET_FILES):
        return "network"
    if func in _LOCK_FUNCS and _in(frame, "threading.py", "queue.py"):
        return "lock"
    if short == "sleep" and _in(frame, "asyncio/tasks.py"):
        return "sleep"
    if short in ("_run_once", "run_forever") and _in(frame, "asyncio/base_events.py"):
        return "event_loop"
    return None


_LIBRARY = re.compile(
    r"(?:.*/)?(?:ray|asyncio|threading\.py|queue\.py|selectors\.py|socket\.py|ssl\.py"
    r"|concurrent|http|urllib|urllib3|requests|torch|<frozen [^>]*>)(?:/|:|$).*"
)


def _caller(frames: Sequence[Frame], start: int) -> Frame | None:
    """The first Python frame outward of `start` that is no library's: the code that waits."""
    for frame in frames[start + 1 :]:
        if not frame.native and not _LIBRARY.fullmatch(frame.file):
            return frame
    return None


def classify_thread(thread: Thread) -> Wait:
    """Where one thread waits: the most telling WHERE any of its frames says."""
    best: tuple[int, int] | None = None  # (rank, frame index)
    shorts = {_short(f.func) for f in thread.frames if not f.native}
    if "main_loop" in shorts and not shorts & set(_EXECUTORS):
        return Wait("no_task", "", thread.name)  # a Ray worker between tasks
    idle = _engine_idle(thread)
    if idle is not None:
        return Wait("no_task", f"engine idle, waiting for work: {_at(idle)}"[:200], thread.name)
    for i, frame in enumerate(thread.frames):
        where = _frame_where(frame)
        if where == "no_task":
            continue
        if where is not None and (best is None or RANK[where] < best[0]):
            best = (RANK[where], i)
    if best is None:
        active = thread.status.startswith("active")
        first = next((f for f in thread.frames if not f.native), None)
        return Wait("running" if active else "unknown", _at(first) if first else "", thread.name)
    where, i = WHERE[best[0]], best[1]
    frames = thread.frames
    # the outermost frame of the same wait names it (Queue.get over Condition.wait); a
    # native frame says how, the Python frame above it what
    while i + 1 < len(frames) and (frames[i].native or _frame_where(frames[i + 1]) == where):
        if frames[i].native and _frame_where(frames[i + 1]) not in (None, where):
            break
        i += 1
        if not frames[i].native and _frame_where(frames[i]) != where:
            break
    named = frames[i]
    if named.native or _LIBRARY.fullmatch(named.file):
        caller = _caller(frames, i)
        detail = _CALLS.get(where, named.func)
        if caller is not None:
            detail += f" in {_at(caller)}"
    else:
        detail = _at(named)
    return Wait(where, detail[:200], thread.name)


_CALLS = {"ray_get": "ray.get", "ray_wait": "ray.wait"}


def _engine_idle(thread: Thread) -> Frame | None:
    """The frame of a vLLM engine core or worker waiting for work (ENGINE_IDLE), when no
    frame of the thread is in an engine step or generate (the core's `collective_rpc` also
    waits in a `dequeue`: for its workers' answers, inside a step)."""
    idle = None
    for frame in thread.frames:
        if frame.native or not _ENGINE_FILE.fullmatch(_path(frame)):
            continue
        short = _short(frame.func)
        if short in ENGINE_IDLE and idle is None:
            idle = frame
        elif short not in _ENGINE_LOOPS and _frame_where(frame) in ENGINE_WAITS:
            return None
    return idle


ENGINE_WAITS = frozenset({"engine_step", "engine_generate"})


def _at(frame: Frame) -> str:
    return f"{frame.func} ({frame.file.rsplit('/', 1)[-1]})"


def _speakers(process: Process) -> list[Thread]:
    """The threads that say what the process does (see the module's doc)."""
    running = [t for t in process.threads if any(_short(f.func) in _EXECUTORS for f in t.frames)]
    if running:
        return running
    main = [t for t in process.threads if t.name == "MainThread" or t.tid == process.pid]
    if main and classify_thread(main[0]).where not in ("no_task", "unknown"):
        return main  # a driver's script, or a process that is no Ray worker
    loops = [t for t in process.threads if classify_thread(t).where == "event_loop"]
    return loops or main or list(process.threads[:1])


def classify(processes: Sequence[Process]) -> Wait:
    """Where one actor's process waits (with its children, when py-spy read them too: a
    vLLM server's engine core is a child process)."""
    served = [p for p in processes if not any(h in p.command for h in _HELPERS)]
    waits = [(classify_thread(t), p) for p in served or processes for t in _speakers(p)]
    if not waits:
        return Wait("unknown", "no thread in the stack")
    # the most telling wait; among equals, one that says more (an idle engine's frame)
    wait, process = min(waits, key=lambda wp: (RANK[wp[0].where], not wp[0].detail))
    title = process.command
    task = title[5:].split(" ", 1)[0] if title.startswith("ray::") else ""
    return replace(wait, task=task if "." in task else "")


def awaited(
    tasks: Iterable[tuple[int, str, str, str]], driver_pids: Iterable[int] = ()
) -> dict[int, tuple[str, ...]]:
    """pid -> the names of the Ray tasks it waits on, from Ray's unfinished tasks (worker
    pid: the process it runs on, 0 when it does not run yet; task id, parent task id,
    name): a task's children are what its `ray.get` awaits. A driver runs no task: its
    children are the tasks whose parent is the job's root, a task id of f's but for the job
    id's 8 hex digits. An actor's creation task is f's too, but 16, then the actor's id: it
    parents what the actor's own threads submit (Ray #32157), which no driver awaits (the
    real verl job's vLLMHttpServer.collective_rpc)."""
    by_pid: dict[int, str] = {}
    children: dict[str, set[str]] = {}
    roots: set[str] = set()
    for pid, task, parent, name in tasks:
        if pid > 0:
            by_pid.setdefault(pid, task)
        children.setdefault(parent, set()).add(name[:120])
        if _is_driver_task(parent):
            roots.add(name[:120])
    out = {pid: tuple(sorted(children.get(task, ())))[:3] for pid, task in by_pid.items()}
    for pid in driver_pids:
        out[pid] = tuple(sorted(roots))[:3]
    return {pid: names for pid, names in out.items() if names}


def _is_driver_task(task_id: str) -> bool:
    """Ray's driver task id: f's, then the 4-byte job id (TaskID::ForDriverTask); not Ray's
    nil task id (all f's: the nil job id too), which no driver task has."""
    return len(task_id) > 8 and task_id[:-8].strip("f") == "" and task_id[-8:] != "ffffffff"


def on(wait: Wait, names: Sequence[str]) -> Wait:
    """A ray_get / ray_wait named with what it waits on."""
    if wait.where not in ("ray_get", "ray_wait") or not names:
        return wait
    return replace(wait, detail=f"{wait.detail} on {', '.join(names)}"[:240])


# -- folded across a role's processes ------------------------------------------------------


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
