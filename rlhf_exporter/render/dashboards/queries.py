"""PromQL the dashboards share. Pure strings (no Grafana SDK): tests import it too.

Every job-scoped query filters on the same four variables. `cluster` and `namespace` are
Prometheus target labels that may be absent: their "All" value is `.*`, which also matches a
missing label, so the filters do nothing on a single-cluster setup.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...diagnosis import CHANGES, REASONS, VERDICTS
from ...diagnosis.thresholds import seconds
from ..rules.recording import CHANGE_CODE, CHANGE_CODES, VERDICT_CODE
from .style import change_codes, reason_codes

assert change_codes() == CHANGE_CODES  # the record's numbers are the panels' value mappings

BY_JOB = "project, experiment"
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
    """Keep the series of `expr` that come from an exporter (job, instance) that exports a
    selected verl job: the way to scope per-node GPU and Ray series to a job."""
    return f"({expr})\nand on (job, instance) {sel('rlhf_step')}"


def per_job_from_exporter(expr_by_instance: str) -> str:
    """A per-(job, instance) value copied onto every verl job that exporter exports."""
    return (
        f"max by ({BY_JOB}) (\n  {sel('rlhf_step')} * 0\n"
        f"  + on (job, instance) group_left ()\n  {expr_by_instance}\n)"
    )


def gpus_per_job() -> str:
    """GPUs of each job, from verl's own definition of throughput:
    perf/throughput = total_num_tokens / (timing_s/step x n_gpus)."""
    return (
        f"round({sel('rlhf_step_tokens')}\n  / ({sel('rlhf_step_duration_seconds')}"
        f" * ({sel('rlhf_throughput_tokens_per_gpu_second')} > 0)))"
    )


def stall_limit(alerts: Mapping) -> str:
    """Seconds without a step after which a job counts as stalled, per job:
    max(stall_factor x baseline step time, stall_min); stall_min alone before a baseline."""
    factor = alerts["stall_factor"]
    floor = seconds(alerts["stall_min"])
    return (
        f"(clamp_min({factor} * {sel('rlhf_baseline_step_duration_seconds')}, {floor:g})"
        f"\n  or 0 * {sel('rlhf_last_step_timestamp_seconds')} + {floor:g})"
    )


def since_last_step() -> str:
    return f"time() - {sel('rlhf_last_step_timestamp_seconds')}"


__all__ = [
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
    "change_code",
    "eq",
    "gpus_per_job",
    "match",
    "on_job_exporters",
    "per_job_from_exporter",
    "reason_code",
    "seconds",
    "sel",
    "since_last_step",
    "stall_limit",
    "steady",
    "verdict_code",
    "worst",
]
