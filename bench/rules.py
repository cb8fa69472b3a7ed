"""Rule-group evaluation time at 1,000 jobs: the rules before issue 18 vs the current ones.

    .venv/bin/python bench/rules.py [--jobs 1000] [--before-rev 68a0298] [--seconds 90]

A real Prometheus on 127.0.0.1 evaluates each rule set over the same TSDB: 1,000 synthetic
verl jobs on 10 exporters, backfilled with `promtool tsdb create-blocks-from openmetrics`
(6 h 45 min of history for the series that 6 h rules read, the last 45 min for the others,
one sample a minute). Almost every job is steadily bound (the issue's fleet: rollout 29%,
update 29%, sync 14%, other 14%, logprob and reward 7% each); 1% moved its bottleneck an hour
ago and 1% lost 35% of its throughput an hour ago. The current rules' reference records
(`...:ratio_rate6h`, read `offset 30m`) are backfilled too, as a Prometheus that has run for
hours would hold them.

Each rule set runs in its own Prometheus (a fresh copy of the blocks, evaluation every 10 s,
nothing scraped) for `--seconds`; the script reads `prometheus_rule_group_last_duration_seconds`
from Prometheus' own /metrics after every evaluation and prints the median and max per group,
and the number of active alerts. "Before" is the rule files at git revision `--before-rev`
(the last commit before issue 18); "after" is what `rlhf-exporter render rules` writes now.
"""

from __future__ import annotations

import argparse
import re
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

from rlhf_exporter.render import rules  # noqa: E402
from rlhf_exporter.thresholds_file import load_thresholds  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

VERDICT_MIX = [("rollout", 29), ("update", 29), ("sync", 14), ("other", 14), ("logprob", 7)]
VERDICT_MIX += [("reward", 7)]
GROUPS = ["rollout", "reward", "logprob", "update", "sync", "checkpoint", "other"]
REASON = {
    "rollout": "long_tail",
    "update": "low_mfu",
    "sync": "weight_sync",
    "other": "untimed",
    "logprob": "low_mfu",
    "reward": "reward_model",
}
LONG = 405  # minutes of history for the series read over 6 h
SHORT = 45  # minutes for the others
EVENT = 60  # the movers moved, and the costly jobs slowed down, this many minutes ago


def verdict_of(i: int) -> str:
    k = i % 100
    for v, n in VERDICT_MIX:
        if k < n:
            return v
        k -= n
    return "rollout"


def job_kind(i: int) -> str:
    return "moved" if i % 100 == 50 else "costs" if i % 100 == 51 else "steady"


def openmetrics(path: Path, exposition: Path, jobs: int, now_min: int) -> int:
    """Writes the synthetic fleet's history to `path` (OpenMetrics, for backfilling) and its
    last values to `exposition` (text format, for scraping); returns the number of samples."""
    first_long, first_short, last = now_min - LONG, now_min - SHORT, now_min
    by_metric: dict[str, list[tuple[str, list[tuple[int, float]]]]] = {}

    def add(metric: str, labels: str, start: int, value) -> None:
        pts = [(m, value(m)) for m in range(start, last + 1)]
        by_metric.setdefault(metric, []).append((labels, pts))

    def job(i: int) -> None:
        x = verdict_of(i)
        kind = job_kind(i)
        y = "update" if x != "update" else "rollout"
        event = now_min - EVENT
        lab = f'job="rlhf-exporter",instance="exporter-{i % 10}:9400",project="team{i % 20}",experiment="exp{i}"'

        def steps_of(m: int) -> float:
            return float(m - first_long)

        def verdict_steps(v: str):
            def f(m: int) -> float:
                n = steps_of(m)
                if kind == "moved":
                    before = min(n, event - first_long)
                    after = n - before
                    return 0.9 * (before if v == y else after if v == x else 0) + (
                        0.1 * n if v == "balanced" else 0
                    )
                return 0.9 * n if v == x else 0.1 * n if v == "balanced" else 0.0

            return f

        verdicts = [x, "balanced"] + ([y] if kind == "moved" else [])
        for v in verdicts:
            add("rlhf_bottleneck_steps_total", f'{lab},verdict="{v}"', first_long, verdict_steps(v))

        def tokens(m: int) -> float:
            n = steps_of(m)
            if kind == "costs" and m > event:
                return 60000 * (event - first_long) + 39000 * (m - event)
            return 60000 * n

        add("rlhf_tokens_total", lab, first_long, tokens)
        add("rlhf_step_seconds_total", lab, first_long, lambda m: 60.0 * steps_of(m))
        add("rlhf_baseline_tokens_per_second", lab, first_long, lambda m: 1000.0)
        add("rlhf_steps_total", lab, first_short, lambda m: steps_of(m))
        add("rlhf_last_step_timestamp_seconds", lab, first_short, lambda m: 60.0 * m)
        add("rlhf_baseline_step_duration_seconds", lab, first_short, lambda m: 60.0)
        for g in GROUPS:
            share = 0.5 if g == x else 0.02 if g == "checkpoint" else 0.1
            add(
                "rlhf_group_seconds_total",
                f'{lab},group="{g}"',
                first_short,
                lambda m, s=share: 60 * s * steps_of(m),
            )
        add("rlhf_untimed_seconds_total", lab, first_short, lambda m: 3.0 * steps_of(m))
        for v in verdicts:
            if v in REASON:
                add(
                    "rlhf_bottleneck_reason_steps_total",
                    f'{lab},verdict="{v}",reason="{REASON[v]}"',
                    first_short,
                    verdict_steps(v),
                )
        add("rlhf_change_steps_total", f'{lab},kind="none"', first_short, steps_of)
        add("rlhf_change_steps_total", f'{lab},kind="workload_shift"', first_short, lambda m: 0.0)
        add("rlhf_regression_steps_total", f'{lab},group="{x}"', first_short, lambda m: 0.0)
        for stage in ("actor", "actor_infer"):
            add("rlhf_mfu_ratio", f'{lab},stage="{stage}"', first_short, lambda m: 0.2)
        for stat, val in (("max", 30.0), ("mean", 10.0)):
            add(
                "rlhf_agent_loop_seconds",
                f'{lab},part="generate_sequences",stat="{stat}"',
                first_short,
                lambda m, val=val: val,
            )
        add("rlhf_agent_loop_preempted_max", lab, first_short, lambda m: 0.0)
        # What the current rules' reference records would hold after hours of evaluation.
        ref = "project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate6h"
        for v in verdicts:
            shares = {x: 0.9, "balanced": 0.1} if kind != "moved" else {y: 0.85, x: 0.05}
            shares.setdefault("balanced", 0.1)
            value = shares.get(v, 0.0)
            add(ref, f'{lab},verdict="{v}"', first_short, lambda m, s=value: s)
        add(
            "project_experiment:rlhf_tokens_per_step_second:ratio_rate6h",
            lab,
            first_short,
            lambda m: 1000.0,
        )

    for i in range(jobs):
        job(i)

    for e in range(10):
        lab = f'job="rlhf-exporter",instance="exporter-{e}:9400"'
        add("up", lab, first_short, lambda m: 1.0)
        for g in range(8):
            add(
                "rlhf_gpu_busy_seconds_total",
                f'{lab},gpu="{g}",uuid="GPU-{e}-{g}"',
                first_short,
                lambda m: 50.0 * (m - first_short),
            )
    n = 0
    with path.open("w") as f, exposition.open("w") as out:
        for metric, series in by_metric.items():
            for labels, pts in series:
                f.write("".join(f"{metric}{{{labels}}} {v:g} {m * 60}\n" for m, v in pts))
                n += len(pts)
                if ":" not in metric:  # recording rules' series are not scraped
                    out.write(f"{metric}{{{labels}}} {pts[-1][1]:g}\n")
        f.write("# EOF\n")
    return n


def rule_files_before(rev: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rel in (rules.RECORDING_FILE, rules.DECISION_FILE, rules.OPERATIONS_FILE):
        text = subprocess.run(
            ["git", "show", f"{rev}:{rel}"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        path = out / Path(rel).name
        path.write_text(text)
        paths.append(path)
    return paths


def rule_files_after(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rel, text in rules.rule_files(load_thresholds(None)).items():
        path = out / Path(rel).name
        path.write_text(text)
        paths.append(path)
    return paths


def measure(
    name: str, blocks: Path, rule_paths: list[Path], seconds: float, work: Path, target: str
) -> dict:
    data = work / f"data-{name}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(blocks, data)
    cfg = work / f"prometheus-{name}.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "global": {"evaluation_interval": "10s", "scrape_interval": "15s"},
                "rule_files": [str(p) for p in rule_paths],
                "scrape_configs": [
                    {
                        "job_name": "fleet",
                        "honor_labels": True,
                        "metrics_path": "/fleet.prom",
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / f"prometheus-{name}.log").open("w")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    durations: dict[str, list[float]] = {}
    seen: dict[str, float] = {}
    alerts = 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/-/ready", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            text = requests.get(url + "/metrics", timeout=10).text
            last = {
                m[1]: float(m[2])
                for m in re.finditer(
                    r'prometheus_rule_group_last_evaluation_timestamp_seconds\{rule_group="[^"]*;([^"]+)"\} (\S+)',
                    text,
                )
            }
            for m in re.finditer(
                r'prometheus_rule_group_last_duration_seconds\{rule_group="[^"]*;([^"]+)"\} (\S+)',
                text,
            ):
                group, value = m[1], float(m[2])
                if last.get(group, 0) > 0 and last[group] != seen.get(group):
                    seen[group] = last[group]
                    durations.setdefault(group, []).append(value)
            time.sleep(2)
        per_rule: dict[str, float] = {}
        for group in requests.get(url + "/api/v1/rules", timeout=30).json()["data"]["groups"]:
            for rule in group["rules"]:
                per_rule[rule["name"]] = rule.get("evaluationTime", 0.0)
        body = requests.get(url + "/api/v1/alerts", timeout=30).json()
        alerts = len(body["data"]["alerts"])
        bound = sum(
            1
            for a in body["data"]["alerts"]
            if a["labels"].get("alertname") in rules.BOUND_ALERTS.values()
        )
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return {"durations": durations, "alerts": alerts, "bound": bound, "rules": per_rule}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--before-rev", default="68a0298")
    ap.add_argument("--seconds", type=float, default=45, help="per round and rule set")
    ap.add_argument("--rounds", type=int, default=2, help="before/after runs, interleaved")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rules-"))
    try:
        now_min = int(time.time() // 60)
        t0 = time.monotonic()
        om = work / "fleet.om"
        n = openmetrics(om, work / "fleet.prom", args.jobs, now_min)
        print(f"{args.jobs} jobs: {n:,} samples written in {time.monotonic() - t0:.0f} s")
        blocks = work / "blocks"
        t0 = time.monotonic()
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)],
            check=True,
            capture_output=True,
        )
        om.unlink()
        print(f"backfilled in {time.monotonic() - t0:.0f} s")
        sets = {
            "before": rule_files_before(args.before_rev, work / "before"),
            "after": rule_files_after(work / "after"),
        }
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        results: dict[str, dict] = {}
        try:
            for _ in range(args.rounds):
                for name in ("before", "after"):
                    r = measure(name, blocks, sets[name], args.seconds, work, f"127.0.0.1:{port}")
                    print(f"{name}: {r['alerts']} active alerts, {r['bound']} of them bound alerts")
                    into = results.setdefault(name, {"durations": {}, "rules": {}})
                    for rule, secs in r["rules"].items():
                        into["rules"].setdefault(rule, []).append(secs)
                    for g, d in r["durations"].items():
                        into["durations"].setdefault(g, []).extend(d)
        finally:
            server.terminate()
            server.wait(10)
        groups = sorted({g for r in results.values() for g in r["durations"]})
        print(f"\n{'rule group':<32} {'before median/max (s)':>24} {'after median/max (s)':>24}")
        for g in groups:
            cells = []
            for name in ("before", "after"):
                d = results[name]["durations"].get(g, [])
                cells.append(
                    f"{statistics.median(d):.4f} / {max(d):.4f} (n={len(d)})" if d else "n/a"
                )
            print(f"{g:<32} {cells[0]:>24} {cells[1]:>24}")
        for name in ("before", "after"):
            top = sorted(results[name]["rules"].items(), key=lambda kv: -statistics.median(kv[1]))[
                :6
            ]
            print(f"\n{name}: slowest rules (last evaluation, median over rounds)")
            for rule, secs in top:
                print(f"  {statistics.median(secs):.4f} s  {rule}")
        print()
        dec = "rlhf-exporter.decision-table"
        rec = "rlhf-exporter.recording"
        for name in ("before", "after"):
            d = results[name]["durations"]
            if d.get(dec) and d.get(rec):
                ratio = statistics.median(d[dec]) / statistics.median(d[rec])
                print(f"{name}: decision-table / recording = {ratio:.2f}")
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
