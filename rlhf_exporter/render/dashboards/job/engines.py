"""The job dashboard's "Engines" row: what vLLM / SGLang did during the rollout windows
(docs/engines.md)."""

from __future__ import annotations

from typing import Any

from .. import style
from ..context import DashboardContext
from ..layout import Cell, Row
from ..panels import (
    PanelBuilder,
    Q,
    colour_by_thresholds,
    threshold_line,
    thresholds,
    time_series,
)
from ..queries import (
    JOB_LEGEND,
    sel,
)

ENGINE_REPLICA_LEGEND = "{{project}}/{{experiment}} {{replica}}"


def _engine(c: DashboardContext) -> dict[str, Any]:
    return dict(c.th.document["engine"])


def engine_requests(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Engines: running and waiting requests",
        "Over each step's rollout window W, summed over the rollout replicas: the peak and the "
        "time-weighted mean of running requests, and the mean of waiting (queued) requests. "
        "Requests waiting while the KV cache has room is `queueing`; waiting with a full cache "
        "is `kv_pressure` (docs/engines.md).",
        [
            Q(sel("rlhf_engine_running_requests_peak"), JOB_LEGEND + " running, peak"),
            Q(sel("rlhf_engine_running_requests_mean"), JOB_LEGEND + " running, mean"),
            Q(sel("rlhf_engine_waiting_requests_mean"), JOB_LEGEND + " waiting, mean"),
        ],
        style.PLAIN,
        fill=0,
    ).min(0)


def engine_kv_cache(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return threshold_line(
        time_series(
            "Engines: KV-cache usage, highest during W",
            "The highest KV-cache usage of any replica (and of each replica) during the step's "
            f"rollout window. At or above {e['kv_full']:g} (dashed line) with requests waiting "
            f"for {e['kv_pressure_share']:g} of W the reason is kv_pressure; waiting below "
            f"{e['kv_free']:g} is queueing.",
            [
                Q(sel("rlhf_engine_kv_cache_usage_max_ratio"), JOB_LEGEND),
                Q(sel("rlhf_engine_replica_kv_cache_usage_max_ratio"), ENGINE_REPLICA_LEGEND),
            ],
            style.RATIO,
            fill=0,
        )
        .min(0)
        .max(1),
        float(e["kv_full"]),
    )


def engine_preemptions(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return (
        time_series(
            "Engines: preemptions during W",
            "vllm:num_preemptions_total / sglang:num_retracted_requests_total: their increase over "
            f"the step's rollout window, summed over replicas. Above {e['preemptions_min']:g} the "
            "reason is preemption (verl's own agent_loop/num_preempted is never reported).",
            [Q(sel("rlhf_engine_window_preemptions"), JOB_LEGEND)],
            style.PLAIN,
            bars=True,
        )
        .thresholds(thresholds(style.OK, (float(e["preemptions_min"]) + 1, style.BAD)))
        .color_scheme(colour_by_thresholds())
        .min(0)
    )


def engine_tokens_per_replica(c: DashboardContext) -> PanelBuilder:
    return time_series(
        "Engines: tokens per replica during W",
        "Tokens each rollout replica generated during the step's rollout window "
        '(vllm:generation_tokens_total; SGLang: sglang:realtime_tokens_total{mode="decode"}, '
        "else sglang:generation_tokens_total). One replica far "
        "above the others: replica_imbalance (next panel).",
        [Q(sel("rlhf_engine_replica_generated_tokens"), ENGINE_REPLICA_LEGEND)],
        style.TOKENS,
        fill=0,
    ).min(0)


def engine_imbalance(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return threshold_line(
        time_series(
            "Engines: token imbalance (max ÷ mean replica)",
            "The busiest replica's tokens over the mean replica's during W. At or above "
            f"{e['imbalance_ratio']:g} (dashed line) the reason is replica_imbalance (one slow "
            "node, an uneven load).",
            [Q(sel("rlhf_engine_imbalance_ratio"), JOB_LEGEND)],
            "suffix:×",
            fill=0,
        ).min(0),
        float(e["imbalance_ratio"]),
        style.WARN,
    )


def engine_window_shares(c: DashboardContext) -> PanelBuilder:
    e = _engine(c)
    return time_series(
        "Engines: share of W by condition, and coverage",
        f"kv_pressure (KV ≥ {e['kv_full']:g} with requests waiting; the reason at "
        f"{e['kv_pressure_share']:g}), queueing (waiting with KV < {e['kv_free']:g}; at "
        f"{e['queueing_share']:g}), long_tail (running ≤ {e['long_tail_running_ratio']:g} × peak; "
        f"at {e['long_tail_share']:g}). Coverage: the least-covered replica's share of W; below "
        f"{e['min_coverage']:g} the evidence is not usable and the log's reasons apply.",
        [
            Q(sel("rlhf_engine_window_share_ratio"), JOB_LEGEND + " {{condition}}"),
            Q(sel("rlhf_engine_coverage_ratio"), JOB_LEGEND + " coverage"),
        ],
        style.RATIO,
        fill=0,
    ).min(0)


def engines_row(c: DashboardContext) -> Row:
    return Row(
        550,
        "Engines: what vLLM / SGLang did during the rollout windows",
        [
            Cell(engine_requests(c), w=8, h=8),
            Cell(engine_kv_cache(c), w=8, h=8),
            Cell(engine_preemptions(c), w=8, h=8),
            Cell(engine_tokens_per_replica(c), w=8, h=8),
            Cell(engine_imbalance(c), w=8, h=8),
            Cell(engine_window_shares(c), w=8, h=8),
        ],
    )
