#!/usr/bin/env python3
"""Write the engine fixtures: vLLM's and SGLang's /metrics pages from their OWN metric code.

    python scripts/engine-pages.py [--wheels DIR] [--out tests/fixtures/engine_pages]

1. Gets the pinned wheels (`pip download --no-deps vllm==0.33.0 sglang==0.5.23` into DIR, once)
   and unpacks only their metric modules: vLLM's `vllm/v1/metrics/` (PrometheusStatLogger and
   the stats dataclasses it reads) and SGLang's `sglang/srt/observability/metrics_collector.py`
   (SchedulerMetricsCollector, TokenizerMetricsCollector) with the two small helpers it uses.
2. Runs each scenario in a fresh interpreter: the engines' heavy imports (torch, the engine
   config classes, SGLang's runtime context, msgspec) are stubbed with the few attributes the
   metric code reads, then the engines' real loggers are driven through scripted windows, one
   engine step at a time, exactly as their schedulers call them (vLLM: `record()` with
   SchedulerStats/IterationStats every step; SGLang: `log_stats()` at its log interval on the
   stats rank, `increment_realtime_tokens()` every decode step on the stats rank,
   `increment_retracted_reqs()` on EVERY TP rank, `observe_one_finished_request()` in the
   tokenizer when a request finishes). Pages are what the engines' HTTP servers serve:
   vLLM `generate_latest(REGISTRY)`, SGLang a MultiProcessCollector registry over
   PROMETHEUS_MULTIPROC_DIR (sglang/srt/utils/common.py `add_prometheus_middleware`).
3. Writes `<scenario>.json.gz` per scenario: every replica's page at every sample time, the
   rollout spans W and the scripted truth (computed from the script, not from the pages).

The tests (tests/test_engine_pages.py) serve these pages over 127.0.0.1 and read them with the
real scraper. Only prometheus_client is needed besides the wheels; no GPU, no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

VLLM = "0.33.0"
SGLANG = "0.5.23"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
T0 = 1_000_000.0
SPANS = [(T0, T0 + 4.0), (T0 + 5.0, T0 + 25.0)]  # e.g. switch_wait, then gen
START, END = T0 - 3.0, T0 + 26.0
SAMPLE_DT = 0.5  # the scraper's reads
STEP = 0.025  # one engine step (scheduler iteration)
SGLANG_LOG_EVERY = 10  # log_stats every 10 decode steps (0.25 s) on the stats rank

VLLM_FILES = (
    "vllm/v1/metrics/loggers.py",
    "vllm/v1/metrics/stats.py",
    "vllm/v1/metrics/buckets.py",
    "vllm/v1/metrics/utils.py",
    "vllm/v1/metrics/prometheus.py",
    "vllm/v1/metrics/cache_hit_source.py",
)
SGLANG_FILES = (
    "sglang/srt/observability/metrics_collector.py",
    "sglang/srt/observability/utils.py",
    "sglang/srt/utils/gauge_histogram.py",
)


# -- the script: what each replica's engine does --------------------------------------------
@dataclass(frozen=True)
class Seg:
    """A replica's state for the part of the rollout window up to fraction `until`."""

    until: float
    running: float
    waiting: float  # waiting for capacity
    kv: float
    tokens_per_s: float
    preempt_per_s: float = 0.0
    deferred: float = 0.0  # vLLM: waiting, deferred (LoRA budget, KV transfer)


IDLE = Seg(1.0, 0, 0, 0.02, 0.0)


@dataclass
class Rep:
    profile: tuple[Seg, ...]
    tp: int = 1
    dp: int = 1  # data-parallel engines inside one server (vLLM engine=, SGLang dp_rank=)
    pp: int = 1  # SGLang pipeline stages (pp_rank=): each runs the same scheduler loop
    ep: bool = False  # SGLang expert parallelism over the TP ranks (moe_ep_rank = tp_rank)
    priority: bool = False  # SGLang --enable-priority-scheduling
    # SGLang: times (fraction of the rollout window, may be < 0 or > 1) at which the batch's
    # requests finish (generation_tokens_total grows then, by what was decoded since)
    finish_at: tuple[float, ...] = ()
    retract_burst: tuple[float, int] | None = None  # (window fraction, requests) once
    name: str = ""


def state(r: Rep, t: float) -> Seg:
    a, b = SPANS[0][0], SPANS[-1][1]
    if not a <= t < b:
        return IDLE
    u = (t - a) / (b - a)
    for seg in r.profile:
        if u < seg.until:
            return seg
    return r.profile[-1]


@dataclass(frozen=True)
class Scenario:
    engine: str
    replicas: tuple[Rep, ...]
    reason: str | None
    about: str
    fixes: tuple[str, ...] = field(default=())


def _steady(running: float, kv: float, rate: float, waiting: float = 0.0) -> tuple[Seg, ...]:
    return (Seg(1.0, running, waiting, kv, rate),)


KV_TAIL = (Seg(0.5, 48, 6, 0.98, 900, 0.6), Seg(0.65, 20, 0, 0.7, 400), Seg(1.0, 2, 0, 0.1, 60))
SCENARIOS: dict[str, Scenario] = {
    "vllm_kv_pressure_long_tail": Scenario(
        "vllm",
        (Rep(KV_TAIL), Rep(KV_TAIL)),
        "preemption",
        "the cache fills, requests wait and are preempted, then a long tail",
    ),
    "vllm_queueing": Scenario(
        "vllm",
        tuple(Rep((Seg(0.85, 16, 24, 0.45, 700), Seg(1.0, 8, 0, 0.3, 350))) for _ in range(3)),
        "queueing",
        "requests wait for capacity while the cache has room",
    ),
    "vllm_deferred_waits": Scenario(
        "vllm",
        tuple(
            Rep((Seg(0.55, 40, 0, 0.5, 1200, 0, 12), Seg(1.0, 2, 0, 0.1, 60, 0, 12)))
            for _ in range(2)
        ),
        "long_tail",
        "requests deferred by KV transfer wait the whole window; none waits for capacity",
        ("queueing_from_capacity",),
    ),
    "vllm_data_parallel": Scenario(
        "vllm",
        (Rep(_steady(32, 0.6, 1200), dp=2), Rep(_steady(32, 0.6, 300), dp=2)),
        "replica_imbalance",
        "two servers of two data-parallel engines each; one server is slow",
    ),
    "sglang_first_use_counters": Scenario(
        "sglang",
        (
            Rep(_steady(32, 0.7, 900), retract_burst=(0.3, 5), finish_at=(0.2, 0.45, 0.7, 0.95)),
            Rep(_steady(32, 0.7, 900), finish_at=(0.2, 0.45, 0.7, 0.95)),
        ),
        "preemption",
        "retraction and generated-token counters appear at their first use, inside W",
        ("first_appearance_from_zero",),
    ),
    "sglang_tp2_retractions": Scenario(
        "sglang",
        tuple(
            Rep((Seg(0.6, 48, 6, 0.98, 900, 0.45), Seg(1.0, 20, 0, 0.6, 500)), tp=2)
            for _ in range(2)
        ),
        "preemption",
        "TP=2: every TP rank's scheduler counts each retraction; the gauges come from rank 0",
        ("sglang_counters_once_per_replica",),
    ),
    "sglang_pp2_ep_retractions": Scenario(
        "sglang",
        tuple(
            Rep((Seg(0.6, 48, 6, 0.98, 900, 0.45), Seg(1.0, 20, 0, 0.6, 500)), tp=2, pp=2, ep=True)
            for _ in range(2)
        ),
        "preemption",
        "TP=2, PP=2, EP=2 (MoE): every stage runs the same scheduler loop over the same "
        "micro-batches, so each stage's stats rank logs the same gauges and tokens and every "
        "rank of every stage counts each retraction; moe_ep_rank differs between TP ranks",
        ("sglang_counters_once_per_stage",),
    ),
    "sglang_priority": Scenario(
        "sglang",
        tuple(
            Rep((Seg(0.8, 48, 6, 0.5, 900), Seg(1.0, 30, 0, 0.4, 600)), priority=True)
            for _ in range(2)
        ),
        "queueing",
        'priority scheduling: the total under priority="" beside one series per priority',
        ("sglang_gauges_priority_total",),
    ),
    "sglang_window_edges": Scenario(
        "sglang",
        (
            Rep(_steady(32, 0.6, 1000), finish_at=(-0.1, 1.02, 1.3)),
            Rep(_steady(32, 0.6, 1000), finish_at=(-0.1, 0.3, 0.6, 0.9, 0.99)),
        ),
        None,
        "balanced replicas whose requests finish at the window's edges (one just after W)",
        ("sglang_tokens_realtime",),
    ),
    "sglang_dp_kv_pressure": Scenario(
        "sglang",
        (
            Rep((Seg(0.8, 40, 8, 0.97, 800), Seg(1.0, 10, 0, 0.5, 300)), dp=2),
            Rep((Seg(0.8, 40, 8, 0.97, 800), Seg(1.0, 10, 0, 0.5, 300)), dp=2),
        ),
        "kv_pressure",
        "data-parallel SGLang (dp_rank=): full cache, waiting requests, no retraction",
    ),
}


def sample_times() -> list[float]:
    n = round((END - START) / SAMPLE_DT)
    return [START + i * SAMPLE_DT for i in range(n + 1)]


def steps() -> list[float]:
    n = round((END - START) / STEP)
    return [START + i * STEP for i in range(n + 1)]


def truth(sc: Scenario) -> dict[str, object]:
    """The evidence over W from the script (a fine grid; counters from the scripted events)."""
    total = sum(b - a for a, b in SPANS)
    pts: list[float] = []
    for a, b in SPANS:
        k = int(20000 * (b - a) / total)
        pts += [a + (i + 0.5) * (b - a) / k for i in range(k)]
    running, waiting, kvs = [], [], []
    for t in pts:
        ss = [state(r, t) for r in sc.replicas]
        running.append(sum(s.running * r.dp for s, r in zip(ss, sc.replicas, strict=True)))
        waiting.append(sum(s.waiting * r.dp for s, r in zip(ss, sc.replicas, strict=True)))
        kvs.append(max(s.kv for s in ss))
    peak = max(running)
    m = len(pts)
    events = play_counts(sc)
    tokens = {r.name: events[r.name]["tokens"] for r in sc.replicas}
    mean = sum(tokens.values()) / len(tokens)
    return {
        "peak_running": peak,
        "running_mean": sum(running) / m,
        "waiting_mean": sum(waiting) / m,
        "kv_max": max(kvs),
        "preemptions": sum(events[r.name]["preemptions"] for r in sc.replicas),
        "tokens": tokens,
        "imbalance": max(tokens.values()) / mean if mean > 0 else None,
        "kv_pressure_share": sum(1 for i in range(m) if kvs[i] >= 0.95 and waiting[i] > 0) / m,
        "queueing_share": sum(1 for i in range(m) if waiting[i] > 0 and kvs[i] < 0.90) / m,
        "long_tail_share": sum(1 for x in running if x <= 0.10 * peak) / m,
    }


def in_w(t: float) -> bool:
    return any(a <= t < b for a, b in SPANS)


def play_counts(sc: Scenario) -> dict[str, dict[str, float]]:
    """Tokens decoded and requests preempted inside W, per replica, by the same steps the
    loggers are driven with (so the truth counts what the engines did, not what they wrote)."""
    out: dict[str, dict[str, float]] = {}
    for r in sc.replicas:
        tok = pre = 0.0
        for t, _s, n_tok, n_pre in engine_steps(r):
            if in_w(t):
                tok += n_tok
                pre += n_pre
        out[r.name] = {"tokens": tok, "preemptions": pre}
    return out


def engine_steps(r: Rep):
    """(t, state, decoded tokens, preempted requests) of each engine step; whole numbers, the
    fractions carried (per DP engine: the replica's numbers are dp times one engine's)."""
    tok_acc = pre_acc = 0.0
    burst_t = None
    if r.retract_burst is not None:
        a, b = SPANS[0][0], SPANS[-1][1]
        burst_t = a + r.retract_burst[0] * (b - a)
    for t in steps():
        s = state(r, t)
        tok_acc += s.tokens_per_s * STEP
        pre_acc += s.preempt_per_s * STEP
        n_tok, n_pre = int(tok_acc), int(pre_acc)
        tok_acc -= n_tok
        pre_acc -= n_pre
        if burst_t is not None and t >= burst_t:
            n_pre += r.retract_burst[1] if r.retract_burst else 0
            burst_t = None
        yield t, s, n_tok * r.dp, n_pre * r.dp


# -- the stubs: what the metric modules import -----------------------------------------------
def _module(name: str, **attrs: object) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _package(name: str, path: Path) -> None:
    mod = _module(name)
    mod.__path__ = [str(path)]


def stub_vllm(src: Path) -> None:
    import enum
    import logging

    root = src / "vllm"
    for pkg, sub in (("vllm", ""), ("vllm.v1", "v1"), ("vllm.v1.metrics", "v1/metrics")):
        _package(pkg, root / sub)

    class _Any:
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def observe(self, *a: object, **k: object) -> None:
            pass

    class FinishReason(enum.IntEnum):  # vllm/v1/engine/__init__.py (msgspec-free copy)
        STOP = 0
        LENGTH = 1
        ABORT = 2
        ERROR = 3
        REPETITION = 4

        def __str__(self) -> str:
            return ("stop", "length", "abort", "error", "repetition")[self.value]

    _module("vllm.envs", VLLM_COMPUTE_NANS_IN_LOGITS=False)
    _module("vllm.logger", init_logger=logging.getLogger)
    _module(
        "vllm.plugins",
        STAT_LOGGER_PLUGINS_GROUP="vllm.stat_logger_plugins",
        load_plugins_by_group=lambda group: {},
    )
    _module("vllm.config", VllmConfig=object, SupportsMetricsInfo=object, SpeculativeConfig=object)
    _module("vllm.compilation")
    _module("vllm.compilation.cuda_graph", CUDAGraphLogging=_Any, CUDAGraphStat=_Any)
    for name in (
        "vllm.distributed",
        "vllm.distributed.ec_transfer",
        "vllm.distributed.ec_transfer.ec_connector",
        "vllm.distributed.kv_transfer",
        "vllm.distributed.kv_transfer.kv_connector",
        "vllm.distributed.kv_transfer.kv_connector.v1",
    ):
        _module(name)
    _module(
        "vllm.distributed.ec_transfer.ec_connector.metrics",
        ECConnectorLogging=_Any,
        ECConnectorProm=_Any,
    )
    _module(
        "vllm.distributed.kv_transfer.kv_connector.v1.metrics",
        KVConnectorLogging=_Any,
        KVConnectorProm=_Any,
    )
    _module("vllm.v1.engine", FinishReason=FinishReason)
    _module("vllm.v1.metrics.perf", PerfMetricsLogging=_Any, PerfMetricsProm=_Any, PerfStats=_Any)
    _module("vllm.v1.spec_decode")
    _module(
        "vllm.v1.spec_decode.metrics",
        SpecDecodingLogging=_Any,
        SpecDecodingProm=_Any,
        SpecDecodingStats=_Any,
    )


class _Ns(types.SimpleNamespace):
    pass


SG_CTX: dict[str, _Ns] = {}


def stub_sglang(src: Path, priority: bool) -> None:
    import enum

    for pkg, sub in (
        ("sglang", ""),
        ("sglang.srt", "srt"),
        ("sglang.srt.observability", "srt/observability"),
        ("sglang.srt.utils", "srt/utils"),
    ):
        _package(pkg, src / "sglang" / sub)

    class Struct:  # msgspec.Struct: a base class taking class keywords
        def __init_subclass__(cls, **kw: object) -> None:
            pass

    class DisaggregationMode(enum.Enum):  # sglang/srt/disaggregation/utils.py
        NULL = "null"
        PREFILL = "prefill"
        DECODE = "decode"

        @staticmethod
        def to_engine_type(mode: str) -> str:
            return {"null": "unified", "prefill": "prefill", "decode": "decode"}[mode]

    _module("msgspec", Struct=Struct)
    _module("sglang.srt.disaggregation")
    _module("sglang.srt.disaggregation.utils", DisaggregationMode=DisaggregationMode)
    _module("sglang.srt.model_executor")
    _module("sglang.srt.model_executor.forward_batch_info", ForwardMode=int)
    _module(
        "sglang.srt.observability.scheduler_stage_metrics",
        FORWARD_OVERLAP_CATEGORIES=("none",),
        FORWARD_OVERLAP_NONE="none",
        SCHEDULER_STAGE_CATEGORIES=("schedule",),
    )
    obs = _Ns(
        enable_metrics=True,
        enable_metrics_for_all_schedulers=False,
        kv_events_config=None,
        extra_metric_labels=None,
        stat_loggers=None,
        tokenizer_metrics_allowed_custom_labels=None,
        prompt_tokens_buckets=None,
        generation_tokens_buckets=None,
    )
    SG_CTX.update(
        observability=obs,
        parallel=_Ns(
            tp_rank=0, pp_rank=0, moe_ep_rank=0, dp_rank=None, attn_tp_rank=0, attn_cp_rank=0
        ),
        schedule=_Ns(
            enable_priority_scheduling=priority,
            prefill_delayer_max_delay_passes=30,
            prefill_delayer_forward_passes_buckets=None,
            prefill_delayer_wait_seconds_buckets=None,
        ),
        serving=_Ns(served_model_name=MODEL, enable_streaming_session=False),
        disagg=_Ns(disaggregation_mode="null", enable_pd_role_switch=False),
    )
    ctx = _Ns(is_config_namespace_published=lambda ns: False)
    _module(
        "sglang.srt.runtime_context",
        exports_expert_balancedness_to_prometheus=lambda: False,
        get_context=lambda: ctx,
        get_disagg=lambda: SG_CTX["disagg"],
        get_observability=lambda: SG_CTX["observability"],
        get_parallel=lambda: SG_CTX["parallel"],
        get_schedule=lambda: SG_CTX["schedule"],
        get_serving=lambda: SG_CTX["serving"],
    )
    _module("sglang.srt.server_args", ServerArgs=object)
    utils = sys.modules["sglang.srt.utils"]
    utils.get_bool_env_var = lambda name, default="false": False  # type: ignore[attr-defined]


# -- driving the real loggers ----------------------------------------------------------------
def run_vllm(sc: Scenario, src: Path) -> dict[str, list[str]]:
    stub_vllm(src)
    from prometheus_client import REGISTRY, generate_latest
    from vllm.v1.metrics.loggers import PrometheusStatLogger  # type: ignore[import-not-found]
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats  # type: ignore

    times = sample_times()
    pages: dict[str, list[str]] = {}
    for r in sc.replicas:  # one server at a time: the logger registers in the global REGISTRY
        config = _Ns(
            observability_config=_Ns(
                show_hidden_metrics=False, kv_cache_metrics=False, custom_histogram_buckets=None
            ),
            model_config=_Ns(served_model_name=MODEL, max_model_len=4096, is_diffusion=False),
            speculative_config=None,
            kv_transfer_config=None,
            watermark_config=None,
            lora_config=None,
            cache_config=_Ns(metrics_info=lambda: {"block_size": "16", "num_gpu_blocks": "8000"}),
        )
        logger = PrometheusStatLogger(config, list(range(r.dp)))
        logger.log_engine_initialized()
        out, k = [], 0
        for t, s, n_tok, n_pre in engine_steps(r):
            while k < len(times) and times[k] <= t:
                out.append(generate_latest(REGISTRY).decode())
                k += 1
            for e in range(r.dp):  # each DP engine core reports its own stats
                sched = SchedulerStats(
                    num_running_reqs=int(s.running),
                    num_waiting_reqs=int(s.waiting),
                    num_skipped_waiting_reqs=int(s.deferred),
                    kv_cache_usage=s.kv,
                )
                it = IterationStats()
                it.num_generation_tokens = n_tok // r.dp + (1 if e < n_tok % r.dp else 0)
                it.num_preempted_reqs = n_pre // r.dp + (1 if e < n_pre % r.dp else 0)
                logger.record(sched, it, None, engine_idx=e)
        while k < len(times):
            out.append(generate_latest(REGISTRY).decode())
            k += 1
        pages[r.name] = out
    return pages


def run_sglang(name: str, src: Path) -> dict[str, list[str]]:
    sc = SCENARIOS[name]
    times = sample_times()
    pages: dict[str, list[str]] = {}
    for r in sc.replicas:  # each server in its own process: its own PROMETHEUS_MULTIPROC_DIR
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [sys.executable, __file__, "--sglang-replica", name, r.name, "--src", str(src)],
                env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": tmp},
                check=True,
                capture_output=True,
            )
        got = json.loads(out.stdout)
        assert len(got) == len(times)
        pages[r.name] = got
    return pages


def sglang_replica(sc: Scenario, name: str, src: Path) -> list[str]:
    """One SGLang server (PROMETHEUS_MULTIPROC_DIR set by the caller): its schedulers (one
    per TP rank and DP rank) and its tokenizer, through the scripted window."""
    (r,) = [x for x in sc.replicas if x.name == name]
    stub_sglang(src, r.priority)
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
    from sglang.srt.observability import metrics_collector as mc  # type: ignore

    def fresh() -> None:  # one process holds every rank here: each registers its own names
        for c in list(REGISTRY._collector_to_names):
            REGISTRY.unregister(c)

    ranks = []  # (dp, tp, collector)
    # every pipeline stage's schedulers: scheduler_pp_mixin.py `event_loop_pp` runs the same
    # loop on each stage (requests forwarded stage to stage, every batch's result processed
    # on every stage), and `is_stats_logging_rank` (attn_tp_rank 0) ignores pp_rank
    for dp, pp, tp in ((d, p, t) for d in range(r.dp) for p in range(r.pp) for t in range(r.tp)):
        fresh()
        SG_CTX["parallel"] = _Ns(
            tp_rank=tp,
            pp_rank=pp,
            moe_ep_rank=tp if r.ep else 0,  # data_parallel_controller.py, ep_size == tp_size
            dp_rank=dp if r.dp > 1 else None,
            attn_tp_rank=tp,
            attn_cp_rank=0,
        )
        ctx = mc.SchedulerMetricsCollector.init_new(
            server_args=None,
            enable_priority_scheduling=r.priority,
            enable_lora=False,
            enable_hierarchical_cache=False,
        )
        ranks.append((dp, tp, ctx))
    fresh()
    labels = mc.tokenizer_metric_labels()
    tokenizer = mc.TokenizerMetricsCollector(server_args=None, labels=labels)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)

    a, b = SPANS[0][0], SPANS[-1][1]
    finishes = sorted(a + f * (b - a) for f in r.finish_at)
    times = sample_times()
    out: list[str] = []
    k = 0
    pending = 0  # decoded tokens of requests not finished yet
    for i, (t, s, n_tok, n_pre) in enumerate(engine_steps(r)):
        while k < len(times) and times[k] <= t:
            out.append(generate_latest(registry).decode())
            k += 1
        for dp, _tp, ctx in ranks:
            col = ctx.collector
            share_tok = n_tok // r.dp + (1 if dp < n_tok % r.dp else 0)
            share_pre = n_pre // r.dp + (1 if dp < n_pre % r.dp else 0)
            if share_pre:  # scheduler.py: every rank with enable_metrics counts it
                col.increment_retracted_reqs(share_pre, 200 * share_pre, 300 * share_pre)
            if not ctx.current_scheduler_metrics_enabled:
                continue  # only the stats rank logs gauges and realtime tokens
            if share_tok:
                col.increment_realtime_tokens(None, decode_tokens=share_tok)
            if i % SGLANG_LOG_EVERY == 0:
                running = int(s.running)
                waiting = int(s.waiting)
                col.log_stats(
                    mc.SchedulerStats(
                        num_running_reqs=_queue(mc, running, r.priority),
                        num_queue_reqs=_queue(mc, waiting, r.priority),
                        gen_throughput=s.tokens_per_s,
                        token_usage=s.kv,
                        full_token_usage=s.kv,
                        num_used_tokens=int(s.kv * 100_000),
                        num_retracted_reqs=share_pre,
                    )
                )
        pending += n_tok
        while finishes and t >= finishes[0]:
            finishes.pop(0)
            n_req = 8
            for j in range(n_req):  # the batch's requests finish together
                got = pending // n_req + (1 if j < pending % n_req else 0)
                tokenizer.observe_one_finished_request(
                    labels,
                    prompt_tokens=200,
                    generation_tokens=got,
                    cached_tokens=0,
                    e2e_latency=5.0,
                    has_grammar=False,
                )
            pending = 0
    while k < len(times):
        out.append(generate_latest(registry).decode())
        k += 1
    return out


def _queue(mc: types.ModuleType, n: int, priority: bool) -> object:
    if not priority:
        return mc.QueueCount(total=n)
    high = (2 * n) // 3  # two priorities: 0 (two thirds) and 1
    return mc.QueueCount(total=n, by_priority={0: high, 1: n - high})


# -- main ------------------------------------------------------------------------------------
NAMES = list(SCENARIOS)
for _sc in SCENARIOS.values():
    for _i, _r in enumerate(_sc.replicas):
        _r.name = f"{_sc.engine}_server_{_i}_0"


def fetch_sources(wheels: Path) -> Path:
    wheels.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("-")[0]: p for p in wheels.glob("*.whl")}
    if not ({"vllm", "sglang"} <= have.keys()):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                f"vllm=={VLLM}",
                f"sglang=={SGLANG}",
                "-d",
                str(wheels),
            ],
            check=True,
        )
        have = {p.name.split("-")[0]: p for p in wheels.glob("*.whl")}
    src = wheels / "src"
    for pkg, files in (("vllm", VLLM_FILES), ("sglang", SGLANG_FILES)):
        with zipfile.ZipFile(have[pkg]) as z:
            for f in files:
                z.extract(f, src)
    return src


def write(name: str, pages: dict[str, list[str]], out_dir: Path) -> None:
    sc = SCENARIOS[name]
    doc = {
        "scenario": name,
        "about": sc.about,
        "engine": sc.engine,
        "version": VLLM if sc.engine == "vllm" else SGLANG,
        "fixes": list(sc.fixes),
        "spans": SPANS,
        "times": sample_times(),
        "reason": sc.reason,
        "truth": truth(sc),
        # the script itself, for the simulated engine to replay (tests/support/sim_engine.py)
        "replicas": {r.name: _script(r) for r in sc.replicas},
        # each replica's pages as indices into its distinct lines (most lines repeat)
        "pages": {name: _interned(got) for name, got in pages.items()},
    }
    path = out_dir / f"{name}.json.gz"
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    print(f"{path}: {len(pages)} replicas x {len(doc['times'])} pages", file=sys.stderr)


def _script(r: Rep) -> dict[str, object]:
    return {
        "profile": [list(dataclasses.astuple(seg)) for seg in r.profile],
        "tp": r.tp,
        "dp": r.dp,
        "pp": r.pp,
        "ep": r.ep,
        "priority": r.priority,
        "finish_at": list(r.finish_at),
        "retract_burst": list(r.retract_burst) if r.retract_burst else None,
    }


def _interned(pages: list[str]) -> dict[str, list]:
    lines: dict[str, int] = {}
    idx = [[lines.setdefault(line, len(lines)) for line in p.split("\n")] for p in pages]
    return {"lines": list(lines), "pages": idx}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--wheels", type=Path, default=Path(tempfile.gettempdir()) / "rlhf-engine-wheels"
    )
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/engine_pages"))
    p.add_argument("--only", action="append", choices=NAMES, help="one scenario (repeatable)")
    p.add_argument("--vllm-scenario", help=argparse.SUPPRESS)
    p.add_argument("--sglang-replica", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sglang_replica:  # a child: one SGLang server
        sc = SCENARIOS[args.sglang_replica[0]]
        json.dump(sglang_replica(sc, args.sglang_replica[1], args.src), sys.stdout)
        return 0
    if args.vllm_scenario:  # a child: one vLLM scenario (its own global REGISTRY)
        sc = SCENARIOS[args.vllm_scenario]
        json.dump(run_vllm(sc, args.src), sys.stdout)
        return 0
    src = fetch_sources(args.wheels)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or NAMES:
        sc = SCENARIOS[name]
        if sc.engine == "vllm":  # a fresh interpreter, so the stubs never meet SGLang's
            got = subprocess.run(
                [sys.executable, __file__, "--vllm-scenario", name, "--src", str(src)],
                check=True,
                capture_output=True,
            )
            pages = json.loads(got.stdout)
        else:
            pages = run_sglang(name, src)
        write(name, pages, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
