"""Where a stalled job's process waits, in a fixed vocabulary (`WHERE`), what each place
means and what to do about it (`MEANING`), and one process's `Wait`. Pure."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Wait:
    """Where one process waits: `where` from WHERE, `detail` the frame that says so and
    the code that called it (short, bounded), `thread` the thread that speaks for it."""

    where: str
    detail: str = ""
    thread: str = ""
    task: str = ""  # the Ray task the process runs, from its title (`ray::Class.method`)
