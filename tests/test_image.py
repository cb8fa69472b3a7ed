"""The built image (scripts/build-image.sh), run the way the chart runs it.

The chart is rendered by the real Helm engine (tests/support/chart.py) and its head
sidecar's container spec (args, env, volumeMounts, securityContext) is applied to the image's
own config (entrypoint, env, user, working directory): the unpacked root filesystem runs under
`unshare` + chroot as user 10001, on a read-only root, with no capability, no_new_privs, and
the chart's volumes bound as it mounts them (tests/support/container_init.py). The sidecar
shares the host's network, as it shares its pod's with the Ray head.

Under CI (CI=true) a missing image fails these tests; locally they skip with the command that
builds it (`sudo bash scripts/build-image.sh`).
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rlhf_exporter
from rlhf_exporter import options, settings
from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl
from tests.support import container as ct
from tests.support.chart import CHART, container, copy_example, rayjob_of, render
from tests.support.procs import REPO, free_port, wait_until
from tests.support.ray_head import connected_head, verl_actor_classes
from tests.support.rendered_pods import ray_pod_templates

tomllib = pytest.importorskip("tomllib")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
LOCK = REPO / "image" / "requirements.txt"
# where the test mounts the fake pynvml (tests/support/nvml_shim, which imports tests.support
# .fake_pynvml from the folder above `tests`) and its scenario: the tests folder only, so
# that the image's own rlhf_exporter is the one imported
SHIM_ROOT, SCENARIO_DIR = "/opt/fake-nvml", "/opt/fake-nvml-scenario"


@pytest.fixture(scope="module")
def example_chart(tmp_path_factory) -> Path:
    """The example RayJob chart with this chart in its charts/ (tests/support/chart.py)."""
    return copy_example(tmp_path_factory)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> ct.Image:
    return ct.unpacked_image(tmp_path_factory)


def head_sidecar(chart_dir: Path, **exporter_values) -> dict:
    """The head pod's exporter container, as the example RayJob renders it with `values`."""
    objects = render({"rlhf-exporter": exporter_values}, chart=chart_dir, namespace="ray-jobs")
    return container(ray_pod_templates(rayjob_of(objects))["head"]["spec"], "rlhf-exporter")


def pins(lock: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock.read_text(), re.M)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}


def installed(rootfs: Path) -> dict[str, str]:
    """Distributions in the image's virtualenv, from their METADATA."""
    out = {}
    for meta in rootfs.glob("opt/rlhf-exporter/lib/python3*/site-packages/*.dist-info/METADATA"):
        head = meta.read_text(errors="replace").split("\n\n", 1)[0]
        fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        out[re.sub(r"[-_.]+", "-", fields["Name"]).lower()] = fields["Version"]
    return out


# ---------------------------------------------------------------------------- what it is


def test_labels_version_and_reference_match_the_package_and_the_chart(image, example_chart):
    labels = image.labels
    assert labels["org.opencontainers.image.version"] == rlhf_exporter.__version__
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert labels["org.opencontainers.image.source"] in chart["sources"]
    revision = labels["org.opencontainers.image.revision"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", revision), revision
    if ct.in_ci():  # the build CI just ran is of this very commit
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert revision.removesuffix("-dirty") == head
    # the chart's default image reference is the image this build produced
    side = head_sidecar(example_chart)
    assert (
        side["image"] == image.ref == f"{VALUES['image']['repository']}:{rlhf_exporter.__version__}"
    )


def test_config_runs_the_chart_user_and_listens_from_the_environment(image):
    cfg = image.config["config"]
    sc = VALUES["securityContext"]
    assert cfg["User"] == f"{sc['runAsUser']}:{sc['runAsGroup']}"
    assert cfg["Entrypoint"] == ["rlhf-exporter"]
    # `docker run IMAGE serve --verl-root /logs` replaces CMD: nothing CMD holds may matter
    assert cfg["Cmd"] == ["serve"]
    assert image.env["RLHF_EXPORTER_LISTEN"] == f"0.0.0.0:{options.DEFAULT_PORT}"
    assert image.env["RLHF_EXPORTER_PUSH"] == "false"
    known = {settings.env_name(o) for o in options.OPTIONS}
    assert {k for k in image.env if k.startswith(settings.ENV_PREFIX)} <= known
    assert f"{options.DEFAULT_PORT}/tcp" in cfg["ExposedPorts"]


def test_contents_are_the_locked_wheels_and_nothing_to_build_with(image):
    root = image.rootfs
    assert installed(root) == {**pins(LOCK), "rlhf-exporter": rlhf_exporter.__version__}
    assert "ray" not in installed(root)
    site = next(root.glob("opt/rlhf-exporter/lib/python3*/site-packages"))
    for record in site.glob("*.dist-info/RECORD"):  # every file each wheel installed is there
        for line in record.read_text().splitlines():
            path = (site / line.rsplit(",", 2)[0]).resolve()
            assert path.is_relative_to(root.resolve()), line
            assert path.exists() or path.suffix == ".pyc", f"{record.parent.name}: {line}"
    for tool in ("gcc", "cc", "c++", "make", "ld", "as", "pip", "pip3"):
        for folder in ("usr/bin", "usr/local/bin", "opt/rlhf-exporter/bin"):
            assert not (root / folder / tool).exists(), f"/{folder}/{tool}"
    assert not list(site.glob("pip*")) and not list(site.glob("setuptools*"))
    assert not (root / "opt" / "build").exists() and not (root / "src").exists()
    assert not list(site.glob("tests")) and not list((site / "rlhf_exporter").rglob("test_*.py"))
    for cache in ("root/.cache", "var/cache/apt/archives/partial", "var/lib/apt/lists"):
        path = root / cache
        assert not path.exists() or not [p for p in path.iterdir() if p.name != "lock"], cache
    # the copyright files of Debian's packages stay; documentation and man pages go
    assert (root / "usr/share/doc/python3.11/copyright").exists()
    assert not list((root / "usr/share/man").glob("*/*"))


def test_the_image_stays_small_and_the_readme_says_how_small(image):
    """Compressed, as a registry stores it; README.md quotes the figure (within 10 %) and the
    reference of this version."""
    compressed = sum(image.layers)
    assert compressed < 80e6, [f"{s / 1e6:.1f} MB" for s in image.layers]
    readme = (REPO / "README.md").read_text()
    (stated,) = re.findall(r"\*\*(\d+) MB compressed", readme)
    assert abs(int(stated) * 1e6 - compressed) <= 0.1 * compressed, (stated, compressed)
    for doc in (readme, (REPO / "docs" / "image.md").read_text()):
        found = re.findall(r"rlhf-exporter[:-](\d[\w.]*)", doc)
        refs = {ref.removesuffix(".oci.tar").removesuffix(".tgz").rstrip(".") for ref in found}
        assert refs == {rlhf_exporter.__version__}, refs
    assert "sudo bash scripts/build-image.sh" in readme


# ---------------------------------------------------------------------------- as the chart runs it


@pytest.mark.ray
@pytest.mark.slow
def test_sidecar_runs_as_the_chart_runs_it(image, example_chart, tmp_path):
    """Metrics pass promtool; the mounted verl log is read; a real Ray head's actors are
    reported by role; NVML comes from the fake pynvml at its import boundary; the process is
    uid/gid 10001 with no capability and no_new_privs."""
    logs = tmp_path / "verl-logs"
    (logs / "proj").mkdir(parents=True)
    write_jsonl(logs / "proj" / "exp1.jsonl", DEMO_PLAN[:1])
    scenario = tmp_path / "scenario"
    scenario.mkdir()
    (scenario / "gpus.json").write_text(
        json.dumps({"sample_period": 0.05, "gpus": [{"util": [[0, 40]]}, {"util": [[0, 90]]}]})
    )
    port = free_port()
    with connected_head("rlhf-exporter-image") as head:
        classes = verl_actor_classes()
        actors = [classes[name].remote() for name in ("WorkerDict", "vLLMHttpServer", "TaskRunner")]
        import ray

        ray.get([a.pid.remote() for a in actors])
        side = head_sidecar(
            example_chart,
            port=port,
            sidecar={"head": {"nvml": True, "rayAddress": head.dashboard_url}},
            # the NVIDIA runtime would bring libnvidia-ml; here the fake pynvml comes first
            extraEnv=[
                {"name": "PYTHONPATH", "value": f"{SHIM_ROOT}/tests/support/nvml_shim"},
                {"name": "FAKE_PYNVML_SCENARIO", "value": f"{SCENARIO_DIR}/gpus.json"},
            ],
        )
        assert side["args"][0] == "serve" and "--listen" not in side["args"]
        engines = tmp_path / "engines"  # the chart's engines volume: verl's Prometheus file
        engines.mkdir()
        spec = image.spec(
            side,
            volumes={"verl-logs": logs, "rlhf-engines": engines},
            extra_mounts=[
                (REPO / "tests", f"{SHIM_ROOT}/tests", True),
                (scenario, SCENARIO_DIR, True),
            ],
        )
        assert spec["read_only_root"] and spec["no_new_privs"] and spec["drop_all_caps"]
        assert spec["mounts"][0][1:] == ["/verl-logs", True]
        with ct.ContainerExporter(spec, tmp_path, port) as exp:
            status = exp.status()
            assert status["Uid"].split() == ["10001"] * 4
            assert status["Gid"].split() == ["10001"] * 4
            assert status["Groups"].strip() == ""
            assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
            assert int(status["CapBnd"], 16) == 0
            assert status["NoNewPrivs"].strip() == "1"

            exp.wait_for(lambda: exp.value("rlhf_steps_total", project="proj"), 60, "verl steps")
            for role in ("trainer", "rollout", "driver"):
                exp.wait_for(
                    lambda role=role: exp.value("rlhf_ray_actors", role=role, state="ALIVE") == 1,
                    60,
                    f"one ALIVE {role} actor",
                )
            exp.wait_for(
                lambda: len(exp.series("rlhf_gpu_utilization_ratio")) == 2, 60, "two fake GPUs"
            )
            for collector in ("verl", "ray", "nvml"):
                assert exp.value("rlhf_exporter_collector_up", collector=collector) == 1.0, (
                    collector
                )
            text = exp.metrics_text()
        assert "Traceback" not in exp.output(), exp.output()[-3000:]
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


PROBE = r"""
import errno, json, os, sys
import pynvml, rlhf_exporter
out = {"uid": os.getuid(), "gid": os.getgid(), "pynvml": pynvml.__file__,
       "exporter": rlhf_exporter.__file__, "path": sys.path, "writes": {}}
for path in ("/probe", "/tmp/probe", "/opt/rlhf-exporter/probe", "/verl-logs/probe"):
    try:
        open(path, "w").close()
        out["writes"][path] = 0
    except OSError as exc:
        out["writes"][path] = exc.errno
print(json.dumps(out))
"""


def test_root_is_read_only_and_the_image_holds_its_own_modules(image, example_chart, tmp_path):
    """The chart's spec with the image's python as command: every write to the root (even to
    /tmp, which is world-writable) fails with EROFS, and so does one to the read-only logs
    volume; pynvml is nvidia-ml-py's and rlhf_exporter the image's (nothing of the host)."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)  # writable by 10001 but for the read-only mount
    side = head_sidecar(example_chart)
    engines = logs.parent / "engines"  # the chart's engines volume (read-only, verl's file)
    engines.mkdir()
    spec = image.spec(
        side, volumes={"verl-logs": logs, "rlhf-engines": engines}, argv=["python3", "-c", PROBE]
    )
    done = ct.run(spec)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["uid"], out["gid"]) == (10001, 10001)
    assert out["writes"] == {
        "/probe": errno.EROFS,
        "/tmp/probe": errno.EROFS,
        "/opt/rlhf-exporter/probe": errno.EROFS,
        "/verl-logs/probe": errno.EROFS,
    }
    assert out["pynvml"].startswith("/opt/rlhf-exporter/lib/python3")
    assert out["exporter"].startswith("/opt/rlhf-exporter/lib/python3")
    assert not [p for p in out["path"] if p.startswith(str(REPO))]


def test_serve_demo_works_with_nothing_mounted(image, tmp_path):
    """`docker run IMAGE serve --demo`: the image's own settings only, in a network namespace
    of its own, listening on every address of it (the image's RLHF_EXPORTER_LISTEN)."""
    spec = image.spec({"args": ["serve", "--demo"]}, network="new")
    assert spec["uid"] == 10001 and not spec["read_only_root"]  # the image's USER, no chart
    proc = ct.Proc(ct.command(spec), tmp_path / "demo.log")
    try:
        children = Path(f"/proc/{proc.popen.pid}/task/{proc.popen.pid}/children")
        pid = wait_until(lambda: int(children.read_text()), 30, what="the container's process")
        port = f"{options.DEFAULT_PORT:04X}"

        def listening() -> list[str]:
            rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
            return [row.split()[1] for row in rows if row.split()[3] == "0A"]

        wait_until(lambda: f"00000000:{port}" in listening(), 60, what=f"0.0.0.0:{port} (hex)")
        scrape = [
            "nsenter", "--target", str(pid), "--net", sys.executable, "-c",
            f"import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{options.DEFAULT_PORT}/metrics', timeout=10).read().decode())",
        ]  # fmt: skip

        def steps() -> float:
            text = subprocess.run(scrape, capture_output=True, text=True, timeout=30).stdout
            return sum(float(v) for v in re.findall(r"^rlhf_steps_total\{.*\} (\S+)$", text, re.M))

        wait_until(steps, 60, what="demo steps")
        assert proc.alive()
    except BaseException:
        print(proc.output()[-5000:])
        raise
    finally:
        proc.terminate()
