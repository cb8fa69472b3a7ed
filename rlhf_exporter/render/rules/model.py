"""The pieces every rule is made of: files, alert names, durations, annotation templates,
the Alert and Runbook records, and the frozen `Context` every rule function reads."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...diagnosis import GROUPS, Thresholds
from ...diagnosis.thresholds import seconds
from ..template import TemplateError, sections, substitute

RECORDING_FILE = "alerts/recording.rules.yaml"
DECISION_FILE = "alerts/decision-table.rules.yaml"
OPERATIONS_FILE = "alerts/operations.rules.yaml"
RUNBOOKS_FILE = "docs/runbooks.md"

BOUND_ALERTS: Mapping[str, str] = {
    "rollout": "RLHFJobRolloutBound",
    "reward": "RLHFJobRewardBound",
    "logprob": "RLHFJobLogprobBound",
    "update": "RLHFJobUpdateBound",
    "sync": "RLHFJobSyncBound",
    "other": "RLHFJobDriverOverheadBound",
}
"""One alert per row of the decision table. `checkpoint`, `balanced` and `unknown` have none."""
assert set(BOUND_ALERTS) == set(GROUPS) - {"checkpoint"}

SEVERITIES = ("critical", "warning", "info")
"""critical pages; warning goes to chat at any hour; info (bottlenecks) in working hours."""


def duration(secs: float) -> str:
    """600.0 -> '10m'; fractions of a second become milliseconds ('1500ms')."""
    ms = round(secs * 1000)
    if ms <= 0:
        return "0s"
    for unit, size in (("h", 3600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _num(x: float) -> str:
    return f"{x:g}"


# ---------------------------------------------------------------------------------------------
# Go-template helpers for annotations (Prometheus expands them at each evaluation).

JOB_MATCH = 'project="%s",experiment="%s"'
JOB_ARGS = "$labels.project $labels.experiment"


def _tq(expr: str, fmt: str, args: str = JOB_ARGS, default: str = "n/a") -> str:
    """The first value of PromQL `expr` (its %s filled from `args`), formatted, or `default`."""
    return (
        "{{ with query (printf `" + expr + "` " + args + ") }}"
        "{{ . | first | value | " + fmt + " }}{{ else }}" + default + "{{ end }}"
    )


JOB_NAME = "{{ $labels.project }}/{{ $labels.experiment }}"

# A job's identity across scrape targets: its head and worker sidecars are different targets
# (`instance`, `pod`) of one job. Joins between a job's series from different targets match
# `on (JOB_KEY)`; sums over a job's nodes drop `NODES` (never `on (job, instance)`).
JOB_KEY = "cluster, namespace, project, experiment"
# A scrape target across clusters: two clusters may reuse a pod address, so a join between one
# exporter's series matches `on (EXPORTER_KEY)` (`cluster` absent groups as empty).
EXPORTER_KEY = "cluster, job, instance"
NODES = "instance, pod"


def fill(template: str, **names: str) -> str:
    """`template` with each `<name>` replaced by `names[name]`: annotation templates stay
    readable Go templates (no doubled braces), and PromQL's own `<` is left alone."""
    return re.sub(r"<([a-z_]+)>", lambda m: names.get(m[1], m[0]), template)


def query_open(expr: str, args: str = JOB_ARGS) -> str:
    """`{{ with query ... }}` on PromQL `expr` (its %s filled from `args`): the text after it
    sees the result vector as `.`, up to its `{{ else }}` (no result) and `{{ end }}`."""
    return "{{ with query (printf `" + expr + "` " + args + ") }}"


def query_first(expr: str, body: str, default: str = "", args: str = JOB_ARGS) -> str:
    """A template that runs PromQL `expr` (its %s filled from `args`) and expands `body` with
    `.` set to the result vector, or `default` when the result is empty."""
    return query_open(expr, args) + body + "{{ else }}" + default + "{{ end }}"


def counts_by(expr: str, label: str, args: str, default: str = "n/a") -> str:
    """Each series of PromQL `expr` as `<its label>=<value>`, or `default` when none."""
    body = "{{ range . }}{{ .Labels." + label + " }}={{ .Value | humanize }} {{ end }}"
    return query_first(expr, body, default, args)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What every rule function reads: the thresholds, the time scale, and the names of the
    recording rules (they carry the configured windows). Frozen: a rule cannot change what
    the next one sees."""

    th: Thresholds
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError("scale must be positive")
        if seconds(self.a["bound_reference"]) <= seconds(self.a["window"]):
            raise ValueError("alerts.bound_reference must be longer than alerts.window")
        if not isinstance(self.a["bound_reference_after_shift"], list):
            raise ValueError("alerts.bound_reference_after_shift must be a list of durations")

    @property
    def a(self) -> Mapping[str, Any]:
        """The thresholds file's `alerts:` section."""
        return self.th.alerts

    def dur(self, key: str) -> str:
        return duration(seconds(self.a[key]) * self.scale)

    def secs(self, key: str) -> float:
        return seconds(self.a[key]) * self.scale

    @property
    def window(self) -> str:
        return self.dur("window")

    @property
    def reference(self) -> str:
        """The bound alerts' reference window; it ends where `window` begins."""
        return self.dur("bound_reference")

    # recording rules over `window`
    @property
    def share(self) -> str:
        return f"project_experiment_group:rlhf_group_share:ratio_rate{self.window}"

    @property
    def verdicts(self) -> str:
        return f"project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate{self.window}"

    @property
    def reasons(self) -> str:
        return (
            "project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:"
            f"ratio_rate{self.window}"
        )

    @property
    def step_rate(self) -> str:
        return f"project_experiment:rlhf_steps:rate{self.window}"

    @property
    def regressions(self) -> str:
        return f"project_experiment_group:rlhf_regression_steps:increase{self.window}"

    @property
    def regressions_nonzero(self) -> str:
        """`regressions` where above 0, every fleet interval: absent while a job's group has
        not regressed, so a per-job panel over hours reads only the jobs that did."""
        return f"project_experiment_group:rlhf_regression_steps:nonzero_increase{self.window}"

    @property
    def changes(self) -> str:
        return f"project_experiment_kind:rlhf_change_steps:ratio_rate{self.window}"

    @property
    def tokens_rate(self) -> str:
        return f"project_experiment:rlhf_tokens_per_step_second:ratio_rate{self.window}"

    @property
    def gpu_busy(self) -> str:
        return f"instance_gpu:rlhf_gpu_busy:ratio_rate{self.window}"

    @property
    def gpus_busy(self) -> str:
        """The mean busy ratio of a job's GPUs, across every node that serves it."""
        return f"project_experiment:rlhf_gpu_busy:ratio_rate{self.window}"

    # the bound alerts' evidence, precomputed so that their templates read one series
    @property
    def top_reasons(self) -> str:
        return (
            "project_experiment_verdict_reason:rlhf_bottleneck_reason_steps:"
            f"topratio_rate{self.window}"
        )

    @property
    def untimed(self) -> str:
        return f"project_experiment:rlhf_untimed_of_other:ratio_rate{self.window}"

    @property
    def generate_spread(self) -> str:
        return "project_experiment:rlhf_agent_loop_generate_sequences:max_over_mean"

    # a job's lifecycle: the one definition that alerts and dashboards read
    @property
    def blind(self) -> str:
        """How long a job's last-seen series stand in for it once no target exports it."""
        return self.dur("blind_lookback")

    stall_budget = "project_experiment:rlhf_job_stall_budget:ratio"
    job_state = "project_experiment_state:rlhf_job_state:max"

    job_state_code = "project_experiment:rlhf_job_state:code"
    carry = "10m"  # how far back the state code reads itself (several rule evaluations)

    # recording rules over the reference window (read `offset window`)
    @property
    def verdict_steps_ref(self) -> str:
        return f"project_experiment_verdict:rlhf_bottleneck_steps:increase{self.reference}"

    @property
    def verdicts_ref(self) -> str:
        return f"project_experiment_verdict:rlhf_bottleneck_steps:ratio_rate{self.reference}"

    @property
    def tokens_rate_ref(self) -> str:
        """Tokens per second of step time over the reference window; where a step of that
        window was a workload shift, over the longest of `bound_reference_after_shift` that
        holds none, else absent (a reference never mixes two workloads)."""
        return f"project_experiment:rlhf_tokens_per_step_second:ratio_rate{self.reference}"

    def shift_steps(self, window: str) -> str:
        """Workload-shift steps over `window` (the references' own windows)."""
        return f"project_experiment:rlhf_workload_shift_steps:increase{window}"

    @property
    def references_after_shift(self) -> tuple[str, ...]:
        """The shorter throughput references tried in turn (longest first) where the full one
        holds a workload shift; a window not shorter than `bound_reference` is left out."""
        full = seconds(self.a["bound_reference"])
        after = (seconds(v) for v in self.a["bound_reference_after_shift"])
        return tuple(duration(v * self.scale) for v in sorted(after, reverse=True) if v < full)

    @property
    def fleet_interval(self) -> str:
        return self.dur("fleet_interval")

    @property
    def group_gpu_seconds(self) -> str:
        """GPU-seconds each group of each job's step held its GPUs over the fleet interval."""
        return f"project_experiment_group:rlhf_group_gpu_seconds:increase{self.fleet_interval}"

    @property
    def verdict_steps_fleet(self) -> str:
        """Classified steps per verdict over the fleet interval (the values tile the time)."""
        return f"project_experiment_verdict:rlhf_bottleneck_steps:increase{self.fleet_interval}"

    @property
    def regression_steps_fleet(self) -> str:
        """Steps diagnosed a regression of each group over the fleet interval (the values tile
        the time: the fleet's regression panels sum them instead of raw counters)."""
        return f"project_experiment_group:rlhf_regression_steps:increase{self.fleet_interval}"

    @property
    def change_steps_fleet(self) -> str:
        """Steps per change kind but `steady` over the fleet interval (tiles the time)."""
        return f"project_experiment_kind:rlhf_change_steps:increase{self.fleet_interval}"

    @property
    def tokens_vs_best(self) -> str:
        """Tokens per second of step time over the window, over the best baseline: the fleet's
        "Tokens per second ÷ baseline", one recorded series per job."""
        return (
            "project_experiment:rlhf_tokens_per_step_second_vs_best_baseline:"
            f"ratio_rate{self.window}"
        )

    @property
    def throughput_reference(self) -> str:
        return self.dur("throughput_reference")

    @property
    def best_baseline(self) -> str:
        """The throughput alert's and the fleet panel's reference: the job's best baseline
        tokens per second over `alerts.throughput_reference`, or its current baseline where
        that window holds a workload shift (the reference restarts at the shift)."""
        return (
            "project_experiment:rlhf_baseline_tokens_per_second:"
            f"max_over_time{self.throughput_reference}"
        )


# ---------------------------------------------------------------------------------------------


RUNBOOK_SECTIONS: Mapping[str, str] = {
    "Meaning": "meaning",
    "Impact": "impact",
    "Immediate mitigation": "mitigate",
    "Escalation": "escalate",
    "Confirm": "checks",
    "In verl's log and output": "verl_keys",
    "What to change": "change",
    "What the log cannot show": "cannot_show",
}
"""A runbook template's `## headings` and the `Runbook` field each fills."""
TEXT_FIELDS = ("meaning", "impact", "escalate")
ALERT_SECTIONS = ("Summary", "Description")
"""An alert template's `## headings` for the alert's own annotations (not its runbook)."""
FRAGMENT = "Fragment: "
"""A `## Fragment: <name>` section is a piece of text the code fills and puts into another."""


class Prose(NamedTuple):
    """An alert's `summary` and `description` annotations."""

    summary: str
    description: str


def alert_prose(template: str, values: Mapping[str, object] | None = None) -> Prose:
    """The alert's annotations from `templates/runbooks/<template>.md`: its `## Summary` (one
    paragraph) and its `## Description` (each paragraph one line), filled with `values` and
    `${job}` (the job the alert's labels name)."""
    name = f"runbooks/{template}.md"
    found = sections(name)
    filled = {
        heading: [substitute(e, {"job": JOB_NAME, **(values or {})}, name) for e in found[heading]]
        for heading in ALERT_SECTIONS
        if heading in found
    }
    if len(filled.get("Summary", ())) != 1 or not filled.get("Description"):
        raise TemplateError(f"{name}: needs one `## Summary` paragraph and a `## Description`")
    return Prose(filled["Summary"][0], "\n".join(filled["Description"]))


def fragment(template: str, name: str, values: Mapping[str, object] | None = None) -> str:
    """The section `## Fragment: <name>` of `templates/runbooks/<template>.md`, filled."""
    path = f"runbooks/{template}.md"
    entries = sections(path).get(FRAGMENT + name)
    if not entries:
        raise TemplateError(f"{path}: no section `## {FRAGMENT}{name}`")
    return " ".join(substitute(e, {"job": JOB_NAME, **(values or {})}, path) for e in entries)


def shared_prose(section: str) -> list[str]:
    """The entries of one section of `templates/runbooks/shared.md` (prose several runbooks
    repeat)."""
    return list(sections("runbooks/shared.md")[section])


def runbook(
    template: str,
    confirm: list[str],
    values: Mapping[str, object] | None = None,
    **lists: list[str],
) -> Runbook:
    """A runbook: its prose from `templates/runbooks/<template>.md` filled with `values`, its
    PromQL `confirm` (P and E for the job's project and experiment), and any list the code
    builds from tables (its items follow the template's)."""
    name = f"runbooks/{template}.md"
    fields: dict[str, Any] = {"verl_keys": []}
    for heading, entries in sections(name).items():
        if heading in ALERT_SECTIONS or heading.startswith(FRAGMENT):
            continue
        if heading not in RUNBOOK_SECTIONS:
            raise TemplateError(f"{name}: unknown section {heading!r}")
        filled = [substitute(e, values or {}, name) for e in entries]
        key = RUNBOOK_SECTIONS[heading]
        fields[key] = " ".join(filled) if key in TEXT_FIELDS else filled
    for key, items in lists.items():
        fields[key] = [*fields.get(key, []), *items]
    return Runbook(confirm=confirm, **fields)


@dataclass
class Runbook:
    meaning: str
    confirm: list[str]  # PromQL, with P and E for the job's project and experiment
    verl_keys: list[str]  # verl metric keys to read in the job's log (or prose starting "the ")
    change: list[str]  # what to change: verl config keys and other actions (markdown)
    checks: list[str] = field(default_factory=list)  # more ways to confirm (markdown)
    cannot_show: list[str] = field(default_factory=list)  # evidence verl's log lacks (advice)
    impact: str = ""  # what the page costs if nobody acts (every critical alert has one)
    mitigate: list[str] = field(default_factory=list)  # the immediate mitigation, in order
    escalate: str = ""  # whom to call when the mitigation does not help


@dataclass
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    category: str
    summary: str
    description: str
    runbook: Runbook
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def rule(self, runbook_base: str) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, "category": self.category, **self.labels},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                **self.annotations,
                "runbook_url": runbook_url(runbook_base, self.name),
            },
        }


def runbook_url(base: str, alert: str) -> str:
    return f"{base}#{anchor(alert)}"


def anchor(alert: str) -> str:
    """The runbook section's anchor (GitHub's anchor of a `## Name` heading)."""
    return alert.lower()
