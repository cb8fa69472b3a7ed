"""`diagnose` prints exactly what it printed before its speed-ups (issue 37).

The outputs of every sample trace in `tests/fixtures/traces/`, in every format (jsonl, json,
the table in full and its summary, the HTML report), were written by the code before any of
issue 37's optimisations and committed in `tests/fixtures/diagnose_golden/`; this test runs
`diagnose` again and compares byte for byte. A change that means to change an output
regenerates them (`python -m tests.test_diagnose_golden`) and the diff is reviewed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

from rlhf_exporter.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACES = sorted(
    p.relative_to(REPO)
    for p in (REPO / "tests/fixtures/traces").glob("*.jsonl")
    if not p.name.endswith(".expected.jsonl")
)
GOLDEN = REPO / "tests/fixtures/diagnose_golden"
VARIANTS = {
    "jsonl": ["--format", "jsonl"],
    "json": ["--format", "json"],
    "table": ["--format", "table", "--wide", "--color", "never"],
    "summary": ["--format", "table", "--summary", "--wide", "--color", "never"],
}


def outputs(trace: Path, tmp: Path) -> dict[str, bytes]:
    """Every variant's standard output for this trace, and the HTML report (run from the
    repository root, so that the paths printed are the same everywhere)."""
    out: dict[str, bytes] = {}
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for name, flags in VARIANTS.items():
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                assert main(["diagnose", *flags, str(trace)]) == 0
            out[name] = buf.getvalue().encode()
        html = tmp / "report.html"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(["diagnose", "--format", "jsonl", "--html", str(html), str(trace)]) == 0
        out["html"] = html.read_bytes()
    finally:
        os.chdir(cwd)
    return out


MADE = re.compile(rb"made \d{4}-\d\d-\d\d \d\d:\d\d UTC")  # the HTML report's own time


def stable(data: bytes) -> bytes:
    return MADE.sub(b"made <time> UTC", data)


def golden_path(trace: Path, variant: str) -> Path:
    return GOLDEN / f"{trace.stem}.{variant}"


@pytest.mark.parametrize("trace", TRACES, ids=[t.stem for t in TRACES])
def test_outputs_unchanged(trace, tmp_path):
    got = outputs(trace, tmp_path)
    assert set(got) == {*VARIANTS, "html"}
    for variant, data in got.items():
        want = golden_path(trace, variant).read_bytes()
        assert b"made <time> UTC" not in data
        assert stable(data) == stable(want), (
            f"{trace.name}: `{variant}` output differs from the golden one"
        )


def test_every_trace_has_goldens():
    assert len(TRACES) >= 9
    names = {p.name for p in GOLDEN.iterdir()}
    assert names == {golden_path(t, v).name for t in TRACES for v in (*VARIANTS, "html")}


if __name__ == "__main__":  # regenerate: python -m tests.test_diagnose_golden
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for trace in TRACES:
            for variant, data in outputs(trace, Path(d)).items():
                golden_path(trace, variant).write_bytes(data)
    print(f"wrote {len(TRACES)} traces' outputs to {GOLDEN}", file=sys.stderr)
