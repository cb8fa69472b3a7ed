"""Bearer tokens for push and the windows API: checked at start, compared in constant time,
failures rate-limited and counted, never logged.

- `check_token`: a configured token is refused at start (exit 2, a message that never
  shows it) when it holds a control character, a space or a non-ASCII character (it could
  never be sent in an `Authorization` header); surrounding whitespace, such as the newline
  a secret file ends with, is stripped.
- `AuthGuard.check`: a wrong or missing token answers 401. Failed authentications are
  rate-limited per client (`auth_fail_rate` per second, a burst of twice that) and in all
  (`auth_fail_rate_total`): beyond, the request answers 429 without comparing the token, so
  a guesser gets at most that many tries per second whatever the number of connections.
  Both are counted in `rlhf_exporter_auth_failures_total{endpoint,reason}` (`unauthorized`,
  `auth_throttled`). At most `MAX_CLIENTS` clients are remembered (the idlest go first).
- `client_key`: who a client is for caps and limits: every loopback address is one client,
  an IPv6 address counts by its /64, an IPv4-mapped one as its IPv4 address.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from .metrics.snapshot import Sample

METRIC = "rlhf_exporter_auth_failures_total"
UNAUTHORIZED = "unauthorized"
THROTTLED = "auth_throttled"
FAIL_RATE = 5.0  # failed authentications per second and client
FAIL_RATE_TOTAL = 50.0  # failed authentications per second in all
MAX_CLIENTS = 4096  # clients whose failures are remembered


class Denied(NamedTuple):
    status: int
    reason: str
    message: str


def check_token(token: str | None, where: str = "push_token") -> str | None:
    """The token fit for an `Authorization: Bearer` header, or a ValueError that says what
    is wrong with it without showing it."""
    if token is None:
        return None
    stripped = token.strip()
    if not stripped:
        raise ValueError(f"{where} is empty (or only whitespace)")
    for i, c in enumerate(stripped):
        if not (0x21 <= ord(c) <= 0x7E):
            raise ValueError(
                f"{where} holds a space, control or non-ASCII character at position {i + 1} "
                "(the token is not shown); an Authorization header cannot carry it"
            )
    return stripped


def client_key(address: str) -> str:
    """Who a client address is, for per-client caps and limits."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Bucket:
    __slots__ = ("level", "t")

    def __init__(self, level: float, t: float):
        self.level, self.t = level, t

    def refill(self, now: float, rate: float) -> float:
        self.level = min(2 * rate, self.level + (now - self.t) * rate)
        self.t = now
        return self.level


class AuthGuard:
    """One endpoint's bearer-token check (thread-safe)."""

    def __init__(
        self,
        token: str | None,
        endpoint: str,
        rate: float = FAIL_RATE,
        rate_total: float = FAIL_RATE_TOTAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        token = check_token(token, f"the {endpoint} token")
        self._token = token.encode() if token else None
        self.endpoint = endpoint
        self.rate, self.rate_total = rate, rate_total
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()
        self._all = _Bucket(2 * rate_total, clock())
        # both reasons from 0, so that increase() sees the first refusal
        self.failures: Counter[str] = Counter(dict.fromkeys((UNAUTHORIZED, THROTTLED), 0))
        self._samples: tuple[Sample, ...] = ()  # the same tuple while nothing is counted

    @property
    def required(self) -> bool:
        return self._token is not None

    def check(self, authorization: str | None, client: str = "") -> Denied | None:
        """None when the request may go on; else the answer to give."""
        if self._token is None:
            return None
        key = client_key(client)
        with self._lock:
            now = self._clock()
            bucket = self._clients.get(key)
            if bucket is not None:
                self._clients.move_to_end(key)
            if (bucket is not None and bucket.refill(now, self.rate) < 1.0) or self._all.refill(
                now, self.rate_total
            ) < 1.0:
                self.failures[THROTTLED] += 1
                self._samples = ()
                return Denied(429, THROTTLED, "too many failed authentications; retry later")
        scheme, _, given = (authorization or "").partition(" ")
        ok = hmac.compare_digest(given.strip().encode(errors="replace"), self._token)
        if ok and scheme.lower() == "bearer":
            return None
        with self._lock:
            self.failures[UNAUTHORIZED] += 1
            self._samples = ()
            if bucket is None:
                bucket = self._clients[key] = _Bucket(2 * self.rate, now)
                while len(self._clients) > MAX_CLIENTS:
                    self._clients.popitem(last=False)
            bucket.level -= 1.0
            self._all.level -= 1.0
        return Denied(401, UNAUTHORIZED, "missing or wrong 'Authorization: Bearer <token>'")

    def samples(self) -> tuple[Sample, ...]:
        """Its counters (the same tuple while unchanged: the exposition caches by identity)."""
        out = self._samples
        if not out and self.failures:
            with self._lock:
                out = self._samples = tuple(
                    Sample(METRIC, (self.endpoint, reason), float(n))
                    for reason, n in sorted(self.failures.items())
                )
        return out
