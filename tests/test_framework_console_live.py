"""`serve --ray-address ... --console` on a real Ray head gives, for each framework's job,
what `diagnose` gives on the same printed output: every step's verdict, reason and change,
and the framework as `rlhf_job_framework_info`.

Each job is a real Ray job submitted with the Job Submission API, its entrypoint replaying a
framework fixture (tests/fixtures/frameworks/<framework>/regression.console.log, written by
the framework's own logging code) a step at a time, from where the framework prints it:

- AReaL, NeMo-RL, ROLL: the driver itself, on stdout (read from the job's driver log);
- OpenRLHF: a named `PPOTrainer` actor, on stdout (read from the actor's own stdout; the
  same lines Ray forwards into the driver log are not read twice);
- slime: a `RolloutManager` and a `MegatronTrainRayActor` actor, on stderr (read from the
  driver log, where Ray forwards both); each step's trainer half is printed before its
  rollout half, so a step classified from its first half alone would miss its rollout.

Every job is named by its submission's metadata (project, experiment), as verl's are.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from pathlib import Path

import pytest

from rlhf_exporter.cli import main
from rlhf_exporter.diagnosis.change import contract_change
from rlhf_exporter.sources.console import ConsoleSource
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.thresholds_file import load_thresholds

from .support.procs import wait_until
from .support.serve import Exporter

ray = pytest.importorskip("ray")
from ray.job_submission import JobStatus, JobSubmissionClient  # noqa: E402

from .support.ray_head import RayHead, auth_env  # noqa: E402

ROOT = Path(__file__).parent / "fixtures" / "frameworks"
FRAMEWORKS = ("openrlhf", "areal", "nemo_rl", "slime", "roll")
REGIME = "regression"
PACE = 0.6  # seconds between two steps of a replay (a job runs longer than a list's interval)
PROJECT = "fw-live"

REPLAY = r"""
import re, sys, time
framework, path, pace = sys.argv[1], sys.argv[2], float(sys.argv[3])
lines = open(path, "rb").read().decode("utf-8").splitlines(keepends=True)
STEP = re.compile(r"Global step \d+:|perf \d+:|metrics_tag:|Train step \d+/\d+ done|=+ Step \d+/")


def replay(out, lines):
    for line in lines:
        out.write(line)
        out.flush()
        if STEP.search(line):
            time.sleep(pace)


class Printer:
    def say(self, lines, stream):
        replay(sys.stderr if stream == "err" else sys.stdout, lines)
        return len(lines)


def actor(name):
    import ray
    cls = type(name, (Printer,), {"__qualname__": name, "__module__": "__main__"})
    return ray.remote(num_cpus=0)(cls).options(name=name).remote()


if framework == "openrlhf":  # the PPO trainer actor prints every step
    import ray
    ray.init()
    trainer = actor("PPOTrainer")
    ray.get(trainer.say.remote(lines, "out"))
elif framework == "slime":  # two actors print a half of each step each, to stderr
    import ray
    ray.init()
    rollout, trainer = actor("RolloutManager"), actor("MegatronTrainRayActor")
    halves = [[], []]  # (rollout's, trainer's) lines of the step being printed
    for line in lines:
        halves["rollout" not in line].append(line)
        if "train_metric_utils" in line:  # the trainer's half ends the step: it goes first
            ray.get(trainer.say.remote(halves[1], "err"))
            ray.get(rollout.say.remote(halves[0], "err"))
            halves = [[], []]
    ray.get(trainer.say.remote(halves[1], "err"))
    ray.get(rollout.say.remote(halves[0], "err"))
    time.sleep(1.0)  # Ray forwards the actors' last lines to this driver's log
else:  # the driver prints every step
    replay(sys.stdout, lines)
"""


def diagnosed(path: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[int, str, str, str]]:
    """`diagnose`'s (step, verdict, reason, change) of every step of a printed output."""
    capsys.readouterr()
    assert main(["diagnose", "--format", "jsonl", str(path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [
        (r["step"], r["verdict"], r["reason"] or "", r["change"]) for r in rows if "verdict" in r
    ]


_VERDICT = re.compile(
    r'<rect class="verdict" data-verdict="(\w+)"[^>]*><title>step (-?\d+): ([^<]*)</title>'
)
_MARKER = re.compile(r'<text class="marker" data-step="(-?\d+)" data-change="(\w+)"')


def served(page: str) -> list[tuple[int, str, str, str]]:
    """The job page's (step, verdict, reason, change) of every step it draws."""
    changes = {int(s): c for s, c in _MARKER.findall(page)}
    out = []
    for verdict, step, title in _VERDICT.findall(page):
        reason = html.unescape(title).partition(": ")[2]
        out.append((int(step), verdict, reason, changes.get(int(step), "none")))
    return out


@pytest.fixture(scope="module")
def head():
    os.environ.update(auth_env(None))  # the Job Submission client's, as the head's
    h = RayHead("fwlive", num_cpus=4)
    try:
        yield h
    finally:
        h.stop(grace=2.0)


def test_every_framework_through_the_console_route_is_diagnosed_as_diagnose_says(
    head, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    client = JobSubmissionClient(head.dashboard_url)
    with Exporter(
        tmp_path / "serve", "--ray", "--ray-address", head.dashboard_url, "--ray-interval", "1",
        "--console", "--console-interval", "0.5",
    ) as exp:  # fmt: skip
        submitted = {}
        for fw in FRAMEWORKS:
            fixture = ROOT / fw / f"{REGIME}.console.log"
            submitted[fw] = client.submit_job(
                entrypoint=f"{sys.executable} {script} {fw} {fixture} {PACE}",
                metadata={"project": PROJECT, "experiment": fw},
            )
        for fw, sid in submitted.items():
            wait_until(lambda sid=sid: client.get_job_status(sid).is_terminal(), 240, 0.5,
                       what=f"{fw}'s job to end")  # fmt: skip
            status = client.get_job_status(sid)
            assert status == JobStatus.SUCCEEDED, (fw, client.get_job_logs(sid)[-3000:])
        for fw in FRAMEWORKS:
            want = diagnosed(ROOT / fw / f"{REGIME}.console.log", capsys)
            path = f"/jobs/{PROJECT}/{fw}"

            def same(path: str = path, want: list = want) -> bool:
                r = exp.get(path)
                return r.status_code == 200 and served(r.text) == want

            exp.wait_for(same, 90, what=f"{fw}'s steps on its job page")
            assert len(want) >= 15
            (info,) = exp.series("rlhf_job_framework_info", project=PROJECT, experiment=fw)
            assert dict(info)["framework"] == fw
        jobs = {j["experiment"]: j for j in exp.get("/api/v1/jobs").json()["jobs"]}
        for fw in FRAMEWORKS:
            want = diagnosed(ROOT / fw / f"{REGIME}.console.log", capsys)
            assert jobs[fw]["framework"] == fw
            assert jobs[fw]["verdict"] == want[-1][1], (fw, jobs[fw])
        errors = exp.series("rlhf_exporter_record_errors_total", collector="console")
        lost = {dict(k)["reason"]: v for k, v in errors.items() if v}
        assert not lost, lost  # no half step, no step counted twice, nothing dropped


class Gate:
    """The Ray source's trainer actors, hidden until `open`: a sidecar whose console source
    reads a job's driver log before its Ray source has listed the job's trainer actor."""

    def __init__(self, inner: RaySource):
        self.inner, self.open = inner, False

    @property
    def trainers_seen(self) -> bool:
        return self.open and self.inner.trainers_seen

    def trainer_actors(self):
        return self.inner.trainer_actors()

    def submission_fact(self, job_id: str):
        return self.inner.submission_fact(job_id)


def test_a_trainers_steps_forwarded_into_the_driver_log_are_read_once(
    head, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenRLHF's trainer prints its steps; Ray forwards them into the driver log too. The
    driver log is read first (the trainer actor not listed yet), then the trainer's own
    stdout: every step is read once, from the trainer, as `diagnose` reads the output."""
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    fixture = ROOT / "openrlhf" / f"{REGIME}.console.log"
    client = JobSubmissionClient(head.dashboard_url)
    sid = client.submit_job(
        entrypoint=f"{sys.executable} {script} openrlhf {fixture} {PACE}",
        metadata={"project": PROJECT, "experiment": "forwarded"},
    )
    ray_src = RaySource(head.dashboard_url, interval=0.5, timeout=10.0)
    gate = Gate(ray_src)
    console = ConsoleSource(load_thresholds(None), gate, head.dashboard_url, interval=0.2,
                            drivers_every=0.5)  # fmt: skip

    def driver_read_a_trainer_step() -> bool:
        ray_src.poll_once()
        console.poll_once()
        tails = [t for cj in console._jobs.values() for t in cj.tails.values() if t.driver]
        return any(b"(PPOTrainer pid=" in t.last_bytes and b"Global step" in t.last_bytes
                   for t in tails)  # fmt: skip

    wait_until(driver_read_a_trainer_step, 120, 0.2, what="the driver log's forwarded steps")
    gate.open = True
    want = diagnosed(fixture, capsys)

    def all_steps() -> list:
        ray_src.poll_once()
        console.poll_once()
        jobs = [cj.job for cj in console._jobs.values() if cj.job is not None]
        if len(jobs) != 1:
            return []
        points = [(p.step, p.verdict, p.reason or "", contract_change(p.change))
                  for p in jobs[0]._history]  # fmt: skip
        return points if points == want else []

    wait_until(all_steps, 120, 0.2, what="every step, once, from the trainer")
    ((cj,),) = [[cj for cj in console._jobs.values() if cj.job is not None]]
    assert cj.job.labels == (PROJECT, "forwarded") and cj.job.run == 0
    assert [t.driver for t in cj.tails.values()] == [False]  # the driver log: closed
    assert not {r: n for r, n in console.snapshot().record_errors.items() if n}
    wait_until(lambda: client.get_job_status(sid).is_terminal(), 120, 0.5, what="the job's end")
    console.close()
