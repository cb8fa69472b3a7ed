"""`rlhf-exporter diagnose LOG...`: the decision table, offline, on verl JSONL logs."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from ..config import load_thresholds
from ..diagnosis import BatchDiagnoser, StepDiagnosis, Thresholds
from ..diagnosis.advice import EVIDENCE_KEYS, missing_evidence, shown_evidence
from ..diagnosis.episodes import episodes
from ..diagnosis.history import MAX_DRAWN, StepBins, StepPoint, point
from ..sources.verl_reader import MAX_LINE_BYTES, RecordReader, looks_gzip
from ..view import Links, ReportFile, ReportRun, report_page
from ..view.report import (
    MAX_EPISODE_STEPS,
    RunSummary,
    Style,
    Table,
    rejected_line,
    step_json,
    summary_lines,
    terminal_width,
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

change (against the job's own recent steps): `none`; `workload_shift` (slower, but only
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


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="diagnose verl JSONL logs offline (the same decision table as serve)",
        description='Read verl `file`-logger JSONL (trainer.logger=[...,"file"]) and say, for '
        "every step, which window the training loop waited on, why, and whether a "
        "slowdown is a workload shift or a regression.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="LOG",
        help="verl JSONL files; - reads standard input (default: the bundled example)",
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
    from ..config import default_thresholds_text

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
    writer: Any = {
        "table": TableWriter(
            out,
            Style(colour),
            args.summary,
            len(files) > 1,
            terminal_width(args.wide, out.isatty()),
        ),
        "jsonl": JsonlWriter(out, len(files) > 1),
        "json": JsonWriter(out),
    }[args.format]
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
        stream = _open(path)
        if stream is None:
            continue
        with stream:
            n = diagnose_stream(stream, path, thresholds, args.max_line_bytes, writer)
        if n == 0:
            print(f"rlhf-exporter diagnose: {path}: no verl record found", file=sys.stderr)
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


def _open(path: str) -> IO[bytes] | None:
    if path == "-":
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "is a directory (give the .jsonl files inside it)")
        return open(path, "rb")
    except OSError as exc:
        print(f"rlhf-exporter diagnose: {path}: {exc.strerror or exc}", file=sys.stderr)
        return None


def diagnose_stream(stream: IO[bytes], path: str, th: Thresholds, max_line: int, writer) -> int:
    """Diagnose one input; returns how many verl records it gave."""
    reader = RecordReader(max_line)
    diagnoser = BatchDiagnoser(th)
    writer.begin_file(path)
    progress = Progress(stream, path)
    on_record = getattr(writer, "record", None)  # a writer that wants the raw records
    shown: set[str] = set()  # evidence keys the log reported (advice.shown_evidence)
    first = True
    for chunk in iter(lambda: stream.read(CHUNK), b""):
        if first and looks_gzip(chunk):
            print(
                f"rlhf-exporter diagnose: {path}: gzip-compressed; decompress it first: "
                f"zcat {path} | rlhf-exporter diagnose -",
                file=sys.stderr,
            )
        first = False
        for record in reader.feed(chunk):
            if on_record is not None:
                on_record(record)
            if len(shown) < len(EVIDENCE_KEYS):
                shown |= shown_evidence(record.data)
            result = diagnoser.feed(record)
            if result is not None:
                writer.step(result)
        writer.flush()  # what this chunk produced, so `diagnose -` on a live tail keeps up
        progress.update()
    reader.finish()
    result = diagnoser.close()
    if result is not None:
        writer.step(result)
    writer.flush()
    progress.done()
    cannot = missing_evidence(shown) if reader.records else ()
    writer.end_file(reader.records, dict(reader.rejected), cannot)
    return reader.records


def cannot_show_lines(cannot_show: tuple[str, ...]) -> list[str]:
    """The summary's notice of what this log cannot show (advice.missing_evidence)."""
    if not cannot_show:
        return []
    return ["  cannot show:", *(f"    - {line}" for line in cannot_show)]


_LABEL = re.compile(r"^\s*[^:]{1,20}:\s+")  # "    look at:     " before a summary's text


def fit(line: str, width: int | None) -> list[str]:
    """A summary line wrapped to the width, continuation lines under its text: after a
    label's padding ("    look at:     "), else two columns in (a line with colour codes is
    left whole: it is short)."""
    if width is None or len(line) <= width or "\033" in line:
        return [line]
    label = _LABEL.match(line)
    indent = label.end() if label else len(line) - len(line.lstrip()) + 2
    return textwrap.wrap(
        line, width, subsequent_indent=" " * min(indent, width // 2), break_on_hyphens=False
    ) or [line]


class Extras:
    """What a step's point takes from its records besides the diagnosis: verl's
    perf/throughput and response lengths (the change episodes' numbers), until classified.
    Cheap per record (three lookups): `diagnose` reads tens of thousands of steps a second."""

    KEYS = ("perf/throughput", "response_length/mean", "response_length/max")
    NONE = (None, None, None)

    def __init__(self) -> None:
        self._by_step: dict[int, tuple[Any, ...]] = {}

    def clear(self) -> None:
        self._by_step.clear()

    def record(self, record: Any) -> None:
        get = record.data.get
        values = (get("perf/throughput"), get("response_length/mean"), get("response_length/max"))
        if values == self.NONE:
            return
        old = self._by_step.get(record.step)
        if old is not None:  # a step in several records: the later value, else the earlier
            values = tuple(o if v is None else v for v, o in zip(values, old))
        elif len(self._by_step) >= 64:  # records of steps never classified: bounded
            del self._by_step[next(iter(self._by_step))]
        self._by_step[record.step] = values

    def point(self, d: StepDiagnosis) -> StepPoint:
        tps, mean, longest = self._by_step.pop(d.step, self.NONE)
        return point(d, _number(tps), _number(mean), _number(longest))


def _number(value: Any) -> float | None:
    """A usable value (>= 0) as a float, or None."""
    if type(value) is float:  # orjson's floats: the common case first
        return value if value >= 0 else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


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


class JsonlWriter:
    """The contract: one object per classified step, in file order (`file` when several);
    after a file's steps, one object per change episode of each run, told apart by its
    `"type": "episode"` (a step object has no `type`; rlhf_exporter/diagnosis/episodes.py).

    Lines are batched and written once per input chunk: stdout may be unbuffered
    (PYTHONUNBUFFERED), and a write per step would then be a system call per step.
    """

    def __init__(self, out: IO[str], many: bool):
        self.out = out.buffer if hasattr(out, "buffer") else None
        self.text = out
        self.many = many
        self.path: str | None = None
        self._pending: list[bytes] = []
        self.points: list[StepPoint] = []  # for the episodes, at most MAX_EPISODE_STEPS
        self.extras = Extras()

    def record(self, record: Any) -> None:
        self.extras.record(record)

    def begin_file(self, path: str) -> None:
        self.path = path
        self.points = []
        self.extras.clear()

    def step(self, d: StepDiagnosis) -> None:
        p = self.extras.point(d)
        if len(self.points) < MAX_EPISODE_STEPS:
            self.points.append(p)
        obj = d.to_json()
        if self.many:
            obj["file"] = self.path
        self._pending.append(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if self.out is not None:
            self.out.write(data)
            self.out.flush()
        else:
            self.text.write(data.decode())

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None:
        for e in episodes(self.points):
            obj = e.to_json()
            if self.many:
                obj["file"] = self.path
            self._pending.append(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))
        self.flush()
        if rejected:
            total = sum(rejected.values())
            print(
                f"rlhf-exporter diagnose: {self.path}: {total} line(s) rejected: "
                + ", ".join(f"{n} {r}" for r, n in sorted(rejected.items())),
                file=sys.stderr,
            )

    def close(self) -> None:
        self.flush()


class JsonWriter:
    """One document: files, their runs with steps and summaries, and a total summary."""

    def __init__(self, out: IO[str]):
        self.out = out
        self.files: list[dict[str, Any]] = []
        self.runs: dict[int, tuple[RunSummary, list]] = {}
        self.extras = Extras()

    def record(self, record: Any) -> None:
        self.extras.record(record)

    def begin_file(self, path: str) -> None:
        self.path = path
        self.runs = {}
        self.extras.clear()

    def flush(self) -> None:
        """Nothing to do: the document is written whole at the end."""

    def step(self, d: StepDiagnosis) -> None:
        summary, steps = self.runs.setdefault(d.run, (RunSummary(d.run), []))
        summary.add(d, self.extras.point(d))
        steps.append(step_json(d))

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None:
        runs = [{**summary.to_json(), "step_list": steps} for summary, steps in self.runs.values()]
        for run in runs:
            run["summary"] = {k: run.pop(k) for k in list(run) if k not in ("run", "step_list")}
            run["steps"] = run.pop("step_list")
        self.files.append(
            {
                "path": self.path,
                "records": records,
                "rejected": rejected,
                "cannot_show": list(cannot_show),
                "runs": runs,
            }
        )

    def close(self) -> None:
        verdicts: dict[str, int] = {}
        steps = 0
        for f in self.files:
            for run in f["runs"]:
                steps += run["summary"]["steps"]
                for v, n in run["summary"]["verdicts"].items():
                    verdicts[v] = verdicts.get(v, 0) + n
        doc = {
            "files": self.files,
            "summary": {
                "files": len(self.files),
                "steps": steps,
                "verdicts": verdicts,
                "rejected": sum(sum(f["rejected"].values()) for f in self.files),
            },
        }
        self.out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")


class TableWriter:
    """Per-step rows as they come, then each run's summary; for a person at a terminal."""

    def __init__(
        self, out: IO[str], style: Style, summary_only: bool, many: bool, width: int | None = None
    ):
        self.out, self.style, self.summary_only, self.many = out, style, summary_only, many
        self.table = Table(width)
        self.width = width
        self.summary: RunSummary | None = None
        self.summaries: list[RunSummary] = []
        self.extras = Extras()

    def record(self, record: Any) -> None:
        self.extras.record(record)

    def _print(self, line: str = "") -> None:
        self.out.write(line + "\n")

    def flush(self) -> None:
        self.out.flush()

    def begin_file(self, path: str) -> None:
        self.path = path
        self.summary = None
        self.summaries = []
        self.extras.clear()
        for part in fit(f"== {path}", self.width):
            self._print(self.style.bold(part))

    def step(self, d: StepDiagnosis) -> None:
        if self.summary is None or d.run != self.summary.run:
            self.summary = RunSummary(d.run)
            self.summaries.append(self.summary)
            if not self.summary_only:
                self._print()
                self._print(
                    f"run {d.run}"
                    + (" (the job restarted: the baseline starts again)" if d.run else "")
                )
                for line in self.table.header():
                    self._print(line)
        self.summary.add(d, self.extras.point(d))
        if not self.summary_only:
            self._print(self.table.row(d, self.style))

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None:
        self._print()
        for part in fit(f"summary of {self.path}: {records} records", self.width):
            self._print(self.style.bold(part))
        if not self.summaries:
            self._print("  no classified steps (no record had a usable timing_s/step)")
        for s in self.summaries:
            for line in summary_lines(s, self.style):
                for part in fit(line, self.width):
                    self._print(part)
        for line in cannot_show_lines(cannot_show):
            for part in fit(line, self.width):
                self._print(part)
        self._print(rejected_line(rejected))
        self._print()

    def close(self) -> None:
        self.out.flush()


class Tee:
    """Feeds one diagnosis to two writers (the chosen format, and the HTML report)."""

    def __init__(self, first: Any, second: Any):
        self.writers = (first, second)
        if any(hasattr(w, "record") for w in self.writers):
            self.record = self._record

    def _record(self, record: Any) -> None:
        for w in self.writers:
            if hasattr(w, "record"):
                w.record(record)

    def begin_file(self, path: str) -> None:
        for w in self.writers:
            w.begin_file(path)

    def step(self, d: StepDiagnosis) -> None:
        for w in self.writers:
            w.step(d)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None:
        for w in self.writers:
            w.end_file(records, rejected, cannot_show)

    def close(self) -> None:
        for w in self.writers:
            w.close()


REPORT_RUNS = 20  # runs of a file `--html` draws (the last ones); earlier ones are counted


class HtmlWriter:
    """`--html`: every step as a `StepPoint`, drawn at the end by rlhf_exporter/view (the same
    code as the sidecar's job view) into one self-contained file.

    Bounded whatever the log's length: per run at most MAX_DRAWN bars (past that each bar is
    the mean of consecutive steps, `StepBins`), and the last REPORT_RUNS runs of a file (the
    earlier ones are counted in a line). The file is written to a temporary file beside the
    target and renamed over it: never half-written, and a symlink at the target is
    replaced, never followed."""

    def __init__(self, path: str, runbook_base: str):
        self.path = path
        self.runbook_base = runbook_base
        self.files: list = []
        self.extras = Extras()  # step -> perf/throughput and response lengths, until classified

    def begin_file(self, path: str) -> None:
        self.current = path
        self.runs: dict[int, tuple[RunSummary, StepBins]] = {}
        self.earlier = [0, 0]  # runs, steps not drawn
        self.extras.clear()

    def record(self, record: Any) -> None:
        self.extras.record(record)

    def step(self, d: StepDiagnosis) -> None:
        entry = self.runs.get(d.run)
        if entry is None:
            entry = self.runs[d.run] = (RunSummary(d.run), StepBins())
            while len(self.runs) > REPORT_RUNS:
                _, bins = self.runs.pop(next(iter(self.runs)))
                self.earlier[0] += 1
                self.earlier[1] += bins.steps
        summary, bins = entry
        p = self.extras.point(d)
        summary.add(d, p)
        bins.add(p)

    def flush(self) -> None:
        """Nothing to do: the file is written whole at the end."""

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None:
        runs = [ReportRun(s.to_json(), b.points(), b.width) for s, b in self.runs.values()]
        self.files.append(
            ReportFile(
                self.current,
                records,
                dict(rejected),
                runs,
                tuple(cannot_show),
                (self.earlier[0], self.earlier[1]),
            )
        )
        self.runs = {}

    def close(self) -> None:
        """Nothing to do: `write()` is called once every file is read."""

    def write(self) -> None:
        from .. import __version__

        # the user's runbook URL wins; else the report embeds the sections it links
        page = report_page(self.files, Links.of(self.runbook_base, Links("")), __version__)
        write_atomically(self.path, page.encode("utf-8"))


def write_atomically(path: str, data: bytes) -> None:
    """`data` as the file `path`: written beside it under a temporary name, then renamed
    over it (a symlink at `path` is replaced, not followed; readers never see half a file)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".rlhf-report-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
