"""A job's state (issue 22): the pure decision, the Jobs API tie, the declared end beside the
log, and real `ray job submit` submissions on a real Ray head (normal end, crash, stop,
head restart)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.lifecycle import RayFact, is_failure, job_state
from rlhf_exporter.sources.ray_jobs import JobBook, tie
from rlhf_exporter.sources.verl_files import CHUNK, VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.procs import wait_until

TH = load_thresholds(None)
DRIVER = Path(__file__).parent / "fixtures" / "ray_jobs" / "verl_like_driver.py"


def state_of(samples, project="p", experiment="e"):
    hot = [
        s.labels[2]
        for s in samples
        if s.name == "rlhf_job_state" and s.labels[:2] == (project, experiment) and s.value == 1
    ]
    assert len(hot) == 1, hot  # one-hot
    return hot[0]


# -- the decision ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stepped", "declared", "fact", "want"),
    [
        (False, False, None, ("unknown", "none")),
        (True, False, None, ("running", "steps")),
        (True, True, None, ("finished", "declared")),
        (False, False, RayFact("PENDING"), ("running", "ray_job")),
        (True, False, RayFact("SUCCEEDED"), ("finished", "ray_job")),
        (True, False, RayFact("STOPPED"), ("finished", "ray_job")),
        (True, True, RayFact("FAILED"), ("failed", "ray_job")),  # Ray outranks the marker
        (True, False, RayFact("LOST"), ("failed", "ray_job")),
        (True, False, RayFact("RUNNING", failure="WORKER_DIED"), ("failed", "actor_death")),
        (True, False, RayFact("RUNNING"), ("running", "steps")),
    ],
)
def test_state_decision(stepped, declared, fact, want):
    assert job_state(stepped=stepped, declared_finished=declared, ray=fact) == want


def test_failure_causes():
    assert is_failure("WORKER_DIED") and is_failure("OUT_OF_MEMORY") and is_failure("NODE_DIED")
    for normal in ("OWNER_DIED", "OUT_OF_SCOPE", "REF_DELETED", "RAY_KILL", "UNKNOWN"):
        assert not is_failure(normal)
    # Ray's JobSupervisor ends every job with WORKER_DIED + an intended exit (Ray 2.60)
    msg = "Worker exit type: INTENDED_USER_EXIT Worker exit detail: exit_actor() is called."
    assert not is_failure("WORKER_DIED", msg)
    assert not is_failure("WORKER_DIED", "", "JobSupervisor")


@pytest.mark.parametrize(
    ("entry", "want"),
    [
        (
            {
                "entrypoint": "python3 -m verl.trainer.main_ppo trainer.project_name=p "
                "trainer.experiment_name=e data.x=1"
            },
            ("p", "e"),
        ),
        (
            {
                "entrypoint": "python a.py '++trainer.project_name=my p' +trainer.experiment_name=\"x\""
            },
            ("my p", "x"),
        ),
        ({"entrypoint": "python a.py trainer.project_name=p"}, None),  # no experiment
        (
            {"entrypoint": "python a.py", "metadata": {"project": "mp", "experiment": "me"}},
            ("mp", "me"),
        ),
        (
            {"entrypoint": "python 'unbalanced trainer.project_name=a trainer.experiment_name=b"},
            ("a", "b"),
        ),
        ({"entrypoint": None}, None),
    ],
)
def test_tie_submission_to_verl_log(entry, want):
    assert tie(entry) == want


def _entry(sid, status, start, overrides="", job_id="", end=0):
    return {"submission_id": sid, "status": status, "start_time": start, "end_time": end,
            "job_id": job_id, "entrypoint": f"python main.py {overrides}"}  # fmt: skip


def test_book_ties_newest_remembers_failures_and_head_restart():
    book = JobBook(max_jobs=2)
    ov = "trainer.project_name=p trainer.experiment_name=e"
    book.update([_entry("a", "FAILED", 1000, ov, "01"), _entry("b", "RUNNING", 2000, ov, "02")])
    tied, newest = book.facts()
    assert tied[("p", "e")].status == "RUNNING" and tied[("p", "e")].submission == "b"
    assert newest is None  # the newest entry is tied: it stands for no sole job
    book.failed_actor("02", "OUT_OF_MEMORY")
    assert book.facts()[0][("p", "e")].failure == "OUT_OF_MEMORY"
    book.failed_actor("01", "WORKER_DIED")  # another submission's actor: not this one's
    assert book.facts()[0][("p", "e")].failure == "OUT_OF_MEMORY"
    # the head restarts: the running submission died with it, and the new head lists nothing
    book.session_changed()
    book.update([])
    tied, _ = book.facts()
    assert tied[("p", "e")].status == "LOST" and tied[("p", "e")].failure == ""
    # bounded: a third tied job pushes the oldest out (counted)
    book.update([_entry("c", "RUNNING", 3000, "trainer.project_name=q trainer.experiment_name=1")])
    book.update([_entry("d", "RUNNING", 4000, "trainer.project_name=q trainer.experiment_name=2")])
    assert set(book.facts()[0]) == {("q", "1"), ("q", "2")} and book.dropped == 1
    # an untied newest entry stands for the sole job
    book.update([_entry("u", "SUCCEEDED", 5000, "", "05", end=6000)])
    assert book.facts()[1] == RayFact("SUCCEEDED", "u", "", 6.0)
    assert book.update([{"status": "WEIRD"}, "junk", {"status": "RUNNING"}]) == {"RUNNING": 1}


def test_job_state_series_and_since():
    now = [1000.0]
    job = Job("p", "e", TH, clock=lambda: now[0], total_steps=2)
    assert state_of(job.samples()) == "unknown"
    job.feed([Record(1, {"timing_s/step": 2.0})])
    assert state_of(job.samples()) == "running"
    now[0] = 1100.0
    job.set_ray(RayFact("RUNNING", failure="NODE_DIED"))
    samples = job.samples()
    assert state_of(samples) == "failed"
    assert {s.name: s.value for s in samples}["rlhf_job_state_timestamp_seconds"] == 1100.0
    assert {s.name: s.value for s in samples}["rlhf_job_finished"] == 0.0
    job.set_ray(None)
    job.feed([Record(2, {"timing_s/step": 2.0})])  # step 2 of total 2: declared finished
    assert state_of(job.samples()) == "finished" and job.summary()["state_signal"] == "declared"
    assert {s.name: s.value for s in job.samples()}["rlhf_job_finished"] == 1.0


def test_fleet_declares_per_job_ends_beside_the_log(tmp_path):
    """Fleet mode: no code in the job. `<experiment>.total_steps` gives one job its total,
    `<experiment>.finished` ends another; a third runs on; a bad total is counted."""
    now = [time.time() + 100]  # the logs were written before: idle
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    for name in ("a", "b", "c"):
        write_jsonl(root / "p" / f"{name}.jsonl", DEMO_PLAN[:3])
    src = VerlFileSource(TH, [root], interval=1.0, clock=lambda: now[0])
    src.poll_once()
    now[0] += 30  # idle logs: the marker files are read
    (root / "p" / "a.total_steps").write_text("3\n")
    (root / "p" / "b.finished").write_text("")
    (root / "p" / "c.total_steps").write_text("many")
    snap = src.poll_once()
    samples = [s for part in snap.parts for s in part]
    assert [state_of(samples, "p", x) for x in "abc"] == ["finished", "finished", "running"]
    assert snap.record_errors["bad_total_steps"] == 1
    (root / "p" / "b.finished").unlink()
    now[0] += 30
    samples = [s for part in src.poll_once().parts for s in part]
    assert state_of(samples, "p", "b") == "running"  # the marker is the state, not a latch


def test_a_big_log_is_exported_once_read_to_its_end(tmp_path):
    """An exporter (re)starting on a log larger than one poll's budget reads it over several
    polls; the job is exported only once the read reached the end, so no scrape shows a
    partial history (Prometheus would take the lower counters for a reset)."""
    root = tmp_path / "logs"
    (root / "p").mkdir(parents=True)
    write_jsonl(root / "p" / "big.jsonl", DEMO_PLAN * 40)
    size = (root / "p" / "big.jsonl").stat().st_size
    src = VerlFileSource(TH, [root], file_budget=CHUNK, poll_budget=CHUNK)
    polls = 0
    while True:
        polls += 1
        steps = [s.value for part in src.poll_once().parts for s in part
                 if s.name == "rlhf_steps_total"]  # fmt: skip
        if steps:
            break
        assert polls < 100
    assert polls >= size // CHUNK >= 2  # it took several polls, all of them hidden
    assert steps == [float(sum(n for _, n in DEMO_PLAN) * 40 + 1)]  # all at once (and step 0)
    assert src.stats["backlog_hidden"] >= polls - 1


def test_a_broken_jobs_api_keeps_the_actor_series_and_the_last_facts():
    """A Jobs API answer that is not usable (here: not a list; in life: larger than the
    body limit, a timeout) is counted and logged once; the actor series stay, and each job
    keeps what Ray last said about it (a failed job stays failed)."""
    from rlhf_exporter.sources.ray import RaySource
    from tests.support.ray_state import RayStateApi

    with RayStateApi() as api:
        api.submit("s1", "p", "e", job_id="02000000")
        api.end("s1", "FAILED")
        src = RaySource(api.url, node_ips=["127.0.0.1"], interval=60, timeout=5)
        assert src.poll_once().up and src.job_fact("p", "e").status == "FAILED"
        real = api._answer

        def broken(path, query):
            return {"oops": 1} if path == "/api/jobs/" else real(path, query)

        api._answer = broken
        snap = src.poll_once()
        assert snap.up and any(s.name == "rlhf_ray_actors" for s in snap.samples)
        assert snap.errors["jobs_api_bad_response"] == 1
        assert src.job_fact("p", "e").status == "FAILED"


# -- a real Ray head, real `ray job submit` (marked `ray`: skipped where Ray is missing) ---------
from rlhf_exporter.sources.ray import RaySource  # noqa: E402
from tests.support.ray_head import RayHead, ray_binary  # noqa: E402
from tests.support.serve import Exporter  # noqa: E402


def submit(head, mode, experiment, *extra):
    out = subprocess.run(
        [ray_binary(), "job", "submit", "--no-wait", "--address", head.dashboard_url,
         "--working-dir", str(DRIVER.parent), "--", sys.executable, DRIVER.name, mode, *extra,
         "trainer.project_name=proj", f"trainer.experiment_name={experiment}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


def facts(src, want):
    src.poll_once()
    got = {e: src.job_fact("proj", e) for e in want}
    return got if all(got[e] and got[e].status == s for e, s in want.items()) else None


@pytest.mark.ray
@pytest.mark.slow
def test_real_submissions_normal_end_crash_stop_and_head_restart(tmp_path):
    head = RayHead("jobstate")
    try:
        src = RaySource(head.dashboard_url, interval=60, timeout=10)
        assert src.poll_once().up  # the baseline poll: deaths from here on are counted
        release = tmp_path / "release"
        submit(head, "ok", "ends")
        submit(head, "crash", "crashes")
        submit(head, "wait", "stopped", str(release))
        submit(head, "wait", "lost", str(release))
        got = wait_until(
            lambda: facts(
                src,
                {"ends": "SUCCEEDED", "crashes": "FAILED", "stopped": "RUNNING", "lost": "RUNNING"},
            ),
            180,
            1.0,
            what="the Jobs API's statuses",
        )
        assert got["crashes"].failure == "WORKER_DIED"  # tied by the driver's Ray job id
        assert got["ends"].failure == ""  # a normal shutdown's deaths are no failure
        snap = src.poll_once()
        failures = {s.labels: s.value for s in snap.samples
                    if s.name == "rlhf_ray_actor_failures_total"}  # fmt: skip
        deaths = {s.labels: s.value for s in snap.samples
                  if s.name == "rlhf_ray_actor_deaths_total"}  # fmt: skip
        assert sum(failures.values()) == 1, (failures, deaths)  # only the killed worker
        assert sum(deaths.values()) > 1  # the normal end's OWNER_DIED / OUT_OF_SCOPE ...
        stop = subprocess.run(
            [ray_binary(), "job", "stop", "--address", head.dashboard_url, got["stopped"].submission],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stderr[-2000:]
        wait_until(lambda: facts(src, {"stopped": "STOPPED"}), 60, 1.0, what="STOPPED")
        # a real `serve` on the same head: each verl log gets its submission's state
        with Exporter(tmp_path / "serve", "--ray", "--ray-address", head.dashboard_url,
                      "--ray-interval", "0.5") as exp:  # fmt: skip
            (exp.verl_root / "proj").mkdir()
            for name in ("ends", "crashes", "stopped", "lost", "untied"):
                write_jsonl(exp.verl_root / "proj" / f"{name}.jsonl", DEMO_PLAN[:1])

            def served():
                got = {n: exp.series("rlhf_job_state", project="proj", experiment=n)
                       for n in ("ends", "crashes", "stopped", "lost", "untied")}  # fmt: skip
                hot = {
                    n: [dict(k)["state"] for k, v in s.items() if v == 1] for n, s in got.items()
                }
                return hot if all(len(v) == 1 for v in hot.values()) else None

            want = {"ends": ["finished"], "crashes": ["failed"], "stopped": ["finished"],
                    "lost": ["running"], "untied": ["running"]}  # fmt: skip
            exp.wait_for(lambda: served() == want, 60, "states served")
            assert exp.value("rlhf_ray_jobs", status="SUCCEEDED") == 1
            # the head restarts under the running job: the new head lists nothing, the job
            # was lost with it (its driver is gone), and no exporter restart forgets that
            port = head.dashboard_port
            head.stop(grace=2)
            head = RayHead("jobstate2", dashboard_port=port)
            got = wait_until(lambda: facts(src, {"lost": "LOST", "ends": "SUCCEEDED"}), 60, 1.0,
                             what="LOST after the head restart")  # fmt: skip
            assert job_state(stepped=True, declared_finished=False, ray=got["lost"])[0] == "failed"
            want["lost"] = ["failed"]
            exp.wait_for(lambda: served() == want, 60, "a lost job served as failed")
    finally:
        head.stop(grace=2)
