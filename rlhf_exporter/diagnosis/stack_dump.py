"""py-spy's dump text (as Ray's dashboard serves it) read into processes, threads and frames,
bounded (rlhf_exporter/diagnosis/stacks.py shows the shape). Pure; never raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_THREADS = 256  # threads read per process
MAX_FRAMES = 128  # frames kept per thread (innermost first)
MAX_LINE = 512  # characters of a frame line read


@dataclass(frozen=True)
class Frame:
    func: str
    file: str  # a Python frame's "file.py:line"; a C frame's library or "file.c:line"
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
