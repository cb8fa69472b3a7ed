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

Then lifecycles that nobody announces (issue 22): a RayJob that ends normally (its actors
die as a real shutdown leaves them, the Jobs API says SUCCEEDED) and a fleet job that stops
at the total steps written beside its log raise nothing; a crash (a worker dies, the driver
exits 1), a Ray head restart under a running job, a hang whose exporter then fails to be
scraped and vanishes, a hang whose log volume is then unmounted, and a pushed job lost in
an exporter restart each page once, on time, and stay firing through the blindness; a
pushed job that pushes again after the restart raises nothing; an exporter restart on a
50 MB log fakes no regression.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from rlhf_exporter.diagnosis.thresholds import seconds
from rlhf_exporter.join.names import JobNames
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support import procs
from tests.support.fake_pynvml import FakeGpu, make_module
from tests.support.ray_state import RayStateApi
from tests.support.simday import SCRAPE, Day, FileSink, PushSink, TraceJob, trace_steps

# the vendored sample traces (tests/fixtures/traces; RLHF_TEST_TRACES: another folder)
TRACES = Path(os.environ.get("RLHF_TEST_TRACES", str(procs.TRACES)))
pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="needs promtool (Prometheus's rule tester) on PATH",
)

HOUR = 3600
ROOT = Path(__file__).resolve().parents[1]
NV_OFFSET = 1000.0  # the fake driver's clock starts at 1000 s (NVML timestamps are never 0)
V1_SUBMISSION, V1_RAY_JOB = "raysubmit_v1", "02000000"


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
        api.clock = c  # Ray stamps the ends by the day's clock
        # `ray job submit` of verl's main_ppo for grpo/v1 (the Jobs API ties it to its log)
        api.submit(V1_SUBMISSION, "grpo", "v1", job_id=V1_RAY_JOB)
        for i, (cls, pid) in enumerate(
            [("TaskRunner", 100), ("WorkerDict", 101), ("WorkerDict", 102), ("vLLMHttpServer", 103)]
        ):
            api.alive(f"actor{i}", cls, pid, job_id=V1_RAY_JOB)
        self.root_c = tmp / "c"
        self.ray = RaySource(
            api.url, node_ips=["127.0.0.1"], clock=c, timeout=5.0, interval=ray_interval
        )
        # as `serve` wires them: job states from Ray, a file wins its name over a push
        facts, names = self.ray.facts(), JobNames()
        head_verl, head_push = (
            VerlFileSource(th, [self.head_root], clock=c, facts=facts, names=names),
            PushSource(th, clock=c, facts=facts, names=names),
        )
        self.head = day.target(
            "head-v1:19839",
            [
                head_verl,
                head_push,
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
        self.shared = day.target("shared:19839", [VerlFileSource(th, [root_c], clock=c)])
        # 4. a pod without Ray, GPUs or a log volume: its job pushes
        push = PushSource(th, clock=c)
        self.pusher = day.target("pusher:19839", [push])

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


def stall_starts(day: Day, cfg: dict) -> float:
    """When v1's stall condition can first hold: its last step plus the stall limit,
    max(factor x baseline step, floor) + the longest validation seen."""
    last = day.value("rlhf_last_step_timestamp_seconds", experiment="v1")
    base = day.value("rlhf_baseline_step_duration_seconds", experiment="v1")
    between = day.value("rlhf_between_steps_max_seconds", experiment="v1")
    assert last is not None and base is not None and between is not None
    limit = max(cfg["stall_factor"] * base, seconds(cfg["stall_min"])) + between
    return last + limit


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
        day.run(INJECT + 60, fleet.jobs)
        starts = stall_starts(day, cfg)  # the first moment the condition can hold
        due = starts + seconds(cfg["stall_for"]) + LATE
        alert, labels = "RLHFJobStalled", {"project": "grpo", "experiment": "v1"}
    elif failure == "dead_actor":
        # a worker of the job's submission died of a failure: the job failed (issue 22), and
        # that is its one page; the actor-death alert stays quiet for a failed job
        starts = INJECT
        due = starts + SCRAPE + seconds(cfg["failed_for"]) + LATE
        alert, labels = "RLHFJobFailed", {"project": "grpo", "experiment": "v1"}
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
    pages: dict[str, int] = {alert: 1}
    if failure == "exporter_down":
        day.expect_firing(due, "RLHFExporterDown", instance="head-v1:19839")
        pages["RLHFExporterDown"] = 1  # the warning beside the page, once
    day.expect_pages(at=end, window=end, pages=pages)  # once, and nothing else
    critical = {"RLHFJobStalled", "RLHFJobFailed", "RLHFJobUnwatched"}
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


# -- lifecycles nobody announces (issue 22) ------------------------------------------------------
CRITICAL = "critical"
AFTER = 2 * HOUR  # how long after the event the day goes on


@pytest.mark.parametrize(
    "lifecycle",
    [
        "normal_end_sidecar",
        "normal_end_fleet",
        "crash",
        "stall_then_blind",
        "unmounted_log",
        "ray_head_restart",
        "pushed_job_survives_restart",
        "pushed_job_lost_in_restart",
    ],
)
def test_lifecycles_nobody_announces(tmp_path, ray_api, nvml, lifecycle):
    """Jobs end and fail the way they do, with nobody telling the exporter. A normal end
    raises nothing; each failure pages exactly once, within its `for:` plus two scrapes,
    and stays firing to the end of the day (nobody recovers it or declares it finished)."""
    cfg = _alerts_config()
    day = Day(tmp_path)
    fleet = Fleet(day, tmp_path, ray_api, nvml)
    ray_poll = SCRAPE  # the head's Ray source polls once a scrape
    alert: str | None = None
    warnings: dict[str, int] = {}
    if lifecycle == "normal_end_sidecar":
        # the RayJob's driver returns: its actors die as a real shutdown leaves them
        # (OWNER_DIED, OUT_OF_SCOPE; Ray's JobSupervisor WORKER_DIED, an intended exit), the
        # submission SUCCEEDED; the RayJob keeps its cluster (ttlSecondsAfterFinished)
        fleet.v1.hang_at = INJECT
        day.at(INJECT + 30, lambda: ray_api.normal_end(V1_SUBMISSION))
        end = INJECT + AFTER
    elif lifecycle == "normal_end_fleet":
        # a shared exporter, no Ray: the job's total steps lie beside its log from the start
        # (as a job template writes it), and the job simply stops after its last step
        fleet.v0.total_steps = 40
        (fleet.root_c / "ppo" / "v0.total_steps").write_text("40\n")
        end = INJECT + AFTER
    elif lifecycle == "crash":
        # a worker dies (SIGKILL, OOM killer), the driver gets ActorDiedError and exits 1
        fleet.v1.hang_at = INJECT
        day.at(INJECT, lambda: ray_api.kill("actor1", "WORKER_DIED"))
        day.at(INJECT + 30, lambda: ray_api.end(V1_SUBMISSION, "FAILED"))
        alert, starts = "RLHFJobFailed", INJECT
        due = starts + ray_poll + seconds(cfg["failed_for"]) + LATE
        end = INJECT + AFTER
    elif lifecycle == "ray_head_restart":
        # the head pod restarts (no GCS fault tolerance): the driver dies with it, the new
        # head lists no actor and no job; nobody says the job is dead
        fleet.v1.hang_at = INJECT
        day.at(INJECT, ray_api.restart_head)
        alert, starts = "RLHFJobFailed", INJECT
        due = starts + ray_poll + seconds(cfg["failed_for"]) + LATE
        end = INJECT + AFTER
    elif lifecycle.startswith("pushed_job"):
        # the pod without a log volume restarts its exporter: pushed jobs live in memory. A
        # job that pushes again is back at once; one that hung meanwhile is lost: it pages
        def restart() -> None:
            fresh = PushSource(day.th, clock=day.clock)
            fleet.pusher.restart(day.clock(), [fresh])
            fleet.pushed.sink = PushSink(fresh)

        day.at(INJECT, restart)
        end = INJECT + AFTER
        if lifecycle == "pushed_job_lost_in_restart":
            fleet.pushed.hang_at = INJECT
            alert, starts = "RLHFJobUnwatched", INJECT
            due = starts + seconds(cfg["exporter_down_for"]) + LATE
    else:  # stall_then_blind, unmounted_log: a real hang first
        fleet.v1.hang_at = INJECT
        day.run(INJECT + 60, fleet.jobs)
        alert, starts = "RLHFJobStalled", stall_starts(day, cfg)
        due = starts + seconds(cfg["stall_for"]) + LATE
        end = due + AFTER
        if lifecycle == "stall_then_blind":
            # scrapes fail for 10 minutes, then the head pod is gone (its target vanishes)
            day.at(due + 300, lambda: setattr(fleet.head, "up", False))
            day.at(due + 900, lambda: setattr(fleet.head, "scraped", False))
            warnings["RLHFExporterDown"] = 1
        else:
            # the log volume is unmounted under the hung job
            day.at(due + 300, lambda: fleet.head_root.rename(tmp_path / "unmounted"))
            warnings["RLHFExporterCollectorDown"] = 1
    day.run(end, fleet.jobs)

    if alert is None:  # a normal end (or a job that survived): nothing at all, all day
        day.expect_pages(at=end, window=end, pages={})
        if lifecycle.startswith("normal_end"):
            experiment = "v1" if lifecycle == "normal_end_sidecar" else "v0"
            assert day.value("rlhf_job_state", experiment=experiment, state="finished") == 1.0
    else:
        job = {"project": "dapo", "experiment": "pushed"} if "pushed" in lifecycle else {
            "project": "grpo", "experiment": "v1"}  # fmt: skip
        day.expect_firing(due, alert, **job)  # on time
        for t in (due + 600, due + 1200, end):  # and firing still: through blindness
            day.expect_firing(t, alert, **job)
        day.expect_pages(at=end, window=end, pages={alert: 1}, severities=CRITICAL)  # once
        day.expect_pages(at=end, window=end, pages={alert: 1, **warnings})  # nothing else
        day.expect_pages(at=starts - SCRAPE, window=starts, pages={})  # not before
    if lifecycle == "crash":
        assert day.value("rlhf_ray_actor_failures_total", role="trainer") == 1.0
    if lifecycle == "normal_end_sidecar":
        assert (
            sum(v for (n, _), v in fleet.head.last.items() if n == "rlhf_ray_actor_failures_total")
            == 0.0
        )
        assert day.value("rlhf_ray_actor_deaths_total", reason="OWNER_DIED") == 1.0
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


class AppendSink(FileSink):
    """verl's file logger appending to a log that already exists (no truncation at start)."""

    def __init__(self, path: Path):
        self.path = path


def test_an_exporter_restart_on_a_50_mb_log_fakes_no_history(tmp_path):
    """A job with a 50 MB log (thousands of steps, regressions among them) keeps stepping;
    its exporter restarts and re-reads the log over several scrapes (8 MiB a poll). The job
    is exported again only once read to its end: its counters never drop, so `increase()`
    counts no history again. Nothing pages: not at the first start, not at the restart (no
    fake RLHFJobRegression, no RLHFJobUnwatched for the few scrapes it is absent), and the
    job's stall clock is its file's, not the restart's."""
    day = Day(tmp_path)
    c = day.clock
    root = tmp_path / "fleet"
    path = root / "big" / "run.jsonl"
    path.parent.mkdir(parents=True)
    steps = trace_steps(trace("regression_update_v1"))
    n = 0
    with open(path, "wb") as f:
        while f.tell() < 50 << 20:
            group = steps[n % len(steps)]
            n += 1
            f.write(b"".join(orjson.dumps({"step": n, "data": r["data"]}) + b"\n" for r in group))
    # from now on the job runs steadily: the trace's steps before its regression (30-35)
    steady = tmp_path / "steady.jsonl"
    steady.write_bytes(b"".join(orjson.dumps(r) + b"\n" for group in steps[:29] for r in group))
    job = TraceJob(steady, AppendSink(path), "big", "run", step=n)
    target = day.target("fleet:19839", [VerlFileSource(day.th, [root], clock=c)])
    day.run(INJECT, [job])
    before = day.value("rlhf_steps_total", experiment="run")
    regressed = sum(v for (m, _), v in target.last.items() if m == "rlhf_regression_steps_total")
    assert before is not None and before > n - 10 and regressed > 3, (before, n, regressed)
    day.at(INJECT + SCRAPE, lambda: target.restart(c(), [VerlFileSource(day.th, [root], clock=c)]))
    day.run(INJECT + 2 * HOUR, [job])
    # the re-read took several scrapes, during which the job was absent (stale), never lower:
    # no scrape showed a partial history that Prometheus would take for a counter reset
    key = next(k for k in day.series if k[0] == "rlhf_steps_total")
    after = {k: v for k, v in day.series[key].items() if k * SCRAPE > INJECT + SCRAPE}
    assert min(v for v in after.values() if isinstance(v, float)) >= before
    k_restart = (INJECT + SCRAPE) // SCRAPE
    hidden = [k for k in range(k_restart, k_restart + 20) if not isinstance(after.get(k), float)]
    assert len(hidden) >= 3, hidden  # 50 MB at 8 MiB a poll, a poll a scrape
    day.expect_pages(at=INJECT + 2 * HOUR, window=INJECT + 2 * HOUR, pages={})
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
