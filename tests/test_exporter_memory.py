"""The exporter's per-job memory (issue 37): what is kept compactly is kept exactly.

- The job view's history, packed (`rlhf_exporter.job.packed_history`), gives back the very
  `StepPoint`s it was given, the last `limit` of them, whatever strings and missing numbers.
- A chunk of the exposition holds its fragments' lines (no fragment keeps its own copy); a
  chunk rebuilt after steps, new jobs and shifted chunk boundaries slices its unchanged
  fragments out of the chunks that held them, and the body stays byte for byte the one a
  from-scratch render gives; a step of one job rebuilds one chunk and keeps its unchanged
  families' deflate segments.
Work is counted, never timed.
"""

from __future__ import annotations

import gzip

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.diagnosis import GROUPS
from rlhf_exporter.diagnosis.history import StepPoint
from rlhf_exporter.job.packed_history import MAX_STRINGS, StepHistory, history_of
from rlhf_exporter.metrics import chunks as mod
from rlhf_exporter.metrics.exposition import Exposition
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.test_exposition_direct import OPENMETRICS, TEXT, from_scratch

finite = st.floats(allow_nan=False, allow_infinity=True)
optional = st.none() | finite
word = st.sampled_from(["rollout", "balanced", "none", "regression", "kv_pressure", "x"]) | (
    st.text(max_size=8)
)
points = st.builds(
    StepPoint,
    st.integers(0, 2**40),
    st.integers(-(2**53), 2**53),
    word,
    st.none() | word,
    finite,
    st.tuples(*[finite] * len(GROUPS)),
    finite,
    word,
    st.none() | word,
    optional,
    optional,
    optional,
    optional,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(points, max_size=80), st.integers(0, 70))
def test_the_packed_history_gives_back_the_last_points_exactly(pts, limit):
    h = StepHistory(limit=limit)
    for k, p in enumerate(pts):
        before = h
        h = h.appended(p)
        assert tuple(before) == tuple(pts[:k][-limit:] if limit else ())  # never changed
    want = tuple(pts[-limit:]) if limit else ()
    assert tuple(h) == want and len(h) == len(want) and h == want
    assert [repr(x) for x in h] == [repr(x) for x in want]  # -0.0, inf, None alike
    if want:
        assert h[-1] == want[-1] and h[0] == want[0] and h[1:] == want[1:]
    assert history_of(pts, limit) == want
    assert len(h._strings) <= max(MAX_STRINGS, 4 * limit)


def test_the_packed_history_redoes_its_string_table_when_it_outgrows_it():
    pts = [
        StepPoint(0, i, f"v{i}", f"r{i}", 1.0, (0.0,) * len(GROUPS), 0.0, "none", None, *[None] * 4)
        for i in range(3 * MAX_STRINGS)
    ]
    h = history_of(pts, 10)
    assert tuple(h) == tuple(pts[-10:])
    assert len(h._strings) <= MAX_STRINGS + 4


# -- the exposition's chunks ---------------------------------------------------------------
@pytest.fixture(scope="module")
def th():
    return load_thresholds()


class Files:
    def __init__(self, root):
        self.root, self.paths, self.streams = root, [], []
        self.regimes = list(REGIMES.values())

    def add(self) -> int:
        i = len(self.paths)
        path = self.root / f"team{i % 3}" / f"exp{i:03d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        regime = self.regimes[i % len(self.regimes)]
        stream = records([(regime, 10**6)], seed=i, validation=False)
        path.write_bytes(b"".join(encode(next(stream)) for _ in range(3)))
        self.paths.append(path)
        self.streams.append(stream)
        return i

    def step(self, i: int) -> None:
        with open(self.paths[i], "ab") as f:
            f.write(encode(next(self.streams[i])))


def placed_only(ex: Exposition) -> bool:
    return all(
        isinstance(v, mod.Placed)
        for f in (*ex._by_id.values(), *ex._by_value.values())
        for v in f.lines.values()
    )


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.integers(-1, 7), min_size=1, max_size=20),  # -1: a new job; else a step
    chunk=st.integers(1, 5),
    data=st.data(),
)
def test_rebuilt_chunks_give_the_from_scratch_body(
    tmp_path_factory, th, monkeypatch, ops, chunk, data
):
    monkeypatch.setattr(mod, "CHUNK", chunk)
    files = Files(tmp_path_factory.mktemp("verl"))
    for _ in range(4):
        files.add()
    src = VerlFileSource(th, [files.root])
    snaps = [src.poll_once()]
    ex = Exposition([lambda: snaps[0]])
    for k, op in enumerate(ops):
        if op < 0:
            files.add()  # sorted into the middle: the chunk boundaries after it move
        else:
            files.step(op % len(files.paths))
        snaps[0] = src.poll_once()
        if data.draw(st.booleans(), label=f"scrape after op {k}") or k == len(ops) - 1:
            for accept in (OPENMETRICS, TEXT):
                want = from_scratch(snaps, accept)
                zipped, _, gz = ex.render(accept, want_gzip=True)
                assert gz and gzip.decompress(zipped) == want
                assert ex.render(accept)[0] == want
            assert placed_only(ex)  # no fragment keeps a copy of what its chunk holds


def test_a_step_rebuilds_one_chunk_and_keeps_its_unchanged_segments(tmp_path, th):
    files = Files(tmp_path)
    for _ in range(40):
        files.add()
    src = VerlFileSource(th, [files.root])
    snaps = [src.poll_once()]
    ex = Exposition([lambda: snaps[0]])
    ex.render(OPENMETRICS, want_gzip=True)
    built, deflated = ex.stats["chunks_built"], ex.stats["segments_deflated"]
    chunk = next(c for c in ex._chunks.cache.values() if len(c.frags) == mod.CHUNK)
    files.step(20)
    snaps[0] = src.poll_once()
    zipped, _, _ = ex.render(OPENMETRICS, want_gzip=True)
    assert gzip.decompress(zipped) == from_scratch(snaps, OPENMETRICS)
    assert ex.stats["chunks_built"] == built + 1  # the stepped job's chunk only
    assert ex.stats["segments_reused"] > 0  # its families the step left as they were
    assert ex.stats["segments_deflated"] - deflated < len(chunk.raw)
    assert placed_only(ex)
