"""The join: each step's rollout window (from the timeline the GPU join builds) + the engines'
samples -> the step's reason and the exported evidence (issue 29, done-when 1 and 2).

A V1 trace and a fully-async trace are replayed in simulated time; simulated vLLM/SGLang
servers play a scenario in phase with the steps' rollout windows (a shadow job without
engines, fed the same records at the same times, gives those windows); the engine source
reads them over HTTP every second of the windows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import Record
from rlhf_exporter.diagnosis.engines import EngineLimits, rollout_spans
from rlhf_exporter.job.state import Job
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import EngineSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.sim_engine import EngineSim, SimClock, scenario

TRACES = Path(__file__).parent / "fixtures" / "traces"
T0 = 2_000_000.0
STEPS = 5
# The engines are read twice a second around the windows (the contract asks at least once):
# a fully-async record places two rollout spans, and at 1 Hz each span edge costs up to a
# second of samples, which alone puts a long tail's mean 6-7 % off the fine-grained truth.
POLL = 0.5


def steps_of(trace: str) -> list[list[Record]]:
    """The trace's records grouped by step, first STEPS steps with a timing_s/step."""
    out: list[list[Record]] = []
    current: list[Record] = []
    for line in (TRACES / trace).read_text().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        current.append(Record(doc["step"], doc["data"]))
        if "timing_s/step" in doc["data"]:
            out.append(current)
            current = []
            if len(out) == STEPS:
                break
    return out


def value(samples, name: str, **labels: str) -> float | None:
    from rlhf_exporter.metrics.catalog import BY_NAME

    names = BY_NAME[name].labels
    for s in samples:
        if s.name == name and all(s.labels[names.index(k)] == v for k, v in labels.items()):
            return s.value
    return None


def replay(trace: str, scenario_name: str | None):
    """(job, shadow job, engine sim, per-step spans) after the trace's first steps."""
    th = load_thresholds(None)
    clock = SimClock(T0)
    groups = steps_of(trace)
    arrivals, t = [], T0
    for recs in groups:
        t += float(recs[-1].data["timing_s/step"]) + 0.3
        arrivals.append(t)
    shadow_board = WindowBoard()
    shadow = Job("p", "e", th, clock=clock, windows=shadow_board)
    for recs, at in zip(groups, arrivals, strict=True):
        clock.t = at
        shadow.feed(recs)
    timelines = {tl.step: tl for tl in shadow_board.recent(("p", "e"))}
    spans = {step: rollout_spans(tl.intervals) for step, tl in timelines.items()}
    windows = sorted(w for ss in spans.values() for w in ss)
    replicas, expected = scenario(scenario_name or "healthy")
    sim = EngineSim(replicas, windows, clock).start()
    board = WindowBoard()
    source = EngineSource(
        Targets(static=sim.urls() if scenario_name else ()),
        interval=1.0,
        timeout=2.0,
        clock=clock,
        active=lambda: True,
        limits=EngineLimits.from_document(th.document),
    )
    job = Job("p", "e", th, clock=clock, windows=board, engines=source)
    clock.t = T0
    for recs, at in zip(groups, arrivals, strict=True):
        while clock.t < at:  # read the engines every second around the rollout windows
            if any(a - 2.0 <= clock.t <= b + 1.0 for a, b in windows):
                source.poll()
            clock.t += POLL
        clock.t = at
        job.feed(recs)
    source.close()
    return job, shadow, sim, spans, expected


@pytest.mark.parametrize("trace", ["rollout_generation_v1.jsonl", "fully_async_rollout.jsonl"])
@pytest.mark.parametrize("name", ["queueing", "kv_preemption", "long_tail"])
def test_rollout_bound_steps_get_the_engines_reason(trace: str, name: str) -> None:
    job, shadow, sim, spans, expected = replay(trace, name)
    try:
        assert job.last is not None and shadow.last is not None
        assert job.last.verdict == shadow.last.verdict == "rollout"
        assert shadow.last.reason in ("generation", "long_tail")  # the log alone
        assert job.last.reason == expected
        assert job.reason_steps["rollout", expected] >= STEPS - 1  # the first may be partial
        samples = job.samples()
        assert value(samples, "rlhf_bottleneck_reason", verdict="rollout", reason=expected) == 1.0
        assert value(samples, "rlhf_engine_evidence_usable") == 1.0
        truth = sim.truth(spans[job.last.step])
        for metric, key in (
            ("rlhf_engine_running_requests_peak", "peak_running"),
            ("rlhf_engine_running_requests_mean", "running_mean"),
            ("rlhf_engine_waiting_requests_mean", "waiting_mean"),
            ("rlhf_engine_kv_cache_usage_max_ratio", "kv_max"),
            ("rlhf_engine_window_preemptions", "preemptions"),
        ):
            got = value(samples, metric)
            assert got is not None and abs(got - truth[key]) <= 0.05 * truth[key] + 1e-6, (
                metric,
                got,
                truth[key],
            )
        for cond in ("kv_pressure", "queueing", "long_tail"):
            got = value(samples, "rlhf_engine_window_share_ratio", condition=cond)
            assert got is not None and abs(got - truth[f"{cond}_share"]) <= 0.05, (cond, got)
        per_replica = sorted(
            s.value for s in samples if s.name == "rlhf_engine_replica_generated_tokens"
        )
        want = sorted(truth["tokens"].values())
        assert len(per_replica) == len(want)
        for got, w in zip(per_replica, want, strict=True):
            assert abs(got - w) <= 0.05 * w
        assert "engine_queueing_share" in job.last.evidence
        assert job.summary()["engine"]["usable"] is True
    finally:
        sim.stop()


@pytest.mark.parametrize("trace", ["rollout_generation_v1.jsonl", "fully_async_rollout.jsonl"])
def test_without_engines_nothing_changes(trace: str) -> None:
    """No engine targets: every step's reason and every exported series are today's."""
    job, shadow, sim, _spans, _ = replay(trace, None)
    try:
        clock = SimClock(T0)
        plain = Job("p", "e", load_thresholds(None), clock=clock)
        t = T0
        for recs in steps_of(trace):
            t += float(recs[-1].data["timing_s/step"]) + 0.3
            clock.t = t
            plain.feed(recs)
        assert job.last is not None and plain.last is not None
        assert [p.reason for p in job.summary()["history"]] == [
            p.reason for p in plain.summary()["history"]
        ]
        assert job.samples() == plain.samples() == shadow.samples()
        assert "engine" not in job.summary()
    finally:
        sim.stop()


def test_a_healthy_rollout_keeps_the_logs_reason_with_evidence() -> None:
    job, shadow, sim, _spans, _ = replay("rollout_generation_v1.jsonl", "healthy")
    try:
        assert job.last is not None and shadow.last is not None
        assert job.last.reason == shadow.last.reason == "generation"
        assert value(job.samples(), "rlhf_engine_evidence_usable") == 1.0
        assert value(job.samples(), "rlhf_engine_imbalance_ratio") == pytest.approx(1.0, abs=0.01)
    finally:
        sim.stop()


def test_the_sidecar_wires_engines_only_where_they_can_be_found() -> None:
    from rlhf_exporter import settings as settings_mod
    from rlhf_exporter.commands import serve as serve_mod

    base = {
        "RLHF_EXPORTER_LISTEN": "127.0.0.1:0",
        "RLHF_EXPORTER_NVML": "false",
        "RLHF_EXPORTER_RAY": "false",
    }
    plain = serve_mod.Sidecar(settings_mod.resolve(None, base))
    try:  # no Ray and no targets: no engine source, and the push source (whose board is kept
        # for the head's windows API, issue 23) has none either
        assert [s.name for s in plain.sources] == ["push"]
        assert plain.engines is None
        assert plain.push is not None and plain.push.engines is None
    finally:
        plain.server.server_close()
    s = settings_mod.resolve(None, {**base, "RLHF_EXPORTER_ENGINE_TARGET": "127.0.0.1:1"})
    wired = serve_mod.Sidecar(s)
    try:
        assert wired.engines is not None and "engines" in [x.name for x in wired.sources]
        assert wired.push is not None and wired.push.engines is wired.engines
        # a sidecar that reads jobs serves their windows to worker sidecars (issue 23)
        assert wired.endpoints.windows_api is not None
        # the verl source wakes the exposition after its polls (issue 37), the engines' polls
        # (10 a second while a job steps) do not
        assert wired.engines.after_poll == []
    finally:
        wired.server.server_close()
    read = serve_mod.Sidecar(
        settings_mod.resolve(None, {**base, "RLHF_EXPORTER_VERL_ROOT": "/nonexistent"})
    )
    try:
        assert read.verl is not None
        assert read.verl.after_poll == [read.endpoints.exposition.wake]
    finally:
        wired.server.server_close()


def test_diagnose_says_which_reasons_need_the_sidecar() -> None:
    import subprocess

    from tests.support.procs import exporter_cmd

    def run(trace: str) -> str:
        out = subprocess.run(
            exporter_cmd("diagnose", str(TRACES / trace)),
            capture_output=True,
            text=True,
            timeout=120,
            env={**__import__("os").environ, "COLUMNS": "400"},
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    rollout = run("fully_async_rollout.jsonl")
    assert "kv_pressure, queueing and replica_imbalance" in rollout
    assert "need the sidecar" in rollout and "docs/engines.md" in rollout
    assert "need the sidecar" not in run("checkpoint_outside_one_step_off.jsonl")  # update-bound


def test_the_landing_page_and_job_view_show_the_evidence_beside_the_reason() -> None:
    from rlhf_exporter.view.pages import Facts, Links, index_page, job_page

    job, _shadow, sim, _spans, _ = replay("rollout_generation_v1.jsonl", "queueing")
    sim.stop()
    facts, links = Facts("test", "http://127.0.0.1:9", "verl (test)"), Links("https://r/x.md")
    summary = job.summary()
    page = job_page(summary, [], facts, links)
    assert "rollout-bound: queueing" in page and "Engine evidence" in page
    assert "share of W: waiting with KV room" in page
    ev = summary["engine"]
    assert f"{ev['queueing_share']:.0%}" in page and f"{ev['kv_max']:.0%}" in page
    landing = index_page([summary], [], facts, links)
    assert "queueing" in landing and "engines: KV max" in landing
    plain = Job("p", "e", load_thresholds(None))
    assert "Engine evidence" not in job_page(plain.summary(), [], facts, links)


def test_the_engine_source_reads_fast_while_a_job_of_the_board_steps() -> None:
    """The sidecar's engine source learns from the window board (its port in the sources'
    Context) whether a job stepped in the last ENGINE_ACTIVE seconds: then it reads every
    `engine_interval`, else every `engine_idle_interval`."""
    import dataclasses

    from rlhf_exporter import settings as settings_mod
    from rlhf_exporter.diagnosis.timeline import Timeline
    from rlhf_exporter.sources.base import Context
    from rlhf_exporter.sources.engines import ENGINE_ACTIVE

    now = [10_000.0]
    s = dataclasses.replace(
        settings_mod.resolve(None, {}), engine_target=["127.0.0.1:1"], engine_interval=1.0
    )
    board = WindowBoard()
    source = EngineSource.from_settings(
        s, Context(load_thresholds(None), lambda: now[0], windows=board)
    )
    assert source is not None
    source._last_scrape = now[0]
    assert not source._due(now[0] + 1.0)  # nothing steps: the idle interval
    board.post(("p", "e"), Timeline(1, now[0] - 20.0, now[0] - 1.0, (), 0.0))
    assert source._due(now[0] + 1.0)  # a job stepped just now: every second
    now[0] += ENGINE_ACTIVE + 60.0
    source._last_scrape = now[0]
    assert not source._due(now[0] + 1.0)  # its last step is long past
    assert EngineSource.from_settings(s, Context(load_thresholds(None))) is None  # no board


def test_the_real_v1_first_step_placed_with_its_untimed_warm_up_is_not_measured() -> None:
    """Issue 32: the real V1 job's first step (tests/fixtures/real_verl/v1) has 10.3 s
    outside every timer (verl waiting for its agent-loop workers) beside a 6.05 s `gen`, so
    its rollout window's place is uncertain by more than its length. Even with engines busy
    in the placed window, that step keeps the log's reason and counts no window; steps 2 and
    3 (0.03 s untimed) are measured."""
    job, shadow, sim, spans, _ = replay("../real_verl/v1/v1.jsonl", "healthy")
    try:
        assert sorted(spans) == [1, 2, 3]
        counted = value(job.samples(), "rlhf_engine_windows_total", usable="true") or 0.0
        counted += value(job.samples(), "rlhf_engine_windows_total", usable="false") or 0.0
        assert counted == 2.0
        assert value(job.samples(), "rlhf_engine_window_seconds") == pytest.approx(
            spans[3][0][1] - spans[3][0][0]
        )  # the last measured window is step 3's
        assert [p.reason for p in job.summary()["history"]] == [
            p.reason for p in shadow.summary()["history"]
        ]
    finally:
        sim.stop()
