"""Start real processes on 127.0.0.1 for tests, and always stop them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "fixtures" / "traces"  # the sample verl logs, vendored


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    fn: Callable[[], T], timeout: float = 30.0, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll `fn` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # not ready yet
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_exc!r})" if last_exc else "")
    )


class Proc:
    """A subprocess in its own session, killed with its children on exit."""

    def __init__(
        self, args: Sequence[str], log: Path, env: dict | None = None, cwd: Path | None = None
    ):
        self.args = list(args)
        self.log_path = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """Everything the process printed so far (also after terminate())."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.popen.returncode

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc) -> None:
        self.terminate()


def exporter_cmd(*args: str) -> list[str]:
    """`rlhf-exporter ARGS` with this interpreter (works without the console script)."""
    return [sys.executable, "-m", "rlhf_exporter", *args]
