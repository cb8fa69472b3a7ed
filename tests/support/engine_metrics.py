"""The rollout engines' own metric definitions, as their packages declare them.

Read from the wheels (`pip download --no-deps vllm sglang`, 2026-12-01):

- vLLM 0.33.0, `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger.__init__`): every series
  has the labels `model_name`, `engine` (the engine index within one server, "0" unless
  data-parallel). Counters are declared without `_total`; prometheus_client adds it.
- SGLang 0.5.23, `sglang/srt/observability/metrics_collector.py`: the scheduler's gauges
  (`SchedulerMetricsCollector`) have the labels `model_name`, `engine_type` ("unified"
  unless disaggregated), `tp_rank`, `pp_rank`, `moe_ep_rank` (+ `priority` with priority
  scheduling, + `dp_rank` with data parallelism); the tokenizer's counters
  (`TokenizerMetricsCollector`) `model_name`, `engine_type` (+ `is_streaming` on token
  counters). SGLang serves them in prometheus_client's multiprocess mode: a series exists
  from the first time its labels are used (a counter from its first increment).

Both serve them with prometheus_client's exposition, so the simulated engine does too.
Each entry: (name as declared, type, HELP, label names).
"""

from __future__ import annotations

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"

VLLM_LABELS = ("model_name", "engine")
SGLANG_SCHED_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
SGLANG_TOKENIZER_LABELS = ("model_name", "engine_type")

VLLM = {
    "running": ("vllm:num_requests_running", "gauge",
                "Number of requests in model execution batches.", VLLM_LABELS),
    "waiting": ("vllm:num_requests_waiting", "gauge",
                "Number of requests waiting to be processed.", VLLM_LABELS),
    "waiting_by_reason": ("vllm:num_requests_waiting_by_reason", "gauge",
                          "Number of waiting requests by reason. Reason labels: 'capacity' = "
                          "waiting for scheduling capacity; 'deferred' = deferred by transient "
                          "constraints (LoRA budget, KV transfer, blocked status). Sum of all "
                          "reasons equals vllm:num_requests_waiting.",
                          (*VLLM_LABELS, "reason")),
    "kv": ("vllm:kv_cache_usage_perc", "gauge",
           "KV-cache usage. 1 means 100 percent usage.", VLLM_LABELS),
    "preempted": ("vllm:num_preemptions", "counter",
                  "Cumulative number of preemption from the engine.", VLLM_LABELS),
    "tokens": ("vllm:generation_tokens", "counter",
               "Number of generation tokens processed.", VLLM_LABELS),
    "prompt": ("vllm:prompt_tokens", "counter",
               "Number of prefill tokens processed.", VLLM_LABELS),
}  # fmt: skip
# a histogram of the real page (bulk: a scraper must skip what it does not read)
VLLM_E2E = (
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
     120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)  # fmt: skip
VLLM_TTFT = (
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
     7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)  # fmt: skip

SGLANG = {
    "running": ("sglang:num_running_reqs", "gauge", "The number of running requests.",
                SGLANG_SCHED_LABELS),
    "waiting": ("sglang:num_queue_reqs", "gauge",
                "The number of requests in the waiting queue.", SGLANG_SCHED_LABELS),
    "kv": ("sglang:token_usage", "gauge", "The token usage.", SGLANG_SCHED_LABELS),
    "throughput": ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                   SGLANG_SCHED_LABELS),
    "preempted": ("sglang:num_retracted_requests_total", "counter",
                  "Total number of retracted requests.", SGLANG_SCHED_LABELS),
    "tokens": ("sglang:generation_tokens_total", "counter",
               "Number of generation tokens processed.",
               SGLANG_TOKENIZER_LABELS + ("is_streaming",)),
    "used": ("sglang:num_used_tokens", "gauge", "The number of used tokens.",
             SGLANG_SCHED_LABELS),
    "realtime": ("sglang:realtime_tokens_total", "counter",
                 "Total number of tokens processed (updated on each log interval). mode: "
                 "prefill_compute, prefill_cache, decode.", (*SGLANG_SCHED_LABELS, "mode")),
}  # fmt: skip
SGLANG_TTFT = (
    "sglang:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
     200.0, 400.0),
)  # fmt: skip
