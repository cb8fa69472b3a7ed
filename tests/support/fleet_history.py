"""A fleet's history for a real Prometheus: N jobs, H hours at a 15 s scrape, backfilled.

The series are the real exporter's: a few template jobs (the vendored sample traces, cycled)
run through the real sources and collector on a simulated clock (tests/support/simday.py),
keeping every series a rule or a dashboard reads. Each of the N jobs is one template's
series under its own project, experiment and exporter instance, so the TSDB holds N jobs'
worth of series and samples (values repeat across jobs; query cost does not depend on them).

`write_openmetrics` streams them as one OpenMetrics file (each series' samples together, in
time order: what `promtool tsdb create-blocks-from openmetrics` reads), one template body
per series with the series' name put in by `str.replace`, so 1,000 jobs x 12 h are written at
disk speed. `backfill` runs promtool on it, then `backfill_rules` records the repository's
recording rules over the same hours through a Prometheus serving those blocks.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlhf_exporter.sources.verl_files import VerlFileSource

from . import fleet_hardware
from .simday import JOB, SCRAPE, STALE, Day, FileSink, TraceJob, rule_metrics

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
MARK = "\x00"  # where a series' name goes in a template body
BLOCK = 7200  # seconds: promtool writes one block per aligned window of this length


def dashboard_metrics(glob: str = "*.json") -> frozenset[str]:
    """Every series name a shipped dashboard (grafana/`glob`) reads."""
    names: set[str] = set()
    for path in (ROOT / "grafana").glob(glob):
        names.update(re.findall(r"\b(rlhf_[a-z0-9_]+)", path.read_text(encoding="utf-8")))
    return frozenset(names)


def template_traces() -> list[Path]:
    return sorted(p for p in TRACES.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))


@dataclass
class Templates:
    """The template jobs' series: {(name, labels): {scrape index: value}}, and their count."""

    series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float | str]]
    scrapes: int
    experiments: list[str]


def templates(workdir: Path, hours: float) -> Templates:
    """Run one exporter with one job per sample trace for `hours` of simulated time."""
    day = Day(workdir, evaluation=60)
    day.keep = rule_metrics() | dashboard_metrics()
    root = workdir / "verl"
    root.mkdir(parents=True, exist_ok=True)
    day.target("template:19839", [VerlFileSource(day.th, [root], clock=day.clock)])
    jobs = []
    for i, trace in enumerate(template_traces()):
        experiment = f"t{i}"
        jobs.append(
            TraceJob(
                trace,
                FileSink(root / "tpl" / f"{experiment}.jsonl"),
                "tpl",
                experiment,
                start=i * 7.0,
                validate_every=40,
                validations=(120.0,),
            )
        )
    day.run(hours * 3600 - SCRAPE, jobs)
    return Templates(day.series, day.scrapes, [j.experiment for j in jobs])


def _fmt(v: float) -> str:
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def job_names(n: int) -> Iterator[tuple[str, str, str]]:
    """(project, experiment, instance) of job i: 10 projects, 10 exporters."""
    for i in range(n):
        yield f"team{i % 10}", f"exp{i:04d}", f"fleet{i % 10}:19839"


def write_openmetrics(
    path: Path,
    tpl: Templates,
    jobs: int,
    end: float,
    window: tuple[float, float] | None = None,
    detailed: int = 10,
    own_states: frozenset[int] = frozenset(),
) -> int:
    """Write `jobs` jobs' series, the last scrape at `end` (epoch seconds); only the samples
    in `window` ([from, to) epoch seconds) when given. Jobs from `detailed` on carry only
    the series a rule or the fleet dashboard reads (the job dashboard shows one job: ten
    jobs with every series are enough to time it); jobs in `own_states` no job-state series
    (tests/support/fleet_hardware.py writes their state changes). Returns the number of
    samples written."""
    start = end - (tpl.scrapes - 1) * SCRAPE
    stamps = [round(start + k * SCRAPE, 3) for k in range(tpl.scrapes)]
    lo, hi = window or (-math.inf, math.inf)
    bodies: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, int]] = {}
    for key, values in tpl.series.items():
        lines = [
            f"{MARK} {_fmt(float(v))} {_fmt(stamps[k])}\n"
            for k, v in sorted(values.items())
            if v is not None and v != STALE and lo <= stamps[k] < hi
        ]
        bodies[key] = ("".join(lines), len(lines))
    fleet = rule_metrics() | dashboard_metrics("rlhf-fleet.json")
    per_template: dict[str, list] = {e: [] for e in tpl.experiments}
    per_instance = []
    for (name, labels), body in sorted(bodies.items()):
        lab = dict(labels)
        if "experiment" in lab:
            per_template[lab["experiment"]].append((name, lab, body, name in fleet))
        elif name != "up" or lab.get("job") == JOB:
            per_instance.append((name, lab, body))
    samples = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 24) as f:
        instances = sorted({inst for _, _, inst in job_names(jobs)})
        for instance in instances:
            for name, lab, (body, n) in per_instance:
                f.write(body.replace(MARK, f"{name}{{{_labels({**lab, 'instance': instance})}}}"))
                samples += n
        for i, (project, experiment, instance) in enumerate(job_names(jobs)):
            template = tpl.experiments[i % len(tpl.experiments)]
            for name, lab, (body, n), in_fleet in per_template[template]:
                if i >= detailed and not in_fleet:
                    continue
                if i in own_states and name in fleet_hardware.STATE_NAMES:
                    continue
                own = {**lab, "project": project, "experiment": experiment, "instance": instance}
                f.write(body.replace(MARK, f"{name}{{{_labels(own)}}}"))
                samples += n
        f.write("# EOF\n")
    return samples


def backfill(openmetrics: Path, data: Path, promtool: str | None = None, block: str = "2h") -> None:
    """Blocks from the OpenMetrics file into the TSDB directory `data` (a file that covers one
    aligned `block` of time makes exactly one block: files of successive windows never make
    overlapping blocks)."""
    promtool = promtool or shutil.which("promtool") or "promtool"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"--max-block-duration={block}",
            str(openmetrics),
            str(data),
        ],
        check=True,
        capture_output=True,
        timeout=7200,
    )


def backfill_hardware(
    work: Path,
    data: Path,
    plans: list[fleet_hardware.JobPlan],
    start: float,
    end: float,
    log: Callable[..., None] = lambda *a, **k: None,
) -> int:
    """tests/support/fleet_hardware.py's series for [start, end) into `data`, one aligned 2 h
    window at a time (the next window is written while promtool reads the last). Returns the
    samples written."""
    from concurrent.futures import ThreadPoolExecutor

    t0, total = time.time(), 0
    with ThreadPoolExecutor(1) as pool:
        running = None
        for k, lo in enumerate(range(int(start), int(end), BLOCK)):
            path = work / f"hardware-{k % 2}.om"  # promtool reads the other one meanwhile
            total += fleet_hardware.write_openmetrics(path, plans, start, (lo, lo + BLOCK))
            if running is not None:
                running.result()
            running = pool.submit(_backfill_and_remove, path, data)
            log(f"hardware window {lo}: {total:,} samples so far, {time.time() - t0:.0f} s")
        if running is not None:
            running.result()
    return total


def _backfill_and_remove(path: Path, data: Path) -> None:
    backfill(path, data)
    path.unlink()


def backfill_rules(
    url: str,
    rule_files: list[Path],
    data: Path,
    start: float,
    end: float,
    interval: str = "1m",
    promtool: str | None = None,
) -> None:
    """The recording rules of `rule_files` evaluated over [start, end] by the Prometheus at
    `url` (each group at its own interval, else `interval`), written as blocks into `data`."""
    promtool = promtool or shutil.which("promtool") or "promtool"
    out = data.parent / "rule-blocks"
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--start={int(start)}",
            f"--end={int(end)}",
            f"--url={url}",
            f"--eval-interval={interval}",
            f"--output-dir={out}",
            *map(str, rule_files),
        ],
        check=True,
        capture_output=True,
        timeout=7200,
    )
    for block in out.iterdir():
        if block.is_dir():
            shutil.move(str(block), data / block.name)


def record_levels(rule_files: list[Path]) -> list[list[dict]]:
    """The recording rules split into passes: a rule reading another record comes after it
    (promtool backfills what Prometheus already holds)."""
    rules = []
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                if "record" in r:
                    rules.append((path, group, r))
    names = {r["record"] for _, _, r in rules}
    level: dict[str, int] = {}

    def of(r: dict) -> int:
        if r["record"] in level:
            return level[r["record"]]
        reads = [
            n for n in names if n != r["record"] and re.search(rf"{re.escape(n)}\b", r["expr"])
        ]
        deps = [of(next(x for _, _, x in rules if x["record"] == n)) for n in reads]
        level[r["record"]] = 1 + max(deps, default=-1)
        return level[r["record"]]

    for _, _, r in rules:
        of(r)
    passes = []
    for k in range(max(level.values()) + 1):
        groups = []
        for _path, group, r in rules:
            if level[r["record"]] != k:
                continue
            for g in groups:
                if g["name"] == group["name"]:
                    g["rules"].append(r)
                    break
            else:
                groups.append({**{k2: v for k2, v in group.items() if k2 != "rules"}, "rules": [r]})
        passes.append(groups)
    return passes


def build(
    work: Path,
    data: Path,
    jobs: int,
    hours: int,
    end: int,
    log: Callable[..., None] = lambda *a, **k: None,
) -> int:
    """The whole history into the TSDB directory `data`: raw series for [end - hours, end)
    one 2 h window at a time, then the recording rules, pass by pass. Returns the raw
    samples written."""
    t0 = time.time()
    start = end - hours * 3600
    tpl = templates(work / "templates", hours)
    log(f"templates: {len(tpl.series)} series, {time.time() - t0:.0f} s", flush=True)
    plans = fleet_hardware.plans(jobs, start, end)
    own = frozenset(p.index for p in plans if p.transitions())
    total = backfill_hardware(work, data, plans, start, end, log)
    for lo in range(start, end, BLOCK):
        path = work / "window.om"
        n = write_openmetrics(
            path, tpl, jobs, end - SCRAPE, window=(lo, lo + BLOCK), own_states=own
        )
        size = path.stat().st_size
        backfill(path, data)
        path.unlink()
        total += n
        log(
            f"window {lo}: {n:,} samples ({size / 1e9:.1f} GB), {time.time() - t0:.0f} s",
            flush=True,
        )
    rule_files = sorted((ROOT / "alerts").glob("*.rules.yaml"))
    backfill_record_levels(rule_files, work, data, start, end, log)
    return total


def backfill_record_levels(
    rule_files: list[Path],
    work: Path,
    data: Path,
    start: float,
    end: float,
    log: Callable[..., None] = lambda *a, **k: None,
) -> None:
    """The records of `rule_files` over [start, end], pass by pass (`record_levels`), each
    pass through a Prometheus serving what the passes before wrote."""
    from .prometheus import Prometheus

    t0 = time.time()
    for k, groups in enumerate(record_levels(rule_files)):
        prom = Prometheus(
            data.parent, [], scrape_interval="15s", extra_args=["--storage.tsdb.retention.time=30d"]
        )
        try:
            pass_file = work / f"records-{k}.yaml"
            pass_file.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
            backfill_rules(prom.url, [pass_file], data, start, end)
        finally:
            prom.terminate()
        log(f"rules pass {k}: {time.time() - t0:.0f} s", flush=True)
