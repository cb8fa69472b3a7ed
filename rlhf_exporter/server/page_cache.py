"""The job view's rendered pages, kept a second and bounded in bytes, never keyed by the
`Host` header (a checked Host is put into a cached page at serve time)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

PAGE_CACHE_BYTES = 32 << 20  # bytes of rendered pages kept (page_cache_bytes)
# what a page says where the browser's Host goes: replaced at serve time, so the Host
# header never keys the cache (random Hosts cost no render and no memory)
HOST_MARK = "rlhf-exporter-host.invalid"
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]{2,45}\](?::[0-9]{1,5})?")


def clean_host(host: str | None) -> str | None:
    """The Host header when it is a host name or address with an optional port, else None
    (the page then names no host): nothing else of it reaches a page."""
    if host is None or not _HOST.fullmatch(host):
        return None
    return host


class PageCache:
    """Pages of the job view, kept for `ttl` seconds: a browser (or many) reloading `/` costs
    one render per second, so the pure-Python rendering does not compete with scrapes for
    the interpreter. The pages say "N s ago", so a second's staleness is invisible.

    Bounded in bytes (`max_bytes`, the `page_cache_bytes` setting): beyond, the least
    recently stored pages are evicted (counted in `stats["evicted"]`, rendered again when
    asked for); a page larger than the bound is served, not kept."""

    def __init__(self, ttl: float = 1.0, max_bytes: int = PAGE_CACHE_BYTES):
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._pages: OrderedDict[tuple[str, bool], tuple[float, int, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()  # renders, evicted

    @property
    def size(self) -> int:
        """Bytes of the pages kept."""
        return self._bytes

    def get(
        self, key: tuple[str, bool], render: Callable[[], tuple[int, bytes]]
    ) -> tuple[int, bytes]:
        now = time.monotonic()
        hit = self._pages.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1], hit[2]
        status, body = render()  # outside the lock: a slow render never holds up another
        self.stats["renders"] += 1
        with self._lock:
            old = self._pages.pop(key, None)
            if old is not None:
                self._bytes -= len(old[2])
            if len(body) <= self.max_bytes:
                self._pages[key] = (now, status, body)
                self._bytes += len(body)
            while self._bytes > self.max_bytes:
                _, (_, _, gone) = self._pages.popitem(last=False)
                self._bytes -= len(gone)
                self.stats["evicted"] += 1
        return status, body
