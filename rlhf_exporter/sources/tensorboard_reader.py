"""TensorBoard event files as verl records: every framework's `tensorboard` logger (verl's
own, OpenRLHF, AReaL, NeMo-RL, slime, ROLL).

The events are decoded by TensorBoard's own `event_pb2`, their records checked with its own
checksum (`tensorboard` package, the `tensorboard` extra): never a hand-written protobuf
parser. Each file is read incrementally (a poll reads what was appended since the last), and
a damaged record is counted and read past (`corrupt_event`, `truncated_event`:
sources/event_records.py), where TensorBoard's own loader stops without a word. A step's
scalars are collected until the file moves on to another step; the framework is detected
from the tags (tables.py: a window or step-total key, after the framework's TensorBoard
prefix), then the step goes through its `Translator`. A file that cannot be read, or is no
event file, ends its reading there, counted (`bad_event`); one that holds no step of a known
framework gives no record (`unknown_tags`, counted per step).
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..diagnosis import Record
from ..frameworks import TABLES, VERL, Translator
from ..frameworks.tables import Framework
from .event_records import REASONS as RECORD_REASONS
from .event_records import EventRecords

MAX_FILES = 256  # event files of one directory read at most
MAX_HELD_STEPS = 4096  # steps held at most (a file behind the others, an unknown framework)
IDLE_POLLS = 30  # polls a file brings nothing before its last step stops holding others
MAX_KEYS = 4096  # scalars of one step kept at most
BAD_EVENT = "bad_event"
UNKNOWN_TAGS = "unknown_tags"
TOO_MANY_KEYS = "too_many_keys"
REASONS = (BAD_EVENT, UNKNOWN_TAGS, TOO_MANY_KEYS, *RECORD_REASONS)
_VERL_HALLMARK = "timing_s/step"


class TensorBoardMissing(RuntimeError):
    """The `tensorboard` package (the `tensorboard` extra) is not installed."""


def looks_tfevents(path: str) -> bool:
    """Whether `path` names an event file, or a directory that holds one (a few levels)."""
    p = Path(path)
    if p.is_file():
        return "tfevents" in p.name
    return p.is_dir() and bool(event_files(p, limit=1))


def event_files(root: Path, limit: int = MAX_FILES) -> list[Path]:
    """The event files under `root` (itself when a file), sorted by path (a writer's file
    name holds its start time), at most `limit`; no symbolic link followed."""
    if root.is_file():
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if "tfevents" in name and not os.path.islink(os.path.join(dirpath, name)):
                found.append(Path(dirpath, name))
                if len(found) >= limit:
                    return sorted(found)
    return sorted(found)


def detect(tags: Any) -> str | None:
    """The framework whose keys one step's tags hold, or None."""
    if _VERL_HALLMARK in tags:
        return VERL
    for name, fw in TABLES.items():
        keys = [w.key for w in fw.windows] + ([fw.step_total] if fw.step_total else [])
        if any(fw.tensorboard_prefix + k in tags for k in keys):
            return name
    return None


def _loader(path: Path, rejected: Counter[str]) -> EventRecords:
    """The reader of one event file, with TensorBoard's checksum and event decoder."""
    try:
        logging.getLogger("tensorboard").setLevel(logging.ERROR)
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError as exc:  # pragma: no cover - the extra is in the test environment
        raise TensorBoardMissing(
            "reading TensorBoard event files needs the `tensorboard` extra: "
            "pip install 'rlhf-exporter[tensorboard]'"
        ) from exc
    return EventRecords(path, masked_crc32c, event_pb2.Event.FromString, rejected)


def _scalar(value: Any) -> float | None:
    """A summary value's number, when it is one scalar (histograms, text, images: None)."""
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        x = float(value.simple_value)
    elif kind == "tensor":
        array = tensor_util.make_ndarray(value.tensor)
        if array.size != 1 or array.dtype.kind not in "fiu":
            return None
        x = float(array.reshape(()))
    else:
        return None
    return x if math.isfinite(x) else None


class _File:
    """One event file, read incrementally: the step being collected and its scalars."""

    def __init__(self, path: Path):
        self.path = path
        self.loader: EventRecords | None = None
        self.step: int | None = None
        self.data: dict[str, float | None] = {}
        self.broken = False
        self.idle = 0  # polls in a row that brought it nothing


class TensorBoardReader:
    """The records of the event files under one path (a file or a directory).

    Several files of one job (slime's rollout manager and trainer each write one) are
    merged by step: a step is given out once every file still writing has moved past it
    (a file that brought nothing for IDLE_POLLS polls stops holding the others back)."""

    def __init__(self, path: str | Path, framework: str | None = None):
        self.root = Path(path)
        self.framework = framework
        self.rejected: Counter[str] = Counter()
        self.records = 0
        self._files: dict[Path, _File] = {}
        self._translator = Translator(framework) if framework else None
        self._merged: dict[int, dict[str, float | None]] = {}  # complete in their files

    @property
    def pending_bytes(self) -> int:
        """Bytes of records not yet complete in their files."""
        return sum(f.loader.pending_bytes for f in self._files.values() if f.loader is not None)

    def poll(self) -> Iterator[Record]:
        """The steps completed since the last poll (new files are found too)."""
        for path in event_files(self.root):
            f = self._files.get(path)
            if f is None:
                if len(self._files) >= MAX_FILES:
                    continue
                f = self._files[path] = _File(path)
            if not f.broken:
                self._read(f)
        open_steps = [f.step for f in self._files.values() if f.step is not None]
        yield from self._give(min(open_steps) if open_steps else None)

    def finish(self) -> Iterator[Record]:
        """The input has ended: each file's last step, then what was held."""
        for f in self._files.values():
            if f.loader is not None and not f.broken:
                f.loader.end()
            self._step_done(f)
        yield from self._give(None)
        if self._merged:
            self.rejected[UNKNOWN_TAGS] += len(self._merged)
            self._merged.clear()
        if self._translator is not None:
            for record in self._translator.finish():
                self.records += 1
                yield record

    def _read(self, f: _File) -> None:
        before = (f.step, len(f.data))
        try:
            if f.loader is None:
                f.loader = _loader(f.path, self.rejected)
            for event in f.loader.read():
                if not event.HasField("summary"):
                    continue
                if event.step != f.step:
                    self._step_done(f)
                    f.step = int(event.step)
                for value in event.summary.value:
                    self._add(f, value)
        except TensorBoardMissing:
            raise
        except Exception:  # a file that cannot be read: what it gave so far stands
            f.broken = True
            self.rejected[BAD_EVENT] += 1
            self._step_done(f)
        f.idle = f.idle + 1 if (f.step, len(f.data)) == before else 0
        if f.idle >= IDLE_POLLS:
            self._step_done(f)

    def _add(self, f: _File, value: Any) -> None:
        number = _scalar(value)
        if number is None and value.WhichOneof("value") != "simple_value":
            return
        if len(f.data) >= MAX_KEYS and value.tag not in f.data:
            self.rejected[TOO_MANY_KEYS] += 1
            return
        f.data[value.tag] = number

    def _step_done(self, f: _File) -> None:
        step, data = f.step, f.data
        f.step, f.data = None, {}
        if step is None or not data:
            return
        merged = self._merged.get(step)
        if merged is None:
            if len(self._merged) >= MAX_HELD_STEPS:
                self.rejected[UNKNOWN_TAGS] += 1  # never detected, or a file far behind
                del self._merged[min(self._merged)]
            merged = self._merged[step] = {}
        merged.update(data)

    def _give(self, below: int | None) -> Iterator[Record]:
        """The merged steps lower than `below` (every one when None), in order."""
        if self._translator is None:
            self.framework = next((fw for d in self._merged.values() if (fw := detect(d))), None)
            if self.framework is None:
                return
            self._translator = Translator(self.framework)
        for step in sorted(self._merged):
            if below is not None and step >= below:
                break
            yield from self._translate(step, self._merged.pop(step))

    def _translate(self, step: int, data: dict[str, float | None]) -> Iterator[Record]:
        assert self._translator is not None and self.framework is not None
        fw: Framework | None = TABLES.get(self.framework)
        if fw is not None and fw.tensorboard_prefix:
            cut = len(fw.tensorboard_prefix)
            data = {
                k[cut:] if k.startswith(fw.tensorboard_prefix) else k: v for k, v in data.items()
            }
        offset = fw.tensorboard_step_offset if fw is not None else 0
        for record in self._translator.feed(step + offset, data):
            self.records += 1
            yield record
