"""The alert and recording rules: generated, current, valid, and tested with promtool.

`promtool test rules` runs each case below against the rules of `rlhf_exporter.render.rules`: at
least one firing and one not-firing case per alert, and the guards of issue 6. The logic
cases use copies of the rules without annotations (promtool compares annotations exactly);
the template cases check the full annotations of the committed files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlhf_exporter.diagnosis import GROUPS
from rlhf_exporter.metrics.catalog import NAMES
from rlhf_exporter.render import repo_root, rules, stale
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.prometheus import binary
from tests.support.promtool import run_rule_tests, without_annotations

pytestmark = pytest.mark.prometheus

REPO = repo_root()
RULE_FILES = [REPO / rules.RECORDING_FILE, REPO / rules.DECISION_FILE, REPO / rules.OPERATIONS_FILE]
AM_EXAMPLE = REPO / "alerts" / "alertmanager.example.yaml"

TARGET = {"job": "rlhf-exporter", "instance": "e:9"}
JOB = {**TARGET, "project": "p", "experiment": "e"}


# ------------------------------------------------------------------------------------------
# generation


def test_render_check_fails_on_a_stale_file(tmp_path, thresholds):
    files = rules.targets(thresholds)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert stale(tmp_path, files) == []
    path = tmp_path / rules.DECISION_FILE
    path.write_text(path.read_text().replace(">= 0.7", ">= 0.6"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhf_exporter",
            "render",
            "rules",
            "--check",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert rules.DECISION_FILE in out.stderr


def test_thresholds_come_from_the_thresholds_file(tmp_path):
    from rlhf_exporter.thresholds_file import load_thresholds

    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        "alerts:\n  bound_fraction: 0.55\n  window: 1h\n  stall_min: 20m\n"
        "reason:\n  mfu_compute_bound: 0.4\n"
    )
    th = load_thresholds(cfg)
    text = "".join(rules.rule_files(th).values())
    assert 'ratio_rate1h{verdict="rollout"} >= 0.55' in text
    assert "increase(rlhf_bottleneck_steps_total[1h])" in text
    assert ", 1200)" in text  # stall_min in seconds
    assert "compute-bound at >= 40%" in text
    assert "ratio_rate30m" not in text


def test_scale_shrinks_windows_and_for(thresholds):
    groups = rules.rule_groups(thresholds, scale=0.01)
    text = yaml.safe_dump(groups)
    assert "[18s]" in text and "[30m]" not in text
    decision = groups[rules.DECISION_FILE][0]["rules"]
    bound = next(r for r in decision if r["alert"] == "RLHFJobRolloutBound")
    assert bound["for"] == "9s"
    stalled = next(
        r for r in groups[rules.OPERATIONS_FILE][0]["rules"] if r["alert"] == "RLHFJobStalled"
    )
    assert stalled["for"] == "1200ms"
    budget = next(
        r
        for g in groups[rules.RECORDING_FILE]
        for r in g["rules"]
        if r.get("record") == "project_experiment:rlhf_job_stall_budget:ratio"
    )
    assert "clamp_min(0.03 * rlhf_baseline_step_duration_seconds, 6)" in budget["expr"]
    assert "project_experiment:rlhf_job_stall_budget:ratio" in stalled["expr"]


def test_durations():
    assert rules.duration(600) == "10m" and rules.duration(5400) == "90m"
    assert rules.duration(7200) == "2h" and rules.duration(1.5) == "1500ms"
    assert rules.duration(0) == "0s" and rules.seconds("6h") == 21600


def all_rules() -> list[dict]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


def test_every_alert_carries_severity_for_summary_description_and_runbook():
    runbooks = (REPO / rules.RUNBOOKS_FILE).read_text()
    alerts = [r for r in all_rules() if "alert" in r]
    assert len(alerts) == len({r["alert"] for r in alerts}) >= 17
    for r in alerts:
        assert r["labels"]["severity"] in rules.SEVERITIES, r["alert"]
        assert "for" in r, r["alert"]
        ann = r["annotations"]
        assert ann["summary"], r["alert"]
        if r["alert"] in ("RLHFJobFailed", "RLHFJobUnwatched"):  # a state: its value is 1
            assert "$labels" in ann["description"] and "query" in ann["description"]
        elif r["alert"] != "RLHFExporterAbsent":  # absent() has no labels and no value
            assert "$labels" in ann["description"] and "$value" in ann["description"], r["alert"]
        url = ann["runbook_url"]
        assert url.endswith("#" + r["alert"].lower())
        section = f"\n## {r['alert']}\n"
        assert section in runbooks, r["alert"]
        body = runbooks.split(section, 1)[1].split("\n## ", 1)[0]
        for part in ("**Meaning.**", "**Confirm.**", "**What to change.**", "```promql"):
            assert part in body, (r["alert"], part)
    severities = {r["alert"]: r["labels"]["severity"] for r in alerts}
    assert (
        severities["RLHFJobStalled"] == "critical" and severities["RLHFRayActorsDied"] == "critical"
    )
    critical = [a for a, s in severities.items() if s == "critical"]
    assert critical == ["RLHFJobStalled", "RLHFJobFailed", "RLHFJobUnwatched", "RLHFRayActorsDied"]
    for name in critical:  # what a page costs, what to do now, whom to call (issue 22)
        body = runbooks.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Impact.**", "**Immediate mitigation.**", "**Escalation.**"):
            assert part in body, (name, part)


def test_every_job_alert_links_to_the_job_dashboard_with_its_variables():
    """A job alert (its expression keeps project and experiment) carries `dashboard_url`:
    the configured Grafana, the job dashboard's uid, and one `var-` per dashboard variable
    the alert can fill; a job-less alert carries none."""
    job = json.loads((REPO / "grafana" / "rlhf-job.json").read_text())
    names = {v["name"] for v in job["templating"]["list"]}
    base = load_thresholds().alerts["dashboard_url"].rstrip("/")
    shipped = []
    for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            shipped += [r for r in group["rules"] if "alert" in r]
    per_job = {r["alert"]: r["annotations"].get("dashboard_url") for r in shipped}
    job_alerts = {a for a in per_job if a.startswith("RLHFJob")} | {
        "RLHFTrainerStarved",
        "RLHFRolloutOverprovisioned",
    }
    assert {a for a, url in per_job.items() if url} >= job_alerts
    for alert, url in per_job.items():
        if url is None:
            assert alert.startswith(("RLHFExporter", "RLHFRay", "RLHFGPUs", "RLHFRemoteWrite")), (
                alert
            )
            continue
        assert url.startswith(f"{base}/d/{job['uid']}/"), url
        assert set(re.findall(r"var-(\w+)=", url)) <= names
        assert {"project", "experiment"} <= set(re.findall(r"var-(\w+)=", url))


def test_promtool_dashboard_url_escapes_the_labels(tmp_path, thresholds):
    """The URL Prometheus expands: labels query-escaped, cluster and namespace only when the
    alert has them."""
    url = rules.dashboard_url(rules.Context(thresholds))
    labelled = 'label_replace(vector(1), "project", "a b&c", "", "")'
    expr = f'label_replace({labelled}, "experiment", "e/1", "", "")'
    rule_file = tmp_path / "url.yaml"
    rule_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "u",
                        "rules": [
                            {"alert": "U", "expr": expr, "annotations": {"dashboard_url": url}},
                            {
                                "alert": "N",
                                "expr": f'label_replace({expr}, "namespace", "ns", "", "")',
                                "annotations": {"dashboard_url": url},
                            },
                        ],
                    }
                ]
            }
        )
    )
    base = thresholds.alerts["dashboard_url"].rstrip("/") + "/d/rlhf-job/rlhf-job?"
    labels = {"project": "a b&c", "experiment": "e/1"}
    query = "var-project=a+b%26c&var-experiment=e%2F1"
    run_promtool_tests(
        tmp_path,
        [rule_file],
        [
            {
                "interval": "1m",
                "input_series": [],
                "alert_rule_test": [
                    {
                        "eval_time": "1m",
                        "alertname": "U",
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": {"dashboard_url": base + query},
                            }
                        ],
                    },
                    {
                        "eval_time": "1m",
                        "alertname": "N",
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, "namespace": "ns"},
                                "exp_annotations": {
                                    "dashboard_url": base + query + "&var-namespace=ns"
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    )


def test_one_bound_alert_per_decision_table_row_and_none_for_checkpoint():
    names = {r["alert"]: r for r in all_rules() if "alert" in r}
    for verdict, name in rules.BOUND_ALERTS.items():
        assert f'{{verdict="{verdict}"}}' in names[name]["expr"]
    assert set(rules.BOUND_ALERTS) == set(GROUPS) - {"checkpoint"}
    assert not any('"checkpoint"' in r["expr"] or '"balanced"' in r["expr"] for r in names.values())


def test_runbooks_reuse_the_advice_texts_and_name_verl_keys():
    from rlhf_exporter.diagnosis.advice import LOOK_AT

    text = (REPO / rules.RUNBOOKS_FILE).read_text()
    for (verdict, _), look in LOOK_AT.items():
        if verdict != "checkpoint":
            assert look in text
    for key in (
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.nccl_timeout",
    ):
        assert key in text


def test_runbooks_say_what_the_log_cannot_show():
    from rlhf_exporter.diagnosis.advice import EVIDENCE_CAVEATS

    text = (REPO / rules.RUNBOOKS_FILE).read_text()

    def section(alert):
        return text.split(f"\n## {alert}\n", 1)[1].split("\n## ", 1)[0]

    rollout, logprob = section("RLHFJobRolloutBound"), section("RLHFJobLogprobBound")
    assert EVIDENCE_CAVEATS["v1_rollout_reasons"] in rollout  # V1: no agent_loop/*
    assert EVIDENCE_CAVEATS["fully_async_idle_ratio"] in rollout  # verl #6693
    assert EVIDENCE_CAVEATS["v1_logprob_mfu"] in logprob  # V1: no perf/mfu/actor_infer
    assert "What the log cannot show" not in section("RLHFJobSyncBound")
    # -1 preemptions (every engine verl pins): named where a rollout step is read
    assert EVIDENCE_CAVEATS["unreported_preemptions"] in rollout
    assert "-1" in EVIDENCE_CAVEATS["unreported_preemptions"]


def test_runbooks_name_the_legacy_reward_key_trap_where_reward_dominates():
    from rlhf_exporter.diagnosis.advice import CONFIG_TRAPS

    text = (REPO / rules.RUNBOOKS_FILE).read_text()
    trap = CONFIG_TRAPS["legacy_reward_keys"]

    def section(alert):
        return text.split(f"\n## {alert}\n", 1)[1].split("\n## ", 1)[0]

    change = section("RLHFJobRewardBound").split("**What to change.**", 1)[1]
    assert trap in change
    assert trap in section("RLHFJobRolloutBound")  # reward_in_loop: the reward function
    assert trap not in section("RLHFJobUpdateBound")
    for key in ("fully_async_main.py", "0.9.1", "main_ppo", "one-step-off", "reward.num_workers"):
        assert key in trap


def test_rules_use_only_catalog_metrics_and_their_own_records():
    records = {r["record"] for r in all_rules() if "record" in r}
    for r in all_rules():
        for name in re.findall(r"(?<![:\w])(rlhf_[a-z_]+)(?![:\w])", r["expr"]):
            assert name in NAMES, (name, r.get("alert") or r.get("record"))
        for name in re.findall(r"\b([a-z_]+:[a-z_]+:[a-z_0-9]+)\b", r["expr"]):
            assert name in records, name
    for rec in records:
        assert re.fullmatch(r"[a-z_]+:rlhf_[a-z_]+:[a-z_0-9]+", rec), rec


def test_promtool_check_rules_lint_all():
    out = subprocess.run(
        [binary("promtool"), "check", "rules", "--lint=all", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(RULE_FILES)


# ------------------------------------------------------------------------------------------
# promtool test rules


def series(metric: str, values: str, labels: dict | None = None, **extra: str) -> dict:
    lab = {**(JOB if labels is None else labels), **extra}
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in lab.items()) + "}",
        "values": values,
    }


def alert(
    name: str, severity: str, category: str, labels: dict | None = None, **extra: str
) -> dict:
    return {
        "exp_labels": {
            "severity": severity,
            "category": category,
            **(JOB if labels is None else labels),
            **extra,
        }
    }


def state_series(state: str, values: str, others: str | None = None, labels: dict | None = None):
    """rlhf_job_state one-hot: `state` takes `values`, the other states `others` (default:
    0 wherever `values` has a sample)."""
    zero = others or re.sub(r"\d+(\.\d+)?(?=x|$| )", "0", values)
    return [
        series("rlhf_job_state", values if s == state else zero, labels, state=s)
        for s in ("running", "finished", "failed", "unknown")
    ]


def case(at: str, name: str, *expected: dict) -> dict:
    return {"eval_time": at, "alertname": name, "exp_alerts": list(expected)}


BOUND = rules.BOUND_ALERTS


def bound_firing(verdict: str, experiment: str = "e") -> dict:
    return alert(
        BOUND[verdict], "info", "bottleneck", {**JOB, "experiment": experiment}, verdict=verdict
    )


def steps(**per_minute: float) -> list[dict]:
    """Verdict step counters growing by `per_minute[verdict]` each minute for 60 minutes."""
    return [
        series("rlhf_bottleneck_steps_total", f"0+{n:g}x60", verdict=v)
        for v, n in per_minute.items()
    ]


# The bound alerts' day (issue 18): for each verdict X, five jobs over 24 h, all of them
# X-bound (>= 70% of their steps) for most of the day. At CHANGE (8 h) one thing happens:
# - steady: nothing (24 h flat throughput): quiet;
# - moved: it was Y-bound until CHANGE, then X-bound: fires once, naming both, then the new
#   verdict fills the 6 h reference and it resolves;
# - costs: its tokens per second of step time drop to 70% of the reference: fires, then
#   resolves once the reference holds the new level;
# - shift: twice the tokens per step at the same cost per token (steps take twice as long,
#   tokens per second of step time hold), the first 10 steps labelled workload_shift: quiet;
# - for rollout only, from_balanced: balanced until CHANGE, then rollout-bound: fires.
DAY = 1440  # minutes
CHANGE = 480
KINDS = ("steady", "moved", "costs", "shift")


def _before(verdict: str) -> str:
    """The verdict the moved job had before CHANGE."""
    order = list(BOUND)
    return order[order.index(verdict) - 1]


def _counter(before: float, after: float) -> str:
    """A counter growing `before` per minute until CHANGE, then `after` per minute, to DAY."""
    at = before * CHANGE
    return f"0+{before:g}x{CHANGE} {at + after:g}+{after:g}x{DAY - CHANGE - 1}"


def day_job(verdict: str, kind: str, experiment: str = "") -> list[dict]:
    labels = {**JOB, "experiment": experiment or f"{verdict}-{kind}"}

    def s(metric: str, values: str, **extra: str) -> dict:
        return series(metric, values, labels, **extra)

    tokens, step_s = _counter(60000, 60000), _counter(60, 60)  # 1,000 tokens/s of step time
    out = [s("rlhf_change_steps_total", _counter(10, 10), kind="steady")]
    if kind == "steady":
        out += [
            s("rlhf_bottleneck_steps_total", _counter(9, 9), verdict=verdict),
            s("rlhf_bottleneck_steps_total", _counter(1, 1), verdict="balanced"),
        ]
    elif kind == "moved":
        out += [
            s("rlhf_bottleneck_steps_total", _counter(9, 0), verdict=_before(verdict)),
            s("rlhf_bottleneck_steps_total", _counter(0, 9), verdict=verdict),
            s("rlhf_bottleneck_steps_total", _counter(1, 1), verdict="balanced"),
        ]
    elif kind == "from_balanced":
        out += [
            s("rlhf_bottleneck_steps_total", _counter(10, 1), verdict="balanced"),
            s("rlhf_bottleneck_steps_total", _counter(0, 9), verdict=verdict),
        ]
    elif kind == "costs":
        out += [
            s("rlhf_bottleneck_steps_total", _counter(9, 9), verdict=verdict),
            s("rlhf_bottleneck_steps_total", _counter(1, 1), verdict="balanced"),
        ]
        tokens = _counter(60000, 42000)  # 700 tokens/s of step time
    elif kind == "shift":
        out += [
            s("rlhf_bottleneck_steps_total", _counter(9, 4.5), verdict=verdict),
            s("rlhf_bottleneck_steps_total", _counter(1, 0.5), verdict="balanced"),
            s(
                "rlhf_change_steps_total",
                f"0x{CHANGE} 1+1x9 10x{DAY - CHANGE - 10}",
                kind="workload_shift",
            ),
        ]
    return out + [s("rlhf_tokens_total", tokens), s("rlhf_step_seconds_total", step_s)]


def day_jobs() -> list[tuple[str, str]]:
    return [(v, k) for v in BOUND for k in KINDS] + [("rollout", "from_balanced")]


def bound_day_case() -> dict:
    """One promtool test: every job of the day together, checked at each milestone."""
    inputs = [s for v, k in day_jobs() for s in day_job(v, k)]
    firing = {v: [] for v in BOUND}
    for v, k in day_jobs():
        if k in ("moved", "costs", "from_balanced"):
            firing[v].append(bound_firing(v, f"{v}-{k}"))
    cases = []
    for verdict in BOUND:
        cases += [
            case(f"{CHANGE - 30}m", BOUND[verdict]),  # 7.5 h steady: quiet
            case(f"{CHANGE + 20}m", BOUND[verdict]),  # still pending
            case(f"{CHANGE + 50}m", BOUND[verdict], *firing[verdict]),
            case(f"{CHANGE + 240}m", BOUND[verdict]),  # the new state is the reference now
            case(f"{DAY}m", BOUND[verdict]),
        ]
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": cases}


def logic_cases() -> list[dict]:
    tests = [bound_day_case()]
    # Guard: checkpoint steps never fire a bound alert, and do not count as a verdict before.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_bottleneck_steps_total", "0+10x400 4000x400", verdict="checkpoint"),
                series("rlhf_bottleneck_steps_total", "0x400 0+9x400", verdict="update"),
                series("rlhf_bottleneck_steps_total", "0x400 0+1x400", verdict="balanced"),
            ],
            "alert_rule_test": [case("450m", BOUND[v]) for v in BOUND],
        }
    )
    # Guard: a reference window with fewer than bound_reference_min_steps (10) steps does not
    # count. A slow job (a step every 5 minutes) makes 8 rollout-bound steps, then update-bound
    # ones: its 8-step start would read as "was rollout-bound" for 25 minutes; counted from
    # the 10th step it lasts 10 minutes, under bound_for: quiet.
    rollout = [min(m // 5, 8) for m in range(121)]
    update = [max(0, m // 5 - 8) for m in range(121)]
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_bottleneck_steps_total", " ".join(map(str, rollout)), verdict="rollout"
                ),
                series("rlhf_bottleneck_steps_total", " ".join(map(str, update)), verdict="update"),
            ],
            "alert_rule_test": [case(f"{m}m", BOUND["update"]) for m in (75, 85, 90, 100)],
        }
    )
    # Guard: a balanced job fires no bound alert.
    tests.append(
        {
            "interval": "1m",
            "input_series": steps(balanced=10, unknown=1),
            "alert_rule_test": [case("50m", BOUND[v]) for v in BOUND],
        }
    )

    # Regression: 5 steps regressed update, then it became the new normal.
    reg = "0x10 1+1x4 5x40"
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_regression_steps_total", reg, group="update"),
                series("rlhf_regression_steps_total", "0x55", group="rollout"),
                series("rlhf_change_steps_total", "0x10 1+1x4 5x40", kind="regression"),
            ],
            "alert_rule_test": [
                case(
                    "30m",
                    "RLHFJobRegression",
                    alert("RLHFJobRegression", "warning", "regression", group="update"),
                ),
                case("14m", "RLHFJobRegression"),  # pending
                case("55m", "RLHFJobRegression"),  # out of the window: the new normal
            ],
        }
    )
    # Guard: a workload shift never fires the regression alert.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_regression_steps_total", "0x55", group="update"),
                series("rlhf_change_steps_total", "0x10 1+1x20 21x20", kind="workload_shift"),
                series("rlhf_change_steps_total", "0+1x55", kind="steady"),
            ],
            "alert_rule_test": [case("30m", "RLHFJobRegression")],
        }
    )
    # A single slow step is not sustained.
    tests.append(
        {
            "interval": "1m",
            "input_series": [series("rlhf_regression_steps_total", "0x10 1x40", group="sync")],
            "alert_rule_test": [case("30m", "RLHFJobRegression")],
        }
    )

    # Throughput: 1000 tokens/s of step time, then 333 from minute 60.
    tok_drop = "0+60000x60 3620000+20000x100"
    step_s = "0+60x160"
    base = "1000x60 400x100"
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_tokens_total", tok_drop),
                series("rlhf_step_seconds_total", step_s),
                series("rlhf_baseline_tokens_per_second", base),
                series("rlhf_change_steps_total", "0x160", kind="workload_shift"),
            ],
            "alert_rule_test": [
                case(
                    "120m",
                    "RLHFJobThroughputBelowBaseline",
                    alert("RLHFJobThroughputBelowBaseline", "warning", "throughput"),
                ),
                case("55m", "RLHFJobThroughputBelowBaseline"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # the same drop during a workload shift
                series("rlhf_tokens_total", tok_drop),
                series("rlhf_step_seconds_total", step_s),
                series("rlhf_baseline_tokens_per_second", base),
                series("rlhf_change_steps_total", "0x60 1+1x100", kind="workload_shift"),
            ],
            "alert_rule_test": [case("120m", "RLHFJobThroughputBelowBaseline")],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # the same drop, a workload shift of 10 steps at its start: the
                # window holds no shift at 120m, but the best-baseline reference restarted
                series("rlhf_tokens_total", tok_drop),
                series("rlhf_step_seconds_total", step_s),
                series("rlhf_baseline_tokens_per_second", base),
                series("rlhf_change_steps_total", "0x60 1+1x9 10x90", kind="workload_shift"),
            ],
            "alert_rule_test": [
                case(f"{m}m", "RLHFJobThroughputBelowBaseline") for m in (120, 159)
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # steady
                series("rlhf_tokens_total", "0+60000x160"),
                series("rlhf_step_seconds_total", step_s),
                series("rlhf_baseline_tokens_per_second", "1000x160"),
            ],
            "alert_rule_test": [case("120m", "RLHFJobThroughputBelowBaseline")],
        }
    )

    # Stalled: steps every minute until minute 30, baseline step 60 s -> limit max(180 s, 10m).
    # The state comes from the exporter (rlhf_job_state) and the stall budget (issue 22).
    last = "0+60x30 1800x60"
    running = state_series("running", "1x90")
    stalled = alert("RLHFJobStalled", "critical", "job")
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_last_step_timestamp_seconds", last),
                series("rlhf_baseline_step_duration_seconds", "60x90"),
                *running,
            ],
            "alert_rule_test": [
                case("45m", "RLHFJobStalled", stalled),
                case("38m", "RLHFJobStalled"),
                case("25m", "RLHFJobStalled"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # long steps: 3 x 400 s = 20m
                series("rlhf_last_step_timestamp_seconds", last),
                series("rlhf_baseline_step_duration_seconds", "400x90"),
                *running,
            ],
            "alert_rule_test": [
                case("45m", "RLHFJobStalled"),
                case("55m", "RLHFJobStalled", stalled),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # no baseline yet: the 10m floor
                series("rlhf_last_step_timestamp_seconds", last),
                *running,
            ],
            "alert_rule_test": [case("45m", "RLHFJobStalled", stalled)],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # a 30-minute checkpoint seen before: the limit grows by it
                series("rlhf_last_step_timestamp_seconds", last),
                series("rlhf_between_steps_max_seconds", "1800x90"),
                *running,
            ],
            "alert_rule_test": [
                case("45m", "RLHFJobStalled"),
                case("75m", "RLHFJobStalled", stalled),
            ],
        }
    )
    # A finished job raises nothing, whether still exported or gone (its last state).
    finished = state_series("finished", "0x30 1x20 stale", "1x30 0x20 stale")
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_last_step_timestamp_seconds", "0+60x30 1800x20 stale"),
                *finished,
            ],
            "alert_rule_test": [
                case(t, n)
                for t in ("45m", "80m", "200m")
                for n in ("RLHFJobStalled", "RLHFJobUnwatched", "RLHFJobFailed")
            ],
        }
    )
    # A failed job pages once, as RLHFJobFailed; RLHFJobStalled does not page for it.
    failed = alert("RLHFJobFailed", "critical", "job")
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_last_step_timestamp_seconds", last),
                *state_series("failed", "0x31 1x60", "1x31 0x60"),
            ],
            "alert_rule_test": [
                case("31m", "RLHFJobFailed"),  # failed from 32m; for 1m (+1m: group order)
                case("35m", "RLHFJobFailed", failed),
                case("80m", "RLHFJobFailed", failed),
                case("80m", "RLHFJobStalled"),
                case("20m", "RLHFJobFailed"),
            ],
        }
    )
    # Blindness never resolves a page. A real stall, then scrape failures (stale), then the
    # target vanishes: the stall page stays, and no second page (unwatched) comes.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_last_step_timestamp_seconds", "0+60x30 1800x15 stale _x5 1800x5 stale"
                ),
                *state_series("running", "1x45 stale _x5 1x5 stale", "0x45 stale _x5 0x5 stale"),
            ],
            "alert_rule_test": [
                case(t, "RLHFJobStalled", stalled) for t in ("45m", "48m", "58m", "120m", "300m")
            ]
            + [case(t, "RLHFJobUnwatched") for t in ("48m", "58m", "120m")]
            + [case("420m", "RLHFJobStalled")],  # blind_lookback (6h) after its last series
        }
    )
    # A job that was stepping when its exporter went blind pages once: unwatched, not stalled.
    unwatched = alert("RLHFJobUnwatched", "critical", "job")
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_last_step_timestamp_seconds", "0+60x30 stale"),
                *state_series("running", "1x30 stale", "0x30 stale"),
            ],
            "alert_rule_test": [
                case("33m", "RLHFJobUnwatched"),
                case("38m", "RLHFJobUnwatched", unwatched),  # stale from 31m; for 5m (+1m)
                case("100m", "RLHFJobUnwatched", unwatched),
                case("100m", "RLHFJobStalled"),
                case("20m", "RLHFJobUnwatched"),
            ],
        }
    )
    # ... but not when a new target (a replaced pod) exports the job.
    moved = {**JOB, "instance": "f:9"}
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_last_step_timestamp_seconds", "0+60x30 stale"),
                *state_series("running", "1x30 stale", "0x30 stale"),
                series("rlhf_last_step_timestamp_seconds", "_x31 1900+60x30", moved),
                *state_series("running", "_x31 1x30", "_x31 0x30", moved),
            ],
            "alert_rule_test": [
                case("40m", "RLHFJobUnwatched"),
                case("55m", "RLHFJobStalled"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [  # the exporter is down (up 0), its series stale: unwatched
                series("rlhf_last_step_timestamp_seconds", "0+60x30 stale"),
                *state_series("running", "1x30 stale", "0x30 stale"),
                series("up", "1x30 0x60", TARGET),
            ],
            "alert_rule_test": [case("40m", "RLHFJobUnwatched", unwatched)],
        }
    )

    # Ray actors died of a failure: a counter that appears at minute 10 with its first death.
    died = alert("RLHFRayActorsDied", "critical", "ray", TARGET, role="actor")
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_ray_actor_failures_total",
                    "_x9 1x50",
                    TARGET,
                    role="actor",
                    reason="OUT_OF_MEMORY",
                )
            ],
            "alert_rule_test": [
                case("11m", "RLHFRayActorsDied", died),
                case("5m", "RLHFRayActorsDied"),
                case("40m", "RLHFRayActorsDied"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_ray_actor_failures_total",
                    "0x20 2x30",
                    TARGET,
                    role="actor",
                    reason="NODE_DIED",
                ),
                series(
                    "rlhf_ray_actor_failures_total",
                    "3x50",
                    TARGET,
                    role="rollout",
                    reason="OUT_OF_MEMORY",
                ),
            ],
            "alert_rule_test": [
                case("25m", "RLHFRayActorsDied", died),
                case("45m", "RLHFRayActorsDied"),
            ],
        }
    )
    # A normal end (deaths counted, no failure) raises nothing; a failure of a job the
    # exporter knows failed or finished is RLHFJobFailed's (or nothing), not a second page.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_ray_actor_deaths_total",
                    "0x20 6x30",
                    TARGET,
                    role="trainer",
                    reason="OWNER_DIED",
                ),
                series(
                    "rlhf_ray_actor_failures_total",
                    "0x50",
                    TARGET,
                    role="trainer",
                    reason="WORKER_DIED",
                ),
                series(
                    "rlhf_ray_actor_failures_total",
                    "0x20 1x30",
                    TARGET,
                    role="rollout",
                    reason="WORKER_DIED",
                ),
                *state_series("failed", "0x20 1x30", "1x20 0x30"),
            ],
            "alert_rule_test": [case("22m", "RLHFRayActorsDied"), case("30m", "RLHFRayActorsDied")],
        }
    )

    # An old death's counter back after a 10-minute gap (the exporter was down): not new.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series(
                    "rlhf_ray_actor_failures_total",
                    "3x30 stale _x9 3x40",
                    TARGET,
                    role="actor",
                    reason="OUT_OF_MEMORY",
                )
            ],
            "alert_rule_test": [
                case("10m", "RLHFRayActorsDied", died),  # it appeared with its deaths
                case("42m", "RLHFRayActorsDied"),
                case("50m", "RLHFRayActorsDied"),
                case("60m", "RLHFRayActorsDied"),
            ],
        }
    )

    # Restarting.
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_ray_actor_restarts_total", "0x10 1x50", TARGET, role="rollout")
            ],
            "alert_rule_test": [
                case(
                    "12m",
                    "RLHFRayActorsRestarting",
                    alert("RLHFRayActorsRestarting", "warning", "ray", TARGET, role="rollout"),
                ),
                case("8m", "RLHFRayActorsRestarting"),
                case("40m", "RLHFRayActorsRestarting"),
            ],
        }
    )

    # Pending creation for 30m (longer than a cluster autoscaler takes).
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_ray_actors", "2x50", TARGET, role="actor", state="PENDING_CREATION"),
                series(
                    "rlhf_ray_actors", "3x25 0x25", TARGET, role="rollout", state="PENDING_CREATION"
                ),
            ],
            "alert_rule_test": [
                case(
                    "35m",
                    "RLHFRayActorsPending",
                    alert(
                        "RLHFRayActorsPending",
                        "warning",
                        "ray",
                        TARGET,
                        role="actor",
                        state="PENDING_CREATION",
                    ),
                ),
                case("25m", "RLHFRayActorsPending"),
            ],
        }
    )

    # GPUs idle while steps progress (busy 20% of the time). Multi-node (issue 23): the steps
    # come from the head sidecar (JOB, instance e:9), the GPUs from two worker sidecars (other
    # targets) whose GPU series carry the job's labels; no `on (job, instance)` join.
    def worker_gpus(busy: str, job: dict = JOB) -> list[dict]:
        return [
            series(
                "rlhf_gpu_busy_seconds_total",
                busy,
                {**job, "instance": f"w{node}:9", "pod": f"w{node}"},
                gpu=str(i),
                uuid=f"GPU-{node}-{i}",
            )
            for node in (1, 2)
            for i in (0, 1)
        ]

    gpus = worker_gpus("0+12x60")
    job_wide = {k: v for k, v in JOB.items() if k != "instance"}
    idle = alert("RLHFGPUsIdleWhileStepping", "warning", "gpu", job_wide)
    tests.append(
        {
            "interval": "1m",
            "input_series": gpus + [series("rlhf_steps_total", "0+1x60")],
            "alert_rule_test": [
                case("50m", "RLHFGPUsIdleWhileStepping", idle),
                case("10m", "RLHFGPUsIdleWhileStepping"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": gpus + [series("rlhf_steps_total", "5x60")],  # no steps
            "alert_rule_test": [case("50m", "RLHFGPUsIdleWhileStepping")],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": worker_gpus("0+54x60")  # busy
            + [series("rlhf_steps_total", "0+1x60")],
            "alert_rule_test": [case("50m", "RLHFGPUsIdleWhileStepping")],
        }
    )
    tests.append(  # one node busy (54/60), one idle (6/60): the job's mean 50%, quiet
        {
            "interval": "1m",
            "input_series": worker_gpus("0+54x60")[:2]
            + worker_gpus("0+6x60")[2:]
            + [series("rlhf_steps_total", "0+1x60")],
            "alert_rule_test": [case("50m", "RLHFGPUsIdleWhileStepping")],
        }
    )
    tests.append(  # another job's idle GPUs, or GPUs that know no job yet: never this job's
        {
            "interval": "1m",
            "input_series": worker_gpus("0+12x60", {**JOB, "experiment": "other"})
            + worker_gpus("0+12x60", TARGET)
            + [series("rlhf_steps_total", "0+1x60")],
            "alert_rule_test": [case("50m", "RLHFGPUsIdleWhileStepping")],
        }
    )

    # Collectors. Guard: a never-successful collector is down but not stale.
    coll = {**TARGET, "collector": "ray"}
    tests.append(
        {
            "interval": "1m",
            "input_series": [series("rlhf_exporter_collector_up", "0x40", coll)],
            "alert_rule_test": [
                case(
                    "6m",
                    "RLHFExporterCollectorDown",
                    alert("RLHFExporterCollectorDown", "warning", "exporter", coll),
                ),
                case("3m", "RLHFExporterCollectorDown"),
                case("30m", "RLHFExporterCollectorStale"),
            ],
        }
    )
    tests.append(  # up, but its poll stopped (a dead or hung poll thread): stale
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_exporter_collector_up", "1x50", coll),
                series(
                    "rlhf_exporter_collector_last_success_timestamp_seconds", "0+60x10 600x40", coll
                ),
            ],
            "alert_rule_test": [
                case(
                    "31m",
                    "RLHFExporterCollectorStale",
                    alert("RLHFExporterCollectorStale", "warning", "exporter", coll),
                ),
                case("28m", "RLHFExporterCollectorStale"),
            ],
        }
    )
    tests.append(  # a collector that reports its failure pages once: down, not also stale
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_exporter_collector_up", "1x10 0x40", coll),
                series(
                    "rlhf_exporter_collector_last_success_timestamp_seconds", "0+60x10 600x40", coll
                ),
            ],
            "alert_rule_test": [
                case("40m", "RLHFExporterCollectorStale"),
                case(
                    "40m",
                    "RLHFExporterCollectorDown",
                    alert("RLHFExporterCollectorDown", "warning", "exporter", coll),
                ),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("rlhf_exporter_collector_up", "1x40", coll),
                series("rlhf_exporter_collector_last_success_timestamp_seconds", "0+60x40", coll),
            ],
            "alert_rule_test": [
                case("30m", "RLHFExporterCollectorStale"),
                case("30m", "RLHFExporterCollectorDown"),
            ],
        }
    )

    # The exporter: down, absent.
    tests.append(
        {
            "interval": "1m",
            "input_series": [series("up", "0x10", TARGET)],
            "alert_rule_test": [
                case(
                    "6m",
                    "RLHFExporterDown",
                    alert("RLHFExporterDown", "warning", "exporter", TARGET),
                ),
                case("3m", "RLHFExporterDown"),
                case("6m", "RLHFExporterAbsent"),
            ],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [
                series("up", "1x10", TARGET),
                series("up", "1x10", {"job": "node", "instance": "n:1"}),
            ],
            "alert_rule_test": [case("6m", "RLHFExporterDown"), case("6m", "RLHFExporterAbsent")],
        }
    )
    tests.append(
        {
            "interval": "1m",
            "input_series": [series("up", "1x10", {"job": "node", "instance": "n:1"})],
            "alert_rule_test": [
                case(
                    "6m",
                    "RLHFExporterAbsent",
                    alert("RLHFExporterAbsent", "warning", "exporter", {}),
                ),
                case("3m", "RLHFExporterAbsent"),
            ],
        }
    )
    return tests


def run_promtool_tests(tmp_path: Path, rule_files: list[Path], tests: list[dict]) -> None:
    out = run_rule_tests(tmp_path, rule_files, tests)
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_not_firing_case():
    firing, quiet = set(), set()
    for t in logic_cases():
        for c in t["alert_rule_test"]:
            (firing if c["exp_alerts"] else quiet).add(c["alertname"])
    names = {r["alert"] for r in all_rules() if "alert" in r}
    assert firing == names, names - firing
    assert quiet == names, names - quiet


def test_promtool_logic(tmp_path, thresholds):
    files = without_annotations(tmp_path, rules.rule_groups(thresholds))
    run_promtool_tests(tmp_path, files, logic_cases())


def test_promtool_a_moved_bottleneck_names_both(tmp_path, thresholds):
    """Each bound alert's summary names the verdict now and the one before (the logic run
    above strips annotations; this one keeps the bound alerts' summaries)."""
    files = []
    for rel, groups in rules.rule_groups(thresholds).items():
        for g in groups:
            for r in g["rules"]:
                ann = r.pop("annotations", {})
                if r.get("alert") in BOUND.values():
                    r["annotations"] = {"summary": ann["summary"]}
        path = tmp_path / Path(rel).name
        path.write_text(yaml.safe_dump({"groups": groups}))
        files.append(path)
    jobs = [(v, "moved") for v in BOUND] + [("rollout", "from_balanced")]
    cases = []
    for verdict in BOUND:
        expected = []
        for v, kind in jobs:
            if v == verdict:
                was = "balanced" if kind == "from_balanced" else f"{_before(v)}-bound"
                expected.append(
                    {
                        **bound_firing(v, f"{v}-{kind}"),
                        "exp_annotations": {"summary": f"p/{v}-{kind} is {v}-bound, was {was}"},
                    }
                )
        cases.append(case(f"{CHANGE + 50}m", BOUND[verdict], *expected))
    test = {
        "interval": "1m",
        "input_series": [s for v, k in jobs for s in day_job(v, k)],
        "alert_rule_test": cases,
    }
    run_promtool_tests(tmp_path, files, [test])


JOB_DASHBOARD_URL = "http://grafana.example.com/d/rlhf-job/rlhf-job?var-project=p&var-experiment=e"
NO_STACKS_YET = (  # RLHFJobStalled's where_it_hangs without stacks (issue 39)
    "no stacks yet (taken through Ray's dashboard once the job passes its stall limit: see "
    "the job view)"
)


def test_promtool_annotations(tmp_path):
    """The committed files' templates, expanded by promtool: reasons, evidence, advice."""
    base = load_thresholds().alerts["runbook_url"] + "#"
    # rollout-bound all day; at CHANGE its throughput drops to 70%: the cost case.
    rollout = day_job("rollout", "costs", "e") + [
        series(
            "rlhf_bottleneck_reason_steps_total",
            _counter(8, 8),
            verdict="rollout",
            reason="long_tail",
        ),
        series(
            "rlhf_bottleneck_reason_steps_total",
            _counter(1, 1),
            verdict="rollout",
            reason="generation",
        ),
        series("rlhf_group_seconds_total", _counter(40, 40), group="rollout"),
        series("rlhf_group_seconds_total", _counter(10, 10), group="update"),
        series("rlhf_group_seconds_total", _counter(10, 10), group="other"),
        series("rlhf_agent_loop_seconds", f"30x{DAY}", part="generate_sequences", stat="max"),
        series("rlhf_agent_loop_seconds", f"10x{DAY}", part="generate_sequences", stat="mean"),
        series("rlhf_agent_loop_preempted_max", f"0x{DAY}"),
    ]
    rollout_ann = {
        "summary": "p/e is rollout-bound, at 71.19% of its reference throughput",
        "description": (
            "90% of the classified steps of p/e in the last 30m were rollout-bound: the trainer waits "
            "for rollout samples (gen).\n"
            "Not moved: no other verdict dominated the 6h before.\n"
            "Throughput: 700 tokens per second of step time over the last 30m, 71.19% of the 983.3 "
            "of the 6h before (costs when below 80%, unless a workload shift).\n"
            "Dominant reason: long_tail, in 88.89% of these steps: a few long samples hold the batch "
            "(max >> mean). Look next at: response length cap; partial rollout (fully-async only).\n"
            "Evidence: the rollout window took 66.67% of step time; agent-loop generate_sequences "
            "max/mean 3.0 (long tail at >= 2); most preemptions of one sample 0."
        ),
        "reason": "long_tail",
        "runbook_url": base + "rlhfjobrolloutbound",
        "dashboard_url": JOB_DASHBOARD_URL,
    }
    # rollout-bound until CHANGE, then update-bound (low MFU): the move case.
    update = day_job("update", "moved", "e") + [
        series(
            "rlhf_bottleneck_reason_steps_total", _counter(0, 9), verdict="update", reason="low_mfu"
        ),
        series("rlhf_mfu_ratio", f"0.14x{DAY}", stage="actor"),
    ]
    update_ann = {
        "summary": "p/e is update-bound, was logprob-bound",
        "description": (
            "90% of the classified steps of p/e in the last 30m were update-bound: the optimizer step "
            "(update_actor, update_critic).\n"
            "Moved: it is update-bound, was logprob-bound in 85% of its steps of the 6h before.\n"
            "Throughput: 1k tokens per second of step time over the last 30m, 100% of the 1k of "
            "the 6h before (costs when below 80%, unless a workload shift).\n"
            "Dominant reason: low_mfu, in 100% of these steps: MFU is low: the GPUs are under-used. "
            "Look next at: micro-batch size, dynamic bsz, offload (FSDP: fsdp_config.*_offload; "
            "Megatron: megatron.*_offload), communication.\n"
            "Evidence: the update window took n/a of step time; last step's MFU (perf/mfu/actor) 14% "
            "(compute-bound at >= 30%, 0 means unknown)."
        ),
        "reason": "low_mfu",
        "runbook_url": base + "rlhfjobupdatebound",
        "dashboard_url": JOB_DASHBOARD_URL,
    }
    # the exporter vanishes at 45m, while the job is stalled: the page keeps the budget it
    # had when last seen (140%, frozen: the value reads the same whichever rule group
    # promtool evaluates first)
    stall = [
        series("rlhf_last_step_timestamp_seconds", "0+60x30 1800x13 stale"),
        series("rlhf_baseline_step_duration_seconds", "60x44 stale"),
        *state_series("running", "1x44 stale"),
    ]
    stall_ann = {
        "summary": "p/e has made no step for 20m 0s",
        "description": (
            "No new step of p/e for 20m 0s: 140% of its stall limit (limit: max(3 x its "
            "baseline step time of 1m 0s, 10m) + its longest validation and checkpoint seen), "
            "seen by e:9 (last seen, if that exporter is down or gone). "
            "An NCCL hang ends in ActorDiedError only after "
            "the NCCL timeout (verl 0.8+: PyTorch's default; verl 0.6-0.7: "
            "actor_rollout_ref.nccl_timeout, 600 s). Where it hangs: " + NO_STACKS_YET + "."
        ),
        "where_it_hangs": NO_STACKS_YET,
        "runbook_url": base + "rlhfjobstalled",
        "dashboard_url": JOB_DASHBOARD_URL,
    }
    tests = [
        {
            "interval": "1m",
            "input_series": rollout,
            "alert_rule_test": [
                {
                    **case(f"{CHANGE + 50}m", BOUND["rollout"]),
                    "exp_alerts": [{**bound_firing("rollout"), "exp_annotations": rollout_ann}],
                }
            ],
        },
        {
            "interval": "1m",
            "input_series": update,
            "alert_rule_test": [
                {
                    **case(f"{CHANGE + 50}m", BOUND["update"]),
                    "exp_alerts": [{**bound_firing("update"), "exp_annotations": update_ann}],
                }
            ],
        },
        {
            "interval": "1m",
            "input_series": stall,
            "alert_rule_test": [
                {
                    **case("50m", "RLHFJobStalled"),
                    "exp_alerts": [
                        {**alert("RLHFJobStalled", "critical", "job"), "exp_annotations": stall_ann}
                    ],
                }
            ],
        },
    ]
    run_promtool_tests(tmp_path, RULE_FILES, tests)


# ------------------------------------------------------------------------------------------
# Alertmanager example


def test_amtool_check_config():
    out = subprocess.run(
        [binary("amtool"), "check-config", str(AM_EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "4 inhibit rules" in out.stdout


@pytest.mark.parametrize(
    "labels, receiver",
    [
        (["severity=critical", "alertname=RLHFJobStalled", "project=p", "experiment=e"], "pager"),
        (["severity=critical", "alertname=RLHFRayActorsDied", "role=actor"], "pager"),
        (["severity=warning", "alertname=RLHFJobRegression", "category=regression"], "chat"),
        (["severity=warning", "alertname=RLHFExporterDown", "category=exporter"], "chat"),
        (["severity=info", "alertname=RLHFJobRolloutBound", "category=bottleneck"], "team-chat"),
        (
            ["severity=info", "category=bottleneck", "team=alignment", "project=p", "experiment=e"],
            "team-alignment-chat",
        ),
        (["severity=info", "category=bottleneck", "team=reasoning"], "team-reasoning-chat"),
        (["severity=info", "category=bottleneck", "team=unknown-team"], "team-chat"),
        # a team label does not pull other alerts into the team's chat
        (["severity=warning", "category=regression", "team=alignment"], "chat"),
        (["severity=critical", "alertname=RLHFJobStalled", "team=alignment"], "pager"),
    ],
)
def test_amtool_routes(labels, receiver):
    out = subprocess.run(
        [
            binary("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={AM_EXAMPLE}",
            f"--verify.receivers={receiver}",
            *labels,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receiver


def test_alertmanager_example_inhibits_bound_alerts_of_a_stalled_job():
    config = yaml.safe_load(AM_EXAMPLE.read_text())
    rule = next(
        r
        for r in config["inhibit_rules"]
        if 'alertname=~"RLHFJobStalled|RLHFJobFailed"' in r["source_matchers"]
    )
    assert rule["equal"] == ["cluster", "namespace", "project", "experiment"]
    assert config["route"]["group_by"][:4] == ["cluster", "namespace", "project", "experiment"]
    for inhibit in config["inhibit_rules"]:  # never across clusters or namespaces (issue 22)
        assert inhibit["equal"][:2] == ["cluster", "namespace"], inhibit
    categories = {
        r["labels"]["category"]
        for r in all_rules()
        if "alert" in r and r["alert"] in BOUND.values()
    }
    assert categories == {"bottleneck"}
    assert re.fullmatch(rule["target_matchers"][0].split("=~")[1].strip('"'), "bottleneck")


def test_alertmanager_example_groups_bound_alerts_per_team_and_job_and_says_them_once():
    """The bottleneck route: one group per team and job, a day between repeats, no resolved
    message, working hours on every team route (active_time_intervals is not inherited)."""
    config = yaml.safe_load(AM_EXAMPLE.read_text())
    route = next(
        r for r in config["route"]["routes"] if 'category="bottleneck"' in r.get("matchers", [])
    )
    assert route["group_by"] == ["team", "project", "experiment"]
    assert rules.seconds(route["group_wait"]) >= 60
    assert rules.seconds(route["group_interval"]) >= 30 * 60
    assert rules.seconds(route["repeat_interval"]) >= 24 * 3600
    receivers = {r["name"]: r for r in config["receivers"]}
    for r in [route, *route["routes"]]:
        assert r["active_time_intervals"] == ["working-hours"], r["receiver"]
        assert receivers[r["receiver"]]["slack_configs"][0]["send_resolved"] is False


def test_promtool_fleet_changes_count_only_news_under_either_steady_value(tmp_path, thresholds):
    """Issue 38: the fleet's changed-steps record matches the news kinds by name, so that a
    steady step counts nowhere whether the exporter serves `kind="steady"` or, with the
    deprecated legacy_change_none, `kind="none"` (the old `kind!="none"` counted every
    `steady` step as a change)."""
    files = without_annotations(tmp_path, rules.rule_groups(thresholds))
    record = rules.Context(thresholds).change_steps_fleet
    legacy = {**JOB, "experiment": "legacy"}
    test = {
        "interval": "1m",
        "input_series": [
            series("rlhf_change_steps_total", "0+1x20", kind="steady"),
            series("rlhf_change_steps_total", "0+2x20", kind="workload_shift"),
            series("rlhf_change_steps_total", "0+1x20", legacy, kind="none"),
        ],
        "promql_expr_test": [
            {
                "expr": record,
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": series(record, "", kind="workload_shift")["series"], "value": 4}
                ],
            }
        ],
    }
    run_promtool_tests(tmp_path, files, [test])
