"""A real Ray head on 127.0.0.1 for tests, with its own ports and temp dir, always stopped.

    head = RayHead("t1")          # ray start --head ... (every port free-chosen)
    head.dashboard_url            # http://127.0.0.1:<port>, what the exporter reads
    head.stop()                   # stops this head's processes only

    with connected_head("my-namespace") as head:    # ... with this process as its driver
        classes = verl_actor_classes()              # actor classes named as verl names them
        pid = ray.get(classes["WorkerDict"].remote().pid.remote())

Every head runs with `RAY_AUTH_MODE=disabled` unless it is given a `token` (then
`RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN`): Ray 2.60 turns token authentication on by itself
when `~/.ray/auth_token` exists and `RAY_AUTH_MODE` is unset, and a test's head must not
depend on what a machine's home holds. The driver of `connected_head` is told the same mode.

`ray stop` would stop every Ray process of every user on the machine (other engineers'
heads included), so `stop()` ends exactly the processes of this head: `ray start` runs in a
new session, every daemon and worker it spawns stays in that session, and stop() signals
that session's processes (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from .procs import free_port, wait_until


def ray_binary() -> str:
    local = Path(sys.executable).parent / "ray"
    path = str(local) if local.exists() else shutil.which("ray")
    if path is None:
        pytest.skip("ray is not installed (pip install -e '.[test]')")
    return path


def auth_env(token: str | None) -> dict[str, str]:
    """Ray's authentication variables for a head or driver: off, or on with `token`."""
    if token is None:
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def _owned_pids(sid: int, marker: bytes) -> list[int]:
    """Live processes of session `sid`, or whose command line names `marker` (this head's
    own temp dir: a process that left the session is still found)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            try:
                if _zombie(pid):
                    continue
                if os.getsid(pid) == sid:
                    pids.append(pid)
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker in f.read():
                        pids.append(pid)
            except OSError:
                pass
    return pids


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


class RayHead:
    """`ray start --head` with a short temp dir (unix sockets need a short path)."""

    def __init__(
        self,
        tag: str | None = None,
        num_cpus: int = 2,
        dashboard_port: int | None = None,
        timeout: float = 90.0,
        token: str | None = None,
        ray: str | None = None,
        num_gpus: int | None = None,
        object_store_memory: int = 100_000_000,
        env: dict[str, str] | None = None,
    ):
        """`token`: token authentication on, with this token; `ray`: another environment's
        `ray` binary (its Python runs the head's workers and jobs, e.g. .venv-verl's);
        `num_gpus`: logical GPUs to advertise; `env`: added to the head's environment (every
        daemon, worker and job inherits it)."""
        self.token = token
        self._base_tag = tag or uuid.uuid4().hex[:6]
        self._fixed_dashboard_port = dashboard_port
        failures: list[str] = []
        # `ray start` sometimes fails on a loaded 2-core machine with "the current node timed
        # out during startup": its raylet did not register with the GCS within Ray's fixed
        # 30 s (seen once in CI, right after the README test; the next start on the same
        # machine took 6 s). A port chosen here may also be taken by
        # another process's outgoing connection before Ray binds it. Such a start is retried
        # once, on fresh ports and a fresh temp dir, and both failures are reported.
        for attempt in range(2):
            rc = self._start(attempt, num_cpus, timeout, ray, num_gpus, object_store_memory, env)
            if rc == 0:
                break
            failures.append(
                f"attempt {attempt + 1}: ray start failed ({rc}):\n{self.log()}{self._daemon_logs()}"
            )
            self.stop(grace=2.0)
        else:
            raise RuntimeError("\n\n".join(failures))
        try:
            wait_until(self._ready, timeout, 0.25, what=f"Ray dashboard at {self.dashboard_url}")
        except BaseException:
            self.stop()
            raise

    def _start(
        self,
        attempt: int,
        num_cpus: int,
        timeout: float,
        ray: str | None,
        num_gpus: int | None,
        object_store_memory: int,
        env: dict[str, str] | None,
    ) -> int:
        """One `ray start --head` on freshly chosen ports; returns its exit code."""
        token = self.token
        self.tag = self._base_tag if attempt == 0 else f"{self._base_tag}r{attempt}"
        self.temp_dir = Path(f"/tmp/rlhf-ray-{self.tag}")
        self.gcs_port = free_port()
        self.dashboard_port = self._fixed_dashboard_port or free_port()
        self.gcs_address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.log_path = Path(f"/tmp/rlhf-ray-{self.tag}.start.log")
        ports = {
            f"--{name}": str(free_port())
            for name in (
                "ray-client-server-port",
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
                "node-manager-port",
                "object-manager-port",
            )
        }
        # workers listen below the kernel's ephemeral range, where free_port() picks from
        try:
            ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        except (OSError, ValueError, IndexError):
            ephemeral = 32768
        span = max(1000, ephemeral - 401 - 12000)
        worker_base = 12000 + (os.getpid() * 37 + self.dashboard_port) % span
        args = [
            ray or ray_binary(),
            "start",
            "--head",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--port={self.gcs_port}",
            f"--dashboard-port={self.dashboard_port}",
            "--include-dashboard=true",
            f"--num-cpus={num_cpus}",
            f"--object-store-memory={object_store_memory}",
            *([f"--num-gpus={num_gpus}"] if num_gpus is not None else []),
            f"--temp-dir={self.temp_dir}",
            f"--min-worker-port={worker_base}",
            f"--max-worker-port={worker_base + 400}",
            *[f"{k}={v}" for k, v in ports.items()],
        ]
        head_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **auth_env(token), **(env or {})}
        if token is None:
            head_env.pop("RAY_AUTH_TOKEN", None)
            head_env.pop("RAY_AUTH_TOKEN_PATH", None)
        with open(self.log_path, "wb") as log:
            starter = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=head_env, start_new_session=True
            )
        self.sid = starter.pid  # the session every process of this head belongs to
        try:
            return starter.wait(timeout)
        except BaseException:
            self.stop()
            raise

    def _daemon_logs(self) -> str:
        """The tails of this head's raylet and GCS logs (why a start failed)."""
        out = []
        for name in ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err"):
            for path in sorted(self.temp_dir.glob(f"session_*/logs/{name}")):
                try:
                    tail = path.read_text(errors="replace")[-1500:]
                except OSError:
                    continue
                if tail.strip():
                    out.append(f"\n--- {path.name} ---\n{tail}")
        return "".join(out)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _ready(self) -> bool:
        h = self.headers()
        version = requests.get(self.dashboard_url + "/api/version", timeout=2, headers=h)
        nodes = requests.get(self.dashboard_url + "/api/v0/nodes", timeout=5, headers=h)
        if version.status_code in (401, 403):  # say so at once instead of waiting 90 s
            raise RuntimeError(
                f"Ray dashboard {self.dashboard_url} answers HTTP {version.status_code}: token "
                "authentication is on although this head was started without a token"
            )
        return version.ok and nodes.ok and bool(nodes.json()["data"]["result"]["result"])

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        return _owned_pids(self.sid, str(self.temp_dir).encode() + b"/")

    def stop(self, grace: float = 10.0) -> None:
        """Stop this head's processes (and only those); remove its temp dir."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.pids():
            time.sleep(0.1)
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: not self.pids(), 10, 0.1, what="Ray processes gone")
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)


@contextlib.contextmanager
def connected_head(namespace: str, grace: float = 10.0, **kwargs: Any) -> Iterator[RayHead]:
    """A RayHead with this process connected to it as a Ray driver (`ray.init`). On exit,
    also on failure, the driver disconnects first (a driver whose GCS vanishes may end this
    process), then the head stops (`stop(grace)`: Ray's GCS and raylet take ~10 s to end on
    SIGTERM; a head whose state nobody reads afterwards can be killed sooner)."""
    import ray

    head = RayHead(**kwargs)
    os.environ.update(auth_env(head.token))  # read by ray.init in this process
    try:
        ray.init(
            address=head.gcs_address,
            namespace=namespace,
            log_to_driver=False,
            configure_logging=False,
        )
        yield head
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop(grace)


def verl_actor_classes() -> dict[str, Any]:
    """Remote actor classes named as verl's (connect a driver first). WorkerDict is made
    inside a function, as verl does, so Ray reports it as `...<locals>.WorkerDict`; the others
    look module-level. Every actor answers `pid()` (its worker process), `spawn_child()` (a
    child process, like vLLM's engine under the rollout server) and `exit()` (a crash)."""
    import ray

    def named(name: str, cls: type) -> type:
        cls.__name__ = cls.__qualname__ = name
        return cls

    class Worker:
        def __init__(self) -> None:
            self.child: subprocess.Popen | None = None

        def pid(self) -> int:
            return os.getpid()

        def spawn_child(self) -> int:
            self.child = subprocess.Popen(["sleep", "120"])
            return self.child.pid

        def exit(self) -> None:
            os._exit(1)

    def colocated() -> type:
        class WorkerDict(Worker):
            pass

        return WorkerDict

    out = {"WorkerDict": colocated()}
    for name in (
        "vLLMHttpServer",
        "AgentLoopWorker",
        "TaskRunner",
        "RewardLoopWorker",
        "MessageQueue",
    ):
        out[name] = named(name, type(name, (Worker,), {}))
    return {name: ray.remote(num_cpus=0)(cls) for name, cls in out.items()}
