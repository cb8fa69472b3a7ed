"""Reading the thresholds file (YAML) into `diagnosis.Thresholds`.

The packaged `thresholds.yaml` holds every default; a user file overrides any subset of it.
Problems become `ConfigError`s that name the file, the key and what is wrong.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .diagnosis import Thresholds, ThresholdsError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster


def _load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a safe loader either way


DEFAULT_THRESHOLDS = Path(__file__).with_name("thresholds.yaml")  # shipped as package data


class ConfigError(Exception):
    """A configuration file cannot be used; the message says where and why."""


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML file, turning every failure into a ConfigError naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        return _load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None


@lru_cache(maxsize=1)
def default_document() -> dict[str, Any]:
    """The packaged defaults, parsed once."""
    doc: dict[str, Any] = _load(default_thresholds_text())
    return doc


def default_thresholds_text() -> str:
    return DEFAULT_THRESHOLDS.read_text(encoding="utf-8")


def load_thresholds(path: str | Path | None = None, section: str | None = None) -> Thresholds:
    """The defaults, overridden by the file at `path` when given.

    `section` names a key of the file that holds the thresholds (the `serve` config keeps
    them under `thresholds:`); None means the whole file is a thresholds document.
    """
    overrides = []
    if path is not None:
        doc = read_yaml(path)
        if section is not None and isinstance(doc, dict):
            doc = doc.get(section)
        overrides.append(doc)
    try:
        return Thresholds.from_documents(default_document(), *overrides)
    except ThresholdsError as exc:
        raise ConfigError(f"{path}: {exc}") from None
