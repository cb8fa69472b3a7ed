"""PromQL the dashboards share. Pure strings (no Grafana SDK): tests import it too.

Every job-scoped query filters on the same four variables. `cluster` and `namespace` are
Prometheus target labels that may be absent: their "All" value is `.*`, which also matches a
missing label, so the filters do nothing on a single-cluster setup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...diagnosis import CHANGES, REASONS, VERDICTS
from ...diagnosis.thresholds import seconds
from ..rules.recording import CHANGE_CODE, CHANGE_CODES, VERDICT_CODE
from .style import change_codes, reason_codes

assert change_codes() == CHANGE_CODES  # the record's numbers are the panels' value mappings

BY_JOB = "cluster, namespace, project, experiment"
"""A job's identity in the store: two clusters (or namespaces) may both run `grpo/exp1`, and
every per-job aggregation and join keeps them apart. An absent `cluster` or
`namespace` groups as empty, so a single Prometheus sees one row per job as before."""
JOB_LEGEND = "{{project}}/{{experiment}}"
"""A per-job series' legend."""
BY_EXPORTER = "cluster, job, instance"
"""A scrape target's identity: two clusters may reuse a pod address (`instance`)."""
TARGET = 'cluster=~"$cluster", namespace=~"$namespace"'
JOB = TARGET + ', project=~"$project", experiment=~"$experiment"'
RATE = "$__rate_interval"
RANGE = "$__range"
INTERVAL = "$__interval"
TOP = 10
"""Series a per-job (or per-GPU) time series draws by default: the worst ones; the full list
is the fleet table. Never more than `MAX_SERIES`, over any time range."""
MAX_SERIES = 20


def at_end(selector: str) -> str:
    """`selector` read at the end of the dashboard's time range (PromQL's `@ end()`): a
    score evaluated once per query, not once per point."""
    return f"{selector} @ end()"


def steady(expr: str) -> str:
    """Any `expr` as a step-invariant score: its value at the end of the time range (a
    one-point subquery, one panel step long, read `@ end()`)."""
    return f"last_over_time(({expr})[{INTERVAL}:{INTERVAL}] @ end())"


def worst(expr: str, score: str, by: str = BY_JOB, k: int = TOP, lowest: bool = False) -> str:
    """The series of `expr` whose (`by`) labels are among the `k` highest (`lowest`: lowest)
    of `score`. `score` must be step-invariant (its selectors read `@ end()`): the same
    series are kept at every point, so the panel draws at most `k` whatever the range."""
    if k > MAX_SERIES:
        raise ValueError(f"a panel draws at most {MAX_SERIES} series")
    fn = "bottomk" if lowest else "topk"
    return f"{expr}\nand on ({by})\n{fn}({k}, {score})"


def sel(metric: str, *extra: str, scope: str = JOB) -> str:
    """`metric{<job filters>, extra...}`."""
    return f"{metric}{{{', '.join((scope,) + extra)}}}"


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def match(label: str, regex: str) -> str:
    return f'{label}=~"{regex}"'


def coded(
    metric: str,
    codes: Mapping[str, int] | Mapping[tuple[str, str], int],
    labels: tuple[str, ...],
) -> str:
    """Turn a one-hot gauge into one series per job whose value is the code of the hot label.

    `rlhf_bottleneck{verdict="rollout"} * 1 or rlhf_bottleneck{verdict="reward"} * 2 or ...`,
    the largest per job: the one-hot 1 picks its code; a job with every gauge at 0 gets 0.
    """
    terms = []
    for key, code in codes.items():
        values = (key,) if isinstance(key, str) else key
        matchers = [f'{label}="{value}"' for label, value in zip(labels, values)]
        terms.append(f"{sel(metric, *matchers)} * {code}")
    return f"max by ({BY_JOB}) (\n  " + "\n  or ".join(terms) + "\n)"


def verdict_code() -> str:
    """The recorded verdict code (rlhf_exporter/render/rules/recording.py): the same numbers as
    `coded("rlhf_bottleneck", verdict_codes(), ...)`, one series per job to read."""
    return f"max by ({BY_JOB}) ({sel(VERDICT_CODE)})"


def reason_code() -> str:
    return coded("rlhf_bottleneck_reason", reason_codes(), ("verdict", "reason"))


def change_code() -> str:
    """The recorded change code (rlhf_exporter/render/rules/recording.py): the numbers of
    `style.change_codes()`, one series per job to read."""
    return f"max by ({BY_JOB}) ({sel(CHANGE_CODE)})"


def on_job_exporters(expr: str) -> str:
    """Keep the series of `expr` from an exporter (job, instance) that serves a selected verl
    job: its head (which exports the job's steps) or a worker (whose GPU series carry the
    job). For the exporters' own health, per node."""
    return f"({expr})\nand on ({BY_EXPORTER}) ({sel('rlhf_step')} or {sel('rlhf_gpu_info')})"


def on_sole_job_exporters(expr: str) -> str:
    """Keep the series of `expr` (per-exporter series without job labels: Ray's) only from an
    exporter that exports exactly one verl job, a selected one. A sidecar serves one job, so
    its Ray cluster is that job's; a fleet exporter serves many jobs from one shared cluster,
    and its cluster-wide series are shown for none of them rather than for every one (the
    fleet dashboard shows the shared cluster; docs/fleet.md)."""
    one = f"count by ({BY_EXPORTER}) ({sel('rlhf_step', scope=TARGET)}) == 1"
    return f"({expr})\nand on ({BY_EXPORTER}) ({one})\nand on ({BY_EXPORTER}) {sel('rlhf_step')}"


def gpus_per_job() -> str:
    """GPUs of each job, from verl's own definition of throughput:
    perf/throughput = total_num_tokens / (timing_s/step x n_gpus)."""
    return (
        f"round({sel('rlhf_step_tokens')}\n  / ({sel('rlhf_step_duration_seconds')}"
        f" * ({sel('rlhf_throughput_tokens_per_gpu_second')} > 0)))"
    )


def stall_limit(alerts: Mapping[str, Any]) -> str:
    """Seconds without a step after which a job counts as stalled, per job:
    max(stall_factor x baseline step time, stall_min); stall_min alone before a baseline."""
    factor = alerts["stall_factor"]
    floor = seconds(alerts["stall_min"])
    return (
        f"(clamp_min({factor} * {sel('rlhf_baseline_step_duration_seconds')}, {floor:g})"
        f"\n  or 0 * {sel('rlhf_last_step_timestamp_seconds')} + {floor:g})"
    )


JOB_STATE = "project_experiment_state:rlhf_job_state:max"  # recording.lifecycle_records
STALL_BUDGET = "project_experiment:rlhf_job_stall_budget:ratio"
PER_TARGET_JOB = f"{BY_JOB}, job, instance"


def job_state_is(regex: str) -> str:
    """The jobs whose recorded state matches `regex` (one series per job, value 1)."""
    return f"({sel(JOB_STATE, match('state', regex))} == 1)"


def stall_budget() -> str:
    """Each running or stalled job's stall budget used (the record the alert reads);
    finished and failed jobs have none to use."""
    return f"{sel(STALL_BUDGET)}\nunless on ({PER_TARGET_JOB}) {job_state_is('finished|failed')}"


def attention_code() -> str:
    """Per job, style.ATTENTION's number: failed, stalled, regressed (a running job whose
    last step regressed), running, unknown, finished."""
    from .style import ATTENTION

    def hot(state: str) -> str:
        return job_state_is(state)

    terms = [
        f"{hot('failed')} * {ATTENTION['failed'][0]}",
        f"{hot('stalled')} * {ATTENTION['stalled'][0]}",
        f"{hot('running')} * {ATTENTION['regressed'][0]}\n"
        f"    and on ({PER_TARGET_JOB}) ({sel('rlhf_change', eq('kind', 'regression'))} == 1)",
        f"{hot('running')} * {ATTENTION['running'][0]}",
        f"{hot('unknown')} * {ATTENTION['unknown'][0]}",
        f"{hot('finished')} * {ATTENTION['finished'][0]}",
    ]
    return f"max by ({BY_JOB}) (\n  " + "\n  or ".join(terms) + "\n)"


def since_last_step() -> str:
    return f"time() - {sel('rlhf_last_step_timestamp_seconds')}"


__all__ = [
    "BY_EXPORTER",
    "BY_JOB",
    "CHANGES",
    "JOB",
    "MAX_SERIES",
    "RANGE",
    "RATE",
    "REASONS",
    "TARGET",
    "TOP",
    "VERDICTS",
    "at_end",
    "attention_code",
    "change_code",
    "eq",
    "gpus_per_job",
    "job_state_is",
    "match",
    "on_job_exporters",
    "on_sole_job_exporters",
    "reason_code",
    "seconds",
    "sel",
    "since_last_step",
    "stall_budget",
    "stall_limit",
    "steady",
    "verdict_code",
    "worst",
]
