"""The built image (scripts/build-image.sh's oci-archive), unpacked and run as a container would
run it: a Kubernetes container spec (the chart's) applied to the image's config, started by
tests/support/container_init.py under `unshare` (mount and PID namespaces; the host's network
namespace, as a pod's sidecar shares its pod's, or a new one as `docker run` gives).

    image = unpacked_image(tmp_path_factory)          # skips, or fails under CI=true, if unbuilt
    spec = image.spec(container, volumes={"verl-logs": host_dir})
    with ContainerExporter(spec, tmp_path, port) as exp:   # tests.support.serve.Exporter's API
        exp.value("rlhf_steps_total", project="p")
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlhf_exporter import __version__

from .procs import REPO, Proc
from .serve import Exporter

BUILD_COMMAND = "sudo bash scripts/build-image.sh"
INIT = Path(__file__).with_name("container_init.py")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def archive_path() -> Path:
    """Where scripts/build-image.sh writes the image (RLHF_IMAGE_OUT, default build/image)."""
    out = Path(os.environ.get("RLHF_IMAGE_OUT") or REPO / "build" / "image")
    return out / f"rlhf-exporter-{__version__}.oci.tar"


def unavailable(reason: str) -> None:
    """Under CI a missing image or tool is a failure (the build must have run); locally a skip."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the image tests must run)")
    pytest.skip(reason)


def require_runtime() -> None:
    if os.geteuid() != 0:
        unavailable("running the image needs root (mount namespaces, chroot, setuid)")
    for tool in ("unshare", "umoci"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (Debian packages util-linux, umoci)")


@dataclass
class Image:
    archive: Path
    ref: str  # the name the archive gives the image: repository:tag
    config: dict  # the OCI image config (config.Env, User, Entrypoint, Labels, ...)
    manifest: dict
    rootfs: Path
    layers: list[int] = field(default_factory=list)  # compressed sizes

    @property
    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.config["config"].get("Env", []))

    @property
    def labels(self) -> dict[str, str]:
        return self.config["config"].get("Labels") or {}

    def spec(
        self,
        container: dict,
        volumes: dict[str, Path] | None = None,
        extra_mounts: list[tuple[Path, str, bool]] = (),
        argv: list[str] | None = None,
        network: str = "host",
    ) -> dict:
        """A Kubernetes container (`command`, `args`, `env` with literal values,
        `volumeMounts`, `securityContext`) applied to this image, as container_init's spec.
        Every volume the container mounts must be named in `volumes` (name -> host path)."""
        cfg = self.config["config"]
        entrypoint = container.get("command") or cfg.get("Entrypoint") or []
        args = container.get("args") if "args" in container else cfg.get("Cmd") or []
        if container.get("command") and "args" not in container:
            args = []
        env = dict(self.env)
        for entry in container.get("env", []):
            assert "value" in entry, f"env {entry['name']}: only literal values run here"
            env[entry["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(entry["value"])
            )
        sc = container.get("securityContext") or {}
        user, _, group = (cfg.get("User") or "0").partition(":")
        uid = sc.get("runAsUser", int(user) if user.isdigit() else None)
        gid = sc.get("runAsGroup", int(group) if group.isdigit() else 0)
        assert uid is not None, f"image user {cfg.get('User')!r} is not numeric"
        if sc.get("runAsNonRoot"):
            assert uid != 0, "runAsNonRoot: the kubelet refuses to start a uid-0 container"
        mounts = []
        for m in container.get("volumeMounts", []):
            assert m["name"] in (volumes or {}), f"volume {m['name']} has no host path here"
            mounts.append([str(volumes[m["name"]]), m["mountPath"], bool(m.get("readOnly"))])
        mounts += [[str(host), target, ro] for host, target, ro in extra_mounts]
        drop = [c.upper() for c in (sc.get("capabilities") or {}).get("drop", [])]
        return {
            "rootfs": str(self.rootfs),
            "argv": argv if argv is not None else [*entrypoint, *args],
            "env": env,
            "workdir": cfg.get("WorkingDir") or "/",
            "uid": uid,
            "gid": gid,
            "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
            "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
            "drop_all_caps": "ALL" in drop,
            "mounts": mounts,
            "tmpfs": [],
            "loopback_up": network == "new",
            "network": network,
        }


def command(spec: dict) -> list[str]:
    """unshare + container_init for `spec` (the host's Python runs the init, not the image's)."""
    flags = ["--mount", "--pid", "--fork", "--kill-child", "--propagation", "private"]
    if spec["network"] == "new":
        flags.append("--net")
    return ["unshare", *flags, sys.executable, str(INIT), json.dumps(spec)]


def run(spec: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `spec` to its end; stdout and stderr as text."""
    return subprocess.run(command(spec), capture_output=True, text=True, timeout=timeout)


def unpack(archive: Path, where: Path) -> Image:
    """The oci-archive's image: its config and manifest, and its layers unpacked by umoci."""
    layout = where / "layout"
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+ (Debian's 3.11.2: no filter)
            tar.extractall(layout, filter="data")
        else:
            tar.extractall(layout)
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    ref = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
    blob = lambda digest: json.loads(  # noqa: E731
        (layout / "blobs" / digest.replace(":", "/")).read_text()
    )
    manifest = blob(entry["digest"])
    config = blob(manifest["config"]["digest"])
    # umoci finds a manifest by its ref.name, which it reads as a bare tag: name the copy's
    (entry_copy,) = json.loads(json.dumps(index))["manifests"]
    entry_copy["annotations"] = {"org.opencontainers.image.ref.name": "under-test"}
    (layout / "index.json").write_text(json.dumps({**index, "manifests": [entry_copy]}))
    bundle = where / "bundle"
    done = subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:under-test", str(bundle)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return Image(
        archive=archive,
        ref=ref,
        config=config,
        manifest=manifest,
        rootfs=bundle / "rootfs",
        layers=[layer["size"] for layer in manifest["layers"]],
    )


def unpacked_image(tmp_path_factory) -> Image:
    archive = archive_path()
    if not archive.exists():
        unavailable(f"no image at {archive}: build it with `{BUILD_COMMAND}`")
    require_runtime()
    return unpack(archive, tmp_path_factory.mktemp("image"))


class ContainerExporter(Exporter):
    """`spec` started as a container, with tests.support.serve.Exporter's HTTP helpers on
    `port` (the port the spec's settings make it listen on, on the host's network)."""

    def __init__(self, spec: dict, workdir: Path, port: int, ready: bool = True):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.verl_root = None
        Proc.__init__(self, command(spec), workdir / f"container-{port}.log", env={})
        if ready:
            try:
                self.wait_ready(60)
            except BaseException:
                self.terminate()
                raise

    def pid(self) -> int:
        """The containerised process's host PID (the child of `unshare --fork`)."""
        children = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children").read_text()
        (pid,) = children.split()
        return int(pid)

    def status(self) -> dict[str, str]:
        """/proc/<pid>/status of the containerised process, as a dict."""
        text = Path(f"/proc/{self.pid()}/status").read_text()
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
