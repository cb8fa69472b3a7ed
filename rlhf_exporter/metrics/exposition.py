"""The /metrics body, rebuilt in proportion to what changed: the sources' snapshots cut into
fragments, their lines chunked per family, gzip from cached segments, one build at a time
(docs/exposition.md)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .catalog import BY_NAME
from .chunks import Body, Chunks, Fragment, same
from .deflate import DEFAULT as DEFAULT_DEFLATE
from .deflate import Deflate
from .families import health_samples, process_samples
from .fragment_lines import FragmentLines
from .gzip_member import GzipMember
from .negotiation import EOF, Encoder, encode, is_openmetrics, line_format, negotiate
from .snapshot import Sample, SnapshotFn
from .warm import BUILD_AHEAD, MAX_LEAD, WARM_FOR, scrape_near, start

__all__ = ["DROPPED", "MAX_FORMATS", "Exposition", "encode", "line_format", "negotiate"]

DROPPED = "rlhf_exporter_samples_dropped_total"
MAX_FORMATS = 4  # content types served from cache at once; the least recently scraped goes
_CATALOG_ORDER = tuple(BY_NAME)


class Exposition:
    """The /metrics body for the sources' current snapshots, cached per fragment.

    With `warm_interval`, a daemon thread re-encodes what changed every so many seconds, and
    at once when `wake()` says a source's poll ended, for the formats scraped in the last
    `WARM_FOR` seconds, so that a scrape mostly finds its bytes ready (the thread ends when
    the exposition is garbage-collected). `direct_lines=False` encodes every fragment through
    prometheus_client's checked path, the one lines.py's lines are held equal to."""

    def __init__(
        self,
        snapshot_fns: Sequence[SnapshotFn],
        warm_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_fns: Sequence[Callable[[], tuple[Sample, ...]]] = (),
        deflate: Deflate = DEFAULT_DEFLATE,
        direct_lines: bool = True,
    ):
        self._fns = tuple(snapshot_fns)
        self._sample_fns = tuple(sample_fns)  # the server's own few samples (auth failures)
        self._lock = threading.Lock()
        self._by_id: dict[tuple[int, str], Fragment] = {}  # job parts, whole sample tuples
        self._by_value: dict[tuple[Any, str], Fragment] = {}  # small fragments
        self._bodies: dict[str, Body] = {}
        # (ctype, gzipped) -> the last bytes finished: what a scrape during a build gets
        self._served: dict[tuple[str, bool], bytes] = {}
        self._seen: dict[str, float] = {}  # ctype -> a scrape served while a build ran
        # ctype -> (encoder, last scrape, the scrape before it, gzip)
        self._wanted: dict[str, tuple[Encoder, float, float | None, bool]] = {}
        self._clock = clock
        self._build_s: dict[str, float] = {}  # ctype -> seconds the warm pass's last build took
        self.dropped: Counter[tuple[str, str]] = Counter()  # (collector, reason) -> samples
        self.stats: Counter[str] = Counter()  # renders, samples_encoded, deflate segments
        self._lines = FragmentLines(self.stats, self.dropped, direct_lines)
        self._chunks = Chunks(self.stats)
        self._gzip = GzipMember(deflate, self.stats)
        self._woken = threading.Event()  # set by wake(): a source's poll just ended
        self.warm_thread: threading.Thread | None = None
        if warm_interval is not None:
            self.warm_thread = start(self, warm_interval, self._woken)

    # -- the scrape ---------------------------------------------------------------------
    def render(self, accept: str | None = None, want_gzip: bool = False) -> tuple[bytes, str, bool]:
        """(body, content type, gzipped) for a scrape with this Accept header."""
        encoder, ctype = negotiate(accept)
        if not self._lock.acquire(blocking=False):
            # a build is under way (most often the warm thread's, after a poll): the body it
            # replaces is at most one poll old, and a scrape in phase with the polls would
            # otherwise wait for every build
            ready = self._ready(ctype, want_gzip)
            if ready is not None:
                self.stats["served_while_building"] += 1
                # the warm thread times its builds by the scrapes: this one counts too
                # (merged into `_wanted` under the lock, by `_merge_seen`)
                self._seen[ctype] = self._clock()
                return ready, ctype, want_gzip
            self._lock.acquire()
        try:  # one render at a time; scrapers that wait then share its bytes
            return self._render(encoder, ctype, want_gzip)
        finally:
            self._lock.release()

    def _ready(self, ctype: str, want_gzip: bool) -> bytes | None:
        """The last body finished for this format in this encoding, if any (read without the
        lock: bytes, never changed). Not the body under way: a build puts its new body in
        place before it deflates it, and a scrape that found that one would wait for the
        deflating."""
        return self._served.get((ctype, want_gzip))

    def _render(self, encoder: Encoder, ctype: str, want_gzip: bool) -> tuple[bytes, str, bool]:
        last = self._merge_seen(ctype)
        self._wanted[ctype] = (encoder, self._clock(), last[1] if last else None, want_gzip)
        if last is None and len(self._wanted) > MAX_FORMATS:
            # the least recently scraped other format goes; the lines it shares with
            # this one are kept, as this one is wanted already
            others = (c for c in self._wanted if c != ctype)
            self._forget(min(others, key=lambda c: self._wanted[c][1]))
            self.stats["formats_evicted"] += 1
        body = self._current(encoder, ctype)
        return self._finish(body, ctype, want_gzip), ctype, want_gzip

    def _finish(self, body: Body, ctype: str, want_gzip: bool) -> bytes:
        """The body's bytes in this encoding (joined or deflated once), then served to the
        scrapes that come during the next build."""
        if want_gzip:
            if body.gzipped is None:
                plain = (body.plain,) if body.plain is not None else self._plain_parts(body)
                body.gzipped = self._gzip.member(body, plain, self._header)
            out = body.gzipped
        else:
            if body.plain is None:
                body.plain = b"".join(self._plain_parts(body))
            out = body.plain
        self._served[ctype, want_gzip] = out
        return out

    def _header(self, body: Body, name: str) -> bytes:
        return self._lines.header(body.encoder, body.ctype, name)

    def _plain_parts(self, body: Body) -> Iterator[bytes]:
        for name in body.names:
            yield self._header(body, name)
            for chunk in body.chunks:
                raw = chunk.raw.get(name)
                if raw is not None:
                    yield raw
        if is_openmetrics(body.ctype):
            yield EOF

    # -- the warm thread ----------------------------------------------------------------
    def wake(self) -> None:
        """A source's poll just ended: the warm thread looks at once instead of at its next
        tick (a scrape in the gap between a poll and that tick would build the body itself)."""
        self._woken.set()

    def _merge_seen(self, ctype: str) -> tuple[Encoder, float, float | None, bool] | None:
        """The format's entry in `_wanted`, with a later scrape served while a build held the
        lock taken as its last scrape (under the lock; an evicted format is not re-added)."""
        seen = self._seen.pop(ctype, None)
        entry = self._wanted.get(ctype)
        if entry is not None and seen is not None and seen > entry[1]:
            entry = self._wanted[ctype] = (entry[0], seen, entry[1], entry[3])
        return entry

    def warm(self) -> None:
        """Encode what changed for the formats scraped lately (the warm thread calls this).

        The jobs that changed are encoded at once, so that a scrape never waits for many.
        The body (joining per chunk, deflating, the CRC-32 of the plain body) is built only
        when the next scrape is near: BUILD_AHEAD seconds plus twice what the last builds
        took (all formats: one pass builds them in turn)."""
        now, cpu = self._clock(), time.thread_time()
        lead = BUILD_AHEAD + 2 * sum(self._build_s.values())
        for ctype in list(self._wanted):
            with self._lock:  # one format at a time: a scrape waits for one build at most
                entry = self._merge_seen(ctype)
                if entry is None:  # evicted by a scrape since the list was taken: never
                    continue  # rebuilt here (its body would be held by nothing that frees it)
                encoder, when, before, want_gzip = entry
                if now - when > WARM_FOR:
                    self._forget(ctype)
                    continue
                if not scrape_near(now, when, before, lead):
                    self._prepare(encoder, ctype)
                    continue
                t, renders = time.monotonic(), self.stats["renders"]
                self._finish(self._current(encoder, ctype), ctype, want_gzip)
                if self.stats["renders"] != renders:  # a build, not a body found ready
                    self._build_s[ctype] = min(time.monotonic() - t, MAX_LEAD)
        self.stats["warm_cpu_us"] += int((time.thread_time() - cpu) * 1e6)

    def _forget(self, ctype: str) -> None:
        """Stop serving this format from cache: its body, and what only it used (a scraper
        that asks for a new content type at every scrape cannot grow the cache: at most
        MAX_FORMATS are kept, each a body's worth of bytes)."""
        entry = self._wanted.pop(ctype, None)
        self._bodies.pop(ctype, None)
        self._served.pop((ctype, False), None)
        self._served.pop((ctype, True), None)
        self._seen.pop(ctype, None)
        self._build_s.pop(ctype, None)
        self._gzip.forget(ctype)
        lkey = line_format(ctype)
        if entry is None or any(line_format(c) == lkey for c in self._wanted):
            self._lines.forget(ctype, None)  # another format scraped lately shares its lines
            return
        self._lines.forget(ctype, lkey)
        self._chunks.forget(lkey)
        for frag in (*self._by_id.values(), *self._by_value.values()):
            frag.lines.pop(lkey, None)

    def _prepare(self, encoder: Encoder, ctype: str) -> None:
        """Encode the fragments that changed since the last build; build no body."""
        snaps = self._inputs()
        body = self._bodies.get(ctype)
        if body is not None and same(body.snaps, snaps):
            return
        self.stats["prepares"] += 1
        for frag in self._fragments(snaps):
            self._lines.lines(frag, encoder, ctype)

    # -- the body -------------------------------------------------------------------------
    def _current(self, encoder: Encoder, ctype: str) -> Body:
        snaps = self._inputs()
        body = self._bodies.get(ctype)
        if body is None or not same(body.snaps, snaps):
            body = self._bodies[ctype] = self._assemble(encoder, ctype, snaps)
        return body

    def _inputs(self) -> tuple[Any, ...]:
        """The sources' snapshots, then the server's own sample tuples: a body is current
        while each is the very object it was built from (a sample function returns the same
        tuple while its values are unchanged)."""
        return (*(fn() for fn in self._fns), *(fn() for fn in self._sample_fns))

    def _fragments(self, inputs: tuple[Any, ...]) -> list[Fragment]:
        by_id, by_value = self._by_id, self._by_value
        new_id: dict[tuple[int, str], Fragment] = {}
        new_value: dict[tuple[Any, str], Fragment] = {}

        def keyed(samples: tuple[Any, ...], collector: str) -> Fragment:
            key = (id(samples), collector)
            frag = new_id.get(key) or by_id.get(key)
            if frag is None or frag.samples is not samples:
                frag = Fragment(samples, collector)
            new_id[key] = frag
            return frag

        def valued(samples: tuple[Any, ...], collector: str) -> Fragment:
            try:
                key = (samples, collector)
                frag = new_value.get(key) or by_value.get(key)
            except TypeError:  # an unhashable (malformed) sample: encode it every time
                return Fragment(samples, collector)
            if frag is None:
                frag = Fragment(samples, collector)
            new_value[key] = frag
            return frag

        out = [valued(process_samples(), "")]
        n = len(self._fns)
        snaps, owns = inputs[:n], inputs[n:]
        for own in owns:
            if own:
                out.append(valued(own, ""))
        for snap in snaps:
            out.append(valued(health_samples(snap), snap.collector))
            out.extend(keyed(part, snap.collector) for part in snap.parts if part)
            rest = snap.rest
            if rest:  # beside parts, a source's own few samples: cached by value
                out.append(
                    valued(rest, snap.collector) if snap.parts else keyed(rest, snap.collector)
                )
        self._by_id, self._by_value = new_id, new_value
        return out

    def _assemble(self, encoder: Encoder, ctype: str, snaps: tuple[Any, ...]) -> Body:
        self.stats["renders"] += 1
        frags = self._fragments(snaps)
        for frag in frags:
            self._lines.lines(frag, encoder, ctype)
        self._lines.prune(frags)
        if self.dropped:
            samples = tuple(
                Sample(DROPPED, key, float(n)) for key, n in sorted(self.dropped.items())
            )
            frag = Fragment(samples, "", counted=True)
            self._lines.lines(frag, encoder, ctype)
            frags.append(frag)
        chunks = self._chunks.of(frags, line_format(ctype))
        names = {name for chunk in chunks for name in chunk.raw}
        return Body(snaps, encoder, ctype, chunks, [n for n in _CATALOG_ORDER if n in names])
