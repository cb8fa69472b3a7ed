"""The body's pieces: fragments (a source's samples kept by identity, with their lines per
family) grouped in chunks of `CHUNK` consecutive ones, each chunk's lines joined per family
and cached with their deflate segments (docs/exposition.md)."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

from .negotiation import Encoder
from .snapshot import Sample

CHUNK = 16  # consecutive fragments (jobs) cached and gzipped together, per family
MAX_NAME_SETS = 1024  # distinct family-name sets of fragments shared (then forgotten)


class Placed(NamedTuple):
    """Where a chunked fragment's lines are: its slice of each family of a chunk's `raw` (a
    fragment's own lines are dropped once a chunk holds them; a rebuilt chunk slices its
    unchanged fragments' lines out of the chunk that held them)."""

    raw: dict[str, bytes]  # the chunk's lines per family
    gz: dict[str, bytes]  # the chunk's deflate segments per family
    offsets: dict[str, array[int]]  # per family: where each fragment's lines start, then end
    pos: int  # the fragment's place in the chunk
    names: tuple[str, ...]  # the families it has lines of


@dataclass
class Fragment:
    samples: tuple[Any, ...]  # held: while cached, its id() is not reused
    collector: str
    # line format -> its lines per family (until chunked), or where a chunk holds them
    lines: dict[str, dict[str, bytes] | Placed] = field(default_factory=dict)
    counted: bool = False  # its dropped samples were added to the total
    families: tuple[tuple[Sample, ...], ...] = ()  # its samples per family (cache keys)


@dataclass
class Chunk:
    """A run of consecutive fragments: their lines joined per family, and deflate segments."""

    frags: list[Fragment]  # held: the cache key is their ids
    raw: dict[str, bytes]
    gz: dict[str, bytes] = field(default_factory=dict)  # deflate segments per family
    offsets: dict[str, array[int]] = field(default_factory=dict)  # see Placed


@dataclass
class Body:
    snaps: tuple[Any, ...]  # the snapshots, then the server's own sample tuples (by identity)
    encoder: Encoder
    ctype: str
    chunks: list[Chunk]
    names: list[str]  # families with samples, catalog order
    plain: bytes | None = None
    gzipped: bytes | None = None


def same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def families_of(samples: Sequence[Any]) -> dict[str, tuple[Sample, ...]] | None:
    """The samples grouped per family name, in order; None if one is not a well-formed
    `Sample` (those take the checked path) or the group cannot key a cache: an unhashable
    value, or a -0.0 (equal to 0.0, yet encoded differently)."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        if type(s) is not Sample or type(s.labels) is not tuple:
            return None
        for v in s.labels:
            if type(v) is not str:  # a str subclass may equal a cached value, yet encode
                return None  # otherwise (or fail): the checked path
        value = s.value
        if value == 0 and type(value) is float and math.copysign(1.0, value) < 0:
            return None
        groups.setdefault(s.name, []).append(s)
    out = {name: tuple(fam) for name, fam in groups.items()}
    try:
        for fam in out.values():
            hash(fam)
    except TypeError:
        return None
    return out


class Chunks:
    """The chunks of every line format, keyed by (line format, their fragments' ids)."""

    def __init__(self, stats: Counter[str]):
        self.cache: dict[tuple[Any, ...], Chunk] = {}
        self.stats = stats
        self._name_sets: dict[tuple[str, ...], tuple[str, ...]] = {}  # see _names

    def of(self, frags: Sequence[Fragment], lkey: str) -> list[Chunk]:
        """The chunks of these fragments in this line format, reused where their fragments
        are the same; this format's chunks no longer used are dropped."""
        old, new = self.cache, dict[tuple[Any, ...], Chunk]()
        chunks = []
        for i in range(0, len(frags), CHUNK):
            run = list(frags[i : i + CHUNK])
            key = (lkey, *map(id, run))
            chunk = new.get(key) or old.get(key)
            if chunk is None:
                chunk = self._chunk(run, lkey)
            new[key] = chunk
            chunks.append(chunk)
        # keep the other line formats' chunks; drop this one's unused ones
        self.cache = {k: v for k, v in old.items() if k[0] != lkey}
        self.cache.update(new)
        return chunks

    def forget(self, lkey: str) -> None:
        self.cache = {k: v for k, v in self.cache.items() if k[0] != lkey}

    def _chunk(self, run: list[Fragment], lkey: str) -> Chunk:
        """The chunk of these fragments: their lines joined per family. A fragment that
        another chunk holds is sliced out of it (consecutive ones of one chunk in one slice);
        a family whose bytes come out as that chunk's keeps its deflate segment. Then each
        fragment's own lines are dropped: the chunk holds them."""
        self.stats["chunks_built"] += 1
        pieces: dict[str, list[bytes | memoryview]] = {}
        prev: Placed | None = None  # the chunk most of the unchanged fragments come from
        i, n = 0, len(run)
        while i < n:
            src = run[i].lines[lkey]
            if not isinstance(src, Placed):
                for name, lines in src.items():
                    pieces.setdefault(name, []).append(lines)
                i += 1
                continue
            j = _run_end(run, lkey, src, i)
            prev = prev or src
            end = src.pos + j - i
            for name in _names_of_run(run, lkey, i, j):
                off = src.offsets[name]
                if off[src.pos] < off[end]:
                    pieces.setdefault(name, []).append(
                        memoryview(src.raw[name])[off[src.pos] : off[end]]
                    )
                else:  # (a family of no line: kept, as a join of its fragments would)
                    pieces.setdefault(name, [])
            i = j
        raw: dict[str, bytes] = {}
        gz: dict[str, bytes] = {}
        for name, parts in pieces.items():
            joined = b"".join(parts)
            if prev is not None and prev.raw.get(name) == joined:  # this family unchanged
                joined = prev.raw[name]
                segment = prev.gz.get(name)
                if segment is not None:
                    gz[name] = segment
                    self.stats["segments_reused"] += 1
            raw[name] = joined
        chunk = Chunk(run, raw, gz)
        self._place(chunk, lkey)
        return chunk

    def _place(self, chunk: Chunk, lkey: str) -> None:
        """Record each fragment's slice of the chunk's families and drop its own lines."""
        run = chunk.frags
        index = {name: k for k, name in enumerate(chunk.raw)}
        lengths = [[0] * len(run) for _ in index]  # per family, per fragment
        placed = []
        for pos, frag in enumerate(run):
            src = frag.lines[lkey]
            if isinstance(src, Placed):
                at = src.pos
                for name in src.names:
                    o = src.offsets[name]
                    lengths[index[name]][pos] = o[at + 1] - o[at]
            else:
                for name, lines in src.items():
                    lengths[index[name]][pos] = len(lines)
            placed.append(self._names(src))
        chunk.offsets = {
            name: array("I", accumulate(lengths[k], initial=0)) for name, k in index.items()
        }
        for pos, (frag, names) in enumerate(zip(run, placed)):
            frag.lines[lkey] = Placed(chunk.raw, chunk.gz, chunk.offsets, pos, names)

    def _names(self, src: dict[str, bytes] | Placed) -> tuple[str, ...]:
        """A fragment's family names, one shared tuple per set of names."""
        if isinstance(src, Placed):
            return src.names
        names = tuple(src)
        shared = self._name_sets.get(names)
        if shared is None:
            if len(self._name_sets) >= MAX_NAME_SETS:
                self._name_sets.clear()
            shared = self._name_sets[names] = names
        return shared


def _run_end(run: list[Fragment], lkey: str, src: Placed, i: int) -> int:
    """Where the run of consecutive fragments that `src`'s chunk holds, from `i`, ends."""
    j = i + 1
    while j < len(run):
        nxt = run[j].lines[lkey]
        if not (isinstance(nxt, Placed) and nxt.raw is src.raw and nxt.pos == src.pos + j - i):
            break
        j += 1
    return j


def _names_of_run(run: list[Fragment], lkey: str, i: int, j: int) -> tuple[str, ...]:
    """The family names of fragments i..j (placed in one chunk), in first-seen order."""
    sets: list[tuple[str, ...]] = []
    for k in range(i, j):
        placed = run[k].lines[lkey]
        assert isinstance(placed, Placed)
        if all(placed.names is not t for t in sets):
            sets.append(placed.names)
    return sets[0] if len(sets) == 1 else tuple(dict.fromkeys(x for t in sets for x in t))
