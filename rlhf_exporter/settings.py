"""Every `serve` setting resolved: flags, `--config FILE`, environment, from the one table of
options (`rlhf_exporter.options`).

Precedence, lowest first: built-in default < `--config FILE` (YAML) < `RLHF_EXPORTER_*`
environment variables < command-line flags. The flag `--ray-address` is the YAML key
`ray_address` and the variable `RLHF_EXPORTER_RAY_ADDRESS`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .options import BY_NAME, ENV_PREFIX, GROUP_TITLES, OPTIONS, Option, as_list, is_switch
from .thresholds_file import ConfigError, read_yaml


def flag(option: Option) -> str:
    return "--" + option.name.replace("_", "-")


def env_name(option: Option) -> str:
    return ENV_PREFIX + option.name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option, grouped for --help. Defaults are resolved later (see resolve)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with any of the settings below, by their key "
        "(the flag without dashes, e.g. ray_address: http://head:8265)",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in OPTIONS:
        group = groups.get(option.group)
        if group is None:
            group = groups[option.group] = parser.add_argument_group(GROUP_TITLES[option.group])
        text = f"{option.help} [env {env_name(option)}; default {option.default!r}]"
        if is_switch(option):
            group.add_argument(
                flag(option),
                dest=option.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=text,
            )
        elif option.multiple:
            group.add_argument(
                flag(option),
                dest=option.name,
                action="append",
                default=None,
                metavar=option.metavar,
                help=text,
            )
        else:
            group.add_argument(
                flag(option), dest=option.name, default=None, metavar=option.metavar, help=text
            )


@dataclass(frozen=True)
class Settings:
    """Every `serve` setting, resolved (`resolve`): one typed field per `Option` of OPTIONS,
    by its name, in its order (the table holds the default, parser and help;
    tests/test_settings.py checks that the two agree, name, type and default)."""

    listen: str
    thresholds: str | None
    log_format: str
    log_level: str
    demo: bool
    demo_step_seconds: float
    demo_scenario: str
    legacy_change_none: bool
    verl_root: list[str] | None
    verl_file: list[str] | None
    project: str | None
    experiment: str | None
    verl_interval: float
    job_expiry: float
    total_steps: int | None
    max_line_bytes: int
    push: bool
    push_max_bytes: int
    push_token: str | None
    auth_fail_rate: float
    auth_fail_rate_total: float
    push_allow_anonymous: bool
    push_max_jobs: int
    push_max_jobs_per_client: int
    max_unknown_timers: int
    max_step_keys: int
    max_key_chars: int
    max_files: int
    http_max_connections: int
    http_read_timeout: float
    page_cache_bytes: int
    ray: bool
    ray_address: str | None
    ray_token_file: str | None
    ray_token: str | None
    ray_interval: float
    ray_timeout: float
    ray_actors: bool
    ray_per_class: bool
    ray_roles: str | None
    ray_node_ip: str | None
    console: bool
    console_interval: float
    console_max_streams: int
    console_stream_budget: int
    stacks: bool
    stacks_interval: float
    stacks_every: float
    stacks_timeout: float
    stacks_max_processes: int
    stacks_max_jobs: int
    stacks_max_frames: int
    stacks_max_bytes: int
    stacks_native: bool
    nvml: bool
    nvml_interval: float
    gpu_roles: bool | None
    gpu_windows: bool
    gpu_windows_keep: int
    gpu_windows_from: str | None
    gpu_windows_interval: float
    engines: bool
    engine_target: list[str] | None
    engine_targets_file: str | None
    engine_prometheus_file: str | None
    engine_interval: float
    engine_idle_interval: float
    engine_timeout: float
    engine_max_bytes: int
    engine_max_replicas: int
    engine_max_series: int
    engine_ring: int


def _convert(option: Option, raw: Any, where: str) -> Any:
    if raw is None:
        return None
    try:
        if option.multiple:
            return [option.parse(v) for v in as_list(raw)]
        return option.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


VERL_FILE_LOGGER_PATH = "VERL_FILE_LOGGER_PATH"


def _verl_file_logger_path(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    """verl's own `VERL_FILE_LOGGER_PATH` names the one file its `file` logger writes, with no
    project or experiment in the path. Set, it is the default of --verl-file (as verl prefers
    it to VERL_FILE_LOGGER_ROOT); the job's labels then come from configuration (--project,
    --experiment), never from the path."""
    path = environ.get(VERL_FILE_LOGGER_PATH)
    if not path or values["verl_file"] or values["demo"]:
        return
    if not values["project"] or not values["experiment"]:
        raise ConfigError(
            f"{VERL_FILE_LOGGER_PATH}={path} names one file, and its path holds no project or "
            "experiment: set --project and --experiment (RLHF_EXPORTER_PROJECT, "
            "RLHF_EXPORTER_EXPERIMENT) to the job's trainer.project_name and "
            "trainer.experiment_name"
        )
    values["verl_file"] = [path]


DEMO_OFF = ("ray", "nvml")
"""Real collectors `--demo` turns off unless a flag, variable or file turns them on: the demo
simulates its own GPUs and Ray actors (collector `demo`), and a real Ray dashboard or GPU on
the same machine would duplicate their series."""


def _demo(values: dict[str, Any], explicit: set[str]) -> None:
    """`--demo` is only the demo; `--demo-scenario NAME` without `--demo` is a mistake, not
    a setting silently ignored (its default, `all`, written out in a settings file is fine)."""
    if not values["demo"]:
        if (
            "demo_scenario" in explicit
            and values["demo_scenario"] != BY_NAME["demo_scenario"].default
        ):
            raise ConfigError(
                "demo_scenario: only with --demo (e.g. rlhf-exporter serve --demo "
                f"--demo-scenario {values['demo_scenario']})"
            )
        return
    for name in DEMO_OFF:
        if name not in explicit:
            values[name] = False


def resolve(
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    config_path: str | None = None,
) -> Settings:
    """Defaults < config file < environment < flags. Raises ConfigError with the culprit."""
    environ = os.environ if environ is None else environ
    values = {o.name: o.default for o in OPTIONS}
    explicit: set[str] = set()  # set by a file, a variable or a flag, not by default
    path = config_path or (getattr(args, "config", None) if args is not None else None)
    if path is None:
        path = environ.get(ENV_PREFIX + "CONFIG")
    if path:
        doc = read_yaml(path) or {}
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{path}: expected a mapping of settings")
        for key, raw in doc.items():
            option = BY_NAME.get(str(key).replace("-", "_"))
            if option is None:
                raise ConfigError(
                    f"{path}: unknown setting '{key}' (see rlhf-exporter serve --help)"
                )
            values[option.name] = _convert(option, raw, f"{path}: {key}")
            explicit.add(option.name)
    for option in OPTIONS:
        raw = environ.get(env_name(option))
        if raw is not None:
            values[option.name] = _convert(option, raw, env_name(option))
            explicit.add(option.name)
    if args is not None:
        for option in OPTIONS:
            raw = getattr(args, option.name, None)
            if raw is not None:
                values[option.name] = _convert(option, raw, flag(option))
                explicit.add(option.name)
    _verl_file_logger_path(values, environ)
    _demo(values, explicit)
    if values["log_format"] not in ("text", "json"):
        raise ConfigError(f"log_format: expected text or json, got {values['log_format']!r}")
    return Settings(**values)
