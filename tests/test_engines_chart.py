"""The head sidecar of the RENDERED example chart finds the job's rollout engines the way the
chart deploys it (issue 33): through verl's own list of its servers, with the sidecar's
security context, never reading another uid's /proc.

verl 0.9.1 with `actor_rollout_ref.rollout.prometheus.enable=True` writes a Prometheus config
naming every replica's `/metrics` to `rollout.prometheus.file` on every node
(verl/workers/rollout/utils.py:141-223, `update_prometheus_config`; called at
workers/rollout/llm_server.py:494-497). The example sets that file on an emptyDir the Ray head
container and the sidecar (read-only) share (`sidecar.head.engines`). Here:

- the example chart is rendered with the real Helm engine; its RayJob's entrypoint, the Ray
  head container's and the sidecar's mounts, and the sidecar's env agree on the file;
- verl's own `update_prometheus_config` (its source, read from the installed verl and run
  with Ray's task API done in-process) writes the file for three simulated vLLM servers;
- the sidecar runs as the rendered container's uid/gid (10001, `setpriv`) with exactly its
  rendered arguments and env (the listen address, the logs root, the Ray address and the
  file's directory substituted: tests/support/rendered_pods.py), and reads every engine.
  The engines' processes belong to root: their /proc/<pid>/fd is closed to uid 10001.
"""

from __future__ import annotations

import ast
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import REPO, free_port
from tests.support.rendered_pods import (
    pod_env,
    ray_pod_templates,
    render,
    sidecar,
    substitute,
)
from tests.support.serve import Exporter
from tests.support.sim_engine import EngineSim, scenario

pytestmark = [pytest.mark.slow]
pytest.importorskip("helm_python")

CHART = REPO / "helm" / "rlhf-exporter"
EXAMPLE = REPO / "examples" / "verl-grpo-rayjob"
RELEASE, NAMESPACE = "grpo", "ray-jobs"
VERL_UTILS = "verl/workers/rollout/utils.py"


def _verl_source(rel: str) -> Path:
    import site

    for base in site.getsitepackages():
        if (Path(base) / rel).is_file():
            return Path(base) / rel
    pytest.skip(f"verl 0.9.1 is not installed ({rel})")


class _InProcessRay:
    """Ray's task API as update_prometheus_config uses it, run in this process: one alive
    node (this machine)."""

    @staticmethod
    def remote(**_kw):
        def wrap(fn):
            task = SimpleNamespace(remote=fn)
            return SimpleNamespace(options=lambda **_o: task, remote=fn)

        return wrap

    @staticmethod
    def get(results):
        return results

    @staticmethod
    def nodes():
        return [{"Alive": True, "NodeManagerAddress": "127.0.0.1"}]


def verl_writes_its_prometheus_file(path: Path, addresses: list[str]) -> None:
    """verl's own update_prometheus_config (its source from the installed verl) writing `path`."""
    src = _verl_source(VERL_UTILS).read_text()
    (fn,) = [
        n
        for n in ast.parse(src).body
        if isinstance(n, ast.FunctionDef) and n.name == "update_prometheus_config"
    ]
    code = textwrap.dedent(ast.get_source_segment(src, fn) or "")
    code = code.replace("config: PrometheusConfig", "config")  # the annotation's import: torch
    space: dict = {"ray": _InProcessRay, "yaml": yaml, "os": os, "logger": logging.getLogger()}
    exec(compile(code, VERL_UTILS, "exec"), space)
    config = SimpleNamespace(file=str(path), port=free_port())  # no Prometheus to reload
    space["update_prometheus_config"](config, addresses, "vllm")


@pytest.fixture(scope="module")
def head():
    where = Path(tempfile.mkdtemp()) / EXAMPLE.name
    shutil.copytree(EXAMPLE, where)
    shutil.copytree(CHART, where / "charts" / CHART.name)  # as `helm dependency build` does
    objects = render(where, None, RELEASE, NAMESPACE)
    shutil.rmtree(where.parent)
    (job,) = [o for o in objects if o["kind"] == "RayJob"]
    return job, ray_pod_templates(job)["head"]


def test_the_rendered_chart_shares_verls_engine_list_with_the_head_sidecar(head) -> None:
    job, template = head
    side = sidecar(template)
    (ray_head,) = [c for c in template["spec"]["containers"] if c["name"] == "ray-head"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    file = env["RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE"]
    directory = str(Path(file).parent)
    (mount,) = [m for m in side["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    assert {"name": mount["name"], "mountPath": directory} in ray_head["volumeMounts"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
    entry = job["spec"]["entrypoint"].split()
    # what verl needs: stats on (llm_server.py:491-493 refuses prometheus without them),
    # its Prometheus file on, at the shared path
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in entry
    assert "actor_rollout_ref.rollout.prometheus.enable=True" in entry
    assert f"actor_rollout_ref.rollout.prometheus.file={file}" in entry
    ctx = side["securityContext"]
    assert ctx["runAsUser"] == 10001 and ctx["runAsNonRoot"] and ctx["readOnlyRootFilesystem"]


def _readable_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rlhf-engines-chart-"))
    d.chmod(0o755)  # the sidecar's uid must enter it (tmp_path is root's alone)
    return d


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the sidecar as uid 10001: needs root")
def test_the_head_sidecar_finds_every_engine_as_uid_10001_without_proc(head) -> None:
    _job, template = head
    side = sidecar(template)
    assert side["args"] == ["serve"]
    ctx = side["securityContext"]
    uid, gid = ctx["runAsUser"], ctx["runAsGroup"]
    labels = dict(template["metadata"]["labels"])
    rendered = pod_env(side, labels, NAMESPACE, {})
    work = _readable_dir()
    engines_dir, verl_root = work / "engines", work / "verl"
    engines_dir.mkdir(mode=0o777)  # an emptyDir: world-writable
    verl_root.mkdir(mode=0o755)
    replicas, _ = scenario("healthy")
    with EngineSim(replicas[:3], [(0.0, 1e12)]) as sim:
        addresses = [u.split("/")[2] for u in sim.urls()]
        prom_file = engines_dir / Path(rendered["RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE"]).name
        verl_writes_its_prometheus_file(prom_file, addresses)
        assert prom_file.stat().st_mode & stat.S_IROTH  # verl's umask: readable by the sidecar
        env = substitute(
            rendered,
            RLHF_EXPORTER_LISTEN=f"127.0.0.1:{free_port()}",
            RLHF_EXPORTER_VERL_ROOT=str(verl_root),
            RLHF_EXPORTER_RAY_ADDRESS=f"http://127.0.0.1:{free_port()}",  # no Ray here
            RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE=str(prom_file),
        )
        env["PYTHONPATH"] = str(REPO)
        prefix = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--")
        exp = Exporter(work / "run", defaults=False, ready=False, env=env, prefix=prefix)
        try:
            exp.wait_ready()
            with open(f"/proc/{exp.popen.pid}/status") as f:
                ids = {
                    k: v.split()
                    for k, v in (line.split(":", 1) for line in f)
                    if k in ("Uid", "Gid")
                }
            assert ids["Uid"][0] == str(uid) and ids["Gid"][0] == str(gid)
            # that uid cannot read the engines' /proc/<pid>/fd (they run as root here)
            probe = subprocess.run(
                [*prefix, sys.executable, "-c", f"import os; os.listdir('/proc/{os.getpid()}/fd')"],
                capture_output=True,
                text=True,
            )
            assert probe.returncode != 0 and "PermissionError" in probe.stderr

            def up() -> dict[tuple[str, str], float]:
                return {
                    (s.labels["replica"], s.labels["engine"]): s.value
                    for fam in text_string_to_metric_families(exp.get("/metrics").text)
                    for s in fam.samples
                    if s.name == "rlhf_engine_up"
                }

            got = exp.wait_for(lambda: len(up()) == 3 and up(), 30, "every engine read")
            assert got == {(a, "vllm"): 1.0 for a in addresses}
        finally:
            exp.terminate()
            shutil.rmtree(work, ignore_errors=True)
