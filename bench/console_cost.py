"""The console source's cost: `serve` reading 20 verl trainers' stdout from Ray vs `--no-console`.

    .venv/bin/python bench/console_cost.py [--seconds 180] [--step-every 60] [--backlog-mb 200]

A real Ray head of its own (tests/support/ray_head.py: own ports and temp dir,
RAY_AUTH_MODE=disabled). Each of `--jobs` (20) Ray jobs is one driver connection of this
process that starts one detached actor of a class named `TaskRunner` (the class name Ray
reports, which the exporter takes for a verl trainer) and disconnects: 20 Ray job ids, 20
verl jobs to the console source. Each trainer prints on its own stdout (the file the console
source streams by actor id), with a flush per line:

- first a verl-like resolved config (`pprint` of a dict; `trainer.project_name` 'bench',
  `trainer.experiment_name` 'job-<i>');
- then a verl console step line (`step:N - timing_s/step:np.float64(98.9) - ...`, 60 keys,
  values varying) every `--step-every` seconds (default 60, a real step's pace), the first
  at a random offset so the jobs do not step together;
- amid vLLM-request-log-like lines (~150 bytes each), `--lines-per-s` (200) in all across
  the trainers, printed by the same actors (the trainer's stdout is what the source reads).

Two exporters run side by side against that head for the same `--seconds` (180): `serve
--ray-address <dashboard> --no-nvml --no-push --ray-interval 5` with the console source on
(the default), and the same with `--no-console`. Each process's CPU time and RSS are sampled
every `--sample-every` seconds (psutil), and the bytes each reads from Ray's dashboard (each
talks to it through a relay of this script that counts them: Ray polls and streams alike;
the relays' CPU is this script's, not the exporters'). Then the trainers stop stepping and the console exporter's /api/v1/jobs must list
the 20 jobs with every step each trainer printed (the script fails loudly if not).

Then the catch-up of a sidecar started in the middle of a job: the 20 trainers are killed, a
new trainer prints `--backlog-mb` (200) MB (a ~150-byte line at a time, a step line every
2,000 lines) before a fresh console exporter starts; printed: the time from its start until
/api/v1/jobs shows all of that job's steps (the source exports a job only once its backlog
is read), MB/s, the exporter's CPU and max RSS meanwhile (sampled every 0.5 s).

Every process started (head, actors, exporters) is stopped at the end, also on Ctrl-C,
SIGTERM or failure. A figure, not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.procs import free_port, wait_until  # noqa: E402
from tests.support.ray_head import RayHead, auth_env  # noqa: E402

NAMESPACE = "console-cost"
PROJECT = "bench"

# the 60 keys of a verl step (ppo_trainer's metrics; values as NumPy 2 prints them), with a
# typical value each: every step prints each one varied by up to +-20 %
STEP_KEYS: dict[str, float | int] = {
    "training/global_step": 0,
    "training/epoch": 0,
    "actor/entropy": 0.434,
    "actor/pg_loss": 0.0121,
    "actor/pg_clipfrac": 0.0032,
    "actor/pg_clipfrac_lower": 0.0,
    "actor/ppo_kl": 0.00041,
    "actor/kl_loss": 0.0013,
    "actor/kl_coef": 0.001,
    "actor/grad_norm": 0.616,
    "actor/lr": 1e-06,
    "actor/perf/max_memory_allocated_gb": 61.5,
    "actor/perf/max_memory_reserved_gb": 70.0,
    "actor/perf/cpu_memory_used_gb": 180.0,
    "critic/score/mean": 0.215,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "critic/rewards/mean": 0.373,
    "critic/rewards/max": 1.0,
    "critic/rewards/min": 0.0,
    "critic/advantages/mean": 0.0012,
    "critic/advantages/max": 2.47,
    "critic/advantages/min": -2.31,
    "critic/returns/mean": 0.0012,
    "critic/returns/max": 2.47,
    "critic/returns/min": -2.31,
    "response_length/mean": 1500.0,
    "response_length/max": 2400.0,
    "response_length/min": 150.0,
    "response_length/clip_ratio": 0.01,
    "response/aborted_ratio": 0.0,
    "prompt_length/mean": 512.0,
    "prompt_length/max": 1024.0,
    "prompt_length/min": 64.0,
    "prompt_length/clip_ratio": 0.0,
    "num_turns/mean": 1.0,
    "num_turns/max": 1,
    "num_turns/min": 1,
    "global_seqlen/mean": 152691.0,
    "global_seqlen/min": 141022,
    "global_seqlen/max": 163015,
    "global_seqlen/minmax_diff": 21993,
    "global_seqlen/balanced_min": 152690,
    "global_seqlen/balanced_max": 152692,
    "timing_s/gen": 29.68,
    "timing_s/reward": 3.12,
    "timing_s/old_log_prob": 12.29,
    "timing_s/ref": 7.82,
    "timing_s/adv": 2.0,
    "timing_s/update_actor": 28.78,
    "timing_s/update_weights": 5.2,
    "timing_per_token_ms/gen": 0.0347,
    "timing_per_token_ms/ref": 0.0064,
    "timing_per_token_ms/adv": 0.0016,
    "timing_per_token_ms/update_actor": 0.0236,
    "perf/total_num_tokens": 1221529,
    "perf/throughput": 772.0,
    "perf/mfu/actor": 0.339,
    "timing_s/step": 0.0,  # the sum of the phases, below
    "perf/time_per_step": 0.0,
}


def step_line(step: int, rng: random.Random) -> str:
    """One step as verl's console logger prints it (`concat_dict_to_str`)."""
    parts = [f"step:{step}"]
    total = 0.0
    for key, typical in STEP_KEYS.items():
        if key == "training/global_step":
            v: float | int = step
        elif key in ("timing_s/step", "perf/time_per_step"):
            v = round(total * 1.02, 4)
        elif isinstance(typical, int):
            v = round(typical * rng.uniform(0.8, 1.2))
        else:
            v = typical * rng.uniform(0.8, 1.2)
            if key.startswith("timing_s/"):
                total += v
        parts.append(f"{key}:np.int64({v})" if isinstance(v, int) else f"{key}:np.float64({v!r})")
    return " - ".join(parts)


def noise_line(rng: random.Random) -> str:
    """A vLLM request log line, ~150 bytes."""
    return (
        f"INFO 12-05 08:{rng.randrange(60):02d}:{rng.randrange(60):02d} [logger.py:43] Received "
        f"request chatcmpl-{rng.getrandbits(64):016x}: params: SamplingParams(n=1, "
        f"temperature=1.0, max_tokens={rng.randrange(1024, 4096)}), lora_request: None."
    )


def config(experiment: str) -> dict[str, Any]:
    """A verl-like resolved config (what main_ppo pprints at start)."""
    return {
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 256, "strategy": "fsdp2", "use_kl_loss": True},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "rollout": {"gpu_memory_utilization": 0.6, "n": 5, "name": "vllm", "mode": "async"},
        },
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "data": {"max_prompt_length": 1024, "max_response_length": 2048, "train_batch_size": 1024},
        "trainer": {
            "experiment_name": experiment,
            "logger": ["console", "wandb"],
            "n_gpus_per_node": 8,
            "nnodes": 1,
            "project_name": PROJECT,
            "total_epochs": 15,
        },
    }


def trainer_class() -> Any:
    import ray

    class TaskRunner:
        """Prints like a verl trainer: its config, then steps amid request logs."""

        def __init__(self, experiment: str, seed: int) -> None:
            import pprint

            self.rng = random.Random(seed)
            self.experiment = experiment
            self.steps = 0
            self.printed = 0
            self.stepping = True
            self.running = True
            text = pprint.pformat(config(experiment)) + "\n"
            self._out(text)

        def _out(self, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.printed += len(text.encode())

        def start(self, lines_per_s: float, step_every: float) -> int:
            import threading

            threading.Thread(target=self._run, args=(lines_per_s, step_every), daemon=True).start()
            return os.getpid()

        def _run(self, lines_per_s: float, step_every: float) -> None:
            t0 = time.monotonic()
            next_line = t0
            next_step = t0 + self.rng.uniform(0.1, 1.0) * step_every
            while self.running:
                now = time.monotonic()
                if self.stepping and now >= next_step:
                    self.steps += 1
                    self._out(step_line(self.steps, self.rng) + "\n")
                    next_step += step_every
                if now >= next_line:
                    self._out(noise_line(self.rng) + "\n")
                    next_line += 1.0 / lines_per_s
                    if now - next_line > 5:  # a stalled machine: no burst to catch up
                        next_line = now
                time.sleep(max(0.0, min(next_line, next_step) - time.monotonic()))

        def stop_stepping(self) -> tuple[int, int]:
            """Stop stepping (request logs go on); returns (steps printed, bytes printed)."""
            self.stepping = False
            return self.steps, self.printed

        def fill(self, mb: float, step_lines_every: int = 2000) -> tuple[int, int]:
            """Print `mb` MB at once (a backlog): request-log lines, a step line every
            `step_lines_every` lines; returns (steps printed, bytes printed)."""
            want = int(mb * 1e6)
            chunk: list[str] = []
            size = n = 0
            while self.printed + size < want:
                n += 1
                line = (
                    step_line(self.steps + 1, self.rng)
                    if n % step_lines_every == 0
                    else noise_line(self.rng)
                ) + "\n"
                if n % step_lines_every == 0:
                    self.steps += 1
                chunk.append(line)
                size += len(line)
                if size >= 1 << 20:
                    self._out("".join(chunk))
                    chunk, size = [], 0
            if chunk:
                self._out("".join(chunk))
            return self.steps, self.printed

    return ray.remote(num_cpus=0, lifetime="detached", namespace=NAMESPACE)(TaskRunner)


class CountingProxy:
    """A TCP relay to the Ray dashboard that counts the bytes each exporter receives from
    it (Ray polls and console streams alike): one relay per exporter."""

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self.target = ("127.0.0.1", target_port)
        self.received = 0  # bytes from Ray to the exporter
        self.lock = threading.Lock()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.socks: list[Any] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.closed:
            try:
                client, _ = self.srv.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                continue
            self.socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: Any, dst: Any, count: bool) -> None:
        import socket

        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if count:
                    with self.lock:
                        self.received += len(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        for sock in [self.srv, *self.socks]:
            try:
                sock.close()
            except OSError:
                pass


class Stop(Exception):
    pass


def _sigterm(signum: int, frame: Any) -> None:
    raise Stop(f"signal {signum}")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.head: RayHead | None = None
        self.exporters: list[subprocess.Popen[bytes]] = []
        self.proxies: list[CountingProxy] = []
        self.logs: dict[str, Path] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="console-cost-"))

    # -- Ray --------------------------------------------------------------------------------
    def driver(self) -> Any:
        """Connect this process as a new Ray driver: each connection is a new Ray job id."""
        import ray

        os.environ.update(auth_env(None))
        ray.init(
            address=self.head.gcs_address,
            namespace=NAMESPACE,
            log_to_driver=False,
            configure_logging=False,
        )
        # Ray's core worker installs its own SIGTERM handler (it ends the process at once,
        # leaving the head and the exporters running): ours stops them first
        signal.signal(signal.SIGTERM, _sigterm)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return ray

    def start_trainers(self, n: int) -> dict[str, Any]:
        """n trainers, each the actor of its own Ray job (the driver disconnects after)."""
        job_ids = set()
        for i in range(n):
            ray = self.driver()
            job_ids.add(ray.get_runtime_context().get_job_id())
            actor = trainer_class().options(name=f"job-{i}").remote(f"job-{i}", seed=i)
            ray.get(actor.start.remote(self.args.lines_per_s / n, self.args.step_every))
            ray.shutdown()
        if len(job_ids) != n:
            raise RuntimeError(f"{n} drivers made {len(job_ids)} Ray job ids, not {n}")
        ray = self.driver()
        return {f"job-{i}": ray.get_actor(f"job-{i}", namespace=NAMESPACE) for i in range(n)}

    # -- exporters --------------------------------------------------------------------------
    def exporter(
        self, name: str, *extra: str, address: str | None = None
    ) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        env = {**os.environ, **auth_env(None)}
        env.pop("RAY_AUTH_TOKEN", None)
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        with open(log, "wb") as out:
            p = subprocess.Popen(
                [
                    str(REPO / ".venv" / "bin" / "rlhf-exporter"),
                    "serve",
                    "--ray-address",
                    address or self.head.dashboard_url,
                    "--no-nvml",
                    "--no-push",
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--ray-interval",
                    "5",
                    *extra,
                ],
                cwd=self.tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.exporters.append(p)
        return p, port

    def ready(self, p: subprocess.Popen[bytes], port: int, name: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}):\n{self.tail(name)}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} not ready after 60 s:\n{self.tail(name)}")

    def tail(self, name: str, n: int = 30) -> str:
        try:
            return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop_exporters(self) -> None:
        for p in self.exporters:
            if p.poll() is None:
                p.terminate()
        for p in self.exporters:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.exporters = []
        for proxy in self.proxies:
            proxy.close()
        self.proxies = []

    def close(self) -> None:
        self.stop_exporters()
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except Exception:
            pass
        if self.head is not None:
            self.head.stop(grace=3.0)
            self.head = None

    # -- phase 1: side by side --------------------------------------------------------------
    def side_by_side(self) -> None:
        args = self.args
        t = time.monotonic()
        trainers = self.start_trainers(args.jobs)
        print(f"{args.jobs} trainers (TaskRunner actors, one Ray job each) started in "
              f"{time.monotonic() - t:.0f} s; each prints its config, a step every "
              f"{args.step_every:g} s and {args.lines_per_s / args.jobs:g} request-log lines/s "
              f"({args.lines_per_s:g}/s in all) on its own stdout")  # fmt: skip
        proxies = {
            name: CountingProxy(self.head.dashboard_port) for name in ("console", "no-console")
        }
        self.proxies += proxies.values()
        runs = {
            name: self.exporter(
                name,
                *(["--no-console"] if name == "no-console" else []),
                address=f"http://127.0.0.1:{proxies[name].port}",
            )
            for name in proxies
        }
        for name, (p, port) in runs.items():
            self.ready(p, port, name)
        procs = {name: psutil.Process(p.pid) for name, (p, _) in runs.items()}
        samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runs}

        def sample() -> None:
            for name, ps in procs.items():
                c = ps.cpu_times()
                samples[name].append((time.monotonic(), c.user + c.system, ps.memory_info().rss))

        rx0 = {name: proxies[name].received for name in runs}
        sample()
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(min(args.sample_every, max(0.0, t0 + args.seconds - time.monotonic())))
            sample()
        wall = time.monotonic() - t0
        read = {name: proxies[name].received - rx0[name] for name in runs}
        import ray

        got = ray.get([a.stop_stepping.remote() for a in trainers.values()])
        expected = {name: steps for name, (steps, _) in zip(trainers, got, strict=True)}
        printed = sum(b for _, b in got)
        jobs = self.check(runs["console"][1], expected, "console")
        _, port_off = runs["no-console"]
        off_jobs = fetch_jobs(port_off)

        print(f"\nside by side, {wall:.0f} s (samples every {args.sample_every:g} s):")
        cpu = {}
        for name in runs:
            s = samples[name]
            cpu[name] = (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])
            rss = [r for _, _, r in s]
            print(f"  {name:10} CPU {100 * cpu[name]:6.2f} % of a core   RSS median "
                  f"{mb(statistics.median(rss)):6.1f} MB, max {mb(max(rss)):6.1f} MB   "
                  f"bytes read {read[name] / 1e6:7.2f} MB")  # fmt: skip
        med = {n: statistics.median(r for _, _, r in samples[n]) for n in runs}
        top = {n: max(r for _, _, r in samples[n]) for n in runs}
        print(f"  console / no-console CPU: {cpu['console'] / max(cpu['no-console'], 1e-9):.2f}x "
              f"(+{100 * (cpu['console'] - cpu['no-console']):.2f} % of a core)")  # fmt: skip
        print(f"  RSS difference: median +{mb(med['console'] - med['no-console']):.1f} MB, "
              f"max +{mb(top['console'] - top['no-console']):.1f} MB")  # fmt: skip
        print(f"  bytes read: the console exporter read {read['console'] / 1e6:.2f} MB, "
              f"{(read['console'] - read['no-console']) / 1e6:.2f} MB more than --no-console "
              f"(every byte Ray's dashboard sent each one, counted by a relay in between: its "
              f"polls too); the {args.jobs} trainers printed {printed / 1e6:.2f} MB in all since "
              f"they started")  # fmt: skip
        steps = sorted(j["steps"] for j in jobs)
        print(f"  console exporter: {len(jobs)} jobs listed, steps per job {steps[0]}-{steps[-1]}"
              f" (as printed); --no-console lists {len(off_jobs)} jobs")  # fmt: skip
        for a in trainers.values():
            ray.kill(a)

    def check(self, port: int, expected: dict[str, int], name: str) -> list[dict[str, Any]]:
        """Wait until /api/v1/jobs lists each expected job with its steps; fail loudly."""
        seen: list[dict[str, Any]] = []

        def done() -> bool:
            nonlocal seen
            seen = [j for j in fetch_jobs(port) if j.get("project") == PROJECT]
            have = {j["experiment"]: j.get("steps") for j in seen}
            return all(have.get(e) == s for e, s in expected.items())

        try:
            wait_until(done, self.args.check_timeout, 1.0, "every job with its steps")
        except Exception:
            have = {j["experiment"]: j.get("steps") for j in seen}
            lines = [
                f"  {e}: expected {s} steps, listed {have.get(e, 'NOT LISTED')}"
                for e, s in sorted(expected.items())
                if have.get(e) != s
            ]
            raise RuntimeError(
                f"the {name} exporter's /api/v1/jobs does not list every job with its steps "
                f"after {self.args.check_timeout:g} s ({len(seen)} listed):\n"
                + "\n".join(lines)
                + f"\n--- {name} exporter log (tail) ---\n{self.tail(name)}"
            ) from None
        return seen

    # -- phase 2: catch-up ------------------------------------------------------------------
    def catch_up(self) -> None:
        args = self.args
        import ray

        ray.shutdown()
        ray = self.driver()
        actor = trainer_class().options(name="backlog").remote("backlog", seed=1000)
        t = time.monotonic()
        steps, printed = ray.get(actor.fill.remote(args.backlog_mb))
        print(f"\ncatch-up: a trainer printed {printed / 1e6:.1f} MB ({steps} steps, a step line "
              f"every 2,000 request-log lines) in {time.monotonic() - t:.1f} s before the "
              f"exporter started")  # fmt: skip
        time.sleep(3)  # Ray's log monitor reads the new file too: let it settle
        t0 = time.monotonic()
        p, port = self.exporter("catch-up")
        ps = psutil.Process(p.pid)
        rss_max = 0
        listed_at = None
        while True:
            if p.poll() is not None:
                raise RuntimeError(
                    f"the exporter exited ({p.returncode}):\n{self.tail('catch-up')}"
                )
            rss_max = max(rss_max, ps.memory_info().rss)
            c = ps.cpu_times()
            cpu = c.user + c.system
            try:
                jobs = [j for j in fetch_jobs(port, 2) if j.get("experiment") == "backlog"]
            except requests.RequestException:
                jobs = []
            if jobs and listed_at is None:
                listed_at = time.monotonic() - t0
            if jobs and jobs[0].get("steps") == steps:
                break
            if time.monotonic() - t0 > args.catchup_timeout:
                raise RuntimeError(
                    f"after {args.catchup_timeout:g} s the exporter lists "
                    f"{jobs[0].get('steps') if jobs else 'no'} steps of {steps} for the backlog "
                    f"job:\n--- exporter log (tail) ---\n{self.tail('catch-up')}"
                )
            time.sleep(0.5)
        took = time.monotonic() - t0
        print(
            f"  from the exporter's start to all {steps} steps in /api/v1/jobs: {took:.1f} s "
            f"({printed / 1e6 / took:.1f} MB/s; the job first listed at {listed_at:.1f} s)"
        )
        print(f"  exporter CPU meanwhile {cpu:.1f} s ({100 * cpu / took:.0f} % of a core), "
              f"max RSS {mb(rss_max):.1f} MB (sampled every 0.5 s)")  # fmt: skip
        ray.kill(actor)


def fetch_jobs(port: int, timeout: float = 10) -> list[dict[str, Any]]:
    r = requests.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=timeout)
    r.raise_for_status()
    return r.json()["jobs"]


def mb(n: float) -> float:
    return n / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=180.0, help="side-by-side window")
    ap.add_argument("--step-every", type=float, default=60.0, help="seconds between steps")
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--lines-per-s", type=float, default=200.0, help="other lines, in all")
    ap.add_argument("--sample-every", type=float, default=3.0)
    ap.add_argument("--backlog-mb", type=float, default=200.0, help="0: no catch-up phase")
    ap.add_argument("--check-timeout", type=float, default=60.0)
    ap.add_argument("--catchup-timeout", type=float, default=300.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _sigterm)
    bench = Bench(args)
    t = time.monotonic()
    try:
        bench.head = RayHead(f"cc{uuid.uuid4().hex[:6]}", num_cpus=2)
        print(f"Ray head {bench.head.dashboard_url} up in {time.monotonic() - t:.0f} s; "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        bench.side_by_side()
        bench.stop_exporters()
        if args.backlog_mb > 0:
            bench.catch_up()
    except (KeyboardInterrupt, Stop) as exc:
        print(f"interrupted ({exc or 'Ctrl-C'}): stopping every process started", file=sys.stderr)
        return 130
    finally:
        bench.close()
    print(f"\nwhole run {time.monotonic() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
