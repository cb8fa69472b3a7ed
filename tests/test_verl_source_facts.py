"""What the project says about verl, checked against verl 0.9.1's own source, read as text
from the installed wheel (`pip install --no-deps verl==0.9.1`; never imported): the actor
names and classes the role map relies on, and the evidence caveats the docs carry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlhf_exporter.render.rules import verl_keys
from rlhf_exporter.sources.roles import RoleMap
from tests.support.verl_config import VERL_VERSION, verl_dir, verl_version

REPO = Path(__file__).resolve().parent.parent

# The classes the role map names, where verl 0.9.1 defines them (FusedWorker is made by
# create_colocated_worker_raw_cls under the name FusedWorkerCLSName).
CLASSES = {
    "TaskRunnerV1": "trainer/main_ppo.py",
    "TaskRunner": "trainer/main_ppo_v0.py",
    "OneStepTaskRunner": "experimental/one_step_off_policy/main_ppo.py",
    "FullyAsyncTaskRunner": "experimental/fully_async_policy/fully_async_main.py",
    "TrainingWorker": "workers/engine_workers.py",
    "DetachActorWorker": "experimental/separation/engine_workers.py",
    "FullyAsyncTrainer": "experimental/fully_async_policy/fully_async_trainer.py",
    "FullyAsyncRollouter": "experimental/fully_async_policy/fully_async_rollouter.py",
    "MessageQueue": "experimental/fully_async_policy/message_queue.py",
    "vLLMHttpServer": "workers/rollout/vllm_rollout/vllm_async_server.py",
    "SGLangHttpServer": "workers/rollout/sglang_rollout/async_sglang_server.py",
    "TRTLLMHttpServer": "workers/rollout/trtllm_rollout/trtllm_async_server.py",
    "CheckpointEngineWorker": "checkpoint_engine/base.py",
    "GlobalRequestLoadBalancer": "workers/rollout/router.py",
    "AgentLoopWorker": "experimental/agent_loop/agent_loop.py",
    "AgentLoopWorkerTQ": "trainer/ppo/v1/agent_loop_tq.py",
    "RewardLoopWorker": "experimental/reward_loop/reward_loop.py",
    "RewardComputeWorker": "experimental/reward_loop/reward_manager/remote.py",
}
NAME_SOURCES = (
    "workers/rollout/vllm_rollout/vllm_async_server.py",
    "workers/rollout/sglang_rollout/async_sglang_server.py",
    "workers/rollout/trtllm_rollout/trtllm_async_server.py",
    "workers/rollout/replica.py",
)
# an f-string that builds a reward or teacher actor name (or a worker-group name prefix)
NAME_FSTRING = re.compile(r'f"([^"]*(?:server|rollout)_(?:reward|teacher)_[^"]*)"')


@pytest.fixture(scope="module")
def verl() -> Path:
    root = verl_dir()
    if root is None or verl_version(root) != VERL_VERSION:
        pytest.skip(
            f"verl {VERL_VERSION} is not installed: `pip install --no-deps verl=={VERL_VERSION}` "
            "(scripts/test.sh does it)"
        )
    return root


def test_every_class_the_role_map_names_is_defined_in_verl(verl):
    roles = RoleMap.default()
    for cls, path in CLASSES.items():
        text = (verl / path).read_text()
        assert re.search(rf"^class {cls}\b", text, re.M), f"{cls} is not defined in {path}"
        assert roles.role(cls) != "other" or cls == "MessageQueue", cls
    assert (
        'FusedWorkerCLSName = "FusedWorker"' in (verl / "single_controller/ray/base.py").read_text()
    )
    assert RoleMap.default().role("FusedWorker") == "trainer"


def test_the_names_verl_builds_for_reward_and_teacher_servers_get_their_role(verl):
    roles = RoleMap.default()
    found = []
    for path in NAME_SOURCES:
        for template in NAME_FSTRING.findall((verl / path).read_text()):
            # {prefix} is the engine's name prefix (vllm_); every other field is a number
            # or a suffix; a worker-group prefix is followed by the worker class and rank
            name = template.replace("{prefix}", "vllm_")
            name = re.sub(r"\{[^}]*\}", "0", name)
            if name.startswith("rollout_"):
                name += "CheckpointEngineWorker_0:0"
            want = "teacher" if "_teacher_" in name else "reward"
            found.append(name)
            for cls in ("vLLMHttpServer", "SGLangHttpServer", "CheckpointEngineWorker"):
                assert roles.role(cls, name) == want, (path, template, name)
    # vLLM, SGLang and TensorRT-LLM servers and both worker-group modes are covered
    assert {n.split("_server_")[0] for n in found if "_server_" in n} >= {
        "vllm",
        "sglang",
        "trtllm",
    }
    assert any(n.startswith("rollout_reward_colocate_") for n in found)
    assert any(n.startswith("rollout_teacher_standalone_") for n in found)
    # and a plain rollout server, by the same code, stays rollout
    assert roles.role("vLLMHttpServer", "vllm_server_0_0") == "rollout"


def test_the_docs_state_the_support_and_every_evidence_caveat():
    support = (REPO / "docs" / "verl-support.md").read_text()
    for text in verl_keys.EVIDENCE_CAVEATS.values():
        assert text in support, text
    assert "verl ≥ 0.6" in support
    assert "verl ≥ 0.6" in (REPO / "README.md").read_text()
    assert "verl (≥ 0.6)" in (REPO / "helm" / "rlhf-exporter" / "README.md").read_text()


def test_caveats_attach_to_the_right_reasons():
    assert verl_keys.caveats("logprob", "mfu_unknown") == (
        verl_keys.EVIDENCE_CAVEATS["v1_logprob_mfu"],
    )
    rollout = verl_keys.caveats("rollout", "preemption")
    assert rollout == (
        verl_keys.EVIDENCE_CAVEATS["fully_async_idle_ratio"],
        verl_keys.EVIDENCE_CAVEATS["unreported_preemptions"],
        verl_keys.EVIDENCE_CAVEATS["v1_rollout_reasons"],
    )
    assert verl_keys.caveats("update", "low_mfu") == ()


def _keys(path: Path) -> set[str]:
    """The evidence keys a trace reports (advice.shown_evidence over its records)."""
    import json

    from rlhf_exporter.diagnosis.advice import shown_evidence

    keys: set[str] = set()
    for line in path.read_text().splitlines():
        try:
            keys |= shown_evidence(json.loads(line)["data"])
        except (ValueError, KeyError, TypeError):
            continue
    return keys


def test_missing_evidence_on_the_sample_traces(sample_traces):
    """V1 logs neither agent-loop statistics nor actor_infer MFU; the legacy trainer and
    one-step-off log both; fully-async logs the misleading rollouter idle ratio."""
    from rlhf_exporter.diagnosis.advice import (
        EVIDENCE_CAVEATS,
        EVIDENCE_KEYS,
        NEEDS,
        REASON_EVIDENCE,
        missing_evidence,
    )

    # a log without the agent loop (and its tool calls) has no use for the reasons that need
    # it: those are not "cannot show"
    applicable = len(REASON_EVIDENCE) - len(NEEDS)

    traces = {p.name: p for p in sample_traces.glob("*.jsonl") if ".expected." not in p.name}
    v1 = [n for n in traces if n.endswith("_v1.jsonl")]
    unreported = "agent_loop_preempted_unreported_v0.jsonl"  # -1 throughout: not evidence
    v0 = [n for n in traces if (n.endswith("_v0.jsonl") or "one_step_off" in n) and n != unreported]
    assert v1 and v0
    for name in v1:
        gaps = missing_evidence(_keys(traces[name]))
        assert len(gaps) == applicable, name  # every reason that applies and needs evidence
        assert all("cannot be seen" in g for g in gaps), name
    for name in v0:
        assert missing_evidence(_keys(traces[name])) == (), name
    gaps = missing_evidence(_keys(traces["fully_async_rollout.jsonl"]))
    assert EVIDENCE_CAVEATS["fully_async_idle_ratio"] in gaps
    # a -1 preemption count is verl's "not reported": the preemption notice appears, alone
    gaps = missing_evidence(_keys(traces[unreported]))
    assert len(gaps) == 1 and gaps[0].startswith("rollout/preemption cannot be seen"), gaps
    assert "-1" in gaps[0]
    # verl 0.6's sync rollout logs no agent loop and no actor_infer MFU
    gaps = missing_evidence(_keys(traces["v06_sync_weight_load_regression.jsonl"]))
    assert len(gaps) == applicable
    # remembering only the EVIDENCE_KEYS a job has seen gives the same answer
    for path in traces.values():
        keys = _keys(path)
        assert missing_evidence(keys & EVIDENCE_KEYS) == missing_evidence(keys), path.name


def test_the_fully_async_shift_is_in_verls_source(verl):
    """The record is logged before the sub-step that synced joins the aggregator
    (timeline.Placer relies on it), `training/global_step` is aggregated as the last value,
    and `dynamic_resource/mq_size` (the marker of 0.9.1's after-`step` logging) is written
    every sub-step."""
    from rlhf_exporter.diagnosis import timeline

    trainer = (verl / "experimental/fully_async_policy/fully_async_trainer.py").read_text()
    fit_step = trainer[trainer.index("async def fit_step(") :]
    fit_step = fit_step[: fit_step.index("\n    def ", 1)]
    assert fit_step.index("self._fit_log_aggregated_training_metrics(") < fit_step.index(
        "self._fit_postprocess_step()"
    )
    post = trainer[trainer.index("def _fit_postprocess_step(") :]
    post = post[: post.index("\n    def ", 1)]
    assert "add_step_metrics(" in post and '"dynamic_resource/mq_size"' in post
    assert 'marked_timer("timing_s/param_sync"' in trainer
    detach = (verl / "experimental/fully_async_policy/detach_utils.py").read_text()
    last = detach[detach.index('"last": [') :]
    last = last[: last.index("]")]
    assert f'"{timeline.GLOBAL_STEP_KEY}"' in last
    assert timeline.LOGGED_AFTER_STEP_PREFIX == "dynamic_resource/"


def test_not_reported_values_and_new_evidence_keys_are_verls(verl):
    from rlhf_exporter.diagnosis.advice import NOT_REPORTED
    from rlhf_exporter.job import record_keys as jobs

    agent_loop = (verl / "experimental/agent_loop/agent_loop.py").read_text()
    assert "num_preempted: int = -1  # -1 means not available" in agent_loop
    assert NOT_REPORTED["timing_s/agent_loop/num_preempted/max"] == -1
    assert 'timing["agent_loop/num_preempted/max"]' in agent_loop
    metric_utils = (verl / "trainer/ppo/metric_utils.py").read_text()
    assert f'"{jobs.ABORTED_KEY}"' in metric_utils
    for stat in jobs.RESPONSE_STATS:
        assert f'"{jobs.NON_ABORTED_PREFIX}{stat}"' in metric_utils
    detach = (verl / "experimental/fully_async_policy/detach_utils.py").read_text()
    assert (
        'f"fully_async/{key}"' in detach
        and jobs.PROCESSING_PREFIX == "fully_async/processing_time/"
    )
    assert set(re.findall(r'"processing_time/(\w+)"', detach)) == jobs.PROCESSING_STATS
    for key in jobs.RESOURCE_KEYS:
        assert f'"{key}"' in detach, key


def test_the_legacy_reward_keys_are_migrated_only_by_fully_async(verl):
    call = "migrate_legacy_reward_impl(config)"
    assert call in (verl / "experimental/fully_async_policy/fully_async_main.py").read_text()
    assert call not in (verl / "trainer/main_ppo.py").read_text()
    assert call not in (verl / "experimental/one_step_off_policy/main_ppo.py").read_text()
    support = (REPO / "docs" / "verl-support.md").read_text()
    assert "silently ignored" in support and "fully_async_main" in support


def test_v1_modes_include_sync_the_default(verl):
    cfg = (verl / "trainer/config/_generated_ppo_trainer.yaml").read_text()
    assert re.search(r"^\s+trainer_mode: sync$", cfg, re.M)
    registered = set()
    for path in (verl / "trainer/ppo/v1").glob("trainer_*.py"):
        registered |= set(re.findall(r'@register_trainer\("(\w+)"\)', path.read_text()))
    assert registered == {"sync", "colocate_async", "separate_async"}
