"""Decision table v5 (section 1): a step written in two records, in the sidecar.

verl <= 0.7's fully-async recipe logs `param_sync` (and `wait_last_valid`) in a second record of
the step, after the one with `timing_s/step`. Once a job has shown such a record, the sidecar
holds each later step until it is complete (the next step's first record, its own S elapsed,
or the job's end) and classifies the merged step then, so serve equals `diagnose`; the first
such step keeps the verdict it had, its late record counted (`late_record`)."""

from __future__ import annotations

import json
import os
import time

from rlhf_exporter.diagnosis import BatchDiagnoser, Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.lifecycle import RayFact
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds

TH = load_thresholds()
S = 20.0  # every step's timing_s/step


def first(i: int) -> dict:
    """The trainer's aggregate of step i (the record with timing_s/step)."""
    return {
        "timing_s/step": S,
        "timing_s/wait_for_enough_samples": 2.0,
        "timing_s/gen": 9.0,
        "timing_s/old_log_prob": 2.0,
        "timing_s/update_actor": 5.0 + (4.0 if i % 4 == 0 else 0.0),
        "perf/total_num_tokens": 1e6 * (2 if i >= 12 else 1),
        "fully_async/trainer/idle_ratio": 0.5,
    }


def second(i: int) -> dict:
    """The recipe's second record of step i: the cycle's param_sync and wait_last_valid."""
    return {"timing_s/param_sync": 1.5 + 0.1 * i, "timing_s/wait_last_valid": 30.0 + i}


def recipe(n: int) -> list[Record]:
    return [Record(i, d) for i in range(1, n + 1) for d in (first(i), second(i))]


def batch(records: list[Record]) -> list[dict]:
    return [d.to_json() for d in BatchDiagnoser(TH).diagnose(records)]


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def served(job: Job, before: object, out: list[dict]) -> None:
    if job.last is not before and job.last is not None:
        out.append(job.last.to_json())


# -- the job ---------------------------------------------------------------------------------


def test_the_first_steps_late_record_keeps_its_verdict_and_is_counted_once():
    clock = Clock()
    job = Job("p", "e", TH, clock=clock)
    job.feed([Record(1, first(1))], clock.t)
    verdict = job.last
    assert verdict is not None and verdict.step == 1 and verdict.shares["sync"] == 0.0
    job.feed([Record(1, second(1))], clock.t + 1)
    assert job.last is verdict  # kept: never classified twice
    assert job.verdict_steps[verdict.verdict] == 1 and sum(job.verdict_steps.values()) == 1
    assert job.drops == {"late_record": 1}
    job.feed([Record(2, first(2))], clock.t + 30)
    assert job.last is verdict  # step 2 is held now: the job writes steps in two records
    job.feed([Record(2, second(2))], clock.t + 31)
    assert job.drops == {"late_record": 1}  # a held step's second record is no late one
    assert job.tick(clock.t + 30 + S)
    assert job.last is not None and job.last.step == 2 and job.last.shares["sync"] > 0.0


def test_held_steps_are_released_by_the_next_steps_first_record():
    records = recipe(15)
    job = Job("p", "e", TH, clock=Clock())
    out: list[dict] = []
    for k, record in enumerate(records):
        before = job.last
        job.feed([record], 1000.0 + k)  # one record a second: no step's S passes
        served(job, before, out)
    assert [d["step"] for d in out] == list(range(1, 15))  # step 15 is still held
    assert job.due == 1000.0 + 28 + S  # its S record's arrival + S
    assert out[1:] == batch(records)[1:14]
    assert job.tick(job.due)
    assert job.last is not None and job.last.to_json() == batch(records)[-1]
    assert not job.tick(job.due or 1e12)  # classified once
    assert job.steps == 15 and sum(job.verdict_steps.values()) == 15
    assert job.drops == {"late_record": 1}


def test_a_held_step_is_released_when_its_s_has_passed():
    clock = Clock()
    job = Job("p", "e", TH, clock=clock)
    job.feed(recipe(2)[:3], 1000.0)  # step 1 with both records, then step 2's S record
    assert job.last is not None and job.last.step == 1
    assert not job.tick(1000.0 + S - 0.5)  # not yet
    assert job.last.step == 1
    clock.t = 1000.0 + S
    assert job.tick()  # the job's own clock
    assert job.last.step == 2 and job.last.shares["sync"] == 0.0  # what it had
    job.feed([Record(2, second(2))], 1000.0 + S + 1)  # too late: counted, verdict kept
    assert job.last.step == 2 and job.last.shares["sync"] == 0.0
    assert job.drops == {"late_record": 2}  # step 1's, then step 2's
    # a second record after the S passed counts as late even when no tick came between
    job.feed([Record(3, first(3))], 2000.0)
    job.feed([Record(3, second(3))], 2000.0 + S + 5)
    assert job.last.step == 3 and job.drops == {"late_record": 3}


def test_a_held_step_is_released_when_the_job_ends():
    for end in ("ray", "marker", "new_run"):
        clock = Clock()
        job = Job("p", "e", TH, clock=clock)
        job.feed(recipe(3)[:5], 1000.0)  # steps 1-2, then step 3's S record: held
        assert job.last is not None and job.last.step == 2
        if end == "ray":
            job.set_ray(RayFact("SUCCEEDED", "raysubmit_1", since=1001.0))
            assert job.tick(1001.0)
        elif end == "marker":  # verl's last record: the job's end marker in the same step
            job.feed([Record(3, {"rlhf_job_finished": 1})], 1001.0)
        else:  # the file was truncated: nothing more comes of this run
            job.new_run()
        assert job.last.step == 3 and sum(job.verdict_steps.values()) == 3, end


def test_reaching_the_total_steps_waits_for_the_last_steps_second_record():
    records = recipe(4)
    job = Job("p", "e", TH, clock=Clock(), total_steps=4)
    for k, record in enumerate(records):
        job.feed([record], 1000.0 + k)
        job.tick(1000.0 + k)
    assert job.finished and job.last is not None and job.last.step == 3
    assert job.tick(1000.0 + 6 + S)
    assert job.last.to_json() == batch(records)[-1]


class Posts:
    def __init__(self) -> None:
        self.timelines: list = []

    def post(self, labels, timeline) -> None:
        self.timelines.append(timeline)


def test_a_held_step_is_placed_in_time_where_its_s_record_arrived():
    board = Posts()
    job = Job("p", "e", TH, clock=Clock(), windows=board)
    job.feed([Record(1, first(1))], 100.0)
    job.feed([Record(1, second(1))], 101.0)
    job.feed([Record(2, first(2))], 200.0)
    job.feed([Record(2, second(2))], 201.0)
    assert [t.step for t in board.timelines] == [1]  # step 2 is held: not placed yet
    job.feed([Record(3, first(3)), Record(3, second(3))], 300.0)
    assert [t.step for t in board.timelines] == [1, 2]
    assert 150.0 < board.timelines[1].end <= 200.0  # where step 2 ended, not its release
    job.feed([Record(4, first(4))], 400.0)  # step 3's S record was followed in its batch
    assert [t.step for t in board.timelines] == [1, 2]  # arrival unknown: not placed


# -- serve == diagnose, through the sources -------------------------------------------------


def test_serve_equals_diagnose_through_the_file_source(tmp_path):
    records = recipe(15)
    expected = batch(records)
    root = tmp_path / "verl"
    (root / "recipes").mkdir(parents=True)
    path = root / "recipes" / "fully_async.jsonl"
    path.touch()
    skew = [0.0]
    src = VerlFileSource(TH, [root], clock=lambda: time.time() + skew[0])
    out: list[dict] = []
    job = None
    for k in range(0, len(records), 2):
        # one step a poll, or its two records in two polls (so both arrivals are known)
        for part in ([records[k], records[k + 1]],) if k % 4 else ([records[k]], [records[k + 1]]):
            with open(path, "ab") as f:
                for r in part:
                    f.write(json.dumps({"step": r.step, "data": dict(r.data)}).encode() + b"\n")
            now = time.time()
            os.utime(path, (now, now))
            before = job.last if job is not None else None
            src.poll_once()
            job = job or next(iter(src._watched.values())).job
            served(job, before, out)
    assert job is not None and [d["step"] for d in out] == list(range(1, 15))
    skew[0] = S + 1  # the last step's S passes: the next poll releases it
    before = job.last
    snap = src.poll_once()
    served(job, before, out)
    assert out[1:] == expected[1:] and len(out) == 15
    assert out[0]["shares"]["sync"] == 0.0 and expected[0]["shares"]["sync"] > 0.0
    assert snap.record_errors.get("late_record") == 1


def test_serve_equals_diagnose_through_push():
    records = recipe(15)
    expected = batch(records)
    clock = Clock()
    src = PushSource(TH, clock=clock)

    def push(record: Record) -> int:
        body = json.dumps(
            {"project": "p", "experiment": "e", "step": record.step, "data": dict(record.data)}
        ).encode()
        return src.handle(None, str(len(body)), lambda n: body, "127.0.0.1").status

    out: list[dict] = []
    job = None
    for record in records:
        clock.t += 1.0
        before = job.last if job is not None else None
        assert push(record) == 200
        job = job or src._jobs["p", "e"].job
        served(job, before, out)
    assert job is not None and [d["step"] for d in out] == list(range(1, 15))
    clock.t += S  # nothing pushed: the next scrape's snapshot releases the held last step
    before = job.last
    snap = src.snapshot()
    served(job, before, out)
    assert out[1:] == expected[1:] and len(out) == 15
    assert snap.record_errors.get("late_record") == 1
