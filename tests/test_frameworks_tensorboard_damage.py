"""A damaged TensorBoard event file is counted, never silently cut short: a corrupt record
(`corrupt_event`) or a tail cut inside a record (`truncated_event`) is counted under the
reader's rejected reasons, and every good record before and after the damage is still
read (sources/event_records.py). TensorBoard's own EventFileLoader stops at the first
damaged record without a word."""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.sources.event_records import CORRUPT_EVENT, TRUNCATED_EVENT
from rlhf_exporter.sources.tensorboard_reader import TensorBoardReader
from tests.support import framework_output as fo

STEPS = 8


def _events_file(tmp: Path) -> Path:
    """One event file of STEPS slime steps (two scalars a step), as TensorBoard writes it."""
    scalars = [
        (s, {"perf/rollout_time": 50.0 + s, "perf/step_time": 80.0 + s}) for s in range(STEPS)
    ]
    (path,) = list(fo.write_tensorboard(tmp / "run", scalars).glob("*tfevents*"))
    return path


def _record_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record of an intact event file (its framing, for the test)."""
    spans, at = [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        end = at + 12 + length + 4
        spans.append((at, end))
        at = end
    return spans


def _read(path: Path) -> tuple[dict[int, float], TensorBoardReader]:
    reader = TensorBoardReader(path.parent)
    records = list(reader.poll()) + list(reader.finish())
    return {r.step: r.data["timing_s/gen"] for r in records if "timing_s/gen" in r.data}, reader


def test_a_corrupt_record_is_counted_and_the_records_after_it_are_read(tmp_path: Path) -> None:
    path = _events_file(tmp_path)
    data = bytearray(path.read_bytes())
    spans = _record_spans(bytes(data))
    _, end = spans[8]  # step 3's perf/step_time (record 0 is the file's version event)
    data[end - 6] ^= 0xFF  # one byte of its event: its checksum fails
    path.write_bytes(bytes(data))
    got, reader = _read(path)
    assert reader.rejected[CORRUPT_EVENT] == 1
    assert sorted(got) == list(range(STEPS))  # step 3 lost one scalar, not the rest of the file
    assert got[STEPS - 1] == 50.0 + STEPS - 1


def test_a_damaged_header_is_counted_once_and_reading_resumes(tmp_path: Path) -> None:
    path = _events_file(tmp_path)
    data = bytearray(path.read_bytes())
    start, _ = _record_spans(bytes(data))[5]
    data[start + 1] ^= 0x40  # its length: the header's checksum fails
    data[start + 9] ^= 0x01
    path.write_bytes(bytes(data))
    got, reader = _read(path)
    assert reader.rejected[CORRUPT_EVENT] == 1
    assert set(range(3, STEPS)) <= set(got)


def test_a_truncated_tail_is_counted_when_the_input_ends(tmp_path: Path) -> None:
    path = _events_file(tmp_path)
    data = path.read_bytes()
    start, end = _record_spans(data)[-1]
    path.write_bytes(data[: (start + end) // 2])
    reader = TensorBoardReader(path.parent)
    got = list(reader.poll())
    assert reader.rejected[TRUNCATED_EVENT] == 0  # a record still being written: held
    got += list(reader.finish())
    assert reader.rejected[TRUNCATED_EVENT] == 1
    assert [r.step for r in got] == list(range(STEPS))


def test_an_intact_file_has_nothing_rejected(tmp_path: Path) -> None:
    got, reader = _read(_events_file(tmp_path))
    assert sorted(got) == list(range(STEPS)) and sum(reader.rejected.values()) == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1),
            st.sampled_from(["flip", "cut", "insert", "zeros"]),
            st.binary(max_size=40),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_hostile_bytes_never_crash_and_untouched_steps_are_read(
    tmp_path_factory: object, damage: list[tuple[float, str, bytes]]
) -> None:
    """Any damage: nothing raises; a step none of whose records was touched is read with
    its values; the damage is counted."""
    tmp = tmp_path_factory.mktemp("tb")  # type: ignore[attr-defined]
    path = _events_file(tmp)
    data = bytearray(path.read_bytes())
    spans = _record_spans(bytes(data))
    touched: set[int] = set()  # record indices a change reached (by the original offsets)
    used: set[int] = set()
    size = len(data)
    for where, kind, junk in sorted(damage, reverse=True):  # from the end: offsets stay true
        at = int(where * (size - 1))
        if at in used:  # (two flips of one byte undo each other)
            continue
        used.add(at)
        if kind == "flip":
            data[at] ^= 0xA5
        elif kind == "cut":
            del data[at : at + 1 + len(junk)]
        elif kind == "insert":
            data[at:at] = junk or b"\x01"
        else:
            data[at : at + 16] = b"\x00" * 16
        hit_end = at + max(16, len(junk) + 1)
        touched |= {i for i, (s, e) in enumerate(spans) if s < hit_end and at < e}
    path.write_bytes(bytes(data))
    got, reader = _read(path)
    # records 1 + 2k and 2 + 2k are step k's two scalars
    whole = {k for k in range(STEPS) if not {1 + 2 * k, 2 + 2 * k} & touched}
    for k in whole:
        assert got.get(k) == 50.0 + k, (k, touched)
    damaged = touched - {0}
    if damaged and touched != {len(spans) - 1}:
        assert reader.rejected[CORRUPT_EVENT] + reader.rejected[TRUNCATED_EVENT] >= 1
