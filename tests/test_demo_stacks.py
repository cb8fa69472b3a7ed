"""Where the demo's stall hangs: its stalled trainer's stacks, read by the real stacks source
from the demo's simulated Ray dashboard (rlhf_exporter/demo/dashboard.py), on the job page
within the demo's first five minutes, and only in its stall."""

from __future__ import annotations

from html import unescape

from rlhf_exporter.demo.dashboard import INTERVAL, DemoStacks
from rlhf_exporter.demo.job import EXPERIMENT, PROJECT, DemoJob
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.diagnosis.stall import StallLimit
from rlhf_exporter.job.state import Job
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.pages import Facts, Links, index_page, job_page
from tests.test_demo import _resolve

STEP = 0.7  # serve --demo's seconds a step
LINKS = Links.served()


def test_the_demo_stall_shows_where_it_hangs_within_five_minutes(tmp_path):
    """The `all` scenario on a simulated wall clock, as the demo's thread plays it: the
    stacks source takes a round exactly while the page says stalled (the stall limit on the
    demo's clock), only in the stall, within the first five minutes; the round folds the
    simulated dumps into where the trainer hangs, and the job page and `/` say it."""
    th = load_thresholds()
    demo = DemoJob(tmp_path, step_seconds=STEP, th=th)
    job = Job(PROJECT, EXPERIMENT, th)
    t = 0.0
    stacks = DemoStacks(
        demo, [lambda: [job.summary()]], StallLimit.of(th.alerts), clock=lambda: t, interval=3600
    )
    facts = Facts.of("t", "", "demo", True, th.alerts, clock=(PROJECT, EXPERIMENT, demo.clock.at))
    stacks.start()  # the dashboard serves; the thread's first poll sees no stall
    seen = []  # (wall time, phase, the page says stalled, a round was taken)
    found, samples = None, ()
    try:
        for wait, record in demo.timeline(0):
            if record is not None:
                demo.schedule(t + wait * STEP, record, start=t)
            end = t + wait * STEP
            while t < end:  # a stall check every INTERVAL of wall time, as the demo's
                t = min(end, t + INTERVAL)
                polled = stacks.poll()
                got = stacks.round_of(PROJECT, EXPERIMENT)
                samples = polled.samples if got is not None else samples
                stalled = facts.stalled(job.summary(), t) is not None
                seen.append((t, demo.phase.name, stalled, got is not None))
                found = (got if demo.phase.hangs else None) or found
            if record is not None:
                job.feed([Record(record["step"], record["data"])], now=t)
    finally:
        stacks.stop()
    rounds = [(at, phase) for at, phase, _, taken in seen if taken]
    assert rounds and rounds[0][0] < 300.0, rounds[:1]
    # in the stall, and in the step's time after it (the job runs again, its record not yet
    # written: the page still says stalled)
    stall = "stall: the job stopped writing steps"
    entered = {phase: at for at, phase, _, _ in reversed(seen)}
    assert stall in {phase for _, phase in rounds}
    assert all(phase == stall or at <= entered[phase] + STEP for at, phase in rounds), rounds
    assert all(stalled == taken for _, _, stalled, taken in seen)  # one judgement
    assert found is not None and not found.why
    answer = found.answer
    assert answer.startswith("trainer: 7 of 8 in collective (all_reduce in "), answer
    assert "WorkerDict 4205 in collective (all_gather_into_tensor in" in answer
    assert "driver: ray_get (ray.get in RayPPOTrainer.fit" in answer
    assert "on WorkerDict.update_actor)" in answer  # named from the dashboard's tasks
    assert "rollout: 8 of 8 in no_task" in answer
    summary = {**job.summary(), "stacks": found}
    page = unescape(job_page(summary, [], facts, LINKS))
    assert "Where it hangs" in page and "all_gather_into_tensor" in page
    assert "where it hangs: trainer: 7 of 8 in collective" in unescape(
        index_page([summary], [], facts, LINKS)
    )
    by_where = {
        (s.labels[2], s.labels[3]): s.value for s in samples if s.name == "rlhf_job_stalled_in"
    }
    assert by_where[("trainer", "collective")] == 8.0 and by_where[("driver", "ray_get")] == 1.0


def test_serve_demo_reads_its_stacks_unless_they_are_off(tmp_path, monkeypatch):
    import tempfile

    from rlhf_exporter.commands.serve import Sidecar

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for argv, wanted in (((), True), (("--no-stacks",), False)):
        sidecar = Sidecar(_resolve("--demo", *argv, "--listen", "127.0.0.1:0"))
        sidecar.start()
        try:
            assert isinstance(sidecar.stacks, DemoStacks) is wanted
            if wanted:
                assert sidecar.stacks in sidecar.sources and sidecar.stacks.interval <= INTERVAL
                assert sidecar.endpoints.stacks_of is not None
                assert "simulated Ray dashboard" in sidecar.stacks.describe()
        finally:
            sidecar.stop()
