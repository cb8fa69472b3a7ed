"""Every `serve` setting, declared once: flag, YAML key, environment variable, default, help.

The table (`OPTIONS`) and the parsers of its values. `rlhf_exporter.settings` turns it into
flags, reads the YAML file and the environment, and resolves the `Settings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .auth import FAIL_RATE, FAIL_RATE_TOTAL, check_token
from .diagnosis.thresholds import seconds
from .logs import LEVELS

DEFAULT_PORT = 19839  # outside 9100-9999, which the Prometheus port registry has fully allocated
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
ENV_PREFIX = "RLHF_EXPORTER_"


def _bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _listen(text: str) -> str:
    _host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return text


def _positive(text: str) -> float:
    """A duration > 0: seconds, or the Prometheus syntax (`10m`, `1h30m`), as in thresholds."""
    value = seconds(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    """A whole number >= 1 (a bound)."""
    value = int(str(text).strip())
    if value < 1:
        raise ValueError(f"must be >= 1, got {text!r}")
    return value


def _size(text: str) -> int:
    """A positive number of bytes, with an optional KiB/MiB/GiB (or K/M/G) suffix."""
    s = str(text).strip()
    number, factor = s, 1
    for suffix, f in (
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("K", 1 << 10),
        ("M", 1 << 20),
        ("G", 1 << 30),
    ):
        if s.endswith(suffix):
            number, factor = s[: -len(suffix)], f
            break
    try:
        value = float(number) * factor
        ok = math.isfinite(value) and int(value) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"expected a size of at least 1 byte (e.g. 4096, 512K, 1MiB), got {text!r}"
        )
    return int(value)


def _rate(text: str) -> float:
    """A rate > 0 (per second)."""
    value = float(str(text).strip())
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a number > 0, got {text!r}")
    return value


def _token(text: str) -> str:
    """A bearer token: surrounding whitespace (a secret file's newline) stripped; refused,
    without being shown, when it holds what an Authorization header cannot carry."""
    return check_token(str(text)) or ""


def _ray_token(text: str) -> str:
    """Ray's token, checked as the push token is (never shown)."""
    return check_token(str(text), "ray_token") or ""


def _log_level(text: str) -> str:
    level = str(text).strip().lower()
    if level not in LEVELS:
        raise ValueError(f"expected one of {', '.join(LEVELS)}, got {text!r}")
    return level


def _str_list(text: Any) -> list[str]:
    if isinstance(text, list):
        return [str(t) for t in text]
    return [t for t in str(text).split(",") if t]


@dataclass(frozen=True)
class Option:
    name: str  # the YAML key; the flag is --name-with-dashes
    parse: Callable[[Any], Any]
    default: Any
    help: str
    group: str = "general"
    metavar: str | None = None
    multiple: bool = False  # a flag that may be repeated (a list)


OPTIONS: tuple[Option, ...] = (
    # general
    Option(
        "listen",
        _listen,
        DEFAULT_LISTEN,
        "address to serve on; use 0.0.0.0:PORT in a pod",
        metavar="HOST:PORT",
    ),
    Option(
        "thresholds",
        str,
        None,
        "thresholds YAML overriding the decision table's defaults",
        metavar="FILE",
    ),
    Option("log_format", str, "text", "log format: text or json", metavar="FORMAT"),
    Option(
        "log_level", _log_level, "info", "log level: debug, info, warning or error", metavar="LEVEL"
    ),
    Option(
        "demo",
        _bool,
        False,
        "run a built-in simulated verl job and watch it (a newcomer's first run); its GPUs "
        "and Ray actors are simulated (collector demo), so the real Ray and NVML collectors "
        "are off unless --ray or --nvml (or their variable or key) turns them on",
    ),
    Option(
        "demo_step_seconds",
        _positive,
        0.7,
        "with --demo: seconds between the simulated job's steps",
        metavar="SECONDS",
    ),
    Option(
        "demo_scenario",
        str,
        "all",
        "only with --demo (an error without it): the scripted incidents to play: all (default), workload_shift, "
        "regression, checkpoint, long_validation, actor_restart, gpus_idle, trainer_starved, "
        "rollout_overprovisioned, bottleneck_moves or stall "
        "(timeline: rlhf_exporter/demo/scenario.py)",
        metavar="NAME",
    ),
    Option(
        "legacy_change_none",
        _bool,
        False,
        'deprecated, removed in the next release: serve a steady step as kind="none" '
        '(the previous release\'s value) instead of kind="steady" in rlhf_change and '
        "rlhf_change_steps_total, for dashboards not yet migrated (docs/metrics.md); the "
        "shipped rules and dashboards read either",
    ),
    # verl files
    Option(
        "verl_root",
        str,
        None,
        "watch ROOT/<project>/<experiment>.jsonl (verl's VERL_FILE_LOGGER_ROOT)",
        "verl",
        "DIR",
        multiple=True,
    ),
    Option(
        "verl_file",
        str,
        None,
        "watch one verl JSONL file (repeatable)",
        "verl",
        "PATH",
        multiple=True,
    ),
    Option(
        "project",
        str,
        None,
        "project label for --verl-file or VERL_FILE_LOGGER_PATH (default for --verl-file: "
        "the file's parent directory); with --experiment, also the job this node's GPUs "
        "serve (their series' labels)",
        "verl",
    ),
    Option(
        "experiment",
        str,
        None,
        "experiment label for --verl-file or VERL_FILE_LOGGER_PATH (default for --verl-file: "
        "the file name without .jsonl)",
        "verl",
    ),
    Option(
        "verl_interval",
        _positive,
        1.0,
        "seconds between reads of the verl files",
        "verl",
        "SECONDS",
    ),
    Option(
        "job_expiry",
        _positive,
        86400.0,
        "stop exporting a job whose file has not changed for this long (seconds or 10m, 24h)",
        "verl",
        "DURATION",
    ),
    Option(
        "total_steps",
        _count,
        None,
        "every job's last step (verl's trainer.total_training_steps): reaching it makes "
        "the job finished, and a finished job is not a stalled one; a "
        "<experiment>.total_steps file beside a log sets it for that job",
        "verl",
        "STEPS",
    ),
    Option(
        "max_line_bytes",
        _size,
        1 << 20,
        "longest accepted JSONL line; longer ones are counted as too_long",
        "verl",
        "BYTES",
    ),
    # push
    Option("push", _bool, True, "accept POST /api/v1/records", "push"),
    Option(
        "push_max_bytes",
        _size,
        1 << 20,
        "largest push body accepted (larger: 413)",
        "push",
        "BYTES",
    ),
    Option(
        "push_token",
        _token,
        None,
        "require 'Authorization: Bearer TOKEN' on pushes and GET /api/v1/windows (constant-time "
        "compare; surrounding whitespace stripped; a space, control or non-ASCII character "
        "inside is refused at start)",
        "push",
        "TOKEN",
    ),
    Option(
        "auth_fail_rate",
        _rate,
        FAIL_RATE,
        "failed authentications per second one client may make (a burst of twice that); "
        "beyond, 429 without comparing the token, counted as auth_throttled",
        "push",
        "PER_SECOND",
    ),
    Option(
        "auth_fail_rate_total",
        _rate,
        FAIL_RATE_TOTAL,
        "failed authentications per second in all clients together (beyond: 429, auth_throttled)",
        "push",
        "PER_SECOND",
    ),
    Option(
        "push_allow_anonymous",
        _bool,
        False,
        "allow push without a token on a non-loopback --listen address (refused otherwise)",
        "push",
    ),
    Option(
        "push_max_jobs",
        _count,
        1000,
        "most pushed jobs at a time (more: 429, counted as too_many_jobs)",
        "push",
        "N",
    ),
    Option(
        "push_max_jobs_per_client",
        _count,
        100,
        "most pushed jobs one client address may create (more: 429, counted as "
        "too_many_jobs_per_client)",
        "push",
        "N",
    ),
    # limits: bounds on what one job keeps (each drop counted in rlhf_exporter_record_errors_total)
    Option(
        "max_unknown_timers",
        _count,
        32,
        "timing_s/<x> timers outside the thresholds' timer map kept (exported as phase) per "
        "job; later ones are dropped as too_many_timers",
        "limits",
        "N",
    ),
    Option(
        "max_step_keys",
        _count,
        1024,
        "keys kept of one step's merged records (keys the exporter reads first); the rest "
        "are dropped as too_many_keys",
        "limits",
        "N",
    ),
    Option(
        "max_key_chars",
        _count,
        256,
        "longest record key kept; longer ones are dropped as key_too_long",
        "limits",
        "N",
    ),
    Option(
        "max_files",
        _count,
        5000,
        "verl files watched at most; further files are ignored (too_many_files, counted once); "
        "also the directories and entries looked at for .jsonl files a level too deep in a "
        "root that shows no job",
        "limits",
        "N",
    ),
    Option(
        "http_max_connections",
        _count,
        64,
        "open HTTP connections served at once; beyond it a connection gets 503 and is closed",
        "limits",
        "N",
    ),
    Option(
        "http_read_timeout",
        _positive,
        10.0,
        "seconds a connection may take to send a request's headers, or its body, or to "
        "start the next request on a kept-alive connection; then it is closed",
        "limits",
        "SECONDS",
    ),
    Option(
        "page_cache_bytes",
        _size,
        32 << 20,
        "bytes of rendered job-view pages kept (the least recently stored are evicted; the "
        "Host header never keys the cache)",
        "limits",
        "BYTES",
    ),
    # ray
    Option("ray", _bool, True, "poll Ray's state API for actor liveness", "ray"),
    Option(
        "ray_address",
        str,
        None,
        "Ray dashboard URL (default: $RAY_DASHBOARD_ADDRESS, $RAY_ADDRESS, http://127.0.0.1:8265)",
        "ray",
        "URL",
    ),
    Option(
        "ray_token_file",
        str,
        None,
        "file holding the token of a Ray cluster with token authentication (a mounted Secret; "
        "re-read when it changes), sent as 'Authorization: Bearer' (default: $RAY_AUTH_TOKEN_PATH)",
        "ray",
        "FILE",
    ),
    Option(
        "ray_token",
        _ray_token,
        None,
        "the Ray cluster's token itself; prefer RLHF_EXPORTER_RAY_TOKEN or --ray-token-file "
        "(a flag shows in ps) (default: $RAY_AUTH_TOKEN)",
        "ray",
        "TOKEN",
    ),
    Option("ray_interval", _positive, 15.0, "seconds between Ray polls", "ray", "SECONDS"),
    Option(
        "ray_timeout",
        _positive,
        5.0,
        "seconds one request to Ray's API may take in all (connect, headers and body)",
        "ray",
        "SECONDS",
    ),
    Option(
        "ray_actors",
        _bool,
        True,
        "export actor series; turn off on GPU worker pods that read Ray only to match GPU PIDs to roles (no double counting)",
        "ray",
    ),
    Option("ray_per_class", _bool, False, "also export actors per class_name (more series)", "ray"),
    Option(
        "ray_roles",
        str,
        None,
        "YAML file with an ordered list of {role, pattern} overriding the class-to-role map",
        "ray",
        "FILE",
    ),
    Option(
        "ray_node_ip",
        str,
        None,
        "this host's IP as Ray reports it, to match GPU PIDs to this node's actors (default: every local address; in a pod, the downward API's status.podIP)",
        "ray",
        "IP",
    ),
    # verl's printed steps, read from Ray (sources/console.py, docs/serve.md)
    Option(
        "console",
        _bool,
        True,
        "read every verl job's steps from what its trainer actor prints (verl's console logger, on by default), streamed from Ray's state API by actor id: no change to the job; needs --ray and --ray-actors",
        "console",
    ),
    Option(
        "console_interval",
        _positive,
        1.0,
        "seconds between reads of the trainers' streams",
        "console",
        "SECONDS",
    ),
    Option(
        "console_max_streams",
        _count,
        50,
        "trainer actors and job driver logs streamed at once, at most (each holds one of Ray's state API requests: RAY_STATE_SERVER_MAX_HTTP_REQUEST, 100 by default); more are counted (too_many_streams) and not read",
        "console",
        "N",
    ),
    Option(
        "console_stream_budget",
        _size,
        8 << 20,
        "bytes read from one trainer's stream per read at most (a stream that still brings bytes is read again within the poll, for up to half of --console-interval and 64 MiB in all)",
        "console",
        "BYTES",
    ),
    # stacks of a stalled job (sources/stacks.py, docs/runbooks.md#rlhfjobstalled)
    Option(
        "stacks",
        _bool,
        True,
        "when a job has not stepped for its stall limit, take the Python stack of each of its Ray actor processes through Ray's dashboard (py-spy; the head needs RAY_DASHBOARD_ENABLE_PROFILING=1, each Ray container py-spy and SYS_PTRACE) and say where each role waits",
        "stacks",
    ),
    Option(
        "stacks_interval",
        _positive,
        15.0,
        "seconds between stall checks (a stalled job's stacks come within one of these after its stall limit)",
        "stacks",
        "SECONDS",
    ),
    Option(
        "stacks_every",
        _positive,
        300.0,
        "a stalled job's stacks are taken again at most this often while the stall lasts",
        "stacks",
        "SECONDS",
    ),
    Option(
        "stacks_timeout",
        _positive,
        10.0,
        "deadline of one stack request (Ray runs py-spy dump on the process's node)",
        "stacks",
        "SECONDS",
    ),
    Option(
        "stacks_max_processes",
        _count,
        64,
        "processes of one job whose stacks are taken per round (the rest are counted, not read)",
        "stacks",
        "N",
    ),
    Option(
        "stacks_max_jobs",
        _count,
        8,
        "stalled jobs whose stacks are kept at once (more stalled jobs are counted, not read)",
        "stacks",
        "N",
    ),
    Option(
        "stacks_max_frames",
        _count,
        48,
        "frames kept per thread of a stack (innermost first)",
        "stacks",
        "N",
    ),
    Option(
        "stacks_max_bytes",
        _size,
        64 << 10,
        "bytes of one process's stack read and kept at most",
        "stacks",
        "BYTES",
    ),
    Option(
        "stacks_native",
        _bool,
        True,
        "ask for the C frames too (py-spy --native): they tell a sleep, a lock or a socket read in the job's own code; without them those read as unknown",
        "stacks",
    ),
    # nvml
    Option("nvml", _bool, True, "sample GPUs through NVML", "nvml"),
    Option("nvml_interval", _positive, 1.0, "seconds between NVML samples", "nvml", "SECONDS"),
    Option(
        "gpu_roles",
        _bool,
        None,
        "attribute GPU memory to Ray roles by PID (default: on when Ray is on)",
        "nvml",
    ),
    Option(
        "gpu_windows",
        _bool,
        True,
        "GPU busy time by step window and GPU role: join NVML's samples to verl's step windows",
        "nvml",
    ),
    Option(
        "gpu_windows_keep",
        _count,
        32,
        "steps' window timelines kept per job for the GPU window join",
        "nvml",
        "STEPS",
    ),
    Option(
        "gpu_windows_from",
        str,
        None,
        "a worker sidecar: the head sidecar's URL to read the job's step windows from (GET /api/v1/windows, with --push-token as bearer token)",
        "nvml",
        "URL",
    ),
    Option(
        "gpu_windows_interval",
        _positive,
        2.0,
        "seconds between reads of the head's step windows (--gpu-windows-from)",
        "nvml",
        "SECONDS",
    ),
    # rollout engines (docs/engines.md)
    Option(
        "engines",
        _bool,
        True,
        "sample the rollout engines' /metrics (vLLM, SGLang) for each rollout window's evidence: "
        "verl's rollout servers found through Ray on this node, plus the targets below",
        "engines",
    ),
    Option(
        "engine_target",
        str,
        None,
        "a rollout engine's metrics URL or HOST:PORT (repeatable; engines outside Ray)",
        "engines",
        "URL",
        multiple=True,
    ),
    Option(
        "engine_targets_file",
        str,
        None,
        "a Prometheus file_sd YAML/JSON list of engine targets ({targets, labels: {replica}}), "
        "re-read when it changes",
        "engines",
        "FILE",
    ),
    Option(
        "engine_prometheus_file",
        str,
        None,
        "the Prometheus config verl writes with actor_rollout_ref.rollout.prometheus.enable=True "
        "(rollout.prometheus.file): its `rollout` job's targets are scraped",
        "engines",
        "FILE",
    ),
    Option(
        "engine_interval",
        _positive,
        1.0,
        "seconds between engine reads while a job steps, an engine is busy or a verl rollout "
        "server's Ray actor lives on this node",
        "engines",
        "SECONDS",
    ),
    Option(
        "engine_idle_interval",
        _positive,
        15.0,
        "seconds between engine reads while nothing steps",
        "engines",
        "SECONDS",
    ),
    Option(
        "engine_timeout",
        _positive,
        0.5,
        "seconds one engine read may take in all (then counted as engine_timeout)",
        "engines",
        "SECONDS",
    ),
    Option(
        "engine_max_bytes",
        _size,
        4 << 20,
        "largest engine /metrics answer read (larger: engine_body_too_large)",
        "engines",
        "BYTES",
    ),
    Option(
        "engine_max_replicas",
        _count,
        64,
        "engine replicas read at most; more are dropped as engine_too_many_replicas",
        "engines",
        "N",
    ),
    Option(
        "engine_max_series",
        _count,
        256,
        "samples of one engine family read per page (more: engine_series_dropped); a page "
        "of 70,000 label sets costs a split, not 70,000 parsed samples",
        "engines",
        "N",
    ),
    Option(
        "engine_ring",
        _count,
        900,
        "samples kept per replica (at 1 s: the last 15 minutes; a longer rollout window is "
        "not covered and keeps the log's reason)",
        "engines",
        "N",
    ),
)
BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}
GROUP_TITLES = {
    "general": "general",
    "verl": "verl files",
    "push": "push endpoint",
    "limits": "limits (bad or hostile input)",
    "ray": "Ray actors",
    "console": "verl's printed steps (from Ray, no change to the job)",
    "nvml": "GPUs (NVML)",
    "engines": "rollout engines (vLLM, SGLang)",
    "stacks": "stacks of a stalled job (through Ray's dashboard)",
}


def is_switch(option: Option) -> bool:
    """A yes/no option: `--name` and `--no-name` on the command line."""
    return option.parse is _bool


def as_list(raw: Any) -> list[str]:
    """A repeated option's values: a YAML list, or one comma-separated string."""
    return _str_list(raw)
