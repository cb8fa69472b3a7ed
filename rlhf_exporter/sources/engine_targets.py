"""Where the rollout engines' `/metrics` are: discovery without asking for addresses.

In order, merged (one target per URL):

1. **Ray actors on this node.** verl 0.9.1 names each rollout server actor (ROLLOUT_SERVER):
   vLLM/SGLang `(vllm|sglang)_server_<replica>_<node rank>` (node rank 0 serves the
   replica's HTTP API), TRT-LLM `trtllm_server_<replica>` (one server per replica), and with
   prefill/decode disaggregation `(vllm|sglang)_server_decode_<replica>_<i>` (decode server
   i, each with an HTTP API of its own) beside the prefill peer `..._server_<replica>_0`
   (role "prefill": it generates no tokens to speak of, so it is left out of the imbalance);
   any of them may end in verl's `_<name_suffix>`. The reward and teacher servers of the
   same classes are `..._server_reward_...` / `..._server_teacher_...` and are not rollout
   replicas. The Ray source lists this
   node's ALIVE actors with their worker PID (`RaySource.pid_actors`); the server's
   listening TCP ports come from `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}` (node-local:
   the sidecar must see the actor's processes, as for the GPU roles), and the port that
   answers `GET /metrics` with Prometheus text is kept for that PID (a server whose port is
   not found yet, still loading its model, is probed again after 1, 2, 4, ... seconds, at
   most PROBE_RETRY (10 s) apart: a real vLLM server listens tens of seconds after its actor
   is ALIVE, and a fixed 30 s retry would miss a short job's whole rollout). While
   such a server's actor is alive a verl job runs on this node, so the engine source reads
   at its fast interval (`ray_servers`), from the first step on.
2. **verl's Prometheus config** (`actor_rollout_ref.rollout.prometheus.enable=True` writes
   `rollout.prometheus.file`, by default /tmp/ray/session_latest/metrics/prometheus/prometheus.yml,
   on every node): the `rollout` scrape job's static targets, every replica of the job
   (node IPs: the sidecar must reach them).
3. **A file-based target list** (Prometheus `file_sd` format, YAML or JSON:
   `[{targets: [host:port, ...], labels: {replica: name}}]`), re-read when it changes.
4. **Static targets** (`--engine-target URL`, repeatable).

Bounds (what they drop is counted in the engine source's record errors):
- a PID's ports are probed only when its process is a Ray worker (`/proc/<pid>/cmdline`
  starts `ray::`, as Ray titles its actors' processes), at most MAX_PORTS ports per PID and
  MAX_PROBES PIDs per poll (`engine_port_not_found`, `engine_not_a_ray_worker`); probes
  time out like scrapes (one deadline over everything, sources/http.py);
- a target list is opened non-blocking and must be a regular file (a FIFO or a symlink to
  /dev/zero is refused, `engine_target_file_not_regular`), is read to MAX_FILE_BYTES at most
  (`engine_target_file_too_large`), and YAML aliases are refused
  (`engine_target_file_alias`; a 30 KB alias bomb would expand into millions of targets);
  a list that is not YAML/JSON is `engine_bad_target_file`;
- a list is read again only when its modification time or size changed and at most every
  FILE_REREAD seconds, and parsed only when its bytes changed (a digest): a 900 KB file
  rewritten every second costs one read and one hash per FILE_REREAD;
- a list's targets are capped while they are built (the engine source's
  `--engine-max-replicas`; the rest `engine_too_many_replicas`), de-duplicated by URL;
- names and labels from a list are cleaned and cut like job names (sources/labels.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from ..join.ports import ActorPids, ActorProcess
from . import http
from .labels import outside_label
from .small_file import NOT_REGULAR, TOO_LARGE, SmallFileError, read_small

ROLLOUT_SERVER = re.compile(
    r"(?:(?P<engine>vllm|sglang)_server_(?P<decode>decode_)?(?P<replica>\d+)_(?P<rank>\d+)"
    r"|(?P<trt>trtllm)_server_(?P<trt_replica>\d+))"
    r"(?:_[A-Za-z0-9][A-Za-z0-9_.-]*)?"
)
"""A rollout server actor's name (verl 0.9.1; see rollout_replica). Reward and teacher
servers (`_server_reward_`, `_server_teacher_`) do not match."""
MAX_PORTS = 8
PROBE_RETRY = (
    10.0  # at most this many seconds before a server whose port was not found is probed again
)
PROBE_FIRST_RETRY = 1.0  # ... the first retry; each later one waits twice as long
MAX_FILE_BYTES = 1 << 20
MAX_PROBES = 4  # PIDs whose ports are probed per poll (the others wait for the next poll)
MAX_NODES = 200_000  # YAML nodes in one target list
FILE_REREAD = 5.0  # seconds: a changed target list is read again at most this often
MAX_TARGETS = 4096  # targets built from one list when no lower cap is asked for
PORT_NOT_FOUND = "engine_port_not_found"
NOT_RAY_WORKER = "engine_not_a_ray_worker"
BAD_TARGET_FILE = "engine_bad_target_file"
FILE_NOT_REGULAR = "engine_target_file_not_regular"
FILE_TOO_LARGE = "engine_target_file_too_large"
FILE_ALIAS = "engine_target_file_alias"
TOO_MANY = "engine_too_many_replicas"
KNOWN = (PORT_NOT_FOUND, NOT_RAY_WORKER, BAD_TARGET_FILE, FILE_NOT_REGULAR, FILE_TOO_LARGE,
         FILE_ALIAS)  # fmt: skip


class Target(NamedTuple):
    name: str  # the replica: the server actor's name, or host:port
    url: str
    engine: str = ""  # vllm / sglang / trtllm when known
    role: str = ""  # "prefill" / "decode" (prefill/decode disaggregation), "" otherwise


class RolloutServer(NamedTuple):
    engine: str
    replica: int
    node_rank: int  # the server's node within its replica: 0 serves the HTTP API
    role: str  # "decode" (a decode server of a prefill/decode replica) or ""


def rollout_replica(actor_name: str) -> RolloutServer | None:
    """What a rollout server actor's name says, or None (reward, teacher and every other
    actor): `vllm_server_<r>_<n>`, a PD pair's prefill `vllm_server_<r>_0` and decode
    `vllm_server_decode_<r>_<i>`, SGLang's and TensorRT-LLM's `<engine>_server_<r>...`, each
    with the replica's `_<name_suffix>` (verl's source: docs/verl-support.md, "Verified in
    verl source")."""
    m = ROLLOUT_SERVER.fullmatch(actor_name)
    if m is None:
        return None
    if m.group("trt"):
        return RolloutServer("trtllm", int(m.group("trt_replica")), 0, "")
    if m.group("decode"):  # decode server i of the replica: its own server, its own API
        return RolloutServer(m.group("engine"), int(m.group("replica")), 0, "decode")
    return RolloutServer(m.group("engine"), int(m.group("replica")), int(m.group("rank")), "")


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


class TargetFileError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_FILE_REASONS = {NOT_REGULAR: FILE_NOT_REGULAR, TOO_LARGE: FILE_TOO_LARGE}


def read_capped(path: str, cap: int = MAX_FILE_BYTES) -> bytes:
    """A target list's bytes (sources/small_file.py: non-blocking, a regular file, capped);
    FileNotFoundError when it is not there, TargetFileError with a reason otherwise."""
    try:
        return read_small(path, cap)
    except SmallFileError as exc:
        raise TargetFileError(_FILE_REASONS.get(exc.reason, BAD_TARGET_FILE)) from None


def load_document(raw: bytes) -> Any:
    """A target list's YAML or JSON document, with only what the targets need: lists,
    mappings, strings; any other scalar (a number, a boolean, null) is None.

    JSON (file_sd's other format) is read by orjson. YAML is read event by event from the C
    parser and built here: an alias is refused at once (`FILE_ALIAS`: nothing is expanded),
    and so is a document of more than MAX_NODES nodes (`FILE_TOO_LARGE`). No call holds
    the interpreter lock for long (composing a 900 KB document in one C call held it for
    hundreds of milliseconds, and the scrapes with it)."""
    try:
        import orjson

        return orjson.loads(raw)
    except ValueError:
        pass
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    builder = _YamlBuilder()
    try:
        for event in yaml.parse(raw, Loader=loader_cls):
            builder.feed(event)
    except yaml.YAMLError:
        raise TargetFileError(BAD_TARGET_FILE) from None
    return builder.root


_NOT_A_KEY = object()  # a mapping key that is not a string: never looked up


class _YamlBuilder:
    """Builds a document from YAML events (see load_document)."""

    def __init__(self) -> None:
        import yaml

        self.yaml = yaml
        self.resolver = yaml.resolver.Resolver()
        self.stack: list[list[Any]] = []  # [container, pending key] being built
        self.root: Any = None
        self.nodes = 0
        self.documents = 0

    def feed(self, event: Any) -> None:
        y = self.yaml
        if isinstance(event, y.AliasEvent):
            raise TargetFileError(FILE_ALIAS)
        if isinstance(event, y.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:  # as yaml.safe_load: one document
                raise TargetFileError(BAD_TARGET_FILE)
        elif isinstance(event, y.ScalarEvent | y.SequenceStartEvent | y.MappingStartEvent):
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise TargetFileError(FILE_TOO_LARGE)
            if isinstance(event, y.ScalarEvent):
                self._add(self._scalar(event))
            else:
                self.stack.append([[] if isinstance(event, y.SequenceStartEvent) else {}, None])
        elif isinstance(event, y.SequenceEndEvent | y.MappingEndEvent):
            done, _ = self.stack.pop()
            self._add(done)

    def _scalar(self, event: Any) -> Any:
        y = self.yaml
        tag = event.tag
        if tag is None or tag == "!":
            # types-PyYAML leaves Resolver.resolve unannotated
            tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                y.ScalarNode, event.value, event.implicit
            )
        if tag == "tag:yaml.org,2002:str":
            return event.value
        if not tag.startswith("tag:yaml.org,2002:"):  # yaml.safe_load refuses it too
            raise TargetFileError(BAD_TARGET_FILE)
        return None

    def _add(self, value: Any) -> None:
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        container = top[0]
        if isinstance(container, list):
            container.append(value)
        elif top[1] is None:
            top[1] = value if isinstance(value, str) else _NOT_A_KEY
        else:
            key, top[1] = top[1], None
            if key is not _NOT_A_KEY:
                container[key] = value


class _File(NamedTuple):
    stat: tuple[float, int, int]  # (mtime, size, inode) when last read
    digest: bytes
    targets: list[Target]
    read_at: float  # monotonic


class Targets:
    """The current rollout replicas to scrape (see the module docstring)."""

    def __init__(
        self,
        static: Iterable[str] = (),
        file_sd: str | None = None,
        prometheus_file: str | None = None,
        ray: ActorPids | None = None,
        probe_timeout: float = 0.5,
        proc: str = "/proc",
        reread: float = FILE_REREAD,
    ):
        self.static = [Target(outside_label(_hostport(_url(s))), _url(s)) for s in static]
        self.file_sd = file_sd
        self.prometheus_file = prometheus_file
        self.ray = ray
        self.probe_timeout = probe_timeout
        self.proc = proc
        self.reread = reread
        self._files: dict[str, _File] = {}  # path -> what was read last
        # pid -> (the /metrics URL, or None: none found yet; when it was probed, monotonic;
        # how many probes found none)
        self._ports: dict[int, tuple[str | None, float, int]] = {}
        # verl rollout servers (node rank 0) Ray listed alive on this node at the last look,
        # their port found or not: while there is one, a verl job runs here
        self.ray_servers = 0

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

    def current(self, errors: Counter[str], limit: int = MAX_TARGETS) -> list[Target]:
        """The targets, at most `limit` (the rest counted as engine_too_many_replicas)."""
        out: dict[str, Target] = {}
        for t in self._from_ray(errors):
            out.setdefault(t.url, t)
        if self.prometheus_file:
            for t in self._cached(self.prometheus_file, errors, _verl_prometheus, limit):
                out.setdefault(t.url, t)
        if self.file_sd:
            for t in self._cached(self.file_sd, errors, _file_sd, limit):
                out.setdefault(t.url, t)
        for t in self.static:
            out.setdefault(t.url, t)
        return sorted(out.values())

    def _cached(
        self,
        path: str,
        errors: Counter[str],
        build: Callable[[Any, int, Counter[str]], list[Target]],
        limit: int,
    ) -> list[Target]:
        try:
            st = os.stat(path)
        except OSError:
            self._files.pop(path, None)
            return []
        key = (st.st_mtime, st.st_size, st.st_ino)
        hit = self._files.get(path)
        now = time.monotonic()
        if hit is not None and (hit.stat == key or now - hit.read_at < self.reread):
            return hit.targets
        try:
            raw = read_capped(path)
        except FileNotFoundError:
            self._files.pop(path, None)
            return []
        except TargetFileError as exc:
            errors[exc.reason] += 1
            self._files[path] = _File(key, b"", [], now)
            return []
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        if hit is not None and hit.digest == digest:  # rewritten with the same bytes
            self._files[path] = hit._replace(stat=key, read_at=now)
            return hit.targets
        try:
            targets = build(load_document(raw), limit, errors)
        except TargetFileError as exc:
            errors[exc.reason] += 1
            targets = []
        except Exception:  # not YAML/JSON, or a shape the builder cannot read
            errors[BAD_TARGET_FILE] += 1
            targets = []
        self._files[path] = _File(key, digest, targets, now)
        return targets

    def _from_ray(self, errors: Counter[str]) -> list[Target]:
        if self.ray is None:
            return []
        try:
            actors: Mapping[int, ActorProcess] = self.ray.pid_actors()
        except Exception:
            self.ray_servers = 0
            return []
        out = []
        alive = set()
        probes = 0
        servers = {pid: rollout_replica(getattr(a, "name", "") or "") for pid, a in actors.items()}
        # a replica with decode servers is disaggregated: its `_server_<r>_0` is the prefill peer
        disaggregated = {(s.engine, s.replica) for s in servers.values() if s and s.role}
        for pid, actor in actors.items():
            found = servers[pid]
            if found is None or found.node_rank != 0:
                continue
            role = found.role
            if not role and (found.engine, found.replica) in disaggregated:
                role = "prefill"
            alive.add(pid)
            url, probed, misses = self._ports.get(pid, (None, None, 0))
            now = time.monotonic()
            wait = min(PROBE_RETRY, PROBE_FIRST_RETRY * 2 ** max(0, misses - 1))
            if url is None and (probed is None or now - probed >= wait):
                if probes >= MAX_PROBES:
                    continue  # probed at a later poll
                probes += 1
                # a server found before its HTTP server listens (vLLM loads the model first)
                if not _ray_worker(pid, self.proc):
                    # a PID the answer names that is no Ray worker: never probed
                    self._ports[pid] = (None, now, misses + 1)
                    errors[NOT_RAY_WORKER] += 1
                    continue
                url = self._probe(pid)
                self._ports[pid] = (url, now, 0 if url else misses + 1)
                if url is None:
                    errors[PORT_NOT_FOUND] += 1
            if url is not None:
                out.append(Target(outside_label(actor.name), url, found.engine, role))
        for pid in list(self._ports):
            if pid not in alive:
                del self._ports[pid]
        self.ray_servers = len(alive)
        return out

    def _probe(self, pid: int) -> str | None:
        """The server's /metrics: the first port answering Prometheus text, else one whose
        HTTP server has no /metrics route (404: SGLang without enable_metrics), read as a
        replica without stats rather than as one whose port was not found."""
        probe = http.Client(timeout=self.probe_timeout, max_bytes=1 << 22, accept="text/plain")
        no_route = None
        for addr, port in listening_ports(pid, self.proc)[:MAX_PORTS]:
            url = f"http://{addr}:{port}/metrics"
            try:
                body = probe.get(url)
            except http.HttpFailure as exc:
                if exc.status == 404 and no_route is None:
                    no_route = url
                continue
            if b"# TYPE " in body or b"# HELP " in body:
                return url
        return no_route

    def probe_soon(self) -> None:
        """Probe every server whose port was not found yet at the next poll, its backoff
        started over (the ports already found are kept)."""
        self._ports = {pid: v for pid, v in self._ports.items() if v[0] is not None}

    def forget_ports(self) -> None:
        """Probe every server's port again at the next poll."""
        self._ports.clear()


def _ray_worker(pid: int, proc: str = "/proc") -> bool:
    """Whether process `pid` is a Ray worker: Ray titles its workers' processes `ray::...`
    (`ray::IDLE`, `ray::vLLMHttpServer.__init__`). A PID a Ray answer names that is not one
    (sshd, the kubelet) never gets its ports probed."""
    try:
        fd = os.open(f"{proc}/{pid}/cmdline", os.O_RDONLY | os.O_NONBLOCK)
        try:
            head = os.read(fd, 64)
        finally:
            os.close(fd)
    except OSError:
        return False
    return head.startswith(b"ray::")


class _Builder:
    """Targets of one list, de-duplicated by URL and capped while they are built."""

    def __init__(self, limit: int, errors: Counter[str]):
        self.limit = limit
        self.errors = errors
        self.out: dict[str, Target] = {}

    def add(self, raw: str, name: str | None = None, engine: str = "") -> None:
        url = _url(raw)
        if url in self.out:
            return
        if len(self.out) >= self.limit:
            self.errors[TOO_MANY] += 1
            return
        self.out[url] = Target(outside_label(name or _hostport(url)), url, outside_label(engine))


def _verl_prometheus(doc: Any, limit: int = MAX_TARGETS, errors: Counter[str] | None = None
                     ) -> list[Target]:  # fmt: skip
    """The `rollout` job's targets in the Prometheus config verl writes
    (verl/workers/rollout/utils.py)."""
    b = _Builder(limit, Counter() if errors is None else errors)
    if not isinstance(doc, Mapping):
        return []
    for job in _items(doc.get("scrape_configs")):
        if not isinstance(job, Mapping) or job.get("job_name") != "rollout":
            continue
        for sc in _items(job.get("static_configs")):
            if isinstance(sc, Mapping):
                for t in _items(sc.get("targets")):
                    if isinstance(t, str) and t and len(t) <= 1000:
                        b.add(t)
    return list(b.out.values())


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _file_sd(doc: Any, limit: int = MAX_TARGETS, errors: Counter[str] | None = None
             ) -> list[Target]:  # fmt: skip
    b = _Builder(limit, Counter() if errors is None else errors)
    for group in _items(doc):
        if not isinstance(group, Mapping):
            continue
        raw = group.get("labels")
        labels: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        targets = [t for t in _items(group.get("targets")) if isinstance(t, str) and t]
        replica = labels.get("replica")
        engine = labels.get("engine") if isinstance(labels.get("engine"), str) else ""
        for t in targets:
            if len(t) > 1000:
                continue
            name = replica if isinstance(replica, str) and replica and len(targets) == 1 else None
            b.add(t, name, engine or "")
    return list(b.out.values())
