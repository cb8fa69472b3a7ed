"""verl's configuration as data: the generated YAML files of an installed verl wheel, read as
files (verl is never imported: installed with --no-deps it cannot be), and a checker for the
configuration keys the project names.

Install: `pip install --no-deps verl==0.9.1` (scripts/test.sh does it).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

VERL_VERSION = "0.9.1"

# The files that hold every key a verl 0.9.1 job can set: the generated trainer configs (FSDP
# and Megatron) and the overlays of the one-step-off and fully-async recipes.
CONFIG_FILES = (
    "trainer/config/_generated_ppo_trainer.yaml",
    "trainer/config/_generated_ppo_megatron_trainer.yaml",
    "experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
    "experimental/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml",
    "experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
    "experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml",
)
MAIN_FILE = CONFIG_FILES[0]
NOT_KEYS = {"hydra", "defaults"}  # Hydra's own sections of the overlays


def verl_dir() -> Path | None:
    """The installed verl package's directory, found without importing it (None: absent)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def verl_version(root: Path) -> str | None:
    version = root / "version" / "version"
    return version.read_text().strip() if version.is_file() else None


def flatten(doc: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """Every dotted key of a YAML document, mapping nodes included, with its value."""
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            if not prefix and k in NOT_KEYS:
                continue
            key = f"{prefix}.{k}" if prefix else str(k)
            yield key, v
            yield from flatten(v, key)


@dataclass
class VerlConfig:
    keys: dict[str, object]  # every key of every file -> its value (last file wins)
    roots: frozenset[str]  # top-level keys of the main trainer config
    files: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> VerlConfig:
        keys: dict[str, object] = {}
        files = {}
        for name in CONFIG_FILES:
            flat = dict(flatten(yaml.safe_load((root / name).read_text())))
            files[name] = frozenset(flat)
            for k, v in flat.items():
                keys.setdefault(k, v)
        main = yaml.safe_load((root / MAIN_FILE).read_text())
        return cls(keys=keys, roots=frozenset(map(str, main)), files=files)


def key_pattern(roots: Iterable[str]) -> re.Pattern[str]:
    """A dotted verl key in prose: a top-level key, then at least one `.name`; not part of a
    longer word, path or file name."""
    alt = "|".join(sorted(map(re.escape, roots), key=len, reverse=True))
    return re.compile(rf"(?<![\w./$-])(?:{alt})(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w(])")


FILE_SUFFIXES = {"py", "yaml", "yml", "json", "jsonl", "md", "txt", "sh", "log"}
VERSION_NEAR = re.compile(r"\b0\.[67](?:\.\d+)?\b|\bverl\s*(?:0\.[67]|≤\s*0\.7)")


def mentions(text: str, roots: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(key, its surroundings) for every verl key named in a text, except struck-out ones
    (`~~key~~`, how docs name a key not to use: see struck())."""
    for m in key_pattern(roots).finditer(text):
        key = m.group(0)
        if key.rsplit(".", 1)[-1] in FILE_SUFFIXES or _struck(text, m.start()):
            continue
        yield key, text[max(0, m.start() - 160) : m.end() + 160]


def struck(text: str, roots: Iterable[str]) -> list[str]:
    """The keys a text names struck out (`~~key~~` or ~~`key`~~): keys it says not to use."""
    return [m.group(0) for m in key_pattern(roots).finditer(text) if _struck(text, m.start())]


def _struck(text: str, start: int) -> bool:
    before = text[max(0, start - 3) : start]
    return before.endswith("~~") or before.endswith("~~`")


def problems(
    named: Iterable[tuple[str, str, str]],
    config: VerlConfig,
    dead: Mapping[str, str],
    older: Mapping[str, tuple[str, str]],
) -> list[str]:
    """What is wrong with each (where, key, surroundings): a key verl 0.9.1 does not have, or
    one it has but ignores or deprecates, unless an older verl reads it and the text says so
    next to the key. Empty: every key can be set as written."""
    out = []
    for where, key, near in named:
        is_dead = next((why for k, why in dead.items() if key == k or key.startswith(k)), None)
        if key in older:
            if not VERSION_NEAR.search(near):
                out.append(
                    f"{where}: {key} is read only by verl {older[key][0]}; name the version "
                    f"next to it (0.9.1: {older[key][1]})"
                )
            continue
        if key not in config.keys:
            out.append(f"{where}: {key} is not a key of verl {VERL_VERSION}'s configuration")
        elif is_dead is not None:
            out.append(f"{where}: {key} is dead or deprecated in verl {VERL_VERSION}: {is_dead}")
    return out
