"""TensorBoard event files as verl records: every framework's `tensorboard` logger (verl's
own, OpenRLHF, AReaL, NeMo-RL, slime, ROLL).

The events are read by TensorBoard's own loader (`tensorboard` package, the `tensorboard`
extra): never a hand-written protobuf parser. Each file is read incrementally (a poll reads
what was appended since the last). A step's scalars are collected until the file moves on to
another step; the framework is detected from the tags (tables.py: a window or step-total key,
after the framework's TensorBoard prefix), then the step goes through its `Translator`. A
file that is not an event file, or is cut short, ends its reading where it breaks, counted
(`bad_event`); one that holds no step of a known framework gives no record (`unknown_tags`,
counted per step, for the first MAX_UNDETECTED steps held while looking).
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

MAX_FILES = 256  # event files of one directory read at most
MAX_UNDETECTED = 64  # steps held while the framework is not known yet
MAX_KEYS = 4096  # scalars of one step kept at most
BAD_EVENT = "bad_event"
UNKNOWN_TAGS = "unknown_tags"
TOO_MANY_KEYS = "too_many_keys"
REASONS = (BAD_EVENT, UNKNOWN_TAGS, TOO_MANY_KEYS)
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


def _loader(path: Path) -> Any:
    try:
        logging.getLogger("tensorboard").setLevel(logging.ERROR)
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError as exc:  # pragma: no cover - the extra is in the test environment
        raise TensorBoardMissing(
            "reading TensorBoard event files needs the `tensorboard` extra: "
            "pip install 'rlhf-exporter[tensorboard]'"
        ) from exc
    return EventFileLoader(str(path))


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
        self.loader: Any = None
        self.step: int | None = None
        self.data: dict[str, float | None] = {}
        self.broken = False


class TensorBoardReader:
    """The records of the event files under one path (a file or a directory)."""

    def __init__(self, path: str | Path, framework: str | None = None):
        self.root = Path(path)
        self.framework = framework
        self.rejected: Counter[str] = Counter()
        self.records = 0
        self.pending_bytes = 0  # (the loader holds no partial line)
        self._files: dict[Path, _File] = {}
        self._translator = Translator(framework) if framework else None
        self._undetected: list[tuple[int, dict[str, float | None]]] = []

    def poll(self) -> Iterator[Record]:
        """The steps completed since the last poll (new files are found too)."""
        for path in event_files(self.root):
            f = self._files.get(path)
            if f is None:
                if len(self._files) >= MAX_FILES:
                    continue
                for older in self._files.values():  # a new file: the writer moved on
                    yield from self._step_done(older)
                f = self._files[path] = _File(path)
            if not f.broken:
                yield from self._read(f)

    def finish(self) -> Iterator[Record]:
        """The input has ended: each file's last step, then what was held."""
        for f in self._files.values():
            yield from self._step_done(f)
        if self._undetected:
            self.rejected[UNKNOWN_TAGS] += len(self._undetected)
            self._undetected.clear()
        if self._translator is not None:
            for record in self._translator.finish():
                self.records += 1
                yield record

    def _read(self, f: _File) -> Iterator[Record]:
        try:
            if f.loader is None:
                f.loader = _loader(f.path)
            for event in f.loader.Load():
                if not event.HasField("summary"):
                    continue
                if event.step != f.step:
                    yield from self._step_done(f)
                    f.step = int(event.step)
                for value in event.summary.value:
                    self._add(f, value)
        except TensorBoardMissing:
            raise
        except Exception:  # a corrupt or foreign file: what it gave so far stands
            f.broken = True
            self.rejected[BAD_EVENT] += 1

    def _add(self, f: _File, value: Any) -> None:
        number = _scalar(value)
        if number is None and value.WhichOneof("value") != "simple_value":
            return
        if len(f.data) >= MAX_KEYS and value.tag not in f.data:
            self.rejected[TOO_MANY_KEYS] += 1
            return
        f.data[value.tag] = number

    def _step_done(self, f: _File) -> Iterator[Record]:
        step, data = f.step, f.data
        f.step, f.data = None, {}
        if step is None or not data:
            return
        if self._translator is None:
            self.framework = detect(data)
            if self.framework is None:
                if len(self._undetected) < MAX_UNDETECTED:
                    self._undetected.append((step, data))
                else:
                    self.rejected[UNKNOWN_TAGS] += 1
                return
            self._translator = Translator(self.framework)
            held, self._undetected = self._undetected, []
            for s, d in held:
                yield from self._translate(s, d)
        yield from self._translate(step, data)

    def _translate(self, step: int, data: dict[str, float | None]) -> Iterator[Record]:
        assert self._translator is not None and self.framework is not None
        fw: Framework | None = TABLES.get(self.framework)
        prefix = fw.tensorboard_prefix if fw is not None else ""
        if prefix:
            data = {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in data.items()}
        for record in self._translator.feed(step, data):
            self.records += 1
            yield record
