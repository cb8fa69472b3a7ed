"""Issue 17, multi-node: two real sidecars on 127.0.0.1, a head and a worker, each a
`python -m exporter serve` process with its own fake GPUs.

- The head reads the job's verl log (the verl file source) and joins the steps' windows to
  its GPUs: a single-node run of the job.
- The worker is configured as the chart configures a worker pod (environment only: NVML on,
  Ray off or for PIDs only (below), `RLHF_EXPORTER_GPU_WINDOWS_FROM` = the head's URL,
  `RLHF_EXPORTER_PUSH_TOKEN`); it has no verl log and gets the steps over the head's
  `GET /api/v1/windows`.
- Both load `pynvml` from tests/support/nvml_shim (the fake of tests/support/fake_pynvml.py
  at the import boundary, nothing else patched), reading one scenario file: five GPUs whose
  utilization follows the job's true windows on the wall clock (GPUs 0-1 busy in `gen`,
  2-3 in `old_log_prob` and `update_actor`, 4 in all three).

The module runs twice (the `run` fixture's two params):

- `no_ray`: the chart with `sidecar.gpuRoles: false`, no Ray: every GPU's role is `unknown`.
- `ray_roles`: the chart with `sidecar.gpuRoles: true` on a REAL Ray head (one per module,
  tests/support/ray_head.py, always stopped) holding a rollout server (`vLLMHttpServer`
  named `vllm_server_0_0`) and a trainer (`WorkerDict`, `<pg>WorkerDict_0:0`), actors as
  verl creates them. The fake GPUs report those actors' real PIDs as their processes (GPUs
  0-1 the rollout's, 2-3 the trainer's, 4 both: the hybrid engine), so both sidecars read
  the real /proc (`ray::<Class>` titles) and the real dashboard to give them their roles:
  `rollout`, `trainer`, `colocated`. The head sidecar exports the actor counts; the worker,
  as the chart sets it (Ray for PIDs only: RAY_ACTORS=false), exports none.

A synthetic job writes its records to the log at their true times. The worker's
`rlhf_window_gpu_{busy_,}seconds_total` per (group, gpu_role) must equal the head's.
The tolerance is 1e-6 GPU-seconds: both nodes see the same buffered samples (NVML stamps
them itself, on the driver's grid, so when a sidecar polls changes which poll brings a
sample, not its time or value) and the same step timelines (the API's JSON carries the
floats exactly), so only float formatting may differ. Both must also hold every step exactly
once (available GPU-seconds = GPUs x the steps' durations) and be near the truth.

A third sidecar, a worker with a wrong token, must report its collector down with reason
`unauthorized` and export no window series.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rlhf_exporter.config import load_thresholds
from rlhf_exporter.render import rules as rules_mod
from rlhf_exporter.render.rules import gpuwindows
from tests.support.procs import REPO
from tests.support.ray_head import connected_head, verl_actor_classes
from tests.support.serve import Exporter

pytestmark = pytest.mark.slow

TOKEN = "multinode-s3cret"
PROJECT, EXPERIMENT = "p", "e"
SHIM = REPO / "tests" / "support" / "nvml_shim"
# one step's windows in verl's order, back to back (no untimed remainder: where R runs is a
# placement choice, not what this test is about), seconds
WINDOWS = (
    ("gen", 1.2),
    ("reward", 0.2),
    ("old_log_prob", 1.0),
    ("adv", 0.2),
    ("update_actor", 1.0),
    ("update_weights", 0.2),
)
# per GPU: its role when its processes are matched to Ray actors, and percent busy during its
# windows (IDLE otherwise)
GPUS = (
    ("rollout", {"gen": 90}),
    ("rollout", {"gen": 90}),
    ("trainer", {"old_log_prob": 85, "update_actor": 85}),
    ("trainer", {"old_log_prob": 85, "update_actor": 85}),
    ("colocated", {"gen": 70, "old_log_prob": 80, "update_actor": 80}),
)
BUSY = [busy for _role, busy in GPUS]
# the processes NVML reports on a GPU of each role: (actor, GPU memory bytes); each actor is
# named by its Ray role
PROCESSES = {
    "rollout": (("rollout", 30 << 30),),
    "trainer": (("trainer", 40 << 30),),
    "colocated": (("rollout", 30 << 30), ("trainer", 40 << 30)),
}
IDLE = 5
STEPS = 5
GAP = 0.3  # seconds between a record and the next step's start (outside every window)
TESTING = {3: 0.5}  # validation after `step` in these steps: the record comes later
SAMPLE_PERIOD = 0.05  # the fake driver's sampling period (real GPUs: 1/6 to 1 s)
GROUPS = load_thresholds().timer_groups
EXACT = 1e-6  # GPU-seconds: worker versus head (see the module docstring)
NEAR_TRUTH = 0.05  # busy share versus the simulation's truth (the 5 points)


def plan(t0: float) -> list[dict]:
    """The job's steps in wall-clock time: windows, record time and record data."""
    steps, t = [], t0
    for step in range(1, STEPS + 1):
        intervals = []
        for timer, seconds in WINDOWS:
            intervals.append((timer, t, t + seconds))
            t += seconds
        data = {f"timing_s/{timer}": seconds for timer, seconds in WINDOWS}
        data["timing_s/step"] = sum(seconds for _timer, seconds in WINDOWS)  # R = 0
        if step in TESTING:
            data["timing_s/testing"] = TESTING[step]
            t += TESTING[step]
        steps.append({"step": step, "at": t, "data": data, "intervals": intervals})
        t += GAP
    return steps


def schedule(steps: list[dict], gpu: int) -> list[list[float]]:
    """GPU `gpu`'s utilization as a step function of epoch seconds."""
    util = [[0.0, IDLE]]
    for st in steps:
        for timer, a, b in st["intervals"]:
            util += [[a, BUSY[gpu].get(timer, IDLE)], [b, IDLE]]
    out: list[list[float]] = []
    for t, pct in util:  # back-to-back windows: the later value at a shared edge wins
        if out and out[-1][0] == t:
            out[-1] = [t, pct]
        else:
            out.append([t, pct])
    return out


def write_scenario(path: Path, steps: list[dict], pids: dict[str, int] | None = None) -> None:
    """The fake GPUs: utilization by `steps`; with `pids` (actor -> PID), each GPU runs the
    processes of its role (none without)."""
    doc = {
        "sample_period": SAMPLE_PERIOD,
        "gpus": [
            {
                "util": schedule(steps, g),
                "processes": [[pids[actor], mem] for actor, mem in PROCESSES[role]] if pids else [],
            }
            for g, (role, _busy) in enumerate(GPUS)
        ],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # the sidecars re-read it whole, never half-written


def truth_shares(steps: list[dict], roles: list[str]) -> dict[tuple[str, str], float]:
    """(group, gpu_role) -> the busy share the simulation used, for GPUs of these roles."""
    busy: dict[tuple[str, str], float] = {}
    avail: dict[tuple[str, str], float] = {}
    for st in steps:
        for timer, a, b in st["intervals"]:
            group = GROUPS.get(timer, "other")
            for gpu, role in enumerate(roles):
                key = (group, role)
                busy[key] = busy.get(key, 0.0) + BUSY[gpu].get(timer, IDLE) / 100 * (b - a)
                avail[key] = avail.get(key, 0.0) + (b - a)
    return {k: busy[k] / avail[k] for k in avail}


def window_series(exp: Exporter) -> dict[tuple[str, frozenset], float]:
    """The job's GPU-window series of one scrape: (name, label items) -> value."""
    return {
        (name, labels): value
        for (name, labels), value in exp.samples().items()
        if name in (gpuwindows.BUSY, gpuwindows.TOTAL)
        and {("project", PROJECT), ("experiment", EXPERIMENT)} <= labels
    }


def windows_by_group(exp: Exporter) -> dict[tuple[str, str], tuple[float, float]]:
    """(group, gpu_role) -> (busy, available) GPU-seconds of the job, from one scrape."""
    out: dict[tuple[str, str], list[float]] = {}
    for (name, labels), value in window_series(exp).items():
        lab = dict(labels)
        out.setdefault((lab["group"], lab["gpu_role"]), [0.0, 0.0])[name == gpuwindows.TOTAL] = (
            value
        )
    return {k: (v[0], v[1]) for k, v in out.items()}


def role_memory(exp: Exporter) -> dict[str, dict[str, float]]:
    """GPU -> {role: memory bytes > 0}, from one scrape of `rlhf_gpu_role_memory_bytes`."""
    out: dict[str, dict[str, float]] = {}
    for labels, value in exp.series("rlhf_gpu_role_memory_bytes").items():
        lab = dict(labels)
        out.setdefault(lab["gpu"], {})
        if value > 0:
            out[lab["gpu"]][lab["role"]] = value
    return out


def chart_env(
    scenario: Path, pod: str, ray_address: str | None = None, **settings: str
) -> dict[str, str]:
    """The environment helm/rlhf-exporter/templates/_helpers.tpl (`rlhf-exporter.sidecar`)
    gives the sidecar of a `pod` ("head" or "worker"): with `ray_address` (the Ray dashboard)
    as with `sidecar.gpuRoles: true` (head: Ray with actor counts; worker: Ray for PIDs only,
    `sidecar.worker.rayAddress`), without it as with `gpuRoles: false` and no Ray at all.
    Plus the fake pynvml and short intervals (tests only), then `settings`."""
    roles = ray_address is not None
    env = {
        "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO)]),
        "FAKE_PYNVML_SCENARIO": str(scenario),
        "RLHF_EXPORTER_RAY": str(roles).lower(),
        "RLHF_EXPORTER_RAY_ACTORS": str(roles and pod == "head").lower(),
        "RLHF_EXPORTER_NVML": "true",
        "RLHF_EXPORTER_GPU_ROLES": str(roles).lower(),
        "RLHF_EXPORTER_NVML_INTERVAL": "0.25",
    }
    if ray_address is not None:
        env["RLHF_EXPORTER_RAY_ADDRESS"] = ray_address
        env["RLHF_EXPORTER_RAY_INTERVAL"] = "1"  # the chart leaves the default, 15 s
    env.update({f"RLHF_EXPORTER_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.fixture(scope="module")
def ray_actors():
    """One real Ray head for the module (stopped at its end, also on failure), with a
    rollout server and a trainer worker as verl names them; this process is their driver."""
    ray = pytest.importorskip("ray")  # where Ray is missing, the other Ray tests skip too
    with connected_head("rlhf-exporter-multinode", grace=2.0) as head:
        classes = verl_actor_classes()
        rollout = classes["vLLMHttpServer"].options(name="vllm_server_0_0").remote()
        trainer = classes["WorkerDict"].options(name="a1b2c3WorkerDict_0:0").remote()
        pids = ray.get([rollout.pid.remote(), trainer.pid.remote()], timeout=120)
        yield SimpleNamespace(
            head=head,
            handles=(rollout, trainer),  # alive as long as their handles
            pids={"rollout": pids[0], "trainer": pids[1]},
        )


@pytest.fixture(scope="module", params=["no_ray", pytest.param("ray_roles", marks=pytest.mark.ray)])
def run(request, tmp_path_factory):
    """Head, worker and a worker with a wrong token, all started before the job (with Ray:
    and all knowing their GPUs' roles); the job runs, then both nodes have joined every step.
    Every sidecar is stopped at the end of its run, also on failure."""
    cluster = request.getfixturevalue("ray_actors") if request.param == "ray_roles" else None
    pids = cluster.pids if cluster else None
    dashboard = cluster.head.dashboard_url if cluster else None
    roles = [role if cluster else "unknown" for role, _busy in GPUS]
    tmp_path = tmp_path_factory.mktemp(f"multinode-{request.param}")
    scenario = tmp_path / "gpus.json"
    write_scenario(scenario, [], pids)  # idle until the job's plan is known
    verl_root = tmp_path / "verl"
    (verl_root / PROJECT).mkdir(parents=True)
    started: list[Exporter] = []
    try:
        head = Exporter(
            tmp_path / "head",
            defaults=False,
            env=chart_env(
                scenario,
                "head",
                dashboard,
                verl_root=str(verl_root),
                verl_interval="0.2",
                push_token=TOKEN,
            ),
        )
        started.append(head)
        sidecars = {"head": head}
        for name, token in (("worker", TOKEN), ("intruder", "not-the-token")):
            sidecars[name] = Exporter(
                tmp_path / name,
                defaults=False,
                ready=False,
                env=chart_env(
                    scenario,
                    "worker",
                    dashboard,
                    gpu_windows_from=head.url,
                    gpu_windows_interval="0.5",
                    push_token=token,
                ),
            )
            started.append(sidecars[name])
        for exp in started:
            exp.wait_ready()
        if cluster:  # every GPU's role known on both nodes before the job's first sample
            want = {
                str(g): {actor for actor, _mem in PROCESSES[role]}
                for g, (role, _b) in enumerate(GPUS)
            }
            for name in ("head", "worker"):
                exp = sidecars[name]
                exp.wait_for(
                    lambda e=exp: {g: set(r) for g, r in role_memory(e).items()} == want,
                    30,
                    f"{name} matches its GPUs' processes to Ray roles",
                )

        log_file = verl_root / PROJECT / f"{EXPERIMENT}.jsonl"
        log_file.write_bytes(b"")  # the job's logger opens its file before the first step
        steps = plan(time.time() + 1.5)
        write_scenario(scenario, steps, pids)  # before any sample of the job is taken
        late = []
        with open(log_file, "ab") as f:
            for st in steps:
                time.sleep(max(0.0, st["at"] - time.time()))
                f.write(json.dumps({"step": st["step"], "data": st["data"]}).encode() + b"\n")
                f.flush()
                late.append(time.time() - st["at"])
        gpu_seconds = len(BUSY) * sum(st["data"]["timing_s/step"] for st in steps)

        def joined(exp: Exporter) -> dict:
            found = windows_by_group(exp)
            total = sum(avail for _busy, avail in found.values())
            # epoch seconds carry ~2.4e-7 s of float resolution: relative 1e-6, far below one
            # step's 15 GPU-seconds, tells "every step joined once" from anything else
            return found if abs(total - gpu_seconds) <= 1e-6 * gpu_seconds else {}

        results = {
            name: sidecars[name].wait_for(lambda e=sidecars[name]: joined(e), 20, f"{name} joins")
            for name in ("head", "worker")
        }
        yield {
            **sidecars,
            "results": results,
            "steps": steps,
            "late": late,
            "tmp": tmp_path,
            "roles": roles,
            "ray": cluster,
        }
    finally:
        for exp in started:
            exp.terminate()


def test_worker_sidecar_matches_a_single_node_run(run):
    head_result, worker_result = run["results"]["head"], run["results"]["worker"]
    assert worker_result.keys() == head_result.keys()
    assert {g for g, _ in head_result} == {GROUPS.get(t, "other") for t, _ in WINDOWS}
    roles = run["roles"]
    # no Ray: no PID join, all `unknown`; with Ray: exactly the GPUs' roles, none `unknown`
    assert {r for _, r in head_result} == set(roles)
    assert {(g, r) for g, _ in head_result for r in roles} == set(head_result)
    for key, (busy, avail) in head_result.items():
        w_busy, w_avail = worker_result[key]
        assert abs(w_avail - avail) <= EXACT, (key, w_avail, avail)
        assert abs(w_busy - busy) <= EXACT, (key, w_busy, busy)
        assert 0.0 <= busy <= avail
    # ... and both are near the truth the simulation used (every step was joined once: the
    # fixture waited for available GPU-seconds = GPUs x the steps' durations)
    # (the groups of 1 s windows and longer: a 0.2 s window's share also carries how late the
    # test wrote a record, x5 -- the anchor error the docs state, not the join's)
    truth = truth_shares(run["steps"], roles)
    for group in ("rollout", "logprob", "update"):
        for role in set(roles):
            busy, avail = head_result[group, role]
            share = busy / avail
            assert abs(share - truth[group, role]) <= NEAR_TRUTH, (group, role, share, run["late"])
    # the worker read no log: its windows came over the head's API, and its source is up
    head, worker = run["head"], run["worker"]
    assert worker.value("rlhf_steps_total") is None
    assert head.value("rlhf_steps_total", project=PROJECT) == STEPS
    assert worker.value("rlhf_exporter_collector_up", collector="gpu_windows_remote") == 1.0


def test_gpu_roles_come_from_the_real_ray_actors_and_only_the_head_counts_them(run):
    """With Ray: each GPU's memory goes to the role of the actor process holding it, on both
    nodes (each read /proc and the dashboard itself); the worker reads Ray for PIDs only."""
    cluster = run["ray"]
    if cluster is None:
        for name in ("head", "worker"):
            assert run[name].value("rlhf_gpu_role_memory_bytes") is None  # gpu_roles off
            assert run[name].value("rlhf_ray_actors") is None
        return
    # the actors are named by their Ray roles: `rollout` and `trainer`
    want = {
        str(g): {actor: float(mem) for actor, mem in PROCESSES[role]}
        for g, (role, _busy) in enumerate(GPUS)
    }
    head, worker = run["head"], run["worker"]
    assert role_memory(head) == role_memory(worker) == want
    for exp in (head, worker):
        assert exp.value("rlhf_exporter_collector_up", collector="ray") == 1.0
        assert exp.value("rlhf_exporter_collector_up", collector="nvml") == 1.0
    assert head.value("rlhf_ray_actors", role="rollout", state="ALIVE") == 1.0
    assert head.value("rlhf_ray_actors", role="trainer", state="ALIVE") == 1.0
    assert worker.value("rlhf_ray_actors") is None  # the head counts actors, once
    assert worker.value("rlhf_ray_cluster_info") == 1.0  # ... the worker did read Ray


def test_worker_with_a_wrong_token_is_down_and_exports_no_windows(run):
    intruder = run["intruder"]
    assert intruder.value("rlhf_exporter_collector_up", collector="gpu_windows_remote") == 0.0
    errors = intruder.value(
        "rlhf_exporter_collector_errors_total",
        collector="gpu_windows_remote",
        reason="unauthorized",
    )
    assert errors is not None and errors >= 1
    assert windows_by_group(intruder) == {}
    assert intruder.value("rlhf_window_gpu_seconds_total") is None
    log = intruder.output()
    assert "gpu_windows_remote source failed (unauthorized)" in log and "HTTP 401" in log


def test_recording_rules_sum_the_nodes_into_the_job_total(run):
    """The two nodes' real series, fed to promtool as counters growing by their scraped value
    every minute: at 60m the job's idle record (`sum without (instance, pod)`) must be one
    series per (group, gpu_role), worth 30 minutes of both nodes' idle GPU-seconds."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/test.sh installs it)")
    th = load_thresholds()
    ctx = rules_mod.Context(th)
    head, worker = window_series(run["head"]), window_series(run["worker"])
    assert head.keys() == worker.keys()  # same labels: the nodes' series add up
    inputs, idle = [], {}
    for instance, series in (("head:19839", head), ("worker:19839", worker)):
        for (name, labels), value in series.items():
            lab = {**dict(labels), "instance": instance, "job": "rlhf-exporter"}
            text = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
            inputs.append({"series": f"{name}{{{text}}}", "values": f"0+{value!r}x60"})
            key = (dict(labels)["group"], dict(labels)["gpu_role"])
            sign = 1.0 if name == gpuwindows.TOTAL else -1.0
            idle[key] = idle.get(key, 0.0) + sign * value * 30
    record = gpuwindows.job_idle(ctx)
    exprs = []
    for (group, role), want in idle.items():
        sel = f'{record}{{project="{PROJECT}",experiment="{EXPERIMENT}",group="{group}",gpu_role="{role}"}}'
        tol = 1e-9 * max(1.0, abs(want))
        exprs += [
            {"expr": f"count({sel})", "eval_time": "60m", "exp_samples": [{"value": 1}]},
            {
                "expr": f"abs(sum({sel}) - {want!r}) < bool {tol!r}",
                "eval_time": "60m",
                "exp_samples": [{"value": 1}],
            },
        ]
    tmp = run["tmp"]
    rule_file = tmp / "gpu-windows.rules.yaml"
    rule_file.write_text(rules_mod.rule_files(th)[gpuwindows.GPU_WINDOWS_FILE])
    spec = tmp / "rules-test.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rule_file)],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": exprs}],
            },
            sort_keys=False,
        )
    )
    out = subprocess.run(
        [promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
