"""The NVML source, through a scripted fake `pynvml` injected at the import boundary, and the
real nvidia-ml-py on this GPU-less machine (LibraryNotFound). Role attribution against a
real Ray head's actor PIDs is in tests/test_ray_source.py (it shares that module's head)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlhf_exporter.metrics.catalog import NAMES
from rlhf_exporter.metrics.families import families
from rlhf_exporter.settings import resolve as resolve_settings
from rlhf_exporter.sources.base import Context
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.nvml_readings import error_reason
from rlhf_exporter.sources.ray import ActorProcess
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeClock, FakeGpu, FakeRay, make_module
from tests.support.families import SnapshotCollector
from tests.support.procs import wait_until
from tests.support.serve import Exporter


def _arity(module, name):
    """Positional parameters of a fake function (a device call: its scripted result's)."""
    fn = getattr(module, name)
    return len(inspect.signature(getattr(fn, "result", fn)).parameters)


def values(snapshot, name, job=("", "")):
    """{labels tuple: value} of one metric in a snapshot; a GPU series' labels without its
    job (project, experiment), which must be `job`."""
    out = {}
    for s in snapshot.samples:
        if s.name == name:
            labels = s.labels
            if name.startswith("rlhf_gpu_"):
                assert labels[-2:] == job, (name, labels)
                labels = labels[:-2]
            out[labels] = s.value
    return out


@pytest.fixture
def install(monkeypatch):
    def install(gpus, clock=None, **kwargs):
        module = make_module(gpus, clock, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


# -- the fake is faithful to the real module where the source touches it ---------------------
def test_fake_mirrors_real_pynvml_names_values_and_exceptions():
    real = importlib.import_module("pynvml")
    if getattr(real, "__file__", "") == fake_pynvml.__file__:
        pytest.skip("the fake is installed")
    fake = make_module([FakeGpu(0)])
    for name, value in {**fake_pynvml.ERRORS, **fake_pynvml.CONSTANTS}.items():
        assert getattr(real, name) == value, name
    used = [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]
    assert len(used) >= 14
    for name in used:
        assert callable(getattr(real, name)), f"real pynvml has no {name}"
    # the health readings' functions take what the real ones take (their positional arity)
    for name in (
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetCreate",
        "nvmlEventSetFree",
    ):
        assert name in used, name
        assert len(inspect.signature(getattr(real, name)).parameters) == _arity(fake, name), name
    # the source's own copies of the throttle bits are pynvml's
    from rlhf_exporter.sources.nvml_readings import THROTTLE_REASONS, XID_EVENT

    assert real.nvmlEventTypeXidCriticalError == XID_EVENT
    assert {
        "power_cap": real.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": real.nvmlClocksEventReasonHwSlowdown,
        "sw_thermal": real.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal": real.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake": real.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    } == THROTTLE_REASONS
    for name in [n for n in dir(fake) if n.startswith("NVMLError")]:
        assert issubclass(getattr(real, name), real.NVMLError), name
        # the same factory behaviour: NVMLError(value) is the subclass; subclasses need no arg
        value = getattr(fake, name)().value if name != "NVMLError" else None
        if value is not None:
            assert (
                type(real.NVMLError(value)).__name__ == type(fake.NVMLError(value)).__name__ == name
            )
    assert (
        error_reason(real.NVMLError_GpuIsLost())
        == error_reason(fake.NVMLError_GpuIsLost())
        == "gpu_is_lost"
    )
    assert error_reason(real.NVMLError_LibraryNotFound()) == "library_not_found"


# -- busy seconds integrate exactly ----------------------------------------------------------
def test_busy_seconds_integrate_nvml_samples_exactly(install):
    clock = FakeClock()
    gpus = [FakeGpu(i, util=[(0, 50), (10, 100)]) for i in range(2)]
    install(gpus, clock)
    src = NvmlSource(1.0, roles=False, clock=clock)
    busy = []
    for _ in range(20):
        clock.advance(1.0)
        snap = src.poll_once()
        assert snap.up, snap.errors
        busy.append(values(snap, "rlhf_gpu_busy_seconds_total")[("0", gpus[0].uuid)])
    # 50 % for 10 s then 100 % for 10 s: 15 busy-seconds (the first sample only starts the
    # integral, at t=0, so nothing is lost here; allow one sample period in general)
    assert busy[-1] == pytest.approx(15.0, abs=1 / 6)
    assert busy[9] == pytest.approx(5.0, abs=1 / 6)  # first 10 s at 50 %
    assert busy == sorted(busy)  # a counter
    samples = values(snap, "rlhf_gpu_samples_total")[("0", gpus[0].uuid)]
    assert samples == pytest.approx(20 * 6, abs=1)  # 6 samples a second, all integrated
    assert values(snap, "rlhf_gpu_utilization_ratio")[("0", gpus[0].uuid)] == 1.0


def test_samples_between_polls_are_not_missed(install):
    """A 0.5 s idle gap between two 1 s polls counts: the point of integrating NVML's buffer."""
    clock = FakeClock()
    gpu = FakeGpu(0, util=[(0, 100), (2.0, 0), (2.5, 100)], sample_period=0.1)
    install([gpu], clock)
    src = NvmlSource(1.0, roles=False, clock=clock)
    for _ in range(4):
        clock.advance(1.0)
        snap = src.poll_once()
    assert values(snap, "rlhf_gpu_busy_seconds_total")[("0", gpu.uuid)] == pytest.approx(
        3.5, abs=0.1
    )


def test_fallback_integrates_utilization_times_elapsed(install):
    clock = FakeClock()
    gpus = [FakeGpu(0, util=[(0, 50), (10, 100)], supports_samples=False)]
    install(gpus, clock)
    src = NvmlSource(1.0, roles=False, clock=clock)
    src.poll_once()  # t=0: the first reading only starts the integral
    for _ in range(20):
        clock.advance(1.0)
        snap = src.poll_once()
    busy = values(snap, "rlhf_gpu_busy_seconds_total")[("0", gpus[0].uuid)]
    assert busy == pytest.approx(15.0, abs=0.5 + 1e-9)
    assert values(snap, "rlhf_gpu_samples_total")[("0", gpus[0].uuid)] == 20


def test_all_readings_and_identity(install):
    clock = FakeClock()
    gpu = FakeGpu(
        0, util=[(0, 40)], memory_used=7 * 2**30, power_mw=250_500, temperature=71, sm_mhz=1410
    )
    install([gpu], clock, driver="550.54.15")
    src = NvmlSource(1.0, roles=False, clock=clock)
    clock.advance(1.0)
    snap = src.poll_once()
    key = ("0", gpu.uuid)
    assert values(snap, "rlhf_gpu_info") == {("0", gpu.uuid, gpu.name, "550.54.15"): 1.0}
    assert values(snap, "rlhf_gpu_memory_used_bytes")[key] == 7 * 2**30
    assert values(snap, "rlhf_gpu_memory_total_bytes")[key] == 80 * 2**30
    assert values(snap, "rlhf_gpu_power_watts")[key] == 250.5
    assert values(snap, "rlhf_gpu_temperature_celsius")[key] == 71
    assert values(snap, "rlhf_gpu_sm_clock_hertz")[key] == 1410e6
    assert values(snap, "rlhf_gpu_utilization_ratio")[key] == 0.4
    assert "rlhf_gpu_role_memory_bytes" not in {s.name for s in snap.samples}  # roles off
    # exposition: every name is in the catalog, and prometheus_client renders it
    registry = CollectorRegistry()
    registry.register(SnapshotCollector([src.snapshot]))
    text = generate_latest(registry).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "rlhf_gpu_busy_seconds_total" in names and 'collector="nvml"' in text
    assert {f.name if f.type != "counter" else f.name + "_total" for f in families([snap])} <= NAMES


def test_unsupported_readings_are_left_out_not_errors(install):
    clock = FakeClock()
    gpu = FakeGpu(
        0, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses"}
    )
    install([gpu], clock)
    src = NvmlSource(1.0, roles=True, clock=clock)
    clock.advance(1.0)
    snap = src.poll_once()
    names = {s.name for s in snap.samples}
    assert (
        snap.up
        and "rlhf_gpu_power_watts" not in names
        and "rlhf_gpu_role_memory_bytes" not in names
    )
    assert "rlhf_gpu_temperature_celsius" in names
    assert values(snap, "rlhf_gpu_errors_total") == {("0", gpu.uuid, "unknown", "gpu_is_lost"): 0}
    calls = gpu.calls
    clock.advance(1.0)
    src.poll_once()
    # samples, memory, temperature, clock, 4 ECC counters, remapped rows, throttle reasons:
    # unsupported readings (power, processes) are not asked again
    assert gpu.calls - calls == 10
    unsupported = values(snap, "rlhf_gpu_reading_unsupported")
    assert unsupported == {("0", gpu.uuid, "power"): 1.0, ("0", gpu.uuid, "processes"): 1.0}


# -- faults --------------------------------------------------------------------------------
def test_gpu_is_lost_on_one_of_eight(install, caplog):
    clock = FakeClock()
    gpus = [FakeGpu(i, util=[(0, 100)]) for i in range(8)]
    install(gpus, clock)
    src = NvmlSource(1.0, roles=False, clock=clock)
    clock.advance(1.0)
    src.poll_once()
    gpus[3].fail = fake_pynvml.NVML_ERROR_GPU_IS_LOST
    caplog.set_level(logging.INFO, logger="rlhf_exporter")
    for _ in range(3):
        clock.advance(1.0)
        snap = src.poll_once()
    assert snap.up  # the other seven keep going
    busy = values(snap, "rlhf_gpu_busy_seconds_total")
    assert sorted(g for g, _ in busy) == ["0", "1", "2", "4", "5", "6", "7"]
    assert busy[("0", gpus[0].uuid)] == pytest.approx(4.0, abs=1 / 6)
    # only its error and XID counters stay (a lost GPU's XIDs are the evidence)
    kept = ("rlhf_gpu_errors_total", "rlhf_gpu_xid_errors_total", "rlhf_gpu_reading_unsupported")
    assert not [s for s in snap.samples if s.labels[0] == "3" and s.name not in kept]
    assert {k: v for k, v in values(snap, "rlhf_gpu_errors_total").items() if v} == {
        ("3", gpus[3].uuid, "unknown", "gpu_is_lost"): 3.0
    }
    lost = [
        r for r in caplog.records if "GPU 3" in r.getMessage() and "gpu_is_lost" in r.getMessage()
    ]
    assert len(lost) == 1 and not lost[0].exc_info  # one line, no traceback
    # it comes back: series again, counter continues from where it was, error count kept
    before = busy[("0", gpus[0].uuid)]
    gpus[3].fail = None
    clock.advance(1.0)
    src.poll_once()
    clock.advance(1.0)
    snap = src.poll_once()
    busy = values(snap, "rlhf_gpu_busy_seconds_total")
    assert ("3", gpus[3].uuid) in busy and busy[("0", gpus[0].uuid)] > before
    assert (
        values(snap, "rlhf_gpu_errors_total")[("3", gpus[3].uuid, "unknown", "gpu_is_lost")] == 3.0
    )
    assert any("GPU 3 answers again" in r.getMessage() for r in caplog.records)


def test_all_gpus_failing_is_down_and_reinitialises(install):
    clock = FakeClock()
    gpus = [FakeGpu(i) for i in range(2)]
    install(gpus, clock)
    src = NvmlSource(1.0, roles=False, clock=clock)
    assert src.poll_once().up
    for g in gpus:
        g.fail = fake_pynvml.ERRORS["NVML_ERROR_UNKNOWN"]
    snap = src.poll_once()
    assert not snap.up and snap.errors == {"all_gpus_failed": 1}
    # down, but each GPU's error counter is still served (and continues over NVML's restart)
    assert {s.name for s in snap.samples} <= {"rlhf_gpu_errors_total", "rlhf_gpu_xid_errors_total"}
    assert values(snap, "rlhf_gpu_errors_total") == {
        **{(str(g.index), g.uuid, "unknown", "gpu_is_lost"): 0.0 for g in gpus},
        **{(str(g.index), g.uuid, "unknown", "unknown"): 1.0 for g in gpus},
    }
    snap = src.poll_once()
    assert values(snap, "rlhf_gpu_errors_total")[("0", gpus[0].uuid, "unknown", "unknown")] == 2.0
    assert snap.errors == {"all_gpus_failed": 1}  # the problem counted once, not per poll
    for g in gpus:
        g.fail = None
    snap = src.poll_once()
    assert snap.up
    assert values(snap, "rlhf_gpu_errors_total")[("0", gpus[0].uuid, "unknown", "unknown")] == 2.0


@pytest.mark.parametrize(
    "kwargs, gpus, reason",
    [
        ({"library": False}, 1, "library_not_found"),
        ({"driver_loaded": False}, 1, "driver_not_loaded"),
        ({}, 0, "no_gpu"),
    ],
)
def test_absent_nvml_is_down_with_one_line(install, caplog, kwargs, gpus, reason):
    clock = FakeClock()
    install([FakeGpu(i) for i in range(gpus)], clock, **kwargs)
    src = NvmlSource(1.0, roles=False, clock=clock, retry_after=0.0)
    caplog.set_level(logging.INFO, logger="rlhf_exporter")
    for _ in range(5):
        clock.advance(1.0)
        snap = src.poll_once()
    assert not snap.up and snap.samples == ()
    assert snap.errors == {reason: 5}
    lines = [
        r
        for r in caplog.records
        if r.name.startswith("rlhf_exporter") and r.levelno >= logging.WARNING
    ]
    assert len(lines) == 1 and not lines[0].exc_info, [r.getMessage() for r in lines]


def test_library_not_found_on_this_real_machine(monkeypatch, caplog):
    """The real nvidia-ml-py, no libnvidia-ml.so.1 here: up 0, one line, no traceback."""
    real = importlib.import_module("pynvml")
    try:
        real.nvmlInit()
    except real.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - a machine with a GPU driver
        real.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    caplog.set_level(logging.INFO, logger="rlhf_exporter")
    src = NvmlSource(0.05, roles=False, retry_after=0.0)
    for _ in range(4):
        snap = src.poll_once()
    assert not snap.up and snap.errors == {"library_not_found": 4} and snap.samples == ()
    lines = [r for r in caplog.records if r.name.startswith("rlhf_exporter")]
    assert len(lines) == 1 and not lines[0].exc_info
    assert "libnvidia-ml.so.1" in lines[0].getMessage()


def test_errors_are_counted_per_attempt_not_per_poll(install):
    """No driver, polled every 1 s, retried every 30 s: 65 polls are 3 attempts, 3 errors."""
    clock = FakeClock()
    install([], clock, driver_loaded=False)
    src = NvmlSource(1.0, roles=False, clock=clock, retry_after=30.0)
    for _ in range(65):
        clock.advance(1.0)
        snap = src.poll_once()
    assert not snap.up and snap.errors == {"driver_not_loaded": 3}


class _ReusingRay:
    """A Ray source whose every poll publishes a new PID map (as RaySource does)."""

    interval = 15.0

    def __init__(self):
        self.pids = None

    def pid_actors(self, max_age=None):
        return self.pids


def test_role_cache_is_not_fooled_by_a_reused_pid(install, tmp_path):
    """PID 100 was a trainer; Ray's next poll says a rollout server now has it. The new map
    may sit at the old one's address (CPython reuses them): the role must follow anyway."""
    root = tmp_path / "proc"
    _proc(root, 100, 1, b"ray::WorkerDict")
    gpu = FakeGpu(0, processes=[(100, 8 << 30)])
    clock = FakeClock()
    install([gpu], clock)
    ray = _ReusingRay()
    src = NvmlSource(1.0, ray=ray, roles=True, clock=clock, proc_root=str(root))
    roles = []
    for class_name, role, title in [
        ("WorkerDict", "trainer", b"ray::WorkerDict"),
        ("vLLMHttpServer", "rollout", b"ray::vLLMHttpServer"),
        ("WorkerDict", "trainer", b"ray::WorkerDict"),
    ]:
        ray.pids = None  # drop our reference to the old map: its address is free again
        ray.pids = {100: ActorProcess(class_name, role)}
        (root / "100" / "cmdline").write_bytes(title + b"\0")
        clock.advance(1.0)
        got = values(src.poll_once(), "rlhf_gpu_role_memory_bytes")
        roles.append(sorted(labels[2] for labels, v in got.items() if v))
    assert roles == [["trainer"], ["rollout"], ["trainer"]]


@pytest.mark.slow
def test_library_not_found_through_serve(tmp_path):
    """`serve --nvml` on this GPU-less machine: nvml up 0, one log line, everything else served."""
    with Exporter(tmp_path, "--nvml", "--nvml-interval", "0.1") as exp:
        exp.wait_for(
            lambda: exp.value("rlhf_exporter_collector_up", collector="nvml") == 0.0,
            what="nvml up 0",
        )
        time.sleep(1.0)  # ten more polls, all within the 30 s before NVML is tried again
        # one attempt, one error: the polls in between do not count (nor log) it again
        assert exp.value("rlhf_exporter_collector_errors_total", collector="nvml") == 1.0
        assert exp.value("rlhf_exporter_build_info") == 1.0
        assert exp.value("rlhf_exporter_collector_up", collector="verl") is not None
    log = exp.log_path.read_text()
    assert log.count("NVML unavailable") == 1, log
    assert "Traceback" not in log


def test_hung_nvml_call_blocks_neither_scrape_nor_threads(install):
    clock = FakeClock(real=True)
    gpus = [FakeGpu(i, util=[(0, 30)]) for i in range(2)]
    install(gpus, clock)
    src = NvmlSource(0.05, roles=False, clock=clock, stale_after=0.5)
    collector = SnapshotCollector([src.snapshot])
    src.start()
    try:
        wait_until(lambda: src.snapshot().up, 5, 0.02, what="first poll")
        threads = threading.active_count()
        gpus[1].hang = threading.Event()
        wait_until(
            lambda: not src.snapshot().up, 5, 0.05, what="reported down while the call hangs"
        )
        started = time.monotonic()
        fams = list(collector.collect())  # a scrape while the NVML call still hangs
        assert time.monotonic() - started < 0.2
        up = [s.value for f in fams for s in f.samples if s.name == "rlhf_exporter_collector_up"]
        assert up == [0.0]
        assert not [f for f in fams if f.name.startswith("rlhf_gpu")]  # no stale series
        # for ten intervals while hung, checked every half interval: no new thread is started
        # and no other poll reaches the GPU (the hung call is its last one). An absence has
        # no event to wait for, so this window is counted in poll intervals.
        calls = gpus[1].calls
        for _ in range(20):
            assert threading.active_count() == threads
            assert gpus[1].calls == calls
            assert not src.snapshot().up
            time.sleep(src.interval / 2)
        gpus[1].hang.set()
        gpus[1].hang = None
        wait_until(lambda: src.snapshot().up, 5, 0.02, what="recovery after the hang")
    finally:
        src.stop()
    assert not [t for t in threading.enumerate() if t.name == "source-nvml"]


# -- roles, without Ray: a /proc tree in a temporary directory --------------------------------
def _proc(root: Path, pid: int, ppid: int, title: bytes) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(title + b"\0" * 20)
    (d / "stat").write_bytes(f"{pid} (x) S {ppid} {pid} {pid} 0".encode())


def test_role_memory_matches_verified_pids_and_ancestors(install, tmp_path):
    root = tmp_path / "proc"
    _proc(root, 100, 1, b"ray::WorkerDict")
    _proc(root, 200, 1, b"ray::vLLMHttpServer.generate")  # busy actor: Class.method
    _proc(root, 201, 200, b"VLLM::EngineCore")  # vLLM's engine process under the actor
    _proc(root, 300, 1, b"ray::IDLE")  # Ray says it is an actor, /proc disagrees: not trusted
    _proc(root, 400, 1, b"python train.py")  # not an actor at all
    actors = {
        100: ActorProcess("create_colocated_worker_cls.<locals>.WorkerDict", "trainer"),
        200: ActorProcess("vLLMHttpServer", "rollout"),
        300: ActorProcess("RewardLoopWorker", "reward"),
    }
    gpu = FakeGpu(
        0,
        processes=[
            (100, 30 << 30),
            (201, 20 << 30),
            (300, 5 << 30),
            (400, 1 << 30),
            (999999, 2 << 30),
            (100, None),
        ],
    )
    clock = FakeClock()
    install([gpu], clock)
    src = NvmlSource(1.0, ray=FakeRay(actors), roles=True, clock=clock, proc_root=str(root))
    clock.advance(1.0)
    snap = src.poll_once()
    got = {labels[2]: v for labels, v in values(snap, "rlhf_gpu_role_memory_bytes").items()}
    assert got == {"trainer": 30 << 30, "rollout": 20 << 30, "unknown": (5 + 1 + 2) << 30}
    # without Ray every byte is unknown (never a guessed role)
    src2 = NvmlSource(1.0, ray=None, roles=True, clock=clock, proc_root=str(root))
    got2 = {
        labels[2]: v for labels, v in values(src2.poll_once(), "rlhf_gpu_role_memory_bytes").items()
    }
    assert got2 == {"unknown": (30 + 20 + 5 + 1 + 2) << 30}


def test_from_settings():
    def s(**kw):
        return dataclasses.replace(  # the real, typed Settings
            resolve_settings(None, {}),
            **{
                "nvml": True,
                "nvml_interval": 2.0,
                "gpu_roles": None,
                "project": None,
                "experiment": None,
                **kw,
            },
        )

    ctx = Context(load_thresholds())
    assert NvmlSource.from_settings(s(nvml=False), ctx) is None
    assert NvmlSource.from_settings(s(), ctx).roles is False  # no Ray: roles off by default
    with_ray = NvmlSource.from_settings(s(), replace(ctx, ray=FakeRay({})))
    assert with_ray.roles is True and with_ray.interval == 2.0
    assert (
        NvmlSource.from_settings(s(gpu_roles=False), replace(ctx, ray=FakeRay({}))).roles is False
    )
    assert "nvml" in with_ray.describe()
    # the GPUs' job from configuration, only when both labels are set
    assert NvmlSource.from_settings(s(project="p", experiment="e"), ctx).current_job() == ("p", "e")
    assert NvmlSource.from_settings(s(project="p"), ctx).current_job() == ("", "")


# -- property: whatever the poll timing, every NVML sample is integrated exactly once ----------


@settings(max_examples=40, deadline=None)
@given(
    levels=st.lists(st.integers(0, 100), min_size=1, max_size=6),
    lengths=st.lists(st.integers(1, 30), min_size=6, max_size=6),
    polls=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=25),
)
def test_integral_is_exact_for_any_poll_timing(levels, lengths, polls):
    period = 1 / 6
    script, t = [], 0.0
    for level, n in zip(levels, lengths):
        script.append((t, level))
        t += n * period  # utilization changes on sample boundaries
    clock = FakeClock()
    gpu = FakeGpu(0, util=script, sample_period=period)
    previous = sys.modules.get("pynvml")
    sys.modules["pynvml"] = make_module(
        [gpu], clock
    )  # (hypothesis and function fixtures don't mix)
    try:
        src = NvmlSource(1.0, roles=False, clock=clock)
        for dt in polls:
            clock.advance(dt)
            snap = src.poll_once()
        assert snap.up
        end = int((clock() - gpu.start) / period + 1e-9)  # the last sample the driver has
        expected = sum(
            gpu.percent(gpu.start + (k + 0.5) * period) / 100 * period for k in range(end)
        )
        got = values(snap, "rlhf_gpu_busy_seconds_total")[("0", gpu.uuid)]
        # NVML stamps samples in whole microseconds: each sample's interval may be off by
        # up to 1 us from the exact period, so the integral is exact to 1 us per sample
        assert got == pytest.approx(expected, abs=1e-6 * (end + 1))
        assert values(snap, "rlhf_gpu_samples_total")[("0", gpu.uuid)] == end
    finally:
        if previous is None:
            del sys.modules["pynvml"]
        else:
            sys.modules["pynvml"] = previous
