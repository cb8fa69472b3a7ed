"""Where a stalled job waits, from `py-spy dump` text of its processes. Pure.

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

The reading is in stack_dump.py, the vocabulary in stack_vocabulary.py, the folding and the
round in stack_rounds.py; this module classifies, and is what the others import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from .stack_dump import MAX_FRAMES, MAX_LINE, MAX_THREADS, Frame, Process, Thread, parse
from .stack_rounds import Group, ProcessStack, RoleFold, Seen, StackRound, answer, fold
from .stack_vocabulary import MEANING, RANK, WAITING, WHERE, Wait

__all__ = [
    "MAX_FRAMES",
    "MAX_LINE",
    "MAX_THREADS",
    "MEANING",
    "RANK",
    "WAITING",
    "WHERE",
    "Frame",
    "Group",
    "Process",
    "ProcessStack",
    "RoleFold",
    "Seen",
    "StackRound",
    "Thread",
    "Wait",
    "answer",
    "awaited",
    "classify",
    "classify_thread",
    "fold",
    "on",
    "parse",
]

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
    parents what the actor's own threads submit (a Ray behaviour), which no driver awaits (the
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
