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

The readings per GPU are in nvml_readings.py, the PID -> role match in gpu_pid_roles.py.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..diagnosis.gpujoin import gpu_role
from ..join.board import WindowBoard, WindowJoiner
from ..join.ports import ActorPids, ActorProcess
from ..metrics.snapshot import Sample
from ..settings import Settings
from .base import Clock, Context, PollingSource, PollResult, SourceError
from .gpu_pid_roles import UNKNOWN_ROLE, PidRoles
from .nvml_readings import ALERTED_XIDS, XID_EVENT, Gpu, GpuReadings, error_reason, text

log = logging.getLogger(__name__)

JOB_HORIZON = 900.0  # seconds: a job that made a step this recently is the GPUs' job
NO_JOB = ("", "")


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
        self._roles = PidRoles(ray, roles, proc_root)  # which role's process uses a GPU
        self._readings = GpuReadings(self.name, clock, self.wall, interval, self.joiner)

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
                self._driver = text(nv.nvmlSystemGetDriverVersion())
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
        actors = self._roles.actors()
        out: list[Sample] = []
        failed = 0
        self._readings.read_events(nv, self._events, self._gpus)
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
            gpu.uuid = text(nv.nvmlDeviceGetUUID(handle))
            gpu.name = text(nv.nvmlDeviceGetName(handle))
            gpu.handle = handle
            if self._events is not None:
                self._readings.optional(
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
        self._readings.integrate(nv, gpu)
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
        power = self._readings.optional(nv, gpu, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out.append(Sample("rlhf_gpu_power_watts", key, power / 1000.0))  # milliwatts
        temp = self._readings.optional(
            nv, gpu, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU
        )
        if temp is not None:
            out.append(Sample("rlhf_gpu_temperature_celsius", key, float(temp)))
        clock = self._readings.optional(
            nv, gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM
        )
        if clock is not None:
            out.append(Sample("rlhf_gpu_sm_clock_hertz", key, clock * 1e6))  # MHz
        if self.roles:
            procs = self._readings.optional(
                nv, gpu, "processes", nv.nvmlDeviceGetComputeRunningProcesses, h
            )
            if procs is not None:
                by_role = {UNKNOWN_ROLE: 0.0}
                for proc in procs:
                    role = self._roles.role_of(int(proc.pid), actors)
                    by_role[role] = by_role.get(role, 0.0) + float(proc.usedGpuMemory or 0)
                out += [
                    Sample("rlhf_gpu_role_memory_bytes", (*key, role), v)
                    for role, v in sorted(by_role.items())
                ]
                gpu.role = gpu_role(by_role)
        out += self._readings.health(nv, gpu)
        if self.joiner is not None:
            self.joiner.add_samples(gpu.label, gpu.role, gpu.recent)
        gpu.recent = []
        return out
