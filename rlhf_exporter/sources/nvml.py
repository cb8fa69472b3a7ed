"""GPUs through NVML: utilization integrated into busy-seconds, memory, power, clocks, roles.

Instantaneous utilization scraped every 15-30 s misses the short idle gaps that matter in
RLHF (weight sync, the rollout's long tail). This source samples every --nvml-interval
(1 s) and integrates: `rlhf_gpu_busy_seconds_total` grows by utilization x elapsed time, so
`rate()` is the exact busy ratio over any window.

- Preferred: NVML's own buffered samples (`nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES,
  last seen timestamp)`): the driver records utilization several times a second, each
  sample covering the time since the previous one, so nothing between two polls goes
  unseen. Where that is not supported: `nvmlDeviceGetUtilizationRates` x the elapsed time.
- `pynvml` is imported lazily, inside the poll, so the module that answers is whatever
  `sys.modules['pynvml']` holds (tests inject a fake there; a GPU host has the real one).
- No library, no driver, no GPU: `up` is 0 and one log line says why (retried every 30 s).
  One GPU failing (e.g. NVMLError_GpuIsLost) drops that GPU's series, counts the error in
  `rlhf_gpu_errors_total{gpu,uuid,reason}`, and the other GPUs go on.
- One poll thread, never more: an NVML call that hangs holds that thread only; the
  scrape reads the last snapshot and reports the source down once the poll is overdue.
- GPU memory by role: NVML's compute processes are matched to Ray actors' worker PIDs on
  this node (see docs/gpu-roles.md). A PID counts for a role only when this process can see
  it (or an ancestor, e.g. vLLM's engine processes under the rollout actor) in /proc, titled
  `ray::<ActorClass>` as Ray names actor processes. Anything else is role `unknown`: memory
  is never given to a wrong role.
- The job the GPUs serve (`project`/`experiment` on every `rlhf_gpu_*` series): configured
  (`--project`/`--experiment`), else the one job of the window board (this sidecar's own
  jobs on a head, the head's windows on a worker) that made a step in the last
  `JOB_HORIZON` seconds; when none did, the last such job is kept (a stalled job's GPUs keep
  its name); when several did, none (NVML cannot tell which job a GPU serves; logged once).
  One job per GPU at a time: the labels add no cardinality.
- Health (docs/dcgm-exporter.md): XID critical errors from one NVML event set, by XID code
  (bounded: rlhf_exporter/diagnosis/xid.py); ECC error counters; remapped rows (A100 and
  later) or retired pages (older GPUs); clock throttle reasons as seconds per reason. Each is
  optional per GPU: NotSupported (or no permission) once means never asked again, shown by
  `rlhf_gpu_reading_unsupported{reading}` and one log line.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..diagnosis.gpujoin import gpu_role
from ..diagnosis.xid import BAD_GPU, DEGRADED, LOST, xid_label
from ..join.board import WindowBoard, WindowJoiner
from ..join.ports import ActorPids, ActorProcess
from ..metrics.catalog import KNOWN_ERRORS
from ..metrics.snapshot import Sample
from ..settings import Settings
from .base import Clock, Context, PollingSource, PollResult, SourceError
from .roles import short_name

log = logging.getLogger(__name__)

UNKNOWN_ROLE = "unknown"
MAX_ANCESTORS = 8  # /proc parent hops from a GPU process to its actor
MAX_GAP_US = 3600 * 10**6  # a larger jump between samples is a clock change, not busy time
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
JOB_HORIZON = 900.0  # seconds: a job that made a step this recently is the GPUs' job
NO_JOB = ("", "")
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


def _text(value: Any) -> str:
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


class NvmlSource(PollingSource):
    def __init__(
        self,
        interval: float = 1.0,
        *,
        ray: ActorPids | None = None,
        roles: bool = True,
        clock: Callable[[], float] = time.monotonic,
        stale_after: float | None = None,
        retry_after: float = 30.0,
        proc_root: str = "/proc",
        wall: Clock = time.time,
        windows: WindowBoard | None = None,
        job: tuple[str, str] | None = None,
    ):
        super().__init__("nvml", interval, stale_after, wall=wall)
        self.ray = ray
        self.roles = roles
        self.clock = clock
        self.retry_after = retry_after
        self.proc_root = proc_root
        # GPU time by step window (rlhf_exporter/join/board.py): None when off
        self.joiner = WindowJoiner(windows) if windows is not None else None
        self.board = windows
        self.configured_job = job  # (project, experiment) from configuration, or None
        self._job = NO_JOB
        self._job_ambiguous = False
        self._events: Any = None  # the NVML event set XID events arrive on, or None
        self._nv: Any = None  # the pynvml module, once initialised
        self._gpus: list[Gpu] = []
        self._driver = "unknown"
        self._init_failed: tuple[float, SourceError] | None = None
        # PID -> role, for one Ray poll's PID map: the map itself is kept (a reference, not
        # its id(), which CPython reuses), so a new poll (reused PIDs) empties the cache
        self._role_cache: tuple[Mapping[int, ActorProcess] | None, dict[int, str]] = (None, {})

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> NvmlSource | None:
        if not settings.nvml:
            return None
        ray = context.ray
        roles = settings.gpu_roles if settings.gpu_roles is not None else ray is not None
        if roles and ray is None:
            log.warning(
                "gpu_roles is on but the Ray source is off: all GPU memory goes to role 'unknown'",
                extra={"collector": "nvml"},
            )
        return cls(
            settings.nvml_interval,
            ray=ray,
            roles=roles,
            wall=context.clock,
            windows=context.windows,
            job=(
                (settings.project, settings.experiment)
                if settings.project and settings.experiment
                else None
            ),
        )

    def describe(self) -> str:
        return f"nvml (every {self.interval:g}s{', GPU memory by role' if self.roles else ''})"

    # -- NVML life cycle ----------------------------------------------------------------------
    def _init(self) -> Any:
        if self._nv is not None:
            return self._nv
        if self._init_failed is not None:
            at, error = self._init_failed
            if self.clock() - at < self.retry_after:  # a fresh exception: no growing traceback
                # not a new attempt: not counted again (one error per try, every retry_after)
                raise SourceError(error.reason, str(error), attempted=False)
        try:
            nv = importlib.import_module("pynvml")
        except ImportError:
            self._fail_init(
                SourceError(
                    "library_not_found",
                    "the nvidia-ml-py package (module pynvml) is not installed: no GPU metrics",
                )
            )
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            reason = error_reason(exc)
            hint = {
                "library_not_found": "no NVIDIA driver library (libnvidia-ml.so.1) on this host",
                "driver_not_loaded": "the NVIDIA kernel driver is not loaded",
                "no_permission": "no permission to open the GPU devices",
            }.get(reason, "NVML failed")
            self._fail_init(
                SourceError(
                    reason,
                    f"NVML unavailable: {hint} ({exc}); GPU metrics off, "
                    f"retrying every {self.retry_after:g}s",
                )
            )
        try:
            count = nv.nvmlDeviceGetCount()
            try:
                self._driver = _text(nv.nvmlSystemGetDriverVersion())
            except nv.NVMLError:
                self._driver = "unknown"
        except nv.NVMLError as exc:
            self._shutdown(nv)
            self._fail_init(SourceError(error_reason(exc), f"NVML cannot count GPUs: {exc}"))
        if count == 0:
            self._shutdown(nv)
            self._fail_init(SourceError("no_gpu", "NVML sees no GPU on this host: GPU metrics off"))
        old = {g.index: g for g in self._gpus}
        self._gpus = [Gpu(i) for i in range(count)]
        for gpu in self._gpus:  # after a restart of NVML its GPUs' counters continue
            before = old.get(gpu.index)
            if before is not None:
                gpu.uuid, gpu.role, gpu.failing = before.uuid, before.role, before.failing
                gpu.errors, gpu.xids, gpu.busy = before.errors, before.xids, before.busy
                gpu.samples, gpu.throttle = before.samples, before.throttle
        self._events = None
        if hasattr(nv, "nvmlEventSetCreate"):
            try:
                self._events = nv.nvmlEventSetCreate()
            except nv.NVMLError as exc:
                log.info(
                    "NVML events unavailable (%s): no XID counts",
                    exc,
                    extra={"collector": self.name},
                )
        self._nv = nv
        self._init_failed = None
        log.info("NVML %s: %d GPU(s)", self._driver, count, extra={"collector": self.name})
        return nv

    def _fail_init(self, error: SourceError) -> None:
        self._init_failed = (self.clock(), error)
        raise error

    def _shutdown(self, nv: Any) -> None:
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except Exception:  # best effort, as the shutdown
                pass
            self._events = None
        try:
            nv.nvmlShutdown()
        except Exception:  # shutting down is best effort
            pass

    def close(self) -> None:
        # never shut NVML down under a poll that is still running (a hung call)
        if self._nv is not None and self._poll_started is None:
            self._shutdown(self._nv)
            self._nv = None

    # -- one poll ---------------------------------------------------------------------------
    def current_job(self) -> tuple[str, str]:
        """(project, experiment) of the job this node's GPUs serve, or ("", "")."""
        if self.configured_job is not None:
            return self.configured_job
        if self.board is None:
            return NO_JOB
        active = self.board.active_jobs(self.wall() - JOB_HORIZON)
        if len(active) == 1:
            self._job, self._job_ambiguous = next(iter(active)), False
        elif len(active) > 1:
            if not self._job_ambiguous:
                log.warning(
                    "%d verl jobs made steps here in the last %gs: GPU series carry no job "
                    "(NVML cannot tell which job a GPU serves)",
                    len(active),
                    JOB_HORIZON,
                    extra={"collector": self.name},
                )
            self._job, self._job_ambiguous = NO_JOB, True
        return self._job  # none active: the last job keeps its GPUs

    def poll(self) -> PollResult:
        nv = self._init()
        actors = self._actors()
        out: list[Sample] = []
        failed = 0
        self._read_events(nv)
        for gpu in self._gpus:
            try:
                out += self._sample_gpu(nv, gpu, actors)
            except nv.NVMLError as exc:
                failed += 1
                self._gpu_failed(gpu, error_reason(exc), exc)
            else:
                if gpu.failing is not None:
                    log.info("GPU %s answers again", gpu.label, extra={"collector": self.name})
                    gpu.failing = None
            key = (gpu.label, gpu.uuid)
            for reason, n in gpu.errors.items():
                out.append(Sample("rlhf_gpu_errors_total", (*key, gpu.role, reason), float(n)))
            for xid, n in sorted(gpu.xids.items()):
                out.append(Sample("rlhf_gpu_xid_errors_total", (*key, gpu.role, xid), float(n)))
            for what in sorted(gpu.unsupported):
                out.append(Sample("rlhf_gpu_reading_unsupported", (*key, what), 1.0))
        job = self.current_job()
        out = [Sample(s.name, (*s.labels, *job), s.value) for s in out]  # every rlhf_gpu_*
        if self.joiner is not None:
            self.joiner.join(self.wall())
            out += self.joiner.samples()
        if failed and failed == len(self._gpus):
            self._shutdown(nv)  # start over next poll: the driver may have been reloaded
            self._nv = None
            # down, but the error and XID counters stay: a node whose every GPU is lost
            # (a one-GPU node, a board failure) still says which GPUs were lost
            return PollResult(tuple(out), down="all_gpus_failed")
        return PollResult(tuple(out))

    def _gpu_failed(self, gpu: Gpu, reason: str, exc: BaseException) -> None:
        gpu.errors[reason] = gpu.errors.get(reason, 0) + 1
        gpu.last_ts = gpu.last_time = None  # integrate again from the next good sample
        gpu.recent = []
        if self.joiner is not None:
            self.joiner.forget(gpu.label)
        if gpu.failing != reason:
            log.warning(
                "GPU %s (%s) failed (%s): %s; its series are dropped until it answers",
                gpu.label,
                gpu.uuid or "uuid unknown",
                reason,
                exc,
                extra={"collector": self.name, "reason": reason},
            )
            gpu.failing = reason

    def _sample_gpu(self, nv: Any, gpu: Gpu, actors: Mapping[int, ActorProcess]) -> list[Sample]:
        if gpu.handle is None:
            handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
            gpu.uuid = _text(nv.nvmlDeviceGetUUID(handle))
            gpu.name = _text(nv.nvmlDeviceGetName(handle))
            gpu.handle = handle
            if self._events is not None:
                self._optional(
                    nv,
                    gpu,
                    "xid_events",
                    nv.nvmlDeviceRegisterEvents,
                    handle,
                    XID_EVENT,
                    self._events,
                )
                if "xid_events" not in gpu.unsupported:
                    # the codes the alerts read start at 0: a counter born at 1 would show
                    # no increase() for its first event
                    for code in ALERTED_XIDS:
                        gpu.xids.setdefault(str(code), 0)
        h, key = gpu.handle, (gpu.label, gpu.uuid)
        self._integrate(nv, gpu)
        memory = nv.nvmlDeviceGetMemoryInfo(h)
        out = [
            Sample("rlhf_gpu_info", (gpu.label, gpu.uuid, gpu.name, self._driver), 1.0),
            Sample("rlhf_gpu_busy_seconds_total", key, gpu.busy),
            Sample("rlhf_gpu_samples_total", key, float(gpu.samples)),
            Sample("rlhf_gpu_memory_used_bytes", key, float(memory.used)),
            Sample("rlhf_gpu_memory_total_bytes", key, float(memory.total)),
        ]
        if gpu.utilization is not None:
            out.append(Sample("rlhf_gpu_utilization_ratio", key, gpu.utilization))
        power = self._optional(nv, gpu, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out.append(Sample("rlhf_gpu_power_watts", key, power / 1000.0))  # milliwatts
        temp = self._optional(
            nv, gpu, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU
        )
        if temp is not None:
            out.append(Sample("rlhf_gpu_temperature_celsius", key, float(temp)))
        clock = self._optional(nv, gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        if clock is not None:
            out.append(Sample("rlhf_gpu_sm_clock_hertz", key, clock * 1e6))  # MHz
        if self.roles:
            procs = self._optional(nv, gpu, "processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
            if procs is not None:
                by_role = {UNKNOWN_ROLE: 0.0}
                for proc in procs:
                    role = self._role_of(int(proc.pid), actors)
                    by_role[role] = by_role.get(role, 0.0) + float(proc.usedGpuMemory or 0)
                out += [
                    Sample("rlhf_gpu_role_memory_bytes", (*key, role), v)
                    for role, v in sorted(by_role.items())
                ]
                gpu.role = gpu_role(by_role)
        out += self._health(nv, gpu)
        if self.joiner is not None:
            self.joiner.add_samples(gpu.label, gpu.role, gpu.recent)
        gpu.recent = []
        return out

    # -- health -----------------------------------------------------------------------------
    def _health(self, nv: Any, gpu: Gpu) -> list[Sample]:
        """ECC, remapped rows or retired pages, throttle seconds (docs/dcgm-exporter.md)."""
        h, key = gpu.handle, (gpu.label, gpu.uuid, gpu.role)
        out: list[Sample] = []
        for error, etype in ECC:
            for scope, counter in ECC_SCOPES:
                n = self._optional(
                    nv, gpu, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, etype, counter
                )
                if n is None:
                    break
                out.append(Sample("rlhf_gpu_ecc_errors_total", (*key, error, scope), float(n)))
        rows = self._optional(nv, gpu, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
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
                pages = self._optional(
                    nv, gpu, "retired_pages", nv.nvmlDeviceGetRetiredPages, h, code
                )
                if pages is None:
                    break
                out.append(Sample("rlhf_gpu_retired_pages", (*key, cause), float(len(pages))))
            pend = self._optional(
                nv, gpu, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h
            )
            if pend is not None:
                out.append(Sample("rlhf_gpu_retired_pages_pending", key, 1.0 if pend else 0.0))
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        mask = self._optional(
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

    def _read_events(self, nv: Any) -> None:
        """Count the XID events waiting in the event set (at most MAX_EVENTS a poll)."""
        if self._events is None:
            return
        by_uuid = {g.uuid: g for g in self._gpus if g.uuid}
        by_handle = {_address(g.handle): g for g in self._gpus if g.handle is not None}
        for _ in range(MAX_EVENTS):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:  # e.g. a GPU lost: its own reading says so
                log.debug("NVML event wait failed: %s", exc, extra={"collector": self.name})
                return
            if int(data.eventType) & XID_EVENT == 0:
                continue
            gpu = by_handle.get(_address(data.device))
            if gpu is None:
                try:
                    gpu = by_uuid.get(_text(nv.nvmlDeviceGetUUID(data.device)))
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
                extra={"collector": self.name, "reason": f"xid_{xid}"},
            )

    def _optional(self, nv: Any, gpu: Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any:
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
            log.info("GPU %s does not report %s", gpu.label, what, extra={"collector": self.name})
            return None

    # -- busy seconds -----------------------------------------------------------------------
    def _integrate(self, nv: Any, gpu: Gpu) -> None:
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
                    extra={"collector": self.name},
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

    # -- roles ------------------------------------------------------------------------------
    def _actors(self) -> Mapping[int, ActorProcess]:
        if not self.roles or self.ray is None:
            return {}
        return self.ray.pid_actors(max_age=max(4 * self.ray.interval, 60.0))

    def _role_of(self, pid: int, actors: Mapping[int, ActorProcess]) -> str:
        if not actors:
            return UNKNOWN_ROLE
        seen, cache = self._role_cache
        if seen is not actors:  # a new Ray poll: PIDs may have been reused
            cache = {}
            self._role_cache = (actors, cache)
        role = cache.get(pid)
        if role is None:
            role = cache[pid] = self._match(pid, actors)
        return role

    def _match(self, pid: int, actors: Mapping[int, ActorProcess]) -> str:
        """Walk up from the GPU process to an actor process this host can see and verify."""
        for _ in range(MAX_ANCESTORS):
            actor = actors.get(pid)
            if actor is not None:
                return actor.role if self._titled(pid, actor.class_name) else UNKNOWN_ROLE
            pid = self._parent(pid)
            if pid <= 1:
                break
        return UNKNOWN_ROLE

    def _titled(self, pid: int, class_name: str) -> bool:
        """Ray titles actor processes `ray::<Class>` (`ray::<Class>.<method>` while busy)."""
        try:
            with open(f"{self.proc_root}/{pid}/cmdline", "rb") as f:
                title = f.read(512)
        except OSError:
            return False
        want = b"ray::" + short_name(class_name).encode()
        return title.startswith(want) and title[len(want) : len(want) + 1] in (
            b"",
            b".",
            b"\0",
            b" ",
        )

    def _parent(self, pid: int) -> int:
        try:
            with open(f"{self.proc_root}/{pid}/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0
