"""What the console source keeps per stream and per Ray job (sources/console.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..job.state import Job
from ..join.ports import Labels, TrainerActor
from ..lifecycle import RayFact
from .console_join import StepJoiner
from .console_reader import ConsoleReader
from .framework_console import FrameworkConsoleReader
from .log_stream import LogStream, wait_readable

DRAIN = 5.0  # seconds a gone actor's stream is still read while it brings bytes
CAUGHT_UP_WAIT = 0.2  # seconds a stream that brought bytes then none is waited on, at most
EMPTY_AFTER = 2.0  # seconds a new stream that brought nothing takes for an empty file


@dataclass
class Tail:
    """One stream, as far as it was read: a trainer actor's stdout, or a job's driver log
    (`driver`: its `actor` is the submission, with no actor id)."""

    actor: TrainerActor
    reader: ConsoleReader | FrameworkConsoleReader  # verl's, or another framework's
    stream: LogStream | None = None  # while connected
    delivered: int = 0  # bytes read over every connection (skipped after a reconnect)
    retry_at: float = 0.0  # monotonic: when a failed stream may be opened again
    failures: int = 0
    caught_up: bool = False  # read to its end once (what came before is exported)
    opened_at: float = 0.0  # monotonic: when its stream was last opened
    got_any: bool = False  # its stream brought bytes since it was opened
    empty: bool = False  # its last read brought nothing
    gone_at: float | None = None  # monotonic: when Ray stopped listing the actor ALIVE
    heard_at: float = 0.0  # monotonic: when its stream last brought bytes
    last_bytes: bytes = b""  # its last TAIL_KEEP bytes read
    checked_at: float = 0.0  # monotonic: when the file's last line was last compared
    suspect: bool = False  # that comparison found the file ending otherwise
    driver: bool = False  # the job's driver log, not an actor's stdout
    log_file: dict[str, str] = field(default_factory=dict)  # a driver log's query (node, file)
    finished: bool = False  # read to its end for good: its reader's held steps came out


@dataclass
class ConsoleJob:
    """One Ray job's streams and the `Job` their printed steps feed."""

    job_id: str  # the Ray job id (a submission id until its driver connects to Ray)
    submission_id: str
    named: Labels | None
    tails: dict[str, Tail] = field(default_factory=dict)
    job: Job | None = None
    yielded: bool = False  # a verl file holds its name: the file source reads it
    ended_at: float | None = None  # wall time every tail was gone
    last_change: float = 0.0  # wall time of its last record
    joiner: StepJoiner | None = None  # a framework printing each step in halves
    driver_fact: RayFact | None = None  # its submission's state, from the driver list


def drained(tail: Tail, mono: float) -> bool:
    """A gone stream that has brought nothing for DRAIN seconds is read to its end."""
    return tail.gone_at is not None and mono - max(tail.heard_at, tail.gone_at) > DRAIN


def close(tail: Tail) -> None:
    if tail.stream is not None:
        tail.stream.close()
        tail.stream = None


def settle(tails: list[Tail], mono: float) -> None:
    """Which backlogs are read: Ray sends a backlog without a pause, and a followed file in
    bursts (it looks again every second). So a stream that brought bytes, then nothing for
    CAUGHT_UP_WAIT more, has caught up (and one that has brought nothing for EMPTY_AFTER
    since it opened: an empty file); its job is exported from then on."""
    waiting = [t for t in tails if t.stream is not None and not t.caught_up and t.empty]
    for t in waiting:
        if not t.got_any and mono - t.opened_at >= EMPTY_AFTER:
            t.caught_up = True
    heard = [t for t in waiting if t.got_any and t.stream is not None]
    if heard:
        ready = wait_readable([t.stream for t in heard if t.stream], CAUGHT_UP_WAIT)
        for t in heard:
            t.caught_up = id(t.stream) not in ready


def quiet(tail: Tail, mono: float, stale_after: float) -> bool:
    """A followed stream that brought nothing for `stale_after`, not compared lately."""
    return (
        tail.stream is not None and tail.caught_up and tail.gone_at is None
        and tail.delivered > 0 and mono - tail.heard_at >= stale_after
        and mono - tail.checked_at >= stale_after / 2
    )  # fmt: skip
