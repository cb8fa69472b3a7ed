"""The role map on a REAL Ray head (127.0.0.1, always stopped), with actors whose class names
and actor names are those verl 0.9.1 gives them: the name decides before the class wherever
verl reuses a rollout server class for a reward model or a distillation teacher.

Names as verl builds them (verl 0.9.1): `vllm_server_reward_<replica>_<node>`
(workers/rollout/vllm_rollout/vllm_async_server.py:1366-1371), `sglang_server_teacher_...`
(sglang_rollout/async_sglang_server.py:839-843), `trtllm_server_reward_<replica>`
(trtllm_rollout/trtllm_async_server.py:632-636), worker groups
`<name_prefix><Class>_<pg>:<rank>` with name_prefix `rollout_reward_colocate_<replica>`
(single_controller/ray/base.py:656, workers/rollout/replica.py:171-216), and
`reward_loop_worker_<i>` (experimental/reward_loop/reward_loop.py:335).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.roles import ROLES, RoleMap
from rlhf_exporter.thresholds_file import ConfigError
from tests.support.procs import wait_until

# (class name as Ray reports it, actor name or None, role)
VERL_ACTORS = [
    # drivers: main_ppo (v0, V1), one-step-off, fully-async
    ("TaskRunner", None, "driver"),
    ("TaskRunnerV1", None, "driver"),
    ("OneStepTaskRunner", None, "driver"),
    ("FullyAsyncTaskRunner", None, "driver"),
    # training workers
    ("WorkerDict", "abc123WorkerDict_0:0", "trainer"),
    ("FusedWorker", None, "trainer"),
    ("ActorRolloutRefWorker", None, "trainer"),
    ("TrainingWorker", None, "trainer"),
    ("DetachActorWorker", None, "trainer"),
    ("CriticWorker", None, "trainer"),
    ("FullyAsyncTrainer", None, "trainer"),
    # rollout servers, the weight-transfer workers, the request router, fully-async's rollouter
    ("vLLMHttpServer", "vllm_server_0_0", "rollout"),
    ("SGLangHttpServer", "sglang_server_1_0", "rollout"),
    ("TRTLLMHttpServer", "trtllm_server_0", "rollout"),
    ("CheckpointEngineWorker", "rollout_colocate_0CheckpointEngineWorker_0:0", "rollout"),
    ("GlobalRequestLoadBalancer", None, "rollout"),
    ("FullyAsyncRollouter", None, "rollout"),
    # the same server classes serving a reward model: the name decides
    ("vLLMHttpServer", "vllm_server_reward_0_0", "reward"),
    ("SGLangHttpServer", "sglang_server_reward_1_0", "reward"),
    ("TRTLLMHttpServer", "trtllm_server_reward_0", "reward"),
    (
        "CheckpointEngineWorker",
        "rollout_reward_colocate_0CheckpointEngineWorker_0:0",
        "reward",
    ),
    # ... and a distillation teacher
    ("vLLMHttpServer", "vllm_server_teacher_0_0", "teacher"),
    ("SGLangHttpServer", "sglang_server_teacher_0_1", "teacher"),
    (
        "CheckpointEngineWorker",
        "rollout_teacher_standalone_0CheckpointEngineWorker_0:1",
        "teacher",
    ),
    # agent loop, reward workers, fully-async's queue
    ("AgentLoopWorker", None, "agent_loop"),
    ("AgentLoopWorkerTQ", None, "agent_loop"),
    ("RewardLoopWorker", "reward_loop_worker_0", "reward"),
    ("RewardComputeWorker", None, "reward"),
    ("MessageQueue", None, "other"),
]


def test_roles_by_class_and_name_without_ray():
    roles = RoleMap.default()
    assert "teacher" in ROLES
    for cls, name, role in VERL_ACTORS:
        assert roles.role(cls, name or "") == role, (cls, name)
    # a per-class summary has no names: a reward server then counts under its class's role
    assert roles.role("vLLMHttpServer") == "rollout"
    # a name rule needs the whole name to match; an unrelated name leaves the class to decide
    assert roles.role("vLLMHttpServer", "my_server_rewarder") == "rollout"
    assert roles.role("SomethingElse", "vllm_server_reward_0_0") == "reward"


def test_name_rules_in_a_file_come_first(tmp_path):
    f = tmp_path / "roles.yaml"
    f.write_text(
        "- {role: reward, name: 'judge_.*'}\n- {role: other, name: 'vllm_server_teacher_.*'}\n"
    )
    roles = RoleMap.from_file(str(f))
    assert roles.role("vLLMHttpServer", "judge_0") == "reward"
    assert roles.role("vLLMHttpServer", "vllm_server_teacher_0_0") == "other"
    assert roles.role("vLLMHttpServer", "vllm_server_reward_0_0") == "reward"  # defaults after
    for text, message in [
        ("- {role: reward, name: 'x', pattern: 'y'}\n", "one of 'pattern'"),
        ("- {role: reward, name: ''}\n", "'name' must be a non-empty string"),
        ("- {role: teachers, name: 'x'}\n", "unknown role 'teachers'"),
        ("- {role: reward, name: '('}\n", "invalid regular expression"),
    ]:
        f.write_text(text)
        with pytest.raises(ConfigError) as err:
            RoleMap.from_file(str(f))
        assert message in str(err.value), (text, str(err.value))


# -- the real Ray head -------------------------------------------------------------------------
try:  # only the tests marked `ray` use it; tests/conftest.py skips them where Ray is missing
    import ray
except ImportError:
    ray = None
from tests.support.ray_head import RayHead  # noqa: E402


def values(snapshot, name):
    return {s.labels: s.value for s in snapshot.samples if s.name == name}


class _Actor:
    def pid(self):
        return os.getpid()


def _remote_class(name):
    cls = type(name, (_Actor,), {})
    cls.__qualname__ = name
    return ray.remote(num_cpus=0)(cls)


@pytest.fixture(scope="module")
def cluster():
    head = RayHead()
    try:
        ray.init(
            address=head.gcs_address,
            namespace="rlhf-exporter-roles",
            log_to_driver=False,
            configure_logging=False,
        )
        classes = {cls: _remote_class(cls) for cls, _, _ in VERL_ACTORS}
        actors = []
        for cls, name, role in VERL_ACTORS:
            opts = {"name": name} if name else {}
            actors.append((classes[cls].options(**opts).remote(), cls, name, role))
        pids = ray.get([a.pid.remote() for a, *_ in actors], timeout=300)
        yield SimpleNamespace(head=head, actors=actors, pids=pids)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop()


@pytest.mark.ray
@pytest.mark.slow
def test_real_verl_actors_get_their_roles_and_deaths_their_role(cluster):
    src = RaySource(cluster.head.dashboard_url, interval=60, timeout=10, per_class=True)
    snap = src.poll_once()
    assert snap.up, snap.errors
    expect = {role: 0 for role in ROLES}
    for *_, role in VERL_ACTORS:
        expect[role] += 1
    alive = {
        role: n for (role, state), n in values(snap, "rlhf_ray_actors").items() if state == "ALIVE"
    }
    assert alive == expect
    # Ray reports the class names and actor names verl's code produces
    by_class = values(snap, "rlhf_ray_actors_by_class")
    for cls, _, _ in VERL_ACTORS:
        assert by_class[(cls, "ALIVE")] >= 1, cls
    # each PID gets its actor's role (what the GPU source charges memory to)
    roles = src.pid_roles()
    for pid, (_, cls, name, role) in zip(cluster.pids, cluster.actors, strict=True):
        assert roles[pid] == role, (cls, name)
    # a reward server's death is a reward death, a teacher's a teacher death, not rollout's
    victims = [
        (a, role)
        for a, cls, name, role in cluster.actors
        if name in ("vllm_server_reward_0_0", "sglang_server_teacher_0_1")
    ]
    for actor, _ in victims:
        ray.kill(actor)

    def counted():
        s = src.poll_once()
        deaths = values(s, "rlhf_ray_actor_deaths_total")
        return s if sum(deaths.values()) >= 2 else None

    snap = wait_until(counted, 60, 0.5, what="two deaths counted")
    deaths = values(snap, "rlhf_ray_actor_deaths_total")
    assert deaths == {("reward", "RAY_KILL"): 1.0, ("teacher", "RAY_KILL"): 1.0}
    alive = {
        role: n for (role, state), n in values(snap, "rlhf_ray_actors").items() if state == "ALIVE"
    }
    assert alive["reward"] == expect["reward"] - 1 and alive["teacher"] == expect["teacher"] - 1
    assert alive["rollout"] == expect["rollout"]
