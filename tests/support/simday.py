"""A simulated day: real exporter code on an injected clock, scraped into a promtool test.

The exporter's sources and jobs take a `clock` (wall time). Here it is a `SimClock` that the
harness moves forward: verl jobs write their records (from the sample traces) into real
files or real pushes at simulated times, each `Target` (one exporter process: its real
sources, polled in process) is scraped every `SCRAPE` simulated seconds through the real
collector, and every sample a rule reads is recorded. `Day.promtool_test()` writes those
series, compressed with promtool's expanding notation (`a+bxN`, `_xN`), as a
`promtool test rules` input with the repository's real rule files at their real thresholds,
and `Day.check()` runs promtool. Simulated time 0 is promtool's time 0 (its `time()`).

    day = Day(tmp_path)
    t = day.target("pod-a", verl_roots=[root])
    job = TraceJob(trace, FileSink(root / "p" / "e.jsonl"))
    day.run(until=3600, jobs=[job])
    day.expect_no_page(at=3600)
    day.check()
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from rlhf_exporter.metrics.families import families
from rlhf_exporter.sources.base import PollingSource, Source
from rlhf_exporter.thresholds_file import load_thresholds

from .promtool import eval_order

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yaml"))
SCRAPE = 15  # seconds between scrapes (the chart's monitor.interval)
JOB = "rlhf-exporter"
PAGES = "critical|warning"  # severities that page; info alerts are diagnoses


class SimClock:
    """Wall time the harness moves; what every source and job reads instead of time.time."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def rule_metrics() -> frozenset[str]:
    """Every series name a rule file reads (the only ones worth writing to promtool)."""
    names = {"up"}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                names.update(re.findall(r"\b(rlhf_[a-z0-9_]+|process_[a-z0-9_]+)", rule["expr"]))
    return frozenset(names)


# -- jobs: records written at simulated times ---------------------------------------------------
def trace_steps(path: Path) -> list[list[dict]]:
    """A trace's records grouped by step (fully-async writes several per step), step >= 1."""
    steps: dict[int, list[dict]] = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:  # verl 0.6 wrote bare NaN (json.dumps), as read
                rec = json.loads(line)
            if rec["step"] >= 1:
                steps.setdefault(rec["step"], []).append(rec)
    return [steps[k] for k in sorted(steps)]


class FileSink:
    """verl's file logger: append lines; `truncate()` is what a restarted job does."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")

    def __call__(self, project: str, experiment: str, records: list[dict]) -> None:
        with open(self.path, "ab") as f:
            f.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    def truncate(self) -> None:
        self.path.write_bytes(b"")


class PushSink:
    """POST /api/v1/records, through the push source's own request handling."""

    def __init__(self, push: Any):
        self.push = push

    def __call__(self, project: str, experiment: str, records: list[dict]) -> None:
        body = orjson.dumps({"project": project, "experiment": experiment, "records": records})
        answer = self.push.handle(None, str(len(body)), lambda n: body[:n])
        assert answer.status == 200, answer

    def truncate(self) -> None:
        pass


@dataclass
class TraceJob:
    """A verl job replaying a sample trace's steps (cycled, renumbered) in simulated time.

    Between two records lies the step's own `timing_s/step`, plus what verl runs outside it:
    a validation every `validate_every` steps (`timing_s/testing`, durations taken in turn
    from `validations`) and a checkpoint every `save_every` steps when `save_outside`
    (`timing_s/save_checkpoint`, 0.6.x and the separated trainers)."""

    trace: Path
    sink: Any
    project: str = "proj"
    experiment: str = "exp"
    start: float = 0.0
    validate_every: int = 0
    validations: Sequence[float] = ()
    save_every: int = 0
    save_seconds: float = 0.0
    total_steps: int | None = None  # the job ends after this step
    restart_at: float | None = None  # the job restarts (file truncated) at this time ...
    restart_gap: float = 300.0  # ... comes back after this long, from its last checkpoint
    hang_at: float | None = None  # no record after this time
    step: int = 0
    next_at: float = field(init=False)  # when the next step's records are written
    _steps: list[list[dict]] = field(init=False, repr=False)
    _next: list[dict] = field(init=False, repr=False)
    _validations_done: int = 0
    _last_save: int = 0

    def __post_init__(self) -> None:
        self._steps = trace_steps(self.trace)
        self._plan(self.start)

    def _plan(self, after: float) -> None:
        """Prepare step `step + 1`: its records, and when its last one is written."""
        n = self.step + 1
        group = self._steps[(n - 1) % len(self._steps)]
        records = [{"step": n, "data": {**r["data"], "training/global_step": n}} for r in group]
        last = records[-1]["data"]
        if self.validate_every and n % self.validate_every == 0 and self.validations:
            last["timing_s/testing"] = self.validations[
                self._validations_done % len(self.validations)
            ]
        if self.save_every and n % self.save_every == 0 and self.save_seconds:
            last["timing_s/save_checkpoint"] = self.save_seconds
        self._next = records
        self.next_at = after + self._busy(records)

    @staticmethod
    def _busy(records: list[dict]) -> float:
        """Seconds the step takes before its records are written: the step, then what verl
        runs after it (validation; checkpoint in the separated trainers and 0.6.x)."""

        def most(key: str) -> float:
            return max(float(r["data"].get(key, 0.0)) for r in records)

        step = max(most("timing_s/step"), most("perf/time_per_step"), 30.0)
        return step + most("timing_s/testing") + most("timing_s/save_checkpoint")

    def advance(self, now: float) -> None:
        """Write every record due by `now`."""
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.sink.truncate()  # verl truncates its file when the job starts again
            self.step = self._last_save
            self._plan(now + self.restart_gap)
        while self.next_at <= now:
            if self.hang_at is not None and self.next_at >= self.hang_at:
                return
            if self.total_steps is not None and self.step >= self.total_steps:
                return
            records, at = self._next, self.next_at
            self.step += 1
            if "timing_s/testing" in records[-1]["data"] and self.validate_every:
                self._validations_done += self.step % self.validate_every == 0
            if self.save_every and self.step % self.save_every == 0:
                self._last_save = self.step
            self.sink(self.project, self.experiment, records)
            self._plan(at)


# -- targets: one exporter each -------------------------------------------------------------
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
HEALTH_TIMES = (
    "rlhf_exporter_collector_duration_seconds",
    "rlhf_exporter_collector_last_success_timestamp_seconds",
)


@dataclass
class Target:
    """One exporter process: its real sources, polled in process (each at its own
    `interval`, at most once a scrape), scraped by `Day` through the real collector."""

    instance: str
    sources: list[Source]
    keep: frozenset[str] = frozenset()  # series names to record (empty: all)
    up: bool = True
    scraped: bool = True  # False: dropped from service discovery (no `up` series at all)
    started: float = 0.0  # process_start_time_seconds (the process is simulated: `restart`)
    exported: set = field(default_factory=set)  # the series of the last successful scrape
    _next_poll: dict[str, float] = field(default_factory=dict)
    _key: tuple | None = None
    _held: list = field(default_factory=list)
    _out: list[tuple[SeriesKey, float]] = field(default_factory=list)
    _times: list[tuple[int, str, str]] = field(default_factory=list)
    last: dict[SeriesKey, float] = field(default_factory=dict)  # every series, last render

    def restart(self, now: float, sources: list[Source]) -> None:
        """The exporter process restarts: new sources (nothing remembered), a new start time."""
        self.sources = list(sources)
        for s in self.sources:
            if not isinstance(s, PollingSource):
                s.start()
        self.started = now
        self._next_poll.clear()
        self._key = None

    def scrape(self, now: float) -> list[tuple[SeriesKey, float]]:
        """(series, value) of one scrape, target labels (`job`, `instance`) included."""
        for source in self.sources:
            polled = isinstance(source, PollingSource)
            if polled and now >= self._next_poll.get(source.name, -math.inf):
                source.poll_once()
                self._next_poll[source.name] = now + max(source.interval, SCRAPE) - 1e-6
        snaps = [s.snapshot() for s in self.sources]
        # a scrape that finds the same series as the last one reuses its rendering with the
        # fresh health times (the exposition is the collector's either way; this only keeps
        # a day's 23,040 scrapes fast)
        key = tuple(
            (
                id(s.samples),
                s.up,
                tuple(s.errors.items()),
                s.records,
                tuple(s.record_errors.items()),
            )
            for s in snaps
        )
        if key != self._key:
            self._key, self._held = key, [s.samples for s in snaps]  # held: ids stay unique
            target = {"job": JOB, "instance": self.instance}
            self._out, self._times, self.last = [], [], {}
            for family in families(snaps):
                for sample in family.samples:
                    labels = {**sample.labels, **target}
                    value = sample.value
                    if sample.name == "process_start_time_seconds":
                        value = self.started
                    self.last[sample.name, tuple(sorted(labels.items()))] = value
                    if self.keep and sample.name not in self.keep:
                        continue
                    if sample.name in HEALTH_TIMES:
                        self._times.append((len(self._out), sample.name, labels["collector"]))
                    self._out.append(((sample.name, tuple(sorted(labels.items()))), value))
            return self._out
        by = {s.collector: s for s in snaps}
        out = list(self._out)
        for i, name, collector in self._times:
            s = by[collector]
            value = s.duration if name == HEALTH_TIMES[0] else s.last_success
            out[i] = (out[i][0], float(value) if value is not None else out[i][1])
        return out


# -- series and promtool ------------------------------------------------------------------------
STALE = "stale"


def _fmt(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e15 else str(int(x))


def encode(values: Sequence[float | str | None]) -> str:
    """promtool's expanding notation: `a+bxN` runs, `_xN` gaps, `stale` markers."""
    out: list[str] = []
    i, n = 0, len(values)
    while i < n:
        v = values[i]
        if v is None:
            j = i
            while j < n and values[j] is None:
                j += 1
            out.append(f"_x{j - i}")
            i = j
            continue
        if v == STALE:
            out.append(STALE)
            i += 1
            continue
        a = float(v)
        j = i + 1
        d = 0.0
        if j < n and isinstance(values[j], float):
            d = float(values[j]) - a
            cur = a
            while j < n and isinstance(values[j], float):
                cur += d
                if abs(cur - values[j]) > 1e-6 * max(1.0, abs(values[j])):
                    break
                j += 1
        count = j - i - 1
        if count == 0:
            out.append(_fmt(a))
        elif d == 0:
            out.append(f"{_fmt(a)}x{count}")
        else:
            sign = "+" if d > 0 else "-"
            out.append(f"{_fmt(a)}{sign}{abs(d)!r}x{count}")
        i = j
    return " ".join(out)


def _series_text(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


class Day:
    def __init__(self, workdir: Path, clock: SimClock | None = None, evaluation: int = SCRAPE):
        self.workdir = workdir
        self.evaluation = evaluation  # seconds between rule evaluations in promtool
        self.clock = clock or SimClock()
        self.th = load_thresholds()
        self.targets: list[Target] = []
        self.keep = rule_metrics()
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float | str]] = {}
        self.scrapes = 0
        self.checks: list[dict] = []
        self.hooks: list[tuple[float, Callable[[], None]]] = []

    def target(self, instance: str, sources: Iterable[Source]) -> Target:
        t = Target(instance, list(sources), self.keep)
        for s in t.sources:
            if not isinstance(s, PollingSource):
                s.start()  # push: publishes on start; polled sources are polled by scrape()
        self.targets.append(t)
        return t

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run `action` once the simulated time reaches `when` (before that scrape)."""
        self.hooks.append((when, action))

    def run(self, until: float, jobs: Sequence[TraceJob] = ()) -> None:
        while self.scrapes * SCRAPE <= until:
            now = self.scrapes * SCRAPE
            self.clock.now = now
            for when, action in [h for h in self.hooks if h[0] <= now]:
                self.hooks.remove((when, action))
                action()
            for job in jobs:
                job.advance(now)
            for t in self.targets:
                self._scrape(t, self.scrapes, now)
            self.scrapes += 1

    def _scrape(self, t: Target, k: int, now: float) -> None:
        if not t.scraped:  # not a target any more: its series, `up` included, go stale once
            for (_, labels), values in self.series.items():
                if dict(labels).get("instance") == t.instance and isinstance(
                    values.get(k - 1), float
                ):
                    values[k] = STALE
            return
        up = ("up", (("instance", t.instance), ("job", JOB)))
        self.series.setdefault(up, {})[k] = 1.0 if t.up else 0.0
        if not t.up:  # a failed scrape: Prometheus marks the target's series stale once
            for (name, labels), values in self.series.items():
                mine = name != "up" and dict(labels).get("instance") == t.instance
                if mine and isinstance(values.get(k - 1), float):
                    values[k] = STALE
            return
        series = self.series
        seen = set()
        for key, value in t.scrape(now):
            values = series.get(key)
            if values is None:
                values = series[key] = {}
            values[k] = float(value)
            seen.add(key)
        # a series the target no longer exports is marked stale once, as Prometheus does
        for key in t.exported - seen:
            values = series.get(key)
            if values is not None and isinstance(values.get(k - 1), float):
                values[k] = STALE
        t.exported = seen

    def value(self, name: str, **labels: str) -> float | None:
        """The last scraped value of one series (all given labels must match)."""
        for t in self.targets:
            for (n, lab), value in t.last.items():
                if n == name and labels.items() <= dict(lab).items():
                    return value
        return None

    # -- what promtool must find ------------------------------------------------------------
    def expect_pages(
        self, at: float, window: float, pages: dict[str, int], severities: str = PAGES
    ) -> None:
        """At `at`, the alerts that fired (and paged: critical or warning, or any of the
        `severities` regex) in the `window` seconds before are exactly `pages` (alertname ->
        how many distinct alerts)."""
        self.checks.append(
            {
                "expr": (
                    "count by (alertname) (max_over_time("
                    f'ALERTS{{alertstate="firing", severity=~"{severities}"}}[{int(window)}s]))'
                ),
                "eval_time": f"{int(at)}s",
                "exp_samples": [
                    {"labels": f'{{alertname="{name}"}}', "value": n}
                    for name, n in sorted(pages.items())
                ],
            }
        )

    def expect_firing(self, at: float, alertname: str, **labels: str) -> None:
        """At `at`, `alertname` with these labels is firing."""
        matchers = "".join(f', {k}="{v}"' for k, v in sorted(labels.items()))
        self.checks.append(
            {
                "expr": (
                    f'count(ALERTS{{alertstate="firing", alertname="{alertname}"{matchers}}})'
                ),
                "eval_time": f"{int(at)}s",
                "exp_samples": [{"labels": "{}", "value": 1}],
            }
        )

    def promtool_test(self) -> Path:
        n = self.scrapes
        inputs = []
        for (name, labels), values in sorted(self.series.items()):
            row = [values.get(k) for k in range(n)]
            inputs.append({"series": _series_text(name, dict(labels)), "values": encode(row)})
        end = (n - 1) * SCRAPE
        doc = {
            "rule_files": [str(p) for p in RULE_FILES],
            "evaluation_interval": f"{self.evaluation}s",
            "group_eval_order": eval_order(RULE_FILES),
            "tests": [
                {
                    "interval": f"{SCRAPE}s",
                    "input_series": inputs,
                    # an alert test at the end makes promtool evaluate the rules up to it
                    "alert_rule_test": [
                        {
                            "eval_time": f"{end}s",
                            "alertname": "RLHFExporterAbsent",
                            "exp_alerts": [],
                        }
                    ],
                    "promql_expr_test": self.checks,
                }
            ],
        }
        path = self.workdir / "simday.test.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20), encoding="utf-8")
        return path

    def check(self, promtool: str = "promtool") -> subprocess.CompletedProcess:
        path = self.promtool_test()
        return subprocess.run(
            [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300
        )
