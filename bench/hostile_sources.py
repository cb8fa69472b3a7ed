"""Hostile input to the sources: each finding replayed against `serve`, side by side
with a clean `serve` fed the same jobs and benign inputs of the same kind.

    .venv/bin/python bench/hostile_sources.py [--attack all|engines|targets|ray|ray_jobs|marker]
                                             [--jobs 20] [--seconds 30] [--scrape-every 0.2]

Both exporters follow `--jobs` verl jobs stepping every few seconds and are scraped every
`--scrape-every` seconds (a new connection each); RSS is sampled every second. The attacks:

- engines: 8 engine targets each answering 70,000 label sets of `vllm:num_requests_running`
  (4.1 MB, under the 4 MiB cap) every second (clean: 8 ordinary vLLM pages);
- targets: `--engine-targets-file` a 30 KB YAML alias bomb rewritten every second (and 900 KB
  of other YAML in between), `--engine-prometheus-file` a FIFO (clean: a plain list);
- ray: a Ray dashboard answering the node list with 15 MB of `{},` (under the 16 MiB cap:
  5 million objects) (clean: an ordinary dashboard);
- ray_jobs: the Jobs API listing 10,000 submissions with 1.3 KB entrypoints, 15 MB (clean:
  10). (The issue's 60 MB of `{},` and 10,000 x 5 KB submissions are over the cap: refused
  by their Content-Length, before a byte of the body is read.)
- marker: a `.total_steps` FIFO beside one job's log.

Prints, per attack, RSS (max), scrape p50/p99, CPU (% of a core over the run), jobs
exported, and the counted cause; the
goals: RSS within +100 MiB of the clean run, scrape p99 < 50 ms, every job
exported, the cause counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.flood import rss_mb, scrape  # noqa: E402


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


from rlhf_exporter.demo.simulator import REGIMES, encode, records  # noqa: E402
from tests.support.ray_state import RayStateApi  # noqa: E402
from tests.support.serve import Exporter, parse_samples  # noqa: E402

RUNNING = "vllm:num_requests_running"


def engine_page(label_sets: int) -> bytes:
    head = (
        f"# HELP {RUNNING} Number of requests in model execution batches.\n# TYPE {RUNNING} gauge\n"
    )
    lines = [f'{RUNNING}{{engine="0",x="{i:05d}"}} 1' for i in range(label_sets)]
    rest = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0\n'
    )
    return (head + "\n".join(lines) + "\n" + rest).encode()


class Served:
    """One HTTP/1.1 server on 127.0.0.1 answering every GET with `body()` (and headers)."""

    def __init__(self, body, headers: dict[str, str] | None = None):
        outer = self
        self.requests = 0

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.requests += 1
                data, extra = body(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                for k, v in {**(headers or {}), **extra}.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class EngineProcess:
    """8 engines in a child process, each answering a page of `label_sets` label sets."""

    def __init__(self, label_sets: int, n: int = 8):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-engines", str(label_sets), str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.urls = [self.proc.stdout.readline().strip() for _ in range(n)]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class ChildProcess:
    """Servers in a child process (`python hostile_sources.py <flag> <args>`), which prints
    one URL a line."""

    def __init__(self, flag: str, *args: str, count: int):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, __file__, flag, *args], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.urls = [self.proc.stdout.readline().strip() for _ in range(count)]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def serve_ray(attack: str) -> None:
    """A clean and a hostile Ray dashboard (`attack` ray: a node list of 5 million `{}`;
    ray_jobs: 10,000 submissions with 1.3 KB entrypoints), their URLs printed."""
    clean, bad = RayStateApi().__enter__(), RayStateApi().__enter__()
    if attack == "ray":
        flood = b'{"result": true, "msg": "", "data": {"result": {"result": ['
        flood += b"{}," * (5 << 20) + b'{}], "total": 1, "num_after_truncation": 1}}}'
        bad.hostile["/api/v0/nodes"] = (200, {}, flood)
    else:
        pad = " ".join(f"data.k{i}=v{i}" for i in range(300))[:1300]
        for i in range(10_000):
            bad.jobs[f"s{i}"] = {"type": "SUBMISSION", "job_id": f"{i:08x}",
                "submission_id": f"s{i}", "status": "SUCCEEDED", "start_time": 1 + i,
                "end_time": 2 + i, "metadata": {}, "entrypoint": "python3 -m "
                f"verl.trainer.main_ppo {pad} trainer.project_name=x{i} "
                f"trainer.experiment_name=y{i}"}  # fmt: skip
        for i in range(10):
            clean.submit(f"s{i}", f"x{i}", f"y{i}", f"{i:08x}")
    print(clean.url, flush=True)
    print(bad.url, flush=True)
    threading.Event().wait()


def serve_engines(label_sets: int, n: int) -> None:
    page = engine_page(label_sets)
    servers = [Served(lambda p: (page, {}), {"Content-Type": "text/plain"}) for _ in range(n)]
    for s in servers:
        print(s.url, flush=True)
    threading.Event().wait()


def write_steps(roots: list[Path], jobs: int, stop: threading.Event, every: float) -> None:
    plan = list(records([(REGIMES["balanced"], 100_000)], seed=3))
    i = 1
    while not stop.wait(every / max(jobs, 1)):
        j = i % jobs
        line = encode(plan[min(i // jobs + 1, len(plan) - 1)])
        for root in roots:
            with open(root / f"p{j}" / "e.jsonl", "ab") as f:
                f.write(line)
        i += 1


def rewrite(path: Path, stop: threading.Event, bodies: list[bytes]) -> None:
    """A target list rewritten every second, in turn with each of `bodies`."""
    i = 0
    while not stop.wait(1.0):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(bodies[i % len(bodies)])
        os.replace(tmp, path)
        i += 1


def alias_bomb(n: int = 2000, m: int = 5000) -> bytes:
    targets = ", ".join(f'"10.{i // 62500}.{i // 250 % 250}.{i % 250}:8000"' for i in range(n))
    return (f"- {{targets: &t [{targets}]}}\n" + "- {targets: *t}\n" * m).encode()


def setup(attack: str, tmp: Path, stop: threading.Event) -> tuple[list, list, list, str]:
    """(clean flags, attacked flags, things to close, the counted cause's reason)."""
    closers: list = []
    if attack == "engines":
        # the engines serve from their own processes: serving 28 MB a second from the bench's
        # would slow the bench's own scrapes, not the exporter's
        bad, good = EngineProcess(70_000), EngineProcess(4)
        closers += [bad, good]
        flags = ("--engine-interval", "1", "--engine-idle-interval", "1")
        return ([*flags, *[a for u in good.urls for a in ("--engine-target", u)]],
                [*flags, *[a for u in bad.urls for a in ("--engine-target", u)]],
                closers, "engine_series_dropped")  # fmt: skip
    if attack == "targets":
        plain = tmp / "plain.yaml"
        plain.write_text("- targets: ['127.0.0.1:9']\n")
        sd = tmp / "sd.yaml"
        other = b"".join(b"- targets: ['127.0.%d.%d:8000']\n" % (i // 250 % 250, i % 250)
                         for i in range(25_000))  # 900 KB  # fmt: skip
        sd.write_bytes(alias_bomb())
        fifo = tmp / "prometheus.yml"
        os.mkfifo(fifo)
        t = threading.Thread(target=rewrite, args=(sd, stop, [alias_bomb(), other]), daemon=True)
        t.start()
        flags = ("--engine-interval", "1", "--engine-idle-interval", "1")
        return ([*flags, "--engine-targets-file", str(plain)],
                [*flags, "--engine-targets-file", str(sd), "--engine-prometheus-file", str(fifo)],
                closers, "engine_target_file_alias")  # fmt: skip
    if attack in ("ray", "ray_jobs"):
        # the fake dashboards serve their 15 MB answers from a child process: served from
        # this one, they would hold the interpreter the scraper needs, and both exporters'
        # p99 would measure the bench (clean 59 ms beside attacked 55 ms)
        ray = ChildProcess("--serve-ray", attack, count=2)
        closers.append(ray)
        clean_url, bad_url = ray.urls
        cause = "too_many_elements" if attack == "ray" else ""
        flags = ("--ray-interval", "2", "--ray-timeout", "5")
        return ([*flags, "--ray", "--ray-address", clean_url],
                [*flags, "--ray", "--ray-address", bad_url], closers, cause)  # fmt: skip
    if attack == "marker":
        return [], [], closers, "bad_total_steps"
    raise SystemExit(f"unknown attack {attack}")


def run(attack: str, args: argparse.Namespace) -> dict:
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        clean_flags, bad_flags, closers, cause = setup(attack, tmp, stop)
        base = ("--verl-interval", "0.5")
        with (
            Exporter(tmp / "clean", *base, *clean_flags) as clean,
            Exporter(tmp / "attacked", *base, *bad_flags) as attacked,
        ):
            roots = [clean.verl_root, attacked.verl_root]
            plan = list(records([(REGIMES["balanced"], 3)], seed=3))
            for root in roots:
                for j in range(args.jobs):
                    (root / f"p{j}").mkdir()
                    (root / f"p{j}" / "e.jsonl").write_bytes(b"".join(encode(r) for r in plan))
            if attack == "marker":
                os.mkfifo(attacked.verl_root / "p0" / "e.total_steps")
            for exp in (clean, attacked):
                exp.wait_for(
                    lambda e=exp: e.value("rlhf_exporter_jobs", collector="verl") == args.jobs,
                    timeout=120,
                )
            writer = threading.Thread(target=write_steps, daemon=True,
                                      args=(roots, args.jobs, stop, 5.0))  # fmt: skip
            writer.start()
            times: dict = {"clean": [], "attacked": []}
            rss: dict = {"clean": [], "attacked": []}
            cpu0 = {n: cpu_s(e.popen.pid) for n, e in (("clean", clean), ("attacked", attacked))}
            end = time.monotonic() + args.seconds
            next_rss = 0.0
            while time.monotonic() < end:
                for name, exp in (("clean", clean), ("attacked", attacked)):
                    times[name].append(scrape(exp.port)[0])
                if time.monotonic() >= next_rss:
                    next_rss = time.monotonic() + 1.0
                    for name, exp in (("clean", clean), ("attacked", attacked)):
                        rss[name].append(rss_mb(exp.popen.pid))
                time.sleep(args.scrape_every)
            stop.set()
            writer.join(10)
            res: dict = {}
            for name, exp in (("clean", clean), ("attacked", attacked)):
                ts = sorted(times[name])
                samples = parse_samples(exp.metrics_text())
                res[name] = {
                    "rss_mb": max(rss[name]),
                    "cpu_pct": 100 * (cpu_s(exp.popen.pid) - cpu0[name]) / args.seconds,
                    "p50_ms": 1000 * statistics.median(ts),
                    "p99_ms": 1000 * ts[min(len(ts) - 1, int(len(ts) * 0.99))],
                    "jobs": sum(1 for (n, _) in samples if n == "rlhf_steps_total"),
                    "samples": samples,
                }
        for c in closers:
            c.close()
    res["cause"] = cause
    return res


def counted(samples: dict, reason: str) -> float:
    return sum(
        v
        for (n, lab), v in samples.items()
        if n in ("rlhf_exporter_record_errors_total", "rlhf_exporter_collector_errors_total")
        and ("reason", reason) in lab
    )


def main() -> int:
    if sys.argv[1:2] == ["--serve-engines"]:
        serve_engines(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["--serve-ray"]:
        serve_ray(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attack", default="all",
                    choices=["all", "engines", "targets", "ray", "ray_jobs", "marker"])  # fmt: skip
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--scrape-every", type=float, default=0.2)
    args = ap.parse_args()
    attacks = ["engines", "targets", "ray", "ray_jobs", "marker"]
    ok_all = True
    print(f"{'attack':10}{'RSS clean':>10}{'RSS bad':>9}{'+MiB':>7}{'p50 c':>7}{'p50 b':>7}"
          f"{'p99 c':>7}{'p99 b':>7}{'CPU% c':>7}{'CPU% b':>7}{'jobs':>6}  cause counted")  # fmt: skip
    for attack in attacks if args.attack == "all" else [args.attack]:
        r = run(attack, args)
        c, a = r["clean"], r["attacked"]
        n = counted(a["samples"], r["cause"]) if r["cause"] else None
        ok = (
            a["rss_mb"] - c["rss_mb"] < 100
            and a["p99_ms"] < 50
            and a["jobs"] == args.jobs
            and (n is None or n > 0)
        )
        ok_all &= ok
        shown = f"{r['cause']}={n:.0f}" if n is not None else "(none: the work is bounded)"
        print(f"{attack:10}{c['rss_mb']:10.1f}{a['rss_mb']:9.1f}{a['rss_mb'] - c['rss_mb']:7.1f}"
              f"{c['p50_ms']:7.1f}{a['p50_ms']:7.1f}{c['p99_ms']:7.1f}{a['p99_ms']:7.1f}"
              f"{c['cpu_pct']:7.1f}{a['cpu_pct']:7.1f}"
              f"{a['jobs']:4d}/{args.jobs:<2d} {shown}  {'met' if ok else 'MISSED'}")  # fmt: skip
    print("goals (RSS within +100 MiB of clean, p99 < 50 ms, every job exported, cause counted):",
          "met" if ok_all else "MISSED")  # fmt: skip
    return 0 if ok_all else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
