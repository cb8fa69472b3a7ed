"""One definition per question (issues 22 and 24): the fleet dashboard's stall and state
panels and the alerts read the same recording rules, so they agree. promtool evaluates the
repository's rule files and the shipped panels' PromQL over the same series: a job stalled,
one finished, one failed, one in a 30-minute checkpoint, one regressed, and one whose
exporter went blind during a stall."""

from __future__ import annotations

import json

import pytest
import yaml

from rlhf_exporter.render import repo_root, rules
from tests.support.grafana_vars import substitute
from tests.support.promtool import run_rule_tests, without_annotations

pytestmark = pytest.mark.prometheus

REPO = repo_root()
RULE_FILES = [REPO / rules.RECORDING_FILE, REPO / rules.OPERATIONS_FILE]
TARGET = {"job": "rlhf-exporter", "instance": "e:9"}
STATES = ("running", "finished", "failed", "unknown")


def _series(metric: str, values: str, experiment: str, **extra: str) -> dict:
    labels = {**TARGET, "project": "p", "experiment": experiment, **extra}
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
        "values": values,
    }


def job(experiment: str, last_step: str, state: str, n: int = 90, **more: str) -> list[dict]:
    """A job exported for `n` minutes in `state` (one-hot), its last step time `last_step`."""
    out = [
        _series("rlhf_last_step_timestamp_seconds", last_step, experiment),
        _series("rlhf_baseline_step_duration_seconds", f"60x{n}", experiment),
    ]
    out += [
        _series("rlhf_job_state", f"{1 if s == state else 0}x{n}", experiment, state=s)
        for s in STATES
    ]
    out += [_series(metric, values, experiment) for metric, values in more.items()]
    return out


def committed_without_annotations(tmp_path) -> list:
    """The committed rule files without annotations (promtool compares them exactly)."""
    committed = {str(path): yaml.safe_load(path.read_text())["groups"] for path in RULE_FILES}
    return without_annotations(tmp_path, committed)


def panel_query(title: str, ref: str = "A") -> str:
    board = json.loads((REPO / "grafana" / "rlhf-fleet.json").read_text())

    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    panel = next(p for p in walk(board["panels"]) if p.get("title") == title)
    expr = next(t["expr"] for t in panel["targets"] if t["refId"] == ref)
    return substitute(expr)


def table_column(name: str) -> str:
    from rlhf_exporter.render.dashboards.context import DashboardContext
    from rlhf_exporter.render.dashboards.fleet_table import job_columns
    from rlhf_exporter.thresholds_file import load_thresholds

    columns = [n for n, _ in job_columns(DashboardContext.of(load_thresholds()))]
    return panel_query(
        "Every job: verdict, throughput, health", chr(ord("A") + columns.index(name))
    )


def test_panels_and_alerts_agree_on_every_state(tmp_path):
    hung = "0+60x30 1800x60"  # steps until 30m, then nothing
    in_checkpoint = (
        "0+60x30 1800x60"  # the same silence, inside a 30-minute checkpoint it did before
    )
    series = (
        job("hung", hung, "running")
        + job("ckpt", in_checkpoint, "running", rlhf_between_steps_max_seconds="1800x90")
        + job("done", hung, "finished")
        + job("crashed", hung, "failed")
        + job("slower", "0+60x90", "running")
        + [
            _series("rlhf_change", "1x90", "slower", kind="regression"),
            _series("rlhf_change", "0x90", "hung", kind="regression"),
        ]
        # blind: stalled from 40m, then its exporter went away at 50m (series end)
        + job("blind", "0+60x30 1800x19 stale", "running", n=50)
    )
    for s in series:  # the blind job's state series end with its target
        if 'experiment="blind"' in s["series"] and not s["values"].endswith("stale"):
            s["values"] += " stale"
    at = "60m"
    stalled = {"severity": "critical", "category": "job", **TARGET, "project": "p"}
    codes = {"crashed": 5, "hung": 4, "blind": 4, "slower": 3, "ckpt": 2, "done": 0}
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": "RLHFJobStalled",
                    "exp_alerts": [
                        {"exp_labels": {**stalled, "experiment": e}} for e in ("blind", "hung")
                    ],
                },
                {
                    "eval_time": at,
                    "alertname": "RLHFJobFailed",
                    "exp_alerts": [{"exp_labels": {**stalled, "experiment": "crashed"}}],
                },
                {"eval_time": at, "alertname": "RLHFJobUnwatched", "exp_alerts": []},
            ],
            "promql_expr_test": [
                {  # the stat: the same two jobs the alert pages for
                    "expr": panel_query("Stalled jobs"),
                    "eval_time": at,
                    "exp_samples": [{"labels": "{}", "value": 2}],
                },
                {  # the table's state column, which it sorts by: failed, stalled, regressed...
                    "expr": table_column("state"),
                    "eval_time": at,
                    "exp_samples": [
                        {"labels": f'{{experiment="{e}", project="p"}}', "value": v}
                        for e, v in codes.items()
                    ],
                },
                {  # the budget: over 1 for the hung job only; none for finished and failed
                    "expr": f"({panel_query('Stall budget used')}) > 1",
                    "eval_time": at,
                    "exp_samples": [
                        {
                            "labels": "{"
                            + ",".join(f'{k}="{v}"' for k, v in {**TARGET, "project": "p"}.items())
                            + f',experiment="{e}'
                            + '",__name__="project_experiment:rlhf_job_stall_budget:ratio"}',
                            "value": v,
                        }
                        for e, v in (("blind", 2.0), ("hung", 3.0))  # blind: frozen at 50m
                    ],
                },
            ],
        }
    ]
    run_rule_tests(tmp_path, committed_without_annotations(tmp_path), tests, "agree.yaml")
