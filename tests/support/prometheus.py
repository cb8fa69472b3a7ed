"""A real Prometheus (and Alertmanager) on 127.0.0.1, from Debian's packages."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from .procs import Proc, free_port, wait_until


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package prometheus / prometheus-alertmanager)")
    return path


class Prometheus(Proc):
    """Scrapes `targets` every `scrape_interval` and evaluates `rule_files`."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
        alertmanagers: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        scrape_configs: Sequence[dict] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": list(scrape_configs)
            if scrape_configs is not None  # e.g. a monitor's, translated by the caller
            else [{"job_name": "rlhf-exporter", "static_configs": [{"targets": list(targets)}]}],
        }
        if alertmanagers:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]
            }
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        super().__init__(
            [
                binary("prometheus"),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *extra_args,
            ],
            workdir / "prometheus.log",
        )
        wait_until(
            lambda: requests.get(self.url + "/-/ready", timeout=1).ok, 60, what="prometheus ready"
        )

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query, evaluated now or `at` (epoch seconds)."""
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        r = requests.get(self.url + "/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def alerts(self) -> list[dict]:
        r = requests.get(self.url + "/api/v1/alerts", timeout=10)
        r.raise_for_status()
        return r.json()["data"]["alerts"]


class Alertmanager(Proc):
    def __init__(self, workdir: Path, config: dict):
        self.port = free_port()
        cluster_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "alertmanager.yml"
        cfg.write_text(yaml.safe_dump(config))
        super().__init__(
            [
                binary("prometheus-alertmanager"),
                f"--config.file={cfg}",
                f"--storage.path={workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--cluster.listen-address=127.0.0.1:{cluster_port}",
            ],
            workdir / "alertmanager.log",
        )
        wait_until(
            lambda: requests.get(self.url + "/-/ready", timeout=1).ok, 60, what="alertmanager ready"
        )


def victoria_metrics(
    vm: str,
    data: Path,
    log: Path,
    procs: list[Proc],
    port: int | None = None,
    extra_args: Sequence[str] = (),
) -> str:
    """A single-node VictoriaMetrics on 127.0.0.1 (data under `data`), its Proc appended to
    `procs` (the caller stops them), ready; returns its URL. Queries see samples at once
    (no latency offset beyond 1 s, no cache), as a test's assertions need. `port` restarts a
    store on the address it had."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    procs.append(
        Proc(
            [
                vm,
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-storageDataPath={data}",
                "-search.latencyOffset=1s",
                "-search.disableCache",
                *extra_args,
            ],
            log,
        )
    )
    wait_until(lambda: requests.get(url + "/health", timeout=1).ok, 30, what="vm ready")
    return url


def vm_binary(name: str) -> str:
    """A binary of Debian's victoria-metrics package (victoria-metrics, vmagent, vmalert, ...)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian package victoria-metrics)")
    return path


def vm_export(
    url: str, match: str, start: float, end: float, auth: tuple[str, str] | None = None
) -> list[dict]:
    """Every raw sample of the series `match` selects in [start, end] (VictoriaMetrics'
    /api/v1/export): one {"metric", "values", "timestamps" (ms)} per series, in time order
    (the export may give one series in several blocks)."""
    r = requests.get(
        url + "/api/v1/export",
        params={"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"},
        auth=auth,
        timeout=60,
    )
    r.raise_for_status()
    merged: dict[frozenset, dict[int, float]] = {}
    for line in r.text.splitlines():
        if line.strip():
            block = json.loads(line)
            key = frozenset(block["metric"].items())
            merged.setdefault(key, {}).update(zip(block["timestamps"], block["values"]))
    return [
        {"metric": dict(k), "timestamps": sorted(v), "values": [v[t] for t in sorted(v)]}
        for k, v in merged.items()
    ]
