"""The `verl` source: tails verl's `file`-logger JSONL files and diagnoses every step.

- `--verl-root DIR` watches verl's layout `DIR/<project>/<experiment>.jsonl`; jobs that
  appear later are found on the next poll. `--verl-file PATH` watches one file.
- Each file is read from its start and followed. A complete line is ingested once; a
  half-written last line waits for its newline.
- A file that shrinks, changes inode, whose first line changes (a fingerprint of it, up to
  `HEAD_BYTES`) or whose last bytes read change (the `TAIL_BYTES` before the read offset)
  was truncated or replaced (verl truncates on every start and resume): it is read again
  from 0 as a new run of the same job. The job's counters carry on. The two fingerprints
  catch a rewrite that kept the first bytes and grew past the old size between two polls.
- `rlhf_last_step_timestamp_seconds` is the file's modification time when its records were
  read, so an exporter restart that re-reads an old file does not make a stalled job look
  fresh.
- Labels come from directory and file names; a name that is not valid UTF-8 or holds a
  control character has those replaced by U+FFFD (`label_not_utf8`, `label_control_char`).
- A file job always wins its name: a pushed job of the same name is dropped when the file
  appears, and later pushes of it get 409.
- Problems (deleted, unreadable, not a regular file, bad lines) are counted in
  `rlhf_exporter_record_errors_total{collector="verl",reason}` once per occurrence and
  logged once, never once per poll.
- Work per poll is bounded: at most `file_budget` bytes per file and `poll_budget` bytes in
  all, so a huge backlog or a 50 MiB line is read over several polls without stalling.
- A job whose file has not changed for `job_expiry` seconds is no longer exported.
- The root is walked entry by entry: a project folder that is a looping symlink
  (`symlink_loop`), unreadable (`permission_denied`) or that vanishes mid-walk is skipped
  (counted and logged once), never the whole root. A folder whose listing has not changed
  (inode and mtime) is not listed again (but every `RELIST_EVERY` seconds), so files
  ignored beyond `max_files` (or as duplicates) cost one stat of their folder per poll; at
  most `max_files` folders are remembered.
- A `--verl-root` that is missing, not a directory or unreadable (a mis-mounted volume)
  makes the collector down (`rlhf_exporter_collector_up{collector="verl"} 0`), its reason
  counted once per occurrence in `rlhf_exporter_collector_errors_total`; jobs read from the
  other roots and files are still exported. So does a `--verl-file` that is missing, deleted,
  unreadable or not a file (`file_missing`, ...): `/` shows the collector down with the
  reason, until the file can be read (a sidecar started long before verl creates its file
  is down until then, and RLHFExporterCollectorDown fires after 5 minutes of it).
- Set-up mistakes are named (rlhf_exporter/sources/verl_layout.py): a root that cannot be
  listed, `.jsonl` files directly in a root or two levels down, a file none of whose lines is
  a verl record. Each is a `Problem` in the snapshot (`/`, `/api/v1/status`), logged once
  when it appears and once when it clears.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..diagnosis import Thresholds
from ..job.cleaning import clean_label
from ..job.limits import DEFAULT_LIMITS, MAX_STEP, Limits, limits_from_settings
from ..join.names import JobNames
from ..join.ports import WALL, Engines, JobClock, JobFacts, StepWindows
from ..metrics.snapshot import Sample
from ..settings import Settings
from . import verl_layout
from .base import Clock, Context, PollingSource, PollResult, Problems
from .event_tail import EventTail, holds_events
from .file_records import FileRecordReader
from .job_maker import JobMaker
from .small_file import SmallFileError, read_small
from .tensorboard_reader import TensorBoardReader
from .verl_layout import (
    FILES_IN_ROOT,
    FILES_TOO_DEEP,
    ROOT_MISSING,
    ROOT_NOT_A_DIRECTORY,
    ROOT_PERMISSION_DENIED,
)
from .verl_tail import (
    CHUNK,
    FILE_DELETED,
    FILE_MISSING,
    NOT_A_FILE,
    PERMISSION_DENIED,
    READ_FAILED,
    FileTail,
    Watched,
    shown,
)

log = logging.getLogger(__name__)

NAME = "verl"
SUFFIX = ".jsonl"
MAX_FILES = 5000
RACY_NS = 2_000_000_000  # a folder modified this recently is listed again (mtime granularity)
RELIST_EVERY = 60.0  # seconds: every folder is listed again anyway (a network filesystem's
# cached directory mtime may lag)

# collector_errors reasons: a configured root is not there (ROOT_MISSING,
# ROOT_NOT_A_DIRECTORY, ROOT_PERMISSION_DENIED: from verl_layout, which words them), or
# READ_FAILED (verl_tail's)
# a configured --verl-file with one of these problems makes the collector down (its reason)
FILE_DOWN = frozenset({FILE_MISSING, FILE_DELETED, PERMISSION_DENIED, NOT_A_FILE})
DUPLICATE_JOB = "duplicate_job"
TOO_MANY_FILES = "too_many_files"
INTERNAL_ERROR = "internal_error"
BAD_NAME = "bad_name"  # a file named `.jsonl`, `..jsonl` or `...jsonl`
SYMLINK_LOOP = "symlink_loop"  # a project folder that is a looping symlink
BAD_TOTAL_STEPS = "bad_total_steps"  # record_errors: a .total_steps file that is no integer
# (or no small regular file: a FIFO, a symlink to /dev/zero, more than 32 bytes)
FINISHED_SUFFIX = ".finished"  # <experiment>.finished beside the log: the job finished
TOTAL_STEPS_SUFFIX = ".total_steps"  # <experiment>.total_steps: its total steps
MARKER_EVERY = 15.0  # seconds between two reads of an idle job's marker files


def labels_from_path(path: Path) -> tuple[str, str]:
    """verl's layout: <root>/<project>/<experiment>.jsonl."""
    name = path.name
    experiment = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    return path.parent.name or "default", experiment


class VerlFileSource(PollingSource, JobMaker):
    def __init__(
        self,
        th: Thresholds,
        roots: Sequence[str | Path] = (),
        files: Sequence[tuple[str | Path, str | None, str | None]] = (),
        interval: float = 1.0,
        job_expiry: float = 86400.0,
        max_line: int = 1 << 20,
        file_budget: int = 8 << 20,
        poll_budget: int = 64 << 20,
        limits: Limits = DEFAULT_LIMITS,
        max_files: int = MAX_FILES,
        clock: Clock = time.time,
        total_steps: int | None = None,
        windows: StepWindows | None = None,
        engines: Engines | None = None,
        facts: JobFacts | None = None,
        names: JobNames | None = None,
        job_clock: JobClock = WALL,
        job_clock_roots: Sequence[str | Path] = (),
    ):
        super().__init__(NAME, interval, wall=clock)
        self.clock = clock
        # the jobs under `job_clock_roots` (the demo's root) place their steps on `job_clock`
        # (the demo job's clock), every other job on the wall clock
        self.job_clock = job_clock
        self.job_clock_roots = [Path(r) for r in job_clock_roots]
        self.total_steps = total_steps
        self.windows = windows  # where its jobs post step timelines (the WindowBoard)
        self.engines = engines  # what its jobs ask for engine evidence (the engine source)
        self.facts = facts  # what Ray says about a job (RaySource.job_fact), when Ray is read
        self.names = names  # a file job takes its name from a pushed one (the push source)
        self.th = th
        self.roots = [Path(r) for r in roots]
        self.files = [(Path(p), proj, exp) for p, proj, exp in files]
        self.job_expiry = job_expiry
        self.max_line = max_line
        self.limits = limits
        self.max_files = max_files
        self.file_budget = max(file_budget, CHUNK)
        self.poll_budget = max(poll_budget, self.file_budget)
        self._watched: dict[Path, Watched] = {}
        self._known: set[str] = set()  # str(path) of every watched file, for discovery
        self._jobs: dict[tuple[str, str], Path] = {}
        self._rejected: Counter[str] = Counter()  # record errors by reason, all files, ever
        self._root_problems: dict[Path, str] = {}
        # set-up mistakes shown on `/` and in /api/v1/status, each logged once (verl_layout)
        self._problems = Problems(NAME)
        self._tail = FileTail(self._rejected, self._problems)  # reads what is new in a file
        self._events = EventTail(self._rejected)  # an event directory's new steps
        self._layout_at: dict[Path, float] = {}  # root -> monotonic time of its next deep look
        self._folder_problems: dict[str, str] = {}  # project folder -> reason (logged once)
        # project folder -> (st_dev, st_ino, st_mtime_ns) of its last full listing
        self._folders: dict[str, tuple[int, int, int]] = {}
        self._relist_at = 0.0  # monotonic time of the next listing of every folder
        self._rotate = 0
        self._summaries: tuple[dict[str, Any], ...] = ()
        self._parts: tuple[Sequence[Sample], ...] = ()  # each exported job's samples
        self._rest: tuple[Sample, ...] = ()  # the source's own samples (rlhf_exporter_jobs)
        # path -> (the job's samples when summarised, its summary): rebuilt when they change
        self._summary_of: dict[Path, tuple[Sequence[Sample], dict[str, Any]]] = {}
        self.stats: Counter[str] = Counter()  # summaries_built
        self._duplicates: set[tuple[str, str]] = set()
        self._broken: set[tuple[str, str]] = set()  # jobs whose samples() raised (logged)

    # -- discovery ------------------------------------------------------------------------
    def _discover(self) -> None:
        for path, project, experiment in self.files:
            if path not in self._watched:
                p, e = labels_from_path(path)
                self._watch(path, project or p, experiment or e)
        if time.monotonic() >= self._relist_at:
            self._relist_at = time.monotonic() + RELIST_EVERY
            self._folders.clear()
        for root in self.roots:
            try:
                entries = list(os.scandir(root))
            except OSError as exc:
                self._root_problem(root, exc)
                continue
            if self._root_problems.pop(root, None) is not None:
                self._problems.clear(f"root {root}", "it can be listed")
            stray, example = 0, ""  # `.jsonl` files directly in the root: read by no one
            folders: list[str] = []
            for entry in entries:  # one entry's problem never stops the walk
                try:
                    if not entry.is_dir():  # follows a symlink: a loop raises ELOOP
                        if entry.name.endswith(SUFFIX):
                            stray, example = stray + 1, example or entry.name
                        continue
                    folders.append(entry.path)
                    self._scan_folder(entry)
                except OSError as exc:  # a loop, an unreadable or vanished folder
                    self._folder_problem(entry.path, exc)
            self._check_layout(root, stray, example, folders)

    def _check_layout(self, root: Path, stray: int, example: str, folders: list[str]) -> None:
        """Name a root one level off (verl_layout): `.jsonl` files directly in it (counted
        during the walk), or, while it shows no job, two levels down (looked for at most
        every RELIST_EVERY seconds, through at most `max_files` entries)."""
        key = f"shallow {root}"
        if stray:
            self._problems.set(
                key, FILES_IN_ROOT, *verl_layout.files_in_root_text(root, stray, example)
            )
        else:
            self._problems.clear(key, "no .jsonl file directly in the root")
        key = f"deep {root}"
        listed = key in self._problems
        now = time.monotonic()
        if not listed and now < self._layout_at.get(root, 0.0):
            return
        prefix = os.path.join(str(root), "")
        if any(w.spath.startswith(prefix) for w in self._watched.values()):
            self._problems.clear(key, "a job was found at the right depth")
            return
        if now < self._layout_at.get(root, 0.0):
            return
        self._layout_at[root] = now + RELIST_EVERY
        found = verl_layout.too_deep(folders, self.max_files)
        if found is None:
            self._problems.clear(key, "no .jsonl file two levels down")
        else:
            self._problems.set(key, FILES_TOO_DEEP, *verl_layout.too_deep_text(root, *found))

    def _scan_folder(self, folder: os.DirEntry[str]) -> None:
        """Watch the folder's new `*.jsonl` files. A folder whose listing is unchanged since
        its last full scan (same inode and modification time, and that time not within
        `RACY_NS` of the scan, when a change in the same clock tick could hide) is not
        listed again: ignored files (beyond `max_files`, duplicates) cost nothing per poll."""
        st = os.stat(folder.path)
        mark = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if self._folders.get(folder.path) == mark:
            self.stats["folders_unchanged"] += 1
            return
        scanned_at = time.time_ns()
        entries = list(os.scandir(folder.path))
        self.stats["folders_listed"] += 1
        if self._folder_problems.pop(folder.path, None) is not None:
            log.info("%s is readable again", shown(folder.path), extra={"path": shown(folder.path)})
        known = self._known
        for entry in entries:  # no Path made for the files already watched
            if entry.path in known:
                continue
            if entry.name.endswith(SUFFIX) or _event_dir(entry):
                if len(self._watched) >= self.max_files and TOO_MANY_FILES in self._rejected:
                    break  # full, and said so: the rest is not examined
                path = Path(entry.path)
                if path not in self._watched:
                    events = not entry.name.endswith(SUFFIX)
                    name = entry.name if events else entry.name[: -len(SUFFIX)]
                    self._watch(path, folder.name, name, events)
        if st.st_mtime_ns < scanned_at - RACY_NS:
            if len(self._folders) >= self.max_files:  # bounded: forget, list again
                self._folders.clear()
            self._folders[folder.path] = mark

    def _folder_problem(self, path: str, exc: OSError) -> None:
        """A project folder that cannot be listed: counted and logged once per folder and
        reason (at most `max_files` folders remembered); the other folders are walked."""
        self._folders.pop(path, None)
        if isinstance(exc, FileNotFoundError):
            return  # removed during the walk: nothing to watch
        if isinstance(exc, PermissionError):
            reason = PERMISSION_DENIED
        elif exc.errno == errno.ELOOP:
            reason = SYMLINK_LOOP
        else:
            reason = READ_FAILED
        if self._folder_problems.get(path) == reason:
            return
        if len(self._folder_problems) >= self.max_files:
            self._folder_problems.clear()
        self._folder_problems[path] = reason
        self._rejected[reason] += 1
        log.warning(
            "cannot list %s: %s (skipped; the rest of the root is walked)",
            shown(path),
            exc.strerror or exc,
            extra={"path": shown(path), "reason": reason},
        )

    def _root_problem(self, root: Path, exc: OSError) -> None:
        if isinstance(exc, PermissionError):
            reason = ROOT_PERMISSION_DENIED
        elif isinstance(exc, NotADirectoryError):
            reason = ROOT_NOT_A_DIRECTORY
        else:
            reason = ROOT_MISSING
        if self._root_problems.get(root) != reason:
            self._root_problems[root] = reason
            for key in (f"shallow {root}", f"deep {root}"):
                self._problems.clear(key, "the root cannot be listed")
            uid = os.geteuid() if hasattr(os, "geteuid") else None
            self._problems.set(f"root {root}", reason, *verl_layout.root_text(root, reason, uid))

    def _job_clock_of(self, path: Path) -> JobClock:
        if any(path.is_relative_to(root) for root in self.job_clock_roots):
            return self.job_clock
        return WALL

    def _watch(self, path: Path, project: str, experiment: str, events: bool = False) -> None:
        project, bad_p = clean_label(project)
        experiment, bad_e = clean_label(experiment)
        if experiment in (".", "..", ""):  # `..jsonl`: its job page's link would resolve
            if BAD_NAME not in self._rejected:  # elsewhere: not watched, counted once
                self._rejected[BAD_NAME] += 1
                log.warning(
                    "%s: a file named %r.jsonl is not watched (name it after the experiment)",
                    shown(path),
                    experiment,
                    extra={"path": shown(path), "reason": BAD_NAME},
                )
            return
        key = (project, experiment)
        if key in self._jobs:
            if key not in self._duplicates:
                self._duplicates.add(key)
                self._rejected[DUPLICATE_JOB] += 1
                log.warning(
                    "%s: project=%s experiment=%s is already read from %s; ignoring this file",
                    shown(path),
                    project,
                    experiment,
                    shown(self._jobs[key]),
                    extra={"path": shown(path), "reason": DUPLICATE_JOB},
                )
            return
        if len(self._watched) >= self.max_files:
            if TOO_MANY_FILES not in self._rejected:
                self._rejected[TOO_MANY_FILES] += 1
                log.warning(
                    "watching %d files already; ignoring %s and any further files",
                    self.max_files,
                    shown(path),
                    extra={"path": shown(path), "reason": TOO_MANY_FILES},
                )
            return
        bad = bad_p or bad_e
        if bad:
            self._rejected[bad] += 1
            log.warning(
                "%s: directory or file name is not valid UTF-8 or holds a control character; "
                "exported as %r/%r",
                shown(path),
                project,
                experiment,
                extra={"path": shown(path), "reason": bad},
            )
        self._jobs[key] = path
        if self.names is not None and self.names.take(project, experiment):
            log.warning(
                "%s: project=%s experiment=%s was a pushed job; the file wins its name "
                "(later pushes of it get 409)",
                shown(path),
                project,
                experiment,
                extra={"path": shown(path), "reason": "job_conflict"},
            )
        self._known.add(str(path))
        self._watched[path] = Watched(
            path,
            project,
            experiment,
            self.new_job(project, experiment, self._job_clock_of(path)),
            FileRecordReader(self.max_line),
            events=TensorBoardReader(path) if events else None,
        )
        log.info(
            "watching verl job %s/%s in %s",
            project,
            experiment,
            shown(path),
            extra={"project": project, "experiment": experiment, "path": shown(path)},
        )

    def poll(self) -> PollResult:
        now = self.clock()
        self._discover()
        watched = list(self._watched.values())
        if watched:  # start where the last poll's budget ran out, so no file starves
            k = self._rotate % len(watched)
            watched = watched[k:] + watched[:k]
        left = self.poll_budget
        for i, w in enumerate(watched):
            if left <= 0:
                self._rotate += i
                break
            try:
                if w.events is not None:
                    self._events.read(w, now)
                    continue
                left -= self._tail.read(w, min(self.file_budget, left), now)
            except Exception:  # never lets one file stop the others
                self._tail.file_problem(w, INTERNAL_ERROR, "reading failed unexpectedly (a bug)")
                log.debug("internal error reading %s", shown(w.path), exc_info=True)
        parts: list[Sequence[Sample]] = []
        summaries: list[dict[str, Any]] = []
        cached = self._summary_of
        self._summary_of = {}
        for w in list(self._watched.values()):
            self._rejected.update(w.job.take_drops())  # what its records' cleaning dropped
            if now - w.last_change > self.job_expiry:
                if w.problem in (FILE_DELETED, FILE_MISSING) and w.identity is not None:
                    self._forget(w)
                continue
            if w.job.records == 0 and w.identity is None:
                continue  # never read anything: nothing to export yet
            if w.backlog:
                # a log larger than one poll's budget (an exporter (re)start on a big log) is
                # exported once read to its end: a counter never shows a partial history,
                # which Prometheus would take for a reset and count again
                self.stats["backlog_hidden"] += 1
                continue
            try:
                self._job_state(w, now, sole=len(self._watched) == 1)
                w.job.tick(now)  # a held step complete without a new record (its S, an end)
                w.job.set_framework(w.framework)
                part = w.job.samples()
            except Exception:  # never lets one job remove the others' series
                if w.job.labels not in self._broken:
                    self._broken.add(w.job.labels)
                    self._rejected[INTERNAL_ERROR] += 1
                    log.error("%s: building its series failed (a bug); not exported",
                              shown(w.path), exc_info=True,
                              extra={"path": shown(w.path), "reason": INTERNAL_ERROR})  # fmt: skip
                continue
            parts.append(part)
            # a job's summary changes only with its samples (the same tuple while unchanged)
            hit = cached.get(w.path)
            if hit is None or hit[0] is not part:
                self.stats["summaries_built"] += 1
                hit = (part, {**w.job.summary(), "source": shown(w.path), "framework": w.framework})
            self._summary_of[w.path] = hit
            summaries.append(hit[1])
        if not (len(parts) == len(self._parts) and all(a is b for a, b in zip(parts, self._parts))):
            # something changed: a new parts tuple (an unchanged one lets scrapes reuse bytes);
            # the jobs' samples are referenced, never copied into one flat tuple
            self._parts = tuple(parts)
            jobs = Sample("rlhf_exporter_jobs", (NAME,), float(len(parts)))
            self._rest = (jobs,)
            self._summaries = tuple(summaries)
        down = next((self._root_problems[r] for r in self.roots if r in self._root_problems), None)
        if down is None:  # a configured --verl-file that cannot be read: down, with its reason
            configured = (self._watched.get(path) for path, _, _ in self.files)
            down = next(
                (c.problem for c in configured if c is not None and c.problem in FILE_DOWN), None
            )
        return PollResult(
            self._rest,
            self._tail.records + self._events.records,
            dict(self._rejected),
            down,
            self._parts,
            self._problems.current(),
        )

    def _job_state(self, w: Watched, now: float, sole: bool) -> None:
        """Feed the job what decides its state besides its records: Ray's facts, and the
        files a user may put beside its log without code (read while the log is idle, at
        most every MARKER_EVERY seconds): `<experiment>.finished` (any content) declares it
        finished, `<experiment>.total_steps` (an integer) gives its total steps."""
        if self.facts is not None:
            w.job.set_ray(self.facts.job_fact(w.project, w.experiment, sole))
        self._rejected.update(w.job.take_drops())  # with the ends it outgrew
        if now - w.last_change < self.interval or now - w.markers_at < MARKER_EVERY:
            return
        w.markers_at = now
        stem = w.path.with_name(w.path.name.removesuffix(SUFFIX))
        w.job.set_finished_file(*_finished_file(str(stem) + FINISHED_SUFFIX))
        total = self.total_steps
        try:  # non-blocking, a regular file, 32 bytes at most: a FIFO cannot hang the poll
            text = read_small(str(stem) + TOTAL_STEPS_SUFFIX, 32).strip()
            if text.isdigit() and 0 < int(text) <= MAX_STEP:
                total = int(text)
            else:
                self._rejected[BAD_TOTAL_STEPS] += 1
        except SmallFileError:
            self._rejected[BAD_TOTAL_STEPS] += 1
        except OSError:
            pass
        w.job.set_total_steps(total)

    def _forget(self, w: Watched) -> None:
        """A deleted file's job expired: stop tracking it (a new file starts afresh)."""
        self._watched.pop(w.path, None)
        self._known.discard(str(w.path))
        self._problems.clear(f"file {w.spath}", "its job expired")
        self._folders.clear()  # a file ignored at the cap, or a duplicate, may now be watched
        if self._jobs.pop((w.project, w.experiment), None) is not None and self.names:
            self.names.release(w.project, w.experiment)

    def has_job(self, project: str, experiment: str) -> bool:
        """Whether a file of this job is watched (the push source refuses such a job)."""
        return (project, experiment) in self._jobs

    def jobs(self) -> tuple[dict[str, Any], ...]:
        """The exported jobs' summaries, as of the last poll (for the landing page)."""
        return self._summaries

    def describe(self) -> str:
        parts = [f"root {r}" for r in self.roots] + [f"file {p}" for p, _, _ in self.files]
        return f"verl ({', '.join(parts) or 'nothing to watch'}; every {self.interval:g}s)"

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> VerlFileSource | None:
        roots = list(settings.verl_root or []) + [str(r) for r in context.extra_roots]
        files = [(f, settings.project, settings.experiment) for f in (settings.verl_file or [])]
        if not roots and not files:
            return None
        return cls(
            context.thresholds,
            roots,
            files,
            interval=settings.verl_interval,
            job_expiry=settings.job_expiry,
            max_line=settings.max_line_bytes,
            limits=limits_from_settings(settings),
            max_files=settings.max_files,
            clock=context.clock,
            total_steps=settings.total_steps,
            windows=context.windows,
            engines=context.engines,
            facts=context.facts,
            names=context.names,
            job_clock=context.job_clock,
            job_clock_roots=context.extra_roots,
        )


def _event_dir(entry: os.DirEntry[str]) -> bool:
    """A project folder's subdirectory that holds TensorBoard event files (event_tail)."""
    try:
        return entry.is_dir(follow_symlinks=False) and holds_events(entry.path)
    except OSError:
        return False


def _finished_file(path: str) -> tuple[bool, float | None]:
    """(whether a `.finished` regular file is there, its modification time). It is never
    opened; anything but a regular file (a FIFO, a directory) does not count."""
    try:
        st = os.stat(path)
    except OSError:
        return False, None
    if not stat.S_ISREG(st.st_mode):
        return False, None
    return True, st.st_mtime
