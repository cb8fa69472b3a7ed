"""Simulated vLLM rollout engines for `serve --demo`, in phase with the demo job's steps.

Each replica is a real HTTP server on 127.0.0.1 (an ephemeral port) answering `GET /metrics`
with a page in vLLM's exposition format (the HELP and TYPE lines, label names and series of
a real vLLM 0.24 server's page: tests/fixtures/engine_pages/real_vllm_cpu/), holding the
families the engine evidence reads. The sidecar finds them as static engine targets and
reads them with the real engine source (rlhf_exporter/sources/engines.py); nothing about
the demo reaches the measure.

What a page says is the state of the demo job's step running now, on the demo job's clock
(rlhf_exporter/demo/clock.py): outside the step's rollout windows the engines sleep (verl
frees their KV cache while the trainer works): no request. Inside them, by the phase's
`engines` (rlhf_exporter/demo/scenario.py), with `u` the share of the rollout done:

| behaviour | running (per replica) | waiting | KV use | engine reason |
|---|---|---|---|---|
| steady | 64, the last 10 % 4 | 0 | 0.6 | none (the log's) |
| long_tail | 64, then 2 from u = 0.55 (a few stragglers) | 0 | 0.55, then 0.1 | long_tail |
| preemption | 48 | 16 | 0.97 | preemption (about 0.2 a second) |
| queueing | 32 (one engine fewer) | 40 | 0.5 | queueing |

The second replica runs 90 % of the first's requests, so the tokens per replica differ a
little (no `replica_imbalance`). Generated tokens grow at DECODE_RATE per running request
per second of the job clock, preemptions at PREEMPT_RATE, both counters never decreasing.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from ..sources.base import Clock
from .clock import DemoClock, Segment
from .scenario import LONG_TAIL, PREEMPTION, QUEUEING

REPLICAS = 2
INTERVAL = 0.015
"""Seconds between the demo's engine reads (`--engine-interval` in the demo): at the job
clock's ~135x, 2 s of job time, within the engines' `max_sample_gap` (3 s), so a rollout
window is covered (min_coverage 0.8) even in the slowest rollout phase (~200x)."""
IDLE_INTERVAL = 0.5
"""Seconds between the demo's engine reads while nothing steps (`--engine-idle-interval` in
the demo: the stall's pause): the engines are read fast again within half a second of the
job's next step."""
DECODE_RATE = 30.0  # tokens per running request per job-clock second
PREEMPT_RATE = 0.2  # preemptions per job-clock second while the KV cache is full
MODEL = "demo/simulated-model"  # vLLM's model_name label: says the engine is simulated
BATCH = 64.0


class State(NamedTuple):
    running: float
    waiting: float
    kv: float
    preempting: bool


IDLE = State(0.0, 0.0, 0.0, False)


def progress(t: float, spans: tuple[tuple[float, float], ...]) -> float | None:
    """The share of the rollout windows `spans` done at job time `t`; None outside them."""
    total = sum(b - a for a, b in spans)
    done = 0.0
    for a, b in spans:
        if a <= t <= b:
            return (done + t - a) / total if total > 0 else None
        done += b - a
    return None


def state(t: float, seg: Segment | None) -> State:
    """One replica's state at job time `t` of step `seg` (None: between steps)."""
    u = None if seg is None else progress(t, seg.rollout)
    if seg is None or u is None:
        return IDLE
    behaviour = seg.phase.engines
    if behaviour == LONG_TAIL:
        return State(BATCH, 0.0, 0.55, False) if u < 0.55 else State(2.0, 0.0, 0.1, False)
    if behaviour == PREEMPTION:
        return State(48.0, 16.0, 0.97, True)
    if behaviour == QUEUEING:
        return State(32.0, 40.0, 0.5, False)
    return State(BATCH, 0.0, 0.6, False) if u < 0.9 else State(4.0, 0.0, 0.6, False)


class Replica:
    """One simulated engine's counters, advanced at each read on the job clock."""

    def __init__(self, index: int, clock: DemoClock, wall: Clock, scale: float):
        self.index = index
        self.clock = clock
        self.wall = wall
        self.scale = scale
        self.started = wall()
        self._lock = threading.Lock()
        self._t: float | None = None  # job time of the last read
        self._last = IDLE
        self.tokens = 0.0
        self.prompt_tokens = 0.0
        self.preemptions = 0.0

    def read(self) -> State:
        """The state now, the counters grown over the time since the last read (at the
        last read's state: a counter grows while the engine is as it was)."""
        with self._lock:
            t, seg = self.clock.current(self.wall())
            if self._t is not None and t > self._t:
                dt = t - self._t
                self.tokens += self._last.running * DECODE_RATE * dt
                if self._last.preempting:
                    self.preemptions += PREEMPT_RATE * dt
            self._t = t if self._t is None else max(t, self._t)
            s = state(t, seg)
            s = s._replace(running=round(s.running * self.scale), waiting=round(s.waiting))
            if s.running > self._last.running:  # new requests: their prompts prefilled
                self.prompt_tokens += (s.running - self._last.running) * 512
            self._last = s
            return s

    def page(self) -> bytes:
        s = self.read()
        labels = f'engine="0",model_name="{MODEL}"'
        return PAGE.format(
            labels=labels,
            running=float(s.running),
            waiting=float(s.waiting),
            kv=s.kv,
            preemptions=float(int(self.preemptions)),
            prompt=float(int(self.prompt_tokens)),
            tokens=float(int(self.tokens)),
            created=self.started,
        ).encode()


# the families the evidence reads, as vLLM 0.24 writes them (its HELP and TYPE lines)
PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {waiting}
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. Reason \
labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient \
constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals \
vllm:num_requests_waiting.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {waiting}
vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} {kv}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{labels}}} {preemptions}
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{{{labels}}} {created}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{labels}}} {prompt}
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{{labels}}} {created}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{labels}}} {tokens}
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{{{labels}}} {created}
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive, as vLLM's server is
    disable_nagle_algorithm = True  # headers and body apart must not wait for an ACK
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, b"not found\n", "text/plain")
            return
        self._send(200, self.server.replica.page(), "text/plain; version=0.0.4; charset=utf-8")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per read


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, replica: Replica):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replica = replica


class DemoEngines:
    """REPLICAS simulated vLLM servers, bound at construction (their `urls`), served from
    `start()` until `stop()`."""

    def __init__(self, clock: DemoClock, replicas: int = REPLICAS, wall: Clock = time.time):
        self.replicas = [Replica(i, clock, wall, 1.0 - 0.1 * (i % 2)) for i in range(replicas)]
        self._servers: list[_Server] = []
        try:
            for r in self.replicas:
                self._servers.append(_Server(r))
        except OSError:
            self.close()
            raise
        self._threads: list[threading.Thread] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in self._servers]

    def start(self) -> None:
        for i, s in enumerate(self._servers):
            t = threading.Thread(
                target=s.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=f"demo-engine-{i}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        for s in self._servers if self._threads else ():
            s.shutdown()
        for t in self._threads:
            t.join(2.0)
        self._threads = []
        self.close()

    def close(self) -> None:
        for s in self._servers:
            s.server_close()
