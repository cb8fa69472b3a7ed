"""The Prometheus rules (alerts/*.rules.yaml) and their runbooks (docs/runbooks.md).

Generated from the thresholds file's `alerts:` section, the decision table's verdicts and
reasons, the metric catalog and the "look at next" texts of `diagnosis.advice`: no threshold,
metric name or advice is typed twice. `rlhf-exporter render rules` writes the files;
`render --check` fails when the committed ones are stale.

Recording rules follow the `level:metric:operations` convention (Prometheus docs,
kubernetes-mixin). The level names the labels a series is kept by, beyond the scrape target's
own labels (`job`, `instance`, and `cluster`/`namespace`/`pod` where Prometheus adds them):

| name (default window 30m) | value |
|---|---|
| `project_experiment_group:rlhf_group_share:ratio_rate30m` | share of step time per group |
| `project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate30m` | fraction of classified steps per verdict |
| `project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:ratio_rate30m` | fraction of a verdict's steps per reason |
| `project_experiment:rlhf_steps:rate30m` | steps per second |
| `project_experiment_group:rlhf_regression_steps:increase30m` | steps that regressed group g |
| `project_experiment_kind:rlhf_change_steps:ratio_rate30m` | fraction of steps per change kind |
| `project_experiment:rlhf_tokens_per_step_second:ratio_rate30m` | tokens per second of step time |
| `instance_gpu:rlhf_gpu_busy:ratio_rate30m` | busy ratio per GPU (with the job its node serves) |
| `project_experiment:rlhf_gpu_busy:ratio_rate30m` | mean busy ratio of a job's GPUs on every node that serves it |
| `project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:topratio_rate30m` | the dominant reason of each verdict (a bound alert's evidence) |
| `project_experiment:rlhf_untimed_of_other:ratio_rate30m` | untimed remainder over the `other` window |
| `project_experiment:rlhf_agent_loop_generate_sequences:max_over_mean` | agent-loop generate_sequences max / mean |
| `project_experiment_verdict:rlhf_bottleneck_steps:increase6h` | classified steps per verdict over the reference window |
| `project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate6h` | fraction of classified steps per verdict over the reference window |
| `project_experiment:rlhf_workload_shift_steps:increase6h` (and `increase3h`, `increase1h`) | workload-shift steps over the reference window and over each of `alerts.bound_reference_after_shift` |
| `project_experiment:rlhf_tokens_per_step_second:ratio_rate6h` | tokens per second of step time over the reference window; where that window holds a workload shift, over the longest of `alerts.bound_reference_after_shift` that holds none (the reference restarts), else absent |
| `project_experiment:rlhf_baseline_tokens_per_second:max_over_time6h` | the best baseline tokens per second over `alerts.throughput_reference` (the throughput alert's and the fleet panel's reference); the current baseline where that window holds a workload shift |
| `project_experiment:rlhf_tokens_per_step_second_vs_best_baseline:ratio_rate30m` | tokens per second of step time over the window ÷ that best baseline, for the fleet's "Tokens per second ÷ baseline" |
| `project_experiment:rlhf_job_stall_budget:ratio` | seconds since the job's last step ÷ its stall limit (max(stall_factor × baseline step time, stall_min) + the longest validation/checkpoint seen): above 1 is stalled |
| `project_experiment_state:rlhf_job_state:max` | 1 for the job's state: running, finished, failed, stalled (running past its stall budget) or unknown |
| `project_experiment:rlhf_bottleneck_verdict:code` | the last step's verdict as a number (1 + its index in the decision table), for the fleet's verdict panels |
| `project_experiment:rlhf_change:code` | the last step's change as a number (0 none, 1 workload_shift, 2 regression), for the fleet's change panel |
| `project_experiment_verdict:rlhf_bottleneck_steps:increase2m` | classified steps per verdict over `alerts.fleet_interval` (group `rlhf-exporter.fleet`), for the fleet's steps per verdict in the time range |
| `project_experiment_group:rlhf_regression_steps:nonzero_increase30m` | the steps that regressed group g over the window, only where above 0 (every `alerts.fleet_interval`), for the fleet's regressed steps per job |
| `project_experiment_verdict:rlhf_bottleneck:hot` | 1 for the verdict of the job's last step, the other verdicts absent, one series per job (its replicas folded; every `alerts.fleet_interval`), for the fleet's jobs per verdict |
| `instance_uuid:rlhf_gpu_with_errors:max_increase4m` | per GPU with errors, the largest increase of its lost, bad-GPU XID or uncorrectable ECC counters over four rounds of its group (`rlhf-exporter.gpu-health.recording`, every `alerts.gpu_interval`: the windows overlap, so no error falls between two), or 1 for a failed row remap; absent for a healthy GPU, for the fleet's GPUs with errors |
| `project_experiment:rlhf_gpus:round` | the job's GPUs (verl's: total_num_tokens / (timing_s/step x perf/throughput)) |
| `project_experiment_group:rlhf_group_gpu_seconds:increase2m` | GPU-seconds each group held the job's GPUs over `alerts.fleet_interval` (its own group, `rlhf-exporter.fleet`, runs that often: the values tile the time), for the fleet's GPU-time panels |

The suffix follows the configured window (`alerts.window`, and `alerts.bound_reference` or
`alerts.throughput_reference` for the five references, which the bound alerts read
`offset <window>`; they are their own group,
`rlhf-exporter.reference`, evaluated every `alerts.bound_reference_interval`). Rules use `without`, so the
target labels survive for routing and joins; the only records summed across targets are a
job's GPU records (`without (instance, pod)`: a job's head and worker sidecars are different
targets, and every GPU series carries its job's labels).

Each rule is a function of a frozen `Context` (the thresholds, the time scale and the records'
names): `recording.py` (the records), `decision.py` (one function per decision-table row, with
its evidence and runbook beside it), `operations.py` (one function per on-call alert).

`rule_groups(thresholds, scale)` scales every window and `for:` by `scale` (and the stall
test's step-time term with them): the live test runs the same rules 200 times faster.
"""

from __future__ import annotations

from typing import Any

from ...diagnosis import Thresholds
from ...diagnosis.thresholds import seconds
from ..addresses import JOB_UID
from . import decision, gpuhealth, gpuwindows, operations, remotewrite
from .model import (
    BOUND_ALERTS,
    DECISION_FILE,
    OPERATIONS_FILE,
    RECORDING_FILE,
    RUNBOOKS_FILE,
    SEVERITIES,
    Alert,
    Context,
    Runbook,
    anchor,
    duration,
    runbook_url,
)
from .output import dump, runbooks_markdown
from .output import rule_files as _rule_files
from .recording import (
    change_gpu_records,
    evidence_records,
    fleet_records,
    lifecycle_records,
    reason_records,
    reference_records,
    window_records,
)

ORDER = 20
__all__ = [
    "BOUND_ALERTS",
    "DECISION_FILE",
    "OPERATIONS_FILE",
    "RECORDING_FILE",
    "RUNBOOKS_FILE",
    "SEVERITIES",
    "Alert",
    "Context",
    "Runbook",
    "all_alerts",
    "anchor",
    "dashboard_url",
    "dump",
    "duration",
    "groups",
    "rule_files",
    "rule_groups",
    "runbook_url",
    "seconds",
    "targets",
]


def all_alerts(ctx: Context) -> list[Alert]:
    return (
        decision.alerts(ctx)
        + operations.alerts(ctx)
        + gpuwindows.alerts(ctx)
        + gpuhealth.alerts(ctx)
        + remotewrite.alerts(ctx)
    )


def dashboard_url(ctx: Context) -> str:
    """The job dashboard (grafana/rlhf-job.json) on the alert's job: `alerts.dashboard_url`
    (the Grafana base URL), its uid, and its variables from the alert's labels."""
    base = str(ctx.a["dashboard_url"]).rstrip("/")
    return (
        f"{base}/d/{JOB_UID}/rlhf-job?var-project={{{{ $labels.project | urlquery }}}}"
        "&var-experiment={{ $labels.experiment | urlquery }}"
        "{{ with $labels.cluster }}&var-cluster={{ . | urlquery }}{{ end }}"
        "{{ with $labels.namespace }}&var-namespace={{ . | urlquery }}{{ end }}"
    )


def with_dashboard_urls(
    ctx: Context, files: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Every job alert (one whose summary names the job's project: it carries the job's
    labels) gets a `dashboard_url` annotation to the job dashboard with its variables set."""
    url = dashboard_url(ctx)
    for file_groups in files.values():
        for group in file_groups:
            for rule in group["rules"]:
                if "alert" in rule and "$labels.project" in rule["annotations"]["summary"]:
                    rule["annotations"]["dashboard_url"] = url
    return files


def groups(ctx: Context) -> dict[str, list[dict[str, Any]]]:
    """{relative path: [rule groups]}: one group per file."""
    return with_dashboard_urls(ctx, _groups(ctx))


def _groups(ctx: Context) -> dict[str, list[dict[str, Any]]]:
    base = ctx.a["runbook_url"]
    return {
        RECORDING_FILE: [
            # the window's records in three groups, each evaluated in a few % of its interval at
            # 1,000 jobs x 24 h; a group reads another's records only after it
            {"name": "rlhf-exporter.recording", "rules": window_records(ctx)},
            {"name": "rlhf-exporter.recording.reasons", "rules": reason_records(ctx)},
            {
                "name": "rlhf-exporter.recording.changes",
                "rules": change_gpu_records(ctx) + evidence_records(ctx),
            },
            {
                "name": "rlhf-exporter.lifecycle",
                "rules": lifecycle_records(ctx),
            },
            {
                "name": "rlhf-exporter.reference",
                "interval": ctx.dur("bound_reference_interval"),
                "rules": reference_records(ctx),
            },
            {
                "name": "rlhf-exporter.fleet",
                "interval": ctx.fleet_interval,
                "rules": fleet_records(ctx),
            },
        ],
        DECISION_FILE: [
            {
                "name": "rlhf-exporter.decision-table",
                "rules": [a.rule(base) for a in decision.alerts(ctx)],
            }
        ],
        OPERATIONS_FILE: [
            {
                "name": "rlhf-exporter.operations",
                "rules": [a.rule(base) for a in operations.alerts(ctx)],
            }
        ],
        gpuwindows.GPU_WINDOWS_FILE: gpuwindows.groups(ctx),
        gpuhealth.GPU_HEALTH_FILE: gpuhealth.groups(ctx),
        remotewrite.REMOTE_WRITE_FILE: remotewrite.groups(ctx),
    }


def rule_groups(thresholds: Thresholds, scale: float = 1.0) -> dict[str, list[dict[str, Any]]]:
    """{relative path: [rule groups]}; `scale` < 1 shortens every window and `for:`."""
    return groups(Context(thresholds, scale))


def rule_files(thresholds: Thresholds, scale: float = 1.0) -> dict[str, str]:
    return _rule_files(groups(Context(thresholds, scale)))


def targets(thresholds: Thresholds) -> dict[str, str]:
    return {**rule_files(thresholds), RUNBOOKS_FILE: runbooks_markdown(Context(thresholds))}
