"""The demo's engines: simulated vLLM replicas (real HTTP servers on 127.0.0.1, vLLM's page)
in phase with the demo job's rollout windows, read by the real engine source, joined by the
real job, all on the demo job's clock (rlhf_exporter/demo/clock.py, demo/engines.py).

The chain tests play the demo's timeline on a simulated wall clock at `serve --demo`'s pace
(0.7 s a step, the engines read every demo.engines.INTERVAL): nothing but the clocks is
simulated. The live tests run `serve --demo` itself, with a real Prometheus.
"""

from __future__ import annotations

import itertools
import json

import pytest

from rlhf_exporter.demo import engines as demo_engines
from rlhf_exporter.demo.clock import DemoClock
from rlhf_exporter.demo.engines import DemoEngines
from rlhf_exporter.demo.job import DemoJob
from rlhf_exporter.demo.scenario import LONG_TAIL, PREEMPTION, QUEUEING, Phase, scenario
from rlhf_exporter.demo.simulator import encode
from rlhf_exporter.diagnosis.engines import EngineLimits
from rlhf_exporter.job.state import Job
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.join.ports import WALL
from rlhf_exporter.render.addresses import JOB_PATH
from rlhf_exporter.render.dashboards import targets
from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import EngineSource, parse
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support import grafana_vars
from tests.support.prometheus import Prometheus
from tests.support.serve import Exporter
from tests.test_engines_live import ENGINE_PANELS

STEP = 0.7  # serve --demo's seconds a step


class Played:
    """The demo's timeline played on a simulated wall clock through the real parts."""

    def __init__(self, tmp_path, name: str):
        self.th = load_thresholds()
        self.now = [1_000_000.0]
        self.job = DemoJob(tmp_path, step_seconds=STEP, scenario_name=name, th=self.th)
        self.clock = self.job.clock
        self.engines = DemoEngines(self.clock, wall=lambda: self.now[0])
        self.engines.start()
        self.source = EngineSource(
            Targets(static=self.engines.urls),
            interval=demo_engines.INTERVAL,
            limits=EngineLimits.from_document(self.th.document),
            active=lambda: True,
            clock=lambda: self.now[0],
            job_clock=self.clock,
        )
        self.board = WindowBoard(keep=64)
        self.series = Job(
            "demo",
            "grpo-simulated",
            self.th,
            clock=lambda: self.now[0],
            windows=self.board,
            engines=self.source,
            job_clock=self.clock,
        )
        self.steps: list[tuple[Phase, int, str | None]] = []  # (phase, step, its reason)
        self.evidence = []

    def close(self) -> None:
        self.source.stop()
        self.engines.stop()

    def run(self, steps: int) -> None:
        """`steps` records, each scheduled, waited for (the engines read all along), then
        written and read by the job at its due time (as the verl source reads the file)."""
        done = 0
        for wait, record in self.job.timeline(0):
            if record is None:  # a pause: the clock runs on, the engines idle
                self._advance(wait * STEP)
                continue
            due = self.now[0] + wait * STEP
            self.job.schedule(due, record, start=self.now[0])
            self._advance(due - self.now[0])
            self.series.feed(RecordReader().feed(encode(record)), now=due)
            if record["step"]:
                reason = self.series.last.reason if self.series.last else None
                self.steps.append((self.job.phase, record["step"], reason))
                self.evidence.append(self.series.engine)
                done += 1
            if done == steps:
                return

    def _advance(self, seconds: float) -> None:
        end = self.now[0] + seconds
        while self.now[0] + demo_engines.INTERVAL <= end:
            self.now[0] += demo_engines.INTERVAL
            self.source.poll_once()
        self.now[0] = end


@pytest.fixture
def played(tmp_path, request):
    p = Played(tmp_path, request.param)
    yield p
    p.close()


@pytest.mark.parametrize("played", ["actor_restart"], indirect=True)
def test_steps_lie_end_to_end_on_the_job_clock_and_every_window_is_usable(played):
    """The job's placed steps follow each other without overlap on the demo job's clock
    (on the wall clock, ~135 of them would overlap), each step's rollout window is covered
    by the engines' reads, and the engines say what its phase scripts."""
    played.run(12 + 6)  # steady (long tail), then the rollout actor died (queueing)
    timelines = played.board.recent(("demo", "grpo-simulated"))
    assert len(timelines) >= 17
    for a, b in itertools.pairwise(timelines):
        assert b.start >= a.end - 1.0, (a, b)  # the board's anchor tolerance
        assert b.end - b.start > 50.0  # each as long as its record says (~95 s)
    assert all(ev is not None and ev.usable for ev in played.evidence), [
        (ev.coverage if ev else None) for ev in played.evidence
    ]
    reasons = {(p.engines, r) for p, _, r in played.steps}
    assert (LONG_TAIL, "long_tail") in reasons
    # the log cannot say queueing (its records show no waiting): only the engines can
    assert {r for p, _, r in played.steps if p.engines == QUEUEING} == {"queueing"}
    both = list(zip(played.steps, played.evidence, strict=True))
    steady = [ev for (p, _, _), ev in both if p.engines == LONG_TAIL]
    assert len(steady) == 12
    assert all(ev.peak_running > 100 and ev.replicas == 2 for ev in steady)
    assert all(ev.long_tail_share > 0.3 for ev in steady)


@pytest.mark.parametrize("played", ["bottleneck_moves"], indirect=True)
def test_the_slower_generation_phase_preempts(played):
    """The slowest rollout phase (~200x the wall's pace) is still covered, and its reason
    is the engines' preemption, with preemptions counted."""
    played.run(12 + 14)
    slow = [
        (r, ev)
        for (p, _, r), ev in zip(played.steps, played.evidence, strict=True)
        if p.engines == PREEMPTION
    ]
    assert len(slow) == 14
    assert all(ev.usable and ev.preemptions > 5 for _, ev in slow), [ev for _, ev in slow]
    assert {r for r, _ in slow} == {"preemption"}
    assert all(ev.kv_max > 0.95 for _, ev in slow)


def test_the_page_is_vllms_and_the_real_parser_reads_it(tmp_path):
    """The simulated page speaks vLLM's families, read by the engine source's own parser."""
    clock = DemoClock(load_thresholds())
    now = [100.0]
    phase = scenario("all")[0]
    record = {"step": 1, "data": {"timing_s/step": 95.0, "timing_s/gen": 70.0}}
    clock.step(100.0, 100.7, phase, record)
    engines = DemoEngines(clock, wall=lambda: now[0])
    try:
        now[0] = 100.1  # early in the rollout: a full batch
        read = parse(engines.replicas[0].page(), 0.0)
        assert read.error is None and read.engine == "vllm"
        assert read.sample.running == demo_engines.BATCH and read.sample.kv == 0.55
        now[0] = 100.69  # after the rollout window: the engines sleep
        read = parse(engines.replicas[0].page(), 0.0)
        assert read.sample.running == 0 and read.sample.tokens > 0
    finally:
        engines.close()


def test_the_clock_is_the_walls_until_a_step_then_runs_at_the_records_pace():
    clock = DemoClock(load_thresholds())
    assert clock.at(5.0) == 5.0 and WALL.at(5.0) == 5.0
    phase = scenario("all")[0]
    clock.step(10.0, 11.0, phase, {"step": 1, "data": {"timing_s/step": 100.0}})
    assert clock.at(10.0) == 10.0 and clock.at(11.0) == pytest.approx(110.0)
    assert clock.at(10.5) == pytest.approx(60.0)
    assert clock.at(12.0) == pytest.approx(210.0)  # a pause: on at the last pace
    clock.step(12.0, 13.0, phase, {"step": 2, "data": {"timing_s/step": 50.0}})
    assert clock.at(13.0) == pytest.approx(260.0)
    t, seg = clock.current(12.5)
    assert t == pytest.approx(235.0) and seg is not None and seg.job == pytest.approx(210.0)
    assert clock.current(14.0)[1] is None  # between steps
    clock.step(20.0, 21.0, phase, {"step": 0, "data": {}})  # no step time: nothing passes
    assert clock.at(21.0) == pytest.approx(260.0 + 8 * 50.0)


@pytest.mark.slow
@pytest.mark.prometheus
def test_serve_demo_fills_the_engines_row_and_shows_an_engine_reason_within_a_minute(tmp_path):
    """`serve --demo` (only the scenario chosen): within a minute of its start the engines'
    evidence is usable, `/` shows it, the rollout actor's death makes the engines' queueing
    the step's reason, and every query of the job dashboard's Engines row returns data from
    a real Prometheus scraping it."""
    exp = Exporter(tmp_path / "serve", "--demo", "--demo-scenario", "actor_restart", defaults=False)
    prom = None
    try:
        prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{exp.port}"], scrape_interval="500ms")
        job = 'experiment="grpo-simulated"'
        # 12 steady steps (8.4 s), then the actor's death: the engines queue
        exp.wait_for(
            lambda: prom.query(f'rlhf_bottleneck_reason{{{job},reason="queueing"}} == 1'),
            60,
            what="Prometheus to see the engines' queueing reason",
        )
        assert prom.query(f'rlhf_engine_windows_total{{{job},usable="true"}} > 5')
        assert prom.query(f'rlhf_engine_windows_total{{{job},usable="false"}} < 3')
        assert "engines: KV max" in exp.get("/").text
        dash = json.loads(targets(load_thresholds(None))[JOB_PATH])
        panels = [p for row in dash["panels"] for p in [row, *row.get("panels", [])]]
        checked = 0
        for p in panels:
            if p.get("id") not in ENGINE_PANELS:
                continue
            for t in p["targets"]:
                expr = grafana_vars.substitute(
                    t["expr"], project="demo", experiment="grpo-simulated"
                )
                assert prom.query(expr), (p["id"], p["title"], expr)
                checked += 1
        assert checked == 10
        assert len(prom.query('rlhf_engine_up{engine="vllm"} == 1')) == demo_engines.REPLICAS
    finally:
        if prom is not None:
            prom.terminate()
        exp.terminate()


def test_only_the_demo_root_runs_on_the_demo_clock(tmp_path):
    """`serve --demo --verl-root R`: R's jobs are real ones, placed on the wall clock; only the
    jobs under the demo's own root are on its job clock."""
    th = load_thresholds()
    demo_root, real_root = tmp_path / "demo", tmp_path / "real"
    clock = DemoClock(th)
    for root in (demo_root, real_root):
        (root / "p").mkdir(parents=True)
        line = encode({"step": 1, "data": {"timing_s/step": 9.0}})
        (root / "p" / f"{root.name}.jsonl").write_bytes(line)
    src = VerlFileSource(th, [real_root, demo_root], job_clock=clock, job_clock_roots=[demo_root])
    src.poll_once()
    clocks = {p.stem: w.job._job_clock for p, w in src._watched.items()}
    assert clocks == {"demo": clock, "real": WALL}
