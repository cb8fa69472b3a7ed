"""Issue 17: step windows in time, and GPU busy time by window and role.

A synthetic verl job runs its windows in verl's order (with untimed gaps between them, as
the driver's DataProto work leaves), writes its record after `step` and validation, and a
fake `pynvml` (tests/support/fake_pynvml.py, the import boundary) reports GPUs whose
utilization follows the job's true windows. The join must recover the truth.
"""

from __future__ import annotations

import itertools
import random

import pytest

from rlhf_exporter.diagnosis import Record, StreamDiagnoser
from rlhf_exporter.diagnosis.gpufit import QUANTA, place_untimed
from rlhf_exporter.diagnosis.gpujoin import GpuWindowJoin, gpu_role
from rlhf_exporter.diagnosis.timeline import ORDER, UNTIMED, Recent, rebuild
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.fake_pynvml import FakeClock, FakeGpu, make_module

TH = load_thresholds()
GEN, LOGP, UPD = "gen", "old_log_prob", "update_actor"
# which windows keep each side's GPUs busy (percent), the rest of the time they idle at 3 %
BUSY = {"rollout": {GEN: 92}, "trainer": {LOGP: 80, UPD: 95}}
BUSY["colocated"] = {**BUSY["rollout"], **BUSY["trainer"]}
IDLE_PERCENT = 3


def simulate(steps: int, seed: int, t0: float = 1000.0, testing_every: int = 3):
    """True intervals of a legacy-trainer job: (records with arrival times, [(step, timer,
    group, start, end)])."""
    rng = random.Random(seed)
    t = t0 + 5.0
    records, truth = [], []
    timers = [GEN, "reward", LOGP, "ref", "adv", UPD, "update_weights"]
    for step in range(1, steps + 1):
        start = t
        data = {}
        for name in timers:
            t += rng.uniform(0.05, 0.4)  # untimed driver work between windows (part of R)
            d = rng.uniform(2.0, 12.0) if name in (GEN, UPD) else rng.uniform(0.5, 4.0)
            truth.append((step, name, TH.timer_groups.get(name, "other"), t, t + d))
            data[f"timing_s/{name}"] = d
            t += d
        t += rng.uniform(0.0, 0.3)
        data["timing_s/step"] = t - start
        if step % testing_every == 0:  # validation after `step`, timed in the same record
            testing = rng.uniform(3.0, 8.0)
            data["timing_s/testing"] = testing
            t += testing
        t += 0.2  # verl computes its metrics, then the logger writes the line
        records.append((t, Record(step, data)))
        t += rng.uniform(0.0, 0.5)  # the next step's batch
    return records, truth


def timelines(records, delay=0.2):
    sd = StreamDiagnoser(TH)
    out = []
    for arrival, rec in records:
        d = sd.feed(rec).diagnosis
        out.append(rebuild(d.step, d.windows, d.timers, arrival, TH, delay=delay))
    return out


def test_order_is_verls_for_every_mode():
    # one-step-off syncs weights right after gen; fully-async waits before gen, syncs last
    assert ORDER.index("gen") < ORDER.index("sync_rollout_weights") < ORDER.index("reward")
    assert ORDER.index("wait_for_enough_samples") < ORDER.index("gen")
    assert ORDER.index("update_actor") < ORDER.index("save_checkpoint")
    assert ORDER.index("save_checkpoint") < ORDER.index("update_weights")  # legacy 1711/1715
    assert ORDER.index("switch_to_rollout") < ORDER.index("update_weights")  # V1 separate


def test_alignment_error_is_measured_and_within_the_stated_bound():
    records, truth = simulate(40, seed=1)
    tls = {tl.step: tl for tl in timelines(records)}
    worst = 0.0
    for step, name, _group, start, end in truth:
        tl = tls[step]
        (iv,) = [iv for iv in tl.intervals if iv.timer == name]
        err = max(abs(iv.start - start), abs(iv.end - end))
        assert err <= tl.error_seconds + 1e-9, (step, name, err, tl.error_seconds)
        worst = max(worst, err)
    # the bound is delay + R (1.3-2.4 s here); measured with R spread over the gaps: the
    # worst window edge is 0.36 s off, the mean 0.09 s (seed 1, 280 windows)
    assert 0.0 < worst < 0.5
    # the step's edges: the end is exact (arrival - delay - testing), the start too
    for step in tls:
        starts = [s for st, _n, _g, s, _e in truth if st == step]
        assert tls[step].end - tls[step].start == pytest.approx(
            records[step - 1][1].data["timing_s/step"]
        )
        assert tls[step].start <= min(starts)


def test_checkpoint_after_step_moves_the_anchor_in_separated_trainers():
    data = {
        "timing_s/step": 10.0,
        "timing_s/gen": 4.0,
        "timing_s/sync_rollout_weights": 1.0,
        "timing_s/update_actor": 5.0,
        "timing_s/save_checkpoint": 7.0,
        "timing_s/testing": 2.0,
    }
    d = StreamDiagnoser(TH).feed(Record(1, data)).diagnosis
    assert d.windows.checkpoint_seconds == 0.0  # a separated trainer saves after `step`
    tl = rebuild(1, d.windows, d.timers, arrival=100.0, th=TH)
    assert tl.end == pytest.approx(100.0 - 7.0 - 2.0)
    assert [iv.timer for iv in tl.intervals] == [GEN, "sync_rollout_weights", UPD]
    assert tl.intervals[0].start == pytest.approx(81.0)


def test_recent_keeps_the_last_n_steps():
    records, _ = simulate(12, seed=2)
    recent = Recent(keep=5)
    for tl in timelines(records):
        recent.add(tl)
    assert len(recent) == 5
    assert [tl.step for tl in recent] == [8, 9, 10, 11, 12]
    with pytest.raises(ValueError):
        Recent(0)


def test_gpu_role_of_a_gpus_processes():
    assert gpu_role(["rollout"]) == "rollout"
    assert gpu_role(["trainer", "unknown"]) == "trainer"
    assert gpu_role(["trainer", "rollout"]) == "colocated"
    assert gpu_role(["unknown"]) == "unknown"


def _fake_gpus(truth, roles, start):
    """FakeGpus whose utilization follows the job's true windows."""
    edges = sorted({t for *_x, s, e in truth for t in (s, e)})
    gpus = []
    for i, role in enumerate(roles):
        util = [(0.0, IDLE_PERCENT)]
        for t in edges:
            running = [n for _st, n, _g, s, e in truth if s <= t < e]
            pct = BUSY[role].get(running[0], IDLE_PERCENT) if running else IDLE_PERCENT
            util.append((t - start, pct))
        gpus.append(FakeGpu(i, util=util, start=start, buffer=10**6))
    return gpus


def _truth_shares(truth, role, steps):
    busy, total = {}, {}
    for step, name, group, s, e in truth:
        if step not in steps:
            continue
        pct = BUSY[role].get(name, IDLE_PERCENT)
        busy[group] = busy.get(group, 0.0) + pct / 100 * (e - s)
        total[group] = total.get(group, 0.0) + (e - s)
    return {g: busy[g] / total[g] for g in total}


def _nvml_poller(nv, join: GpuWindowJoin, roles):
    """What the sidecar's NVML source feeds the join at each poll: every GPU's buffered
    utilization samples since its last one (fake pynvml, the import boundary)."""
    last = dict.fromkeys(range(len(roles)), 0)
    nv.nvmlInit()

    def poll():
        for i, role in enumerate(roles):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                _vt, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last[i])
            except nv.NVMLError_NotFound:
                continue
            last[i] = samples[-1].timeStamp
            join.add_samples(
                str(i), role, [(s.timeStamp / 1e6, s.sampleValue.uiVal / 100) for s in samples]
            )

    return poll


def _join_simulation(seed: int, roles, steps: int = 30, start: float = 1000.0):
    """The pure join over fake-pynvml GPUs following a simulated job; polled every second
    until each record arrives. Returns (join, [(even timeline, placed timeline)], truth)."""
    records, truth = simulate(steps, seed=seed, t0=start)
    clock = FakeClock(start)
    join = GpuWindowJoin(horizon=600.0)
    poll = _nvml_poller(make_module(_fake_gpus(truth, roles, start), clock), join, roles)
    placed = []
    for tl, (arrival, _rec) in zip(timelines(records), records, strict=True):
        while clock() < arrival:  # the sidecar polls NVML every second until the record
            clock.advance(1.0)
            poll()
        placed.append((tl, join.add_timeline(tl)))
    return join, placed, truth


SYNC_ROLES = ["rollout", "rollout", "trainer", "trainer", "colocated"]


@pytest.mark.parametrize("seed", [3, 4, 6])
def test_synchronized_simulation_busy_share_within_5pp_and_idle_exact(seed):
    roles = SYNC_ROLES
    join, placed, truth = _join_simulation(seed, roles)
    counters = join.counters()
    steps = set(range(1, 31))
    for role in ("rollout", "trainer", "colocated"):
        truth_shares = _truth_shares(truth, role, steps)
        for group in ("rollout", "logprob", "update", "reward"):
            busy, avail = counters[((), group, role)]
            n = roles.count(role)
            share = busy / avail
            assert abs(share - truth_shares[group]) <= 0.05, (role, group, share)
            # available GPU-seconds: the group's true duration on each GPU, within the error
            true_total = sum(e - s for st, _n, g, s, e in truth if g == group)
            assert avail == pytest.approx(n * true_total, rel=0.05)
        # `other`, the untimed remainder R: the driver's work, the GPUs idle through it
        busy, avail = counters[((), "other", role)]
        assert abs(busy / avail - IDLE_PERCENT / 100) <= 0.05, (role, busy / avail)
    # idle = available - busy, exactly, and every attributed second is one GPU-second
    total_busy = sum(b for b, _a in counters.values())
    total_avail = sum(a for _b, a in counters.values())
    idle = {k: a - b for k, (b, a) in counters.items()}
    assert all(v >= 0.0 for v in idle.values())
    assert sum(idle.values()) == pytest.approx(total_avail - total_busy, abs=1e-9)
    covered = sum(tl.end - tl.start for tl, _p in placed)
    assert total_avail == pytest.approx(len(roles) * covered, rel=1e-6)
    # the placed steps keep their edges, their windows' order and durations, and cover
    # [start, end] without a hole or an overlap
    for tl, p in placed:
        assert (p.start, p.end) == (tl.start, tl.end)
        timed = [iv for iv in tl.intervals if iv.timer != UNTIMED]
        moved = [iv for iv in p.intervals if iv.timer != UNTIMED]
        assert [iv.timer for iv in moved] == [iv.timer for iv in timed]
        for a, b in zip(timed, moved, strict=True):
            assert b.end - b.start == pytest.approx(a.end - a.start, abs=1e-9)
        assert p.intervals[0].start == p.start and p.intervals[-1].end == p.end
        assert all(x.end == y.start for x, y in zip(p.intervals, p.intervals[1:]))


def _edge_errors(placed, truth, names, which):
    """Each named window's edge error (seconds): max(|start - true start|, |end - true end|)."""
    out = []
    for step, name, _group, start, end in truth:
        if name not in names:
            continue
        tl = placed[step - 1][which]
        (iv,) = [iv for iv in tl.intervals if iv.timer == name]
        out.append((max(abs(iv.start - start), abs(iv.end - end)), tl.error_seconds))
    return out


def test_placing_r_where_the_gpus_idled_shrinks_the_window_edge_error():
    """The windows whose GPUs work (gen, old_log_prob, update_actor) land on their busy
    edges, within NVML's 1/6 s sample period; the CPU-only windows between them follow,
    their gaps spread evenly between the pinned ones. Measured here (seeds 1-3, 90 steps):
    see the asserts; over seeds 1-4 and 6 (docs/gpu-windows.md): busy windows 0.100 s mean,
    0.376 s worst spread evenly -> 0.035 s mean, 0.087 s worst placed; CPU-only windows
    0.106 s mean -> 0.070 s mean."""
    busy_windows = {GEN, LOGP, UPD}
    cpu_windows = {"reward", "ref", "adv", "update_weights"}
    errors: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for seed in (1, 2, 3):
        _join, tls, truth = _join_simulation(seed, SYNC_ROLES)
        for which in (0, 1):  # 0: rebuild's even spread; 1: placed by the join
            errors.setdefault(("gpu", which), []).extend(
                _edge_errors(tls, truth, busy_windows, which)
            )
            errors.setdefault(("cpu", which), []).extend(
                _edge_errors(tls, truth, cpu_windows, which)
            )

    def mean(kind, which):
        return sum(e for e, _b in errors[kind, which]) / len(errors[kind, which])

    def worst(kind, which):
        return max(e for e, _b in errors[kind, which])

    assert len(errors["gpu", 1]) == 270 and len(errors["cpu", 1]) == 360
    assert mean("gpu", 1) < 0.5 * mean("gpu", 0), (mean("gpu", 1), mean("gpu", 0))
    assert worst("gpu", 1) < 0.15 < worst("gpu", 0)  # a sample period is 0.167 s
    assert mean("cpu", 1) < mean("cpu", 0), (mean("cpu", 1), mean("cpu", 0))
    # the stated bound (delay + R) holds for every window edge either way
    assert all(e <= bound + 1e-9 for es in errors.values() for e, bound in es)


def _even_and_exact_signal(seed: int):
    """A simulated step's even-spread timeline and an exact `busy(t)` (GPU-seconds since
    the step's start, 4 GPUs fully busy in the true gen and update_actor windows)."""
    records, truth = simulate(1, seed=seed, t0=0.0)
    (tl,) = timelines(records, delay=0.2)
    spans = [(s, e) for _st, n, _g, s, e in truth if n in (GEN, UPD)]

    def busy(t: float) -> float:
        return 4.0 * sum(max(0.0, min(t, e) - s) for s, e in spans)

    return tl, busy, truth


@pytest.mark.parametrize("seed", [10, 11, 12])
def test_an_exact_signal_puts_each_busy_window_on_its_edges_within_a_quantum(seed):
    tl, busy, truth = _even_and_exact_signal(seed)
    p = place_untimed(tl, busy)
    r = sum(iv.end - iv.start for iv in tl.intervals if iv.timer == UNTIMED)
    quantum = r / QUANTA
    for _st, name, _g, s, _e in truth:
        if name in (GEN, UPD):
            (iv,) = [iv for iv in p.intervals if iv.timer == name]
            assert abs(iv.start - s) <= quantum + 1e-9, (name, iv.start - s, quantum)
            (ev,) = [iv for iv in tl.intervals if iv.timer == name]
            assert abs(iv.start - s) <= abs(ev.start - s) + 1e-9
    in_gaps = sum(busy(iv.end) - busy(iv.start) for iv in p.intervals if iv.timer == UNTIMED)
    even_gaps = sum(busy(iv.end) - busy(iv.start) for iv in tl.intervals if iv.timer == UNTIMED)
    assert in_gaps < even_gaps
    assert in_gaps <= 2 * 4.0 * quantum + 1e-9  # at most a quantum per busy window edge


def test_without_a_gpu_signal_the_placement_is_the_even_spread():
    tl, _busy, _truth = _even_and_exact_signal(13)
    assert sum(iv.timer == UNTIMED for iv in tl.intervals) == 8
    # no samples, GPUs that never worked, or worked at one constant rate: nothing to go by
    for flat in (lambda t: 0.0, lambda t: 0.37 * 8 * (t - tl.start)):
        assert place_untimed(tl, flat) is tl
    join = GpuWindowJoin()
    assert join.add_timeline(tl) is tl  # no GPU at all
    for gpu in range(4):
        join.add_samples(str(gpu), "trainer", [(tl.start - 5 + k / 6, 0.03) for k in range(6 * 60)])
    assert join.add_timeline(tl) is tl  # idle GPUs: 3 % everywhere

    # a signal only around gen: gen lands on its edges; the gaps it says nothing about (all
    # after gen) share what is left of R evenly, within a quantum
    _records, truth = simulate(1, seed=13, t0=0.0)
    ((_st, _n, _g, s, e),) = [w for w in truth if w[1] == GEN]
    p = place_untimed(tl, lambda t: 4.0 * max(0.0, min(t, e) - s))
    r = sum(iv.end - iv.start for iv in tl.intervals if iv.timer == UNTIMED)
    (gen,) = [iv for iv in p.intervals if iv.timer == GEN]
    assert abs(gen.start - s) <= r / QUANTA + 1e-9
    gaps, t = [], gen.end
    for iv in p.intervals[p.intervals.index(gen) + 1 :]:
        if iv.timer != UNTIMED:
            gaps.append(iv.start - t)
            t = iv.end
    gaps.append(p.end - t)
    assert len(gaps) == 7
    assert max(gaps) - min(gaps) <= r / QUANTA + 1e-9, gaps


def test_a_moment_is_attributed_once_and_old_samples_go():
    join = GpuWindowJoin(horizon=10.0)
    join.add_samples("0", "trainer", [(t / 2, 1.0) for t in range(0, 100)])  # 0 .. 49.5 s
    assert len(join._gpus["0"].ends) <= 22
    records, _ = simulate(1, seed=4, t0=0.0)
    (tl,) = timelines(records)
    join.add_timeline(tl)
    first = dict(join.counters())
    join.add_timeline(tl)  # the same step again (a re-read): nothing more
    assert join.counters() == first


# -- through the sidecar's own parts: verl file source -> board -> NVML source -> samples ----
def _proc(root, pid: int, title: bytes) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(title + b"\0" * 20)
    (d / "stat").write_bytes(f"{pid} (x) S 1 {pid} {pid} 0".encode())


def run_sidecar(tmp_path, monkeypatch, roles, steps=20, seed=5, keep=8, sim=None):
    """A synthetic job writes its records at their arrival times while the sidecar's verl
    file source and NVML source (fake pynvml, roles through /proc + Ray PIDs) poll. `sim`:
    (records, truth) of another simulation than the legacy trainer's."""
    import json
    import sys

    from rlhf_exporter.join.board import WindowBoard
    from rlhf_exporter.sources.nvml import NvmlSource
    from rlhf_exporter.sources.ray import ActorProcess
    from rlhf_exporter.sources.verl_files import VerlFileSource
    from tests.support.fake_pynvml import FakeRay

    start = 1000.0
    records, truth = sim or simulate(steps, seed=seed, t0=start)
    clock = FakeClock(start)
    gpus = _fake_gpus(truth, roles, start)
    pids = {"rollout": [200], "trainer": [100], "colocated": [100, 200]}
    for g, role in zip(gpus, roles, strict=True):
        g.processes = [(pid, 1 << 30) for pid in pids[role]]
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
    root = tmp_path / "proc"
    _proc(root, 100, b"ray::WorkerDict")
    _proc(root, 200, b"ray::vLLMHttpServer")
    actors = {
        100: ActorProcess("WorkerDict", "trainer"),
        200: ActorProcess("vLLMHttpServer", "rollout"),
    }
    board = WindowBoard(keep=keep)
    log_file = tmp_path / "job.jsonl"
    log_file.write_text("")
    verl = VerlFileSource(TH, files=[(log_file, "p", "e")], clock=clock, windows=board)
    nvml = NvmlSource(
        1.0,
        ray=FakeRay(actors),
        roles=True,
        clock=clock,
        proc_root=str(root),
        wall=clock,
        windows=board,
    )
    snap = None
    for arrival, rec in records:
        while clock() + 1.0 < arrival:
            clock.advance(1.0)
            snap = nvml.poll_once()
        clock.advance(arrival - clock())
        with log_file.open("a") as f:
            f.write(json.dumps({"step": rec.step, "data": dict(rec.data)}) + "\n")
        verl.poll_once()
    for _ in range(3):  # the last step's samples come in, then it is joined
        clock.advance(1.0)
        snap = nvml.poll_once()
    assert snap.up, snap.errors
    return snap, truth, board


def _window_values(snap):
    busy = {
        s.labels: s.value for s in snap.samples if s.name == "rlhf_window_gpu_busy_seconds_total"
    }
    total = {s.labels: s.value for s in snap.samples if s.name == "rlhf_window_gpu_seconds_total"}
    return busy, total


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_sidecar_exports_busy_share_per_window_and_role(tmp_path, monkeypatch, seed):
    roles = ["rollout", "rollout", "rollout", "trainer", "trainer", "colocated"]
    snap, truth, board = run_sidecar(tmp_path, monkeypatch, roles, seed=seed)
    busy, total = _window_values(snap)
    assert set(busy) == set(total)
    steps = set(range(1, 21))
    for role in ("rollout", "trainer", "colocated"):
        want = _truth_shares(truth, role, steps)
        for group in ("rollout", "logprob", "update", "sync", "reward"):
            key = ("p", "e", group, role)
            assert abs(busy[key] / total[key] - want[group]) <= 0.05, (key, busy[key] / total[key])
        # `other` holds R, the driver's untimed work, placed where the GPUs idled: truth 0.03
        key = ("p", "e", "other", role)
        assert abs(busy[key] / total[key] - IDLE_PERCENT / 100) <= 0.05, (
            key,
            busy[key] / total[key],
        )
    # the available GPU-seconds are the steps' durations on every GPU (each moment once)
    steps_seconds = sum(r.data["timing_s/step"] for _a, r in simulate(20, seed=seed, t0=1000.0)[0])
    assert sum(total.values()) == pytest.approx(len(roles) * steps_seconds, rel=1e-6)
    # the board kept only the last `keep` steps
    assert [tl.step for tl in board.recent(("p", "e"))] == list(range(13, 21))


def test_window_metrics_are_in_the_catalog():
    from rlhf_exporter.metrics.catalog import BY_NAME

    for name in ("rlhf_window_gpu_busy_seconds_total", "rlhf_window_gpu_seconds_total"):
        assert BY_NAME[name].labels == ("project", "experiment", "group", "gpu_role")
        assert BY_NAME[name].type == "counter"


# -- modes with a known imbalance: the new verdicts and the GPU-move estimate --------------
def _join_modes(records, busy_by_role, roles, start):
    """Run the pure join over fake-pynvml GPUs whose utilization is `busy_by_role[role]`:
    [(start, end, percent)], IDLE_PERCENT elsewhere."""
    gpus = []
    for i, role in enumerate(roles):
        util = [(0.0, IDLE_PERCENT)]
        for s, e, pct in sorted(busy_by_role[role]):
            util += [(s - start, pct), (e - start, IDLE_PERCENT)]
        gpus.append(FakeGpu(i, util=util, start=start, buffer=10**6))
    clock = FakeClock(start)
    join = GpuWindowJoin(horizon=600.0)
    poll = _nvml_poller(make_module(gpus, clock), join, roles)
    tls = timelines(records, delay=0.0)
    for tl, (arrival, _r) in zip(tls, records, strict=True):
        while clock() < arrival + 1.0:
            clock.advance(1.0)
            poll()
        join.add_timeline(tl)
    counters = {(g, r): v for (_job, g, r), v in join.counters().items()}
    wall = sum(tl.end - tl.start for tl in tls)
    return counters, wall


def _optimal_rollout_gpus(n: int, rollout_cost: float, trainer_cost: float) -> float:
    """The simulation's truth: GPU-seconds per sample on each side, linear scaling."""
    return n * rollout_cost / (rollout_cost + trainer_cost)


def test_fully_async_with_too_few_rollout_gpus_is_trainer_starved():
    from rlhf_exporter.diagnosis.balance import balance

    n_r, n_t, batch = 2, 6, 60
    rollout_cost, trainer_cost = 1.0, 1.0  # GPU-seconds per sample
    start, t = 1000.0, 1005.0
    records, busy = [], {"rollout": [], "trainer": []}
    for step in range(1, 21):
        produce = batch * rollout_cost / n_r  # the queue fills this fast (30 s)
        train = batch * trainer_cost / n_t  # the trainer consumes it in 10 s
        gen = produce - train  # fully-async's trainer waits on the queue for the rest
        s0 = t
        logp, upd, sync = 0.3 * train, 0.7 * train, 0.5
        busy["trainer"].append((s0 + gen, s0 + gen + train, 95))
        busy["rollout"].append((s0, s0 + gen + train, 92))  # generates until the weight sync
        t = s0 + gen + train + sync
        data = {
            "timing_s/step": t - s0,
            "timing_s/gen": gen,
            "timing_s/old_log_prob": logp,
            "timing_s/update_actor": upd,
            "timing_s/timing_s/param_sync": sync,
            "fully_async/count/stale_samples_processed": 0,
        }
        t += 0.1
        records.append((t, Record(step, data)))
    counters, wall = _join_modes(records, busy, ["rollout"] * n_r + ["trainer"] * n_t, start)
    b = balance(counters, wall, TH.document["balance"])
    assert b.verdict == "trainer_starved", b
    truth = _optimal_rollout_gpus(n_r + n_t, rollout_cost, trainer_cost) - n_r  # +2
    assert abs(b.move_to_rollout - truth) <= 1, (b.move_to_rollout, truth)
    assert b.move_to_rollout > 0
    assert b.trainer_gpus == pytest.approx(n_t, rel=0.02)
    assert b.trainer_idle_seconds > b.rollout_idle_seconds
    assert b.starved_idle > 0.5 > b.overprovisioned_idle


def test_one_step_off_with_too_many_rollout_gpus_is_rollout_overprovisioned():
    from rlhf_exporter.diagnosis.balance import balance

    n_r, n_t, batch = 6, 2, 60
    rollout_cost, trainer_cost = 1.0, 1.0
    start, t = 1000.0, 1005.0
    records, busy = [], {"rollout": [], "trainer": []}
    for step in range(1, 21):
        produce = batch * rollout_cost / n_r  # 10 s: the next batch, during this training
        train = batch * trainer_cost / n_t  # 30 s
        s0 = t
        gen, sync = 0.2, 1.0  # the previous step's batch is ready: gen waits almost nothing
        busy["rollout"].append((s0 + gen + sync, s0 + gen + sync + produce, 92))
        busy["trainer"].append((s0 + gen + sync, s0 + gen + sync + train, 95))
        t = s0 + gen + sync + train
        data = {
            "timing_s/step": t - s0,
            "timing_s/gen": gen,
            "timing_s/sync_rollout_weights": sync,
            "timing_s/update_weights": 0.9,
            "timing_s/old_log_prob": 0.3 * train,
            "timing_s/update_actor": 0.7 * train,
            "timing_s/generate_async": produce,
        }
        t += 0.1
        records.append((t, Record(step, data)))
    counters, wall = _join_modes(records, busy, ["rollout"] * n_r + ["trainer"] * n_t, start)
    b = balance(counters, wall, TH.document["balance"])
    assert b.verdict == "rollout_overprovisioned", b
    truth = _optimal_rollout_gpus(n_r + n_t, rollout_cost, trainer_cost) - n_r  # -2
    assert abs(b.move_to_rollout - truth) <= 1, (b.move_to_rollout, truth)
    assert b.move_to_rollout < 0
    assert b.rollout_gpus == pytest.approx(n_r, rel=0.02)
    assert b.overprovisioned_idle > 0.5 > b.starved_idle


def test_job_view_shows_who_waits_on_whom():
    from rlhf_exporter.view.pages import gpu_windows_section

    counters = {
        ("rollout", "rollout"): (1100.0, 1200.0),
        ("update", "rollout"): (550.0, 600.0),
        ("rollout", "trainer"): (108.0, 3600.0),
        ("update", "trainer"): (1710.0, 1800.0),
    }
    html = gpu_windows_section((counters, 900.0), TH.document["balance"])
    assert "<td>update</td><td>trainer</td><td>1,800</td><td>95%</td><td>90</td>" in html
    assert "trainer_starved" in html and "move 2 GPUs to the rollout" in html
    assert gpu_windows_section(None, TH.document["balance"]) == ""


def test_balance_needs_two_sides_and_enough_gpu_seconds():
    from rlhf_exporter.diagnosis.balance import balance

    limits = TH.document["balance"]
    colocated = {("rollout", "colocated"): (50.0, 100.0)}
    assert balance(colocated, 100.0, limits) is None
    small = {("rollout", "rollout"): (10.0, 20.0), ("update", "trainer"): (10.0, 20.0)}
    assert balance(small, 20.0, limits).verdict is None  # under min_gpu_seconds
    even = {("rollout", "rollout"): (900.0, 1000.0), ("update", "trainer"): (900.0, 1000.0)}
    b = balance(even, 1000.0, limits)
    assert b.verdict == "balanced" and b.move_to_rollout == 0


# -- multi-node: a worker sidecar reads the head's windows over HTTP on 127.0.0.1 ------------
def test_worker_sidecar_matches_a_single_node_run(tmp_path, monkeypatch):
    import json
    import sys
    import threading
    import urllib.error
    import urllib.request

    from rlhf_exporter.job.windows_wire import WINDOWS_PATH, WindowsApi
    from rlhf_exporter.join.board import WindowBoard
    from rlhf_exporter.server import Endpoints, make_server
    from rlhf_exporter.sources.nvml import NvmlSource
    from rlhf_exporter.sources.ray import ActorProcess
    from rlhf_exporter.sources.remote_windows import RemoteWindowsSource
    from rlhf_exporter.sources.verl_files import VerlFileSource
    from tests.support.fake_pynvml import FakeRay

    roles = ["rollout", "rollout", "trainer", "trainer"]
    start = 1000.0
    records, truth = simulate(12, seed=7, t0=start)
    clock = FakeClock(start)
    gpus = _fake_gpus(truth, roles, start)
    for g, role in zip(gpus, roles, strict=True):
        g.processes = [(200 if role == "rollout" else 100, 1 << 30)]
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, clock))
    root = tmp_path / "proc"
    _proc(root, 100, b"ray::WorkerDict")
    _proc(root, 200, b"ray::vLLMHttpServer")
    ray = FakeRay(
        {100: ActorProcess("WorkerDict", "trainer"), 200: ActorProcess("vLLM", "rollout")}
    )

    def nvml(board):
        return NvmlSource(1.0, ray=ray, clock=clock, proc_root=str(root), wall=clock, windows=board)

    head_board, worker_board = WindowBoard(), WindowBoard()
    log_file = tmp_path / "job.jsonl"
    log_file.write_text("")
    verl = VerlFileSource(TH, files=[(log_file, "p", "e")], clock=clock, windows=head_board)
    head_nvml, worker_nvml = nvml(head_board), nvml(worker_board)  # the same GPUs: same truth
    server = make_server(
        "127.0.0.1:0", Endpoints(snapshot_fns=[], windows_api=WindowsApi(head_board, "s3cret"))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        remote = RemoteWindowsSource(url, worker_board, token="s3cret", wall=clock)
        intruder = RemoteWindowsSource(url, WindowBoard(), token="wrong", wall=clock)
        for arrival, rec in records:
            while clock() + 1.0 < arrival:
                clock.advance(1.0)
                head_snap = head_nvml.poll_once()
                remote_snap = remote.poll_once()
                worker_snap = worker_nvml.poll_once()
            clock.advance(arrival - clock())
            with log_file.open("a") as f:
                f.write(json.dumps({"step": rec.step, "data": dict(rec.data)}) + "\n")
            verl.poll_once()
        for _ in range(3):
            clock.advance(1.0)
            head_snap = head_nvml.poll_once()
            remote_snap = remote.poll_once()
            worker_snap = worker_nvml.poll_once()
        assert remote_snap.up, remote_snap.errors
        bad = intruder.poll_once()
        assert not bad.up and "unauthorized" in str(bad.errors)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + WINDOWS_PATH, timeout=5)
        assert err.value.code == 401
    finally:
        server.shutdown()
        server.server_close()
    head_busy, head_total = _window_values(head_snap)
    worker_busy, worker_total = _window_values(worker_snap)
    assert len(head_total) >= 8  # groups x roles
    assert worker_total.keys() == head_total.keys()
    for key in head_total:
        assert worker_total[key] == pytest.approx(head_total[key], rel=1e-9, abs=1e-9), key
        assert worker_busy[key] == pytest.approx(head_busy[key], rel=1e-9, abs=1e-9), key
    assert [tl.step for tl in worker_board.recent(("p", "e"))] == list(range(1, 13))


def test_a_backlog_read_posts_only_its_last_step_anchored_at_the_files_mtime(tmp_path):
    """An exporter (re)started beside a running job reads the log's backlog in one poll:
    only the last step's arrival is known (the file's mtime), the others are not posted."""
    import json
    import os

    from rlhf_exporter.join.board import WindowBoard, WindowJoiner
    from rlhf_exporter.sources.verl_files import VerlFileSource

    records, _ = simulate(20, seed=8, t0=1000.0)
    log_file = tmp_path / "job.jsonl"
    with log_file.open("w") as f:
        for _arrival, rec in records:
            f.write(json.dumps({"step": rec.step, "data": dict(rec.data)}) + "\n")
    written = records[-1][0]
    os.utime(log_file, (written, written))
    clock = FakeClock(written + 300.0)  # read five minutes later
    board = WindowBoard()
    verl = VerlFileSource(TH, files=[(log_file, "p", "e")], clock=clock, windows=board)
    assert verl.poll_once().up
    (tl,) = board.recent(("p", "e"))
    assert tl.step == 20
    want = timelines(records, delay=0.0)[-1]
    assert tl.end == pytest.approx(want.end) and tl.start == pytest.approx(want.start)
    # steps anchored at one read time overlap: only the later-posted one is joined
    joiner = WindowJoiner(board)
    (early, late) = timelines(records[-2:], delay=0.0)
    shifted = early._replace(
        start=early.start + (late.end - early.end),
        end=late.end,
        intervals=tuple(
            iv._replace(start=iv.start + late.end - early.end, end=iv.end + late.end - early.end)
            for iv in early.intervals
        ),
    )
    joiner.add_samples(
        "0", "trainer", [(float(t), 1.0) for t in range(int(late.end) - 100, int(late.end) + 5)]
    )
    board.take_new()
    board.post(("p", "e"), shifted)
    board.post(("p", "e"), late)
    joiner.join(now=late.end + 1.0)
    busy, total = {}, {}
    for s in joiner.samples():
        (busy if "busy" in s.name else total)[s.labels] = s.value
    assert sum(total.values()) == pytest.approx(late.end - late.start)


def test_two_jobs_on_one_node_are_not_joined(caplog):
    """NVML cannot tell which job a GPU serves: with two active jobs nothing is attributed."""
    from rlhf_exporter.join.board import WindowBoard, WindowJoiner

    records, _ = simulate(2, seed=9, t0=1000.0)
    a, b = timelines(records, delay=0.0)
    board = WindowBoard()
    joiner = WindowJoiner(board)
    joiner.add_samples("0", "trainer", [(float(t), 0.5) for t in range(990, int(b.end) + 5)])
    board.post(("p", "one"), a)
    board.post(("p", "two"), b)
    with caplog.at_level("WARNING"):
        joiner.join(now=b.end + 1.0)
        board.post(("p", "one"), b)
        joiner.join(now=b.end + 2.0)
    assert joiner.samples() == []
    assert sum("more than one verl job" in r.message for r in caplog.records) == 1
    # one job alone is joined
    alone = WindowBoard()
    joiner = WindowJoiner(alone)
    joiner.add_samples("0", "trainer", [(float(t), 0.5) for t in range(990, int(b.end) + 5)])
    alone.post(("p", "one"), a)
    joiner.join(now=a.end + 1.0)
    total = sum(s.value for s in joiner.samples() if s.name == "rlhf_window_gpu_seconds_total")
    assert total == pytest.approx(a.end - a.start)


# -- fully-async: records shifted by one sub-step (verl 0.8.0 and 0.9.1) -----------------------
FA_TIMERS = [GEN, LOGP, "ref", "adv", UPD]
FA_COST = {GEN: 8.0, LOGP: 3.0, "ref": 1.5, "adv": 0.6, UPD: 7.0}


def simulate_fully_async(
    cycles: int, n_sync: int, seed: int, t0: float = 1000.0, v08=False, spread=0.15
):
    """True intervals of a fully-async trainer with trigger_parameter_sync_step = n_sync, and
    its records as verl writes them: at the cycle's last sub-step, after param_sync (0.8.0:
    inside `step`) or after `step` and the checkpoint (0.9.1), the aggregate of the sub-steps
    since the last one: the previous cycle's last and this cycle's first n_sync - 1 (timers
    summed, `training/global_step` the last sub-step's). A rollouter record comes first.
    Returns (records with arrival times, [(record step, timer, group, start, end)])."""
    rng = random.Random(seed)
    t = t0 + 5.0
    records, truth, pending, aggregate = [], [], [], {}
    for sub in range(1, cycles * n_sync + 1):
        last_of_cycle = sub % n_sync == 0
        cycle = (sub - 1) // n_sync + 1
        start = t
        data: dict = {"training/global_step": sub, "fully_async/count/stale_samples_processed": 0}
        windows = []
        names = FA_TIMERS + (["param_sync"] if last_of_cycle else [])
        for name in names:
            t += rng.uniform(0.05, 0.4)  # untimed driver work between windows (part of R)
            cost = FA_COST.get(name, 4.0)
            d = cost * rng.uniform(1 - spread, 1 + spread)
            windows.append((name, TH.timer_groups.get(name, "other"), t, t + d))
            key = "timing_s/timing_s/param_sync" if name == "param_sync" else f"timing_s/{name}"
            data[key] = d
            t += d
            if v08 and name == "param_sync":
                # 0.8.0: the rollouter's and the aggregate record are written here, in `step`
                t += 0.2
                records.append((t, Record(cycle, {"fully_async/rollouter/idle_ratio": 0.1})))
                if aggregate:
                    records.append((t, Record(cycle, aggregate)))
                else:
                    records.append((t, Record(cycle, {})))  # nothing aggregated yet
        t += rng.uniform(0.0, 0.3)
        data["timing_s/step"] = t - start
        if not v08:
            data["dynamic_resource/mq_size"] = 3
        if last_of_cycle and cycle % 3 == 0:  # checkpoint after `step`
            ckpt = rng.uniform(3.0, 8.0)
            data["timing_s/save_checkpoint"] = ckpt
            t += ckpt
        if last_of_cycle and not v08:
            t += 0.2  # after `step`: the rollouter's record, then the aggregate
            records.append((t, Record(cycle, {"fully_async/rollouter/idle_ratio": 0.1})))
            if aggregate:
                records.append((t, Record(cycle, aggregate)))
        if last_of_cycle:
            truth += [(cycle, *w) for s, ws in pending for w in ws]
            pending, aggregate = [], {}
        # this sub-step joins the aggregator only now: it is in the next record
        pending.append((sub, windows))
        for k, v in data.items():
            if not k.startswith("timing_s/"):
                aggregate[k] = v  # verl aggregates these as the last value or an average
            else:
                aggregate[k] = aggregate.get(k, 0.0) + v
        t += rng.uniform(0.0, 0.5)
    return records, truth


def fully_async_timelines(records, delay=0.2, shifted=True):
    from rlhf_exporter.diagnosis.timeline import Placer

    sd, placer, out = StreamDiagnoser(TH), Placer(TH, delay), []
    for arrival, rec in records:
        d = sd.feed(rec).diagnosis
        if d is None:
            if not rec.data:
                placer.empty(arrival, rec.step)
            continue
        if shifted:
            out.append((arrival, placer.place(d.step, d.windows, d.timers, rec.data, arrival)))
        else:
            out.append((arrival, (rebuild(d.step, d.windows, d.timers, arrival, TH, delay),)))
    return out


def _fully_async_join(seed, n_sync, roles, shifted=True, v08=False, start=1000.0):
    """The join over a simulated fully-async job whose sub-steps vary by +-5 % (a steady
    job: docs/gpu-windows.md has the error at +-10 and +-15 %)."""
    records, truth = simulate_fully_async(12, n_sync, seed, t0=start, v08=v08, spread=0.05)
    clock = FakeClock(start)
    join = GpuWindowJoin(horizon=1200.0)
    poll = _nvml_poller(make_module(_fake_gpus(truth, roles, start), clock), join, roles)
    for arrival, tls in fully_async_timelines(records, shifted=shifted):
        while clock() < arrival:
            clock.advance(1.0)
            poll()
        if shifted:  # one record's sub-steps together, as the sidecar's joiner does
            join.add_timelines(tls)
        else:
            for tl in tls:
                join.add_timeline(tl)
    return join.counters(), truth


def _worst_share_error(counters, truth, roles):
    steps = {st for st, *_x in truth}
    worst = 0.0
    for role in ("rollout", "trainer"):
        truth_shares = _truth_shares(truth, role, steps)
        for group in ("rollout", "logprob", "update"):
            busy, avail = counters[((), group, role)]
            worst = max(worst, abs(busy / avail - truth_shares[group]))
    return worst


@pytest.mark.parametrize(
    "n_sync,seed,v08",
    [(2, 3, False), (4, 4, False), (3, 6, True), (3, 4, False), (4, 7, True), (2, 8, False)],
)
def test_fully_async_shifted_records_busy_share_within_5pp(n_sync, seed, v08):
    roles = ["rollout", "rollout", "trainer", "trainer"]
    counters, truth = _fully_async_join(seed, n_sync, roles, v08=v08)
    assert _worst_share_error(counters, truth, roles) <= 0.05
    # the untimed remainder: the GPUs idle through it (R is ~1.5 s a sub-step, beside busy
    # windows whose per-sub-step durations the record does not have: substeps.place_substeps
    # fits them to the GPU signal), held to the same 5 points as every other group
    for role in ("rollout", "trainer"):
        busy, avail = counters[((), "other", role)]
        assert abs(busy / avail - IDLE_PERCENT / 100) <= 0.05, (role, busy / avail)
    # every window's GPU-seconds are found (within the sub-steps' spread), none twice; the
    # run's first record is not placed (no earlier record anchors it)
    for group in ("rollout", "logprob", "update", "sync"):
        true_total = sum(e - s for st, _n, g, s, e in truth if g == group and st > 1)
        _busy, avail = counters[((), group, "trainer")]
        assert avail == pytest.approx(2 * true_total, rel=0.05), group
    # placed as if each record were its own cycle (the old way), the same join is wrong
    unshifted, _ = _fully_async_join(seed, n_sync, roles, shifted=False, v08=v08)
    assert _worst_share_error(unshifted, truth, roles) > 0.1


@pytest.mark.parametrize("v08", [False, True])
def test_fully_async_driver_gaps_do_not_count_the_checkpoint(v08):
    """The driver's time between sub-steps is estimated from the records' arrivals; a
    checkpoint after `step` (every third cycle here, 3-8 s) is not driver time. 0.8.0 logs it
    in the record of its own cycle, 0.9.1 in the next one (timeline.Placer)."""
    from rlhf_exporter.diagnosis.timeline import Placer

    for seed in range(3, 9):
        records, _truth = simulate_fully_async(12, 3, seed, v08=v08, spread=0.05)
        sd, placer, gaps = StreamDiagnoser(TH), Placer(TH, 0.2), []
        for arrival, rec in records:
            d = sd.feed(rec).diagnosis
            if d is None:
                if not rec.data:
                    placer.empty(arrival, rec.step)
                continue
            placer.place(d.step, d.windows, d.timers, rec.data, arrival)
            gaps.append(placer.gap())
        # the simulated driver gap is at most 0.8 s a sub-step (0.2 s more at a write); a
        # checkpoint taken for driver time added 0.4-1.4 s a sub-step before
        assert max(gaps) <= 1.0, (seed, gaps)


def test_place_substeps_fits_each_sub_steps_windows_to_its_busy_stretch():
    """Two sub-steps laid with the record's mean durations (4 s each) where the first really
    ran 3.4 s and the second 4.6 s: placed together, each busy window lands on its own stretch
    and each sub-step keeps its own untimed seconds, none of them busy."""
    from rlhf_exporter.diagnosis.substeps import place_substeps
    from rlhf_exporter.diagnosis.timeline import Timeline

    def sub(start):
        ivs = (
            rebuild_interval(UNTIMED, "other", start, start + 0.5),
            rebuild_interval(GEN, "rollout", start + 0.5, start + 4.5),
            rebuild_interval(UNTIMED, "other", start + 4.5, start + 5.0),
        )
        return Timeline(1, start, start + 5.0, ivs, 1.0)

    tls = [sub(100.0), sub(105.5)]
    truth = [(100.5, 103.9), (104.9, 109.5)]  # 3.4 s, then 4.6 s of generation

    def busy(t):  # two GPUs fully busy in the true windows
        return 2.0 * sum(max(0.0, min(t, e) - s) for s, e in truth)

    placed = place_substeps(tls, busy)
    gens = [next(iv for iv in tl.intervals if iv.timer == GEN) for tl in placed]
    for iv, (s, e) in zip(gens, truth, strict=True):
        assert iv.start == pytest.approx(s, abs=0.1) and iv.end == pytest.approx(e, abs=0.1)
    for tl in placed:
        untimed = [iv for iv in tl.intervals if iv.timer == UNTIMED]
        assert sum(iv.end - iv.start for iv in untimed) == pytest.approx(1.0, abs=0.1)
        assert sum(busy(iv.end) - busy(iv.start) for iv in untimed) <= 0.2
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(placed))
    # without a signal nothing moves
    assert place_substeps(tls, lambda t: 0.0) == tuple(tls)
    # the sub-step holding param_sync (anchored at its end) is placed alone, wherever it is
    shifted = Timeline(
        1, 111.0, 113.0, (rebuild_interval("param_sync", "sync", 111.0, 113.0),), 1.0
    )
    for run in ([*tls, shifted], [shifted, *tls], [tls[0], shifted, tls[1]]):
        out = place_substeps(run, busy)
        assert len(out) == 3
        assert next(tl for tl in out if tl.intervals[0].timer == "param_sync") == shifted


def test_a_long_fully_async_run_is_placed_in_bounded_pieces():
    """trigger_parameter_sync_step = 20: the 19 sub-steps after the anchor are placed in
    runs of at most MAX_RUN (the dynamic programme's work grows with the run), every one
    of them placed, none overlapping, each busy share still near the truth."""
    from rlhf_exporter.diagnosis.substeps import MAX_RUN

    roles = ["rollout", "rollout", "trainer", "trainer"]
    records, truth = simulate_fully_async(3, 20, seed=3, spread=0.05)
    assert MAX_RUN < 20
    clock = FakeClock(1000.0)
    join = GpuWindowJoin(horizon=5000.0)
    poll = _nvml_poller(make_module(_fake_gpus(truth, roles, 1000.0), clock), join, roles)
    placed = []
    for arrival, tls in fully_async_timelines(records):
        while clock() < arrival:
            clock.advance(1.0)
            poll()
        out = join.add_timelines(tls)
        assert len(out) == len(tls)
        placed += out
    assert len(placed) == 2 * 20
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(placed))
    counters = join.counters()
    want = _truth_shares(truth, "trainer", {st for st, *_x in truth if st > 1})
    busy, avail = counters[((), "update", "trainer")]
    assert abs(busy / avail - want["update"]) <= 0.05


def rebuild_interval(timer, group, start, end):
    from rlhf_exporter.diagnosis.timeline import Interval

    return Interval(timer, group, start, end)


def test_fully_async_sub_steps_split_the_record_and_the_first_holds_param_sync():
    from rlhf_exporter.diagnosis.timeline import Placer, substeps

    records, _truth = simulate_fully_async(3, 3, seed=1)
    sd, placer = StreamDiagnoser(TH), Placer(TH)
    placed = []
    for arrival, rec in records:
        d = sd.feed(rec).diagnosis
        if d is not None:
            placed.append((d, placer.place(d.step, d.windows, d.timers, rec.data, arrival)))
    (_d1, first), (d2, second), _ = placed
    assert first == ()  # N - 1 sub-steps, with nothing before them to anchor them
    assert len(second) == 3  # then N: the previous cycle's last and N - 1 of this one
    assert "param_sync" in {iv.timer for iv in second[0].intervals}
    assert all("param_sync" not in {iv.timer for iv in tl.intervals} for tl in second[1:])
    # the sub-steps are consecutive, the shifted one before the previous record's arrival
    # (and before its checkpoint on the third cycle), the others after it
    arrival1 = records[1][0]
    assert second[0].end <= arrival1 <= second[1].start
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(second[1:]))
    parts = substeps(d2.windows, 3)
    assert sum(p.seconds for p in parts) == pytest.approx(d2.windows.step_seconds, rel=1e-9)
    assert parts[0].seconds - parts[1].seconds == pytest.approx(d2.windows.counted["param_sync"])


def test_fully_async_without_global_step_is_one_block_as_before():
    from rlhf_exporter.diagnosis.timeline import Placer

    data = {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/timing_s/param_sync": 1.0}
    d = StreamDiagnoser(TH).feed(Record(1, data)).diagnosis
    (tl,) = Placer(TH).place(d.step, d.windows, d.timers, data, 100.0)
    assert tl == rebuild(d.step, d.windows, d.timers, 100.0, TH)


def _latest_anchors(posted):
    from rlhf_exporter.join.board import _latest_anchors as latest

    return latest(posted)


def _fully_async_job(records, keep=64):
    from rlhf_exporter.job.state import Job
    from rlhf_exporter.join.board import WindowBoard

    board = WindowBoard(keep=keep)
    job = Job("p", "fa", TH, windows=board)
    for arrival, rec in records:
        job.feed([rec], now=arrival)
    return job, board


@pytest.mark.parametrize("v08", [False, True])
def test_the_sidecar_places_fully_async_sub_steps_as_the_pure_placer_does(v08):
    records, _truth = simulate_fully_async(5, 3, seed=2, v08=v08)
    _job, board = _fully_async_job(records)
    expected = [tl for _a, tls in fully_async_timelines(records, delay=0.0) for tl in tls]
    assert board.recent(("p", "fa")) == tuple(expected)
    assert len(expected) == 3 * 4  # every record but the first, 3 sub-steps each
    # posted in time order without overlap: the joiner keeps every one (_latest_anchors)
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(expected))
    posted = [(("p", "fa"), tl) for tl in expected]
    assert _latest_anchors(posted) == posted
    # a backlog read: only its last record's arrival is known, the one after it is not placed
    job2, board2 = _fully_async_job([])
    job2.feed([rec for _a, rec in records[:4]], now=records[3][0])
    job2.feed([records[4][1]], now=records[4][0])
    job2.feed([records[5][1]], now=records[5][0])
    placed = board2.recent(("p", "fa"))
    assert placed and all(tl.step == records[5][1].step for tl in placed)


def test_fully_async_empty_record_and_repeated_last_step_count_once():
    """verl 0.8.0 writes an empty aggregate when the first cycle syncs before any sub-step
    was aggregated (trigger_parameter_sync_step = 1), and a run can end with its last step
    number twice (the final flush). Neither crashes, double-counts or gives a verdict; the
    flush is counted as a late record (decision table v5)."""
    records, _truth = simulate_fully_async(4, 1, seed=3, v08=True)
    empties = [r for _a, r in records if not r.data]
    assert len(empties) == 1  # the first cycle's
    last_arrival, last = records[-1]
    flush = Record(last.step, {**last.data, "timing_s/update_actor": 99.0})
    records.append((last_arrival + 30.0, flush))
    job, board = _fully_async_job(records)
    steps = {r.step for _a, r in records}
    assert job.steps == len(steps)  # one step per step number: neither adds one
    classified = {r.step for _a, r in records if "timing_s/step" in r.data}
    assert sum(job.verdict_steps.values()) == len(classified)  # the repeat is not classified again
    assert job.last is not None and job.last.step == last.step
    assert job.last.windows.counted["update_actor"] == pytest.approx(
        last.data["timing_s/update_actor"]
    )  # the first record of the step decided; the flush changed nothing
    assert job.drops == {"late_record": 1}  # the flush came after its step's verdict (v5)
    # the empty record anchors the next one: every classified record is placed
    placed_steps = {tl.step for tl in board.recent(("p", "fa"))}
    assert placed_steps == classified
    # the flush placed nothing more: one timeline per record (N = 1)
    assert len(board.recent(("p", "fa"))) == len(classified)


@pytest.mark.parametrize("v08", [False, True])
def test_sidecar_joins_fully_async_shifted_records_within_5pp(tmp_path, monkeypatch, v08):
    """The same accuracy through the sidecar's own sources: the verl file source reads each
    record as verl writes it (rollouter's, then the aggregate), the NVML source polls."""
    roles = ["rollout", "rollout", "trainer", "trainer"]
    sim = simulate_fully_async(10, 3, seed=5, t0=1000.0, v08=v08, spread=0.05)
    snap, truth, board = run_sidecar(tmp_path, monkeypatch, roles, keep=64, sim=sim)
    busy, total = _window_values(snap)
    steps = {st for st, *_x in truth if st > 1}  # the first record has no anchor
    for role in ("rollout", "trainer"):
        want = _truth_shares(truth, role, steps)
        for group in ("rollout", "logprob", "update"):
            key = ("p", "e", group, role)
            assert abs(busy[key] / total[key] - want[group]) <= 0.05, (key, busy[key] / total[key])
        key = ("p", "e", "other", role)  # the untimed remainder: the GPUs idle through it
        assert abs(busy[key] / total[key] - IDLE_PERCENT / 100) <= 0.05, (
            key,
            busy[key] / total[key],
        )
    placed = board.recent(("p", "e"))
    assert len(placed) == 3 * 9  # N sub-steps for every record after the first


def test_verl_06_sync_rollout_places_the_weight_load_before_the_generation():
    """0.6.1 `workers/fsdp_workers.py`: rollout_mode() (the weight load) 926, then
    generate_sequences 929, inside `gen`; REMAX's gen_max after `gen` (ray_trainer.py:1051).
    The split's names come from the thresholds (`split_timers`), not from the order."""
    from rlhf_exporter.diagnosis import Thresholds
    from rlhf_exporter.thresholds_file import default_document

    data = {
        "timing_s/step": 20.0,
        "timing_s/gen": 9.0,
        "timing_s/generate_sequences": 6.0,
        "timing_s/gen_max": 3.0,
        "timing_s/update_actor": 5.0,
    }
    d = StreamDiagnoser(TH).feed(Record(1, data)).diagnosis
    tl = rebuild(d.step, d.windows, d.timers, 100.0, TH)
    order = [iv.timer for iv in tl.intervals if iv.timer != UNTIMED]
    assert order == ["gen_weight_load", "generate_sequences", "gen_max", "update_actor"]
    renamed = Thresholds.from_documents(
        default_document(), {"split_timers": {"generate_sequences": ["gen", "load"]}}
    )
    d = StreamDiagnoser(renamed).feed(Record(1, data)).diagnosis
    tl = rebuild(d.step, d.windows, d.timers, 100.0, renamed)
    assert [iv.timer for iv in tl.intervals if iv.timer != UNTIMED][:2] == [
        "load",
        "generate_sequences",
    ]


def test_a_board_nobody_reads_stays_bounded():
    """Without an NVML source (a node with no GPU, or NVML down) nothing takes the posted
    steps: the board still holds at most keep x max_jobs of them, the newest."""
    from rlhf_exporter.join.board import WindowBoard

    records, _ = simulate(3, seed=4, t0=1000.0)
    (tl, *_) = timelines(records, delay=0.0)
    board = WindowBoard(keep=2, max_jobs=3)
    for i in range(50):
        board.post((f"p{i % 5}", "e"), tl._replace(step=i))
    new = board.take_new()
    assert len(new) == 2 * 3
    assert [t.step for _, t in new] == list(range(44, 50))
    assert len(board.jobs()) == 3 and board.take_new() == []
