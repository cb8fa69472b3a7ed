"""The /metrics body, rebuilt in proportion to what changed.

The snapshots are cut into fragments, each a tuple of samples that a source keeps (by
identity) for as long as it is unchanged:

- one fragment per job: a snapshot's `parts` (see `Snapshot`);
- a snapshot's `rest`, its other samples (Ray, GPUs, `rlhf_exporter_jobs`);
- a snapshot's own health series (`rlhf_exporter_collector_*`), rebuilt at every poll;
- build_info, and the count of samples that could not be served.

Each fragment is encoded by prometheus_client's own encoder (text 0.0.4 or OpenMetrics,
whichever the scraper asks for; prometheus_client stays the format authority) and cut at the
family headers into its sample lines per family. The formats differ in their headers (HELP,
TYPE, `_total` on a counter's name, OpenMetrics' `# EOF`), not in the sample lines of the
gauges and counters this exporter serves: a format whose encoder writes every sample line
exactly as the text format does (checked once per format, on a probe of every catalog
family with the hardest label values and numbers, see `line_format`) shares one set of
lines, chunks and deflate segments with it, so a change is encoded and deflated once
whatever the number of formats scraped. A scrape joins, family by
family in catalog order, the family's HELP/TYPE header and every fragment's lines for it:
the same bytes a from-scratch render of all the snapshots gives (a property test checks
this). A new step of one job re-encodes that job's fragment and nothing else.

Fragments are grouped in chunks of `CHUNK` consecutive ones, each chunk's lines joined per
family and cached, so a scrape joins a few hundred byte strings, not one per job and family.
gzip is incremental too: each (chunk, family) is deflated once into a byte-aligned segment
that refers to nothing before it (a full flush), and the gzip body is one member whose
deflate stream is the segments joined (the approach of pigz's independent blocks), so a
change recompresses only the segments that hold a changed fragment.

`serve` keeps the exposition warm: a thread encodes what changed a few times a second, off
the scrape path, for the formats Prometheus asked for lately.

Content negotiation (`negotiate`): an Accept entry is honoured only for a media type and
version prometheus_client writes (OpenMetrics 1.0.0 and 2.0.0, text 0.0.4 and 1.0.0) and a
known escaping scheme; anything else (an invented `version=1.0.N`, `version=x`, `q=0`) is
ignored as if absent, so the content types served are a fixed, small set and nothing a
scraper writes is echoed into `Content-Type`. At most `MAX_FORMATS` of them are cached at
once; an evicted format is rebuilt only by a scrape that asks for it again (never by the
warm thread, which re-checks under the lock that a format is still wanted).

A fragment that fails to encode (a bug; samples are checked before) is left out and counted:
it never takes another job's series or the whole scrape with it. One render at a time;
scrapers that arrive meanwhile get the same cached bytes, or, when the format has a body
already, that body at once (issue 37: a scrape in phase with the polls never waits for the
build that follows each poll; what it gets is at most one build old).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
import weakref
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

from prometheus_client.exposition import choose_encoder

from .catalog import BY_NAME
from .collector import add_samples, health_samples, new_family, process_samples
from .deflate import DEFAULT as DEFAULT_DEFLATE
from .deflate import Deflate
from .lines import lines as direct_lines
from .snapshot import Row, Sample, SnapshotFn, pack

log = logging.getLogger(__name__)

Encoder = Callable[[Any], bytes]
DROPPED = "rlhf_exporter_samples_dropped_total"
CHUNK = 16  # consecutive fragments (jobs) cached and gzipped together, per family
WARM_FOR = 600.0  # seconds after its last scrape that a format is kept warm
BUILD_AHEAD = 2.0  # seconds before a format's next expected scrape that its body is built
MAX_LEAD = 5.0  # seconds: one build's time counted towards the lead at most
GZIP_LEVEL = 1  # issue 37: zlib's level 4 cost 1.4x the CPU at 1,000 jobs for a 4 % smaller body
MAX_FORMATS = 4  # content types served from cache at once; the least recently scraped goes
LOG_EVERY = 60.0  # seconds: a collector's render failure is logged at most this often
MAX_NAME_SETS = 1024  # distinct family-name sets of fragments shared (then forgotten)
_MAX_PROBED = 16  # content types whose line format is remembered; others get lines of their own
_EOF = b"# EOF\n"
_CATALOG_ORDER = tuple(BY_NAME)


class Families:
    """Duck-types a registry for prometheus_client's encoders: collect() over fixed families."""

    def __init__(self, fams: Sequence[Any]):
        self._fams = fams

    def collect(self) -> Iterator[Any]:
        return iter(self._fams)


def encode(encoder: Encoder, fams: Sequence[Any]) -> bytes:
    """prometheus_client's encoding of these families, without OpenMetrics' `# EOF`."""
    out = encoder(Families(fams))
    return out[: -len(_EOF)] if out.endswith(_EOF) else out


_SHARED = "lines"  # the line format of every format that writes text 0.0.4's sample lines
_LINE_FORMATS: dict[str, str] = {}  # content type -> its line format
_PROBE_LABELS = ("", "a", 'quote " back \\ slash', "new\nline", "ünïcødé €𝄞", "\ufffd", "x" * 300)
_PROBE_VALUES = (
    0.0,
    -0.0,
    1.0,
    -1.5,
    1e-7,
    0.1,
    1e300,
    -1e-300,
    2.0**53 + 2,
    math.nan,
    math.inf,
    -math.inf,
)


_MEDIA_VERSIONS = {  # what prometheus_client writes, per media type
    "application/openmetrics-text": frozenset({"1.0.0", "2.0.0"}),
    "text/plain": frozenset({"0.0.4", "1.0.0"}),
}
_ESCAPINGS = frozenset({"underscores", "dots", "values", "allow-utf-8"})
MAX_ACCEPT_ENTRIES = 16  # Accept entries looked at; the rest are ignored


def negotiate(accept: str | None) -> tuple[Encoder, str]:
    """prometheus_client's encoder and content type for this Accept header, fed only the
    entries it knows: a known media type whose version (when given) prometheus_client
    writes, a known escaping scheme (an unknown one is dropped, as prometheus_client would
    default it), q not 0. The entries are rewritten from these known values, so the content
    type never holds a byte of the header."""
    clean = []
    for entry in (accept or "").split(",")[:MAX_ACCEPT_ENTRIES]:
        media, *params = (t.strip() for t in entry.split(";"))
        versions = _MEDIA_VERSIONS.get(media.lower())
        if versions is None:
            continue
        keep, ok = [media.lower()], True
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "version":
                ok = ok and value in versions
                keep.append(f"version={value}")
            elif key == "escaping" and value in _ESCAPINGS:
                keep.append(f"escaping={value}")
            elif key == "q":
                ok = ok and _q(value) > 0
        if ok:
            clean.append(";".join(keep))
    return choose_encoder(",".join(clean))


def _q(value: str) -> float:
    try:
        q = float(value)
    except ValueError:
        return 1.0  # a malformed weight: the entry as if unweighted
    return q if 0.0 <= q <= 1.0 else 1.0


def line_format(encoder: Encoder, ctype: str) -> str:
    """The key under which this format's sample lines are cached: `_SHARED` when its
    encoder writes every sample line exactly as prometheus_client's text 0.0.4 encoder
    does, its own content type otherwise.

    Checked once per content type, by prometheus_client itself: every catalog family is
    encoded by both encoders with samples carrying quotes, backslashes, newlines, non-ASCII
    and long label values and zero, negative zero, tiny, huge, NaN and infinite values, and
    the lines per family compared. A future encoder (or an escaping scheme a scraper asks
    for) that writes samples differently gets lines of its own, encoded by itself."""
    key = _LINE_FORMATS.get(ctype)
    if key is None:
        if len(_LINE_FORMATS) >= _MAX_PROBED:  # a scraper inventing versions: not probed
            return ctype
        key = _LINE_FORMATS[ctype] = _SHARED if _same_lines(encoder) else ctype
    return key


def _same_lines(encoder: Encoder) -> bool:
    reference, _ = choose_encoder("")
    if encoder is reference:
        return True
    metrics = list(BY_NAME.values())
    by_name: dict[str, Any] = {}
    add_samples(by_name, _probe_samples())  # the way every served sample becomes a family
    fams = [by_name[m.name] for m in metrics]
    try:
        return _probe_lines(encoder, metrics, fams) == _probe_lines(reference, metrics, fams)
    except ValueError:
        return False


def _probe_samples() -> list[Sample]:
    """Samples of every catalog family with the hardest label values and numbers."""
    return [
        Sample(
            metric.name,
            tuple(
                _PROBE_LABELS[(i + j + n) % len(_PROBE_LABELS)] + str(j)
                for n in range(len(metric.labels))
            ),
            v,
        )
        for i, metric in enumerate(BY_NAME.values())
        for j, v in enumerate(_PROBE_VALUES)
    ]


_DIRECT: list[bool] = []  # whether `lines.lines` writes what prometheus_client writes


def direct_lines_verified() -> bool:
    """Whether `rlhf_exporter.metrics.lines` writes every probe sample's line exactly as
    prometheus_client's text 0.0.4 encoder does (checked once per process): only then are
    the shared lines written directly."""
    if not _DIRECT:
        reference, _ = choose_encoder("")
        metrics = list(BY_NAME.values())
        samples = _probe_samples()
        by_name: dict[str, Any] = {}
        add_samples(by_name, samples)
        try:
            want = _probe_lines(reference, metrics, [by_name[m.name] for m in metrics])
        except ValueError:
            want = []
        got = direct_lines(samples)
        _DIRECT.append(
            got is not None
            and [got.get(m.name) for m in metrics] == want
            and _packed_agree(samples)
        )
    return _DIRECT[0]


def _packed_agree(samples: Sequence[Sample]) -> bool:
    """Whether a packed job's lines (lines.py's templates) are those of its samples one by
    one, for the probe's job samples grouped by their project and experiment."""
    jobs: dict[tuple[str, ...], list[Row]] = {}
    for s in samples:
        if BY_NAME[s.name].labels[:2] == ("project", "experiment"):
            jobs.setdefault(s.labels[:2], []).append((s.name, s.labels[2:], s.value))
    for head, rows in jobs.items():
        packed = pack(head, rows)
        if direct_lines(packed) != direct_lines(list(packed)):
            return False
    return bool(jobs)


def _probe_lines(encoder: Encoder, metrics: Sequence[Any], fams: Sequence[Any]) -> list[bytes]:
    """Each family's sample lines, cut from one encoding at the headers."""
    out, lines, pos = encode(encoder, fams), [], 0
    headers = [encode(encoder, [new_family(m)]) for m in metrics]
    for i, header in enumerate(headers):
        if not out.startswith(header, pos):
            raise ValueError("the encoder's output does not start with a family's header")
        start = pos + len(header)
        end = out.find(headers[i + 1], start) if i + 1 < len(headers) else len(out)
        lines.append(out[start:end])
        pos = end
    return lines


class _Placed(NamedTuple):
    """Where a chunked fragment's lines are: its slice of each family of a chunk's `raw`
    (issue 37: a fragment's own lines are dropped once a chunk holds them; a rebuilt chunk
    slices its unchanged fragments' lines out of the chunk that held them)."""

    raw: dict[str, bytes]  # the chunk's lines per family
    gz: dict[str, bytes]  # the chunk's deflate segments per family
    offsets: dict[str, array[int]]  # per family: where each fragment's lines start, then end
    pos: int  # the fragment's place in the chunk
    names: tuple[str, ...]  # the families it has lines of


@dataclass
class _Fragment:
    samples: tuple[Any, ...]  # held: while cached, its id() is not reused
    collector: str
    # line format -> its lines per family (until chunked), or where a chunk holds them
    lines: dict[str, dict[str, bytes] | _Placed] = field(default_factory=dict)
    counted: bool = False  # its dropped samples were added to the total
    families: tuple[tuple[Sample, ...], ...] = ()  # its samples per family (cache keys)


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@dataclass
class _Chunk:
    """A run of consecutive fragments: their lines joined per family, and deflate segments."""

    frags: list[_Fragment]  # held: the cache key is their ids
    raw: dict[str, bytes]
    gz: dict[str, bytes] = field(default_factory=dict)  # deflate segments per family
    offsets: dict[str, array[int]] = field(default_factory=dict)  # see _Placed


@dataclass
class _Body:
    snaps: tuple[Any, ...]  # the snapshots, then the server's own sample tuples (by identity)
    encoder: Encoder
    ctype: str
    chunks: list[_Chunk]
    names: list[str]  # families with samples, catalog order
    plain: bytes | None = None
    gzipped: bytes | None = None


class Exposition:
    """The /metrics body for the sources' current snapshots, cached per fragment.

    With `warm_interval`, a daemon thread re-encodes what changed every so many seconds, and
    at once when `wake()` says a source's poll ended,
    for the formats scraped in the last `WARM_FOR` seconds, so that a scrape mostly finds
    its bytes ready (the thread ends when the exposition is garbage-collected)."""

    def __init__(
        self,
        snapshot_fns: Sequence[SnapshotFn],
        warm_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_fns: Sequence[Callable[[], tuple[Sample, ...]]] = (),
        deflate: Deflate = DEFAULT_DEFLATE,
    ):
        self._fns = tuple(snapshot_fns)
        self._sample_fns = tuple(sample_fns)  # the server's own few samples (auth failures)
        self._lock = threading.Lock()
        self._by_id: dict[tuple[int, str], _Fragment] = {}  # job parts, whole sample tuples
        self._by_value: dict[tuple[Any, str], _Fragment] = {}  # small fragments
        self._headers: dict[tuple[str, str], bytes] = {}
        # (line format, one family's samples of one fragment) -> their lines: a job's families
        # that a new step left as they were (equal samples) are not encoded again
        self._family_lines: dict[tuple[str, tuple[Sample, ...]], bytes] = {}
        self._bodies: dict[str, _Body] = {}
        # (ctype, gzipped) -> the last bytes finished: what a scrape during a build gets
        self._served: dict[tuple[str, bool], bytes] = {}
        self._seen: dict[str, float] = {}  # ctype -> a scrape served while a build ran
        self._chunks: dict[tuple[Any, ...], _Chunk] = {}
        self._gz_headers: dict[tuple[str, str], bytes] = {}
        self._name_sets: dict[tuple[str, ...], tuple[str, ...]] = {}  # see _names
        self._deflate_lib = deflate  # metrics/deflate.py: ISA-L's, else zlib's
        self._deflater = deflate.compressor(GZIP_LEVEL)  # raw deflate, used under the lock
        # ctype -> (encoder, last scrape, the scrape before it, gzip)
        self._wanted: dict[str, tuple[Encoder, float, float | None, bool]] = {}
        self._clock = clock
        self._build_s: dict[str, float] = {}  # ctype -> seconds the warm pass's last build took
        self._failed_logged: dict[str, float] = {}  # collector -> when a failure was logged
        self.dropped: Counter[tuple[str, str]] = Counter()  # (collector, reason) -> samples
        self.stats: Counter[str] = Counter()  # renders, samples_encoded, deflate segments
        self.warm_thread: threading.Thread | None = None
        self._woken = threading.Event()  # set by wake(): a source's poll just ended
        if warm_interval is not None:
            self.warm_thread = threading.Thread(
                target=_warm_loop,
                args=(weakref.ref(self), warm_interval, self._woken),
                name="exposition",
                daemon=True,
            )
            self.warm_thread.start()

    # -- the scrape ---------------------------------------------------------------------
    def render(self, accept: str | None = None, want_gzip: bool = False) -> tuple[bytes, str, bool]:
        """(body, content type, gzipped) for a scrape with this Accept header."""
        encoder, ctype = negotiate(accept)
        if not self._lock.acquire(blocking=False):
            # a build is under way (most often the warm thread's, after a poll): the body it
            # replaces is at most one poll old, and a scrape in phase with the polls would
            # otherwise wait for every build (issue 37)
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
        deflating (bench/profile_load.py at 1 s: scrape medians of 22-33 ms in some runs, 5 ms in others)."""
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
        body = self._current(encoder, ctype, want_gzip)
        return self._finish(body, ctype, want_gzip), ctype, want_gzip

    def _finish(self, body: _Body, ctype: str, want_gzip: bool) -> bytes:
        """The body's bytes in this encoding (joined or deflated once), then served to the
        scrapes that come during the next build."""
        if want_gzip:
            if body.gzipped is None:
                body.gzipped = self._gzip(body)
            out = body.gzipped
        else:
            if body.plain is None:
                body.plain = b"".join(self._plain_parts(body))
            out = body.plain
        self._served[ctype, want_gzip] = out
        return out

    def wake(self) -> None:
        """A source's poll just ended: the warm thread looks at once instead of at its next
        tick. Without it a scrape that came in the gap between a poll and that tick (at
        `warm_interval` 0.25 s and 1 s polls, about one scrape in seven) built the body
        itself, 20-30 ms at 1,000 jobs (issue 37)."""
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
        when the next scrape is near: Prometheus scrapes at a steady interval, and at 15 s a
        body built at every change would be built 15 times for one scrape, each chunk of 16
        jobs re-deflated about four times. "Near" is BUILD_AHEAD seconds plus twice what the
        last builds took (all formats: one pass builds them in turn), so that a scrape does
        not wait for a whole fleet's deflating."""
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
                period = when - before if before is not None else 0.0
                if period > lead and now < when + period - lead:
                    self._prepare(encoder, ctype)  # the next scrape is not near
                    continue
                t, renders = time.monotonic(), self.stats["renders"]
                self._finish(self._current(encoder, ctype, want_gzip), ctype, want_gzip)
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
        self._headers = {k: v for k, v in self._headers.items() if k[0] != ctype}
        self._gz_headers = {k: v for k, v in self._gz_headers.items() if k[0] != ctype}
        if entry is None:
            return
        lkey = line_format(entry[0], ctype)
        if any(line_format(e[0], c) == lkey for c, e in self._wanted.items()):
            return  # another format scraped lately shares its lines
        self._chunks = {k: v for k, v in self._chunks.items() if k[0] != lkey}
        self._family_lines = {k: v for k, v in self._family_lines.items() if k[0] != lkey}
        for frag in (*self._by_id.values(), *self._by_value.values()):
            frag.lines.pop(lkey, None)

    def _prepare(self, encoder: Encoder, ctype: str) -> None:
        """Encode the fragments that changed since the last build; build no body."""
        snaps = self._inputs()
        body = self._bodies.get(ctype)
        if body is not None and _same(body.snaps, snaps):
            return
        self.stats["prepares"] += 1
        for frag in self._fragments(snaps):
            self._lines(frag, encoder, ctype)

    def _current(self, encoder: Encoder, ctype: str, want_gzip: bool) -> _Body:
        snaps = self._inputs()
        body = self._bodies.get(ctype)
        if body is None or not _same(body.snaps, snaps):
            body = self._bodies[ctype] = self._assemble(encoder, ctype, snaps)
        return body

    # -- fragments ------------------------------------------------------------------------
    def _inputs(self) -> tuple[Any, ...]:
        """The sources' snapshots, then the server's own sample tuples: a body is current
        while each is the very object it was built from (a sample function returns the same
        tuple while its values are unchanged)."""
        return (*(fn() for fn in self._fns), *(fn() for fn in self._sample_fns))

    def _fragments(self, inputs: tuple[Any, ...]) -> list[_Fragment]:
        by_id, by_value = self._by_id, self._by_value
        new_id: dict[tuple[int, str], _Fragment] = {}
        new_value: dict[tuple[Any, str], _Fragment] = {}

        def keyed(samples: tuple[Any, ...], collector: str) -> _Fragment:
            key = (id(samples), collector)
            frag = new_id.get(key) or by_id.get(key)
            if frag is None or frag.samples is not samples:
                frag = _Fragment(samples, collector)
            new_id[key] = frag
            return frag

        def valued(samples: tuple[Any, ...], collector: str) -> _Fragment:
            try:
                key = (samples, collector)
                frag = new_value.get(key) or by_value.get(key)
            except TypeError:  # an unhashable (malformed) sample: encode it every time
                return _Fragment(samples, collector)
            if frag is None:
                frag = _Fragment(samples, collector)
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

    def _lines(self, frag: _Fragment, encoder: Encoder, ctype: str) -> None:
        """Encode the fragment's sample lines per family in this format's line format,
        unless it has them (or a chunk holds them)."""
        key = line_format(encoder, ctype)
        if key in frag.lines:
            return
        if key == _SHARED and direct_lines_verified():
            # a whole job written directly costs less than hashing its families to find the
            # unchanged ones; None: a malformed sample, prometheus_client's checked path
            direct = direct_lines(frag.samples)
            if direct is not None:
                self.stats["samples_encoded"] += len(frag.samples)
                self.stats["direct_fragments"] += 1
                frag.counted = True
                frag.lines[key] = direct
                return
        groups = _families_of(frag.samples)
        if groups is None:  # a malformed sample: the fragment as a whole, its drops counted
            lines = self._encode(frag, frag.samples, encoder, ctype)[0]
        else:
            # a new step changes some of a job's families only: the others' lines are reused
            cache = self._family_lines
            lines, missed = {}, []
            for name, fam in groups.items():
                hit = cache.get((key, fam))
                if hit is None:
                    missed.append(fam)
                else:
                    self.stats["family_hits"] += 1
                    lines[name] = hit
            if missed:
                fresh, dropped = self._encode(frag, [s for f in missed for s in f], encoder, ctype)
                if not dropped:  # every sample served: its family's lines can be reused
                    for fam in missed:
                        cache[key, fam] = fresh[fam[0].name]
                lines.update(fresh)
            frag.families = tuple(groups.values())
        if not frag.counted:
            frag.counted = True
        frag.lines[key] = lines

    def _encode(
        self, frag: _Fragment, samples: Sequence[Any], encoder: Encoder, ctype: str
    ) -> tuple[dict[str, bytes], int]:
        """These samples' lines per family, encoded by prometheus_client, and how many were
        left out (counted in `dropped` once per fragment)."""
        dropped: Counter[tuple[str, str]] = Counter()
        by_name: dict[str, Any] = {}
        self.stats["samples_encoded"] += len(samples)
        try:
            add_samples(by_name, samples, frag.collector, dropped)
            lines = self._split(encoder, ctype, by_name)
        except Exception:  # a bug: these families are left out, every other one is served
            lines, failed = {}, 0
            if len(by_name) > 1:  # family by family: only those that fail are left out
                for name, fam in by_name.items():
                    try:
                        lines.update(self._split(encoder, ctype, {name: fam}))
                    except Exception:
                        failed += len(fam.samples)
            else:
                failed = len(samples) or len(frag.samples)
            now = time.monotonic()  # logged once a minute per collector: never a flood
            quiet = now - self._failed_logged.get(frag.collector, -LOG_EVERY) < LOG_EVERY
            if not quiet:
                self._failed_logged[frag.collector] = now
            log.log(
                logging.DEBUG if quiet else logging.ERROR,
                "could not encode %d samples of %s (counted as render_failed; logged at most "
                "once a minute per collector)",
                failed,
                frag.collector,
                exc_info=not quiet,
            )
            dropped = Counter({(frag.collector, "render_failed"): failed})
        if not frag.counted:
            self.dropped.update(dropped)
        return lines, sum(dropped.values())

    def _prune_family_lines(self, frags: Sequence[_Fragment]) -> None:
        """Forget the family lines no current fragment holds, once they are an eighth of the
        cache (their keys hold replaced samples alive: at 1,000 jobs each stale family is
        a few KB)."""
        if not self._family_lines:  # the direct lines use no family cache: nothing to prune
            return
        live = sum(len(f.families) * len(f.lines) for f in frags)  # per format
        if len(self._family_lines) <= live + live // 8 + 1024:
            return
        self.stats["family_prunes"] += 1
        keep = {(c, fam) for f in frags for fam in f.families for c in f.lines}
        self._family_lines = {k: v for k, v in self._family_lines.items() if k in keep}

    def _header(self, encoder: Encoder, ctype: str, name: str) -> bytes:
        key = (ctype, name)
        header = self._headers.get(key)
        if header is None:
            header = self._headers[key] = encode(encoder, [new_family(BY_NAME[name])])
        return header

    def _split(self, encoder: Encoder, ctype: str, by_name: dict[str, Any]) -> dict[str, bytes]:
        """Each family's sample lines, cut from one encoding of all of them at the headers."""
        if not by_name:
            return {}
        names = list(by_name)
        out = encode(encoder, list(by_name.values()))
        lines: dict[str, bytes] = {}
        pos = 0
        for i, name in enumerate(names):
            header = self._header(encoder, ctype, name)
            if not out.startswith(header, pos):
                raise ValueError(f"{name}: the encoder's output does not start with its header")
            start = pos + len(header)
            if i + 1 < len(names):
                end = out.find(self._header(encoder, ctype, names[i + 1]), start)
                if end < 0:
                    raise ValueError(f"{names[i + 1]}: header not found in the encoder's output")
            else:
                end = len(out)
            lines[name] = out[start:end]
            pos = end
        return lines

    # -- assembly ---------------------------------------------------------------------------
    def _assemble(self, encoder: Encoder, ctype: str, snaps: tuple[Any, ...]) -> _Body:
        self.stats["renders"] += 1
        frags = self._fragments(snaps)
        for frag in frags:
            self._lines(frag, encoder, ctype)
        self._prune_family_lines(frags)
        if self.dropped:
            samples = tuple(
                Sample(DROPPED, key, float(n)) for key, n in sorted(self.dropped.items())
            )
            frag = _Fragment(samples, "", counted=True)
            self._lines(frag, encoder, ctype)
            frags.append(frag)
        lkey = line_format(encoder, ctype)
        old, new = self._chunks, dict[tuple[Any, ...], _Chunk]()
        chunks = []
        names: set[str] = set()
        for i in range(0, len(frags), CHUNK):
            run = frags[i : i + CHUNK]
            key = (lkey, *map(id, run))
            chunk = new.get(key) or old.get(key)
            if chunk is None:
                chunk = self._chunk(run, lkey)
            new[key] = chunk
            chunks.append(chunk)
            names.update(chunk.raw)
        # keep the other line formats' chunks; drop this one's unused ones
        self._chunks = {k: v for k, v in old.items() if k[0] != lkey}
        self._chunks.update(new)
        return _Body(snaps, encoder, ctype, chunks, [n for n in _CATALOG_ORDER if n in names])

    def _chunk(self, run: list[_Fragment], lkey: str) -> _Chunk:
        """The chunk of these fragments: their lines joined per family. A fragment that
        another chunk holds is sliced out of it (consecutive ones of one chunk in one slice);
        a family whose bytes come out as that chunk's keeps its deflate segment. Then each
        fragment's own lines are dropped: the chunk holds them (issue 37)."""
        self.stats["chunks_built"] += 1
        pieces: dict[str, list[bytes | memoryview]] = {}
        prev: _Placed | None = None  # the chunk most of the unchanged fragments come from
        i, n = 0, len(run)
        while i < n:
            src = run[i].lines[lkey]
            if not isinstance(src, _Placed):
                for name, lines in src.items():
                    pieces.setdefault(name, []).append(lines)
                i += 1
                continue
            j, sets = i + 1, [src.names]  # a run of consecutive fragments of one chunk
            while j < n:
                nxt = run[j].lines[lkey]
                if not (
                    isinstance(nxt, _Placed) and nxt.raw is src.raw and nxt.pos == src.pos + j - i
                ):
                    break
                if all(nxt.names is not t for t in sets):
                    sets.append(nxt.names)
                j += 1
            names = sets[0] if len(sets) == 1 else tuple(dict.fromkeys(x for t in sets for x in t))
            prev = prev or src
            end = src.pos + j - i
            for name in names:
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
        chunk = _Chunk(run, raw, gz)
        self._place(chunk, lkey)
        return chunk

    def _place(self, chunk: _Chunk, lkey: str) -> None:
        """Record each fragment's slice of the chunk's families and drop its own lines."""
        run = chunk.frags
        index = {name: k for k, name in enumerate(chunk.raw)}
        lengths = [[0] * len(run) for _ in index]  # per family, per fragment
        placed = []
        for pos, frag in enumerate(run):
            src = frag.lines[lkey]
            if isinstance(src, _Placed):
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
            frag.lines[lkey] = _Placed(chunk.raw, chunk.gz, chunk.offsets, pos, names)

    def _names(self, src: dict[str, bytes] | _Placed) -> tuple[str, ...]:
        """A fragment's family names, one shared tuple per set of names."""
        if isinstance(src, _Placed):
            return src.names
        names = tuple(src)
        shared = self._name_sets.get(names)
        if shared is None:
            if len(self._name_sets) >= MAX_NAME_SETS:
                self._name_sets.clear()
            shared = self._name_sets[names] = names
        return shared

    def _plain_parts(self, body: _Body) -> Iterator[bytes]:
        ctype = body.ctype
        for name in body.names:
            yield self._header(body.encoder, ctype, name)
            for chunk in body.chunks:
                raw = chunk.raw.get(name)
                if raw is not None:
                    yield raw
        if _is_openmetrics(ctype):
            yield _EOF

    def _gzip(self, body: _Body) -> bytes:
        """One gzip member whose deflate stream is the cached segments, joined.

        Each (chunk, family) is deflated once into a segment ending with a full flush: the
        segment is byte-aligned and refers to nothing before it, so segments can follow each
        other in any order. The member's CRC-32 and length are the plain body's."""
        self.stats["gzip_bodies"] += 1
        crc = size = 0
        crc32 = self._deflate_lib.crc32
        for part in (body.plain,) if body.plain is not None else self._plain_parts(body):
            crc = crc32(part, crc)  # no need to join the plain body for it
            size += len(part)
        parts = [_GZ_HEADER]
        parts.extend(self._segments(body))
        parts.append(_DEFLATE_END)
        parts.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(parts)

    def _deflate(self, data: bytes) -> bytes:
        self.stats["segments_deflated"] += 1
        return self._deflate_lib.segment(self._deflater, data)

    def _segments(self, body: _Body) -> Iterator[bytes]:
        ctype = body.ctype
        for name in body.names:
            key = (ctype, name)
            segment = self._gz_headers.get(key)
            if segment is None:
                header = self._header(body.encoder, ctype, name)
                segment = self._gz_headers[key] = self._deflate(header)
            yield segment
            for chunk in body.chunks:
                raw = chunk.raw.get(name)
                if raw is None:
                    continue
                segment = chunk.gz.get(name)
                if segment is None:
                    segment = chunk.gz[name] = self._deflate(raw)
                yield segment
        if _is_openmetrics(ctype):
            segment = self._gz_headers.get((ctype, ""))
            if segment is None:
                segment = self._gz_headers[ctype, ""] = self._deflate(_EOF)
            yield segment


def _families_of(samples: Sequence[Any]) -> dict[str, tuple[Sample, ...]] | None:
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


def _warm_loop(
    ref: weakref.ReferenceType[Exposition], interval: float, woken: threading.Event
) -> None:
    while True:
        woken.wait(interval)
        woken.clear()
        ex = ref()
        if ex is None:
            return
        try:
            ex.warm()
        except Exception:  # never let the warm thread die: scrapes then render themselves
            log.exception("warming the exposition failed")
        del ex


def _is_openmetrics(ctype: str) -> bool:
    return ctype.startswith("application/openmetrics-text")


_GZ_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0
_DEFLATE_END = b"\x03\x00"  # an empty final block (fixed Huffman)
