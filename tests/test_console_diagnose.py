"""Issue 47: `diagnose` reads what a verl job printed exactly as the JSONL of the same run.

For every trace in tests/fixtures/traces/, its console form is rendered at test time with
verl's own `concat_dict_to_str` (tests/support/console_render.py: the function's source is
read from the installed verl with `ast` and run alone, because its module imports torch),
wrapped as a job driver's log (Ray's coloured prefixes, the config dump, vLLM lines, a tqdm
`\\r` line, Ray's dedup suffix), and `diagnose` must say the same on both: every jsonl row,
and the summary text up to the file's name.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_exporter.cli import main
from rlhf_exporter.commands.diagnose import diagnose_stream
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.writers import JsonlWriter
from tests.support.console_render import (
    NpFloat64,
    NpInt64,
    driver_log,
    held,
    jsonl_records,
    verl_concat,
)

TRACES = Path(__file__).parent / "fixtures" / "traces"
NAMES = sorted(p.name for p in TRACES.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))


def diagnose(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["diagnose", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def console_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("console")
    for name in NAMES:
        records = jsonl_records(TRACES / name)
        (d / name.replace(".jsonl", ".log")).write_bytes(
            driver_log(records, "traces", name.removesuffix(".jsonl"))
        )
    return d


def test_every_trace_is_covered():
    assert len(NAMES) >= 19


@pytest.mark.parametrize("name", NAMES)
def test_diagnose_reads_the_console_form_as_the_jsonl(name, console_dir):
    jsonl = TRACES / name
    console = console_dir / name.replace(".jsonl", ".log")
    rc, want, _ = diagnose("--format", "jsonl", str(jsonl))
    assert rc == 0
    for fmt in ("auto", "console"):
        rc, got, err = diagnose("--format", "jsonl", "--input-format", fmt, str(console))
        assert rc == 0, err
        assert got == want
    rc, want_summary, _ = diagnose("--summary", "--color", "never", "--wide", str(jsonl))
    rc, got_summary, _ = diagnose("--summary", "--color", "never", "--wide", str(console))
    assert got_summary.replace(str(console), "LOG") == want_summary.replace(str(jsonl), "LOG")
    assert "rejected lines: none" in got_summary


def test_a_console_stream_read_in_small_pieces_gives_the_same_rows(console_dir):
    """A line split across reads (as `diagnose -` on a pipe gets it)."""
    name = "regression_after_slowdown_v1.jsonl"
    data = (console_dir / name.replace(".jsonl", ".log")).read_bytes()

    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.pos = 0

        def read(self, n: int = -1) -> bytes:
            piece = data[self.pos : self.pos + 977]
            self.pos += len(piece)
            return piece

    rows = []
    for stream in (Trickle(), io.BytesIO(data)):
        out = io.StringIO()
        writer = JsonlWriter(out, False)
        n = diagnose_stream(stream, "x", load_thresholds(), 1 << 20, writer)  # type: ignore[arg-type]
        writer.close()
        assert n > 0
        rows.append(out.getvalue())
    assert rows[0] == rows[1]
    _rc, want, _ = diagnose("--format", "jsonl", str(TRACES / name))
    assert rows[0] == want


def test_rejected_console_lines_are_counted_by_reason(tmp_path):
    data = driver_log(jsonl_records(TRACES / "sync_bound_v1.jsonl"), "p", "e") + (
        b"(WorkerDict pid=9) step:3 - timing_s/step:1.0\n"
        b"(TaskRunner pid=4242) step:x - a:1\n"
        b"(TaskRunner pid=4242) step:999999999999999999 - a:1\n"
        b"(TaskRunner pid=4242) step:99 - a:Decimal('1')\n"
    )
    path = tmp_path / "driver.log"
    path.write_bytes(data)
    rc, out, _ = diagnose("--summary", "--color", "never", str(path))
    assert rc == 0
    line = next(x for x in out.splitlines() if "rejected lines" in x)
    for reason in ("1 foreign_step", "1 bad_step_line", "1 bad_step", "1 bad_value"):
        assert reason in line, line
    rc, out, _ = diagnose("--format", "json", str(path))
    doc = json.loads(out)
    assert doc["files"][0]["rejected"] == {
        "foreign_step": 1,
        "bad_step_line": 1,
        "bad_step": 1,
        "bad_value": 1,
    }


def test_jsonl_forced_on_console_output_reads_nothing_and_says_what_it_expects(console_dir):
    log = console_dir / "sync_bound_v1.log"
    rc, _, err = diagnose("--input-format", "jsonl", str(log))
    assert rc == 1
    assert "no verl record found" in err
    assert "trainer.logger" in err and '"console"' in err and '"file"' in err


def test_neither_format_says_which_formats_and_settings(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello\nthis is no verl output\n")
    rc, _, err = diagnose(str(path))
    assert rc == 1
    assert "JSONL" in err and "step:N - key:value" in err
    assert '"file"' in err and '"console"' in err and "default" in err


def test_the_command_line_reads_a_driver_log(console_dir):
    """The real command (a process), auto-detecting the console form."""
    log = console_dir / "update_low_mfu_v0.log"
    r = subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "diagnose", "--format", "jsonl", str(log)],
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    want = subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "diagnose", "--format", "jsonl",
         str(TRACES / "update_low_mfu_v0.jsonl")],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert r.stdout == want.stdout and r.stdout
    help_text = subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "diagnose", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "--input-format" in help_text and "console" in help_text


def test_the_rendering_uses_verls_function():
    concat = verl_concat()
    line = concat({"a": held(0.1), "b": held(5), "c": held(None), "d": "text"}, step=3)
    assert line == "step:3 - a:np.float64(0.1) - b:np.int64(5) - c:np.float64(nan)"


def test_stand_ins_print_as_numpy():
    np = pytest.importorskip("numpy")
    for x in (0.1, 1e-05, 123456.789, 1e16, -2.5, 0.0):
        assert repr(NpFloat64(x)) == repr(np.float64(x))
    assert repr(NpFloat64(float("nan"))) == repr(np.float64("nan"))
    for i in (0, 5, -7, 2**40):
        assert repr(NpInt64(i)) == repr(np.int64(i))
