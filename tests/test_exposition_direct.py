"""Sample lines written directly are prometheus_client's, and the cached body of real
jobs stepping in random order is, after every step, the body a from-scratch render gives.

- `lines.lines` against prometheus_client's text encoder on random catalog samples (label
  values with every kind of character, any float);
- (tests/test_exposition_golden.py compares whole bodies with client_python's);
- real `Job`s fed by the simulator through the real verl file source, stepping in a random
  order (hypothesis), scraped in both formats, plain and gzip, with and without the direct
  lines: each body equals an uncached render of the same snapshots.
"""

from __future__ import annotations

import gzip

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.metrics import exposition as mod
from rlhf_exporter.metrics import lines as direct
from rlhf_exporter.metrics.catalog import BY_NAME
from rlhf_exporter.metrics.exposition import Exposition
from rlhf_exporter.metrics.families import add_samples, families, new_family
from rlhf_exporter.metrics.snapshot import Sample, Snapshot
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds

TEXT = "text/plain;version=0.0.4"
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
METRICS = list(BY_NAME.values())
label_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20
) | st.sampled_from(['"', "\\", "\n", 'a"b\\c\nd', "ünïcødé €𝄞", ""])
values = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**60), 2**60)


def from_scratch(snaps, accept: str) -> bytes:
    encoder, ctype = choose_encoder(accept)
    body = mod.encode(encoder, families(snaps))
    return body + (b"# EOF\n" if ctype.startswith("application/openmetrics-text") else b"")


@st.composite
def samples(draw):
    metric = draw(st.sampled_from(METRICS))
    n = draw(st.integers(1, 4))
    return [
        Sample(metric.name, tuple(draw(label_text) for _ in metric.labels), draw(values))
        for _ in range(n)
    ]


@settings(max_examples=300, deadline=None)
@given(samples())
def test_direct_lines_are_prometheus_clients(fam):
    encoder, _ = choose_encoder("")
    by_name: dict = {}
    add_samples(by_name, fam)
    metric = BY_NAME[fam[0].name]
    header = mod.encode(encoder, [new_family(metric)])
    want = mod.encode(encoder, list(by_name.values()))
    assert want.startswith(header)
    assert direct.lines(fam) == {metric.name: want[len(header) :]}


def test_anything_not_a_well_formed_catalog_sample_takes_the_checked_path():
    j = ("p", "e")
    good = Sample("rlhf_step", j, 1.0)
    assert direct.lines([good]) == {"rlhf_step": b'rlhf_step{experiment="e",project="p"} 1.0\n'}
    for bad in (
        Sample("no_such_metric", j, 1.0),
        Sample("rlhf_step", ("p",), 1.0),  # label count
        Sample("rlhf_step", ["p", "e"], 1.0),  # not a tuple
        Sample("rlhf_step", ("p", 3), 1.0),  # not str
        Sample("rlhf_step", j, "1.0"),
        Sample("rlhf_step", j, True),  # bool: prometheus_client writes 1.0, checked anyway
        Sample("rlhf_step", ("p", "\ud800"), 1.0),  # not encodable
        ("rlhf_step", j, 1.0),  # a plain tuple
    ):
        assert direct.lines([good, bad]) is None, bad


# -- real jobs, random step order ---------------------------------------------------------------
JOBS = 12


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


@pytest.mark.parametrize("use_direct", [True, False], ids=["direct", "prometheus_client"])
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(order=st.lists(st.integers(0, JOBS - 1), min_size=1, max_size=25), data=st.data())
def test_cached_bodies_equal_uncached_ones_for_random_step_orders(
    tmp_path_factory, th, use_direct, order, data
):
    root = tmp_path_factory.mktemp("verl")
    regimes = list(REGIMES.values())
    paths, streams = [], []
    for i in range(JOBS):
        path = root / f"team{i % 3}" / f"exp{i:03d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        stream = records([(regimes[i % len(regimes)], 10**6)], seed=i, validation=False)
        path.write_bytes(b"".join(encode(next(stream)) for _ in range(3)))
        paths.append(path)
        streams.append(stream)
    src = VerlFileSource(th, [root])
    snaps = [src.poll_once()]
    ex = Exposition([lambda: snaps[0]], direct_lines=use_direct)
    for k, i in enumerate(order):
        with open(paths[i], "ab") as f:
            f.write(encode(next(streams[i])))
        snaps[0] = src.poll_once()
        if data.draw(st.booleans(), label=f"scrape after step {k}") or k == len(order) - 1:
            for accept in (TEXT, OPENMETRICS):
                want = from_scratch(snaps, accept)
                body, _, _ = ex.render(accept)
                assert body == want
                zipped, _, gz = ex.render(accept, want_gzip=True)
                assert gz and gzip.decompress(zipped) == want
                fresh = Exposition([lambda: snaps[0]]).render(accept)[0]
                assert fresh == want
    assert use_direct == (ex.stats["direct_fragments"] > 0)


def test_a_scrape_while_a_new_body_is_deflated_gets_the_last_finished_one():
    """A build puts its new body in place, then deflates it: a scrape that comes between
    gets the last gzip body finished, at once, and never the half-built one's wait (bench:
    scrape medians of 22-33 ms at 1 s scrapes where 5 ms was usual)."""
    import threading

    from rlhf_exporter.metrics.exposition import negotiate

    j = ("p", "e")
    snaps = [Snapshot("verl", True, rest=(), parts=((Sample("rlhf_step", j, 1.0),),))]
    now = [100.0]
    ex = Exposition([lambda: snaps[0]], clock=lambda: now[0])
    first, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    snaps[0] = Snapshot("verl", True, rest=(), parts=((Sample("rlhf_step", j, 2.0),),))
    encoder, ctype = negotiate(OPENMETRICS)
    now[0] = 115.0
    stale: list[bytes] = []
    with ex._lock:  # the warm thread mid-build: the new body placed, not yet deflated
        placed = ex._current(encoder, ctype)
        assert placed.gzipped is None and ex._bodies[ctype] is placed
        scrape = threading.Thread(
            target=lambda: stale.append(ex.render(OPENMETRICS, want_gzip=True)[0]), daemon=True
        )
        scrape.start()
        scrape.join(10)
        assert stale and stale[0] is first and ex.stats["served_while_building"] == 1
    # the warm thread times its next build by the scrapes, this one included
    now[0] = 116.0
    ex.warm()
    assert ex._wanted[ctype][1:3] == (115.0, 100.0)
    new, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    assert b'rlhf_step{experiment="e",project="p"} 2.0' in gzip.decompress(new)


def test_a_scrape_during_a_build_gets_the_last_body_at_once():
    """While a build holds the exposition (the warm thread after a poll), a scrape of a format
    that has a body gets that body without waiting; a format without one waits for the build."""
    import threading

    j = ("p", "e")
    snaps = [Snapshot("verl", True, rest=(), parts=((Sample("rlhf_step", j, 1.0),),))]
    ex = Exposition([lambda: snaps[0]])
    first, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    snaps[0] = Snapshot("verl", True, rest=(), parts=((Sample("rlhf_step", j, 2.0),),))
    stale: list[bytes] = []
    got: list[bytes] = []
    with ex._lock:  # a build under way
        scrape = threading.Thread(
            target=lambda: stale.append(ex.render(OPENMETRICS, want_gzip=True)[0]), daemon=True
        )
        scrape.start()
        scrape.join(10)
        assert stale and stale[0] is first and ex.stats["served_while_building"] == 1
        waiting = threading.Thread(target=lambda: got.append(ex.render(TEXT)[0]), daemon=True)
        waiting.start()  # text has no body yet: it waits for the lock
        waiting.join(0.5)
        assert waiting.is_alive() and not got
    waiting.join(30)
    assert got and b'rlhf_step{experiment="e",project="p"} 2.0' in got[0]
    body, _, _ = ex.render(OPENMETRICS, want_gzip=True)  # nothing under way: the new step
    assert b'project="p"} 2.0' in gzip.decompress(body)
