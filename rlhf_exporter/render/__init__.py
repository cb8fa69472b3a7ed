"""Generators of the files that must not be typed twice: rules, dashboards, docs, chart files.

Each module here that defines `targets(thresholds) -> dict[relative path, text]` is a render
target named after the module. `rlhf-exporter render NAME` writes its files; `--check` fails
(exit 1) when a committed file differs from what the generator produces.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from importlib import import_module
from pathlib import Path

from ..diagnosis import Thresholds

Generator = Callable[[Thresholds], Mapping[str, str]]


class MissingExtra(Exception):
    """A target needs an optional dependency that this install lacks (`render` renders the
    other targets and says which extra to install)."""

    def __init__(self, target: str, extra: str, requirement: str, detail: str):
        super().__init__(
            f"{target}: not rendered: needs the `{extra}` extra ({requirement}; {detail}). "
            f"In a checkout: .venv/bin/pip install -e '.[{extra}]'"
        )
        self.target = target
        self.extra = extra


def generators() -> dict[str, Generator]:
    """Every render target, by name, in the order they must run (by module `ORDER`)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = import_module(f"{__name__}.{info.name}")
        if hasattr(module, "targets"):
            found.append((getattr(module, "ORDER", 50), info.name, module.targets))
    return {name: fn for _, name, fn in sorted(found)}


def repo_root() -> Path:
    """The source checkout holding alerts/, grafana/, docs/ (render works from a checkout)."""
    return Path(__file__).resolve().parents[2]


def is_checkout(root: Path) -> bool:
    """Whether `root` is a source checkout of this project, not e.g. site-packages."""
    return (root / "pyproject.toml").is_file() and (
        root / "rlhf_exporter" / "__init__.py"
    ).is_file()


def stale(root: Path, files: Mapping[str, str]) -> list[str]:
    """Relative paths whose committed content differs from `files` (or that are missing)."""
    out = []
    for rel, text in files.items():
        path = root / rel
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            out.append(rel)
    return out


def write(root: Path, files: Mapping[str, str]) -> list[str]:
    """Write the files that changed; return their relative paths."""
    changed = stale(root, files)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
    return changed
