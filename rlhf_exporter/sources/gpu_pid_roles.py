"""Which role's process uses a GPU: NVML's compute process matched to a Ray actor's worker
PID on this node (or an ancestor of it, at most MAX_ANCESTORS hops up /proc), and only when
this host sees that process titled `ray::<ActorClass>` (docs/gpu-roles.md); anything else is
role `unknown`, so memory is never given to a wrong role."""

from __future__ import annotations

from collections.abc import Mapping

from ..join.ports import ActorPids, ActorProcess
from .roles import short_name

UNKNOWN_ROLE = "unknown"
MAX_ANCESTORS = 8  # /proc parent hops from a GPU process to its actor


class PidRoles:
    """PID -> role, by the Ray source's PID map (`ray`), when `on`."""

    def __init__(self, ray: ActorPids | None, on: bool, proc_root: str = "/proc"):
        self.ray = ray
        self.on = on
        self.proc_root = proc_root
        # PID -> role, for one Ray poll's PID map: the map itself is kept (a reference, not
        # its id(), which CPython reuses), so a new poll (reused PIDs) empties the cache
        self._role_cache: tuple[Mapping[int, ActorProcess] | None, dict[int, str]] = (None, {})

    def actors(self) -> Mapping[int, ActorProcess]:
        if not self.on or self.ray is None:
            return {}
        return self.ray.pid_actors(max_age=max(4 * self.ray.interval, 60.0))

    def role_of(self, pid: int, actors: Mapping[int, ActorProcess]) -> str:
        if not actors:
            return UNKNOWN_ROLE
        seen, cache = self._role_cache
        if seen is not actors:  # a new Ray poll: PIDs may have been reused
            cache = {}
            self._role_cache = (actors, cache)
        role = cache.get(pid)
        if role is None:
            role = cache[pid] = self._match(pid, actors)
        return role

    def _match(self, pid: int, actors: Mapping[int, ActorProcess]) -> str:
        """Walk up from the GPU process to an actor process this host can see and verify."""
        for _ in range(MAX_ANCESTORS):
            actor = actors.get(pid)
            if actor is not None:
                return actor.role if self._titled(pid, actor.class_name) else UNKNOWN_ROLE
            pid = self._parent(pid)
            if pid <= 1:
                break
        return UNKNOWN_ROLE

    def _titled(self, pid: int, class_name: str) -> bool:
        """Ray titles actor processes `ray::<Class>` (`ray::<Class>.<method>` while busy)."""
        try:
            with open(f"{self.proc_root}/{pid}/cmdline", "rb") as f:
                title = f.read(512)
        except OSError:
            return False
        want = b"ray::" + short_name(class_name).encode()
        return title.startswith(want) and title[len(want) : len(want) + 1] in (
            b"",
            b".",
            b"\0",
            b" ",
        )

    def _parent(self, pid: int) -> int:
        try:
            with open(f"{self.proc_root}/{pid}/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0
