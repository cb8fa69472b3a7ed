"""Where a stalled job hangs, on a real Ray head with real processes (issue 39).

A real Ray 2.60 head (own ports and temp dir, RAY_AUTH_MODE=disabled,
RAY_DASHBOARD_ENABLE_PROFILING=1) runs the verl-shaped job of tests/support/verl_shaped_job.py
(`ray job submit`, tied to its log by metadata): a driver, a TaskRunner, two WorkerDict
trainer workers, a vLLMHttpServer, an AgentLoopWorker and a RewardLoopWorker. A real `serve`
reads its log and Ray; a real Prometheus evaluates the repository's rules rendered from the
same thresholds file (stall_min 4s). The job is hung each way it knows: its rollout server on
a lock or in a sleep, its TaskRunner saving a checkpoint into a pipe nobody reads, a trainer
worker in a gloo all_reduce whose peer does not come (torch: the heads and jobs run on
.venv-verl's Python when it is built, as in CI; else the test venv's). Each time the
folded answer names the role and the wait on `/`, in the job view, in
`GET /api/v1/jobs/<p>/<e>/stacks`, in `rlhf_job_stalled_in` and in the firing RLHFJobStalled's
annotation; once the job steps again its stacks are gone and the page resolves.

Then the same head without the means: py-spy missing where Ray's agent runs, py-spy without
the right to read the processes (the agent's `py-spy` runs the real one as an unprivileged
user, so the kernel refuses it as it does in a container without SYS_PTRACE), and a second
head without RAY_DASHBOARD_ENABLE_PROFILING: the panel says why, once, and the page fires.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html import escape
from pathlib import Path

import pytest
import requests

from rlhf_exporter.render import rules
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.procs import REPO, free_port, wait_until
from tests.support.prometheus import Prometheus, binary
from tests.support.ray_head import RayHead, ray_binary
from tests.support.serve import Exporter, parse_samples

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prometheus]

JOB_SCRIPT = REPO / "tests" / "support" / "verl_shaped_job.py"
VERL_VENV = REPO / ".venv-verl"  # scripts/real-verl-env.sh (scripts/test.sh builds it in CI)


@functools.cache
def job_env() -> tuple[str, str, dict[str, str]]:
    """(python, ray, head env) this module's heads and jobs run with: .venv-verl's when it
    is built (torch 2.11 and the same Ray 2.60; the checkout on PYTHONPATH: the job's
    TaskRunner imports rlhf_exporter.demo), else the test venv's, where the gloo collective
    case skips without torch (the `test` extra brings none). CI builds .venv-verl unless
    SKIP_REAL_VERL=1, so it runs every scripted hang."""
    verl_python = VERL_VENV / "bin" / "python"
    if (VERL_VENV / "STAMP").exists() and verl_python.exists():
        return str(verl_python), str(VERL_VENV / "bin" / "ray"), {"PYTHONPATH": str(REPO)}
    return sys.executable, ray_binary(), {}


PY_SPY = Path(sys.executable).parent / "py-spy"
THRESHOLDS = "alerts:\n  stall_min: 4s\n  stall_for: 1s\n"
PROJECT = "stk"


class Cluster:
    """A Ray head whose agent finds `py-spy` in `bin_dir` (a wrapper this test swaps), a
    verl-shaped job per experiment, an exporter reading both, a Prometheus."""

    def __init__(self, root: Path, tag: str, profiling: bool = True):
        self.root = root
        self.bin_dir = root / f"bin-{tag}"
        self.bin_dir.mkdir(parents=True)
        self.use("real")
        env = {
            "RAY_AUTH_MODE": "disabled",
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            **job_env()[2],
        }
        if profiling:
            env["RAY_DASHBOARD_ENABLE_PROFILING"] = "1"
        self.head = RayHead(tag, num_cpus=4, env=env, ray=job_env()[1])
        self.controls: dict[str, Path] = {}

    def use(self, how: str) -> None:
        """The agent's py-spy: the real one, none, or the real one run as `nobody`."""
        wrapper = self.bin_dir / "py-spy"
        wrapper.unlink(missing_ok=True)
        if how == "none":
            return
        run = f'exec "{PY_SPY}" "$@"'
        if how == "nobody":
            run = f'exec setpriv --reuid=65534 --regid=65534 --clear-groups "{PY_SPY}" "$@"'
        wrapper.write_text(f"#!/bin/sh\n{run}\n")
        wrapper.chmod(0o755)

    def submit(self, experiment: str) -> Path:
        log = self.root / "verl" / PROJECT / f"{experiment}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        control = self.root / f"{experiment}.control"
        control.write_text("step")
        self.controls[experiment] = control
        meta = json.dumps({"project": PROJECT, "experiment": experiment})
        out = subprocess.run(
            [job_env()[1], "job", "submit", "--no-wait", "--address", self.head.dashboard_url,
             "--metadata-json", meta, "--", job_env()[0], str(JOB_SCRIPT), str(log),
             str(control), f"stacks.port={free_port()}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        wait_until(lambda: log.exists() and log.read_text().count("\n") > 5, 120, 0.5,
                   what=f"{experiment} stepping")  # fmt: skip
        return log

    def stop(self) -> None:
        self.head.stop(grace=3)


@contextlib.contextmanager
def watched(root: Path, cluster: Cluster) -> Iterator[tuple[Exporter, Prometheus]]:
    thresholds = root / "thresholds.yaml"
    thresholds.write_text(THRESHOLDS)
    rule_dir = root / "rules"
    rule_dir.mkdir(exist_ok=True)
    files = []
    for rel, text in rules.rule_files(load_thresholds(thresholds)).items():
        files.append(rule_dir / Path(rel).name)
        files[-1].write_text(text)
    exporter = Exporter(
        root / "exporter", "--verl-root", str(root / "verl"), "--ray",
        "--ray-address", cluster.head.dashboard_url, "--ray-interval", "1",
        "--thresholds", str(thresholds), "--stacks-interval", "1", "--stacks-every", "5",
    )  # fmt: skip
    prom = None
    try:
        prom = Prometheus(root / "prometheus", [exporter.url.removeprefix("http://")], files)
        yield exporter, prom
    finally:
        if prom is not None:
            prom.terminate()
        exporter.terminate()


def stacks_of(exporter: Exporter, experiment: str) -> dict | None:
    r = requests.get(f"{exporter.url}/api/v1/jobs/{PROJECT}/{experiment}/stacks", timeout=5)
    r.raise_for_status()
    return r.json()["round"]


def roles(found: dict) -> dict[str, dict]:
    return {r["role"]: r for r in found["roles"]}


def stalled_in(exporter: Exporter, experiment: str) -> dict[tuple[str, str], float]:
    text = requests.get(exporter.url + "/metrics", timeout=5).text
    out = {}
    for (name, labels), value in parse_samples(text).items():
        lab = dict(labels)
        if name == "rlhf_job_stalled_in" and lab.get("experiment") == experiment:
            out[lab["role"], lab["where"]] = value
    return out


def firing_where(prom: Prometheus, experiment: str) -> str | None:
    for a in prom.alerts():
        lab = a["labels"]
        ours = lab.get("alertname") == "RLHFJobStalled" and lab.get("experiment") == experiment
        if ours and a["state"] == "firing":
            return a["annotations"].get("where_it_hangs", "")
    return None


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    for name in ("prometheus", "promtool"):
        binary(name)
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to run py-spy unprivileged")
    root = tmp_path_factory.mktemp("stacks")
    cluster = Cluster(root, "stacks39")
    try:
        log = cluster.submit("e1")
        with watched(root, cluster) as (exporter, prom):
            yield cluster, log, exporter, prom
    finally:
        cluster.stop()


HANGS = [
    # (control, the role that hangs, its where, what the others say)
    ("rollout_lock", "rollout", "lock", {"agent_loop": "ray_get"}),
    ("rollout_sleep", "rollout", "sleep", {"agent_loop": "ray_get"}),
    ("checkpoint", "driver", "checkpoint_save", {}),
    ("collective", "trainer", "collective", {}),
]


@pytest.mark.parametrize("hang, role, where, others", HANGS, ids=[h[0] for h in HANGS])
def test_each_hang_is_named_with_its_role_and_wait_and_gone_once_the_job_steps(
    live, hang, role, where, others
):
    cluster, log, exporter, prom = live
    control = cluster.controls["e1"]
    grouped = json.loads(log.read_text().splitlines()[0])["data"]["stacks/grouped"]
    if hang == "collective" and not grouped:
        pytest.skip(
            f"torch is in neither the test venv nor {VERL_VENV} (not built: `bash "
            "scripts/real-verl-env.sh`): the trainer workers form no gloo group"
        )
    control.write_text(hang)

    def named() -> dict | None:
        found = stacks_of(exporter, "e1")
        return found if found and roles(found).get(role, {}).get("where") == where else None

    found = wait_until(named, 60, 0.5, what=f"{hang}: {role} in {where}")
    by_role = roles(found)
    assert found["answer"].startswith(f"{role}: "), found["answer"]  # the hang first
    for other, other_where in others.items():
        assert by_role[other]["where"] == other_where, by_role[other]
    if hang.startswith("rollout"):  # each ray.get names what it waits on (Ray's tasks)
        details = {g["detail"] for r in found["roles"] for g in r["groups"]}
        assert any(d.endswith(" on vLLMHttpServer.generate") for d in details), details
        assert any(d.endswith(" on AgentLoopWorker.generate_sequences") for d in details)
        assert any(d.endswith(" on TaskRunner.run") for d in details), details  # the driver
    assert by_role["driver"]["processes"] == 2  # the entrypoint's driver and the TaskRunner
    assert len(found["processes"]) == 7 and found["why"] == ""
    if hang == "collective":  # the rank that entered the all_reduce, and the missing peer
        trainer = by_role["trainer"]["groups"]
        assert [(g["where"], g["count"]) for g in trainer] == [("collective", 1), ("sleep", 1)]
        assert trainer[0]["detail"].startswith("all_reduce in ")
    stack = next(p for p in found["processes"] if p["role"] == role and p["where"] == where)
    assert stack["stack"].startswith("Process ") and stack["pid"] > 0
    # the page, the job view and the series say the same
    page = requests.get(exporter.url + "/", timeout=5).text
    assert f"where it hangs: {role}: " in page
    view = requests.get(f"{exporter.url}/jobs/{PROJECT}/e1", timeout=5).text
    assert "Where it hangs" in view and f"pid {stack['pid']}" in view
    # /metrics may serve the body built before the round's poll ended (metrics/exposition.py:
    # a scrape during a build gets the last one finished): the series follows within a build
    series = wait_until(lambda: stalled_in(exporter, "e1").get((role, where)), 10, 0.2,
                        what=f"rlhf_job_stalled_in{{role={role}, where={where}}}")  # fmt: skip
    assert series >= 1
    # the page: RLHFJobStalled fires; its annotation names the role and the wait once
    # Prometheus has scraped the round (it may fire a scrape before, saying "no stacks yet")
    want = f"{role}: {series:g} in {where}"
    text = wait_until(lambda: want in (firing_where(prom, "e1") or ""), 60, 0.5, what=want)
    assert text
    release(log, control)
    wait_until(lambda: stacks_of(exporter, "e1") is None, 30, 0.3, what="stacks forgotten")
    wait_until(lambda: not stalled_in(exporter, "e1"), 30, 0.3, what="series gone")
    wait_until(lambda: firing_where(prom, "e1") is None, 60, 0.5, what="page resolved")


def release(log: Path, control: Path) -> None:
    """The control file says step: the job steps again."""
    steps = log.read_text().count("\n")
    control.write_text("step")
    wait_until(lambda: log.read_text().count("\n") > steps + 2, 60, 0.3, what="steps again")


@pytest.mark.parametrize(
    "how, reason, words",
    [("none", "no_py_spy", "py-spy is not installed"),
     ("nobody", "no_permission", "SYS_PTRACE")],
)  # fmt: skip
def test_without_py_spy_or_ptrace_the_panel_says_why_and_the_page_fires(live, how, reason, words):
    cluster, log, exporter, prom = live
    control = cluster.controls["e1"]
    cluster.use(how)
    try:
        control.write_text("rollout_lock")

        def unread() -> dict | None:
            found = stacks_of(exporter, "e1")
            return found if found and {p["error"] for p in found["processes"]} == {reason} else None

        found = wait_until(unread, 60, 0.5, what=f"a round unread for {reason}")
        assert all(p["where"] is None for p in found["processes"])
        assert words in found["why"] and found["roles"] and found["answer"].count("unread") >= 1
        view = requests.get(f"{exporter.url}/jobs/{PROJECT}/e1", timeout=5).text
        assert view.count(escape(found["why"])) == 1  # said once
        assert view.count(f"unread: {reason}") == len(found["processes"])
        assert not stalled_in(exporter, "e1")  # no wait is invented
        # the page may first fire from an evaluation before the round ("no stacks yet"):
        # its annotation must come to name the reason
        said = f"no stacks ({reason}): see the job view"
        wait_until(lambda: firing_where(prom, "e1") == said, 60, 0.5, what=f"the page: {said}")
    finally:
        cluster.use("real")
        release(log, control)
        wait_until(lambda: stacks_of(exporter, "e1") is None, 30, 0.3, what="stacks forgotten")


def test_a_head_without_profiling_says_how_to_turn_it_on_once(tmp_path):
    cluster = Cluster(tmp_path, "noprof39", profiling=False)
    try:
        log = cluster.submit("e2")
        with watched(tmp_path, cluster) as (exporter, prom):
            cluster.controls["e2"].write_text("rollout_sleep")
            found = wait_until(lambda: stacks_of(exporter, "e2"), 60, 0.5, what="a round")
            assert "RAY_DASHBOARD_ENABLE_PROFILING=1" in found["why"]
            # the first 403 ends the round: asked once, not once per process
            errors = [p["error"] for p in found["processes"]]
            assert set(errors) == {"profiling_disabled"} and len(errors) == 7
            text = requests.get(exporter.url + "/metrics", timeout=5).text
            reads = {dict(k[1]).get("outcome"): v for k, v in parse_samples(text).items()
                     if k[0] == "rlhf_exporter_stack_reads_total"}  # fmt: skip
            assert reads["profiling_disabled"] >= 1 and reads["ok"] == 0
            messages = [p["message"] for p in found["processes"] if p["message"]]
            assert len(messages) == 1 and "Profiling is disabled" in messages[0]
            page = wait_until(lambda: firing_where(prom, "e2"), 60, 0.5, what="the page")
            assert page == "no stacks (profiling_disabled): see the job view"
            assert log.exists()
    finally:
        cluster.stop()


def test_the_exporter_needs_no_ray_import_for_stacks():
    """The stacks source talks HTTP only: a sidecar does not pin the cluster's Ray."""
    code = (
        "import sys, rlhf_exporter.sources.stacks, rlhf_exporter.diagnosis.stacks; "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ})  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr
