"""GPU time by step window, live: a real `serve` following one verl job (fake `pynvml` at the
import boundary, stamping samples in epoch microseconds as NVML does) scraped by a real
Prometheus with the generated rules; the window series, the recording rules and both
dashboards' new panels return data, and the busy share is the GPUs' own.

The rules run 100 times faster (their 30m window becomes 18s), as in the dashboard live test.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from rlhf_exporter.diagnosis import Thresholds
from rlhf_exporter.render import rules as rules_mod
from rlhf_exporter.render.dashboards import fleet, job
from rlhf_exporter.render.rules import gpuwindows
from rlhf_exporter.thresholds_file import default_document
from tests.support import grafana_vars
from tests.support.procs import REPO, wait_until
from tests.support.prometheus import Prometheus
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

SCALE = 0.01
SITECUSTOMIZE = f"""\
import sys, time
sys.path.insert(0, {str(REPO)!r})
from tests.support.fake_pynvml import FakeClock, FakeGpu, make_module
_gpus = [FakeGpu(i, util=((0.0, 30.0 + 40.0 * i),)) for i in range(2)]  # 30 % and 70 % busy
sys.modules["pynvml"] = make_module(_gpus, FakeClock(start=time.time(), real=True))
"""


def scaled() -> Thresholds:
    doc = default_document()
    alerts = {
        k: rules_mod.duration(rules_mod.seconds(v) * SCALE)
        for k, v in doc["alerts"].items()
        if isinstance(v, str) and re.fullmatch(r"\d+(ms|s|m|h|d|w)", v)
    }
    return Thresholds.from_documents(doc, {"alerts": alerts})


def panel_exprs(board: str, title: str) -> list[str]:
    doc = json.loads(board)
    panels = [p for row in doc["panels"] for p in [row, *row.get("panels", [])]]
    (panel,) = [p for p in panels if p.get("title") == title]
    return [t["expr"] for t in panel["targets"]]


def substitute(expr: str, range_: str) -> str:
    return grafana_vars.substitute(
        expr, rate_interval="5s", range_=range_, project="p", experiment="e"
    )


def test_live_window_series_rules_and_panels(tmp_path):
    th = scaled()
    rule_file = tmp_path / "gpu-windows.rules.yaml"
    rule_file.write_text(rules_mod.rule_files(th)[gpuwindows.GPU_WINDOWS_FILE])
    fake = tmp_path / "fake-nvml"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    exporter = Exporter(
        tmp_path / "serve", "--nvml", "--nvml-interval", "0.25", env={"PYTHONPATH": str(fake)}
    )
    prom = None
    try:
        prom = Prometheus(
            tmp_path / "prom",
            [f"127.0.0.1:{exporter.port}"],
            rule_files=[rule_file],
            scrape_interval="500ms",
        )
        start = time.time()
        folder = exporter.verl_root / "p"
        folder.mkdir()
        with open(folder / "e.jsonl", "ab") as f:
            for step in range(1, 26):  # a step a second, its windows as long as they say
                t0 = time.time()
                time.sleep(0.9)
                data = {"timing_s/step": 0.9, "timing_s/gen": 0.4, "timing_s/update_actor": 0.45}
                f.write(json.dumps({"step": step, "data": data}).encode() + b"\n")
                f.flush()
                time.sleep(max(0.0, 1.0 - (time.time() - t0)))
        ctx = rules_mod.Context(th)
        wait_until(
            lambda: prom.query(f'{gpuwindows.job_idle(ctx)}{{project="p",experiment="e"}}'),
            30,
            0.25,
            what="the GPU-window recording rules",
        )
        end = time.time()
        # the busy share of both GPUs (30 % and 70 %) during the windows: 50 %
        (share,) = prom.query(
            'sum(increase(rlhf_window_gpu_busy_seconds_total{project="p"}[15s]))'
            ' / sum(increase(rlhf_window_gpu_seconds_total{project="p"}[15s]))'
        )
        assert abs(float(share["value"][1]) - 0.5) <= 0.05, share
        groups = {
            r["metric"]["group"]
            for r in prom.query(f'{gpuwindows.idle(ctx)}{{gpu_role="unknown"}}')
        }
        assert {"rollout", "update", "other"} <= groups, groups
        assert prom.query(gpuwindows.fleet_idle(ctx))
        page = requests.get(exporter.url + "/jobs/p/e", timeout=10).text
        assert "GPU time by step window and role" in page and "unknown" in page
        range_ = f"{int(end - start) + 1}s"
        exprs = panel_exprs(job.render(th), "GPU busy by window and role")
        exprs += panel_exprs(fleet.render(th), "GPU-hours idle by window, top jobs")
        for expr in exprs:
            q = substitute(expr, range_)
            r = requests.get(prom.url + "/api/v1/query", params={"query": q}, timeout=10)
            assert r.ok and r.json()["data"]["result"], q
    finally:
        if prom is not None:
            prom.terminate()
        exporter.terminate()


def test_a_head_without_nvml_serves_its_windows_and_gpu_windows_off_serves_none(tmp_path):
    """Issue 23: the example's head sidecar has no GPUs (--no-nvml) and reads the job's log:
    it keeps the step windows for its workers. With --no-gpu-windows there is no API."""
    exporter = Exporter(tmp_path / "serve")  # --no-nvml, a verl root
    try:
        r = requests.get(exporter.url + "/api/v1/windows", timeout=5)
        assert r.status_code == 200 and r.json() == {"jobs": []}
    finally:
        exporter.terminate()
    exporter = Exporter(tmp_path / "off", "--no-gpu-windows")
    try:
        r = requests.get(exporter.url + "/api/v1/windows", timeout=5)
        assert r.status_code == 404
    finally:
        exporter.terminate()


def test_serve_windows_api_needs_the_push_token(tmp_path):
    fake = tmp_path / "fake-nvml"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    exporter = Exporter(
        tmp_path / "serve",
        "--nvml",
        "--push-token",
        "s3cret",
        env={"PYTHONPATH": str(fake)},
    )
    try:
        url = exporter.url + "/api/v1/windows"
        assert requests.get(url, timeout=5).status_code == 401
        bad = requests.get(url, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert bad.status_code == 401
        ok = requests.get(url, headers={"Authorization": "Bearer s3cret"}, timeout=5)
        assert ok.status_code == 200 and ok.json() == {"jobs": []}
    finally:
        exporter.terminate()
