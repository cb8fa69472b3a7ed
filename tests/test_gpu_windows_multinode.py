"""Issue 17, multi-node: two real sidecars on 127.0.0.1, a head and a worker, each a
`python -m exporter serve` process with its own fake GPUs.

- The head reads the job's verl log (the verl file source) and joins the steps' windows to
  its GPUs: a single-node run of the job.
- The worker is configured as the chart configures a worker pod (environment only: NVML on,
  Ray off, `RLHF_EXPORTER_GPU_WINDOWS_FROM` = the head's URL, `RLHF_EXPORTER_PUSH_TOKEN`);
  it has no verl log and gets the steps over the head's `GET /api/v1/windows`.
- Both load `pynvml` from tests/support/nvml_shim (the fake of tests/support/fake_pynvml.py
  at the import boundary, nothing else patched), reading one scenario file: four GPUs whose
  utilization follows the job's true windows on the wall clock (GPUs 0-1 busy in `gen`,
  2-3 in `old_log_prob` and `update_actor`). No Ray here, so every GPU's role is `unknown`.

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

import pytest
import yaml

from exporter.config import load_thresholds
from exporter.render import rules as rules_mod
from exporter.render.rules import gpuwindows
from tests.support.procs import REPO
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
# percent busy per GPU during its windows; IDLE otherwise
BUSY = [
    {"gen": 90},
    {"gen": 90},
    {"old_log_prob": 85, "update_actor": 85},
    {"old_log_prob": 85, "update_actor": 85},
]
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


def write_scenario(path: Path, steps: list[dict]) -> None:
    doc = {
        "sample_period": SAMPLE_PERIOD,
        "gpus": [{"util": schedule(steps, g)} for g in range(len(BUSY))],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # the sidecars re-read it whole, never half-written


def truth_shares(steps: list[dict]) -> dict[str, float]:
    busy: dict[str, float] = {}
    avail: dict[str, float] = {}
    for st in steps:
        for timer, a, b in st["intervals"]:
            group = GROUPS.get(timer, "other")
            for gpu in range(len(BUSY)):
                busy[group] = busy.get(group, 0.0) + BUSY[gpu].get(timer, IDLE) / 100 * (b - a)
                avail[group] = avail.get(group, 0.0) + (b - a)
    return {g: busy[g] / avail[g] for g in avail}


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


def chart_env(scenario: Path, **settings: str) -> dict[str, str]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO)]),
        "FAKE_PYNVML_SCENARIO": str(scenario),
        "RLHF_EXPORTER_RAY": "false",
        "RLHF_EXPORTER_RAY_ACTORS": "false",
        "RLHF_EXPORTER_NVML": "true",
        "RLHF_EXPORTER_GPU_ROLES": "false",
        "RLHF_EXPORTER_NVML_INTERVAL": "0.25",
    }
    env.update({f"RLHF_EXPORTER_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Head, worker and a worker with a wrong token, all started before the job; the job runs,
    then both nodes have joined every step. Every sidecar is stopped at the end of the
    module, also on failure."""
    tmp_path = tmp_path_factory.mktemp("multinode")
    scenario = tmp_path / "gpus.json"
    write_scenario(scenario, [])  # idle until the job's plan is known
    verl_root = tmp_path / "verl"
    (verl_root / PROJECT).mkdir(parents=True)
    started: list[Exporter] = []
    try:
        head = Exporter(
            tmp_path / "head",
            defaults=False,
            env=chart_env(
                scenario, verl_root=str(verl_root), verl_interval="0.2", push_token=TOKEN
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
                    gpu_windows_from=head.url,
                    gpu_windows_interval="0.5",
                    push_token=token,
                ),
            )
            started.append(sidecars[name])
        for exp in started:
            exp.wait_ready()

        log_file = verl_root / PROJECT / f"{EXPERIMENT}.jsonl"
        log_file.write_bytes(b"")  # the job's logger opens its file before the first step
        steps = plan(time.time() + 1.5)
        write_scenario(scenario, steps)  # before any sample of the job is taken
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
        yield {**sidecars, "results": results, "steps": steps, "late": late, "tmp": tmp_path}
    finally:
        for exp in started:
            exp.terminate()


def test_worker_sidecar_matches_a_single_node_run(run):
    head_result, worker_result = run["results"]["head"], run["results"]["worker"]
    assert worker_result.keys() == head_result.keys()
    assert {g for g, _ in head_result} == {GROUPS.get(t, "other") for t, _ in WINDOWS}
    assert {r for _, r in head_result} == {"unknown"}  # no Ray: no PID join
    for key, (busy, avail) in head_result.items():
        w_busy, w_avail = worker_result[key]
        assert abs(w_avail - avail) <= EXACT, (key, w_avail, avail)
        assert abs(w_busy - busy) <= EXACT, (key, w_busy, busy)
        assert 0.0 <= busy <= avail
    # ... and both are near the truth the simulation used (every step was joined once: the
    # fixture waited for available GPU-seconds = GPUs x the steps' durations)
    # (the groups of 1 s windows and longer: a 0.2 s window's share also carries how late the
    # test wrote a record, x5 -- the anchor error the docs state, not the join's)
    truth = truth_shares(run["steps"])
    for group in ("rollout", "logprob", "update"):
        busy, avail = head_result[group, "unknown"]
        assert abs(busy / avail - truth[group]) <= NEAR_TRUTH, (group, busy / avail, run["late"])
    # the worker read no log: its windows came over the head's API, and its source is up
    head, worker = run["head"], run["worker"]
    assert worker.value("rlhf_steps_total") is None
    assert head.value("rlhf_steps_total", project=PROJECT) == STEPS
    assert worker.value("rlhf_exporter_collector_up", collector="gpu_windows_remote") == 1.0


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
