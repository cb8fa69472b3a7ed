"""`rlhf-exporter diagnose LOG...`: the decision table, offline, on verl JSONL logs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from ..diagnosis import BatchDiagnoser, Record, Thresholds
from ..diagnosis.advice import (
    EVIDENCE_KEYS,
    SHAPE_RECORDS,
    job_shape,
    missing_evidence,
    shown_evidence,
)
from ..diagnosis.history import MAX_DRAWN
from ..frameworks import FRAMEWORKS, VERL
from ..frameworks.tables import cannot_show as framework_gaps
from ..sources import framework_console
from ..sources.console_reader import ConsoleReader, looks_console
from ..sources.framework_console import FrameworkConsoleReader
from ..sources.tensorboard_reader import TensorBoardMissing, TensorBoardReader, looks_tfevents
from ..sources.verl_layout import FILE_LOGGER
from ..sources.verl_reader import MAX_LINE_BYTES, RecordReader, looks_gzip
from ..thresholds_file import load_thresholds
from ..view.report import (
    Style,
    terminal_width,
)
from ..view.writers import (
    REPORT_RUNS,
    HtmlWriter,
    JsonlWriter,
    JsonWriter,
    TableWriter,
    Tee,
    Writer,
)
from . import add_thresholds_argument, thresholds_path

ORDER = 20
CHUNK = 1 << 20

EPILOG = """\
verdicts (the window the step waited on longest; `balanced` when none clearly dominates):
  rollout     gen: waiting for rollout samples   reasons: preemption, tool_calls,
                                                  reward_in_loop, long_tail, generation
  logprob     old_log_prob, ref, values          reasons: compute_bound, low_mfu, mfu_unknown
  update      update_actor, update_critic        reasons: compute_bound, low_mfu, mfu_unknown
  sync        update_weights, param_sync, ...    reason:  weight_sync
  reward      a colocated reward model           reason:  reward_model
  checkpoint  save_checkpoint                    reason:  checkpoint
  other       adv and untimed driver work        reasons: untimed, driver_compute

change (against the job's own recent steps): `steady`; `workload_shift` (slower, but only
because the work grew: tokens, sequence length, the longest response); `regression` (a
window costs more than its work explains, even if another got faster; `regressed` names it).

examples:
  rlhf-exporter diagnose $VERL_FILE_LOGGER_ROOT/my_project/my_experiment.jsonl
  rlhf-exporter diagnose --format jsonl run.jsonl | jq 'select(.change == "regression")'
  rlhf-exporter diagnose --thresholds my-thresholds.yaml - < run.jsonl
  rlhf-exporter diagnose run.jsonl --html report.html   # one self-contained file to attach

exit status: 0 done, 1 no input gave a verl record (missing, empty, binary, gzip-compressed
or not verl JSONL), 2 usage or configuration error.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="diagnose verl logs offline: JSONL or console output (the same decision table as "
        "serve)",
        description='Read verl\'s `file`-logger JSONL (trainer.logger=[...,"file"]) or what a '
        "job printed (verl's `console` logger, on by default: a saved driver log, `ray job "
        "logs ID`, `kubectl logs` of a RayJob's submitter pod, a trainer actor's .out file) and "
        "say, for every step, which window the training loop waited on, why, and whether a "
        "slowdown is a workload shift or a regression.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="LOG",
        help="verl JSONL files or console output; - reads standard input (default: the "
        "bundled example)",
    )
    p.add_argument(
        "--input-format",
        choices=("auto", "jsonl", "console", "tensorboard", *FRAMEWORKS[1:]),
        default="auto",
        help="auto (default): a TensorBoard event file or directory, another framework's "
        "printed steps, console output when the first bytes are not verl JSONL; jsonl: the "
        "file logger's records; console: what the job printed (`step:N - key:value`); "
        "tensorboard: event files (the `tensorboard` extra); "
        + ", ".join(FRAMEWORKS[1:])
        + ": that framework's printed steps (ROLL's JSON lines too)",
    )
    p.add_argument(
        "--format",
        "-f",
        choices=("table", "jsonl", "json"),
        default="table",
        help="table: per-step rows and a per-run summary (default); jsonl: one "
        "object per classified step (the contract); json: one document",
    )
    add_thresholds_argument(p)
    p.add_argument(
        "--print-thresholds", action="store_true", help="print the default thresholds file and exit"
    )
    p.add_argument("--summary", action="store_true", help="table: only the per-run summaries")
    p.add_argument(
        "--wide",
        action="store_true",
        help="table: every column in full (default: fit the terminal's width, dropping or "
        "abbreviating the least useful columns first)",
    )
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the table (auto: when writing to a terminal and NO_COLOR is unset)",
    )
    p.add_argument(
        "--html",
        metavar="OUT.html",
        help="also write the report as one self-contained HTML file (the job view's charts: "
        f"every step's anatomy, verdicts, regressions; no script, nothing fetched). At most "
        f"{MAX_DRAWN} bars per run (past that each bar is the mean of consecutive steps) and "
        f"the last {REPORT_RUNS} runs of a file; never an input file; written atomically",
    )
    p.add_argument(
        "--max-line-bytes",
        type=_positive_int,
        default=MAX_LINE_BYTES,
        metavar="N",
        help=f"reject longer lines (default {MAX_LINE_BYTES})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..thresholds_file import default_thresholds_text

    if args.print_thresholds:
        sys.stdout.write(default_thresholds_text())
        return 0
    thresholds = load_thresholds(thresholds_path(args))  # a ConfigError exits 2 (cli.main)
    files = args.files or [_bundled_example()]
    if files.count("-") > 1:
        print("rlhf-exporter diagnose: '-' (standard input) can be given once", file=sys.stderr)
        return 2
    out = sys.stdout
    colour = args.color == "always" or (
        args.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR")
    )
    writers: dict[str, Writer] = {
        "table": TableWriter(
            out,
            Style(colour),
            args.summary,
            len(files) > 1,
            terminal_width(args.wide, out.isatty()),
        ),
        "jsonl": JsonlWriter(out, len(files) > 1),
        "json": JsonWriter(out),
    }
    writer = writers[args.format]
    html = None
    if args.html:
        same = output_is_an_input(args.html, files)
        if same is not None:
            print(
                f"rlhf-exporter diagnose: --html {args.html} is the input {same}: refusing to "
                "overwrite it (give another file name)",
                file=sys.stderr,
            )
            return 2
        html = HtmlWriter(args.html, thresholds.alerts["runbook_url"])
        writer = Tee(writer, html)
    records = 0
    for path in files:
        stream = _open(path, args.input_format)
        if stream is None:
            continue
        rejected: Counter[str] = Counter()
        if not isinstance(stream, str):
            with stream:
                n = diagnose_stream(
                    stream, path, thresholds, args.max_line_bytes, writer, args.input_format,
                    rejected,
                )  # fmt: skip
        else:
            try:
                n = diagnose_tensorboard(path, thresholds, writer, rejected)
            except TensorBoardMissing as exc:
                print(f"rlhf-exporter diagnose: {path}: {exc}", file=sys.stderr)
                return 2
        if n == 0:
            print(no_record_message(path, rejected, args.input_format), file=sys.stderr)
        records += n
    writer.close()
    if html is not None and records:
        try:
            html.write()
        except OSError as exc:
            print(f"rlhf-exporter diagnose: {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"(wrote {args.html})", file=sys.stderr)
    return 0 if records else 1


def no_record_message(path: str, rejected: Mapping[str, int], input_format: str = "auto") -> str:
    """What `diagnose` says of an input that gave no verl record: its rejected lines by
    reason, the two formats it reads, and the verl settings that write each."""
    n = sum(rejected.values())
    if n:
        detail = ", ".join(f"{v} {k}" for k, v in sorted(rejected.items(), key=lambda kv: -kv[1]))
        found = f"{n} line{'s' if n != 1 else ''} rejected ({detail})"
    else:
        found = "the input is empty"
    forced = (
        f" (read as {input_format}, --input-format {input_format}: auto tells the two apart)"
        if input_format != "auto"
        else ""
    )
    return (
        f"rlhf-exporter diagnose: {path}: no verl record found: {found}{forced}. Expected:\n"
        f"  - verl's `file`-logger JSONL: {FILE_LOGGER};\n"
        "  - or what a job printed: lines `step:N - key:value - ...` from verl's `console` "
        'logger (trainer.logger includes "console", the default): a driver log, `ray job '
        "logs`, `kubectl logs` of the submitter pod, a trainer actor's .out;\n"
        "  - or another framework's printed steps (OpenRLHF, AReaL, NeMo-RL, slime, ROLL and "
        "ROLL's JSON lines) or a TensorBoard event file or directory (docs/frameworks.md)"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _bundled_example() -> str:
    path = Path(__file__).resolve().parents[1] / "examples" / "demo_job.jsonl"
    print(f"(no LOG given: diagnosing the bundled example {path})", file=sys.stderr)
    return str(path)


def _open(path: str, input_format: str = "auto") -> IO[bytes] | str | None:
    """The input's bytes, or its path when it is TensorBoard event files, or None."""
    if path == "-":
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    if input_format == "tensorboard" or (input_format == "auto" and looks_tfevents(path)):
        return path
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "is a directory (give the .jsonl files inside it)")
        return open(path, "rb")
    except OSError as exc:
        print(f"rlhf-exporter diagnose: {path}: {exc.strerror or exc}", file=sys.stderr)
        return None


class _Feed:
    """One input's records into the diagnoser and the writer, and what its keys showed."""

    def __init__(self, th: Thresholds, writer: Writer):
        self.diagnoser = BatchDiagnoser(th)
        self.writer = writer
        self.on_record = getattr(writer, "record", None)  # a writer that wants the records
        self.shown: set[str] = set()  # evidence keys the log reported (advice.shown_evidence)
        self.shape: set[str] = set()  # what its first records' keys say (advice.job_shape)
        self.looked = 0

    def __call__(self, records: Iterable[Record]) -> None:
        for record in records:
            if self.on_record is not None:
                self.on_record(record)
            if len(self.shown) < len(EVIDENCE_KEYS):
                self.shown |= shown_evidence(record.data, self.shown)
            if self.looked < SHAPE_RECORDS:
                self.looked += 1
                self.shape |= job_shape(record.data)
            result = self.diagnoser.feed(record)
            if result is not None:
                self.writer.step(result)

    def end(
        self, reader: _Reader, rejected: Counter[str] | None, framework: str | None = None
    ) -> int:
        """The input has ended: its last step, its summary; returns its record count."""
        result = self.diagnoser.close()
        if result is not None:
            self.writer.step(result)
        self.writer.flush()
        gaps = framework_gaps(framework)
        cannot = missing_evidence(self.shown | self.shape, gaps) if reader.records else ()
        self.writer.end_file(reader.records, dict(reader.rejected), cannot)
        if rejected is not None:
            rejected.update(reader.rejected)
        if framework is not None and framework != VERL and reader.records:
            print(f"({framework} output, read as verl's records)", file=sys.stderr)
        return reader.records


_Reader = RecordReader | ConsoleReader | FrameworkConsoleReader | TensorBoardReader


def _reader(input_format: str, chunk: bytes, max_line: int) -> _Reader:
    """The reader of an input, by --input-format or (auto) by its first bytes."""
    if input_format == "auto":
        framework = framework_console.detect(chunk)
        if framework is not None:
            return FrameworkConsoleReader(max_line, framework)
        return ConsoleReader(max_line) if looks_console(chunk) else RecordReader(max_line)
    if input_format in FRAMEWORKS:
        return FrameworkConsoleReader(max_line, input_format)
    return ConsoleReader(max_line) if input_format == "console" else RecordReader(max_line)


def diagnose_stream(
    stream: IO[bytes],
    path: str,
    th: Thresholds,
    max_line: int,
    writer: Writer,
    input_format: str = "auto",
    rejected: Counter[str] | None = None,
) -> int:
    """Diagnose one input (JSONL, console output, another framework's printed steps);
    returns how many verl records it gave (and adds its rejected lines, by reason, to
    `rejected` when given)."""
    reader: _Reader | None = None
    feed = _Feed(th, writer)
    writer.begin_file(path)
    progress = Progress(stream, path)
    for chunk in iter(lambda: stream.read(CHUNK), b""):
        if reader is None:
            if looks_gzip(chunk):
                print(
                    f"rlhf-exporter diagnose: {path}: gzip-compressed; decompress it first: "
                    f"zcat {path} | rlhf-exporter diagnose -",
                    file=sys.stderr,
                )
            reader = _reader(input_format, chunk, max_line)
        assert not isinstance(reader, TensorBoardReader)
        feed(reader.feed(chunk))
        writer.flush()  # what this chunk produced, so `diagnose -` on a live tail keeps up
        progress.update()
    if reader is None:  # an empty input
        reader = RecordReader(max_line)
    if isinstance(reader, FrameworkConsoleReader):
        feed(reader.finish())
    else:
        assert not isinstance(reader, TensorBoardReader)
        reader.finish()
    progress.done()
    return feed.end(reader, rejected, getattr(reader, "framework", None))


def diagnose_tensorboard(
    path: str, th: Thresholds, writer: Writer, rejected: Counter[str] | None = None
) -> int:
    """Diagnose the TensorBoard event files at `path` (a file or a directory)."""
    reader = TensorBoardReader(path)
    feed = _Feed(th, writer)
    writer.begin_file(path)
    feed(reader.poll())
    feed(reader.finish())
    return feed.end(reader, rejected, reader.framework)


class Progress:
    """A percentage on stderr for big files, only when stderr is a terminal."""

    def __init__(self, stream: IO[bytes], path: str):
        self.path = path
        self.size = 0
        self.stream = stream
        self.last = 0.0
        try:
            if sys.stderr.isatty():
                self.size = os.fstat(stream.fileno()).st_size
        except (OSError, ValueError):
            pass
        self.enabled = self.size > 64 << 20

    def update(self) -> None:
        if self.enabled and time.monotonic() - self.last > 0.5:
            self.last = time.monotonic()
            pct = 100.0 * self.stream.tell() / self.size
            print(f"\r{self.path}: {pct:5.1f}%", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled:
            print(f"\r{self.path}: 100.0%", file=sys.stderr)


def output_is_an_input(out: str, files: Sequence[str]) -> str | None:
    """The input that `out` is (the same file, through any link), or None."""
    for path in files:
        if path == "-":
            continue
        try:
            if os.path.samefile(out, path):
                return path
        except OSError:
            continue
    return None
