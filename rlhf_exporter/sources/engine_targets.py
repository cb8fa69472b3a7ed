"""Where the rollout engines' `/metrics` are: discovery without asking for addresses.

In order, merged (one target per URL):

1. **Ray actors on this node.** verl names each rollout server actor
   `(vllm|sglang|trtllm)_server_<replica>_<node rank>`; the reward and teacher servers of the
   same classes are `..._server_reward_...` / `..._server_teacher_...` and are not rollout
   replicas. Node rank 0 of each replica serves its HTTP API. The Ray source lists this
   node's ALIVE actors with their worker PID (`RaySource.pid_actors`); the server's
   listening TCP ports come from `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}` (node-local:
   the sidecar must see the actor's processes, as for the GPU roles), and the port that
   answers `GET /metrics` with Prometheus text is kept for that PID (a server whose port is
   not found yet, still loading its model, is probed again after 1, 2, 4, ... seconds, at
   most PROBE_RETRY apart: a real vLLM server listens tens of seconds after its actor is
   ALIVE, and a fixed 30 s retry missed a short job's whole rollout, issue 32).
2. **verl's Prometheus config** (`actor_rollout_ref.rollout.prometheus.enable=True` writes
   `rollout.prometheus.file`, by default /tmp/ray/session_latest/metrics/prometheus/prometheus.yml,
   on every node): the `rollout` scrape job's static targets, every replica of the job
   (node IPs: the sidecar must reach them).
3. **A file-based target list** (Prometheus `file_sd` format, YAML or JSON:
   `[{targets: [host:port, ...], labels: {replica: name}}]`), re-read when it changes.
4. **Static targets** (`--engine-target URL`, repeatable).

Bounds: at most MAX_PORTS listening ports are probed per PID, a target file larger than
MAX_FILE_BYTES is not read (counted), probes time out like scrapes.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

ROLLOUT_SERVER = re.compile(r"(vllm|sglang|trtllm)_server_(\d+)_(\d+)")
"""A rollout replica's server actor (verl 0.9.1); reward/teacher servers do not match."""
MAX_PORTS = 8
PROBE_RETRY = (
    30.0  # at most this many seconds before a server whose port was not found is probed again
)
PROBE_FIRST_RETRY = 1.0  # ... the first retry; each later one waits twice as long
MAX_FILE_BYTES = 1 << 20
PORT_NOT_FOUND = "engine_port_not_found"
BAD_TARGET_FILE = "engine_bad_target_file"


class Target(NamedTuple):
    name: str  # the replica: the server actor's name, or host:port
    url: str
    engine: str = ""  # vllm / sglang / trtllm when known


def rollout_replica(actor_name: str) -> tuple[str, int, int] | None:
    """(engine, replica, node rank) of a rollout server actor's name, or None (reward,
    teacher and every other actor)."""
    m = ROLLOUT_SERVER.fullmatch(actor_name)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def _url(target: str) -> str:
    t = target.strip()
    if "://" not in t:
        t = "http://" + t
    rest = t.partition("://")[2]
    if "/" not in rest:
        t += "/metrics"
    return t


def _hostport(url: str) -> str:
    rest = url.partition("://")[2]
    return rest.split("/", 1)[0]


def listening_ports(pid: int, proc: str = "/proc") -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets process `pid` listens on, from /proc (IPv4 and
    IPv6; a wildcard address is returned as 127.0.0.1 / ::1). [] when /proc is not readable."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"{proc}/{pid}/fd"):
            try:
                link = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    out: list[tuple[str, int]] = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"{proc}/{pid}/net/{table}", encoding="ascii", errors="replace") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != "0A" or parts[9] not in inodes:
                        continue
                    addr_hex, _, port_hex = parts[1].partition(":")
                    out.append((_address(addr_hex, v6), int(port_hex, 16)))
        except (OSError, ValueError):
            continue
    return sorted(set(out), key=lambda a: a[1])


def _address(hexaddr: str, v6: bool) -> str:
    if not v6:
        b = bytes.fromhex(hexaddr)[::-1]  # little-endian u32
        ip = ".".join(str(x) for x in b)
        return "127.0.0.1" if ip == "0.0.0.0" else ip
    raw = bytes.fromhex(hexaddr)
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    b = b"".join(words)
    if b == bytes(16):
        return "[::1]"
    if b[:12] == bytes(10) + b"\xff\xff":  # IPv4-mapped
        return ".".join(str(x) for x in b[12:])
    import ipaddress

    return f"[{ipaddress.IPv6Address(b)}]"


def _read_yaml(path: str, errors: Counter[str]) -> Any:
    try:
        p = Path(path)
        if p.stat().st_size > MAX_FILE_BYTES:
            errors[BAD_TARGET_FILE] += 1
            return None
        import yaml

        return yaml.safe_load(p.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return None
    except Exception:  # unreadable or not YAML/JSON
        errors[BAD_TARGET_FILE] += 1
        return None


class Targets:
    """The current rollout replicas to scrape (see the module docstring)."""

    def __init__(
        self,
        static: Iterable[str] = (),
        file_sd: str | None = None,
        prometheus_file: str | None = None,
        ray: Any = None,
        probe_timeout: float = 0.5,
        proc: str = "/proc",
    ):
        self.static = [Target(_hostport(_url(s)), _url(s)) for s in static]
        self.file_sd = file_sd
        self.prometheus_file = prometheus_file
        self.ray = ray
        self.probe_timeout = probe_timeout
        self.proc = proc
        self._files: dict[str, tuple[float, list[Target]]] = {}  # path -> (mtime, targets)
        # pid -> (the /metrics URL, or None: none found yet; when it was probed, monotonic;
        # how many probes found none)
        self._ports: dict[int, tuple[str | None, float, int]] = {}

    def describe(self) -> str:
        parts = []
        if self.ray is not None:
            parts.append("Ray rollout servers on this node")
        if self.prometheus_file:
            parts.append(f"verl's {self.prometheus_file}")
        if self.file_sd:
            parts.append(f"targets file {self.file_sd}")
        if self.static:
            parts.append(f"{len(self.static)} static")
        return ", ".join(parts) or "no targets"

    def current(self, errors: Counter[str]) -> list[Target]:
        out: dict[str, Target] = {}
        for t in self._from_ray(errors):
            out.setdefault(t.url, t)
        if self.prometheus_file:
            for t in self._cached(self.prometheus_file, errors, _verl_prometheus):
                out.setdefault(t.url, t)
        if self.file_sd:
            for t in self._cached(self.file_sd, errors, _file_sd):
                out.setdefault(t.url, t)
        for t in self.static:
            out.setdefault(t.url, t)
        return sorted(out.values())

    def _cached(self, path: str, errors: Counter[str], read: Any) -> list[Target]:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            self._files.pop(path, None)
            return []
        hit = self._files.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        targets = read(_read_yaml(path, errors))
        self._files[path] = (mtime, targets)
        return targets

    def _from_ray(self, errors: Counter[str]) -> list[Target]:
        if self.ray is None:
            return []
        try:
            actors: Mapping[int, Any] = self.ray.pid_actors()
        except Exception:
            return []
        out = []
        alive = set()
        for pid, actor in actors.items():
            found = rollout_replica(getattr(actor, "name", "") or "")
            if found is None or found[2] != 0:
                continue
            alive.add(pid)
            url, probed, misses = self._ports.get(pid, (None, None, 0))
            now = time.monotonic()
            wait = min(PROBE_RETRY, PROBE_FIRST_RETRY * 2 ** max(0, misses - 1))
            if url is None and (probed is None or now - probed >= wait):
                # a server found before its HTTP server listens (vLLM loads the model first)
                url = self._probe(pid)
                self._ports[pid] = (url, now, 0 if url else misses + 1)
                if url is None:
                    errors[PORT_NOT_FOUND] += 1
            if url is not None:
                out.append(Target(actor.name, url, found[0]))
        for pid in list(self._ports):
            if pid not in alive:
                del self._ports[pid]
        return out

    def _probe(self, pid: int) -> str | None:
        from .engines import FetchError, fetch

        for addr, port in listening_ports(pid, self.proc)[:MAX_PORTS]:
            url = f"http://{addr}:{port}/metrics"
            try:
                body = fetch(url, self.probe_timeout, 1 << 22)
            except FetchError:
                continue
            if b"# TYPE " in body or b"# HELP " in body:
                return url
        return None

    def forget_ports(self) -> None:
        """Probe every server's port again at the next poll."""
        self._ports.clear()


def _verl_prometheus(doc: Any) -> list[Target]:
    """The `rollout` job's targets in the Prometheus config verl writes
    (verl/workers/rollout/utils.py)."""
    out: list[Target] = []
    if not isinstance(doc, Mapping):
        return out
    for job in doc.get("scrape_configs") or ():
        if not isinstance(job, Mapping) or job.get("job_name") != "rollout":
            continue
        for sc in job.get("static_configs") or ():
            if isinstance(sc, Mapping):
                for t in sc.get("targets") or ():
                    if isinstance(t, str) and t:
                        out.append(Target(_hostport(_url(t)), _url(t)))
    return out


def _file_sd(doc: Any) -> list[Target]:
    out: list[Target] = []
    if not isinstance(doc, list):
        return out
    for group in doc:
        if not isinstance(group, Mapping):
            continue
        raw = group.get("labels")
        labels: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        targets = [t for t in group.get("targets") or () if isinstance(t, str) and t]
        for t in targets:
            name = _hostport(_url(t))
            if isinstance(labels.get("replica"), str) and len(targets) == 1:
                name = labels["replica"]
            engine = labels.get("engine") if isinstance(labels.get("engine"), str) else ""
            out.append(Target(name, _url(t), engine or ""))
    return out
