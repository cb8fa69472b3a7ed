"""The demo exercises every alert: each alert of `alerts/*.rules.yaml` fires at least once in
an accelerated run of the demo's timeline, in the incident that scripts it, and no other
alert fires.

The demo job (rlhf_exporter/demo/job.py: its scenario `all`), its simulated GPUs and Ray actors
(`DemoDevices`) and the real verl file source run on the simulated day's clock
(tests/support/simday.py): the job writes one step every `STEP` simulated seconds, as
`serve --demo` does every `--demo-step-seconds`, and the exporter is scraped every 15 s into
a `promtool test rules` input with the real rule files at their real thresholds (`for:` and
windows unchanged, rules evaluated every minute).

The job's incidents fire the job, GPU and Ray alerts, over the demo's first run (five
incidents, its stall, then the others). The exporter's own alerts are about infrastructure,
which the demo does not simulate; they are injected here, during the stall's long pause, the
way tests/test_simulated_day.py injects failures:
- RLHFExporterCollectorDown: the simulated devices' polls fail for 8 minutes;
- RLHFExporterCollectorStale: the simulated devices are not polled for 25 minutes (a poll
  thread that never runs again), while their collector still reports up;
- RLHFExporterDown: the exporter cannot be scraped for 8 minutes;
- RLHFExporterAbsent: the exporter is no target at all for 8 minutes (dropped from service
  discovery).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rlhf_exporter.demo.devices import DemoDevices
from rlhf_exporter.demo.job import EXPERIMENT, PROJECT, DemoJob
from rlhf_exporter.demo.scenario import INCIDENTS, STALL_PAUSE, scenario
from rlhf_exporter.demo.simulator import encode
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.render.rules import gpuhealth, remotewrite
from rlhf_exporter.render.rules.model import Context
from rlhf_exporter.sources.base import SourceError
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support.simday import RULE_FILES, SCRAPE, Day

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")

STEP = 240  # simulated seconds per demo step: the incidents outlast the rules' `for:`
INSTANCE = "demo:19839"
HOUR = 3600.0


class DemoRun:
    """The demo job's runs (`DemoJob.timeline`) written at simulated times, as its thread
    writes them at wall times: each record `STEP` seconds after the last, pauses in steps'
    time, and a new run (the file truncated) after the last phase."""

    def __init__(self, job: DemoJob, step: float):
        self.job, self.step = job, step
        self.at = 0.0
        self.loops = 0
        self.phases: dict[str, tuple[float, float]] = {}  # phase name -> entered, last record
        self._new_run()

    def _new_run(self) -> None:
        self.job.path.parent.mkdir(parents=True, exist_ok=True)
        self.job.path.write_bytes(b"")  # "wb", as verl (and the demo job) at every start
        self._it = self.job.timeline(self.job.seed + self.loops)
        self._due = self._pull()

    def _pull(self) -> tuple[dict | None] | None:
        """The next record (or pause) and its time; the job's phase changes now."""
        try:
            wait, record = next(self._it)
        except StopIteration:
            return None
        name = self.job.phase.name  # the devices follow the phase from here, the wait included
        self.phases.setdefault(name, (self.at, self.at))
        self.at += wait * self.step
        if record is not None:  # the step runs until its record is due, as in the thread
            self.job.schedule(self.at, record)
        return (record,)

    def advance(self, now: float) -> None:
        while True:
            if self._due is None:
                self.loops += 1
                self._new_run()
                continue
            if self.at > now:
                return
            (record,) = self._due
            if record is not None:
                with open(self.job.path, "ab") as f:
                    f.write(encode(record))
                name = self.job.phase.name
                self.phases[name] = (self.phases[name][0], self.at)
            self._due = self._pull()


def _rule_alerts() -> set[str]:
    return {
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


# alert (with its distinguishing label) -> the first and the last phase of its incident: it
# fires at least once, and only from the first phase's start to LATE after the last one's end.
# The bottleneck's moves are also regressions of the group that became slow: it costs more
# seconds per token than the job's own baseline, with no more tokens to explain it.
JOB_ALERTS: dict[tuple[str, str], tuple[str, str]] = {
    # separated: the same records as the phases around them, the GPUs apart (GPU-window join)
    ("RLHFTrainerStarved", ""): ("trainer starved", "trainer starved"),
    ("RLHFRolloutOverprovisioned", ""): ("rollout over-provisioned", "rollout over-provisioned"),
    ("RLHFJobSyncBound", ""): ("sync-bound", "sync-bound"),
    ("RLHFJobRegression", "sync"): ("sync-bound", "sync-bound"),
    ("RLHFJobUpdateBound", ""): ("update-bound", "regression"),  # over-provisioned included
    ("RLHFJobRegression", "update"): ("update-bound", "regression"),
    ("RLHFRayActorsDied", "rollout"): ("rollout actor died", "rollout actor died"),
    ("RLHFRayActorsPending", "rollout"): ("its replacement waits", "its replacement waits"),
    ("RLHFRayActorsRestarting", "rollout"): ("rollout actor restarted", "rollout actor restarted"),
    # back to rollout-bound after the checkpoint; then rollout slows again
    ("RLHFJobRegression", "rollout"): ("rollout actor died", "moves: rollout"),
    ("RLHFGPUsIdleWhileStepping", ""): ("GPUs idle", "GPUs idle"),
    # the bottleneck moved from update: at this pace the 6 hours before the actor's death
    # hold only the update-bound steps after the stall's 28 hours (the shift, the regression)
    ("RLHFJobRolloutBound", ""): ("rollout actor died", "moves: rollout"),
    ("RLHFJobRegression", "reward"): ("moves: a colocated reward", "moves: a colocated reward"),
    ("RLHFJobRewardBound", ""): ("moves: a colocated reward", "moves: a colocated reward"),
    ("RLHFJobRegression", "logprob"): ("moves: log-prob", "moves: log-prob"),
    ("RLHFJobLogprobBound", ""): ("moves: log-prob", "moves: log-prob"),
    ("RLHFJobRegression", "other"): ("moves: driver", "moves: driver"),
    ("RLHFJobDriverOverheadBound", ""): ("moves: driver", "moves: driver"),
    ("RLHFJobThroughputBelowBaseline", ""): ("moves: log-prob", "moves: driver"),  # both halve it
    ("RLHFJobStalled", ""): ("stall", "stall"),  # until the job steps again
}
LABEL = {"RLHFJobRegression": "group"}
LABEL.update({a: "collector" for a in ("RLHFExporterCollectorDown", "RLHFExporterCollectorStale")})
LABEL.update({a: "role" for a in ("RLHFRayActorsDied", "RLHFRayActorsPending")})
LABEL["RLHFRayActorsRestarting"] = "role"
(STALL,) = INCIDENTS["stall"]
AFTER_STALL = scenario("all")[scenario("all").index(STALL) + 1]
LATE = HOUR  # an incident's alerts resolve within this after it ends (30m windows, `for:`)
RECOVER = 2 * 60  # an injected failure's alert resolves within this after its end


def _phase(run: DemoRun, prefix: str) -> tuple[float, float]:
    """(entered, last record) of the one phase whose name contains `prefix`."""
    (times,) = [t for name, t in run.phases.items() if prefix in name]
    return times


def _fires_only_within(day: Day, end: float, alert: str, value: str, a: float, z: float):
    """promtool: `alert` (with its LABEL = `value`) fired, only between `a` and `z`."""
    matcher = f', {LABEL[alert]}="{value}"' if value else ""
    series = f'timestamp(ALERTS{{alertstate="firing", alertname="{alert}"{matcher}}})'
    day.checks.append(
        {
            "expr": (
                f"count(min_over_time({series}[{int(end)}s:60s]) >= {int(a)}"
                f" and max_over_time({series}[{int(end)}s:60s]) <= {int(z)})"
            ),
            "eval_time": f"{int(end)}s",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
    )


def test_the_demo_fires_every_alert_in_its_incident_and_no_other(tmp_path):
    day = Day(tmp_path, evaluation=60)  # every minute, as the simulated healthy day
    c = day.clock
    root = tmp_path / "demo-root"
    job = DemoJob(root, step_seconds=STEP)
    run = DemoRun(job, STEP)
    board = WindowBoard()  # as `serve --demo` wires it: the job posts, the devices join
    devices = DemoDevices(job, clock=c, wall=c, windows=board, th=day.th)
    # at this pace the stall's pause lasts 28 hours, past the verl source's default job
    # expiry (a day, after which an unchanged file's job is no longer exported); the live
    # demo's lasts 4.9 minutes: the job stays exported through it, as there
    verl = VerlFileSource(day.th, [root], clock=c, windows=board, job_expiry=2 * STALL_PAUSE * STEP)
    target = day.target(INSTANCE, [verl, devices])

    # the job's timeline, to the stall's alert
    day.run(1.0, [run])
    stall_at = None
    while stall_at is None:
        day.run(day.scrapes * SCRAPE + HOUR, [run])
        if "stall" in " ".join(run.phases):
            stall_at = _phase(run, "stall")[0]
    assert run.loops == 0

    # the infrastructure, during the stall's pause (the job writes nothing for 420 steps)
    t0 = stall_at + 1 * HOUR
    poll = devices.poll

    def failing_poll():
        raise SourceError("demo_failure", "the simulated devices fail (injected)")

    day.at(t0, lambda: setattr(devices, "poll", failing_poll))
    day.at(t0 + 8 * 60, lambda: setattr(devices, "poll", poll))
    t1 = t0 + 30 * 60
    # the harness polls a source when its next poll is due: not for 25 minutes
    day.at(t1, lambda: target._next_poll.__setitem__(devices.name, t1 + 25 * 60))
    t2 = t1 + 55 * 60
    day.at(t2, lambda: setattr(target, "up", False))
    day.at(t2 + 8 * 60, lambda: setattr(target, "up", True))
    t3 = t2 + 30 * 60
    day.at(t3, lambda: setattr(target, "scraped", False))
    day.at(t3 + 8 * 60, lambda: setattr(target, "scraped", True))
    assert t3 + 45 * 60 < stall_at + STALL_PAUSE * STEP, "the pause outlasts the injections"

    # the rest of the run, to a scrape before its last record (then it starts over)
    run_end = sum(p.steps + p.pause for p in job.phases) * STEP
    day.run(run_end - SCRAPE, [run])
    assert run.loops == 0

    # the run did what the timeline says
    assert day.value("rlhf_ray_actor_deaths_total", role="rollout") == 1.0
    assert day.value("rlhf_ray_actor_restarts_total", role="rollout") == 1.0
    assert day.value("rlhf_between_steps_max_seconds", experiment=EXPERIMENT) == 240.0
    assert day.value("rlhf_run", project=PROJECT, experiment=EXPERIMENT) == 0.0  # the first run
    # the separated phases went through the GPU-window join: each side has GPU-seconds
    for role in ("trainer", "rollout"):
        assert day.value("rlhf_window_gpu_seconds_total", gpu_role=role, group="rollout") > 600
    # its incidents' alerts resolve, and the next run plays its first phases
    end = run_end + LATE
    day.run(end, [run])
    names = [p.name for p in job.phases]  # the next run is before its stall
    assert run.loops == 1 and names.index(job.phase.name) < names.index(STALL.name)

    # every alert of the rules is scripted, and fires in its incident only
    infra = {
        ("RLHFExporterCollectorDown", "demo"): (t0, t0 + 8 * 60 + RECOVER),
        ("RLHFExporterCollectorStale", "demo"): (t1, t1 + 25 * 60 + RECOVER),
        ("RLHFExporterDown", ""): (t2, t2 + 8 * 60 + RECOVER),
        ("RLHFExporterAbsent", ""): (t3, t3 + 8 * 60 + RECOVER),
    }
    # the GPU health alerts (issue 23) are not scripted: the demo's simulated GPUs have no
    # faults (tests/test_gpu_health_rules.py, test_gpu_windows_multinode.py and
    # test_simulated_day_gpu.py fire them); here they must stay quiet all run long.
    # The demo's job neither fails nor loses its exporter while it steps: those two lifecycle
    # pages are shown by tests/test_lifecycle_live.py, tests/test_simulated_day.py and the
    # promtool cases of tests/test_rules.py (issue 22)
    health = {a.name for a in gpuhealth.alerts(Context(day.th))}
    lifecycle = {"RLHFJobFailed", "RLHFJobUnwatched"}
    lifecycle |= {a.name for a in remotewrite.alerts(Context(day.th))}  # no store in the demo
    assert {a for a, _ in [*JOB_ALERTS, *infra]} | health == _rule_alerts() - lifecycle
    day.checks.append(
        {
            "expr": (
                'count(max_over_time(ALERTS{alertstate="firing", '
                f'alertname=~"{"|".join(sorted(health))}"}}[{int(end)}s:60s]))'
            ),
            "eval_time": f"{int(end)}s",
            "exp_samples": [],
        }
    )
    for (alert, value), (first, last) in JOB_ALERTS.items():
        z = _phase(run, last)[1] + LATE
        if alert == "RLHFJobStalled":  # resolved at the first evaluation after a step again
            z = _phase(run, AFTER_STALL.name)[0] + STEP + RECOVER
        _fires_only_within(day, end, alert, value, _phase(run, first)[0], z)
    for (alert, value), (a, z) in infra.items():
        _fires_only_within(day, end, alert, value, a, z)

    # and nothing else fires: each (alert, label) above is the one series of its kind
    def labels(alert: str, value: str) -> str:
        return "{" + f'alertname="{alert}"' + (f', {LABEL[alert]}="{value}"' if value else "") + "}"

    by = ", ".join(sorted({"alertname", *LABEL.values()}))
    day.checks.append(
        {
            "expr": f'count by ({by}) (max_over_time(ALERTS{{alertstate="firing"}}[{int(end)}s]))',
            "eval_time": f"{int(end)}s",
            "exp_samples": [
                {"labels": labels(a, v), "value": 1} for a, v in sorted({*JOB_ALERTS, *infra})
            ],
        }
    )
    result = day.check()
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_demo_run_plays_the_timeline_in_simulated_time(tmp_path):
    """The harness's player writes what the demo job's thread writes, at STEP a step."""
    job = DemoJob(tmp_path, step_seconds=STEP)
    run = DemoRun(job, STEP)
    run.advance(0.0)
    assert job.path.read_bytes().count(b"\n") == 1  # step 0: the initial validation
    run.advance(10 * STEP)
    assert job.path.read_bytes().count(b"\n") == 11
    assert job.phase.name.startswith("steady")
    assert Path(job.path).parent.name == PROJECT
