"""A scripted stand-in for nvidia-ml-py's `pynvml`, injected as `sys.modules['pynvml']`.

These machines have no GPU. The NVML source imports `pynvml` lazily, so the same code that
runs against a real driver runs against this module. It mirrors the real module where the
source touches it: the same function names and signatures, the same `NVML_*` constants and
values, and the same exception hierarchy (`NVMLError(value)` returns the
`NVMLError_<CamelCase>` subclass for that value; `NVMLError_GpuIsLost()` needs no argument).
tests/test_nvml_source.py checks those names and values against the real module.

    clock = FakeClock()
    gpus = [FakeGpu(i, util=[(0, 50), (10, 100)]) for i in range(8)]   # % from t=0, t=10 s
    module = make_module(gpus, clock)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    gpus[3].fail = NVML_ERROR_GPU_IS_LOST                               # every call on GPU 3
    gpus[0].hang = threading.Event()                                    # calls block until set

The driver's utilization sample buffer is modelled: one sample every `sample_period` seconds
of the fake clock (real GPUs: 1/6 to 1 s), value = the scripted utilization at that time,
the newest `buffer` samples kept; `nvmlDeviceGetSamples(h, type, last_seen_us)` returns the
newer ones or raises NVMLError_NotFound.
"""

from __future__ import annotations

import bisect
import string
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# -- constants, with the real module's names and values ------------------------------------
NVML_SUCCESS = 0
ERRORS = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_UNKNOWN": 999,
}
NVML_ERROR_UNINITIALIZED = ERRORS["NVML_ERROR_UNINITIALIZED"]
NVML_ERROR_INVALID_ARGUMENT = ERRORS["NVML_ERROR_INVALID_ARGUMENT"]
NVML_ERROR_NOT_SUPPORTED = ERRORS["NVML_ERROR_NOT_SUPPORTED"]
NVML_ERROR_NOT_FOUND = ERRORS["NVML_ERROR_NOT_FOUND"]
NVML_ERROR_DRIVER_NOT_LOADED = ERRORS["NVML_ERROR_DRIVER_NOT_LOADED"]
NVML_ERROR_LIBRARY_NOT_FOUND = ERRORS["NVML_ERROR_LIBRARY_NOT_FOUND"]
NVML_ERROR_GPU_IS_LOST = ERRORS["NVML_ERROR_GPU_IS_LOST"]
NVML_ERROR_TIMEOUT = ERRORS["NVML_ERROR_TIMEOUT"]
CONSTANTS = {
    "NVML_SUCCESS": 0,
    "NVML_GPU_UTILIZATION_SAMPLES": 1,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_VALUE_TYPE_DOUBLE": 0,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    "nvmlEventTypeXidCriticalError": 0x08,
    "nvmlClocksEventReasonSwPowerCap": 0x04,
    "nvmlClocksEventReasonHwSlowdown": 0x08,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x20,
    "nvmlClocksEventReasonHwThermalSlowdown": 0x40,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x80,
}
MESSAGES = {
    1: "Uninitialized",
    3: "Not Supported",
    6: "Not Found",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    10: "Timeout",
    15: "GPU is lost",
    999: "Unknown Error",
}


def _error_classes() -> dict[str, type]:
    """NVMLError and one subclass per NVML_ERROR_*, named and built as pynvml does."""
    mapping: dict[int, type] = {}

    class NVMLError(Exception):
        def __new__(cls, value):
            sub = mapping.get(value, cls)
            obj = Exception.__new__(sub)
            obj.value = value
            return obj

        def __init__(self, *args):
            super().__init__(getattr(self, "value", None))

        def __str__(self):
            return MESSAGES.get(self.value, f"NVML error {self.value}")

        def __eq__(self, other):
            return isinstance(other, NVMLError) and self.value == other.value

        __hash__ = Exception.__hash__

    NVMLError.__module__ = "pynvml"
    classes: dict[str, type] = {"NVMLError": NVMLError}
    for name, value in ERRORS.items():
        cls_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace(
            "_", ""
        )

        def new(cls, *args, _value=value):
            return NVMLError.__new__(cls, _value)

        sub = type(cls_name, (NVMLError,), {"__new__": new, "__module__": "pynvml"})
        mapping[value] = sub
        classes[cls_name] = sub
    return classes


class FakeClock:
    """Seconds; starts at 1000 so timestamps are never 0 (NVML's 'from the start')."""

    def __init__(self, start: float = 1000.0, real: bool = False):
        self._t = start
        self._real_origin = time.monotonic() - start if real else None

    def __call__(self) -> float:
        if self._real_origin is not None:
            return time.monotonic() - self._real_origin
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds


# the NVML calls of the health readings (issue 23): a GPU whose `unsupported` holds all of
# them has none (the source asks each once, then skips it)
HEALTH_CALLS = (
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceRegisterEvents",
)


@dataclass
class FakeGpu:
    index: int
    util: Sequence[tuple[float, float]] = ((0.0, 0.0),)  # (seconds since start, percent)
    memory_total: int = 80 * 2**30
    memory_used: int = 10 * 2**30
    processes: Sequence[tuple[int, int | None]] = ()  # (pid, used bytes or None)
    power_mw: int = 300_000
    temperature: int = 60
    sm_mhz: int = 1980
    name: str = "NVIDIA H100 80GB HBM3"
    sample_period: float = 1 / 6
    buffer: int = 120
    supports_samples: bool = True
    unsupported: set[str] = field(default_factory=set)  # function names raising NotSupported
    fail: int | None = None  # an NVML_ERROR_* every call on this GPU raises
    hang: threading.Event | None = None  # calls block until it is set
    start: float = 1000.0
    calls: int = 0
    # health: ECC counts by (NVML_MEMORY_ERROR_TYPE_*, NVML_*_ECC), remapped rows
    # (corrected, uncorrected, pending, failure), retired page addresses by
    # NVML_PAGE_RETIREMENT_CAUSE_*, pending retirement, the clock event reasons' bit mask, and
    # XID codes waiting to be delivered through the event set (a test appends to it)
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_pages: dict[int, list[int]] = field(default_factory=dict)
    retired_pending: int = 0
    throttle: int = 0
    xids: list[int] = field(default_factory=list)

    @property
    def uuid(self) -> str:
        return f"GPU-{self.index:08x}-fake-4000-8000-{self.index:012x}"

    def percent(self, t: float) -> float:
        rel = t - self.start
        times = [u[0] for u in self.util]
        i = bisect.bisect_right(times, rel) - 1
        return float(self.util[max(i, 0)][1])


def make_module(
    gpus: Sequence[FakeGpu],
    clock: Callable[[], float] | None = None,
    *,
    library: bool = True,
    driver_loaded: bool = True,
    driver: str = "550.54.15",
) -> types.ModuleType:
    clock = clock or FakeClock()
    mod = types.ModuleType("pynvml")
    mod.__file__ = __file__
    mod.__dict__.update(ERRORS)
    mod.__dict__.update(CONSTANTS)
    errors = _error_classes()
    mod.__dict__.update(errors)
    NVMLError = errors["NVMLError"]
    state = {"init": 0}

    def check(gpu: FakeGpu, fn: str) -> None:
        gpu.calls += 1
        if gpu.hang is not None:
            gpu.hang.wait(60)  # bounded: a test that forgets to release does not hang forever
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def initialised() -> None:
        if state["init"] <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit():
        if not library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if not driver_loaded:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        state["init"] += 1

    def nvmlShutdown():
        initialised()
        state["init"] -= 1

    def nvmlDeviceGetCount():
        initialised()
        return len(gpus)

    def nvmlSystemGetDriverVersion():
        initialised()
        return driver

    def nvmlDeviceGetHandleByIndex(index):
        initialised()
        if not 0 <= index < len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        check(gpus[index], "nvmlDeviceGetHandleByIndex")
        return gpus[index]

    def device(name: str, result: Callable[..., object]) -> Callable:
        def call(handle, *args):
            initialised()
            check(handle, name)
            return result(handle, *args)

        call.__name__ = name
        call.result = result  # type: ignore[attr-defined]  # its signature, for the mirror test
        return call

    def samples(gpu: FakeGpu, sampling_type, last_seen):
        if sampling_type != CONSTANTS["NVML_GPU_UTILIZATION_SAMPLES"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.supports_samples:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        now = clock()
        period = gpu.sample_period
        newest = int((now - gpu.start) / period + 1e-9)
        oldest = max(0, newest - gpu.buffer + 1)
        if last_seen:  # skip what the caller has seen (the check below stays exact)
            oldest = max(oldest, int((last_seen / 1e6 - gpu.start) / period) - 1)
        out = []
        for k in range(oldest, newest + 1):
            t = gpu.start + k * period
            ts = round(t * 1e6)
            if ts > last_seen:
                # a sample at t covers (t - period, t]: the utilization just before t
                value = types.SimpleNamespace(uiVal=int(gpu.percent(t - period / 2)))
                out.append(types.SimpleNamespace(timeStamp=ts, sampleValue=value))
        if not out:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_INT"], out

    registered: list[FakeGpu] = []  # GPUs registered on the (one) event set

    def event_wait(event_set, timeoutms):  # nvmlEventSetWait_v2: the next XID, or Timeout
        initialised()
        for gpu in registered:
            if gpu.xids:
                return types.SimpleNamespace(
                    device=gpu,
                    eventType=CONSTANTS["nvmlEventTypeXidCriticalError"],
                    eventData=gpu.xids.pop(0),
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def register(gpu: FakeGpu, event_types, event_set):
        if event_types != CONSTANTS["nvmlEventTypeXidCriticalError"]:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        registered.append(gpu)

    funcs = {
        "nvmlDeviceGetUUID": lambda g: g.uuid,
        "nvmlDeviceRegisterEvents": register,
        "nvmlDeviceGetTotalEccErrors": lambda g, etype, counter: g.ecc.get((etype, counter), 0),
        "nvmlDeviceGetRemappedRows": lambda g: tuple(g.remapped_rows),
        "nvmlDeviceGetRetiredPages": lambda g, cause: list(g.retired_pages.get(cause, [])),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda g: g.retired_pending,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda g: g.throttle,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda g: g.throttle,
        "nvmlDeviceGetName": lambda g: g.name,
        "nvmlDeviceGetSamples": samples,
        "nvmlDeviceGetUtilizationRates": lambda g: types.SimpleNamespace(
            gpu=int(g.percent(clock())), memory=0
        ),
        "nvmlDeviceGetMemoryInfo": lambda g, version=None: types.SimpleNamespace(
            total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used
        ),
        "nvmlDeviceGetPowerUsage": lambda g: g.power_mw,
        "nvmlDeviceGetTemperature": lambda g, sensor: g.temperature,
        "nvmlDeviceGetClockInfo": lambda g, kind: g.sm_mhz,
        "nvmlDeviceGetComputeRunningProcesses": lambda g: [
            types.SimpleNamespace(
                pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for pid, mem in g.processes
        ],
    }
    for name, result in funcs.items():
        setattr(mod, name, device(name, result))
    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlSystemGetDriverVersion,
        nvmlDeviceGetHandleByIndex,
    ):
        setattr(mod, fn.__name__, fn)
    mod.nvmlInitWithFlags = lambda flags: nvmlInit()
    mod.nvmlEventSetCreate = lambda: (initialised(), object())[1]
    mod.nvmlEventSetWait_v2 = event_wait
    mod.nvmlEventSetWait = event_wait
    mod.nvmlEventSetFree = lambda event_set: registered.clear()
    return mod


class FakeRay:
    """What NvmlSource needs of a RaySource: this node's actor PIDs (pid -> ActorProcess)."""

    interval = 15.0

    def __init__(self, pids):
        self.pids = pids

    def pid_actors(self, max_age=None):
        return self.pids
