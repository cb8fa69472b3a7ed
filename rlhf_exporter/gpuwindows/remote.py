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

import json
import time
import urllib.error
import urllib.request
from typing import Any

from ..sources.base import Clock, Context, PollingSource, PollResult, SourceError
from .board import MAX_BODY, WINDOWS_PATH, WindowBoard, parse_board

NAME = "gpu_windows_remote"


class RemoteWindowsSource(PollingSource):
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
        self.board = board
        self.token = token
        self.timeout = timeout
        self._seen: dict[tuple[str, str], float] = {}  # job -> the last step end posted

    @classmethod
    def from_settings(cls, settings: Any, context: Context) -> RemoteWindowsSource | None:
        if not settings.gpu_windows_from or context.windows is None:
            return None
        return cls(
            settings.gpu_windows_from,
            context.windows,
            token=settings.push_token,
            interval=settings.gpu_windows_interval,
            wall=context.clock,
        )

    def describe(self) -> str:
        return f"GPU windows from {self.url} (every {self.interval:g}s)"

    def poll(self) -> PollResult:
        req = urllib.request.Request(self.url)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            reason = "unauthorized" if exc.code == 401 else "http_error"
            raise SourceError(reason, f"{self.url}: HTTP {exc.code}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise SourceError("unreachable", f"{self.url}: {exc}") from None
        if len(raw) > MAX_BODY:
            raise SourceError("too_large", f"{self.url}: answer over {MAX_BODY} bytes")
        try:
            steps = parse_board(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError("bad_answer", f"{self.url}: {exc}") from None
        seen: dict[tuple[str, str], float] = {}  # only the jobs the head still has (bounded)
        for labels, tl in steps:
            last = seen.get(labels, self._seen.get(labels, float("-inf")))
            if tl.end > last:
                self.board.post(labels, tl)
                last = tl.end
            seen[labels] = last
        self._seen = seen
        return PollResult(())
