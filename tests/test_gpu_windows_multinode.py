"""Issue 23 (and 17): the example's whole multi-node job, from the RENDERED Helm chart.

The example chart (examples/verl-grpo-rayjob, with this chart as its dependency) and the
namespace's shared release (examples/shared-values.yaml) are rendered with the real Helm
engine. Their pods run here as real `python -m rlhf_exporter serve` processes, each started
with exactly the arguments and environment its rendered pod spec gives the sidecar
container; only what cannot exist on this machine is substituted, and the list is small and
explicit (tests/support/rendered_pods.py, `SUBSTITUTED`: the listen address, the logs
mount path, the Ray dashboard address, the head Service's DNS name; plus the NVML fake at
the `pynvml` import boundary, `ADDED`, and the monitor's scrape interval):

- the head pod's sidecar reads the job's verl log (no NVML there: `sidecar.head.nvml: false`);
- two GPU worker pods (`workers: 2`) read the job's step windows from the head's Service
  (`gpuWindowsFrom`) and join them to their own fake GPUs (tests/support/nvml_shim): worker 1
  healthy, its GPUs following the job's windows; worker 2 a sick node: idle GPUs, all
  throttled (thermal), GPU 1 lost mid-run, GPU 0 an uncorrectable ECC error and XID 48,
  GPU 2 an application XID (13, ignorable), GPU 3 a row remap pending;
- an intruder: the worker pod spec with a wrong token.

A real Prometheus scrapes them as the rendered PodMonitor says (prometheus-operator's
selection, target labels and relabelings over static targets with the pods' Kubernetes
labels) and evaluates the shipped rules, time-scaled (`rule_groups(th, SCALE)`: every window
and `for:` x SCALE; the rendered PrometheusRule is checked equal to the unscaled rules).
Every GPU alert fires for the example's job (its project/experiment from the verl values),
on the right node and GPU, and the ignorable ones do not; every GPU panel query of the
rendered dashboards shows data for the job, from both worker nodes.

The module runs twice: `no_ray` (`sidecar.gpuRoles: false`; the head's Ray address points
at a closed port) and `ray_roles` (the example's default `gpuRoles: true`, on a real Ray
head holding verl-named actors whose PIDs the fake GPUs report: roles rollout, trainer,
colocated). Balance alerts (RLHFTrainerStarved, RLHFRolloutOverprovisioned) need
`balance.min_gpu_seconds` (600) a side, more than this run has: their logic is tested in
tests/test_gpu_windows_rules.py.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import yaml

from rlhf_exporter.render import rules as rules_mod
from rlhf_exporter.render.addresses import FLEET_PATH, JOB_PATH
from rlhf_exporter.render.rules import gpuwindows
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import grafana_vars
from tests.support.procs import REPO, free_port, wait_until
from tests.support.prometheus import Prometheus
from tests.support.ray_head import connected_head, verl_actor_classes
from tests.support.rendered_pods import (
    ADDED,
    SUBSTITUTED,
    pod_env,
    ray_pod_templates,
    render,
    scrape_config,
    sd_labels,
    sidecar,
    substitute,
)
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]
pytest.importorskip("helm_python")

CHART = REPO / "helm" / "rlhf-exporter"
EXAMPLE = REPO / "examples" / "verl-grpo-rayjob"
SHARED_VALUES = REPO / "examples" / "shared-values.yaml"
RELEASE, NAMESPACE, SHARED = "grpo", "ray-jobs", "rlhf-exporter"
CLUSTER = "grpo-grpo-x7k2p"  # the RayCluster KubeRay creates for the RayJob (its name + suffix)
TOKEN = "multinode-s3cret"
SECRET = "rlhf-token"
_VERL = yaml.safe_load((EXAMPLE / "values.yaml").read_text())["verl"]
PROJECT, EXPERIMENT = _VERL["project"], _VERL["experiment"]  # the example's job
SHIM = REPO / "tests" / "support" / "nvml_shim"
SCALE = 1 / 120  # the rules' windows and for: 30m -> 15 s, 15m -> 7.5 s, 1h -> 30 s
SCRAPE = "1s"  # the monitor says 15s
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
# windows (IDLE otherwise) on the healthy worker
GPUS = (
    ("rollout", {"gen": 90}),
    ("rollout", {"gen": 90}),
    ("trainer", {"old_log_prob": 85, "update_actor": 85}),
    ("trainer", {"old_log_prob": 85, "update_actor": 85}),
    ("colocated", {"gen": 70, "old_log_prob": 80, "update_actor": 80}),
)
BUSY = [busy for _role, busy in GPUS]
# the processes NVML reports on a GPU of each role: (actor, GPU memory bytes)
PROCESSES = {
    "rollout": (("rollout", 30 << 30),),
    "trainer": (("trainer", 40 << 30),),
    "colocated": (("rollout", 30 << 30), ("trainer", 40 << 30)),
}
IDLE = 5
STEPS = 9
GAP = 0.3  # seconds between a record and the next step's start (outside every window)
TESTING = {3: 0.5}  # validation after `step` in these steps: the record comes later
SAMPLE_PERIOD = 0.05  # the fake driver's sampling period (real GPUs: 1/6 to 1 s)
SICK_FROM = 3  # the sick node's faults start with this step
GROUPS = load_thresholds().timer_groups
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
    """GPU `gpu`'s utilization on the healthy worker as a step function of epoch seconds."""
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


def write_scenario(path: Path, gpus: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"sample_period": SAMPLE_PERIOD, "gpus": gpus}))
    os.replace(tmp, path)  # the sidecars re-read it whole, never half-written


def healthy(steps: list[dict], pids: dict | None) -> list[dict]:
    return [
        {
            "util": schedule(steps, g),
            "processes": [[pids[actor], mem] for actor, mem in PROCESSES[role]] if pids else [],
        }
        for g, (role, _busy) in enumerate(GPUS)
    ]


def sick(steps: list[dict], pids: dict | None) -> list[dict]:
    """Worker 2: idle and hot; faults from step SICK_FROM on (times on the wall clock)."""
    gpus = [
        {**gpu, "util": [[0.0, 0]], "throttle": 0x20}  # sw_thermal slowdown, all the time
        for gpu in healthy(steps, pids)
    ]
    if steps:
        t = steps[SICK_FROM - 1]["intervals"][0][1]
        gpus[0].update(ecc_uncorrected=[[t, 2]], xids=[[t, 48]])
        gpus[1].update(lost_at=t, xids=[[t, 79]])
        gpus[2].update(xids=[[t, 13]])
    gpus[3]["remapped_rows"] = [0, 1, 1, 0]
    return gpus


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


def windows_by_group(exp: Exporter) -> dict[tuple[str, str], tuple[float, float]]:
    """(group, gpu_role) -> (busy, available) GPU-seconds of the job, from one scrape."""
    out: dict[tuple[str, str], list[float]] = {}
    for (name, labels), value in exp.samples().items():
        lab = dict(labels)
        if name in (gpuwindows.BUSY, gpuwindows.TOTAL) and (
            lab.get("project"),
            lab.get("experiment"),
        ) == (PROJECT, EXPERIMENT):
            out.setdefault((lab["group"], lab["gpu_role"]), [0.0, 0.0])[
                name == gpuwindows.TOTAL
            ] = value
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


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The shared release (monitor, rules, dashboards) and the example chart, rendered."""
    where = tmp_path_factory.mktemp("example") / EXAMPLE.name
    shutil.copytree(EXAMPLE, where)
    shutil.copytree(CHART, where / "charts" / CHART.name)  # as `helm dependency build` does
    shared = render(CHART, yaml.safe_load(SHARED_VALUES.read_text()), SHARED, NAMESPACE)
    return SimpleNamespace(example=where, shared=shared)


def _one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _pod_labels(template: dict, node_type: str, group: str) -> dict[str, str]:
    """The pod's labels: its template's and those KubeRay adds to every Ray pod."""
    return {
        **template["metadata"]["labels"],
        "ray.io/cluster": CLUSTER,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
    }


@pytest.fixture(scope="module", params=["no_ray", pytest.param("ray_roles", marks=pytest.mark.ray)])
def run(request, rendered, tmp_path_factory):
    """The rendered job's pods as processes, Prometheus scraping them as the monitor says;
    the job runs, then every expected alert fires. Everything is stopped at the end."""
    cluster = request.getfixturevalue("ray_actors") if request.param == "ray_roles" else None
    pids = cluster.pids if cluster else None
    roles = [role if cluster else "unknown" for role, _busy in GPUS]
    tmp = tmp_path_factory.mktemp(f"multinode-{request.param}")
    values = {"rlhf-exporter": {"push": {"tokenSecret": {"name": SECRET}}}}
    if cluster is None:
        values["rlhf-exporter"]["sidecar"] = {"gpuRoles": False}
    example = render(rendered.example, values, RELEASE, NAMESPACE)
    templates = ray_pod_templates(_one(example, "RayJob"))
    head_svc = _one(example, "Service")
    ray_address = cluster.head.dashboard_url if cluster else f"http://127.0.0.1:{free_port()}"
    verl_root = tmp / "verl"
    (verl_root / PROJECT).mkdir(parents=True)
    scenarios = {"worker-1": tmp / "gpus-1.json", "worker-2": tmp / "gpus-2.json"}
    write_scenario(scenarios["worker-1"], healthy([], pids))
    write_scenario(scenarios["worker-2"], sick([], pids))

    def start(name: str, pod: str, template: dict, labels: dict, token: str, **subs: str):
        side = sidecar(template)
        assert side["args"] == ["serve"]  # the container's command line: nothing else
        env = pod_env(side, labels, NAMESPACE, {f"{SECRET}/token": token})
        port = free_port()
        env = substitute(env, RLHF_EXPORTER_LISTEN=f"127.0.0.1:{port}", **subs)
        if name != "head":
            env["FAKE_PYNVML_SCENARIO"] = str(scenarios.get(name, scenarios["worker-1"]))
            env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(REPO)])
        else:
            env["PYTHONPATH"] = str(REPO)
        assert set(env) - set(pod_env(side, labels, NAMESPACE, {f"{SECRET}/token": token})) <= set(
            ADDED
        )
        exp = Exporter(tmp / name, defaults=False, ready=False, env=env)
        exp.pod, exp.env = pod, env
        exp.sd = sd_labels(pod, NAMESPACE, labels, side)
        return exp

    started: dict[str, Exporter] = {}
    prom = seen = None
    try:
        head_t = templates["head"]
        head_labels = _pod_labels(head_t, "head", "headgroup")
        # the example's head Service selects the head pod (and no worker)
        assert head_svc["spec"]["selector"].items() <= head_labels.items()
        started["head"] = start(
            "head",
            f"{CLUSTER}-head-8kq2d",
            head_t,
            head_labels,
            TOKEN,
            RLHF_EXPORTER_VERL_ROOT=str(verl_root),
            RLHF_EXPORTER_RAY_ADDRESS=ray_address,
        )
        head = started["head"]
        head.wait_ready()
        worker_t = templates["worker-gpu"]
        for name, suffix, token in (
            ("worker-1", "4xz9p", TOKEN),
            ("worker-2", "m2v7c", TOKEN),
            ("intruder", "bad00", "not-the-token"),
        ):
            labels = _pod_labels(worker_t, "worker", "gpu")
            assert not head_svc["spec"]["selector"].items() <= labels.items()
            subs = {"RLHF_EXPORTER_GPU_WINDOWS_FROM": head.url}
            if cluster is not None:  # gpuRoles: the worker reads Ray for PIDs only
                subs["RLHF_EXPORTER_RAY_ADDRESS"] = ray_address
            started[name] = start(
                name, f"{CLUSTER}-gpu-worker-{suffix}", worker_t, labels, token, **subs
            )
        for exp in started.values():
            exp.wait_ready()
        if cluster:  # every GPU's role known before the job's first sample
            want = {
                str(g): {actor for actor, _mem in PROCESSES[role]}
                for g, (role, _b) in enumerate(GPUS)
            }
            worker = started["worker-1"]
            worker.wait_for(
                lambda: {g: set(r) for g, r in role_memory(worker).items()} == want,
                60,  # the chart leaves Ray's poll interval at its default (15 s)
                "worker 1 matches its GPUs' processes to Ray roles",
            )

        # Prometheus: the rendered monitor's scrape job over the pods run here; the rules
        monitor = _one(rendered.shared, "PodMonitor")
        targets = [(exp.url.removeprefix("http://"), exp.sd) for exp in started.values()]
        config = scrape_config(monitor, targets, interval=SCRAPE)
        th = load_thresholds()
        shipped = _one(rendered.shared, "PrometheusRule")["spec"]["groups"]
        # the shipped rules, at scale 1 (outside standalone mode the chart leaves out
        # RLHFExporterAbsent: sidecars come and go with their jobs)
        mode = yaml.safe_load(SHARED_VALUES.read_text()).get("mode")
        by_name = {
            g["name"]: {
                **g,
                "rules": [
                    r
                    for r in g["rules"]
                    if mode == "standalone" or r.get("alert") != "RLHFExporterAbsent"
                ],
            }
            for gs in rules_mod.rule_groups(th).values()
            for g in gs
        }
        # the chart points runbook_url to the exporter's own /runbooks (its Service)
        assert _no_runbook({g["name"]: g for g in shipped}) == _no_runbook(by_name)
        rule_dir = tmp / "rules"
        rule_dir.mkdir()
        rule_files = []
        for rel, text in rules_mod.rule_files(th, SCALE).items():
            path = rule_dir / Path(rel).name
            path.write_text(text)
            rule_files.append(path)
        prom = Prometheus(tmp / "prom", [], rule_files, SCRAPE, scrape_configs=[config])
        seen = AlertWatch(prom)  # every alert that fires while the job runs, and after

        log_file = verl_root / PROJECT / f"{EXPERIMENT}.jsonl"
        log_file.write_bytes(b"")  # the job's logger opens its file before the first step
        steps = plan(time.time() + 1.5)
        write_scenario(scenarios["worker-1"], healthy(steps, pids))
        write_scenario(scenarios["worker-2"], sick(steps, pids))
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
            return found if abs(total - gpu_seconds) <= 1e-6 * gpu_seconds else {}

        result = started["worker-1"].wait_for(
            lambda: joined(started["worker-1"]), 20, "worker 1 joins every step"
        )
        try:
            wait_until(
                lambda: _names(seen.alerts) >= EXPECTED, 30, 0.5, what=f"alerts {sorted(EXPECTED)}"
            )
        except TimeoutError:
            up = {r["metric"]["pod"]: r["value"][1] for r in prom.query("up")}
            raise AssertionError(f"fired: {sorted(_names(seen.alerts))}; up: {up}") from None
        firing = list(seen.alerts)
        yield SimpleNamespace(
            **started,
            started=started,
            result=result,
            steps=steps,
            late=late,
            roles=roles,
            ray=cluster,
            prom=prom,
            firing=firing,
            config=config,
            dashboards=_dashboards(rendered.shared),
            end=time.time(),
            start=steps[0]["intervals"][0][1],
        )
    finally:
        if seen is not None:
            seen.stop()
        if prom is not None:
            prom.terminate()
        for exp in started.values():
            exp.terminate()


EXPECTED = {
    "RLHFGPUsIdleWhileStepping",
    "RLHFGPULost",
    "RLHFGPUUncorrectableECC",
    "RLHFGPUBadXid",
    "RLHFGPUNeedsReset",
    "RLHFGPUThrottledInWindow",
}


def _names(alerts: list[dict]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts}


class AlertWatch:
    """Every distinct firing alert (by labels) Prometheus reports, polled twice a second in
    a thread: the health alerts hold for `gpu_health_window` (30 s scaled), shorter than
    the job, so they are collected while it runs."""

    def __init__(self, prom: Prometheus):
        self.prom = prom
        self.alerts: list[dict] = []
        self._keys: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                firing = _firing(self.prom)
            except requests.RequestException:
                continue
            for a in firing:
                key = tuple(sorted(a["labels"].items()))
                if key not in self._keys:
                    self._keys.add(key)
                    self.alerts = [*self.alerts, a]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _firing(prom: Prometheus) -> list[dict]:
    return [a for a in prom.alerts() if a["state"] == "firing"]


def _dashboards(shared: list[dict]) -> dict[str, dict]:
    out = {}
    for cm in (o for o in shared if o["kind"] == "ConfigMap"):
        for text in cm["data"].values():
            doc = json.loads(text)
            out[{"rlhf-job": JOB_PATH, "rlhf-fleet": FLEET_PATH}[doc["uid"]]] = doc
    return out


def _panels(doc: dict):
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", ())


# ------------------------------------------------------------------------------------------
def test_the_substitutions_are_few_and_named(run):
    """Only what cannot exist here differs from the rendered pod specs."""
    assert set(SUBSTITUTED) == {
        "RLHF_EXPORTER_LISTEN",
        "RLHF_EXPORTER_VERL_ROOT",
        "RLHF_EXPORTER_RAY_ADDRESS",
        "RLHF_EXPORTER_GPU_WINDOWS_FROM",
        # the engines volume's file (tests/test_engines_chart.py; kept as rendered here: no
        # engines in this run, the rendered path simply does not exist)
        "RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE",
    }
    assert set(ADDED) == {"PYTHONPATH", "FAKE_PYNVML_SCENARIO"}
    head, worker = run.head.env, run.started["worker-1"].env
    assert head["RLHF_EXPORTER_NVML"] == "false"  # the example's head has no GPUs
    assert worker["RLHF_EXPORTER_NVML"] == "true"
    assert worker["RLHF_EXPORTER_GPU_WINDOWS_FROM"] == run.head.url
    assert worker["RLHF_EXPORTER_PUSH_TOKEN"] == head["RLHF_EXPORTER_PUSH_TOKEN"] == TOKEN
    assert run.config["scrape_interval"] == SCRAPE  # the monitor's 15s, the one other change


def test_workers_join_the_heads_windows_near_the_truth(run):
    result, roles = run.result, run.roles
    assert {g for g, _ in result} == {GROUPS.get(t, "other") for t, _ in WINDOWS}
    assert {r for _, r in result} == set(roles)
    truth = truth_shares(run.steps, roles)
    for group in ("rollout", "logprob", "update"):
        for role in set(roles):
            busy, avail = result[group, role]
            assert abs(busy / avail - truth[group, role]) <= NEAR_TRUTH, (group, role, run.late)
    head, worker = run.head, run.started["worker-1"]
    assert worker.value("rlhf_steps_total") is None  # the worker read no log
    assert head.value("rlhf_steps_total", project=PROJECT) == STEPS
    assert head.value("rlhf_gpu_busy_seconds_total") is None  # no NVML on the head
    assert worker.value("rlhf_exporter_collector_up", collector="gpu_windows_remote") == 1.0
    # every GPU series of both workers carries the job, learnt from the head's windows
    for name in ("worker-1", "worker-2"):
        jobs = {
            (dict(lab).get("project"), dict(lab).get("experiment"))
            for (metric, lab) in run.started[name].samples()
            if metric.startswith("rlhf_gpu_")
        }
        assert jobs == {(PROJECT, EXPERIMENT)}, (name, jobs)


def test_gpu_roles_come_from_the_real_ray_actors(run):
    worker = run.started["worker-1"]
    if run.ray is None:
        assert worker.value("rlhf_gpu_role_memory_bytes") is None  # gpu_roles off
        return
    want = {
        str(g): {actor: float(mem) for actor, mem in PROCESSES[role]}
        for g, (role, _busy) in enumerate(GPUS)
    }
    assert role_memory(worker) == want
    assert worker.value("rlhf_ray_actors") is None  # the head counts actors, once
    assert run.head.value("rlhf_ray_actors", role="rollout", state="ALIVE") == 1.0


def test_every_gpu_alert_fires_for_the_job_on_the_right_node_and_gpu(run):
    sick_pod = run.started["worker-2"].pod
    by_name: dict[str, list[dict]] = {}
    early = []
    for a in run.firing:
        labels = a["labels"]
        if "project" not in labels:  # fired before the sidecar learnt the job (first step)
            early.append(labels)
            continue
        assert (labels["project"], labels["experiment"]) == (PROJECT, EXPERIMENT), labels
        assert labels["namespace"] == NAMESPACE
        by_name.setdefault(labels["alertname"], []).append(labels)
    assert set(by_name) >= EXPECTED, sorted(by_name)
    # only a condition there before the job's first step (the pending row remap) and the
    # exporter's own alerts (the scaled windows are shorter than Ray's 15 s poll) fire
    # without the job's labels
    assert all(
        lab["alertname"] == "RLHFGPUNeedsReset" or lab["alertname"].startswith("RLHFExporter")
        for lab in early
    ), early
    where = {
        name: {(lab.get("pod"), lab.get("gpu"), lab.get("xid")) for lab in by_name[name]}
        for name in EXPECTED - {"RLHFGPUsIdleWhileStepping", "RLHFGPUThrottledInWindow"}
    }
    assert where["RLHFGPULost"] == {(sick_pod, "1", None)}
    assert where["RLHFGPUUncorrectableECC"] == {(sick_pod, "0", None)}
    # 48 pages; 79 is RLHFGPULost's (one page for one fault); 13 is the application's
    assert where["RLHFGPUBadXid"] == {(sick_pod, "0", "48")}
    assert where["RLHFGPUNeedsReset"] == {(sick_pod, "3", None)}
    # job-wide: the job's GPUs on both workers (not one target), the window named
    (idle,) = by_name["RLHFGPUsIdleWhileStepping"]
    assert "instance" not in idle and "pod" not in idle
    groups = {lab["group"] for lab in by_name["RLHFGPUThrottledInWindow"]}
    assert groups and groups <= {"rollout", "update"}
    assert "RLHFGPURowRemapFailed" not in by_name
    # the idle GPUs are two nodes' average: worker 1 alone would not fire (its busy share
    # while the job stepped, ~42 %: read at the last step, over the steps; a window read
    # later holds the idle time after the job's end, CI)
    last = run.steps[-1]["at"]
    busy = run.prom.query(
        "avg(rate(rlhf_gpu_busy_seconds_total"
        f'{{pod="{run.started["worker-1"].pod}",project="{PROJECT}"}}'
        f"[{int(last - run.start)}s]))",
        at=last,
    )
    assert float(busy[0]["value"][1]) > load_thresholds().alerts["gpu_idle_ratio"]


def test_the_job_idle_record_sums_both_workers(run):
    ctx = rules_mod.Context(load_thresholds(), SCALE)
    rows = run.prom.query(
        f'{gpuwindows.job_idle(ctx)}{{project="{PROJECT}",experiment="{EXPERIMENT}"}}'
    )
    keys = [(r["metric"]["group"], r["metric"]["gpu_role"]) for r in rows]
    assert keys and len(keys) == len(set(keys))  # one series per (group, role): nodes summed
    assert not any("pod" in r["metric"] or "instance" in r["metric"] for r in rows)


def _gpu_queries(run) -> list[tuple[str, str]]:
    job = run.dashboards[JOB_PATH]
    fleet = run.dashboards[FLEET_PATH]
    out = []
    for p in _panels(job):
        if 600 < p["id"] < 700:  # the GPU row and the GPU health row
            out += [
                (f"job {p['id']} {p['title']} {t['refId']}", t["expr"])
                for t in p.get("targets", ())
            ]
    for p in _panels(fleet):
        for t in p.get("targets", ()):
            if "rlhf_gpu" in t["expr"] or "rlhf_window_gpu" in t["expr"]:
                out.append((f"fleet {p['id']} {p['title']} {t['refId']}", t["expr"]))
    return out


def test_every_gpu_panel_shows_the_jobs_gpus_on_both_nodes(run):
    # every query is evaluated at the job's end over the whole job: evaluated later (when
    # the tests before this one took long, CI), the range would slide past the lost GPU's
    # few samples and its series would be missing
    range_ = f"{int(run.end - run.start) + 1}s"
    queries = _gpu_queries(run)
    assert len(queries) >= 15
    # the dashboards read the records by their names at scale 1; Prometheus has them scaled
    th = load_thresholds()
    renamed = {
        a["record"]: b["record"]
        for rel, groups in rules_mod.rule_groups(th).items()
        for ga, gb in zip(groups, rules_mod.rule_groups(th, SCALE)[rel])
        for a, b in zip(ga["rules"], gb["rules"])
        if "record" in a
    }
    empty = []
    for where, expr in queries:
        for name in sorted(renamed, key=len, reverse=True):
            expr = expr.replace(name, renamed[name])
        if run.ray is None and "rlhf_gpu_role_memory_bytes" in expr:
            continue  # gpuRoles off: no memory by role, by design
        q = grafana_vars.substitute(
            expr,
            rate_interval=range_,  # the whole job (the query runs when it has ended)
            interval="1s",
            range_=range_,
            project=PROJECT,
            experiment=EXPERIMENT,
        )
        rows = run.prom.query(q, at=run.end)
        if not rows:
            empty.append(f"{where}: {q}")
        for r in rows:
            m = r["metric"]
            assert (
                m.get("project", PROJECT) == PROJECT
                and m.get("experiment", EXPERIMENT) == EXPERIMENT
            )
    assert not empty, "GPU panels without data:\n" + "\n".join(empty)
    # the GPU busy panel shows both workers' GPUs (the lost one's until it was lost)
    (busy,) = [e for w, e in queries if "GPU busy ratio" in w]
    rows = run.prom.query(
        grafana_vars.substitute(busy, rate_interval=range_, project=PROJECT, experiment=EXPERIMENT),
        at=run.end,
    )
    pods = {r["metric"]["pod"] for r in rows}
    assert pods == {run.started["worker-1"].pod, run.started["worker-2"].pod}
    shown = {(r["metric"]["pod"], r["metric"]["gpu"]) for r in rows}
    sick_pod = run.started["worker-2"].pod
    every = {(exp.pod, str(g)) for exp in (run.started["worker-1"], run.started["worker-2"])
             for g in range(len(GPUS))}  # fmt: skip
    # the lost GPU (1 of the sick node) shows when Prometheus holds two samples of it with
    # the job's labels (a rate needs two): the node learns the job from the head's first
    # windows, and the GPU is lost from step SICK_FROM on, a few seconds later
    lost = run.prom.query(
        f'count_over_time(rlhf_gpu_busy_seconds_total{{pod="{sick_pod}",gpu="1",'
        f'project="{PROJECT}"}}[{range_}])',
        at=run.end,
    )
    if not lost or float(lost[0]["value"][1]) < 2:
        every.discard((sick_pod, "1"))
    assert shown == every, (sorted(every - shown), lost)
    # the fleet's "GPUs with errors": GPU 0 (ECC, XID 48) and GPU 1 (lost) of the sick node
    (errors,) = [e for w, e in queries if "rlhf_gpu_with_errors" in e and w.startswith("fleet")]
    for name in sorted(renamed, key=len, reverse=True):
        errors = errors.replace(name, renamed[name])
    (row,) = run.prom.query(
        grafana_vars.substitute(errors, range_=range_, project=PROJECT, experiment=EXPERIMENT),
        at=run.end,
    )
    assert float(row["value"][1]) == 2
    # another job's selection shows none of these GPUs
    other = grafana_vars.substitute(busy, rate_interval=range_, project=PROJECT, experiment="other")
    assert run.prom.query(other, at=run.end) == []


def test_worker_with_a_wrong_token_is_down_and_exports_no_windows(run):
    intruder = run.intruder
    assert intruder.value("rlhf_exporter_collector_up", collector="gpu_windows_remote") == 0.0
    errors = intruder.value(
        "rlhf_exporter_collector_errors_total",
        collector="gpu_windows_remote",
        reason="unauthorized",
    )
    assert errors is not None and errors >= 1
    assert intruder.value("rlhf_window_gpu_seconds_total") is None
    # ... and its GPUs learn no job from a head it may not read
    assert intruder.series("rlhf_gpu_busy_seconds_total", project=PROJECT) == {}
    assert requests.get(run.head.url + "/api/v1/windows", timeout=5).status_code == 401


def _no_runbook(groups: dict) -> dict:
    """Rule groups without the alerts' runbook_url (the chart sets it at install time)."""
    out = {}
    for name, g in groups.items():
        rules = []
        for r in g["rules"]:
            if "alert" in r:
                notes = {k: v for k, v in r.get("annotations", {}).items() if k != "runbook_url"}
                r = {**r, "annotations": notes}
            rules.append(r)
        out[name] = {**g, "rules": rules}
    return out
