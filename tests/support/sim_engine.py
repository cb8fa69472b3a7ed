"""Simulated rollout engines: vLLM and SGLang `/metrics`, in phase with a verl job's rollout.

vLLM and SGLang cannot run here. Each simulated replica is a small HTTP server on a free
127.0.0.1 port that serves exactly the engines' metric names, types, labels and HELP lines
(tests/support/engine_metrics.py, read from the wheels), through prometheus_client's own
exposition as the engines do, and behaves as the engines' own metric code does (first-use
series, TP ranks, priority totals, tokens at request end: `Replica`; checked against their
pages by tests/test_engine_sim_fidelity.py). What they report follows a scenario: inside each rollout
window [a, b) a replica plays its `profile` (segments over the window's fraction u), outside
it idles. Counters (tokens, preemptions) are the exact integrals of the profile's rates, so
`truth()` gives the evidence the exporter should find, computed independently of it.

The clock is injectable: a test can serve the state at a simulated time (`SimClock`) and
sample it exactly when it wants, or use wall time for an end-to-end run.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector

from . import engine_metrics as em

MODEL = "Qwen/Qwen2.5-7B-Instruct"


class Segment(NamedTuple):
    """The replica's state for the part of a rollout window up to fraction `until`."""

    until: float
    running: float
    waiting: float
    kv: float  # 0-1
    tokens_per_s: float
    preempt_per_s: float = 0.0
    deferred: float = 0.0  # vLLM: waiting, deferred (LoRA budget, KV transfer), not for room


IDLE = Segment(1.0, 0.0, 0.0, 0.02, 0.0, 0.0)


@dataclass
class Replica:
    """One server. Per engine (`dp` of them in one server: vLLM's `engine` label, SGLang's
    `dp_rank`) it plays `profile`; the server's running/waiting/tokens are `dp` times one
    engine's. What the real engines do (tests/test_engine_sim_fidelity.py checks it against
    their own pages, tests/fixtures/engine_pages):
    - vLLM creates every series at start; `num_requests_waiting` = capacity + deferred waits,
      beside `num_requests_waiting_by_reason{reason}`;
    - SGLang creates a series at its first use (the retraction counter at the first
      retraction, `realtime_tokens_total{mode="decode"}` at the first decoded token,
      `generation_tokens_total` when the first request finishes); every TP rank counts each
      retraction (one series per `tp_rank`), the gauges and realtime tokens come from TP
      rank 0; `generation_tokens_total` grows only when requests finish (`finish_at`:
      fractions of each window); with priority scheduling each gauge has its total under
      `priority=""` beside one series per priority."""

    kind: str  # "vllm" or "sglang"
    profile: tuple[Segment, ...]
    stats: bool = True  # False: disable_log_stats=True (no engine series at all)
    dies_at: float | None = None  # from this time on the replica does not answer
    gen_tokens_counter: bool = True  # sglang: False = no token counters (only gen_throughput)
    name: str = ""
    tp: int = 1
    dp: int = 1
    pp: int = 1  # sglang pipeline stages: each stage's stats rank repeats the gauges, tokens
    ep: bool = False  # sglang expert parallelism over the TP ranks (moe_ep_rank = tp_rank)
    priority: bool = False  # sglang --enable-priority-scheduling
    finish_at: tuple[float, ...] = ()  # sglang: when requests finish (window fractions)
    retract_burst: tuple[float, int] | None = None  # (window fraction, requests) once each
    server: Any = field(default=None, repr=False)

    def state(self, t: float, windows: Sequence[tuple[float, float]]) -> Segment:
        for a, b in windows:
            if a <= t < b:
                u = (t - a) / (b - a)
                for seg in self.profile:
                    if u < seg.until:
                        return seg
                return self.profile[-1]
        return IDLE

    def counters(self, t: float, windows: Sequence[tuple[float, float]]) -> tuple[float, float]:
        """(generated tokens, preemptions) of the whole server since the start, at time t."""
        tokens = preempted = 0.0
        for a, b in windows:
            if t <= a:
                break
            lo = 0.0
            for seg in self.profile:
                s0, s1 = a + lo * (b - a), a + min(seg.until, 1.0) * (b - a)
                part = max(0.0, min(s1, t) - s0)
                tokens += part * seg.tokens_per_s
                preempted += part * seg.preempt_per_s
                lo = seg.until
                if lo >= 1.0:
                    break
            if self.retract_burst is not None and t >= a + self.retract_burst[0] * (b - a):
                preempted += self.retract_burst[1] / self.dp
        # preemptions are whole events (a counter steps by one request at a time)
        return tokens * self.dp, float(math.floor(preempted * self.dp + 1e-9))

    def finished_tokens(self, t: float, windows: Sequence[tuple[float, float]]) -> float | None:
        """SGLang's generation_tokens_total at t: the tokens of the requests finished by then
        (None before the first finishes: the counter does not exist yet)."""
        done = [a + f * (b - a) for a, b in windows for f in self.finish_at]
        past = [x for x in done if x <= t]
        return self.counters(max(past), windows)[0] if past else None

    def alive(self, t: float) -> bool:
        return self.dies_at is None or t < self.dies_at


class SimClock:
    """A settable clock shared by the test, the engines and the scraper."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


BULK_HISTOGRAMS = (  # more of vLLM's histogram families, for a page of realistic size (bench)
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_params_n",
)


def page(r: Replica, t: float, windows: Sequence[tuple[float, float]], bulk: bool = False) -> bytes:
    """The replica's /metrics body at time t, as the engine writes it. `bulk`: with more
    histogram families (bench/engines.py: a page the size of a real vLLM's)."""
    reg = CollectorRegistry()
    GCCollector(registry=reg)
    PlatformCollector(registry=reg)
    if not r.stats:
        return generate_latest(reg)
    s = r.state(t, windows)
    tokens, preempted = r.counters(t, windows)
    if r.kind == "vllm":
        _vllm(reg, r, s, tokens, preempted, bulk)
    else:
        _sglang(reg, r, s, tokens, preempted, r.finished_tokens(t, windows))
    return generate_latest(reg)


def _share(events: float, n: int, i: int) -> float:
    """Engine i's part of a server's whole events, split over n engines."""
    whole = int(events)
    return float(whole // n + (1 if i < whole % n else 0))


def _vllm(reg: Any, r: Replica, s: Segment, tokens: float, preempted: float, bulk: bool) -> None:
    d = em.VLLM

    def metric(key: str) -> Any:
        name, typ, doc, labels = d[key]
        cls = Gauge if typ == "gauge" else Counter
        return cls(name, doc, labels, registry=reg)

    running, waiting, by_reason, kv = (
        metric(k) for k in ("running", "waiting", "waiting_by_reason", "kv")
    )
    counters = {k: metric(k) for k in ("preempted", "tokens", "prompt")}
    hists = [(em.VLLM_E2E[0], em.VLLM_E2E[1], em.VLLM_E2E[2]), em.VLLM_TTFT]
    if bulk:
        hists += [(n, "Histogram.", em.VLLM_E2E[2]) for n in BULK_HISTOGRAMS]
    hs = [Histogram(n, doc, em.VLLM_LABELS, buckets=b, registry=reg) for n, doc, b in hists]
    for e in range(r.dp):  # each data-parallel engine under its own `engine` label
        lv = (MODEL, str(e))
        running.labels(*lv).set(s.running)
        waiting.labels(*lv).set(s.waiting + s.deferred)
        by_reason.labels(*lv, "capacity").set(s.waiting)
        by_reason.labels(*lv, "deferred").set(s.deferred)
        kv.labels(*lv).set(s.kv)
        counters["preempted"].labels(*lv).inc(_share(preempted, r.dp, e))
        counters["tokens"].labels(*lv).inc(tokens / r.dp)
        counters["prompt"].labels(*lv).inc(tokens / r.dp / 4)
        for h in hs:
            for x in (0.2, 3.0, 45.0):
                h.labels(*lv).observe(x)


def _sglang(
    reg: Any, r: Replica, s: Segment, tokens: float, preempted: float, finished: float | None
) -> None:
    d = em.SGLANG
    extra = ("priority",) if r.priority else ()
    extra += ("dp_rank",) if r.dp > 1 else ()

    def sg(key: str, more: tuple[str, ...] = ()) -> Any:
        name, typ, doc, labels = d[key]
        cls = Gauge if typ == "gauge" else Counter
        if labels[:2] == ("model_name", "engine_type") and "tp_rank" in labels:
            labels = (*labels[:5], *extra, *labels[5:])
        return cls(name, doc, labels, registry=reg)

    gauges = {k: sg(k) for k in ("running", "waiting", "kv", "throughput", "used")}
    retracted, realtime = sg("preempted"), sg("realtime")
    for dp in range(r.dp):

        def rank(tp: int, pp: int = 0, dp: int = dp) -> tuple[str, ...]:
            out: tuple[str, ...] = (MODEL, "unified", str(tp), str(pp), str(tp) if r.ep else "0")
            out += ("",) if r.priority else ()
            return out + ((str(dp),) if r.dp > 1 else ())

        values = {
            "running": s.running,
            "waiting": s.waiting,
            "kv": s.kv,
            "throughput": s.tokens_per_s,
            "used": s.kv * 100_000,
        }
        for pp in range(r.pp):  # each stage's stats rank (TP rank 0) logs the gauges
            for key, value in values.items():
                gauges[key].labels(*rank(0, pp)).set(value)
                if r.priority and key in ("running", "waiting"):
                    high = int(2 * value) // 3  # priority 0: two thirds, priority 1: the rest
                    for prio, part in (("0", high), ("1", value - high)):
                        labels = list(rank(0, pp))
                        labels[5] = prio
                        gauges[key].labels(*labels).set(part)
        mine = _share(preempted, r.dp, dp)
        if mine > 0:  # created at the first retraction, counted by every TP rank of every stage
            for pp in range(r.pp):
                for tp in range(r.tp):
                    retracted.labels(*rank(tp, pp)).inc(mine)
        if r.gen_tokens_counter and tokens > 0:
            for pp in range(r.pp):
                realtime.labels(*rank(0, pp), "decode").inc(tokens / r.dp)
    if r.gen_tokens_counter and finished is not None:
        tok = sg("tokens")
        tok.labels(MODEL, "unified", "false").inc(finished)
    name, doc, buckets = em.SGLANG_TTFT
    h = Histogram(name, doc, em.SGLANG_TOKENIZER_LABELS, buckets=buckets, registry=reg)
    h.labels(MODEL, "unified").observe(0.5)


class _Handler(BaseHTTPRequestHandler):
    sim: EngineSim
    replica: Replica
    protocol_version = "HTTP/1.1"  # keep-alive, as the engines' servers (uvicorn) do

    def do_GET(self) -> None:
        t = self.sim.clock()
        if not self.replica.alive(t):
            self.close_connection = True
            self.connection.close()  # a dead engine: the connection drops, no answer
            return
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = page(self.replica, t, self.sim.windows, self.sim.bulk)
        self.sim.scrapes += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class EngineSim:
    """Replicas of one job, each on its own 127.0.0.1 port."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        windows: Sequence[tuple[float, float]] = (),
        clock: Callable[[], float] | None = None,
        bulk: bool = False,
    ):
        import time

        self.bulk = bulk
        self.replicas = list(replicas)
        self.windows: list[tuple[float, float]] = list(windows)
        self.clock = clock or time.time
        self.scrapes = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> EngineSim:
        for i, r in enumerate(self.replicas):
            handler = type("H", (_Handler,), {"sim": self, "replica": r})
            r.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            r.server.daemon_threads = True
            r.name = r.name or f"{r.kind}_server_{i}_0"
            th = threading.Thread(target=r.server.serve_forever, kwargs={"poll_interval": 0.1})
            th.daemon = True
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        for r in self.replicas:
            if r.server is not None:
                r.server.shutdown()
                r.server.server_close()

    def __enter__(self) -> EngineSim:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{r.server.server_address[1]}/metrics" for r in self.replicas]

    def ports(self) -> list[int]:
        return [r.server.server_address[1] for r in self.replicas]

    # -- the truth ------------------------------------------------------------------------
    def truth(self, spans: Sequence[tuple[float, float]], n: int = 20000) -> dict[str, Any]:
        """The evidence over the union of `spans`, from the scenario itself (fine grid)."""
        total = sum(b - a for a, b in spans)
        pts: list[float] = []
        for a, b in spans:
            k = max(1, int(n * (b - a) / total))
            pts += [a + (i + 0.5) * (b - a) / k for i in range(k)]
        alive = [r for r in self.replicas if r.stats]
        running, waiting, kvs = [], [], []
        for t in pts:
            ss = [(r.state(t, self.windows), r.dp) for r in alive]
            running.append(sum(s.running * dp for s, dp in ss))
            waiting.append(sum(s.waiting * dp for s, dp in ss))  # waits for capacity
            ss = [s for s, _ in ss]
            kvs.append(max((s.kv for s in ss), default=0.0))
        peak = max(running, default=0.0)
        m = len(pts)

        def share(cond: Callable[[int], bool]) -> float:
            return sum(1 for i in range(m) if cond(i)) / m

        tokens: dict[str, float] = {}
        preempted = 0.0
        for r in alive:
            got = 0.0
            for a, b in spans:
                t1, p1 = r.counters(b, self.windows)
                t0, p0 = r.counters(a, self.windows)
                got += t1 - t0
                preempted += p1 - p0
            tokens[r.name] = got
        mean = sum(tokens.values()) / len(tokens) if tokens else 0.0
        return {
            "peak_running": peak,
            "running_mean": sum(running) / m,
            "waiting_mean": sum(waiting) / m,
            "kv_max": max(kvs, default=0.0),
            "preemptions": preempted,
            "tokens": tokens,
            "imbalance": max(tokens.values()) / mean if mean > 0 else None,
            "kv_pressure_share": share(lambda i: kvs[i] >= 0.95 and waiting[i] > 0),
            "queueing_share": share(lambda i: waiting[i] > 0 and kvs[i] < 0.90),
            "long_tail_share": share(lambda i: running[i] <= 0.10 * peak) if peak > 0 else 0.0,
        }


# -- scenarios ------------------------------------------------------------------------------
def _steady(running: float, kv: float, rate: float, waiting: float = 0.0) -> tuple[Segment, ...]:
    return (Segment(1.0, running, waiting, kv, rate),)


def scenario(name: str) -> tuple[list[Replica], str | None]:
    """(replicas, the engine reason the contract names; None: the log's rules apply)."""
    if name == "kv_preemption":  # the cache is full, requests wait and are preempted
        prof = (Segment(0.7, 48, 6, 0.98, 900, 1.5), Segment(1.0, 20, 0, 0.6, 500))
        return [Replica("vllm", prof) for _ in range(4)], "preemption"
    if name == "kv_pressure":  # full cache, waiting, no preemption (SGLang)
        prof = (Segment(0.8, 40, 8, 0.97, 800), Segment(1.0, 10, 0, 0.5, 300))
        return [Replica("sglang", prof) for _ in range(2)], "kv_pressure"
    if name == "queueing":  # requests wait while the cache has room: too few replicas
        prof = (Segment(0.85, 16, 24, 0.45, 700), Segment(1.0, 8, 0, 0.3, 350))
        return [Replica("vllm", prof) for _ in range(3)], "queueing"
    if name == "long_tail":  # a few long responses hold the window (SGLang)
        prof = (Segment(0.4, 64, 0, 0.7, 1500), Segment(1.0, 2, 0, 0.1, 60))
        return [Replica("sglang", prof) for _ in range(4)], "long_tail"
    if name == "slow_replica":  # one replica produces a quarter of the other's tokens
        fast = _steady(32, 0.6, 1200)
        slow = _steady(32, 0.6, 300)
        return [Replica("vllm", fast), Replica("vllm", slow)], "replica_imbalance"
    if name == "healthy":
        return [Replica("vllm", _steady(40, 0.6, 1000)) for _ in range(4)], None
    if name == "replica_dies":  # set dies_at on replica 1 when the windows are known
        return [Replica("vllm", _steady(40, 0.6, 1000)) for _ in range(4)], None
    if name == "no_stats":  # disable_log_stats=True: /metrics answers without engine series
        return [Replica("vllm", _steady(40, 0.6, 1000), stats=False) for _ in range(2)], None
    raise KeyError(name)


SCENARIOS = (
    "kv_preemption",
    "kv_pressure",
    "queueing",
    "long_tail",
    "slow_replica",
    "healthy",
    "replica_dies",
    "no_stats",
)
