"""`diagnose` on every framework fixture under tests/fixtures/frameworks/: each
`<regime>.expected.jsonl` (per step: step, verdict, reason, change) against what `diagnose`
says of its inputs beside it (`<regime>.console.log`, `<regime>.tfevents/`, `<regime>.jsonl`),
read with the format detected from the input itself."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from rlhf_exporter.commands.diagnose import diagnose_stream, diagnose_tensorboard
from rlhf_exporter.frameworks import FRAMEWORKS
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.writers import JsonlWriter

ROOT = Path(__file__).resolve().parent / "fixtures" / "frameworks"
INPUTS = (".console.log", ".tfevents", ".jsonl")
FIELDS = ("step", "verdict", "reason", "change")


def cases() -> list[tuple[Path, Path]]:
    """(expected file, input) for every input that has an expected file beside it."""
    out = []
    for expected in sorted(ROOT.glob("*/*.expected.jsonl")):
        stem = expected.name[: -len(".expected.jsonl")]
        for suffix in INPUTS:
            source = expected.with_name(stem + suffix)
            if source.exists():
                out.append((expected, source))
    return out


def diagnose(path: Path) -> list[dict[str, Any]]:
    """What `diagnose --format jsonl` prints for `path`, its steps only."""
    out = io.StringIO()
    writer = JsonlWriter(out, False)
    if path.is_dir():
        n = diagnose_tensorboard(str(path), load_thresholds(), writer)
    else:
        with path.open("rb") as stream:
            n = diagnose_stream(stream, str(path), load_thresholds(), 1 << 20, writer)
    writer.close()
    assert n > 0, f"{path}: no record read"
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    return [{k: row[k] for k in FIELDS} for row in rows if "step" in row]


CASES = cases()


def test_there_are_fixtures_of_every_input_kind() -> None:
    kinds = {next(s for s in INPUTS if src.name.endswith(s)) for _e, src in CASES}
    assert kinds == set(INPUTS)


@pytest.mark.parametrize(
    ("expected", "source"), CASES, ids=[str(s.relative_to(ROOT)) for _e, s in CASES]
)
def test_diagnose_gives_the_scripted_labels(expected: Path, source: Path) -> None:
    want = [
        {k: row[k] for k in FIELDS}
        for line in expected.read_text(encoding="utf-8").splitlines()
        if line.strip() and "step" in (row := json.loads(line))
    ]
    assert diagnose(source) == want


def test_framework_directories_are_named_as_the_frameworks() -> None:
    for d in ROOT.iterdir():  # (a directory of fixtures; not the truth's tools beside them)
        if d.is_dir() and not d.name.startswith("_") and any(d.glob("*.expected.jsonl")):
            assert d.name in FRAMEWORKS, d.name
