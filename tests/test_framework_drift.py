"""`rlhf-exporter framework-drift` on each framework release's own code: the timing keys it
writes, and the ones its mapping does not know.

The trees under tests/fixtures/frameworks/drift/ are the releases' files reduced to the
statements that name a timer (drift/reduce.py; the releases and their sha256 in each
SOURCES.json): OpenRLHF 0.11.2, AReaL 1.0.4, NeMo-RL, slime and ROLL main.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from rlhf_exporter.cli import main
from rlhf_exporter.drift.frameworks import RULES, check, read_keys
from rlhf_exporter.frameworks import TABLES

TREES = Path(__file__).parent / "fixtures" / "frameworks" / "drift"

# every timing key each release writes, as its source spells it (docs/frameworks.md)
WRITTEN = {
    "openrlhf": {
        "timing/make_experience",
        "timing/ppo_train",
        "timing/broadcast",
        "timing/generation",
        "timing/step_total",
    },
    "areal": {
        "timeperf/rollout",
        "timeperf/critic_values",
        "timeperf/ref_logp",
        "timeperf/teacher_logp",
        "timeperf/recompute_logp",
        "timeperf/compute_advantage",
        "timeperf/train_step",
        "timeperf/critic_train_step",
        "timeperf/update_weights",
        "timeperf/save",
        "timeperf/checkpoint_for_recover",
        "timeperf/eval",
        "timeperf/clear_batches",
        "timeperf/{role}_onload",
        "timeperf/{role}_offload",
        "timeperf/rollout_pause",
        "timeperf/rollout_pause_generation",
        "timeperf/rollout_offload",
        "timeperf/rollout_onload",
        "timeperf/rollout_continue_generation",
        "timeperf/rollout_resume",
    },
    "slime": {
        "perf/rollout_time",
        "perf/{store_prefix}log_probs_time",
        "perf/log_probs_time",
        "perf/ref_log_probs_time",
        "perf/data_preprocess_time",
        "perf/train_time",
        "perf/train_wait_time",
        "perf/actor_train_time",
        "perf/ref_model_update_time",
        "perf/update_weights_time",
        "perf/save_model_time",
        "perf/sleep_time",
        "perf/wake_up_time",
        "perf/step_time",
        "perf/{key}_time",
    },
    "roll": {
        "time/step_total",
        "time/step_stop_server",
        "time/step_model_update",
        "time/val_step",
        "time/step_generate",
        "time/ref_log_probs_values",
        "time/old_log_probs",
        "time/step_train",
        "time/get_sample_level_mask",  # the VLM pipeline's, a step window there
    },
}


def _keys(framework: str, path: Path | None = None) -> dict[str, object]:
    keys, files = read_keys(framework, path or TREES / framework)
    assert files > 0
    return {k.key: k for k in check(framework, keys)}


@pytest.mark.parametrize("framework", sorted(WRITTEN))
def test_each_release_writes_the_keys_its_source_names(framework: str) -> None:
    assert set(_keys(framework)) == WRITTEN[framework]


def test_nemo_rl_timers_of_both_grpo_loops_and_not_the_validator() -> None:
    keys = _keys("nemo_rl")
    for name in (
        "total_step_time",
        "generation",
        "prepare_for_generation/total",
        "prepare_for_generation/transfer_and_update_weights",
        "exposed_generation",
        "idle/refit_bubble",
        "weight_sync",
        "policy_and_reference_logprobs",
        "policy_training",
        "checkpointing",
    ):
        assert f"timing/train/{name}" in keys, name
    # validate()'s timer is logged under timing/validation/, not the step's
    assert "timing/train/total_validation_time" not in keys
    where = keys["timing/train/weight_sync"].where  # type: ignore[attr-defined]
    assert where and where[0].startswith("nemo_rl/algorithms/grpo.py:")


@pytest.mark.parametrize("framework", sorted(RULES))
def test_what_the_mapping_names_is_known_and_nothing_else(framework: str) -> None:
    fw = TABLES[framework]
    named = {w.key for w in fw.windows} | set(fw.not_windows) | {fw.step_total}
    for key, k in _keys(framework).items():
        if "{" not in key:
            assert k.known == (key in named), key  # type: ignore[attr-defined]


def test_names_built_at_run_time_are_patterns() -> None:
    slime = _keys("slime")["perf/{store_prefix}log_probs_time"]
    assert slime.known  # type: ignore[attr-defined]
    assert "perf/ref_log_probs_time" in slime.note  # type: ignore[attr-defined]
    areal = _keys("areal")["timeperf/{role}_onload"]
    assert not areal.known  # type: ignore[attr-defined]
    assert "none of its values" in areal.note  # type: ignore[attr-defined]


def test_a_decorated_function_is_a_timer_where_it_is_defined() -> None:
    k = _keys("slime")["perf/sleep_time"]
    assert k.where[0].startswith("slime/backends/megatron_utils/actor.py:")  # type: ignore[attr-defined]


def test_a_timer_a_release_adds_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "openrlhf"
    shutil.copytree(TREES / "openrlhf", tree)
    assert main(["framework-drift", "--framework", "openrlhf", str(tree)]) == 0
    trainer = tree / "trainer" / "ppo_trainer.py"
    text = trainer.read_text().replace(
        "        status['timing/broadcast'] = broadcast_time\n",
        "        status['timing/broadcast'] = broadcast_time\n"
        "        status['timing/reward_model'] = reward_time\n",
    )
    assert "timing/reward_model" in text
    trainer.write_text(text)
    capsys.readouterr()
    assert main(["framework-drift", "--framework", "openrlhf", str(tree)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "timing/reward_model" in x)
    assert line.strip().startswith("UNKNOWN") and "trainer/ppo_trainer.py:" in line
    assert out.rstrip().endswith("1 unknown: timing/reward_model")


def test_json_lists_every_key_with_where(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["framework-drift", "--framework", "roll", str(TREES / "roll"), "--format", "json"])
        == 1
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["framework"] == "roll" and doc["unknown"] == sum(not k["known"] for k in doc["keys"])
    by_key = {k["key"]: k for k in doc["keys"]}
    assert by_key["time/step_total"]["known"]
    assert by_key["time/step_total"]["where"][0].startswith("roll/pipeline/rlvr/rlvr_pipeline.py:")
    # a domain's timers (<domain>/time/...) are no step windows: not listed
    assert "time/compute_advantage" not in by_key
    assert (
        main(["framework-drift", "--framework", "roll", str(TREES / "roll"), "--unknown-only"]) == 1
    )
    out = capsys.readouterr().out
    assert "ok " not in out and "UNKNOWN time/val_step" in out


def test_a_wheel_and_an_sdist_read_as_the_directory(tmp_path: Path) -> None:
    root = TREES / "areal"
    wheel = tmp_path / "areal-1.0.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p in root.rglob("*.py"):
            z.write(p, p.relative_to(root).as_posix())
    sdist = tmp_path / "areal-1.0.4.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.add(root, arcname="areal-1.0.4")
    assert set(_keys("areal", wheel)) == set(_keys("areal", sdist)) == WRITTEN["areal"]


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["framework-drift", "--framework", "slime", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "setup.py").write_text("print('hi')\n")
    assert main(["framework-drift", "--framework", "slime", str(tmp_path / "empty")]) == 2
    assert "no slime source" in capsys.readouterr().err
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01 not an archive")
    assert main(["framework-drift", "--framework", "slime", str(junk)]) == 2
    broken = tmp_path / "broken" / "slime"
    broken.mkdir(parents=True)
    (broken / "x.py").write_text("def (:\n")  # a file that does not parse is skipped
    assert main(["framework-drift", "--framework", "slime", str(tmp_path / "broken")]) == 2
