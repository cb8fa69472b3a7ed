"""The demo: its scripted incidents show in the diagnosis, and its simulated GPUs and Ray
actors are published through the same snapshot path as the real sources, labelled as demo.

That every alert of the rules fires in an accelerated run of the timeline, and no other, is
tests/test_demo_alerts.py (the on-call issue's promtool harness).
"""

from __future__ import annotations

import pytest

from rlhf_exporter.demo.devices import GPU_NAME, DemoDevices
from rlhf_exporter.demo.scenario import INCIDENTS, NAMES, STALL_PAUSE, ActorLife, play, scenario
from rlhf_exporter.demo.simulator import encode
from rlhf_exporter.diagnosis import BatchDiagnoser
from rlhf_exporter.metrics.catalog import BY_NAME
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.serve import Exporter, parse_samples


def diagnose(name: str):
    records = [r for _, r in play(scenario(name), seed=0) if r is not None]
    data = b"".join(encode(r) for r in records)
    return records, list(BatchDiagnoser(load_thresholds()).diagnose(RecordReader().feed(data)))


def test_every_incident_shows_in_the_all_scenario():
    records, steps = diagnose("all")
    changes = {(d.change.change, d.change.regressed) for d in steps}
    assert ("regression", "update") in changes
    assert ("workload_shift", None) in changes
    verdicts = {d.verdict for d in steps}
    assert {"rollout", "sync", "update", "checkpoint", "reward", "logprob", "other"} <= verdicts
    assert any("timing_s/testing" in r["data"] for r in records)  # the long validation
    phases = [p.name for p in scenario("all")]
    for incident in INCIDENTS.values():
        assert all(p.name in phases for p in incident)
    pauses = [p for p, r in play(scenario("all")) if r is None]
    assert {p.pause for p in pauses} == {2, STALL_PAUSE}  # validation, stall (in steps' time)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "all"])
def test_one_incident_between_steady_steps(name):
    phases = scenario(name)
    assert phases[0].name == "steady" and phases[-1].name == "steady again"
    assert phases[1:-1] == INCIDENTS[name]


def test_unknown_scenario_is_refused():
    with pytest.raises(KeyError):
        scenario("nope")


class _Job:
    project, experiment = "demo", "grpo"  # the job the simulated GPUs serve

    def __init__(self, phases):
        self.phase = phases[0]
        self.rollout = ActorLife()


def _value(samples, name, *labels):
    return next(s.value for s in samples if s.name == name and s.labels == labels)


def test_devices_follow_the_phase_and_speak_the_catalog():
    phases = scenario("actor_restart") + INCIDENTS["gpus_idle"]
    job = _Job(phases)
    dev = DemoDevices(job, n_gpus=4)
    seen = []
    for phase in phases:
        job.rollout.enter(phase)
        job.phase = phase
        snap = dev.poll_once()
        assert snap.up and snap.collector == "demo"
        seen.append(snap.samples)
        for s in snap.samples:  # every series is a catalog metric with its labels
            assert len(s.labels) == len(BY_NAME[s.name].labels), s
    steady, dying, pending, restarted, _, idle = seen
    assert _value(dying, "rlhf_ray_actors", "rollout", "RESTARTING") == 1
    assert _value(dying, "rlhf_ray_actors", "rollout", "ALIVE") == 7
    assert _value(dying, "rlhf_ray_actor_deaths_total", "rollout", "WORKER_DIED") == 1
    assert _value(pending, "rlhf_ray_actors", "rollout", "RESTARTING") == 0
    assert _value(pending, "rlhf_ray_actors", "rollout", "PENDING_CREATION") == 1
    assert _value(pending, "rlhf_ray_actor_restarts_total", "rollout") == 0
    assert _value(restarted, "rlhf_ray_actors", "rollout", "PENDING_CREATION") == 0
    assert _value(restarted, "rlhf_ray_actors", "rollout", "ALIVE") == 8
    assert _value(restarted, "rlhf_ray_actor_restarts_total", "rollout") == 1
    assert _value(steady, "rlhf_ray_cluster_info", "demo", "demo-simulated") == 1
    gpu0 = ("0", "GPU-demo-0000-0000-0000-0000-000000000000", "demo", "grpo")  # with its job
    busy = _value(steady, "rlhf_gpu_utilization_ratio", *gpu0)
    low = _value(idle, "rlhf_gpu_utilization_ratio", *gpu0)
    assert busy > 0.8 and low < 0.1
    roles = {s.labels[2] for s in steady if s.name == "rlhf_gpu_role_memory_bytes"}
    assert roles == {"trainer", "rollout"}
    names = {s.labels[2] for s in steady if s.name == "rlhf_gpu_info"}
    assert names == {GPU_NAME}  # labelled as simulated


@pytest.mark.slow
def test_serve_demo_scenario_publishes_devices(tmp_path):
    with Exporter(
        tmp_path, "--demo", "--demo-scenario", "actor_restart", "--demo-step-seconds", "0.05"
    ) as exp:
        exp.wait_for(
            lambda: exp.value("rlhf_ray_actor_restarts_total", role="rollout") == 1,
            what="the simulated rollout actor restarted",
        )
        assert exp.value("rlhf_ray_actor_deaths_total", role="rollout", reason="WORKER_DIED") == 1
        assert exp.value("rlhf_exporter_collector_up", collector="demo") == 1
        assert exp.value("rlhf_gpu_utilization_ratio", gpu="0") > 0.5
        page = exp.get("/").text
        assert "Demo data" in page and "demo (simulated" in page
        exp.wait_for(lambda: "grpo-simulated" in exp.get("/").text)


def test_serve_refuses_an_unknown_scenario(tmp_path):
    exp = Exporter(tmp_path, "--demo", "--demo-scenario", "nope", ready=False)
    try:
        assert exp.popen.wait(30) == 2
        assert "unknown scenario 'nope'" in exp.output()
    finally:
        exp.terminate()


def test_devices_count_busy_seconds_on_the_given_clock():
    """A simulated clock (tests/test_demo_alerts.py) drives the GPUs' busy seconds."""
    now = [100.0]
    job = _Job(scenario("gpus_idle"))
    dev = DemoDevices(job, n_gpus=1, clock=lambda: now[0], wall=lambda: now[0])
    dev.poll_once()
    now[0] += 600.0
    snap = dev.poll_once()
    busy = _value(
        snap.samples,
        "rlhf_gpu_busy_seconds_total",
        "0",
        "GPU-demo-0000-0000-0000-0000-000000000000",
        "demo",
        "grpo",
    )
    assert 600 * 0.85 <= busy <= 600 * 0.91  # the steady phase's ~0.88, for 600 s
    assert snap.last_success == 700.0


def test_the_option_help_names_every_scenario():
    from rlhf_exporter.settings import OPTIONS

    (option,) = [o for o in OPTIONS if o.name == "demo_scenario"]
    assert all(name in option.help for name in NAMES)


def _idle_shares(phase, th):
    """(trainer idle in `rollout` windows, rollout idle outside them), each over its side's
    GPU-seconds, after six 240 s steps of `phase` joined through a board, as in the demo."""
    from rlhf_exporter.diagnosis.change import Baseline
    from rlhf_exporter.diagnosis.steps import classify
    from rlhf_exporter.diagnosis.timeline import rebuild
    from rlhf_exporter.join.board import WindowBoard

    job = _Job([phase])
    job.upcoming = []
    board = WindowBoard()
    now = [1000.0]
    dev = DemoDevices(job, n_gpus=4, clock=lambda: now[0], wall=lambda: now[0], windows=board)
    dev.poll_once()
    records = [r for _, r in play([phase], seed=1) if r is not None and r["step"]]
    for record in records[:6]:
        due = now[0] + 240.0
        job.upcoming.append((due, record))  # the step runs until its record is due
        while now[0] < due:
            now[0] += 15.0
            dev.poll_once()
        # the verl side: the record arrives when due, its step posted to the board
        d = classify(0, record["step"], record["data"], Baseline(th), th)
        board.post(("demo", "e"), rebuild(d.step, d.windows, d.timers, due, th))
    now[0] += 15.0
    samples = dev.poll_once().samples
    busy, total = {}, {}
    for s in samples:
        if s.name == "rlhf_window_gpu_busy_seconds_total":
            busy[s.labels[2], s.labels[3]] = s.value
        elif s.name == "rlhf_window_gpu_seconds_total":
            total[s.labels[2], s.labels[3]] = s.value
    assert {role for _, role in total} == {"rollout", "trainer"}
    roles = {s.labels[2] for s in samples if s.name == "rlhf_gpu_role_memory_bytes"}
    assert roles == {"rollout", "trainer"}

    def idle_share(role, inside):
        keys = [k for k in total if k[1] == role]
        idle = sum(total[k] - busy[k] for k in keys if (k[0] == "rollout") == inside)
        return idle / sum(total[k] for k in keys)

    return idle_share("trainer", True), idle_share("rollout", False)


def test_separated_devices_join_their_windows_like_nvml():
    """A separated phase: the simulated GPUs' samples go through a WindowJoiner from the
    board, as NVML's do; trainer GPUs idle in `rollout` windows when starved, rollout GPUs
    idle outside them when over-provisioned (the alerts' threshold is 0.3)."""
    from rlhf_exporter.thresholds_file import load_thresholds

    th = load_thresholds()
    (starved_phase,) = INCIDENTS["trainer_starved"]
    (over_phase,) = INCIDENTS["rollout_overprovisioned"]
    starved, over = _idle_shares(starved_phase, th), _idle_shares(over_phase, th)
    assert starved[0] > 0.5 and starved[1] < 0.1  # the trainer waits for samples
    assert over[1] > 0.5 and over[0] < 0.3  # the rollout waits for the trainer


def _resolve(*argv: str, environ=None):
    import argparse

    from rlhf_exporter import settings

    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.resolve(parser.parse_args(list(argv)), environ=environ or {})


def test_the_demo_is_only_the_demo_unless_real_collectors_are_asked_for():
    """`--demo` turns the real Ray and NVML collectors off (its own are simulated); a flag
    or a variable that names one turns it back on."""
    plain = _resolve()
    assert plain.ray and plain.nvml  # without the demo, both are on by default
    demo = _resolve("--demo")
    assert not demo.ray and not demo.nvml
    asked = _resolve("--demo", "--ray")
    assert asked.ray and not asked.nvml
    by_env = _resolve("--demo", environ={"RLHF_EXPORTER_NVML": "true"})
    assert by_env.nvml and not by_env.ray


def test_a_demo_scenario_without_the_demo_is_an_error():
    from rlhf_exporter.thresholds_file import ConfigError

    with pytest.raises(ConfigError, match="only with --demo"):
        _resolve("--demo-scenario", "stall")
    with pytest.raises(ConfigError, match="only with --demo"):
        _resolve(environ={"RLHF_EXPORTER_DEMO_SCENARIO": "stall"})
    assert _resolve("--demo", "--demo-scenario", "stall").demo_scenario == "stall"


def test_a_failed_demo_start_leaves_no_temp_dir(tmp_path, monkeypatch):
    """The demo's temporary root is made before the server listens: a port already taken
    fails the start, and the root goes with it."""
    import socket
    import tempfile

    from rlhf_exporter.commands.serve import Sidecar

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            Sidecar(_resolve("--demo", "--listen", f"127.0.0.1:{port}"))
    finally:
        taken.close()
    assert not list(tmp_path.glob("rlhf-exporter-demo-*"))


@pytest.mark.slow
def test_serve_demo_runs_no_real_collector(tmp_path):
    """Nothing but the demo's flags: no real Ray or NVML collector is exported or shown."""
    with Exporter(tmp_path, "--demo", defaults=False) as exp:
        text = exp.metrics_text()
        collectors = {
            dict(labels)["collector"]
            for name, labels in parse_samples(text)
            if name == "rlhf_exporter_collector_up"
        }
        # the engines and stacks collectors are the real sources, reading the demo's simulated
        # vLLMs and its simulated Ray dashboard's py-spy dumps
        assert collectors == {"verl", "push", "demo", "engines", "stacks"}
        page = exp.get("/").text
        assert 'data-up="0"' not in page and "Demo data" in page


def _live(name: str, steps: int, step_seconds: float = 0.7):
    """`serve --demo`'s pace: `steps` records of scenario `name`, one every `step_seconds`
    of wall time, each played by the devices once due (polled every second)."""
    from rlhf_exporter.diagnosis.balance import balance
    from rlhf_exporter.join.board import WindowBoard

    th = load_thresholds()
    now = [1000.0]
    job = _Job(scenario(name))
    job.upcoming = []
    job.project, job.experiment = "demo", "grpo-simulated"
    dev = DemoDevices(
        job, n_gpus=8, clock=lambda: now[0], wall=lambda: now[0], windows=WindowBoard(), th=th
    )
    played = [(p, r) for p, r in play(scenario(name), seed=0) if r is not None and r["step"]]
    next_poll = now[0] + 1.0
    for phase, record in played[:steps]:
        job.phase = phase
        now[0] += step_seconds
        job.upcoming.append((now[0], record))
        while next_poll <= now[0]:
            dev.poll_once()
            next_poll += 1.0
    dev.poll_once()
    counters, wall = dev.joiner.view[("demo", "grpo-simulated")]
    return counters, balance(counters, wall, th.document["balance"]), now[0] - 1000.0


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        ("trainer_starved", "trainer_starved"),
        ("rollout_overprovisioned", "rollout_overprovisioned"),
    ],
)
def test_the_live_demo_shows_who_waits_on_whom_within_a_minute(name, verdict):
    """At 0.7 s a step, the simulated GPUs work in phase with each step's windows (on the
    demo clock): every window group has GPU-seconds, and the scripted incident is the
    balance verdict in under a minute of wall time."""
    counters, result, seconds = _live(name, steps=12 + 15)  # steady, then the incident
    assert seconds < 60
    assert result is not None and result.verdict == verdict, result
    groups = {g for g, _ in counters}
    assert {"rollout", "logprob", "update", "sync", "other"} <= groups, groups
    # the steady (colocated) steps: busy generating and training, idle in untimed time
    busy = {g: b / t for (g, role), (b, t) in counters.items() if role == "colocated"}
    assert busy["rollout"] > 0.8 and busy["update"] > 0.8 and busy["other"] < 0.1, busy
    # the separated ones: the rollout GPUs busy in `rollout` windows, the trainer's not
    side = {(g, role): b / t for (g, role), (b, t) in counters.items() if role != "colocated"}
    assert side["rollout", "rollout"] > 0.8 and side["rollout", "trainer"] < 0.1, side
    assert side["update", "trainer"] > 0.8, side
    if name == "rollout_overprovisioned":
        assert side["update", "rollout"] < 0.1, side  # idle while the trainer works
    else:
        assert side["update", "rollout"] > 0.8, side  # generating ahead


def _stalled_job(on_demo_clock: bool):
    """The `stall` scenario's steps to its pause, at 0.7 s a step, into a job on the demo's
    clock (or the wall's), fed as the verl source feeds it: (job, demo clock, last step)."""
    from rlhf_exporter.demo.clock import DemoClock
    from rlhf_exporter.diagnosis import Record
    from rlhf_exporter.job.state import Job
    from rlhf_exporter.join.ports import WALL

    th = load_thresholds()
    clock = DemoClock(th)
    job = Job("demo", "grpo", th, job_clock=clock if on_demo_clock else WALL)
    t = 0.0
    for phase, record in play(scenario("stall")):
        if record is None:  # the stall's pause
            return job, clock, t
        if record["step"]:
            clock.step(t, t + 0.7, phase, record)
            t += 0.7
        job.feed([Record(record["step"], record["data"])], now=t)
    raise AssertionError("no stall")


def test_the_demo_job_exports_its_last_step_aged_on_its_own_clock():
    """In the stall, `time() - rlhf_last_step_timestamp_seconds` is the last step's age on
    the demo's clock (~135x the wall's), the age the pages judge; a real job's (the wall
    clock's) is the step's own time, and its series do not change as time passes."""
    job, clock, last = _stalled_job(True)
    for wait in (0.0, 5.0, 60.0):
        now = last + wait
        job.tick(now)
        aged = _value(job.samples(), "rlhf_last_step_timestamp_seconds", "demo", "grpo")
        assert now - aged == pytest.approx(clock.at(now) - clock.at(last))
        assert now - aged == pytest.approx(wait * 95 / 0.7, rel=0.15)  # ~95 s a step
    assert job.summary()["last_step_time"] == last  # what the pages age on the demo clock

    real, _, last = _stalled_job(False)
    before = real.samples()
    real.tick(last + 3600.0)
    assert real.samples() is before  # unchanged: not even rebuilt
    assert _value(before, "rlhf_last_step_timestamp_seconds", "demo", "grpo") == last
