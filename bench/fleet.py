"""Fleet scale (issue 14): one `serve` watching N verl jobs vs a bare prometheus_client registry.

    .venv/bin/python bench/fleet.py [--jobs 100 300 1000] [--interval 15] [--seconds 60]

For each N: N verl JSONL files (30 steps of history each), then every job appends one
realistic record (about 60 keys) about every 60 s at its own random moments (issue 37).
A scraper GETs /metrics every `--interval` seconds the way Prometheus does (gzip; text 0.0.4, then
OpenMetrics: an HA pair of Prometheus servers of two kinds) for `--seconds` seconds. The same
scraper then scrapes a bare `prometheus_client` registry (in its own process, `start_http_server`) holding the very same
series, for the same time. Printed side by side, the table of issue 14:

    series, /metrics bytes (plain / gzip), scrape p50 / p99 per format, process CPU (% of
    one core over the measured window), RSS (peak), record -> visible p99

record -> visible: after the measured window (so that its scrapes do not count in the CPU
figure), `--probes` times: one job (spread over the fleet) writes its next record while the
others go on stepping, and a scraper GETs /metrics every 0.1 s until that step shows in
`rlhf_step`; the time from the write to the end of that response. It includes the
exporter's poll interval (1 s) and the build of the body. Nothing is asserted: the figures go
to bench/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.demo.simulator import REGIMES, encode, records  # noqa: E402
from tests.support.procs import free_port, wait_until  # noqa: E402
from tests.support.serve import parse_samples  # noqa: E402

TEXT = "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.5"
PERIOD = 60.0  # seconds between two records of one job
HISTORY = 30  # steps each file starts with
CLK = os.sysconf("SC_CLK_TCK")
BURST = 1  # scrapers asking at the same moment (--burst)

BARE = """
import json, sys, time
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
port, spec = int(sys.argv[1]), json.load(open(sys.argv[2]))
from prometheus_client import disable_created_metrics
disable_created_metrics()  # the exporter serves no _created series either
registry = CollectorRegistry(auto_describe=False)
for name, (kind, series) in spec.items():
    labels = sorted(series[0][0]) if series else []
    cls = Counter if kind == "counter" else Gauge
    m = cls(name, "static series for the benchmark", labels, registry=registry)
    for lab, value in series:
        child = m.labels(**lab) if labels else m
        child.inc(value) if kind == "counter" else child.set(value)
start_http_server(port, addr="127.0.0.1", registry=registry)
while True:
    time.sleep(3600)
"""


def extra_keys(step: int, i: int) -> dict[str, float]:
    """verl keys a real record carries beyond the simulator's timers (loss, score, perf...)."""
    x = (step * 7 + i) % 100 / 100.0
    return {
        "actor/pg_loss": 0.1 * x,
        "actor/entropy": 1.2 + x,
        "actor/grad_norm": 0.5 + x,
        "actor/pg_clipfrac": 0.01 * x,
        "actor/ppo_kl": 0.001 * x,
        "actor/lr": 1e-6,
        "critic/score/mean": x,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/rewards/mean": x,
        "critic/advantages/mean": 0.0,
        "critic/returns/mean": x,
        "response_length/mean": 900 + 100 * x,
        "response_length/max": 4096.0,
        "response_length/min": 12.0,
        "response_length/clip_ratio": 0.02,
        "prompt_length/mean": 300.0,
        "perf/mfu/actor": 0.31 + 0.01 * x,
        "perf/mfu/ref": 0.22,
        "actor/perf/max_memory_allocated_gb": 61.2,
        "actor/perf/max_memory_reserved_gb": 70.4,
        "perf/cpu_memory_used_gb": 120.0,
        "agent_loop/generate_sequences/mean": 20 + x,
        "agent_loop/generate_sequences/max": 60 + x,
        "agent_loop/tool_calls/mean": 1.0,
    }


class Jobs:
    """N jobs' files and their writers' record streams, numbered from `first` (each
    exporter of a cluster holds different jobs; two clusters hold the same names)."""

    def __init__(self, root: Path, n: int, first: int = 0):
        self.root, self.n, self.first = root, n, first
        regimes = list(REGIMES.values())
        self.paths: list[Path] = []
        self.streams = []
        self._lock = threading.Lock()  # the writer thread and the probes
        for j in range(first, first + n):
            project = root / f"team{j % 10}"
            project.mkdir(parents=True, exist_ok=True)
            path = project / f"exp{j:05d}.jsonl"
            stream = records([(regimes[j % len(regimes)], 10**6)], seed=j, validation=False)
            with open(path, "wb") as f:
                for _ in range(HISTORY):
                    f.write(self._line(next(stream), j))
            self.paths.append(path)
            self.streams.append(stream)

    @staticmethod
    def _line(record: dict, i: int) -> bytes:
        record["data"].update(extra_keys(record["step"], i))
        return encode(record)

    def write(self, i: int) -> tuple[bytes, int, float]:
        """Append job i's next record: (the start of its `rlhf_step` line, its step, the
        time it was written)."""
        j = self.first + i  # the job's number in its name
        with self._lock:
            record = next(self.streams[i])
            line = self._line(record, j)
            at = time.time()
            with open(self.paths[i], "ab") as f:
                f.write(line)
        key = (f"team{j % 10}", f"exp{j:05d}")
        shown = f'\nrlhf_step{{experiment="{key[1]}",project="{key[0]}"}} '
        return shown.encode(), record["step"], at

    def run(self, stop: threading.Event, t0: float) -> None:
        """Each job writes at its own random moments (issue 37: never in label order): first
        at t0 + U(0, PERIOD), then PERIOD x U(0.9, 1.1) after its previous record."""
        rng = random.Random(37)
        heap = [(t0 + rng.uniform(0, PERIOD), i) for i in range(self.n)]
        heapq.heapify(heap)
        while heap:
            at, i = heap[0]
            if stop.wait(max(0.0, at - time.time())):
                return
            heapq.heapreplace(heap, (at + PERIOD * rng.uniform(0.9, 1.1), i))
            self.write(i)


def get(port: int, accept: str) -> tuple[float, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t = time.perf_counter()
    conn.request("GET", "/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - t
    conn.close()
    assert resp.status == 200, resp.status
    if resp.getheader("Content-Encoding") == "gzip":
        return elapsed, body
    return elapsed, gzip.compress(body, 1)  # keep the type: compressed bytes


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def scrape_for(
    port: int, pid: int, seconds: float, interval: float, formats: tuple[str, ...]
) -> dict:
    """Scrape every `interval` s for `seconds` s, in each of `formats`."""
    times: dict[str, list[float]] = {"text": [], "openmetrics": []}
    sizes: dict[str, tuple[int, int]] = {}
    last = b""
    for fmt in formats:  # Prometheus has been scraping for a while
        get(port, TEXT if fmt == "text" else OPENMETRICS)
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        for fmt in formats:  # both: an HA pair of Prometheus, one of each kind
            accept = TEXT if fmt == "text" else OPENMETRICS
            if BURST > 1:  # BURST - 1 other scrapers at the same moment
                out, acc = times[fmt], accept
                burst = [
                    threading.Thread(target=lambda o=out, a=acc: o.append(get(port, a)[0]))
                    for _ in range(BURST - 1)
                ]
                for t in burst:
                    t.start()
            elapsed, zipped = get(port, accept)
            times[fmt].append(elapsed)
            if BURST > 1:
                for t in burst:
                    t.join(120)
            if fmt == formats[0] or fmt not in sizes:
                plain = gzip.decompress(zipped)
                sizes[fmt] = (len(plain), len(zipped))
                if fmt == formats[0]:
                    last = plain
        n += 1
        time.sleep(max(0.0, t0 + n * interval - time.monotonic()))
    wall = time.monotonic() - t0
    cpu = (cpu_seconds(pid) - cpu0) / wall
    return {"times": times, "sizes": sizes, "cpu": cpu, "rss": peak_rss_mb(pid), "text": last}


def probe_visible(port: int, jobs: Jobs, accept: str, probes: int) -> list[float]:
    """Seconds from a record's write to the end of the first scrape that shows its step."""
    out = []
    for k in range(probes):
        i = (k * 7919) % jobs.n  # spread over the fleet (and over chunks of jobs)
        line, step, at = jobs.write(i)
        deadline = at + 30.0
        while time.time() < deadline:
            _elapsed, zipped = get(port, accept)
            body = gzip.decompress(zipped)
            pos = body.find(line)
            # this step or a later one (the job's own writer may have stepped meanwhile)
            if pos >= 0 and float(body[pos + len(line) : body.index(b"\n", pos + 1)]) >= step:
                out.append(time.time() - at)
                break
            time.sleep(0.1)
        else:
            print(f"      probe {k}: step {step} of job {i} not visible in 30 s", flush=True)
    return out


def bench(
    n: int,
    interval: float,
    seconds: float,
    bare_too: bool,
    formats: tuple[str, ...],
    probes: int = 20,
) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        t = time.monotonic()
        jobs = Jobs(root, n)
        setup = time.monotonic() - t
        port = free_port()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "rlhf_exporter", "serve", "--listen", f"127.0.0.1:{port}"]
            + ["--verl-root", str(root), "--no-ray", "--no-nvml", "--no-push"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bare = None
        stop = threading.Event()
        try:
            want = f'rlhf_exporter_jobs{{collector="verl"}} {float(n)}'.encode()

            accept = TEXT if formats[0] == "text" else OPENMETRICS

            def ingested():  # in the measured format: the exporter keeps warm what is asked
                return want in gzip.decompress(get(port, accept)[1])

            t = time.monotonic()
            wait_until(ingested, 600, 1.0, "every job ingested")
            ingest = time.monotonic() - t
            writer = threading.Thread(target=jobs.run, args=(stop, time.time()), daemon=True)
            writer.start()
            time.sleep(min(5.0, interval))
            r = scrape_for(port, exporter.pid, seconds, interval, formats)
            r["visible"] = probe_visible(port, jobs, accept, probes)
            r["name"], r["setup"], r["ingest"] = "exporter", setup, ingest
            rows.append(r)
            stop.set()
            writer.join(10)
            exporter.terminate()  # measure the bare server alone
            exporter.wait(10)
            if bare_too:
                samples = parse_samples(r["text"].decode())
                kinds = _kinds(r["text"])
                spec: dict[str, tuple[str, list]] = {}
                for (name, labels), value in samples.items():
                    kind = kinds.get(name, "gauge")
                    key = name.removesuffix("_total") if kind == "counter" else name
                    spec.setdefault(key, (kind, []))[1].append((dict(labels), value))
                spec_path = Path(tmp) / "spec.json"
                spec_path.write_text(json.dumps(spec))
                bare_port = free_port()
                bare = subprocess.Popen(
                    [sys.executable, "-c", BARE, str(bare_port), str(spec_path)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                wait_until(lambda: get(bare_port, TEXT), 300, 0.5, "bare server")
                b = scrape_for(bare_port, bare.pid, seconds, interval, formats)
                b["visible"], b["name"] = [], "bare prometheus_client"
                rows.append(b)
        finally:
            stop.set()
            for p in (exporter, bare):
                if p is not None:
                    p.terminate()
                    p.wait(10)
    for r in rows:
        r["series"] = len(parse_samples(r["text"].decode())) if r["text"] else 0
    return rows


def _pp(xs: list[float]) -> str:
    return f"{pct(xs, 50) * 1000:>7.1f}/{pct(xs, 99) * 1000:<8.1f}" if xs else f"{'-':>16}"


def _kinds(text: bytes) -> dict[str, str]:
    out = {}
    for m in re.finditer(rb"^# TYPE (\S+) (\S+)$", text, re.M):
        out[m.group(1).decode()] = m.group(2).decode()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window per server")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare registry")
    ap.add_argument(
        "--format",
        choices=["both", "text", "openmetrics"],
        default="both",
        help="what the scraper asks for (both: an HA pair of Prometheus, one of each kind)",
    )
    ap.add_argument(
        "--burst", type=int, default=1, help="concurrent scrapers at each tick (issue 14: 64)"
    )
    ap.add_argument(
        "--probes", type=int, default=20, help="record -> visible probes after the window"
    )
    args = ap.parse_args()
    global BURST
    BURST = args.burst
    print(
        f"scrape every {args.interval:g} s for {args.seconds:g} s, {args.burst} at once; gzip; "
        f"format {args.format}; "
        f"cpus {os.cpu_count()}"
    )
    hdr = (
        f"{'jobs':>5} {'server':<24} {'series':>8} {'text MB':>8} {'gz MB':>6} "
        f"{'text p50/p99 ms':>16} {'OM p50/p99 ms':>16} {'CPU %':>6} {'RSS MB':>7} "
        f"{'rec->vis p99 s':>14}"
    )
    print(hdr)
    for n in args.jobs:
        formats = ("text", "openmetrics") if args.format == "both" else (args.format,)
        rows = bench(n, args.interval, args.seconds, not args.no_bare, formats, args.probes)
        for r in rows:
            t, o = r["times"]["text"], r["times"]["openmetrics"]
            plain, zipped = next(iter(r["sizes"].values()), (0, 0))
            vis = f"{pct(r['visible'], 99):.2f}" if r["visible"] else "-"
            print(
                f"{n:>5} {r['name']:<24} {r['series']:>8} {plain / 1e6:>8.2f} "
                f"{zipped / 1e6:>6.2f} {_pp(t)} {_pp(o)} {r['cpu'] * 100:>6.1f} "
                f"{r['rss']:>7.0f} {vis:>14}",
                flush=True,
            )
        ex = rows[0]
        print(
            f"      (setup {ex['setup']:.1f} s, ingest {ex['ingest']:.1f} s; scrapes text "
            f"{len(ex['times']['text'])}, OM {len(ex['times']['openmetrics'])}; "
            f"record->visible n={len(ex['visible'])}, median "
            f"{statistics.median(ex['visible']) if ex['visible'] else float('nan'):.2f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
