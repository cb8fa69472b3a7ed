"""The Markdown templates in `templates/`: the prose of the generated docs, of every alert's
runbook and of its summary and description, filled with values from the thresholds. Python
keeps the PromQL and the structure.

A placeholder is `${name}` (a dotted name, such as `${verdict.min_share}`, may read a
thresholds key); any other `$` is text, so PromQL and Go templates keep theirs. Filling fails
on a placeholder it has no value for, so a template cannot print a stale word for a number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).with_name("templates")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)\}")
HEADING = re.compile(r"^## (.+)$")
ITEM = re.compile(r"^(?:- |\d+\. )")


class TemplateError(KeyError):
    """A template names a placeholder it was given no value for."""


@cache
def text(name: str) -> str:
    """The template `name` (a path under `templates/`), as written."""
    return (FOLDER / name).read_text(encoding="utf-8")


def substitute(text: str, values: Mapping[str, object], where: str = "a template") -> str:
    """`text` with every `${key}` replaced by `str(values[key])`."""

    def value(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise TemplateError(f"{where}: no value for ${{{match[1]}}}")
        return str(values[match[1]])

    return PLACEHOLDER.sub(value, text)


def fill(name: str, values: Mapping[str, object]) -> str:
    """The template `name` with its placeholders filled from `values`."""
    return substitute(text(name), values, name)


def flat(document: Mapping[str, Any], prefix: str = "") -> dict[str, object]:
    """A nested mapping's scalar leaves by dotted key (`{"verdict.min_share": 0.5, ...}`)."""
    out: dict[str, object] = {}
    for key, value in document.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = value
    return out


@cache
def sections(name: str) -> Mapping[str, tuple[str, ...]]:
    """The template `name` as its sections (`parse`), placeholders not yet filled."""
    return parse(text(name))


def parse(markdown: str) -> dict[str, tuple[str, ...]]:
    """`## heading` sections, each as its entries: the paragraphs, or the items of a list (`- `
    or `1. `), each joined into one line, so a wrapped line is one text. Text before the first
    heading is a comment."""
    out: dict[str, list[list[str]]] = {}
    entries: list[list[str]] = []
    fresh = True  # the next line of text starts an entry
    for line in markdown.splitlines():
        heading = HEADING.match(line)
        if heading:
            entries = out[heading[1]] = []
            fresh = True
        elif not line.strip():
            fresh = True
        elif fresh or ITEM.match(line):
            entries.append([ITEM.sub("", line, count=1)])
            fresh = False
        else:
            entries[-1].append(line.strip())
    return {h: tuple(" ".join(e) for e in es) for h, es in out.items()}
