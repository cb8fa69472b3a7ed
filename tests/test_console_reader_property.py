"""sources/console_reader.py over random console streams split at random chunk boundaries:
the records are those of the whole stream fed at once, it never raises, and what it holds
back stays within max_line."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.sources.console_reader import ConsoleReader

MAX_LINE = 300

VALUES = st.sampled_from(
    [b"5", b"-1", b"0.1", b"1e-05", b"nan", b"inf", b"True", b"np.float64(0.25)",
     b"np.int64(3)", b"np.float32(0.1)", b"np.float64(nan)", b"Decimal('1')", b"", b"x"]
)  # fmt: skip
KEYS = st.sampled_from([b"timing_s/step", b"timing_s/gen", b"perf/mfu/actor", b"a:b", b""])
PREFIXES = st.sampled_from(
    [b"", b"(TaskRunner pid=1) ", b"\x1b[36m(TaskRunner pid=1, ip=10.0.0.2)\x1b[0m ",
     b"(WorkerDict pid=2) ", b"(pid=3) ", b"bar 50%\r", b"\x1b]0;t\x07"]
)  # fmt: skip
SUFFIXES = st.sampled_from([b"", b" [repeated 2x across cluster]", b"\r", b" "])


@st.composite
def step_line(draw: st.DrawFn) -> bytes:
    step = draw(st.integers(-3, 2**54)) if draw(st.booleans()) else draw(st.integers(0, 50))
    fields = draw(st.lists(st.tuples(KEYS, VALUES), max_size=6))
    body = b"step:%d" % step + b"".join(b" - " + k + b":" + v for k, v in fields)
    return draw(PREFIXES) + body + draw(SUFFIXES)


OTHER = st.sampled_from(
    [b"INFO vllm Received request step: 1", b":actor_name:TaskRunner", b":actor_name:WorkerDict",
     b"(TaskRunner pid=1)  'project_name': 'p',", b"'experiment_name': ('a'", b"  'b'),",
     b"'experiment_name': None,", b"x" * 400, b"\xff\xfe\x00", b""]
)  # fmt: skip
LINES = st.one_of(step_line(), OTHER, st.binary(max_size=60))


@st.composite
def stream_and_cuts(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    lines = draw(st.lists(LINES, max_size=25))
    data = b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    return data, cuts


def run(data: bytes, cuts: list[int]) -> tuple[list, ConsoleReader]:
    r = ConsoleReader(MAX_LINE)
    out = []
    bounds = [0, *cuts, len(data)]
    for a, b in itertools.pairwise(bounds):
        for rec in r.feed(data[a:b]):
            out.append((rec.step, dict(rec.data), r.identity))
        assert r.pending_bytes <= MAX_LINE
    r.finish()
    return out, r


@settings(max_examples=400, deadline=None)
@given(stream_and_cuts())
def test_chunking_never_changes_the_records(sc):
    data, cuts = sc
    whole, rw = run(data, [])
    split, rs = run(data, cuts)
    assert split == whole
    assert rs.identity == rw.identity
    assert rs.lines == rw.lines == data.count(b"\n")
    assert rs.rejected == rw.rejected
