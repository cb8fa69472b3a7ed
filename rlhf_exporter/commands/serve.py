"""`rlhf-exporter serve`: the sidecar. Sources in the background, HTTP in front.

Wiring in one place: the verl files, the push endpoint, Ray and NVML become sources; their
snapshot methods feed one exposition; SIGTERM/SIGINT stop everything within a few seconds.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, cast

from .. import __version__
from .. import settings as settings_mod
from ..job.windows_wire import WindowsApi
from ..join.board import WindowBoard
from ..join.names import JobNames
from ..join.ports import WALL
from ..logs import configure
from ..metrics.snapshot import Problem
from ..options import DEFAULT_LISTEN, DEFAULT_PORT
from ..server import Endpoints, PageCache, make_server
from ..settings import Settings
from ..sources.base import DEPENDENCY_MISSING, Clock, Context, Source, UnavailableSource
from ..sources.push import PushSource
from ..sources.verl_files import VerlFileSource
from ..thresholds_file import ConfigError, load_thresholds

if TYPE_CHECKING:
    from ..demo.devices import DemoDevices
    from ..demo.engines import DemoEngines
    from ..demo.job import DemoJob
    from ..sources.console import ConsoleSource
    from ..sources.ray import RaySource
    from ..sources.stacks import StackSource

ORDER = 10
log = logging.getLogger("rlhf_exporter.serve")

EPILOG = f"""\
Every setting is a flag, a key in the --config YAML file (the flag's name with underscores:
verl_root, push_token, ...) and an environment variable (RLHF_EXPORTER_VERL_ROOT, ...).
Precedence: flag > environment > config file > default. Lists (verl_root, verl_file) take a
YAML list or a comma-separated variable. A commented example of every setting, in a
checkout: examples/exporter.yaml. The thresholds file is --thresholds FILE.

Endpoints:
  /metrics            Prometheus metrics (catalog: docs/metrics.md)
  /healthz            200 while the process serves
  /readyz             200 once a source has collected once (503 before); 503 for good, with
                      the settings to add, when no source can ever see a verl job nor a GPU
  /                   the job view: every job (who needs attention first), sources' health,
                      set-up problems, how to scrape; /jobs/<project>/<experiment> one job's
                      step anatomy; /api/v1/jobs as JSON; /api/v1/jobs/<project>/<experiment>/
                      stacks a stalled job's stacks and where each role waits
  /api/v1/status      JSON: readiness, each source's state, last success and errors, and the
                      set-up problems ({{source, kind, message, hint}}): a verl root one level
                      off or missing, a file in another format, no source that sees a job
  POST /api/v1/records  {{"project","experiment","records":[{{"step","data"}}, ...]}}
                      (or one record's "step" and "data" at the top level); answers 200,
                      400 bad JSON/schema, 401 bad token, 409 job read from a file
                      (a file job always wins its name), 413 over push_max_bytes,
                      429 over push_max_jobs(_per_client). A rejected push changes nothing.
                      Prefer RLHF_EXPORTER_PUSH_TOKEN to --push-token (visible in ps).
                      Push on, no token and a non-loopback --listen: refused unless
                      --push-allow-anonymous.

Bounds (group "limits"): what each drops is counted in
rlhf_exporter_record_errors_total{{reason}}; beyond http_max_connections a connection gets 503.
SIGHUP is logged and ignored (settings are read at start); SIGTERM/SIGINT stop.

Examples:
  rlhf-exporter serve --demo                   # a simulated job (no real Ray or NVML); open http://{DEFAULT_LISTEN}/
  rlhf-exporter serve --demo --demo-scenario actor_restart   # one scripted incident
  rlhf-exporter serve --verl-root /logs        # every /logs/<project>/<experiment>.jsonl
  rlhf-exporter serve --listen 0.0.0.0:{DEFAULT_PORT} --verl-file /logs/p/e.jsonl --no-ray --no-push
  curl -X POST http://{DEFAULT_LISTEN}/api/v1/records -H 'Authorization: Bearer T' \\
       -d '{{"project":"p","experiment":"e","step":1,"data":{{"timing_s/step":12.5}}}}'
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve Prometheus metrics for running verl jobs (the sidecar)",
        description="Watch verl jobs (their file-logger JSONL, pushes, Ray actors, GPUs) and "
        "serve each step's diagnosis as Prometheus metrics. Listens on "
        f"{DEFAULT_LISTEN} by default (port {DEFAULT_PORT} is outside "
        "the 9100-9999 range that Prometheus' default port allocations fill).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings_mod.add_arguments(p)
    p.set_defaults(func=run)


class Sidecar:
    """Every part of one `serve` process, started and stopped together.

    Each source is built by its `from_settings(settings, context)`; one whose module cannot
    be imported (an optional dependency missing from this build) is exported as a down
    collector with reason `dependency_missing`, never left out silently.
    """

    def __init__(self, settings: Settings, clock: Clock = time.time):
        self.settings = settings
        self.th = load_thresholds(settings.thresholds)
        self.tempdir: Path | None = None
        try:
            self._build(settings, clock)
        except BaseException:  # a failed start (port taken, bad setting) leaves no temp dir
            engines = getattr(self, "demo_engines", None)
            if engines is not None:
                engines.close()  # nor a bound engine port
            if self.tempdir is not None:
                shutil.rmtree(self.tempdir, ignore_errors=True)
            raise

    def _build(self, settings: Settings, clock: Clock) -> None:
        self.demo = self._demo_job(settings)
        self.demo_devices: DemoDevices | None = None  # the demo's simulated GPUs and Ray actors
        extra_roots = [self.tempdir] if self.tempdir is not None else []
        # GPU time by step window (the demo's simulated GPUs join it too); a head sidecar
        # without GPUs (`sidecar.head.nvml: false`) still keeps its jobs' step windows, for
        # its worker sidecars to read (GET /api/v1/windows); the engine evidence joins each
        # step's rollout window through the same board
        gpu_windows = bool(
            (settings.nvml or self.demo is not None or _reads_jobs(settings))
            and settings.gpu_windows
        )
        # the demo's simulated vLLM engines, read by the real engine source (demo/engines.py)
        self.demo_engines = self._demo_engines(settings)
        engines_on = _engines_wanted(settings) or self.demo_engines is not None
        windows = None
        if gpu_windows or engines_on:
            windows = WindowBoard(keep=settings.gpu_windows_keep)
        context = Context(self.th, clock, tuple(extra_roots), windows=windows, names=JobNames())
        context = replace(context, job_clock=self.demo.clock if self.demo else WALL)  # demo.clock
        # built in the order of what each needs (Ray, then NVML and the engines that read its
        # actors, then the jobs' sources that read the engines and Ray's facts); exported in
        # the order below
        ray_source = self._optional("ray", settings.ray, _ray, settings, context)
        ray = None
        if ray_source is not None and not isinstance(ray_source, UnavailableSource):
            ray = cast("RaySource", ray_source)
        trainers = ray if ray is not None and settings.ray_actors else None
        facts = ray.facts() if ray is not None else None
        context = replace(context, ray=ray, facts=facts, trainers=trainers)
        # in the demo the board holds the simulated job's steps, which no real GPU serves:
        # the simulated devices join them, not NVML
        nvml_windows = windows if self.demo is None and gpu_windows else None
        self.nvml = self._optional(
            "nvml", settings.nvml, _nvml, settings, replace(context, windows=nvml_windows)
        )
        self.engines = None
        found_by_ray = ray is not None and settings.ray_actors
        targets = found_by_ray or _engine_targets(settings) or self.demo_engines is not None
        if engines_on and windows is not None and targets:
            # the rollout engines' evidence (Ray's rollout servers, or targets)
            from ..sources.engines import EngineSource

            self.engines = EngineSource.from_settings(self._engine_settings(settings), context)
            context = replace(context, engines=self.engines)
        self.verl = VerlFileSource.from_settings(settings, context)
        self.console = self._console(settings, context)  # after the files: a file job wins
        self.push = None
        if settings.push:
            _check_push_exposure(settings)
            self.push = PushSource.from_settings(settings, context)
        remote = None
        if gpu_windows and settings.gpu_windows_from:  # a worker: the head's windows
            from ..sources.remote_windows import RemoteWindowsSource

            remote = RemoteWindowsSource.from_settings(settings, context)
        if self.demo is not None:  # simulated GPUs and Ray actors, labelled as demo data
            from ..demo.devices import DemoDevices

            self.demo_devices = DemoDevices.for_job(self.demo, context)
        self.ray = ray_source
        self.stacks = self._stacks(settings, ray, context)
        built = (self.verl, self.console, self.push, ray_source, self.nvml, remote,
                 self.demo_devices, self.engines, self.stacks)  # fmt: skip
        self.sources: list[Source] = [s for s in built if s is not None]
        self.endpoints = self._endpoints(settings, windows if gpu_windows else None)
        self.server = make_server(
            settings.listen,
            self.endpoints,
            max_connections=settings.http_max_connections,
            read_timeout=settings.http_read_timeout,
        )

    def _console(self, settings: Settings, context: Context) -> ConsoleSource | None:
        """Every verl job's printed steps, streamed from Ray."""
        if not settings.console or context.trainers is None:
            return None
        from ..sources.console import ConsoleSource

        return ConsoleSource.from_settings(settings, context)

    def _stacks(
        self, settings: Settings, ray: RaySource | None, context: Context
    ) -> StackSource | None:
        """A stalled job's stacks through Ray's dashboard (sent the Ray token too); in the
        demo without Ray, the demo job's through its simulated dashboard (demo/dashboard.py)."""
        job_sources = [s for s in (self.verl, self.console, self.push) if s is not None]
        if ray is None and self.demo is not None and settings.stacks:
            from ..demo.dashboard import DemoStacks

            return DemoStacks.for_job(self.demo, settings, [s.jobs for s in job_sources], context)
        if ray is None:
            return None
        from ..sources.stacks import build as build_stacks

        token = ray.token
        return build_stacks(
            settings,
            ray,
            [s.jobs for s in job_sources],
            context,
            headers=token.header if token is not None else None,
        )

    def _endpoints(self, settings: Settings, windows: WindowBoard | None) -> Endpoints:
        """What the HTTP server serves, from the parts built (`windows`: the board the
        windows API serves to worker sidecars, None when this sidecar keeps no windows)."""
        endpoints = Endpoints(
            alerts=self.th.alerts,  # the job view's runbook links and stall deadline
            demo=self.demo is not None,
            demo_story=self.demo.story if self.demo is not None else None,
            demo_clock=(
                (self.demo.project, self.demo.experiment, self.demo.clock.at)
                if self.demo is not None
                else None
            ),
            snapshot_fns=[s.snapshot for s in self.sources],
            jobs_fns=[s.jobs for s in self.sources],
            push=self.push,
            ready_fns=[s.snapshot for s in self.sources if s not in (self.push, self.engines)],
            sources_text=", ".join(s.describe() for s in self.sources) or "none",
            windows_api=_windows_api(windows, settings),
            window_view=getattr(self.demo_devices or self.nvml, "joiner", None),
            balance_limits=self.th.document.get("balance", {}),
            pages=PageCache(max_bytes=settings.page_cache_bytes),
            stacks_of=self.stacks.round_of if self.stacks is not None else None,
            blind=self._blind(settings),
        )
        # a verl poll's new steps are encoded at once, off the scrape path; not the
        # engines' polls, 10 a second while a job steps (the warm thread's tick covers them)
        for source in (self.verl, self.console):
            if source is not None:
                source.after_poll.append(endpoints.exposition.wake)
        return endpoints

    def _blind(self, settings: Settings) -> Problem | None:
        """Why no source here can ever see a verl job, when none can (the verl files, the
        demo's included, push and the console source see jobs) and no GPU is sampled either
        (a GPU worker's sidecar, NVML only, serves its GPUs): /readyz answers 503 with it."""
        if self.verl is not None or self.console is not None or self.push is not None:
            return None
        if self.nvml is not None:
            return None
        return Problem("exporter", NO_JOB_SOURCE, BLIND, _blind_hint(settings))

    def _demo_engines(self, settings: Settings) -> DemoEngines | None:
        """`serve --demo`: its simulated vLLM replicas on 127.0.0.1 (unless --no-engines)."""
        if self.demo is None or not settings.engines:
            return None
        from ..demo.engines import DemoEngines

        return DemoEngines(self.demo.clock)

    def _engine_settings(self, settings: Settings) -> Settings:
        """The engine source's settings: in the demo, its engines are static targets too,
        read every demo.engines.INTERVAL (its steps' windows are ~135x compressed; every
        IDLE_INTERVAL while nothing steps)."""
        if self.demo_engines is None:
            return settings
        from ..demo.engines import IDLE_INTERVAL, INTERVAL

        return replace(
            settings,
            engine_target=[*(settings.engine_target or ()), *self.demo_engines.urls],
            engine_interval=min(settings.engine_interval, INTERVAL),
            engine_idle_interval=min(settings.engine_idle_interval, IDLE_INTERVAL),
        )

    def _demo_job(self, settings: Settings) -> DemoJob | None:
        """`serve --demo`: the simulated job, writing its log in a temp dir of its own."""
        if not settings.demo:
            return None
        from ..demo.job import DemoJob
        from ..demo.scenario import NAMES

        scenario = settings.demo_scenario
        if scenario not in NAMES:
            raise ConfigError(
                f"demo_scenario: unknown scenario {scenario!r}; one of {', '.join(NAMES)}"
            )
        self.tempdir = Path(tempfile.mkdtemp(prefix="rlhf-exporter-demo-"))
        return DemoJob(
            self.tempdir,
            step_seconds=settings.demo_step_seconds,
            scenario_name=scenario,
            th=self.th,
        )

    def _optional(
        self,
        name: str,
        enabled: bool,
        load: Callable[[], type[Source]],
        settings: Settings,
        context: Context,
    ) -> Source | None:
        """A source whose module needs an optional dependency."""
        if not enabled:
            return None
        try:
            source_cls = load()
        except ImportError as exc:
            source: Source | None = UnavailableSource(name, DEPENDENCY_MISSING, str(exc))
        else:
            source = source_cls.from_settings(settings, context)
        return source

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        if self.demo is not None:
            self.demo.start()
        if self.demo_engines is not None:
            self.demo_engines.start()
        for source in self.sources:
            source.start()
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.demo is not None:
            self.demo.stop()
        stoppers = [
            threading.Thread(target=s.stop, kwargs={"timeout": 2.0}, daemon=True)
            for s in self.sources
        ]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(3.0)
        if self.demo_engines is not None:
            self.demo_engines.stop()
        if self.tempdir is not None:
            shutil.rmtree(self.tempdir, ignore_errors=True)


def _engines_wanted(settings: Settings) -> bool:
    """Engine scraping is on and has somewhere to find engines: Ray's rollout servers, verl's
    Prometheus file, a targets file or static targets."""
    # a worker sidecar (--no-ray-actors: Ray for PIDs only) has no jobs to join engines to
    ray_discovery = settings.ray and settings.ray_actors
    return bool(settings.engines and (ray_discovery or _engine_targets(settings)))


def _engine_targets(settings: Settings) -> bool:
    return bool(
        settings.engine_target or settings.engine_targets_file or settings.engine_prometheus_file
    )


def _windows_api(windows: WindowBoard | None, settings: Settings) -> WindowsApi | None:
    """GET /api/v1/windows for worker sidecars, when this sidecar keeps step windows."""
    if windows is None:
        return None
    from ..auth import AuthGuard

    guard = AuthGuard(
        settings.push_token, "windows", settings.auth_fail_rate, settings.auth_fail_rate_total
    )
    return WindowsApi(windows, settings.push_token, guard)


def _check_push_exposure(settings: Settings) -> None:
    """Push without a token on an address others can reach lets any neighbour invent jobs:
    refused unless asked for explicitly."""
    import ipaddress

    from ..server import parse_listen

    if settings.push_token or settings.push_allow_anonymous:
        return
    host = parse_listen(settings.listen)[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(
            f"push is on without a token and --listen {settings.listen} is not a loopback "
            "address: set RLHF_EXPORTER_PUSH_TOKEN, or --no-push, or --push-allow-anonymous"
        )


def _ray() -> type[Source]:
    from ..sources.ray import RaySource  # needs requests

    return RaySource


def _nvml() -> type[Source]:
    from ..sources.nvml import NvmlSource  # imports pynvml itself, lazily, in each poll

    return NvmlSource


def run(args: argparse.Namespace) -> int:
    settings = settings_mod.resolve(args)  # a ConfigError exits 2 (cli.main)
    configure(settings.log_format, settings.log_level)
    try:
        sidecar = Sidecar(settings)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)
        return 2
    except OSError as exc:
        log.error(
            "cannot listen on %s: %s",
            settings.listen,
            exc.strerror or exc,
            extra={"listen": settings.listen},
        )
        return 1
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    def on_hangup(
        _signum: int, _frame: FrameType | None
    ) -> None:  # the default action would kill the process silently
        log.warning(
            "received SIGHUP: ignored (settings are read at start; restart to apply a changed "
            "--config)",
            extra={"signal": "SIGHUP"},
        )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, on_hangup)
    sidecar.start()
    blind = sidecar.endpoints.blind
    if blind is not None:  # once, at start: /readyz answers 503 with it
        log.warning("%s (%s): %s", blind.message, blind.kind, blind.hint,
                    extra={"reason": blind.kind})  # fmt: skip
    elif sidecar.verl is None and sidecar.console is None and sidecar.push is None:
        log.info("no source here sees a verl job: this exporter samples GPUs only (a GPU "
                 "worker's sidecar)")  # fmt: skip
    log.info(
        "rlhf-exporter %s serving %s/metrics; sources: %s",
        __version__,
        sidecar.url,
        sidecar.endpoints.sources_text,
        extra={"listen": settings.listen},
    )
    if sidecar.demo is not None:
        log.info(
            "demo: a simulated verl job writes %s; open %s/ to watch its diagnosis change",
            sidecar.demo.path,
            sidecar.url,
        )
    while not stop.wait(1.0):
        pass
    sidecar.stop()
    log.info("stopped")
    return 0


NO_JOB_SOURCE = "no_job_source"
BLIND = "no source of this exporter can ever see a verl job"


def _blind_hint(settings: Settings) -> str:
    """The settings that would let an exporter see a job, given those it has."""
    add = ['--verl-root DIR (verl\'s file logger: trainer.logger with "file" writes '
           "$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl)", "--verl-file FILE"]  # fmt: skip
    if not settings.push:
        add.append("--push (records posted to /api/v1/records)")
    if not (settings.ray and settings.ray_actors and settings.console):
        add.append("--ray --ray-actors --console (the steps every job on Ray prints)")
    return f"add {', '.join(add[:-1])} or {add[-1]}; --demo shows a simulated job"


def _reads_jobs(settings: Settings) -> bool:
    """Whether a source of verl records is on (files, push, or the trainers' printed steps)."""
    console = settings.console and settings.ray and settings.ray_actors
    return bool(settings.verl_root or settings.verl_file or settings.push or console)
