"""A job's samples, packed (rlhf_exporter/metrics/snapshot.py): the very samples
the tuple held, one array of doubles and a layout that jobs with the same series share."""

from __future__ import annotations

import gc
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from rlhf_exporter.demo.simulator import DEMO_PLAN, records
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics import lines as direct
from rlhf_exporter.metrics import snapshot
from rlhf_exporter.metrics.catalog import BY_NAME
from rlhf_exporter.metrics.snapshot import PackedSamples, Sample, pack

HEAD = ("proj", "exp")
text = st.text(max_size=12)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1.7976931348623157e308]),
    st.integers(min_value=-(2**53), max_value=2**53),
)
rows = st.lists(st.tuples(text, st.lists(text, max_size=3).map(tuple), values), max_size=40)


def bits(v: float) -> bytes:
    return struct.pack("<d", v)  # -0.0 and NaN compared exactly


@given(rows)
def test_packed_samples_are_the_samples_the_rows_describe(rs):
    packed = pack(HEAD, rs)
    want = [Sample(n, HEAD + e, float(v)) for n, e, v in rs]
    got = list(packed)
    assert len(packed) == len(want) == len(got)
    for g, w in zip(got, want, strict=True):
        assert type(g) is Sample and type(g.value) is float
        assert (g.name, g.labels, bits(g.value)) == (w.name, w.labels, bits(w.value))
    for i in range(len(want)):
        assert packed[i].labels == want[i].labels and bits(packed[i].value) == bits(want[i].value)
    assert [s.name for s in packed[1:3]] == [s.name for s in want[1:3]]
    if not any(v != v for _, _, v in rs):  # NaN is equal to nothing, as in a tuple
        assert packed == tuple(want) and tuple(want) == packed and packed == list(want)
        assert hash(packed) == hash(tuple(want))


def test_labels_without_extras_are_the_jobs_own_tuple():
    packed = pack(HEAD, [("rlhf_step", (), 3.0), ("rlhf_job_state", ("running",), 1.0)])
    first, second = packed
    assert first.labels is HEAD and second.labels == (*HEAD, "running")


def test_an_int_a_double_cannot_hold_keeps_the_plain_tuple():
    big = 2**53 + 1
    out = pack(HEAD, [("rlhf_step", (), big), ("rlhf_run", (), 1.0)])
    assert not isinstance(out, PackedSamples)
    assert out == (Sample("rlhf_step", HEAD, big), Sample("rlhf_run", HEAD, 1.0))
    huge = pack(HEAD, [("rlhf_step", (), 10**400)])
    assert huge == (Sample("rlhf_step", HEAD, 10**400),)


def test_jobs_with_the_same_series_share_one_layout_while_one_lives(thresholds):
    a, b = Job("p", "a", thresholds), Job("p", "b", thresholds)
    a.feed([Record(r["step"], r["data"]) for r in records(DEMO_PLAN, 0)][:40])
    b.feed([Record(r["step"], r["data"]) for r in records(DEMO_PLAN, 1)][:40])
    sa, sb = a.samples(), b.samples()
    assert isinstance(sa, PackedSamples) and isinstance(sb, PackedSamples)
    assert sa.layout is sb.layout  # the same names and labels: one copy for both jobs
    assert sa.values != sb.values  # but each job its own values
    assert all(s.labels[:2] == ("p", "a") for s in sa)
    assert all(s.labels[:2] == ("p", "b") for s in sb)
    key = (sa.layout.names, sa.layout.extras)
    assert snapshot._LAYOUTS.get(key) is sa.layout
    del a, b, sa, sb
    gc.collect()
    assert snapshot._LAYOUTS.get(key) is None  # no job holds it: the layout is gone too


JOB_METRICS = [m for m in BY_NAME.values() if m.labels[:2] == ("project", "experiment")]
label = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
hard = label | st.sampled_from(['"', "\\", "\n", 'a"b\\c\nd', "ünïcødé €𝄞", ""])


@st.composite
def job_rows(draw):
    out = []
    for metric in draw(st.lists(st.sampled_from(JOB_METRICS), min_size=1, max_size=20)):
        extra = tuple(draw(hard) for _ in metric.labels[2:])
        out.append((metric.name, extra, draw(st.floats(allow_nan=True, allow_infinity=True))))
    return out


@settings(max_examples=300, deadline=None)
@given(st.tuples(hard, hard), job_rows())
def test_a_packed_jobs_lines_are_its_samples_lines_one_by_one(head, rows):
    packed = pack(head, rows)
    assert isinstance(packed, PackedSamples)
    got = direct.lines(packed)
    assert got is not None
    assert got == direct.lines(list(packed))  # the generic writer, itself held to
    # prometheus_client's encoder by tests/test_exposition_direct.py


def test_a_packed_row_outside_the_catalog_takes_the_generic_path():
    packed = pack(HEAD, [("rlhf_step", (), 1.0), ("no_such_metric", (), 2.0)])
    assert direct.lines(packed) is None  # then prometheus_client's checked path
    wrong = pack(HEAD, [("rlhf_group_seconds_total", (), 1.0)])  # a label missing
    assert direct.lines(wrong) is None


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70))
def test_the_short_float_format_is_prometheus_clients(v):
    assert direct._go(v) == floatToGoString(v)
