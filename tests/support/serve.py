"""A real `rlhf-exporter serve` process on a free 127.0.0.1 port, for tests.

    with Exporter(tmp_path) as exp:                 # watches exp.verl_root, no Ray, no NVML
        (exp.verl_root / "proj").mkdir()
        ...write proj/exp1.jsonl...
        exp.wait_for(lambda: exp.value("rlhf_steps_total", project="proj") == 3)
        text = exp.metrics_text()

Defaults added unless the extra arguments set them: `--verl-root <workdir>/verl`
(`.verl_root`), `--verl-interval 0.2`, `--no-ray`, `--no-nvml`; `defaults=False` adds none
(only `--listen`: the rest comes from `env`, as the chart configures a pod). The constructor
returns once /readyz answers 200 (or raises with the process's log). `prefix` runs the
command under a wrapper (e.g. `setpriv ...`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import requests

from .procs import Proc, exporter_cmd, free_port, wait_until

T = TypeVar("T")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text format (0.0.4) -> {(name, frozenset(label items)): value}. A strict,
    fast reader for tests (prometheus_client's parser is slow on 20k series); it raises on a
    line it cannot read."""
    out = {}
    for line in text.split("\n"):  # the format's only line separator (not \r, \x85, ...)
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"unreadable exposition line: {line!r}")
        name, labels, value = m.groups()
        items = frozenset(
            (k, re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group()], v))
            for k, v in _LABEL.findall(labels or "")
        )
        out[name, items] = float(value)
    return out


def _given(args: tuple[str, ...], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


class Exporter(Proc):
    def __init__(
        self,
        workdir: Path,
        *extra_args: str,
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        timeout: float = 30.0,
        prefix: tuple[str, ...] = (),
        defaults: bool = True,
    ):
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.verl_root: Path | None = None
        args = ["serve", "--listen", f"127.0.0.1:{self.port}"]
        if defaults and not _given(extra_args, "--verl-root"):
            self.verl_root = workdir / "verl"
            self.verl_root.mkdir(exist_ok=True)
            args += ["--verl-root", str(self.verl_root)]
        if defaults and not _given(extra_args, "--verl-interval"):
            args += ["--verl-interval", "0.2"]
        if defaults and not _given(extra_args, "--ray", "--no-ray"):
            args.append("--no-ray")
        if defaults and not _given(extra_args, "--nvml", "--no-nvml"):
            args.append("--no-nvml")
        args += list(extra_args)
        log = workdir / f"exporter-{self.port}.log"
        super().__init__([*prefix, *exporter_cmd(*args)], log, env=dict(env or {}))
        if ready:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.terminate()
                raise

    def output(self) -> str:
        """The process's log so far (also after terminate())."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    # -- waiting ----------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(
                    f"exporter exited with {self.popen.returncode}:\n{self.output()}"
                )
            return self.get("/readyz").status_code == 200

        try:
            wait_until(ready, timeout, 0.05, what=f"{self.url}/readyz")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- exporter log ---\n{self.output()}") from None

    def wait_for(self, fn: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
        """Poll `fn` (e.g. a lambda over .value()) until truthy; fails with the exporter's log."""
        try:
            return wait_until(fn, timeout, 0.1, what=what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- exporter log ---\n{self.output()[-5000:]}") from None

    # -- HTTP -------------------------------------------------------------------------------
    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(self.url + path, timeout=kwargs.pop("timeout", 10), **kwargs)

    def push(self, body, token: str | None = None, **kwargs) -> requests.Response:
        """POST /api/v1/records; `body` is JSON-serialised unless it is bytes."""
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if isinstance(body, (bytes, bytearray)):
            return requests.post(
                self.url + "/api/v1/records",
                data=bytes(body),
                headers=headers,
                timeout=10,
                **kwargs,
            )
        return requests.post(
            self.url + "/api/v1/records", json=body, headers=headers, timeout=10, **kwargs
        )

    def metrics_text(self) -> str:
        r = self.get("/metrics")
        r.raise_for_status()
        return r.text

    def samples(self) -> dict[tuple[str, frozenset], float]:
        """Every series of one scrape: (name, frozenset of label items) -> value."""
        return parse_samples(self.metrics_text())

    def series(self, name: str, **labels: str) -> dict[frozenset, float]:
        """The series of `name` whose labels include `labels`: label set -> value."""
        want = set(labels.items())
        return {lab: v for (n, lab), v in self.samples().items() if n == name and want <= lab}

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one series of `name` matching `labels` (None when absent;
        the sum when several match)."""
        found = self.series(name, **labels)
        return sum(found.values()) if found else None
