"""The decision table's alerts: one function per row (the bound alerts, each with its evidence
beside it), the regression alert and the throughput alert.

A bound alert fires only when it says something new about the job: the job is
X-bound over `alerts.window` and either

- **moved**: another verdict dominated the reference window (`alerts.bound_reference`, the
  time just before the window), or
- **costs**: its tokens per second of step time over the window fell below
  `alerts.bound_throughput_ratio` x their value over the reference window, and no step of
  the window was a workload shift. The reference never mixes two workloads: where its
  window holds a workload shift it restarts (`alerts.bound_reference_after_shift`), or is
  absent until a window holds the new work only.

A job that is steadily X-bound at its usual throughput fires nothing: the dashboards and the
exporter's `/` page show the steady bottleneck.
"""

from __future__ import annotations

from collections.abc import Callable

from ...diagnosis import GROUPS, REASONS
from ...diagnosis.advice import LOOK_AT, REASON_MEANING, VERDICT_MEANING, caveats, config_traps
from .model import (
    BOUND_ALERTS,
    JOB_ARGS,
    JOB_MATCH,
    Alert,
    Context,
    _num,
    _tq,
    alert_prose,
    fill,
    fragment,
    query_first,
    query_open,
    runbook,
)
from .verl_keys import VERL_EVIDENCE_KEYS, VERL_KEYS

NOT_BEFORE = ("checkpoint", "unknown")
"""Verdicts that never count as the one a job moved from."""

VERDICT_WAS = '{{ $v := . | first | label "verdict" }}{{ if eq $v "balanced" }}balanced{{ else }}{{ $v }}-bound{{ end }}'
"""The verdict the job moved from, as words: `rollout-bound`, or `balanced`."""

STEADY_STATE = fragment("shared", "the steady state")
"""Where the steady bottleneck is shown instead of being notified."""


# ---------------------------------------------------------------------------------------------
# The parts every bound alert shares.


def _dominant(ctx: Context, verdict: str) -> str:
    return f'{ctx.verdicts}{{verdict="{verdict}"}} >= {_num(ctx.a["bound_fraction"])}'


def _previous(ctx: Context, verdict: str, match: str = "") -> str:
    """Another verdict that dominated the reference window (the time before the window).
    `balanced` counts (a job that had no bottleneck and now has one moved); `checkpoint` and
    `unknown` do not (no window of the loop, no timing)."""
    return (
        f'{ctx.verdicts_ref}{{verdict!~"{verdict}|{"|".join(NOT_BEFORE)}"{match}}} offset {ctx.window}'
        f" >= {_num(ctx.a['bound_fraction'])}"
    )


def bound_expr(ctx: Context, verdict: str) -> str:
    """X-bound now, and either moved (another verdict dominated the reference window) or
    costs (throughput below its reference, and not a workload shift)."""
    return fill(
        "<dominant>\n"
        "and ignoring (verdict) (\n"
        "  # moved: another verdict dominated the <ref> before the window\n"
        "  <previous>\n"
        "  or ignoring (verdict)\n"
        "  # costs: tokens per second of step time below their reference, not a workload shift\n"
        "  (\n"
        "    <tokens> < <ratio> * <tokens_ref> offset <w>\n"
        '    unless ignoring (kind) <changes>{kind="workload_shift"} > 0\n'
        "  )\n"
        ")",
        dominant=_dominant(ctx, verdict),
        previous=_previous(ctx, verdict),
        ref=ctx.reference,
        w=ctx.window,
        tokens=ctx.tokens_rate,
        tokens_ref=ctx.tokens_rate_ref,
        ratio=_num(ctx.a["bound_throughput_ratio"]),
        changes=ctx.changes,
    )


def _throughput_ratio(ctx: Context) -> str:
    return (
        f"{ctx.tokens_rate}{{{JOB_MATCH}}} / {ctx.tokens_rate_ref}{{{JOB_MATCH}}} "
        f"offset {ctx.window}"
    )


def _annotation_values(ctx: Context, verdict: str, evidence: list[str]) -> dict[str, str]:
    """The Go-template pieces of a bound alert's summary and description (`runbooks/bound.md`):
    an `if_` value opens a query whose result the text after it reads, up to `{{ else }}`."""
    both = f"{JOB_ARGS} {JOB_ARGS}"
    share = _tq(f'{ctx.share}{{group="{verdict}",{JOB_MATCH}}}', "humanizePercentage")
    return {
        "if_moved": query_open(_previous(ctx, verdict, "," + JOB_MATCH)),
        "was": VERDICT_WAS,
        "if_costs": query_open(_throughput_ratio(ctx), both),
        "tokens_now": _tq(f"{ctx.tokens_rate}{{{JOB_MATCH}}}", "humanize"),
        "tokens_before": _tq(
            f"{ctx.tokens_rate_ref}{{{JOB_MATCH}}} offset {ctx.window}", "humanize"
        ),
        "tokens_share": _tq(_throughput_ratio(ctx), "humanizePercentage", args=both),
        "if_top_reason": query_open(f'{ctx.top_reasons}{{verdict="{verdict}",{JOB_MATCH}}}'),
        "reason_meanings": _reason_meanings(verdict),
        "evidence": "; ".join(
            [fragment("bound", "share", {"verdict": verdict, "share": share}), *evidence]
        ),
    }


def _reason_meanings(verdict: str) -> str:
    """What the dominant reason `$r` means and where to look next, one branch per reason."""
    branches = []
    for i, reason in enumerate(REASONS[verdict]):
        kw = "if" if i == 0 else "else if"
        look = LOOK_AT.get((verdict, reason), "")
        text = f": {REASON_MEANING[reason]}."
        if look:
            text += " " + fragment("bound", "look next", {"look": look})
        branches.append(f'{{{{ {kw} eq $r "{reason}" }}}}{text}')
    return "".join(branches) + "{{ else }}.{{ end }}"


def _reason_annotation(ctx: Context, verdict: str) -> str:
    return query_first(
        f'{ctx.top_reasons}{{verdict="{verdict}",{JOB_MATCH}}}',
        '{{ . | first | label "reason" }}',
        "none",
    )


def bound(ctx: Context, verdict: str, evidence: list[str], confirm: list[str]) -> Alert:
    """The bound alert of one decision-table row; `evidence` (annotation templates) and
    `confirm` (PromQL for the runbook) are the row's own."""
    name = BOUND_ALERTS[verdict]
    w, ref, frac = ctx.window, ctx.reference, ctx.a["bound_fraction"]
    ratio = ctx.a["bound_throughput_ratio"]
    example = "update" if verdict == "rollout" else "rollout"
    values = {
        "verdict": verdict,
        "verdict_meaning": VERDICT_MEANING[verdict],
        "fraction": _num(frac * 100),
        "window": w,
        "reference": ref,
        "example": example,
        "min_steps": _num(ctx.a["bound_reference_min_steps"]),
        "ratio": f"{ratio:.0%}",
        "steady_state": STEADY_STATE,
    }
    text = alert_prose("bound", {**values, **_annotation_values(ctx, verdict, evidence)})
    rests = {rest for _, rest in ctx.th.split_timers.values()}  # windows verl does not log
    timers = [f"timing_s/{t}" for t in ctx.th.document["groups"][verdict] if t not in rests]
    change = []
    for reason in REASONS[verdict]:
        keys = ", ".join(f"`{k}`" for k in VERL_KEYS.get((verdict, reason), ()))
        look = LOOK_AT.get((verdict, reason), "")
        change.append(
            f"`{reason}` ({REASON_MEANING[reason]}): look at {look}" + (f"; {keys}" if keys else "")
        )
        change += [t for t in config_traps(verdict, reason) if t not in change]
    return Alert(
        name=name,
        expr=bound_expr(ctx, verdict),
        for_=ctx.dur("bound_for"),
        severity="info",
        category="bottleneck",
        summary=text.summary,
        description=text.description,
        annotations={"reason": _reason_annotation(ctx, verdict)},
        runbook=runbook(
            "bound",
            [
                f'{ctx.verdicts}{{project="P", experiment="E"}}',
                f'{ctx.verdicts_ref}{{project="P", experiment="E"}} offset {w}',
                f'{ctx.tokens_rate}{{project="P", experiment="E"}}',
                f'{ctx.tokens_rate_ref}{{project="P", experiment="E"}} offset {w}',
                f'{ctx.top_reasons}{{verdict="{verdict}", project="P", experiment="E"}}',
                f'{ctx.share}{{project="P", experiment="E"}}',
                *confirm,
            ],
            values,
            verl_keys=[*timers, *VERL_EVIDENCE_KEYS[verdict]],
            change=change,
            cannot_show=list(
                dict.fromkeys(c for r in (None, *REASONS[verdict]) for c in caveats(verdict, r))
            ),
        ),
    )


def _mfu(ctx: Context, stage: str) -> str:
    mfu = _tq(f'rlhf_mfu_ratio{{stage="{stage}",{JOB_MATCH}}}', "humanizePercentage")
    return fragment(
        "bound",
        "MFU",
        {"stage": stage, "mfu": mfu, "compute_bound": f"{ctx.th.mfu_compute_bound:.0%}"},
    )


# ---------------------------------------------------------------------------------------------
# One function per row of the decision table.


def rollout_bound(ctx: Context) -> Alert:
    spread = _tq(f"{ctx.generate_spread}{{{JOB_MATCH}}}", 'printf "%.1f"')
    long_tail = _num(ctx.th.long_tail_generate_ratio)
    preempted = _tq(f"rlhf_agent_loop_preempted_max{{{JOB_MATCH}}}", "humanize")
    evidence = [
        fragment("bound", "generate spread", {"spread": spread, "long_tail": long_tail}),
        fragment("bound", "preemptions", {"preempted": preempted}),
    ]
    confirm = [
        f'{ctx.generate_spread}{{project="P", experiment="E"}}',
        'rlhf_agent_loop_seconds{project="P", experiment="E", part="generate_sequences"}',
        # beside long_tail: aborted samples skew the response-length fallback (verl 0.9);
        # fully-async logs per-sample generation times instead of agent_loop/*
        'rlhf_response_aborted_ratio{project="P", experiment="E"}',
        'rlhf_response_length_non_aborted_tokens{project="P", experiment="E"}',
        'rlhf_fully_async_processing_seconds{project="P", experiment="E"}',
    ]
    return bound(ctx, "rollout", evidence, confirm)


def reward_bound(ctx: Context) -> Alert:
    return bound(ctx, "reward", [], [])


def logprob_bound(ctx: Context) -> Alert:
    return bound(
        ctx, "logprob", [_mfu(ctx, "actor_infer")], ['rlhf_mfu_ratio{project="P", experiment="E"}']
    )


def update_bound(ctx: Context) -> Alert:
    return bound(
        ctx, "update", [_mfu(ctx, "actor")], ['rlhf_mfu_ratio{project="P", experiment="E"}']
    )


def sync_bound(ctx: Context) -> Alert:
    return bound(ctx, "sync", [], [])


def driver_overhead_bound(ctx: Context) -> Alert:
    untimed = _tq(f"{ctx.untimed}{{{JOB_MATCH}}}", "humanizePercentage")
    evidence = [
        fragment(
            "bound",
            "untimed driver time",
            {"untimed": untimed, "untimed_fraction": f"{ctx.th.untimed_fraction:.0%}"},
        )
    ]
    return bound(ctx, "other", evidence, [f'{ctx.untimed}{{project="P", experiment="E"}}'])


BOUND: dict[str, Callable[[Context], Alert]] = {
    "rollout": rollout_bound,
    "reward": reward_bound,
    "logprob": logprob_bound,
    "update": update_bound,
    "sync": sync_bound,
    "other": driver_overhead_bound,
}
assert list(BOUND) == list(BOUND_ALERTS)


# ---------------------------------------------------------------------------------------------
# Change against the job's own baseline.


def regression(ctx: Context) -> Alert:
    """Steps of the job regressed a group: it costs more than its work explains."""
    w, n = ctx.window, ctx.a["regression_min_steps"]
    cost = 'rlhf_group_cost_seconds_per_token{group="%s",' + JOB_MATCH + "}"
    base = 'rlhf_baseline_group_cost_seconds_per_token{group="%s",' + JOB_MATCH + "}"
    args = "$labels.group " + JOB_ARGS
    change = []
    for group in (g for g in GROUPS if g != "checkpoint"):
        keys = sorted({k for (v, _), ks in VERL_KEYS.items() if v == group for k in ks})
        change.append(f"`{group}`: " + ", ".join(f"`{k}`" for k in keys))
    values = {
        "window": w,
        "cost": _tq(cost, 'printf "%.3g"', args),
        "baseline": _tq(base, 'printf "%.3g"', args),
    }
    text = alert_prose("RLHFJobRegression", values)
    return Alert(
        name="RLHFJobRegression",
        expr=f"{ctx.regressions} >= {_num(n)}",
        for_=ctx.dur("regression_for"),
        severity="warning",
        category="regression",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFJobRegression",
            [
                f'{ctx.regressions}{{project="P", experiment="E"}}',
                'rlhf_group_cost_seconds_per_token{project="P", experiment="E"}',
                'rlhf_baseline_group_cost_seconds_per_token{project="P", experiment="E"}',
                f'{ctx.changes}{{project="P", experiment="E"}}',
            ],
            values,
            change=change,
        ),
    )


def throughput_below_baseline(ctx: Context) -> Alert:
    """The job runs far below the best of its own recent baselines."""
    w, ratio, ref = (
        ctx.window,
        ctx.a["throughput_drop_ratio"],
        ctx.dur("throughput_reference"),
    )
    best = ctx.best_baseline
    values = {
        "window": w,
        "ratio": _num(ratio),
        "percent": f"{ratio:.0%}",
        "reference": ref,
        "best": _tq(f"{best}{{{JOB_MATCH}}}", "humanize"),
    }
    text = alert_prose("RLHFJobThroughputBelowBaseline", values)
    return Alert(
        name="RLHFJobThroughputBelowBaseline",
        expr=(
            f"{ctx.tokens_rate}\n  < {_num(ratio)} * {best}\n"
            f'unless ignoring (kind)\n  increase(rlhf_change_steps_total{{kind="workload_shift"}}[{w}]) > 0'
        ),
        for_=ctx.dur("throughput_drop_for"),
        severity="warning",
        category="throughput",
        summary=text.summary,
        description=text.description,
        runbook=runbook(
            "RLHFJobThroughputBelowBaseline",
            [
                f'{ctx.tokens_rate}{{project="P", experiment="E"}}',
                f'{best}{{project="P", experiment="E"}}',
                f'{ctx.regressions}{{project="P", experiment="E"}}',
                f'{ctx.verdicts}{{project="P", experiment="E"}}',
            ],
            values,
        ),
    )


ALERTS: tuple[Callable[[Context], Alert], ...] = (
    *BOUND.values(),
    regression,
    throughput_below_baseline,
)
"""The decision-table group, in file order."""


def alerts(ctx: Context) -> list[Alert]:
    return [make(ctx) for make in ALERTS]
