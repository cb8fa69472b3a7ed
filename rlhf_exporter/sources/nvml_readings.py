"""What the NVML source keeps and reads per GPU: utilization integrated into busy seconds
(NVML's buffered samples, else utilization x elapsed time), memory and health readings
(XID events, ECC, remapped rows or retired pages, throttle reasons), and what NVML's errors
are called. `pynvml` (`nv`) is passed in: the source imports it lazily."""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable
from typing import Any

from ..diagnosis.xid import BAD_GPU, DEGRADED, LOST, xid_label
from ..join.board import WindowJoiner
from ..metrics.catalog import KNOWN_ERRORS
from ..metrics.snapshot import Sample
from .gpu_pid_roles import UNKNOWN_ROLE

log = logging.getLogger("rlhf_exporter.sources.nvml")

MAX_GAP_US = 3600 * 10**6  # a larger jump between samples is a clock change, not busy time
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
MAX_EVENTS = 256  # XID events read per poll at most (the rest wait in NVML's queue)
MAX_THROTTLE_GAP = 5.0  # polls' worth of time one throttle reading may stand for at most
# clock event (throttle) reasons: bits of nvmlDeviceGetCurrentClocksEventReasons, the same
# values as pynvml's nvmlClocksEventReason* / nvmlClocksThrottleReason* constants
THROTTLE_REASONS = {
    "power_cap": 0x04,  # SwPowerCap
    "hw_slowdown": 0x08,  # HwSlowdown (clocks halved or worse: thermal, power brake, ...)
    "sw_thermal": 0x20,  # SwThermalSlowdown
    "hw_thermal": 0x40,  # HwThermalSlowdown
    "hw_power_brake": 0x80,  # HwPowerBrakeSlowdown
}
ECC = (("corrected", 0), ("uncorrected", 1))  # NVML_MEMORY_ERROR_TYPE_*
ECC_SCOPES = (("volatile", 0), ("aggregate", 1))  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
PAGE_CAUSES = (("multiple_single_bit", 0), ("double_bit", 1))  # NVML_PAGE_RETIREMENT_CAUSE_*
XID_EVENT = 0x08  # nvmlEventTypeXidCriticalError
ALERTED_XIDS = sorted(BAD_GPU | LOST | DEGRADED)  # exported from 0 on every GPU with XID events
# held down by heat or hardware (not the power cap, normal under full load): what the
# GPU-window join counts as throttled time per step window
SLOWDOWN = sum(
    THROTTLE_REASONS[r] for r in ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
)


def error_reason(exc: BaseException) -> str:
    """NVMLError_GpuIsLost -> gpu_is_lost; NVMLError_LibraryNotFound -> library_not_found."""
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return _CAMEL.sub("_", name[len("NVMLError_") :]).lower()
    return "nvml_error"


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _sample_value(value_type: int, value: Any) -> float:
    """A c_nvmlValue_t union read by its NVML_VALUE_TYPE_* (0 double, 1 uint, 2 ulong, ...)."""
    field = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(value, field.get(value_type, "uiVal")))


def _address(handle: Any) -> int:
    """What identifies an NVML device handle: the address a ctypes pointer holds (two pointer
    objects to one device are not equal in Python), else the object itself."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0) or id(handle)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


GPU_ERRORS = "rlhf_gpu_errors_total"


class Gpu:
    """What the poll thread keeps for one GPU between polls."""

    def __init__(self, index: int):
        self.index = index
        self.label = str(index)
        self.handle: Any = None
        self.uuid = ""
        self.name = ""
        self.use_samples = True
        self.last_ts: int | None = None  # NVML sample timestamp (microseconds)
        self.last_time: float | None = None  # clock() of the last fallback sample
        self.busy = 0.0
        self.samples = 0
        self.utilization: float | None = None
        self.unsupported: set[str] = set()
        # the known reasons from 0 (the GPU-lost alert's increase() sees the first loss)
        self.errors: dict[str, int] = dict.fromkeys(KNOWN_ERRORS["nvml"][GPU_ERRORS], 0)
        self.failing: str | None = None
        self.recent: list[tuple[float, float]] = []  # this poll's (end time, ratio) samples
        self.role = UNKNOWN_ROLE  # gpu_role() of its processes, for the window join
        self.xids: dict[str, int] = {}  # xid label -> events
        self.throttle = dict.fromkeys(THROTTLE_REASONS, 0.0)  # reason -> seconds
        self.throttle_time: float | None = None  # clock() of the last throttle reading


class GpuReadings:
    """One GPU's readings in a poll: busy seconds integrated from NVML's samples, and its
    health (ECC, remapped rows or retired pages, throttle seconds, XID events). A reading
    that a GPU does not support is asked once (`optional`)."""

    def __init__(
        self,
        collector: str,
        clock: Callable[[], float],
        wall: Callable[[], float],
        interval: float,
        joiner: WindowJoiner | None,
    ):
        self.collector = collector
        self.clock = clock  # monotonic: the integration's elapsed time
        self.wall = wall  # epoch seconds: the window join's time
        self.interval = interval
        self.joiner = joiner

    def health(self, nv: Any, gpu: Gpu) -> list[Sample]:
        """ECC, remapped rows or retired pages, throttle seconds (docs/dcgm-exporter.md)."""
        h, key = gpu.handle, (gpu.label, gpu.uuid, gpu.role)
        out: list[Sample] = []
        for error, etype in ECC:
            for scope, counter in ECC_SCOPES:
                n = self.optional(nv, gpu, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, etype, counter)
                if n is None:
                    break
                out.append(Sample("rlhf_gpu_ecc_errors_total", (*key, error, scope), float(n)))
        rows = self.optional(nv, gpu, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failed = rows
            out += [
                Sample("rlhf_gpu_remapped_rows", (*key, "correctable"), float(corr)),
                Sample("rlhf_gpu_remapped_rows", (*key, "uncorrectable"), float(unc)),
                Sample("rlhf_gpu_row_remap_pending", key, 1.0 if pending else 0.0),
                Sample("rlhf_gpu_row_remap_failed", key, 1.0 if failed else 0.0),
            ]
        else:  # GPUs before A100 retire pages instead
            for cause, code in PAGE_CAUSES:
                pages = self.optional(
                    nv, gpu, "retired_pages", nv.nvmlDeviceGetRetiredPages, h, code
                )
                if pages is None:
                    break
                out.append(Sample("rlhf_gpu_retired_pages", (*key, cause), float(len(pages))))
            pend = self.optional(
                nv, gpu, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h
            )
            if pend is not None:
                out.append(Sample("rlhf_gpu_retired_pages_pending", key, 1.0 if pend else 0.0))
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        mask = self.optional(
            nv, gpu, "throttle", reasons or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h
        )
        if mask is not None:
            now = self.clock()
            if gpu.throttle_time is not None:
                dt = min(max(now - gpu.throttle_time, 0.0), MAX_THROTTLE_GAP * self.interval)
                for reason, bit in THROTTLE_REASONS.items():
                    if int(mask) & bit:
                        gpu.throttle[reason] += dt
            gpu.throttle_time = now
            if self.joiner is not None:  # covers the time since the last reading
                slow = 1.0 if int(mask) & SLOWDOWN else 0.0
                self.joiner.add_throttle(gpu.label, gpu.role, [(self.wall(), slow)])
            out += [
                Sample("rlhf_gpu_throttle_seconds_total", (*key, reason), secs)
                for reason, secs in gpu.throttle.items()
            ]
        return out

    def read_events(self, nv: Any, events: Any, gpus: list[Gpu]) -> None:
        """Count the XID events waiting in the event set (at most MAX_EVENTS a poll)."""
        if events is None:
            return
        by_uuid = {g.uuid: g for g in gpus if g.uuid}
        by_handle = {_address(g.handle): g for g in gpus if g.handle is not None}
        for _ in range(MAX_EVENTS):
            try:
                data = nv.nvmlEventSetWait_v2(events, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:  # e.g. a GPU lost: its own reading says so
                log.debug("NVML event wait failed: %s", exc, extra={"collector": self.collector})
                return
            if int(data.eventType) & XID_EVENT == 0:
                continue
            gpu = by_handle.get(_address(data.device))
            if gpu is None:
                try:
                    gpu = by_uuid.get(text(nv.nvmlDeviceGetUUID(data.device)))
                except nv.NVMLError:  # a lost GPU may not answer even that
                    gpu = None
            if gpu is None:
                continue
            xid = xid_label(int(data.eventData))
            gpu.xids[xid] = gpu.xids.get(xid, 0) + 1
            log.warning(
                "GPU %s (%s): XID %d",
                gpu.label,
                gpu.uuid,
                int(data.eventData),
                extra={"collector": self.collector, "reason": f"xid_{xid}"},
            )

    def optional(self, nv: Any, gpu: Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A reading some GPUs do not support: NotSupported once means never again."""
        if what in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except (
            nv.NVMLError_NotSupported,
            nv.NVMLError_FunctionNotFound,
            nv.NVMLError_NoPermission,
        ):
            gpu.unsupported.add(what)
            log.info(
                "GPU %s does not report %s", gpu.label, what, extra={"collector": self.collector}
            )
            return None

    def integrate(self, nv: Any, gpu: Gpu) -> None:
        if gpu.use_samples and not hasattr(nv, "nvmlDeviceGetSamples"):
            gpu.use_samples = False  # a very old nvidia-ml-py
        if gpu.use_samples:
            try:
                value_type, samples = nv.nvmlDeviceGetSamples(
                    gpu.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, gpu.last_ts or 0
                )
            except nv.NVMLError_NotFound:  # no sample newer than last_ts yet
                return
            except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
                gpu.use_samples = False
                log.info(
                    "GPU %s has no utilization sample buffer: integrating utilization x "
                    "elapsed time instead",
                    gpu.label,
                    extra={"collector": self.collector},
                )
            else:
                for sample in sorted(samples, key=lambda s: s.timeStamp):
                    ts = int(sample.timeStamp)
                    if gpu.last_ts is not None and ts <= gpu.last_ts:
                        continue
                    ratio = min(
                        max(_sample_value(value_type, sample.sampleValue) / 100.0, 0.0), 1.0
                    )
                    if gpu.last_ts is not None and ts - gpu.last_ts <= MAX_GAP_US:
                        gpu.busy += ratio * (ts - gpu.last_ts) / 1e6
                        gpu.samples += 1
                    if self.joiner is not None:  # NVML stamps: epoch microseconds
                        gpu.recent.append((ts / 1e6, ratio))
                    gpu.last_ts = ts
                    gpu.utilization = ratio
                return
        now = self.clock()
        ratio = min(max(nv.nvmlDeviceGetUtilizationRates(gpu.handle).gpu / 100.0, 0.0), 1.0)
        if gpu.last_time is not None:
            gpu.busy += ratio * (now - gpu.last_time)
            gpu.samples += 1
        if self.joiner is not None:  # covers the time since the last poll
            gpu.recent.append((self.wall(), ratio))
        gpu.last_time = now
        gpu.utilization = ratio
