"""GPU health from NVML (issue 23), through the scripted fake `pynvml` at the import boundary:
each reading supported, not supported (normal: asked once, shown once, never an error), and
a GPU lost mid-run; the job every GPU series carries (configured, or the window board's)."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from rlhf_exporter.diagnosis.timeline import Timeline
from rlhf_exporter.diagnosis.xid import BAD_GPU, DEGRADED, LABELLED, LOST, xid_label
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.nvml_readings import MAX_EVENTS
from tests.support import fake_pynvml
from tests.support.fake_pynvml import HEALTH_CALLS, FakeClock, FakeGpu, make_module

HEALTH = (
    "rlhf_gpu_xid_errors_total",
    "rlhf_gpu_ecc_errors_total",
    "rlhf_gpu_remapped_rows",
    "rlhf_gpu_row_remap_pending",
    "rlhf_gpu_row_remap_failed",
    "rlhf_gpu_retired_pages",
    "rlhf_gpu_retired_pages_pending",
    "rlhf_gpu_throttle_seconds_total",
)


def series(snap, name, gpu=None):
    """{labels without the job: value} (of one GPU when `gpu` is given); the job labels are
    checked by the job tests."""
    return {
        s.labels[:-2]: s.value
        for s in snap.samples
        if s.name == name and gpu in (None, s.labels[0])
    }


@pytest.fixture
def nvml(monkeypatch):
    def make(gpus, clock):
        monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
        return NvmlSource(1.0, roles=False, clock=clock)

    return make


def test_every_health_reading_supported(nvml):
    clock = FakeClock()
    gpu = FakeGpu(
        0,
        ecc={(0, 0): 5, (0, 1): 40, (1, 0): 1, (1, 1): 2},  # (error type, counter type)
        remapped_rows=(3, 1, 1, 0),
        throttle=0x04 | 0x40,  # power cap and hardware thermal slowdown
    )
    src = nvml([gpu, FakeGpu(1)], clock)
    src.poll_once()
    gpu.xids += [79, 13, 13, 999]  # fell off the bus, two app errors, one unknown code
    for _ in range(4):
        clock.advance(1.0)
        snap = src.poll_once()
    u, k = gpu.uuid, ("0", gpu.uuid, "unknown")
    xids = series(snap, "rlhf_gpu_xid_errors_total")
    assert {key: v for key, v in xids.items() if v} == {
        (*k, "79"): 1.0,
        (*k, "13"): 2.0,
        (*k, "other"): 1.0,
    }
    assert series(snap, "rlhf_gpu_ecc_errors_total", "0") == {
        (*k, "corrected", "volatile"): 5.0,
        (*k, "corrected", "aggregate"): 40.0,
        (*k, "uncorrected", "volatile"): 1.0,
        (*k, "uncorrected", "aggregate"): 2.0,
    }
    assert series(snap, "rlhf_gpu_remapped_rows", "0") == {
        (*k, "correctable"): 3.0,
        (*k, "uncorrectable"): 1.0,
    }
    assert series(snap, "rlhf_gpu_row_remap_pending")[k] == 1.0
    assert series(snap, "rlhf_gpu_row_remap_failed")[k] == 0.0
    assert "rlhf_gpu_retired_pages" not in {s.name for s in snap.samples}  # rows remapped instead
    throttle = series(snap, "rlhf_gpu_throttle_seconds_total")
    assert throttle[(*k, "power_cap")] == pytest.approx(4.0)  # 4 polls 1 s apart
    assert throttle[(*k, "hw_thermal")] == pytest.approx(4.0)
    assert throttle[(*k, "sw_thermal")] == 0.0 and throttle[(*k, "hw_slowdown")] == 0.0
    # the other GPU: the alerted XIDs at 0 from the start (so that increase() sees the first
    # one), no other code, counters at 0, no throttling
    other = ("1", FakeGpu(1).uuid, "unknown")
    assert {key[3]: v for key, v in xids.items() if key[0] == "1"} == {
        str(c): 0.0 for c in BAD_GPU | LOST | DEGRADED
    }
    assert series(snap, "rlhf_gpu_throttle_seconds_total")[(*other, "power_cap")] == 0.0
    assert "rlhf_gpu_reading_unsupported" not in {s.name for s in snap.samples}
    assert u and snap.up and snap.errors == {}


def test_older_gpu_retired_pages_instead_of_remapped_rows(nvml):
    clock = FakeClock()
    gpu = FakeGpu(
        0,
        unsupported={"nvmlDeviceGetRemappedRows"},
        retired_pages={0: [0x1000, 0x2000], 1: [0x3000]},
        retired_pending=1,
    )
    src = nvml([gpu], clock)
    snap = src.poll_once()
    k = ("0", gpu.uuid, "unknown")
    assert series(snap, "rlhf_gpu_retired_pages") == {
        (*k, "multiple_single_bit"): 2.0,
        (*k, "double_bit"): 1.0,
    }
    assert series(snap, "rlhf_gpu_retired_pages_pending") == {k: 1.0}
    assert "rlhf_gpu_remapped_rows" not in {s.name for s in snap.samples}


def test_not_supported_is_asked_once_shown_once_never_an_error(nvml, caplog):
    clock = FakeClock()
    gpus = [FakeGpu(i, unsupported=set(HEALTH_CALLS)) for i in range(8)]
    src = nvml(gpus, clock)
    caplog.set_level(logging.INFO, logger="rlhf_exporter")
    snap = src.poll_once()
    calls = [g.calls for g in gpus]
    for _ in range(30):
        clock.advance(1.0)
        snap = src.poll_once()
    assert snap.up and snap.errors == {}
    names = {s.name for s in snap.samples}
    assert not names & set(HEALTH)
    assert not any(v for v in series(snap, "rlhf_gpu_errors_total").values())  # never an error
    per_gpu = {
        "ecc",
        "remapped_rows",
        "retired_pages",
        "retired_pages_pending",
        "throttle",
        "xid_events",
    }
    shown = series(snap, "rlhf_gpu_reading_unsupported")
    assert shown == {(str(i), gpus[i].uuid, r): 1.0 for i in range(8) for r in per_gpu}
    # asked once: afterwards a poll costs the readings the GPU has (samples, memory,
    # power, temperature, clock, processes are off here: 5 calls a poll)
    assert [g.calls - c for g, c in zip(gpus, calls)] == [5 * 30] * 8
    # one log line per GPU and reading, at info, none after the first poll
    lines = [r for r in caplog.records if "does not report" in r.getMessage()]
    assert len(lines) == 8 * len(per_gpu) and {r.levelno for r in lines} == {logging.INFO}


def test_gpu_lost_mid_run(nvml):
    clock = FakeClock()
    gpus = [FakeGpu(i, throttle=0x08) for i in range(4)]
    src = nvml(gpus, clock)
    for _ in range(3):
        clock.advance(1.0)
        snap = src.poll_once()
    # issue 38: every GPU's known reason is served from 0, so that the GPU-lost alert's
    # increase() sees the first loss (a series born at 1 shows no increase)
    zeros = {(str(i), g.uuid, "unknown", "gpu_is_lost"): 0.0 for i, g in enumerate(gpus)}
    assert series(snap, "rlhf_gpu_errors_total") == zeros
    gpus[2].fail = fake_pynvml.NVML_ERROR_GPU_IS_LOST
    gpus[2].xids.append(79)  # the driver reports the fall off the bus as an XID
    for _ in range(5):
        clock.advance(1.0)
        snap = src.poll_once()
    assert snap.up  # the three others go on
    lost = ("2", gpus[2].uuid, "unknown")
    assert series(snap, "rlhf_gpu_errors_total") == {**zeros, (*lost, "gpu_is_lost"): 5.0}
    xids = series(snap, "rlhf_gpu_xid_errors_total")
    assert {key: v for key, v in xids.items() if v} == {(*lost, "79"): 1.0}
    # the lost GPU's readings stop (no stale health values), the others' keep counting
    throttle = series(snap, "rlhf_gpu_throttle_seconds_total")
    assert not [k for k in throttle if k[0] == "2"]
    assert throttle[("0", gpus[0].uuid, "unknown", "hw_slowdown")] == pytest.approx(7.0)
    # it answers again: the throttle integral restarts from the next reading, the lost
    # seconds are not counted as throttled (the gap is capped)
    gpus[2].fail = None
    clock.advance(1.0)
    snap = src.poll_once()
    before = series(snap, "rlhf_gpu_throttle_seconds_total")[(*lost, "hw_slowdown")]
    assert before <= 3.0 + 5.0  # at most MAX_THROTTLE_GAP polls for the gap
    assert series(snap, "rlhf_gpu_errors_total") == {**zeros, (*lost, "gpu_is_lost"): 5.0}


def test_xid_labels_are_bounded_and_events_read_per_poll_bounded(nvml):
    clock = FakeClock()
    gpu = FakeGpu(0)
    src = nvml([gpu], clock)
    src.poll_once()
    gpu.xids += list(range(1, 1001)) + [48] * (MAX_EVENTS)  # 1,000 codes, then 256 DBEs
    for _ in range(6):
        clock.advance(1.0)
        snap = src.poll_once()
    xids = series(snap, "rlhf_gpu_xid_errors_total")
    assert sum(xids.values()) == 1000 + MAX_EVENTS  # every event counted, over several polls
    assert len(xids) <= len(LABELLED) + 1  # the codes it labels, plus "other"
    assert xids[("0", gpu.uuid, "unknown", "48")] == MAX_EVENTS + 1
    assert (
        xid_label(48) == "48" and xid_label(12345) == "other" and 79 in LOST and 79 not in BAD_GPU
    )


# -- the job every GPU series carries ------------------------------------------------------------
def _step(step: int, end: float) -> Timeline:
    return Timeline(step, end - 10.0, end, (), 0.0)


def test_gpu_series_carry_the_job_of_the_board(monkeypatch):
    clock = FakeClock()
    gpus = [FakeGpu(0), FakeGpu(1)]
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
    board = WindowBoard()
    now = [time.time()]
    src = NvmlSource(1.0, roles=False, clock=clock, wall=lambda: now[0], windows=board)

    def jobs(snap):
        return {s.labels[-2:] for s in snap.samples if s.name.startswith("rlhf_gpu_")}

    assert jobs(src.poll_once()) == {("", "")}  # nothing known yet: no job
    board.post(("proj", "exp"), _step(1, now[0]))
    assert jobs(src.poll_once()) == {("proj", "exp")}
    # the job stalls: no step for an hour, its GPUs keep its name (the stall and a lost GPU
    # must meet on the same labels)
    now[0] += 3600
    assert jobs(src.poll_once()) == {("proj", "exp")}
    # a new job takes the node
    board.post(("proj", "exp2"), _step(1, now[0]))
    assert jobs(src.poll_once()) == {("proj", "exp2")}
    # two jobs stepping here at once: NVML cannot tell whose GPU it is, so neither
    board.post(("other", "x"), _step(1, now[0]))
    assert jobs(src.poll_once()) == {("", "")}
    # window series keep their own job labels (the join's), never the GPUs'
    window = [s for s in src.poll_once().samples if s.name.startswith("rlhf_window_")]
    assert all(len(s.labels) == 4 for s in window)


def test_configured_job_wins(monkeypatch):
    clock = FakeClock()
    monkeypatch.setitem(sys.modules, "pynvml", make_module([FakeGpu(0)], clock))
    board = WindowBoard()
    board.post(("proj", "exp"), _step(1, time.time()))
    src = NvmlSource(1.0, roles=False, clock=clock, windows=board, job=("conf", "job"))
    snap = src.poll_once()
    assert {s.labels[-2:] for s in snap.samples if s.name.startswith("rlhf_gpu_")} == {
        ("conf", "job")
    }


def test_throttled_time_is_joined_to_the_step_windows(monkeypatch):
    """Clocks held down by heat during the update window only: the window join counts the
    throttled GPU-seconds there, none in the rollout window (the alert names the window)."""
    from rlhf_exporter.diagnosis.timeline import Interval

    clock = FakeClock()
    gpus = [FakeGpu(0, util=[(0, 50)]), FakeGpu(1, util=[(0, 50)])]
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
    board = WindowBoard()
    src = NvmlSource(1.0, roles=False, clock=clock, wall=clock, windows=board)
    t0 = clock() + 1.0
    intervals = (
        Interval("gen", "rollout", t0, t0 + 5.0),
        Interval("update_actor", "update", t0 + 5.0, t0 + 10.0),
    )
    board.post(("p", "e"), Timeline(1, t0, t0 + 10.0, intervals, 0.0))
    src.poll_once()
    for _ in range(13):  # a reading covers the time since the one before it
        clock.advance(1.0)
        snap = src.poll_once()
        gpus[0].throttle = 0x20 if clock() >= t0 + 5.0 else 0x04  # power cap is not counted
    throttled = {
        s.labels: s.value
        for s in snap.samples
        if s.name == "rlhf_window_gpu_throttled_seconds_total"
    }
    total = {s.labels: s.value for s in snap.samples if s.name == "rlhf_window_gpu_seconds_total"}
    assert total[("p", "e", "update", "unknown")] == pytest.approx(10.0)  # 2 GPUs x 5 s
    assert throttled[("p", "e", "update", "unknown")] == pytest.approx(5.0)  # GPU 0's 5 s
    assert throttled[("p", "e", "rollout", "unknown")] == pytest.approx(0.0)


def test_a_node_whose_only_gpu_is_lost_still_says_so(nvml):
    """Every GPU lost (a one-GPU node): the source is down (all_gpus_failed, counted once),
    and the lost GPU's counter still grows with its job's labels, for RLHFGPULost."""
    clock = FakeClock()
    gpu = FakeGpu(0)
    src = nvml([gpu], clock)
    src.configured_job = ("p", "e")
    src.poll_once()
    gpu.fail = fake_pynvml.NVML_ERROR_GPU_IS_LOST
    for _ in range(3):
        clock.advance(1.0)
        snap = src.poll_once()
    assert not snap.up and snap.errors == {"all_gpus_failed": 1}
    lost = [s for s in snap.samples if s.name == "rlhf_gpu_errors_total"]
    assert [(s.labels, s.value) for s in lost] == [
        (("0", gpu.uuid, "unknown", "gpu_is_lost", "p", "e"), 3.0)
    ]
