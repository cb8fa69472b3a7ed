"""The suite's proof that the rules and the exporter agree: a simulated day, then failures.

Real exporter code (jobs, the verl, push, Ray and NVML sources, the collector) runs on an
injected clock; the sample traces are written as verl writes them; every simulated 15 s each
exporter is scraped into a `promtool test rules` input that loads the repository's real rule
files at their real thresholds (tests/support/simday.py). NVML is faked at the `pynvml`
import boundary; Ray's state API is served over real HTTP on 127.0.0.1.

A healthy fleet (every verl mode of the traces: v0, v1, one-step-off, fully-async; long
validations and checkpoints between steps; a restart; a job that finishes; a pod without
Ray or GPUs) pages nobody for 24 hours. Then each failure (a hang, a dead actor, a
mis-mounted log volume, an exporter that cannot be scraped) pages, once, within its `for:`
plus two scrapes, and nothing else pages.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from rlhf_exporter.diagnosis.thresholds import seconds
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support import procs
from tests.support.fake_pynvml import FakeGpu, make_module
from tests.support.ray_state import RayStateApi
from tests.support.simday import SCRAPE, Day, FileSink, PushSink, TraceJob

# ../shared/traces, as for every test that reads the sample traces (RLHF_TEST_TRACES: elsewhere)
TRACES = Path(os.environ.get("RLHF_TEST_TRACES", str(procs.TRACES)))
pytestmark = pytest.mark.skipif(
    not TRACES.is_dir() or shutil.which("promtool") is None,
    reason="needs the shared sample traces and promtool",
)

HOUR = 3600
ROOT = Path(__file__).resolve().parents[1]
NV_OFFSET = 1000.0  # the fake driver's clock starts at 1000 s (NVML timestamps are never 0)


@pytest.fixture
def nvml(monkeypatch):
    """Install the fake pynvml driven by the day's clock; returns a GPU factory."""

    def install(day: Day, gpus: int, percent: float = 85.0) -> list[FakeGpu]:
        devices = [
            FakeGpu(i, util=[(0.0, percent)], start=NV_OFFSET, supports_samples=False)
            for i in range(gpus)
        ]
        module = make_module(devices, lambda: day.clock() + NV_OFFSET)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return devices

    return install


def trace(name: str) -> Path:
    return TRACES / f"{name}.jsonl"


class Fleet:
    """Four exporters and five jobs, as a namespace of verl jobs would run them."""

    def __init__(
        self,
        day: Day,
        tmp: Path,
        api: RayStateApi,
        nvml,
        *,
        head_root: Path | None = None,
        ray_interval: float = SCRAPE,
    ):
        c, th = day.clock, day.th
        self.day = day
        # 1. a v1 job's head sidecar: verl files, push, Ray (actors), NVML (2 GPUs)
        root_a = tmp / "a"
        self.head_root = head_root or root_a
        nvml(day, 2)
        for i, (cls, pid) in enumerate(
            [("TaskRunner", 100), ("WorkerDict", 101), ("WorkerDict", 102), ("vLLMHttpServer", 103)]
        ):
            api.alive(f"actor{i}", cls, pid)
        self.ray = RaySource(
            api.url, node_ips=["127.0.0.1"], clock=c, timeout=5.0, interval=ray_interval
        )
        self.head = day.target(
            "head-v1:19839",
            [
                VerlFileSource(th, [self.head_root], clock=c),
                PushSource(th, clock=c),
                self.ray,
                NvmlSource(60.0, ray=self.ray, roles=False, clock=lambda: c() + NV_OFFSET, wall=c),
            ],
        )
        # 2. a one-step-off job (checkpoints after the step) that finishes: --total-steps
        root_b = tmp / "b"
        root_b.mkdir()
        day.target(
            "head-osoff:19839",
            [VerlFileSource(th, [root_b], clock=c, total_steps=600), PushSource(th, clock=c)],
        )
        # 3. a shared exporter (no Ray, no GPUs): a v0 job that restarts, a fully-async job
        root_c = tmp / "c"
        root_c.mkdir()
        day.target("shared:19839", [VerlFileSource(th, [root_c], clock=c)])
        # 4. a pod without Ray, GPUs or a log volume: its job pushes
        push = PushSource(th, clock=c)
        day.target("pusher:19839", [push])

        self.v1 = TraceJob(
            trace("balanced_spread_v1"),
            FileSink(root_a / "grpo" / "v1.jsonl"),
            "grpo",
            "v1",
            validate_every=25,
            validations=(360.0, 480.0, 840.0, 600.0),  # up to 14 min, once 8 min was seen
        )
        self.osoff = TraceJob(
            trace("checkpoint_outside_one_step_off"),
            FileSink(root_b / "grpo" / "one_step_off.jsonl"),
            "grpo",
            "one_step_off",
            save_every=40,
            save_seconds=420.0,
            total_steps=600,
        )
        self.v0 = TraceJob(
            trace("rollout_long_tail_v0"),
            FileSink(root_c / "ppo" / "v0.jsonl"),
            "ppo",
            "v0",
            save_every=50,
            restart_at=8 * HOUR,
        )
        self.fully_async = TraceJob(
            trace("fully_async_rollout"), FileSink(root_c / "async" / "fa.jsonl"), "async", "fa"
        )
        self.pushed = TraceJob(
            trace("rollout_generation_v1"),
            PushSink(push),
            "dapo",
            "pushed",
            validate_every=30,
            validations=(300.0,),
        )
        self.jobs = [self.v1, self.osoff, self.v0, self.fully_async, self.pushed]


@pytest.fixture
def ray_api():
    with RayStateApi() as api:
        yield api


def test_a_healthy_fleet_is_quiet_for_a_day(tmp_path, ray_api, nvml):
    # rules evaluated every minute (not 15 s) and Ray polled every 5 minutes keep a day in
    # seconds; the failures below run at 15 s
    day = Day(tmp_path, evaluation=60)
    fleet = Fleet(day, tmp_path, ray_api, nvml, ray_interval=300.0)
    day.run(24 * HOUR, fleet.jobs)
    # the day did what it says: validations and checkpoints between steps, a restart, an end
    assert day.value("rlhf_between_steps_max_seconds", experiment="v1") == 840.0
    assert day.value("rlhf_between_steps_max_seconds", experiment="one_step_off") >= 420.0
    assert day.value("rlhf_run", experiment="v0") == 1.0
    assert day.value("rlhf_job_finished", experiment="one_step_off") == 1.0
    assert fleet.osoff.step == 600 and fleet.v1.step > 600
    # nothing pages, and no bottleneck notification either (info): every job is steadily
    # bound, and a steady bottleneck belongs on the dashboards and `/`, not in an alert
    day.expect_pages(at=24 * HOUR, window=24 * HOUR, pages={}, severities=".+")
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def _alerts_config() -> dict:
    doc = yaml.safe_load((ROOT / "rlhf_exporter" / "thresholds.yaml").read_text(encoding="utf-8"))
    return doc["alerts"]


INJECT = 40 * 60  # the failure comes after 40 healthy minutes (a baseline, a validation)
LATE = 2 * SCRAPE  # a page may come this much after its `for:` (scrape and evaluation lag)


@pytest.mark.parametrize("failure", ["hang", "dead_actor", "mis_mounted_log", "exporter_down"])
def test_each_failure_pages_once_on_time_and_nothing_else(tmp_path, ray_api, nvml, failure):
    cfg = _alerts_config()
    day = Day(tmp_path)  # rules evaluated every 15 s: the timing is checked to the scrape
    head_root = tmp_path / "not-mounted" if failure == "mis_mounted_log" else None
    fleet = Fleet(day, tmp_path, ray_api, nvml, head_root=head_root)
    if failure == "hang":
        fleet.v1.hang_at = INJECT
    elif failure == "dead_actor":
        day.at(INJECT, lambda: ray_api.kill("actor1", "WORKER_DIED"))
    elif failure == "exporter_down":
        day.at(INJECT, lambda: setattr(fleet.head, "up", False))

    if failure == "hang":
        # the stall limit: max(factor x baseline step, floor) + the longest validation seen
        day.run(INJECT + 60, fleet.jobs)
        last = day.value("rlhf_last_step_timestamp_seconds", experiment="v1")
        base = day.value("rlhf_baseline_step_duration_seconds", experiment="v1")
        between = day.value("rlhf_between_steps_max_seconds", experiment="v1")
        assert last is not None and base is not None and between is not None
        limit = max(cfg["stall_factor"] * base, seconds(cfg["stall_min"])) + between
        starts = last + limit  # the first moment the condition can hold
        due = starts + seconds(cfg["stall_for"]) + LATE
        alert, labels = "RLHFJobStalled", {"project": "grpo", "experiment": "v1"}
    elif failure == "dead_actor":
        starts = INJECT
        due = starts + seconds(cfg["actors_dead_for"]) + LATE
        alert, labels = "RLHFRayActorsDied", {"role": "trainer", "instance": "head-v1:19839"}
    elif failure == "mis_mounted_log":
        starts = 0
        due = seconds(cfg["collector_down_for"]) + LATE
        alert, labels = "RLHFExporterCollectorDown", {"collector": "verl"}
    else:
        starts = INJECT
        due = starts + seconds(cfg["exporter_down_for"]) + LATE
        # the page is the job's own (critical, with its identity); the exporter's is a warning
        alert, labels = "RLHFJobUnwatched", {"project": "grpo", "experiment": "v1"}
    end = max(due, INJECT) + 5 * 60
    day.run(end, fleet.jobs)

    day.expect_firing(due, alert, **labels)  # on time
    pages = {alert: 1}
    if failure == "exporter_down":
        day.expect_firing(due, "RLHFExporterDown", instance="head-v1:19839")
        pages["RLHFExporterDown"] = 1  # the warning beside the page, once
    day.expect_pages(at=end, window=end, pages=pages)  # once, and nothing else
    critical = {"RLHFJobStalled", "RLHFRayActorsDied", "RLHFJobUnwatched"}
    day.expect_pages(  # the pager's share: one page, or none for a warning
        at=end, window=end, pages={alert: 1} if alert in critical else {}, severities="critical"
    )
    if starts > SCRAPE:  # and not before its condition could hold
        day.expect_pages(at=starts - SCRAPE, window=starts, pages={})
    if failure == "mis_mounted_log":  # the reason is counted, the pod stays ready
        key = (("collector", "verl"), ("instance", "head-v1:19839"), ("job", "rlhf-exporter"))
        up = day.series["rlhf_exporter_collector_up", key]
        assert set(up.values()) == {0.0}
        assert day.value("rlhf_exporter_collector_errors_total", reason="root_missing") == 1.0
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
