"""The writers of `rlhf-exporter diagnose`: one per output (`--format table|jsonl|json`,
`--html`), all behind `Writer`, which `commands/diagnose.py` drives file by file and record
by record. Each holds only what its output needs (a bounded summary per run; the HTML report
at most MAX_DRAWN bars per run and the last REPORT_RUNS runs)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import textwrap
from typing import IO, TYPE_CHECKING, Any, Protocol

import orjson

from ..diagnosis import StepDiagnosis
from ..diagnosis.episodes import episodes
from ..diagnosis.history import StepBins, StepPoint, point
from ..diagnosis.words import counted
from .report import (
    MAX_EPISODE_STEPS,
    RunSummary,
    Style,
    Table,
    rejected_line,
    step_json,
    summary_lines,
)

if TYPE_CHECKING:
    from .pages import ReportFile


class Writer(Protocol):
    """What `diagnose` tells an output, in this order: per file `begin_file`, then every
    record (`record`) and each classified step (`step`), `flush` after each chunk read (a
    live tail keeps up), `end_file` with the file's counts; `close` after the last file."""

    def begin_file(self, path: str) -> None: ...

    def record(self, record: Any) -> None: ...

    def step(self, d: StepDiagnosis) -> None: ...

    def flush(self) -> None: ...

    def end_file(
        self, records: int, rejected: dict[str, int], cannot_show: tuple[str, ...] = ()
    ) -> None: ...

    def close(self) -> None: ...


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
        self.runs: dict[int, tuple[RunSummary, list[dict[str, Any]]]] = {}
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
        for part in fit(f"summary of {self.path}: {counted(records, 'record')}", self.width):
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

    def __init__(self, first: Writer, second: Writer):
        self.writers = (first, second)

    def record(self, record: Any) -> None:
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
        self.files: list[ReportFile] = []
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
        from .pages import ReportFile, ReportRun  # only --html loads the pages

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
        from .pages import Links, report_page

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
