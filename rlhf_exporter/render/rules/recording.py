"""Recording rules in `level:metric:operations` form (the table is in the package docstring).

The first group of records is what dashboards and alerts read over the window; the second is
the bound alerts' evidence, precomputed once per evaluation so that an alert's annotation
reads one series instead of running an aggregation per active alert; the third is the
reference the bound alerts compare the window with (read `offset <window>`: the reference
window ends where the window begins).
"""

from __future__ import annotations

from ...diagnosis import CHANGES, VERDICTS
from ...diagnosis.stall import StallLimit
from .model import JOB_KEY, NODES, Context, _num

# The one-hot verdict gauge as one number per job, recorded once per evaluation: a fleet
# panel's range query over 1,000 jobs then reads one series per job instead of evaluating a
# nine-way `or` at every step (measured: bench/prometheus_fleet.py, bench/README.md).
VERDICT_CODE = "project_experiment:rlhf_bottleneck_verdict:code"
VERDICT_CODES = {v: i + 1 for i, v in enumerate(VERDICTS)}  # the dashboards' value mappings


def verdict_code_expr() -> str:
    terms = [f'rlhf_bottleneck{{verdict="{v}"}} * {code}' for v, code in VERDICT_CODES.items()]
    return "max without (verdict) (\n  " + "\n  or ".join(terms) + "\n)"


# The one-hot verdict gauge's hot series alone (1 for the last step's verdict, the other eight
# absent), one per job (`JOB_KEY`: a job's replicas and pods folded at record time), recorded
# every `alerts.fleet_interval`: the fleet's "Jobs per verdict" counts it by a label it already
# has, with no aggregation of its own at every step, instead of `count_values` over the codes
# (which formats every sample's value into a new label at every step).
VERDICT_HOT = "project_experiment_verdict:rlhf_bottleneck:hot"


# The last step's change as one number per job, likewise (0 steady, then the kinds in order).
CHANGE_CODE = "project_experiment:rlhf_change:code"
CHANGE_CODES = {c: i for i, c in enumerate(CHANGES)}
CHANGED = "|".join(CHANGES[1:])  # the kinds that are news (every kind but `steady`)


def change_code_expr() -> str:
    terms = [f'rlhf_change{{kind="{k}"}} * {code}' for k, code in CHANGE_CODES.items() if code]
    return "max without (kind) (\n  " + "\n  or ".join(terms) + "\n)"


# Each job's GPUs (verl's own definition: perf/throughput = total_num_tokens /
# (timing_s/step x n_gpus)), and the GPU-seconds each group of the step held them, per
# `alerts.fleet_interval`: the fleet's GPU-time panels sum these instead of joining every
# job's counters with its GPU count at every point.
JOB_GPUS = "project_experiment:rlhf_gpus:round"


def job_gpus_expr() -> str:
    return (
        "round(rlhf_step_tokens\n"
        "  / (rlhf_step_duration_seconds * (rlhf_throughput_tokens_per_gpu_second > 0)))"
    )


def fleet_records(ctx: Context) -> list[dict[str, str]]:
    """The fleet dashboard's steps per verdict, regressed and changed steps and GPU
    time, one record per job and verdict, group or kind every `alerts.fleet_interval`, over
    that interval: consecutive values tile the
    time, so a panel sums them over its range (`sum_over_time`) instead of reading every
    raw sample of the range. And each job's current verdict (`VERDICT_HOT`), for the jobs
    per verdict, and its groups' regressed steps over the window where there are some (for
    the regressed steps per job: the others' zeros are never read)."""
    f = ctx.fleet_interval
    return [
        {
            "record": ctx.verdict_steps_fleet,
            "expr": f"increase(rlhf_bottleneck_steps_total[{f}])",
        },
        {
            "record": ctx.regression_steps_fleet,
            "expr": f"increase(rlhf_regression_steps_total[{f}])",
        },
        {
            "record": ctx.change_steps_fleet,
            # the news kinds by name, never `kind!="steady"`: right whichever value the
            # deprecated legacy_change_none setting serves for a steady step
            "expr": f'increase(rlhf_change_steps_total{{kind=~"{CHANGED}"}}[{f}])',
        },
        {"record": VERDICT_HOT, "expr": f"max by ({JOB_KEY}, verdict) (rlhf_bottleneck == 1)"},
        {"record": ctx.regressions_nonzero, "expr": f"{ctx.regressions} > 0"},
        {"record": JOB_GPUS, "expr": job_gpus_expr()},
        {
            "record": ctx.group_gpu_seconds,
            "expr": (
                f"increase(rlhf_group_seconds_total[{f}])\n"
                f"* ignoring (group) group_left ()\n{JOB_GPUS}"
            ),
        },
    ]


def _ratio(numerator: str, label: str, floor: str = "> 0") -> str:
    """Each series of `numerator` over their sum across `label` (kept where the sum `floor`)."""
    return (
        f"{numerator}\n/ ignoring ({label}) group_left ()\n"
        f"(sum without ({label}) ({numerator}) {floor})"
    )


def window_records(ctx: Context) -> list[dict[str, str]]:
    """The window's shares, rates and codes (group `rlhf-exporter.recording`)."""
    w = ctx.window
    return [
        {"record": ctx.share, "expr": _ratio(f"increase(rlhf_group_seconds_total[{w}])", "group")},
        {
            "record": ctx.verdicts,
            "expr": _ratio(f"increase(rlhf_bottleneck_steps_total[{w}])", "verdict"),
        },
        {"record": ctx.step_rate, "expr": f"rate(rlhf_steps_total[{w}])"},
        {
            "record": ctx.tokens_rate,
            "expr": f"rate(rlhf_tokens_total[{w}])\n/ (rate(rlhf_step_seconds_total[{w}]) > 0)",
        },
        {"record": VERDICT_CODE, "expr": verdict_code_expr()},
        {"record": CHANGE_CODE, "expr": change_code_expr()},
    ]


def reason_records(ctx: Context) -> list[dict[str, str]]:
    """The window's reasons per verdict and the dominant one (group
    `rlhf-exporter.recording.reasons`: the costliest ratio, read by the next rule)."""
    w = ctx.window
    return [
        {
            "record": ctx.reasons,
            "expr": _ratio(f"increase(rlhf_bottleneck_reason_steps_total[{w}])", "reason"),
        },
        {  # the dominant reason of each verdict (ties keep every tied reason)
            "record": ctx.top_reasons,
            "expr": (
                f"{ctx.reasons}\n== ignoring (reason) group_left ()\n"
                f"max without (reason) ({ctx.reasons})"
            ),
        },
    ]


def change_gpu_records(ctx: Context) -> list[dict[str, str]]:
    """The window's regressions, changes and GPU busy ratios (group
    `rlhf-exporter.recording.changes`)."""
    w = ctx.window
    return [
        {"record": ctx.regressions, "expr": f"increase(rlhf_regression_steps_total[{w}])"},
        {
            "record": ctx.changes,
            "expr": _ratio(f"increase(rlhf_change_steps_total[{w}])", "kind"),
        },
        {"record": ctx.gpu_busy, "expr": f"rate(rlhf_gpu_busy_seconds_total[{w}])"},
        {
            "record": ctx.gpus_busy,
            # every node's GPUs of the job (GPU series carry their job)
            "expr": (
                f"avg without (gpu, uuid, {NODES}) (\n"
                f'  rate(rlhf_gpu_busy_seconds_total{{project!=""}}[{w}])\n)'
            ),
        },
    ]


def evidence_records(ctx: Context) -> list[dict[str, str]]:
    """What the bound alerts' annotations show, one series per job (the dominant reason is
    `reason_records`')."""
    w = ctx.window
    gen = 'rlhf_agent_loop_seconds{part="generate_sequences",stat="%s"}'
    return [
        {  # the untimed remainder's part of the `other` window
            "record": ctx.untimed,
            "expr": (
                f"increase(rlhf_untimed_seconds_total[{w}])\n/ ignoring (group)\n"
                f'(increase(rlhf_group_seconds_total{{group="other"}}[{w}]) > 0)'
            ),
        },
        {  # agent-loop generate_sequences max / mean (the long-tail test)
            "record": ctx.generate_spread,
            "expr": f"{gen % 'max'}\n/ ignoring (stat)\n({gen % 'mean'} > 0)",
        },
    ]


def reference_records(ctx: Context) -> list[dict[str, str]]:
    """The references the window is compared with, over `alerts.bound_reference` (the bound
    alerts: which verdict dominated, and the throughput, only where it holds
    `bound_reference_min_steps` steps) and `alerts.throughput_reference` (the throughput
    alert and the fleet's "Tokens per second ÷ baseline": the best baseline). They move
    slowly: their own group runs every `alerts.bound_reference_interval`, and each long
    range is read once per evaluation (recorded, then divided), never per panel point.

    A reference never mixes two workloads: where its window holds a workload-shift step, the
    throughput reference restarts: it is the one over the longest of
    `alerts.bound_reference_after_shift` that holds none, else absent (the "costs" branch waits until a window holds the new
    work only; "moved" still compares verdicts); the best baseline restarts at the job's
    current baseline (which follows the new work within about ten steps)."""
    r, t, after = ctx.reference, ctx.throughput_reference, ctx.references_after_shift
    n = _num(ctx.a["bound_reference_min_steps"])
    shift = 'rlhf_change_steps_total{kind="workload_shift"}'
    shift_records = [
        {"record": ctx.shift_steps(w), "expr": f"sum without (kind) (increase({shift}[{w}]))"}
        for w in dict.fromkeys((r, *after, t))
    ]

    def tokens(w: str) -> str:
        return (
            f"rate(rlhf_tokens_total[{w}])\n  / (rate(rlhf_step_seconds_total[{w}]) > 0)\n"
            f"  unless {ctx.shift_steps(w)} > 0"
        )

    return [
        *shift_records,
        {"record": ctx.verdict_steps_ref, "expr": f"increase(rlhf_bottleneck_steps_total[{r}])"},
        {
            "record": ctx.verdicts_ref,
            "expr": (
                f"{ctx.verdict_steps_ref}\n/ ignoring (verdict) group_left ()\n"
                f"(sum without (verdict) ({ctx.verdict_steps_ref}) >= {n})"
            ),
        },
        {  # the reference window, or the longest shorter one that holds no workload shift
            "record": ctx.tokens_rate_ref,
            "expr": "\nor ".join(f"(\n  {tokens(w)}\n)" for w in (r, *after)),
        },
        {
            "record": ctx.best_baseline,
            "expr": (
                f"max_over_time(rlhf_baseline_tokens_per_second[{t}])\n"
                f"unless {ctx.shift_steps(t)} > 0\n"
                # the current baseline; `* 1` drops the name, as max_over_time does, so that a
                # job is one series whichever side answers
                "or rlhf_baseline_tokens_per_second * 1"
            ),
        },
        {
            "record": ctx.tokens_vs_best,
            "expr": f"{ctx.tokens_rate}\n/ ({ctx.best_baseline} > 0)",
        },
    ]


def stall_limit(ctx: Context) -> str:
    """Seconds a job may go without a step: max(stall_factor x its baseline step time,
    stall_min) (stall_min alone before a baseline), plus the longest validation and
    checkpoint seen in its run (they run between two records, outside timing_s/step)."""
    limit = StallLimit.of(ctx.a, ctx.scale)  # the exporter's own readers use the same
    factor, floor = limit.factor, _num(limit.minimum)
    last = "rlhf_last_step_timestamp_seconds"
    return (
        f"(\n  clamp_min({_num(factor)} * rlhf_baseline_step_duration_seconds, {floor})\n"
        f"  or 0 * {last} + {floor}\n)\n"
        f"+ (rlhf_between_steps_max_seconds or 0 * {last})"
    )


JOB_STATE_CODES = {"running": 1, "finished": 2, "failed": 3, "stalled": 4, "unknown": 5}
"""The job state as one number (one series per job: its last value is its last state)."""


def _live_code() -> str:
    terms = [
        f'(rlhf_job_state{{state="{s}"}} == 1) * {c}'
        for s, c in JOB_STATE_CODES.items()
        if s != "stalled"
    ]
    return "max without (state) (\n    " + "\n    or ".join(terms) + "\n  )"


def state_code_expr(ctx: Context) -> str:
    """The job's state code: stalled is a running job past its stall budget. A job that no
    target exports any more (its exporter down or gone, its log unmounted) keeps the code it
    had when last seen, for `alerts.blind_lookback` after its last series: its page neither
    resolves nor changes by blindness (a job that was stepping is RLHFJobUnwatched's)."""
    live = _live_code()
    stalled = JOB_STATE_CODES["stalled"]
    return (
        f"(\n  ({live} == 1)\n  and ({ctx.stall_budget} > 1)\n) * {stalled}\n"
        f"or\n  {live}\n"
        f"or {_carried(ctx, ctx.job_state_code)}"
    )


def _carried(ctx: Context, record: str) -> str:
    """`record`'s own last value, for a job that no target exports now but whose target
    exported it within `alerts.blind_lookback` (a job exported elsewhere, such as by a
    replaced pod, is not carried)."""
    return (
        f"(\n  last_over_time({record}[{ctx.carry}])\n"
        f"  unless on ({JOB_KEY}) rlhf_job_state\n"
        f"  and on ({JOB_KEY}, job, instance)\n"
        f'  last_over_time(rlhf_job_state{{state="running"}}[{ctx.blind}])\n)'
    )


def lifecycle_records(ctx: Context) -> list[dict[str, str]]:
    """The one definition of a job's stall budget and state: the alerts and the fleet
    dashboard read these records, so they cannot disagree. A job no target exports any more
    keeps its last budget and state (frozen) for `alerts.blind_lookback`."""
    state_max = " or ".join(
        f'label_replace(clamp({ctx.job_state_code} == {c}, 1, 1), "state", "{s}", "", "")'
        for s, c in JOB_STATE_CODES.items()
    )
    return [
        {
            "record": ctx.stall_budget,
            "expr": (
                f"(time() - rlhf_last_step_timestamp_seconds)\n/ (\n{stall_limit(ctx)}\n)\n"
                f"or {_carried(ctx, ctx.stall_budget)}"
            ),
        },
        {"record": ctx.job_state_code, "expr": state_code_expr(ctx)},
        {"record": ctx.job_state, "expr": state_max.replace(" or ", "\nor ")},
    ]


def recording(ctx: Context) -> list[dict[str, str]]:
    """Every record, in file order (the window and evidence group, the lifecycle group, the
    reference group, then the fleet group)."""
    return (
        window_records(ctx) + reason_records(ctx) + change_gpu_records(ctx)
        + evidence_records(ctx) + lifecycle_records(ctx)
        + reference_records(ctx) + fleet_records(ctx)
    )  # fmt: skip
