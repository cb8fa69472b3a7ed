"""The stacks source's bounds, lifecycle and failures (issue 39; rlhf_exporter/sources/stacks.py).

Against tests/support/ray_state.py over real HTTP: Ray's state and Jobs APIs in Ray 2.60's
shape, and `GET /worker/traceback` answering what a test scripts (the real head's answers are
tests/test_stacks_live.py's and the fixtures'): a stack, Ray 2.60's 403 and 500 texts, a
dashboard without the endpoint (404), token auth (401/403), hostile bodies.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis import stacks
from rlhf_exporter.diagnosis.stall import StallLimit
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.ray_token import RayToken
from rlhf_exporter.sources.stacks import OUTCOMES, StackSource, keep_frames, read_error
from tests.support.ray_state import RayStateApi

FIXTURES = Path(__file__).parent / "fixtures" / "stacks"
LOCKED = (FIXTURES / "ray/rollout_lock/vLLMHttpServer-vllm_server_0_0.native.txt").read_text()
WAITING = (FIXTURES / "ray/rollout_lock/TaskRunner-task_runner.native.txt").read_text()
PROFILING_OFF = (
    "Profiling is disabled by default for security reasons. To enable profiling, set the "
    "environment variable RAY_DASHBOARD_ENABLE_PROFILING=1 on the Ray head node."
)
NO_PY_SPY = "Failed to execute: py-spy is not installed"
NO_PTRACE = (  # profile_manager's message around py-spy's own words
    "Failed to execute `['py-spy', 'dump', '-p', '7']`.\n\nNote that this command requires "
    "`py-spy` to be installed with root permissions.\n=== stderr ===\nError: Permission "
    "denied (os error 13)\n\n=== stdout ===\n"
)
# Ray 2.60's answer (500) for a SIGSTOPped process: the real verl job's trainer WorkerDict
# (tests/test_real_verl.py's hang): py-spy cannot suspend a stopped process
STOPPED = (FIXTURES / "ray/stopped/WorkerDict.native.txt").read_text()
REAL_RUNNER = (FIXTURES / "ray/stopped/TaskRunner.native.txt").read_text()  # the same job's
REAL_DRIVER = (FIXTURES / "ray/stopped/driver.native.txt").read_text()
GONE = "Failed to execute ...\nError: Failed to get process executable name. Check that the process is running."


class Clock:
    def __init__(self, now: float = 10_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def cluster(api: RayStateApi, pids: list[int], classes: list[str] | None = None) -> RaySource:
    api.submit("raysubmit_1", "p", "e", job_id="02000000")
    for i, pid in enumerate(pids):
        cls = (classes or ["WorkerDict"])[i % len(classes or ["WorkerDict"])]
        api.alive(f"a{i}", cls, pid=pid, job_id="02000000")
    ray = RaySource(api.url, node_ips=["127.0.0.1"])
    ray.poll_once()
    return ray


def job(last: float, state: str = "running", experiment: str = "e") -> dict:
    return {"project": "p", "experiment": experiment, "state": state, "last_step_time": last,
            "baseline_step_seconds": 1.0, "between_steps_max": 0.0}  # fmt: skip


def source(api, ray, jobs, clock, **kw) -> StackSource:
    return StackSource(api.url, ray, [lambda: jobs], StallLimit(3.0, 60.0), clock=clock, **kw)


def series(src: StackSource, name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in src.snapshot().samples if s.name == name}


def test_a_round_when_stalled_again_every_and_forgotten_once_it_steps():
    clock = Clock()
    jobs = [job(clock.now - 30)]  # 30 s without a step: under the 60 s limit
    with RayStateApi() as api:
        api.stacks = {101: (200, LOCKED), 102: (200, WAITING)}
        api.tasks = [  # the job's RUNNING tasks: the TaskRunner's run awaits the generate
            {"worker_pid": 102, "task_id": "t1", "parent_task_id": "f" * 40 + "02000000",
             "name": "TaskRunner.run", "state": "RUNNING", "job_id": "02000000"},
            {"worker_pid": 101, "task_id": "t2", "parent_task_id": "t1",
             "name": "vLLMHttpServer.generate", "state": "RUNNING", "job_id": "02000000"},
            {"worker_pid": 909, "task_id": "t3", "parent_task_id": "t1",
             "name": "OtherJob.run", "state": "RUNNING", "job_id": "03000000"},
        ]  # fmt: skip
        ray = cluster(api, [101, 102], ["vLLMHttpServer", "TaskRunner"])
        src = source(api, ray, jobs, clock, every=300.0)
        src.poll_once()
        assert api.stack_requests == [] and src.round_of("p", "e") is None
        clock.now += 40  # 70 s: stalled
        src.poll_once()
        found = src.round_of("p", "e")
        assert found is not None and found.answer.startswith("rollout: lock")
        runner = next(p for p in found.processes if p.pid == 102)
        assert runner.wait is not None and runner.wait.detail.startswith(
            "ray.get in TaskRunner.run"
        )
        assert runner.wait.detail.endswith(" on vLLMHttpServer.generate")  # not OtherJob's
        assert len(api.stack_requests) == 2
        assert {q["native"] for q in api.stack_requests} == {"1"}
        rollout = next(q for q in api.stack_requests if q["pid"] == "101")
        assert rollout["subprocesses"] == "1" and rollout["node_id"] == "n1"
        assert series(src, "rlhf_job_stalled_in") == {
            ("p", "e", "rollout", "lock"): 1.0,
            ("p", "e", "driver", "ray_get"): 1.0,
        }
        clock.now += 100  # still stalled, within `every`: the same round, no new request
        src.poll_once()
        assert src.round_of("p", "e") is found and len(api.stack_requests) == 2
        clock.now += 250  # past `every`: taken again
        src.poll_once()
        assert src.round_of("p", "e") is not found and len(api.stack_requests) == 4
        jobs[0] = job(clock.now - 1)  # it stepped
        src.poll_once()
        assert src.round_of("p", "e") is None and not series(src, "rlhf_job_stalled_in")
        assert series(src, "rlhf_exporter_stack_reads_total")[("ok",)] == 4.0
        jobs[0] = job(clock.now - 500, state="finished")  # a finished job never stalls
        src.poll_once()
        assert src.round_of("p", "e") is None and len(api.stack_requests) == 4


def test_the_ray_token_goes_with_every_read_as_the_ray_source_sends_it(tmp_path):
    """serve hands the Ray source's token (`RayToken.header`, read at each request: a
    rotated Secret is picked up) to the stacks source: each stack and the tasks request
    carry `Authorization: Bearer`, as Ray 2.60's token auth checks."""
    clock = Clock()
    secret = tmp_path / "token"
    secret.write_text("first-token\n")
    token = RayToken(path=str(secret))
    with RayStateApi() as api:
        api.stacks = {101: (200, LOCKED), 102: (200, WAITING)}
        api.tasks = []
        ray = cluster(api, [101, 102], ["vLLMHttpServer", "TaskRunner"])
        src = source(api, ray, [job(clock.now - 500)], clock, headers=token.header)
        api.authorization.clear()
        src.poll_once()
        secret.write_text("second-token-rotated\n")  # the mounted Secret rotated
        clock.now += 400  # past `every`: a new round
        src.poll_once()
    mine = [(path, auth) for path, auth in api.authorization if path != "/api/jobs/"]
    assert {p for p, _ in mine} == {"/worker/traceback", "/api/v0/tasks"}
    assert [a for p, a in mine if p == "/worker/traceback"] == (
        ["Bearer first-token"] * 2 + ["Bearer second-token-rotated"] * 2
    )
    tasks = {a for p, a in mine if p == "/api/v0/tasks"}
    assert tasks == {"Bearer first-token", "Bearer second-token-rotated"}


def test_a_dashboard_without_the_endpoint_is_asked_once_and_said_once():
    clock = Clock()
    with RayStateApi() as api:  # api.stacks None: GET /worker/traceback is a 404
        ray = cluster(api, [101, 102, 103])
        src = source(api, ray, [job(clock.now - 500)], clock)
        src.poll_once()
        found = src.round_of("p", "e")
        assert found is not None and "no /worker/traceback" in found.why
        assert [p.error for p in found.processes] == ["no_endpoint"] * 3
        assert series(src, "rlhf_job_stacks_unread") == {("p", "e", "no_endpoint"): 3.0}
        reads = series(src, "rlhf_exporter_stack_reads_total")
        assert reads[("no_endpoint",)] == 1.0 and set(k[0] for k in reads) == set(OUTCOMES)
        assert found.folds[0].text() == "trainer: 3 of 3 unread (no_endpoint)"
        assert src.snapshot().up  # no stacks is no broken source: the page fires regardless


def test_each_of_rays_refusals_is_told_apart():
    assert read_error(403, PROFILING_OFF) == "profiling_disabled"
    assert read_error(403, "Forbidden: Invalid authentication token") == "unauthorized"
    assert read_error(401, "Unauthorized: Missing authentication token") == "unauthorized"
    assert read_error(404, "404: Not Found") == "no_endpoint"
    assert read_error(500, NO_PY_SPY) == "no_py_spy"
    assert read_error(500, NO_PTRACE) == "no_permission"
    assert read_error(500, GONE) == "no_process"
    assert read_error(500, STOPPED) == "stopped"  # not no_permission: it names PtraceEvent
    assert read_error(500, "Failed to get agent address for node at IP 1.2.3.4") == "no_agent"
    assert read_error(502, "Bad Gateway") == "http_error"


def test_a_stopped_process_is_where_it_hangs_and_the_others_follow():
    """py-spy's refusal of a SIGSTOPped process is the answer (Ray's real 500 for verl's
    trainer): `stopped`, listed first, counted in rlhf_job_stalled_in, never `unread`."""
    clock = Clock()
    with RayStateApi() as api:
        api.stacks = {101: (500, STOPPED), 102: (200, REAL_RUNNER), 103: (200, REAL_DRIVER)}
        # the TaskRunner's call was sent to the stopped worker, which never took it: it is
        # SUBMITTED_TO_WORKER, not RUNNING; an earlier call of the same task is FINISHED
        root = "f" * 40 + "02000000"
        api.tasks = [
            {"worker_pid": 102, "task_id": "t1", "parent_task_id": root,
             "name": "TaskRunner.run", "state": "RUNNING", "job_id": "02000000"},
            {"worker_pid": 101, "task_id": "t2", "parent_task_id": "t1",
             "name": "WorkerDict.actor_rollout_compute_log_prob",
             "state": "SUBMITTED_TO_WORKER", "job_id": "02000000"},
            {"worker_pid": 101, "task_id": "t0", "parent_task_id": "t1",
             "name": "WorkerDict.actor_rollout_update_actor", "state": "FINISHED",
             "job_id": "02000000"},
        ]  # fmt: skip
        ray = cluster(api, [101, 102], ["WorkerDict", "TaskRunner"])
        # the entrypoint's driver (Jobs API's driver_info), in ray.get on TaskRunner.run
        api.jobs["raysubmit_1"] |= {"driver_info": {"pid": "103"}, "driver_node_id": "n1"}
        ray.poll_once()
        src = source(api, ray, [job(clock.now - 500)], clock)
        src.poll_once()
        found = src.round_of("p", "e")
    assert found is not None and found.why == ""
    assert sorted(p.pid for p in found.processes) == [101, 102, 103]
    stopped = next(p for p in found.processes if p.pid == 101)
    assert stopped.wait is not None and stopped.wait.where == "stopped" and stopped.error == ""
    assert "PtraceEvent" in stopped.text and stopped.message == "Error: Failed to get stack traces"
    assert found.answer.startswith("trainer: stopped (state T (stopped)")
    runner = next(p for p in found.processes if p.pid == 102)
    assert runner.wait is not None and runner.wait.detail == (
        "ray.get in RayPPOTrainer._compute_old_log_prob (ray_trainer.py:1304) on "
        "WorkerDict.actor_rollout_compute_log_prob"
    )
    assert series(src, "rlhf_job_stalled_in") == {
        ("p", "e", "trainer", "stopped"): 1.0,
        ("p", "e", "driver", "ray_get"): 2.0,  # the TaskRunner's and the driver's: one series
    }
    names = [(s.name, s.labels) for s in src.snapshot().samples]
    assert len(names) == len(set(names))  # no series twice (each ray.get has its own detail)
    assert not series(src, "rlhf_job_stacks_unread")
    assert series(src, "rlhf_exporter_stack_reads_total")[("stopped",)] == 1.0


def test_per_process_failures_are_counted_and_the_rest_read():
    clock = Clock()
    with RayStateApi() as api:
        api.stacks = {101: (200, LOCKED), 102: (500, NO_PTRACE), 103: (500, GONE)}
        ray = cluster(api, [101, 102, 103], ["vLLMHttpServer"])
        src = source(api, ray, [job(clock.now - 500)], clock)
        src.poll_once()
        found = src.round_of("p", "e")
        assert found is not None and found.why == ""  # one was read: no round-wide excuse
        assert [p.error for p in found.processes] == ["", "no_permission", "no_process"]
        assert found.folds[0].text() == (
            "rollout: vLLMHttpServer 101 in lock (vLLMHttpServer.generate (verl_shaped_job.py:"
            "72)); 1 of 3 unread (no_permission); 1 of 3 unread (no_process)"
        )
        assert found.processes[1].message == "Error: Permission denied (os error 13)"


def test_a_refusal_a_moment_clears_is_read_again_once_per_round():
    """py-spy may fail on a process whose thread or child exits while it attaches (a vLLM
    server read with its subprocesses): the read is asked once more. Once such a second
    read fails too (py-spy is refused for good), the round asks no process twice."""
    clock = Clock()
    with RayStateApi() as api:
        api.stacks = {101: (200, LOCKED), 102: (500, NO_PTRACE), 103: (500, GONE)}
        api.stacks_first = {101: [(500, NO_PTRACE)]}  # refused once, then read
        ray = cluster(api, [101, 102, 103], ["vLLMHttpServer"])
        src = source(api, ray, [job(clock.now - 500)], clock)
        src.poll_once()
        found = src.round_of("p", "e")
        assert found is not None
        assert [p.error for p in found.processes] == ["", "no_permission", "no_process"]
        assert [int(q["pid"]) for q in api.stack_requests] == [101, 101, 102, 102, 103]
        reads = series(src, "rlhf_exporter_stack_reads_total")
        assert reads[("no_permission",)] == 3.0 and reads[("ok",)] == 1.0


def test_a_console_job_is_tied_by_the_ray_job_id_it_was_read_from():
    """A job the console source read from its trainer's stdout names itself from what it
    printed: no submission names it, so Ray cannot tie it by name. Its summary carries the
    Ray job id the console source read it under, and its stacks are read by that id."""
    clock = Clock()
    with RayStateApi() as api:
        api.stacks = {101: (200, LOCKED), 201: (200, WAITING)}
        api.submit("raysubmit_1", "p", "e", job_id="02000000")
        api.alive("a1", "WorkerDict", pid=101, job_id="02000000")
        api.alive("a2", "WorkerDict", pid=201, job_id="03000000")  # a driver by hand: no name
        ray = RaySource(api.url, node_ips=["127.0.0.1"])
        ray.poll_once()
        printed = job(clock.now - 500, experiment="printed") | {"ray_job_id": "03000000"}
        src = source(api, ray, [job(clock.now - 500), printed], clock)
        src.poll_once()
        found = src.round_of("p", "printed")
        assert found is not None and [p.pid for p in found.processes] == [201]
        untied = source(
            api, ray, [job(clock.now - 500), job(clock.now - 500, experiment="printed")], clock
        )
        untied.poll_once()
        assert untied.round_of("p", "printed").processes == ()  # by name alone: not tied


def test_bounds_processes_jobs_frames_and_bytes_are_kept_and_what_they_drop_counted():
    clock = Clock()
    big = WAITING + "\n" + "    x (y.py:1)\n" * 5000
    with RayStateApi() as api:
        api.stacks = {pid: (200, big) for pid in range(101, 106)}
        ray = cluster(api, list(range(101, 106)))
        jobs = [job(clock.now - 500, experiment="e"), job(clock.now - 500, experiment="f")]
        src = source(api, ray, jobs, clock, max_processes=3, max_jobs=1, max_frames=10,
                     max_bytes=4096)  # fmt: skip
        src.poll_once()
        found = src.round_of("p", "e")
        assert found is not None and src.round_of("p", "f") is None
        assert len(api.stack_requests) == 3
        assert [p.error for p in found.processes] == ["", "", "", "not_read", "not_read"]
        for p in found.processes[:3]:
            assert p.truncated and len(p.text.encode()) <= 4096
            for thread in stacks.parse(p.text)[0].threads:
                assert len(thread.frames) <= 10
        reads = series(src, "rlhf_exporter_stack_reads_total")
        assert reads[("not_read",)] == 2.0 and reads[("jobs_over_limit",)] == 1.0


def test_keep_frames_cuts_each_thread():
    text = keep_frames(WAITING, 2)
    threads = stacks.parse(text)[0].threads
    assert all(len(t.frames) <= 2 for t in threads) and text.count("    ...") == len(threads)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(status=st.sampled_from([200, 403, 404, 500, 502]), body=st.text(max_size=2000))
def test_hostile_answers_never_break_a_round(status, body):
    clock = Clock()
    with RayStateApi() as api:
        api.stacks = {101: (status, body)}
        ray = cluster(api, [101])
        src = source(api, ray, [job(clock.now - 500)], clock, max_bytes=1024)
        src.retry_pause = 0.0
        src.poll_once()
        assert src.snapshot().up
        found = src.round_of("p", "e")
        assert found is not None and len(found.processes) == 1
        proc = found.processes[0]
        assert (proc.wait is None) == (status != 200)
        assert proc.wait is None or proc.wait.where in stacks.WHERE
        assert len(proc.text.encode()) <= 1024 and len(proc.message) <= 300
