"""Worker sidecars (NVML-only) fetch the job's recent step windows from the head sidecar.

NVML sees only the local node: on a worker node the sidecar has GPUs but no verl log. With
`--gpu-windows-from http://HEAD:PORT` it reads the head's `GET /api/v1/windows` (the push
token, when set, as `Authorization: Bearer`) every `--gpu-windows-interval` and posts the
steps it has not seen to its own board, where its NVML source joins them to this node's GPUs.
Per-node results are summed in PromQL (alerts/gpu-windows.rules.yaml).

The head's timestamps are its wall clock: the nodes' clocks must agree (NTP); their offset
adds to the alignment error (docs/gpu-windows.md).
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from collections import Counter

import orjson

from ..auth import check_token
from ..job.windows_wire import WINDOWS_PATH, WIRE_BODY_BYTES, parse_board
from ..join.board import WindowBoard
from ..settings import Settings
from ..thresholds_file import ConfigError
from . import http
from .base import Clock, Context, PollingSource, PollResult, SourceError

NAME = "gpu_windows_remote"


class RemoteWindowsSource(PollingSource):
    """Reads the head's windows through the sidecar's bounded HTTP client (sources/http.py).
    The transport is as strict as the answer's check (`parse_board`): no redirect is followed (a 3xx is an error, `redirect`: the token is
    sent to the configured head only), the whole request has a deadline of `timeout`
    seconds (a head that trickles bytes is cut off and counted, `timeout`), at most
    WIRE_BODY_BYTES bytes are read (`too_large`), and an answer identical to the last one is not
    parsed again. Failures are counted in `rlhf_exporter_collector_errors_total` by reason
    and logged without any value from the answer."""

    def __init__(
        self,
        url: str,
        board: WindowBoard,
        token: str | None = None,
        interval: float = 2.0,
        timeout: float = 5.0,
        wall: Clock = time.time,
    ):
        super().__init__(NAME, interval, wall=wall)
        self.url = url.rstrip("/") + WINDOWS_PATH
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self._parts = parts
        self.board = board
        self.token = check_token(token, "the windows token")  # never sent with a newline
        self.timeout = timeout
        # the sidecar's bounded client (sources/http.py): one deadline, no redirect, a cap
        self._http = http.Client(
            timeout=timeout, max_bytes=WIRE_BODY_BYTES, accept="application/json"
        )
        self._errors.update(dict.fromkeys(http.REASONS, 0))
        self._seen: dict[tuple[str, str], float] = {}  # job -> the last step end posted
        self._last_digest = b""  # of the last answer parsed and posted
        self.stats: Counter[str] = Counter()  # answers: unchanged (not parsed), parsed

    @classmethod
    def from_settings(cls, settings: Settings, context: Context) -> RemoteWindowsSource | None:
        if not settings.gpu_windows_from or context.windows is None:
            return None
        try:
            return cls(
                settings.gpu_windows_from,
                context.windows,
                token=settings.push_token,
                interval=settings.gpu_windows_interval,
                wall=context.clock,
            )
        except ValueError as exc:  # a URL that is not http(s)://HOST[:PORT]
            raise ConfigError(f"gpu_windows_from: {exc}") from None

    def describe(self) -> str:
        return f"GPU windows from {self.url} (every {self.interval:g}s)"

    def _fetch(self) -> bytes:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            return self._http.get(self.url, headers=headers)
        except http.HttpFailure as exc:
            reason = exc.reason
            if reason == http.HTTP_ERROR:
                reason = {401: "unauthorized", 429: "throttled"}.get(exc.status or 0, reason)
            raise SourceError(reason, str(exc)) from None

    def close(self) -> None:
        self._http.close()

    def poll(self) -> PollResult:
        raw = self._fetch()
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        if digest == self._last_digest:
            self.stats["unchanged"] += 1
            return PollResult(())  # the same answer: nothing new to post
        self.stats["parsed"] += 1
        try:
            steps = parse_board(orjson.loads(raw), self.board.max_jobs, self.board.keep)
        except (ValueError, orjson.JSONDecodeError) as exc:
            raise SourceError("bad_answer", f"{self.url}: {str(exc)[:200]}") from None
        seen: dict[tuple[str, str], float] = {}  # only the jobs the head still has (bounded)
        for labels, tl in steps:
            last = seen.get(labels, self._seen.get(labels, float("-inf")))
            if tl.end > last:
                self.board.post(labels, tl)
                last = tl.end
            seen[labels] = last
        self._seen = seen
        self._last_digest = digest
        return PollResult(())
