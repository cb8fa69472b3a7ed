"""The incremental /metrics exposition (rlhf_exporter/metrics/exposition.py).

- Property: on random job sets, changed step by step, every incremental render (text and
  OpenMetrics, plain and gzip) is byte for byte prometheus_client's from-scratch render.
- Every byte parses with prometheus_client's parsers and passes `promtool check metrics`.
- The cache is real: a new step of one job re-encodes that job's samples and nothing else,
  and an unchanged scrape re-serves the very same bytes (these tests fail without it).
- One unservable sample is dropped and counted; it never fails the scrape, and a fragment
  that fails to encode never takes another job's series with it.
"""

from __future__ import annotations

import gzip
import math
import shutil
import subprocess
import threading
import zlib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from rlhf_exporter.metrics.catalog import BY_NAME, KNOWN_ERRORS
from rlhf_exporter.metrics.deflate import BACKENDS, DEFAULT
from rlhf_exporter.metrics.exposition import DROPPED, MAX_FORMATS, Exposition, encode, line_format
from rlhf_exporter.metrics.families import families
from rlhf_exporter.metrics.snapshot import Sample, Snapshot

TEXT = ""
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
FORMATS = (TEXT, OPENMETRICS)
VERL_NAMES = sorted(n for n, m in BY_NAME.items() if m.section == "verl steps")


def from_scratch(snaps, accept: str) -> bytes:
    encoder, ctype = choose_encoder(accept)
    body = encode(encoder, families(snaps))
    return body + (b"# EOF\n" if ctype.startswith("application/openmetrics-text") else b"")


class Sources:
    """Snapshot functions over a mutable list (what the sources publish, replaced whole)."""

    def __init__(self, snaps):
        self.snaps = list(snaps)

    def fns(self):
        return [lambda i=i: self.snaps[i] for i in range(len(self.snaps))]


def job_part(project: str, experiment: str, step: int, extra: int = 3) -> tuple[Sample, ...]:
    j = (project, experiment)
    out = [
        Sample("rlhf_step", j, float(step)),
        Sample("rlhf_steps_total", j, float(step)),
        Sample("rlhf_last_step_timestamp_seconds", j, 1.7e9 + step),
    ]
    for i, group in enumerate(("generate", "train", "weight_sync", "other")[:extra]):
        out.append(Sample("rlhf_group_seconds_total", j + (group,), step * (i + 1.5)))
    return tuple(out)


def verl_snapshot(parts, collector: str = "verl", **kw) -> Snapshot:
    parts = tuple(parts)
    rest = (Sample("rlhf_exporter_jobs", (collector,), float(len(parts))),)
    return Snapshot(collector, True, 0.01, 1.7e9, {}, 10, {}, rest, parts=parts, **kw)


def ray_snapshot(n: int = 2) -> Snapshot:
    samples = tuple(Sample("rlhf_ray_actors", (f"role{i}", "ALIVE"), float(i)) for i in range(n))
    return Snapshot("ray", False, 0.2, None, {"timeout": 3}, None, {}, samples)


def check_all(ex: Exposition, snaps, formats=FORMATS) -> None:
    for accept in formats:
        body, ctype, gz = ex.render(accept)
        assert not gz
        assert body == from_scratch(snaps, accept)
        zipped, ctype2, gz = ex.render(accept, want_gzip=True)
        assert gz and ctype2 == ctype
        assert gzip.decompress(zipped) == body


# -- property: incremental == from scratch ----------------------------------------------------
label_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12
)
value = st.one_of(
    st.floats(allow_nan=False, width=64),
    st.just(math.inf),
    st.just(-math.inf),
    st.integers(min_value=-(2**53), max_value=2**53).map(float),
)


@st.composite
def job_samples(draw, project: str, experiment: str) -> tuple[Sample, ...]:
    out = []
    for name in draw(st.lists(st.sampled_from(VERL_NAMES), min_size=1, max_size=6, unique=True)):
        extra = BY_NAME[name].labels[2:]
        for _ in range(draw(st.integers(1, 3)) if extra else 1):
            out.append(
                Sample(
                    name,
                    (project, experiment) + tuple(draw(label_text) for _ in extra),
                    draw(value),
                )
            )
    # duplicate series are the source's business; keep the set valid for promtool
    seen, unique = set(), []
    for s in draw(st.permutations(out)):
        if (s.name, s.labels) not in seen:
            seen.add((s.name, s.labels))
            unique.append(s)
    return tuple(unique)


@st.composite
def fleets(draw):
    """A list of states of one exporter's sources: each state changes a few jobs."""
    n = draw(st.integers(0, 8))
    names = draw(st.lists(label_text, min_size=n, max_size=n, unique=True))
    jobs = {name: draw(job_samples(name, "exp")) for name in names}
    states = []
    for _ in range(draw(st.integers(1, 4))):
        if jobs:
            for name in draw(st.lists(st.sampled_from(sorted(jobs)), max_size=3)):
                jobs[name] = draw(job_samples(name, "exp"))  # a new step: a new tuple
            if draw(st.booleans()):
                del jobs[draw(st.sampled_from(sorted(jobs)))]
        if draw(st.booleans()):
            new = draw(label_text)
            if new not in jobs:
                jobs[new] = draw(job_samples(new, "exp"))
        states.append(dict(jobs))
    return states


# what scrapers ask for: text, OpenMetrics (sharing text's sample lines), and an escaping
# scheme whose sample lines differ (its own lines); in any order
SCRAPED = (*FORMATS, "application/openmetrics-text;version=1.0.0;escaping=dots")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    states=fleets(),
    ray=st.booleans(),
    order=st.booleans(),
    formats=st.permutations(SCRAPED).flatmap(lambda p: st.lists(st.sampled_from(p), min_size=1)),
    backend=st.sampled_from(sorted(BACKENDS)),
)
def test_incremental_render_is_the_from_scratch_render(states, ray, order, formats, backend):
    sources = Sources([verl_snapshot(())] + ([ray_snapshot()] if ray else []))
    if order:
        sources.snaps.reverse()
    ex = Exposition(sources.fns(), deflate=BACKENDS[backend])
    i = sources.snaps.index(next(s for s in sources.snaps if s.collector == "verl"))
    for jobs in states:
        sources.snaps[i] = verl_snapshot(jobs.values())
        check_all(ex, sources.snaps, formats)
        check_all(ex, sources.snaps, formats[::-1])  # cached: the same bytes again


def test_isal_is_the_default_deflate_where_it_is_installed():
    """The test extra installs the package's dependencies, `isal` among them (x86_64,
    aarch64): the property test above then runs on both backends."""
    pytest.importorskip("isal")
    assert DEFAULT.name == "isal" and set(BACKENDS) == {"isal", "zlib"}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_segments_refer_to_nothing_before_them(name):
    """A chunk's cached segment is reused after other segments than the ones it was deflated
    after: each must inflate alone. Repetitive text that a shared history would compress by
    back-references, deflated A, B, C by one compressor and joined C, A, B, inflates to C, A, B
    (a backend whose full flush kept its history would point into the wrong bytes)."""
    d = BACKENDS[name]
    c = d.compressor(1)
    texts = [
        b"".join(b'rlhf_step{experiment="exp%05d",project="team%d"} %d\n' % (i, k, i) for i in r)
        for k, r in enumerate((range(0, 300), range(0, 300), range(150, 450)))
    ]
    segments = [d.segment(c, t) for t in texts]
    order = [2, 0, 1]
    stream = b"".join(segments[i] for i in order) + b"\x03\x00"
    assert zlib.decompress(stream, -15) == b"".join(texts[i] for i in order)
    crc = 0
    for i in order:
        crc = d.crc32(texts[i], crc)
    assert crc == zlib.crc32(b"".join(texts[i] for i in order))


def test_formats_share_sample_lines_only_where_prometheus_client_writes_them_alike():
    text, om, dots = (choose_encoder(a) for a in SCRAPED)
    assert line_format(text[1]) == line_format(om[1])
    assert line_format(dots[1]) == dots[1]  # `escaping=dots` writes `_` as `__`: its own lines
    sources = Sources([verl_snapshot([job_part("p", "e", 1)])])
    ex = Exposition(sources.fns())
    check_all(ex, sources.snaps, SCRAPED)
    assert {k[0] for k in ex._chunks.cache} == {line_format(text[1]), dots[1]}


# every content type prometheus_client writes (13): more than MAX_FORMATS, so they evict
KNOWN_ACCEPTS = (
    TEXT,
    *(
        f"{media};version={v}" + (f";escaping={e}" if e else "")
        for media, v in (
            ("application/openmetrics-text", "1.0.0"),
            ("application/openmetrics-text", "2.0.0"),
            ("text/plain", "1.0.0"),
        )
        for e in ("", "dots", "values", "allow-utf-8")
    ),
)


def test_a_scraper_cycling_content_types_cannot_grow_the_cache():
    parts = [job_part(f"p{i}", "e", 1) for i in range(40)]
    sources = Sources([verl_snapshot(parts)])
    ex = Exposition(sources.fns())
    for v in range(50):  # every scrape another content type, some with odd escaping
        accept = KNOWN_ACCEPTS[v % len(KNOWN_ACCEPTS)]
        body, _, _ = ex.render(accept, want_gzip=True)
        assert gzip.decompress(body) == from_scratch(sources.snaps, accept)
    assert len(ex._bodies) <= MAX_FORMATS and len(ex._wanted) <= MAX_FORMATS
    assert ex.stats["formats_evicted"] == 50 - MAX_FORMATS
    # the cached chunks and lines are those of the formats still kept, no more
    kept = {line_format(c) for c in ex._wanted}
    assert {k[0] for k in ex._chunks.cache} <= kept
    assert all(set(f.lines) <= kept for f in ex._by_id.values())
    assert {k[0] for k in ex._lines.family_lines} <= kept
    check_all(ex, sources.snaps)  # and the usual formats are still right


def test_every_byte_parses_and_promtool_accepts_it(tmp_path):
    tricky = ['a"b', "back\\slash", "new\nline", "ünïcødé", "x" * 100]
    parts = [job_part(p, f"exp-{i}", i + 1) for i, p in enumerate(tricky)]
    snaps = [verl_snapshot(parts), ray_snapshot()]
    ex = Exposition(Sources(snaps).fns())
    text, _, _ = ex.render(TEXT)
    om, _, _ = ex.render(OPENMETRICS)
    fams = {f.name: f for f in parse_text(text.decode())}
    assert {s.labels["project"] for s in fams["rlhf_step"].samples} == set(tricky)
    om_fams = {f.name: f for f in parse_openmetrics(om.decode())}
    assert len(om_fams["rlhf_group_seconds"].samples) == 3 * len(tricky)
    errors = {
        (s.labels["collector"], s.labels["reason"]): s.value
        for s in om_fams["rlhf_exporter_collector_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors[("ray", "timeout")] > 0
    assert errors[("verl", "root_missing")] == 0  # a known reason, served at 0 from the start
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    # promtool lints the Prometheus text format (it reads OpenMetrics counters as unnamed)
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- the cache is real ------------------------------------------------------------------------
def test_a_new_step_of_one_job_re_encodes_that_job_only():
    parts = [job_part(f"p{i}", "e", 1) for i in range(200)]
    sources = Sources([verl_snapshot(parts), ray_snapshot()])
    ex = Exposition(sources.fns())
    for accept in FORMATS:
        ex.render(accept, want_gzip=True)
    before = dict(ex.stats)
    parts[7] = job_part("p7", "e", 2)
    sources.snaps[0] = verl_snapshot(parts)
    for accept in FORMATS:
        ex.render(accept, want_gzip=True)
    check_all(ex, sources.snaps)
    encoded = ex.stats["samples_encoded"] - before["samples_encoded"]
    # once for both formats (they share sample lines): the job's 6 samples, the verl
    # snapshot's health (3 + records) and rlhf_exporter_jobs (at most); never the other
    # 199 jobs' samples
    assert encoded <= len(parts[7]) + 5 + 1, encoded
    # gzip: the segments of the changed job's chunk only (its 4 job families, the 4 health
    # families and build_info that share the first chunk), once for both formats
    members = ex.stats["segments_deflated"] - before["segments_deflated"]
    # + process_start_time_seconds in the first chunk, and verl's two error families (its
    # known reasons are served at 0 from the start)
    assert members <= 12, members
    assert before["segments_deflated"] > 5 * members


def test_an_unchanged_scrape_re_serves_the_same_bytes():
    sources = Sources([verl_snapshot([job_part("p", "e", 1)])])
    ex = Exposition(sources.fns())
    for accept in FORMATS:
        for want_gzip in (False, True):
            first, _, _ = ex.render(accept, want_gzip)
            again, _, _ = ex.render(accept, want_gzip)
            assert again is first
    # a replaced snapshot with the same job tuple: new body, the job is not re-encoded
    before = ex.stats["samples_encoded"]
    sources.snaps[0] = replace(sources.snaps[0], duration=0.5)
    body, _, _ = ex.render(TEXT)
    assert b'rlhf_exporter_collector_duration_seconds{collector="verl"} 0.5' in body
    # the snapshot's health: 5 samples, and the known error reasons it serves at 0
    zeros = sum(len(reasons) for reasons in KNOWN_ERRORS["verl"].values())
    assert ex.stats["samples_encoded"] - before <= 5 + zeros


def test_concurrent_scrapes_share_one_render():
    parts = [job_part(f"p{i}", "e", 1) for i in range(200)]
    sources = Sources([verl_snapshot(parts)])
    ex = Exposition(sources.fns())
    bodies, barrier = [], threading.Barrier(16)

    def scrape():
        barrier.wait()
        bodies.append(ex.render(TEXT, want_gzip=True)[0])

    threads = [threading.Thread(target=scrape) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(bodies) == 16 and all(b is bodies[0] for b in bodies)
    assert ex.stats["renders"] == 1


# -- bad samples: dropped, counted, isolated --------------------------------------------------
def dropped_series(body: bytes) -> dict[tuple[str, str], float]:
    fams = {f.name: f for f in parse_text(body.decode())}
    fam = fams.get(DROPPED.removesuffix("_total"))
    if fam is None:
        return {}
    return {(s.labels["collector"], s.labels["reason"]): s.value for s in fam.samples}


def test_an_unknown_sample_is_dropped_and_counted_never_fails_the_scrape():
    good = job_part("good", "e", 3)
    bad = job_part("bad", "e", 3) + (
        Sample("rlhf_no_such_metric", ("bad", "e"), 1.0),
        Sample("rlhf_step", ("bad",), 1.0),  # one label short
        Sample("rlhf_run", ("bad", "e"), "three"),  # not a number
    )
    snaps = [verl_snapshot([good, bad]), ray_snapshot()]
    ex = Exposition(Sources(snaps).fns())
    body, _, _ = ex.render(TEXT)
    fams = {f.name: f for f in parse_text(body.decode())}
    assert {s.labels["project"] for s in fams["rlhf_step"].samples} == {"good", "bad"}
    assert "rlhf_run" not in fams and "rlhf_no_such_metric" not in fams
    assert dropped_series(body) == {
        ("verl", "unknown_metric"): 1.0,
        ("verl", "bad_labels"): 1.0,
        ("verl", "bad_value"): 1.0,
    }
    assert len(fams["rlhf_ray_actors"].samples) == 2
    # the same (unchanged) job is not counted again on the next scrape or format
    ex.render(OPENMETRICS)
    snaps[1] = ray_snapshot(3)
    body, _, _ = ex.render(TEXT)
    assert dropped_series(body)[("verl", "unknown_metric")] == 1.0


class Hostile(str):
    """A label value that passes as a str but breaks prometheus_client's escaping."""

    def replace(self, *args):
        raise RuntimeError("boom")


def test_a_fragment_that_fails_to_encode_leaves_the_other_jobs_alone():
    good = [job_part(f"p{i}", "e", 1) for i in range(3)]
    broken = job_part(Hostile("evil"), "e", 1)
    snaps = [verl_snapshot(good[:1] + [broken] + good[1:])]
    ex = Exposition(Sources(snaps).fns())
    for accept in FORMATS:
        body, _, _ = ex.render(accept)
        fams = {
            f.name: f for f in (parse_text if accept == TEXT else parse_openmetrics)(body.decode())
        }
        assert {s.labels["project"] for s in fams["rlhf_step"].samples} == {"p0", "p1", "p2"}
    assert dropped_series(ex.render(TEXT)[0]) == {("verl", "render_failed"): float(len(broken))}


def test_no_render_flattens_the_jobs_samples():
    """A snapshot carries its jobs' tuples (`parts`) and the rest: neither the incremental
    exposition nor a from-scratch render builds the flat `samples` tuple (at 1,000 jobs a
    copy of 120,000 references at every change)."""
    snaps = [verl_snapshot([job_part("a", "e", 1), job_part("b", "e", 1)]), ray_snapshot()]
    ex = Exposition(Sources(snaps).fns())
    check_all(ex, snaps)  # the exposition, and families() for the from-scratch render
    assert all("samples" not in vars(snap) for snap in snaps)
    assert snaps[0].samples == tuple(snaps[0].series())  # built on demand, parts first
    assert snaps[0].samples[-1].name == "rlhf_exporter_jobs" and "samples" in vars(snaps[0])
    assert snaps[1].samples is snaps[1].rest  # no parts: nothing to flatten


def test_a_poll_wakes_the_warm_thread_at_once():
    """A source's thread calls `wake()` after each poll (serve wires it): the change is built
    long before the warm thread's next tick, so a scrape in the gap does not build it."""
    import time

    from rlhf_exporter.metrics.snapshot import Snapshot as Snap
    from rlhf_exporter.sources.base import PollingSource, PollResult

    parts = [job_part(f"p{i}", "e", 1) for i in range(20)]
    sources = Sources([verl_snapshot(parts)])
    ex = Exposition(sources.fns(), warm_interval=3600)  # its tick never comes in this test
    ex.render(OPENMETRICS, want_gzip=True)
    time.sleep(0.05)  # the thread is waiting
    parts[3] = job_part("p3", "e", 2)
    sources.snaps[0] = verl_snapshot(parts)

    class OnePoll(PollingSource):
        def poll(self) -> PollResult:
            return PollResult(())

    src = OnePoll("one", interval=3600)
    src.after_poll.append(ex.wake)
    src.after_poll.insert(0, lambda: 1 / 0)  # a failing listener stops neither poll nor wake
    src.start()
    try:
        deadline = time.monotonic() + 10
        while ex.stats["renders"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        src.stop()
    assert ex.stats["renders"] == 2 and isinstance(src.snapshot(), Snap)
    body, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    assert ex.stats["renders"] == 2  # the scrape found it built
    assert b'rlhf_step{experiment="e",project="p3"} 2.0' in gzip.decompress(body)


def test_the_warm_thread_encodes_changes_before_the_scrape_and_ends_with_the_exposition():
    import gc
    import time

    parts = [job_part(f"p{i}", "e", 1) for i in range(20)]
    sources = Sources([verl_snapshot(parts)])
    ex = Exposition(sources.fns(), warm_interval=0.05)
    ex.render(OPENMETRICS, want_gzip=True)  # the format Prometheus asks for is now kept warm
    parts[3] = job_part("p3", "e", 2)
    sources.snaps[0] = verl_snapshot(parts)
    deadline = time.monotonic() + 10
    while ex.stats["renders"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ex.stats["renders"] == 2  # the thread rendered the change, no scrape asked
    encoded = ex.stats["samples_encoded"]
    body, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    assert ex.stats["renders"] == 2 and ex.stats["samples_encoded"] == encoded
    assert b'rlhf_step{experiment="e",project="p3"} 2.0' in gzip.decompress(body)
    assert gzip.decompress(body) == from_scratch(sources.snaps, OPENMETRICS)
    thread = ex.warm_thread
    assert thread is not None and thread.is_alive()
    del ex
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_evicting_a_format_keeps_the_lines_the_newcomer_shares():
    sources = Sources([verl_snapshot([job_part(f"p{i}", "e", 1) for i in range(20)])])
    ex = Exposition(sources.fns())
    ex.render(TEXT)
    for v in ("1.0.0", "2.0.0", "1.0.0;escaping=values")[: MAX_FORMATS - 1]:
        # formats with lines of their own fill the cache
        ex.render(f"application/openmetrics-text;version={v};escaping=dots")
    encoded = ex.stats["samples_encoded"]
    body, _, _ = ex.render(OPENMETRICS)  # evicts text, the oldest, but shares its lines
    assert body == from_scratch(sources.snaps, OPENMETRICS)
    assert ex.stats["formats_evicted"] == 1
    assert ex.stats["samples_encoded"] == encoded  # nothing encoded again


# Accept headers a hostile scraper sends: invented versions, a version prometheus_client
# cannot compare (`x`), an entry it must not be served (q=0), injected header bytes
HOSTILE_ACCEPTS = (
    "application/openmetrics-text;version=1.0.7",
    "application/openmetrics-text; version=1.0.123456789",
    "text/plain;version=x",
    "application/openmetrics-text;version=x",
    "text/plain;version=1.0.0;escaping=<script>",
    "application/openmetrics-text;version=1.0.0;q=0",
    'application/openmetrics-text;version="1.0.0\r\nSet-Cookie: a=b"',
    "application/openmetrics-text;version=1.0.0;" + "x=y;" * 1000,
    ",".join(f"application/openmetrics-text;version=1.0.{v}" for v in range(2000)),
)
SERVED_TYPES = {choose_encoder(a)[1] for a in KNOWN_ACCEPTS}


@pytest.mark.parametrize("accept", HOSTILE_ACCEPTS)
def test_only_content_types_prometheus_client_writes_are_served(accept):
    sources = Sources([verl_snapshot([job_part("p", "e", 1)])])
    ex = Exposition(sources.fns())
    body, ctype, _ = ex.render(accept)  # never raises (version=x did: a TypeError)
    assert ctype in SERVED_TYPES  # never an invented version echoed back
    if "q=0" in accept:
        assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    assert body == from_scratch(sources.snaps, "" if ctype.startswith("text/plain") else ctype)


def test_content_negotiation_honours_order_weights_and_escaping():
    ex = Exposition(Sources([verl_snapshot([job_part("p", "e", 1)])]).fns())
    prom3 = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
        "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
        "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    )
    assert ex.render(prom3)[1] == choose_encoder(prom3)[1]  # what Prometheus 3 sends: as before
    assert ex.render("application/openmetrics-text;version=1.0.0;q=0, text/plain;version=1.0.0")[
        1
    ].startswith("text/plain; version=1.0.0")
    assert (
        ex.render("application/openmetrics-text;version=9.9.9, application/openmetrics-text")[1]
        == choose_encoder("application/openmetrics-text")[1]
    )


class _RacingLock:
    """The exposition's lock, with a hook run the first time the warm thread takes it:
    scrapes that arrive between warm()'s listing of the formats and its first build."""

    def __init__(self, hook):
        self._lock = threading.Lock()
        self._hook = hook

    def __enter__(self):
        hook, self._hook = self._hook, None
        if hook is not None and threading.current_thread().name == "warm":
            hook()
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


def test_warm_never_rebuilds_a_format_a_scrape_evicted():
    sources = Sources([verl_snapshot([job_part(f"p{i}", "e", 1) for i in range(40)])])
    ex = Exposition(sources.fns())
    first, later = KNOWN_ACCEPTS[:MAX_FORMATS], KNOWN_ACCEPTS[MAX_FORMATS : 2 * MAX_FORMATS]
    for accept in first:
        ex.render(accept)
    sources.snaps[0] = verl_snapshot([job_part(f"p{i}", "e", 2) for i in range(40)])

    def scrapes_meanwhile():  # they evict every format warm() listed
        lock, ex._lock = ex._lock, threading.Lock()
        for accept in later:
            ex.render(accept)
        ex._lock = lock

    ex._lock = _RacingLock(scrapes_meanwhile)  # type: ignore[assignment]
    t = threading.Thread(target=ex.warm, name="warm")
    t.start()
    t.join()
    assert set(ex._bodies) <= set(ex._wanted)  # nothing cached that no one scrapes
    assert len(ex._bodies) <= MAX_FORMATS
    kept = {line_format(c) for c in ex._wanted}
    assert {k[0] for k in ex._chunks.cache} <= kept
    assert all(set(f.lines) <= kept for f in (*ex._by_id.values(), *ex._by_value.values()))


def test_many_threads_inventing_versions_keep_the_cache_bounded():
    import random

    parts = [job_part(f"p{i}", "e", 1) for i in range(64)]
    sources = Sources([verl_snapshot(parts)])
    ex = Exposition(sources.fns(), warm_interval=0.001)
    one = len(ex.render(TEXT)[0])
    errors: list[BaseException] = []

    def scraper(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for n in range(60):
                if rnd.random() < 0.5:
                    accept = f"application/openmetrics-text;version=1.0.{rnd.randrange(10**6)}"
                else:
                    accept = rnd.choice(KNOWN_ACCEPTS)
                ctype = ex.render(accept, want_gzip=rnd.random() < 0.5)[1]
                assert ctype in SERVED_TYPES
                if n % 10 == 0:  # the jobs step meanwhile
                    step = rnd.randrange(2, 100)
                    sources.snaps[0] = verl_snapshot(
                        [job_part(f"p{i}", "e", step) for i in range(64)]
                    )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=scraper, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ex.warm()
    assert not errors
    assert len(ex._wanted) <= MAX_FORMATS and set(ex._bodies) <= set(ex._wanted)
    cached = sum(len(b.plain or b"") + len(b.gzipped or b"") for b in ex._bodies.values())
    assert cached <= MAX_FORMATS * 3 * one  # each kept format: a body and its gzip, no more
    kept = {line_format(c) for c in ex._wanted}
    assert {k[0] for k in ex._chunks.cache} <= kept


def test_a_fragment_failing_at_every_poll_is_logged_once_not_flooded(caplog):
    """A source whose samples fail to encode at every poll (a lone surrogate in a label
    from a hostile head did, four times a second) is counted each time, logged once."""
    sources = Sources([verl_snapshot([job_part("p", "e", 1)])])
    ex = Exposition(sources.fns())
    with caplog.at_level("DEBUG", logger="rlhf_exporter.metrics.exposition"):
        for step in range(20):  # a new broken fragment at every poll
            sources.snaps[0] = verl_snapshot([job_part("p\ud800", "e", step + 1)])
            ex.render(TEXT)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert dropped_series(ex.render(TEXT)[0])[("verl", "render_failed")] == 20 * 6  # 6 a job


def test_a_family_that_fails_to_encode_leaves_the_sources_other_families_alone():
    """One bad label in one family (the head's group did it to the window series) drops that
    family's samples only: the GPU series beside it in the same fragment are still served."""
    rest = (
        Sample("rlhf_gpu_busy_seconds_total", ("0", "GPU-0", "p", "e"), 5.0),
        Sample("rlhf_window_gpu_busy_seconds_total", ("p", "e", "rollout\ud800", "rollout"), 1.0),
    )
    snap = Snapshot("nvml", True, 0.01, 1.7e9, {}, None, {}, rest)
    ex = Exposition([lambda: snap])
    body = ex.render(TEXT)[0]
    assert b"rlhf_gpu_busy_seconds_total{" in body
    assert dropped_series(body) == {("nvml", "render_failed"): 1.0}
