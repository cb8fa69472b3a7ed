"""The streaming JSONL reader: every good record exactly once, every bad line counted."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.sources.verl_reader import RecordReader, parse_line

GOOD = st.builds(
    lambda step, data: {"step": step, "data": data},
    st.integers(min_value=0, max_value=10**6),
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(-10, 10**9),
            st.none(),
            st.booleans(),
            st.text(max_size=8),
        ),
        max_size=6,
    ),
)

# (line bytes, the reason it must be rejected)
GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=40)
    .filter(lambda b: b"\n" not in b)
    .map(lambda b: (b"\xff" + b, "not_utf8")),
    st.text(alphabet="abc{}[]:,", min_size=1, max_size=20)
    .filter(lambda t: _not_json(t))
    .map(lambda t: (t.encode(), "invalid_json")),
    st.sampled_from(
        [
            (b"[1, 2]", "not_object"),
            (b"42", "not_object"),
            (b'"step"', "not_object"),
            (b'{"data": {}}', "bad_step"),
            (b'{"step": "3", "data": {}}', "bad_step"),
            (b'{"step": true, "data": {}}', "bad_step"),
            (b'{"step": 1.5, "data": {}}', "bad_step"),
            (b'{"step": null, "data": {}}', "bad_step"),
            (b'{"step": 3}', "bad_data"),
            (b'{"step": 3, "data": [1]}', "bad_data"),
            (b'{"step": 3, "data": null}', "bad_data"),
            (b"", "empty_line"),
            (b"   ", "empty_line"),
            (b'{"step": 3, "data": {"a": 1}', "invalid_json"),
        ]
    ),
)


def _not_json(text: str) -> bool:
    try:
        orjson.loads(text)
        return False
    except orjson.JSONDecodeError:
        return True


def feed_in_pieces(reader: RecordReader, data: bytes, cuts: list[int]) -> list:
    out, start = [], 0
    for cut in sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]:
        out += list(reader.feed(data[start:cut]))
        start = cut
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(GOOD.map(lambda r: ("good", r)), GARBAGE.map(lambda g: ("bad", g))), max_size=40
    ),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=8),
)
def test_garbage_interleaved_every_good_record_once_rejections_counted(items, cuts):
    data = b"".join((orjson.dumps(x) if kind == "good" else x[0]) + b"\n" for kind, x in items)
    reader = RecordReader()
    got = feed_in_pieces(reader, data, cuts)
    reader.finish()
    want = [x for kind, x in items if kind == "good"]
    assert [(r.step, r.data) for r in got] == [(w["step"], w["data"]) for w in want]
    expected: dict[str, int] = {}
    for kind, x in items:
        if kind == "bad":
            expected[x[1]] = expected.get(x[1], 0) + 1
    assert dict(reader.rejected) == expected
    assert reader.records == len(want)


def test_half_written_last_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "job.jsonl"
    line = orjson.dumps({"step": 1, "data": {"timing_s/step": 3.0}}) + b"\n"
    reader = RecordReader()
    got = []
    with open(path, "wb", buffering=0) as w, open(path, "rb") as r:
        for i in range(len(line)):  # verl's writer, seen one byte at a time
            w.write(line[i : i + 1])
            got += list(reader.feed(r.read()))
            if i < len(line) - 1:
                assert got == [] and reader.pending_bytes == i + 1
    assert [g.step for g in got] == [1] and not reader.rejected


def test_unfinished_line_at_the_end_is_counted_never_parsed():
    reader = RecordReader()
    assert list(reader.feed(b'{"step": 1, "data": {}}\n{"step": 2, "data": {}}')) != []
    reader.finish()
    assert reader.records == 1 and reader.rejected == {"incomplete_line": 1}


def test_truncated_and_rewritten_file_is_read_again_from_the_start(tmp_path):
    path = tmp_path / "job.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps({"step": i, "data": {}}) + b"\n" for i in range(5)) + b'{"step": 5,'
    )
    reader = RecordReader()
    first = list(reader.feed(path.read_bytes()))
    path.write_bytes(orjson.dumps({"step": 0, "data": {"x": 1}}) + b"\n")  # verl restarted
    reader.reset()  # the tail noticed the size shrink
    second = list(reader.feed(path.read_bytes()))
    assert [r.step for r in first] == [0, 1, 2, 3, 4]
    assert [(r.step, r.data) for r in second] == [(0, {"x": 1})]
    assert not reader.rejected


def test_over_long_line_is_skipped_without_being_buffered():
    reader = RecordReader(max_line=1000)
    good = orjson.dumps({"step": 7, "data": {}}) + b"\n"
    got = list(reader.feed(good))
    for _ in range(50):  # 50 KB of one line, in pieces
        got += list(reader.feed(b"x" * 1000))
        assert reader.pending_bytes <= 1000
    got += list(reader.feed(b"yyy\n" + good))
    assert [r.step for r in got] == [7, 7]
    assert reader.rejected == {"too_long": 1}


def test_old_verl_nan_tokens_parse_as_missing():
    record = parse_line(
        b'{"step": 2, "data": {"timing_s/gen": NaN, "x": Infinity, "y": -Infinity, "z": 1.0}}'
    )
    assert record.data == {"timing_s/gen": None, "x": None, "y": None, "z": 1.0}


def test_duplicate_keys_last_wins_and_crlf_is_tolerated():
    record = parse_line(b'{"step": 2, "data": {"a": 1, "a": 2}, "step": 3}\r')
    assert (record.step, record.data) == (3, {"a": 2})


def test_huge_integers_and_deep_nesting_are_handled():
    assert parse_line(b'{"step": 1, "data": {"k": 123456789012345678901234567890}}').data["k"] > 0
    assert parse_line(b"[" * 100000 + b"]" * 100000) in ("invalid_json", "not_object")


def test_reading_a_whole_real_file_in_small_chunks_equals_one_read(tmp_path):
    from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl

    path = tmp_path / "demo.jsonl"
    write_jsonl(path, DEMO_PLAN)
    data = path.read_bytes()
    whole = list(RecordReader().feed(data))
    assert len(whole) == sum(n for _, n in DEMO_PLAN) + 1
    for size in (7, 777):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert any(not c.endswith(b"\n") for c in chunks[:-1])  # lines do straddle chunks
        reader = RecordReader()
        pieces = [r for c in chunks for r in reader.feed(c)]
        reader.finish()
        assert pieces == whole, size
        assert (reader.records, reader.pending_bytes) == (len(whole), 0)


def test_a_byte_order_mark_does_not_cost_the_first_record():
    record = parse_line(b'\xef\xbb\xbf{"step": 1, "data": {"timing_s/step": 2.0}}')
    assert record.step == 1
