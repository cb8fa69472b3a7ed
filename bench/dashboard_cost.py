"""What every dashboard query costs with a real amount of history (issue 24).

    .venv/bin/python bench/dashboard_cost.py [--jobs 1000] [--hours 12] [--workdir DIR]

A real Prometheus holds `--jobs` jobs and `--hours` of history at a 15 s scrape: the real
exporter's series (tests/support/fleet_history.py: the sample traces through the real
sources and collector on a simulated clock, one template per trace), written as OpenMetrics
one aligned 2 h window at a time and backfilled with `promtool tsdb create-blocks-from
openmetrics`; then the repository's recording rules are backfilled over the same hours with
`promtool tsdb create-blocks-from rules` (in dependency order: a record read by another is
backfilled first), each group at its own interval, else 1 m.

Then every query of both dashboards runs as Grafana runs it, with `stats=all`:

- time series and state timelines: a range query over the last 6 h and the last 24 h,
  ending at the last sample, at the panel's own step (Grafana: range / the panel's width in
  pixels on a 1,920 px screen, rounded as Grafana rounds it, at least the panel's min
  interval and the 15 s scrape),
  `$__rate_interval` = max(step + 15 s, 60 s);
- stats, tables and bar gauges (instant queries): one query at the end, `$__range` 6 h or 24 h;
- the fleet dashboard with every job selected, the job dashboard on one job.

Each query runs twice and the second run is timed (a Prometheus that has been running has
its blocks in the page cache). It prints, per query, the wall time (client side), Prometheus's own evaluation time and the
samples it touched (`totalQueryableSamples`), and for each rule group the evaluation time
of its rules (each rule's expression as an instant query at the end, summed). With `--hours`
under 24 the 24 h queries read all the history there is: their samples are a lower bound.
Nothing is asserted: the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import fleet_hardware, fleet_history, grafana_vars  # noqa: E402
from tests.support.prometheus import Prometheus  # noqa: E402

SCRAPE = 15
SCREEN = 1920  # px: a panel of grid width w is about w / 24 of it
BLOCK = 7200


def round_interval(ms: float) -> float:
    """Grafana's kbn.roundInterval (ms -> ms), the part above one second."""
    table = [
        (1500, 1000),
        (3500, 2000),
        (7500, 5000),
        (12500, 10000),
        (17500, 15000),
        (25000, 20000),
        (45000, 30000),
        (90000, 60000),
        (210000, 120000),
        (450000, 300000),
        (750000, 600000),
        (1050000, 900000),
        (1500000, 1200000),
        (2700000, 1800000),
        (5400000, 3600000),
    ]
    for limit, value in table:
        if ms < limit:
            return value
    return 7200000


def panel_step(width: int, range_s: float, min_step: int = SCRAPE) -> int:
    """Grafana's step: the range over the panel's pixels, rounded, at least the panel's min
    interval (or the scrape interval)."""
    pixels = max(100, SCREEN * width / 24 - 30)
    return max(min_step, SCRAPE, int(round_interval(range_s * 1000 / pixels) / 1000))


def seconds_of(text: str | None) -> int:
    if not text:
        return SCRAPE
    n, unit = int(text[:-1]), text[-1]
    return n * {"s": 1, "m": 60, "h": 3600}[unit]


def duration(s: float) -> str:
    return f"{int(s // 3600)}h" if s % 3600 == 0 else f"{int(s)}s"


def panel_queries(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    out = []
    panels = []
    for p in doc["panels"]:
        panels += [p, *p.get("panels", [])]
    for p in panels:
        for t in p.get("targets", []):
            out.append(
                {
                    "dashboard": path.stem,
                    "panel": p["title"],
                    "ref": t["refId"],
                    "width": p["gridPos"]["w"],
                    "min_step": seconds_of(p.get("interval")),
                    "expr": t["expr"],
                    "instant": bool(t.get("instant")),
                }
            )
    for a in doc.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(
                {
                    "dashboard": path.stem,
                    "panel": f"annotation {a['name']}",
                    "ref": "-",
                    "width": 24,
                    "expr": a["expr"],
                    "instant": False,
                }
            )
    return out


def run_query(url: str, q: dict, range_s: float, end: float) -> dict:
    step = panel_step(q["width"], range_s, q.get("min_step", SCRAPE))
    job = q["dashboard"] == "rlhf-job"
    expr = grafana_vars.substitute(
        q["expr"],
        rate_interval=duration(max(step + SCRAPE, 4 * SCRAPE)),
        interval=duration(step),
        range_=duration(range_s),
        project="team0" if job else ".+",
        experiment="exp0000" if job else ".+",
    )
    if q["instant"]:
        params = {"query": expr, "time": end, "stats": "all"}
        api = "/api/v1/query"
    else:
        params = {
            "query": expr,
            "start": end - range_s,
            "end": end,
            "step": step,
            "stats": "all",
        }
        api = "/api/v1/query_range"
    t = time.perf_counter()
    r = requests.post(url + api, data=params, timeout=300)
    wall = time.perf_counter() - t
    body = r.json()
    if body.get("status") != "success":
        return {"wall": wall, "error": body.get("error", r.text)[:120], "step": step}
    stats = body["data"].get("stats", {})
    series = {json.dumps(s["metric"], sort_keys=True) for s in body["data"]["result"]}
    return {
        "wall": wall,
        "eval": stats.get("timings", {}).get("evalTotalTime", math.nan),
        "samples": stats.get("samples", {}).get("totalQueryableSamples", 0),
        "series": len(series),
        "step": step,
    }


def backfill_missing(prom: Prometheus, work: Path, data: Path, info: dict) -> bool:
    """Backfill the records of the repository's rules that a kept TSDB (`--workdir`) does not
    hold yet (rules added since it was built, records of series added since), pass by pass
    (a record read by another first), each group at its own interval. Returns whether any
    was. The names backfilled are kept in `info` (a record may have no series at all in this
    history: it is not backfilled again at every start)."""
    done = set(info.get("backfilled", ()))
    groups = []
    for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules = [
                r
                for r in group["rules"]
                if "record" in r
                and r["record"] not in done
                and not prom.query(f"count({r['record']} @ {info['end'] - 60})")
            ]
            if rules:
                groups.append({**group, "rules": rules})
    if not groups:
        return False
    names = [r["record"] for g in groups for r in g["rules"]]
    print(f"backfilling {len(names)} records the kept TSDB lacks: {', '.join(names)}", flush=True)
    rules_file = work / "missing.rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    shutil.rmtree(data.parent / "rule-blocks", ignore_errors=True)
    prom.terminate()
    fleet_history.backfill_record_levels(
        [rules_file], work, data, info["start"], info["end"], log=print
    )
    info["backfilled"] = sorted(done | set(names))
    return True


def add_hardware(work: Path, data: Path, info: dict) -> None:
    """A kept TSDB built before the GPU, engine and job-state series (issue 37): the replayed
    job-state series of the jobs whose state changes, and the lifecycle records (they read
    the states), are deleted; tests/support/fleet_hardware.py's series are backfilled;
    backfill_missing then records what reads them."""
    plans = fleet_hardware.plans(info["jobs"], info["start"], info["end"])
    changing = "|".join(p.experiment for p in plans if p.transitions())
    lifecycle = [
        r["record"]
        for g in yaml.safe_load((REPO / "alerts" / "recording.rules.yaml").read_text())["groups"]
        if g["name"] == "rlhf-exporter.lifecycle"
        for r in g["rules"]
    ]
    prom = start_prometheus(work / "prom", admin=True)
    try:
        matches = [f'{n}{{experiment=~"{changing}"}}' for n in fleet_hardware.STATE_NAMES]
        matches += [f'{{__name__="{n}"}}' for n in lifecycle]
        r = requests.post(
            prom.url + "/api/v1/admin/tsdb/delete_series", data={"match[]": matches}, timeout=600
        )
        r.raise_for_status()
    finally:
        prom.terminate()
    t0 = time.time()
    n = fleet_history.backfill_hardware(work, data, plans, info["start"], info["end"], log=print)
    info["hardware"] = n
    print(f"GPU, engine and job-state series: {n:,} samples, {time.time() - t0:.0f} s")


def print_panels(prom: Prometheus, end: float) -> None:
    """Every dashboard query over 6 h and 24 h (the second of two runs)."""
    print(
        "| dashboard | panel | ref | kind | 6 h ms | 6 h samples | 24 h ms | 24 h samples | series |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    worst = {21600: 0.0, 86400: 0.0}
    for path in sorted((REPO / "grafana").glob("*.json")):
        for q in panel_queries(path):
            cells = []
            for range_s in (21600, 86400):
                run_query(prom.url, q, range_s, end)  # warm: a running Prometheus's cache
                r = run_query(prom.url, q, range_s, end)
                if "error" in r:
                    cells += [f"error: {r['error']}", "", r["step"]]
                    continue
                worst[range_s] = max(worst[range_s], r["wall"])
                cells += [f"{r['wall'] * 1000:.0f}", f"{r['samples']:,}", r["series"]]
            step = panel_step(q["width"], 21600, q.get("min_step", SCRAPE))
            kind = "instant" if q["instant"] else f"range {step} s"
            print(
                f"| {q['dashboard']} | {q['panel'][:48]} | {q['ref']} | {kind} | "
                f"{cells[0]} | {cells[1]} | {cells[3]} | {cells[4]} | {cells[5]} |",
                flush=True,
            )
    print(f"\nslowest query: {worst[21600]:.2f} s over 6 h, {worst[86400]:.2f} s over 24 h")


def rule_groups(rev: str | None = None) -> list[dict]:
    """The rule groups of alerts/*.rules.yaml, of the work tree or of git revision `rev`."""
    out = []
    for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
        if rev is None:
            text = path.read_text()
        else:
            git = ["git", "-C", str(REPO), "show", f"{rev}:alerts/{path.name}"]
            text = subprocess.run(git, capture_output=True, text=True, check=True).stdout
        out += yaml.safe_load(text)["groups"]
    return out


def time_group(prom: Prometheus, group: dict, end: float) -> tuple[float, int]:
    """A group's evaluation cost: its rules' expressions as instant queries at `end`, one after
    the other as Prometheus runs them (ms, samples)."""
    ms, samples = 0.0, 0
    for rule in group["rules"]:
        q = {"dashboard": "rules", "expr": rule["expr"], "width": 24, "instant": True}
        r = run_query(prom.url, q, 21600, end)
        ms += r["wall"] * 1000
        samples += r.get("samples", 0)
    return ms, samples


def print_rule_groups(prom: Prometheus, end: float, before: str | None, rounds: int = 3) -> None:
    """Each rule group's evaluation as a share of its interval (median of `rounds`); with
    `before` (a git revision), that revision's groups too, interleaved group by group in the
    same rounds."""
    sets = {"after": rule_groups()}
    if before:
        sets["before"] = rule_groups(before)
    times: dict[tuple[str, str], list[float]] = {}
    samples: dict[tuple[str, str], int] = {}
    for _ in range(rounds):
        for which, groups in sets.items():
            for group in groups:
                ms, n = time_group(prom, group, end)
                times.setdefault((which, group["name"]), []).append(ms)
                samples[which, group["name"]] = n
    print(
        "\n| rule group | interval | rules | evaluation ms (instant, at the end; median of "
        f"{rounds}) | % of its interval | samples |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for which in sorted(sets, reverse=True):  # before, then after
        for group in sets[which]:
            interval = seconds_of(group.get("interval", f"{SCRAPE}s"))
            ms = statistics.median(times[which, group["name"]])
            tag = f" ({which})" if before else ""
            print(
                f"| {group['name']}{tag} | {interval} s | {len(group['rules'])} | {ms:.0f} | "
                f"{ms / 10 / interval:.1f} | {samples[which, group['name']]:,} |"
            )


def start_prometheus(work: Path, admin: bool = False) -> Prometheus:
    return Prometheus(
        work,
        [],
        scrape_interval="15s",
        extra_args=[
            "--storage.tsdb.retention.time=30d",
            "--query.timeout=5m",
            *(["--web.enable-admin-api"] if admin else []),
        ],
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=12, help="history, a multiple of 2")
    ap.add_argument("--workdir", type=Path, help="keep the TSDB here (reused when present)")
    ap.add_argument(
        "--rules-before",
        metavar="REV",
        help="also time the rule groups of this git revision, interleaved (before/after)",
    )
    ap.add_argument(
        "--only", choices=("panels", "rules"), help="time only the panels or only the rule groups"
    )
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dashboard-cost-"))
    data = work / "prom" / "data"  # tests.support.prometheus.Prometheus(work / "prom") reads it
    meta = work / "history.json"
    t0 = time.time()
    if not meta.exists():
        end = math.floor(time.time() / BLOCK) * BLOCK  # the history ends at a block boundary
        start = end - args.hours * 3600
        total = fleet_history.build(work, data, args.jobs, args.hours, end, log=print)
        meta.write_text(
            json.dumps(
                {"start": start, "end": end, "samples": total, "jobs": args.jobs, "hardware": 1}
            )
        )
    info = json.loads(meta.read_text())
    if "hardware" not in info:  # a kept TSDB from before the GPU, engine and state series
        add_hardware(work, data, info)
        meta.write_text(json.dumps(info))
    end = info["end"] - SCRAPE
    prom = start_prometheus(work / "prom")
    if backfill_missing(prom, work, data, info):  # a kept TSDB, records added since
        meta.write_text(json.dumps(info))
        prom = start_prometheus(work / "prom")
    try:
        head = prom.query(f"count(rlhf_step @ {end})")
        series = prom.query(f"count({{__name__=~'.+'}} @ {end})")
        print(
            f"\n{info['jobs']} jobs ({head[0]['value'][1] if head else 0} in Prometheus), "
            f"{info['samples']:,} raw samples, {series[0]['value'][1] if series else 0} series "
            f"at the end, history {(info['end'] - info['start']) / 3600:g} h; "
            f"setup {time.time() - t0:.0f} s\n",
            flush=True,
        )
        if args.only != "rules":
            print_panels(prom, end)
        if args.only != "panels":
            print_rule_groups(prom, end, args.rules_before)
    finally:
        prom.terminate()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
