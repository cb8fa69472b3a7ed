"""The fleet's recorded verdict code, hot verdict and regressed steps: the dashboards' numbers,
checked by promtool on the rendered rules (tests/support/promtool.py)."""

from __future__ import annotations

import pytest

from rlhf_exporter.render import rules
from rlhf_exporter.render.dashboards.context import DashboardContext
from rlhf_exporter.render.dashboards.fleet import jobs_per_verdict, regressed_steps_per_job
from rlhf_exporter.render.dashboards.style import verdict_codes
from rlhf_exporter.render.rules.recording import VERDICT_CODE, VERDICT_CODES, VERDICT_HOT
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import grafana_vars
from tests.support.promtool import run_rule_tests, without_annotations

pytestmark = pytest.mark.prometheus
JOB = 'project="p", instance="x"'


def recording(tmp_path):
    """The rendered recording rules (every group, promtool runs them each minute)."""
    th = load_thresholds()
    files = {rules.RECORDING_FILE: rules.rule_groups(th)[rules.RECORDING_FILE]}
    return without_annotations(tmp_path, files)


def bottleneck(exp: str, hots: list[str | None]) -> list[dict]:
    """One job's rlhf_bottleneck one-hot gauge, minute by minute (None: no verdict)."""
    return [
        {
            "series": f'rlhf_bottleneck{{{JOB}, experiment="{exp}", verdict="{v}"}}',
            "values": " ".join("1" if h == v else "0" for h in hots),
        }
        for v in VERDICT_CODES
    ]


def test_the_recorded_codes_are_the_dashboards_value_mappings():
    assert verdict_codes() == VERDICT_CODES


def test_promtool_records_the_hot_verdicts_code_per_job(tmp_path):
    hot = {"a": "update", "b": "rollout"}
    series = [s for exp, verdict in hot.items() for s in bottleneck(exp, [verdict] * 4)]
    want = [
        {"labels": f'{VERDICT_CODE}{{{JOB}, experiment="{exp}"}}', "value": VERDICT_CODES[v]}
        for exp, v in hot.items()
    ]
    check = {"expr": VERDICT_CODE, "eval_time": "2m", "exp_samples": want}
    test = {"interval": "1m", "input_series": series, "promql_expr_test": [check]}
    run_rule_tests(tmp_path, recording(tmp_path), [test])


def jobs_per_verdict_query() -> str:
    """The fleet's "Jobs per verdict" query as rendered, every job selected."""
    (query,) = [
        t.expr for t in jobs_per_verdict(DashboardContext.of(load_thresholds())).build().targets
    ]
    return grafana_vars.substitute(query, range_="1h")


def counted(expr: str, at: str, jobs: dict[str, int]) -> dict:
    """A promtool check: `expr` at `at` is `jobs` (verdict: how many jobs), nothing else."""
    samples = [{"labels": f'{{verdict="{v}"}}', "value": n} for v, n in jobs.items()]
    return {"expr": expr, "eval_time": at, "exp_samples": samples}


def test_promtool_records_one_hot_verdict_per_job_as_the_verdict_changes(tmp_path):
    """The fleet's jobs per verdict counts the hot record: one series per job at any time,
    the verdict it left gone at once (a rule's staleness marker), never counted twice."""
    # job a: update for 4 minutes, then rollout; job b: rollout throughout; job c: no verdict
    hot = {"a": ["update"] * 4 + ["rollout"] * 4, "b": ["rollout"] * 8, "c": [None] * 8}
    series = [s for exp, hots in hot.items() for s in bottleneck(exp, hots)]
    panel = jobs_per_verdict_query()
    assert VERDICT_HOT in panel
    checks = [
        counted(panel, "2m", {"update": 1, "rollout": 1}),
        counted(panel, "5m", {"rollout": 2}),
    ]
    test = {"interval": "1m", "input_series": series, "promql_expr_test": checks}
    run_rule_tests(tmp_path, recording(tmp_path), [test])


def test_jobs_per_verdict_counts_a_job_scraped_twice_once(tmp_path):
    """Two replicas scrape job a (another instance, another pod), one scrapes job b: the
    panel counts two jobs, because the record folds a's two series into one (`JOB_KEY`);
    the panel itself folds nothing at every step. The verdict a left goes from both at once."""
    hots = ["update"] * 4 + ["rollout"] * 4
    twice = [
        {**s, "series": s["series"].replace('instance="x"', 'instance="y", pod="p-1"')}
        for s in bottleneck("a", hots)
    ]
    series = bottleneck("a", hots) + twice + bottleneck("b", ["rollout"] * 8)
    panel = jobs_per_verdict_query()
    assert "max by" not in panel  # the fold is the record's, not every step's
    checks = [
        counted(panel, "2m", {"update": 1, "rollout": 1}),
        counted(panel, "6m", {"rollout": 2}),
    ]
    test = {"interval": "1m", "input_series": series, "promql_expr_test": checks}
    run_rule_tests(tmp_path, recording(tmp_path), [test])


def test_regressed_steps_per_job_reads_only_the_jobs_that_regressed(tmp_path):
    """The fleet's regressed steps per job draws a recorded window count that exists only
    where it is above 0 (issue 37: the other jobs' zeros were read at every step): job a's
    update regressed for 10 minutes, job b's never. At the end, only a's update is drawn,
    with the window's count; once a's window holds none, nothing is."""
    th = load_thresholds()
    ctx = rules.Context(th)
    regressed = [0] * 20 + list(range(1, 11)) + [10] * 50  # one regressed step a minute
    series = [
        {
            "series": f'rlhf_regression_steps_total{{{JOB}, experiment="a", group="update"}}',
            "values": " ".join(map(str, regressed)),
        },
        {
            "series": f'rlhf_regression_steps_total{{{JOB}, experiment="a", group="rollout"}}',
            "values": "0x79",
        },
        {
            "series": f'rlhf_regression_steps_total{{{JOB}, experiment="b", group="update"}}',
            "values": "0x79",
        },
    ]
    (query,) = [t.expr for t in regressed_steps_per_job(DashboardContext.of(th)).build().targets]
    panel = grafana_vars.substitute(query, range_="1h")
    a_update = f'{{{JOB}, experiment="a", group="update"}}'
    checks = [
        {  # the 30m window at 35m holds the 10 steps of 20m..30m
            "expr": panel,
            "eval_time": "35m",
            "exp_samples": [{"labels": ctx.regressions_nonzero + a_update, "value": 10}],
        },
        {"expr": ctx.regressions_nonzero, "eval_time": "15m", "exp_samples": []},
        {"expr": panel, "eval_time": "75m", "exp_samples": []},  # the window holds none
        {  # the dense record the alert reads is still there, at 0
            "expr": f"count({ctx.regressions})",
            "eval_time": "75m",
            "exp_samples": [{"labels": "{}", "value": 3}],
        },
    ]
    test = {"interval": "1m", "input_series": series, "promql_expr_test": checks}
    run_rule_tests(tmp_path, recording(tmp_path), [test])
