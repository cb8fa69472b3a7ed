"""Every verl configuration key the project names can be set as written on verl 0.9.1.

The keys come from the runbook data (render/rules/verl_keys.py, diagnosis/advice.py) and, by
pattern, from everything a user reads: docs/, the generated alerts and runbooks, the chart,
the README. They are checked against verl 0.9.1's own generated configuration, read as YAML
from the installed wheel (`pip install --no-deps verl==0.9.1`; verl is never imported).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import advice
from rlhf_exporter.render.rules import verl_keys
from tests.support.verl_config import (
    MAIN_FILE,
    VERL_VERSION,
    VerlConfig,
    mentions,
    problems,
    struck,
    verl_dir,
    verl_version,
)

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".txt", ".tpl", ".json"}
MEGATRON_FILE = "trainer/config/_generated_ppo_megatron_trainer.yaml"


@pytest.fixture(scope="module")
def config() -> VerlConfig:
    root = verl_dir()
    if root is None:
        pytest.skip(
            f"verl is not installed: `pip install --no-deps verl=={VERL_VERSION}` "
            "(scripts/test.sh does it) to check the runbooks' verl keys"
        )
    version = verl_version(root)
    if version != VERL_VERSION:
        pytest.skip(f"verl {version} is installed; the key check reads verl {VERL_VERSION}")
    return VerlConfig.load(root)


def user_texts() -> dict[str, str]:
    """Every file a user reads that may name a verl key."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    paths += sorted((REPO / "alerts").glob("*.yaml"))
    for folder in ("helm", "examples"):  # the chart, and the example job that uses it
        paths += sorted(p for p in (REPO / folder).rglob("*") if p.suffix in TEXT_SUFFIXES)
    return {str(p.relative_to(REPO)): p.read_text() for p in paths if p.is_file()}


def data_texts() -> dict[str, str]:
    """The prose of the runbook data: advice texts and caveats."""
    out = {}
    for name in ("LOOK_AT", "REASON_MEANING", "VERDICT_MEANING"):
        for k, text in getattr(advice, name).items():
            out[f"advice.{name}[{k!r}]"] = text
    for k, text in verl_keys.EVIDENCE_CAVEATS.items():
        out[f"verl_keys.EVIDENCE_CAVEATS[{k!r}]"] = text
    return out


def named_keys(config: VerlConfig) -> list[tuple[str, str, str]]:
    """(where, key, surroundings) for every key the project names."""
    named = []
    for (verdict, reason), keys in verl_keys.VERL_KEYS.items():
        named += [(f"VERL_KEYS[{verdict}, {reason}]", k, "") for k in keys]
    for fsdp, megatron in verl_keys.ENGINE_VARIANTS.items():
        named += [("ENGINE_VARIANTS", fsdp, ""), ("ENGINE_VARIANTS", megatron, "")]
    for a, b, _ in verl_keys.MOVE_TOGETHER:
        named += [("MOVE_TOGETHER", a, ""), ("MOVE_TOGETHER", b, "")]
    for texts in (data_texts(), user_texts()):
        for where, text in texts.items():
            named += [(where, key, near) for key, near in mentions(text, config.roots)]
    return named


def test_every_key_the_project_names_exists_in_verl_and_is_alive(config):
    named = named_keys(config)
    # the collector is not vacuous: it finds the runbooks' keys in the rendered docs
    in_docs = {k for where, k, _ in named if where == "docs/runbooks.md"}
    assert "actor_rollout_ref.rollout.max_num_seqs" in in_docs
    in_example = {k for where, k, _ in named if where.startswith("examples/")}
    assert "actor_rollout_ref.rollout.n" in in_example
    assert len({k for _, k, _ in named}) >= 40
    assert problems(named, config, verl_keys.DEAD_KEYS, verl_keys.OLDER_KEYS) == []


def test_a_wrong_dead_or_unqualified_old_key_is_reported(config):
    cases = {
        "actor_rollout_ref.rollout.max_num_seq": "not a key",  # a typo
        "reward_model.micro_batch_size_per_gpu": "not a key",  # gone since 0.7.1
        "reward_model.reward_manager": "deprecated",  # still in the YAML, migrated away
        "custom_reward_function.path": "deprecated",
        "actor_rollout_ref.rollout.over_sample_rate": "deprecated",  # read by nothing
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes": "name the version",
    }
    text = "Set " + ", ".join(f"`{k}`" for k in cases) + " and retry."
    found = [("doc.md", k, near) for k, near in mentions(text, config.roots)]
    assert [k for _, k, _ in found] == list(cases)
    report = problems(found, config, verl_keys.DEAD_KEYS, verl_keys.OLDER_KEYS)
    assert len(report) == len(cases)
    for line, (key, why) in zip(report, cases.items(), strict=True):
        assert key in line and why in line, line
    # the same older key with its version next to it is fine, and so is a live key
    ok = (
        "verl 0.6: `actor_rollout_ref.rollout.update_weights_bucket_megabytes`; `trainer.save_freq`"
    )
    named = [("doc.md", k, near) for k, near in mentions(ok, config.roots)]
    assert len(named) == 2
    assert problems(named, config, verl_keys.DEAD_KEYS, verl_keys.OLDER_KEYS) == []


def test_the_pattern_skips_paths_files_and_method_calls(config):
    text = (
        "verl/trainer/ppo/ray_trainer.py, data.jsonl, data.get(key), "
        "$labels.project, trainer.resume_mode=auto"
    )
    assert [k for k, _ in mentions(text, config.roots)] == ["trainer.resume_mode"]


def test_engine_variants_exist_in_their_engine_and_are_named_together(config):
    for fsdp, megatron in verl_keys.ENGINE_VARIANTS.items():
        assert fsdp in config.files[MAIN_FILE], fsdp
        assert megatron in config.files[MEGATRON_FILE], megatron
        assert megatron not in config.files[MAIN_FILE], megatron
        for (verdict, reason), keys in verl_keys.VERL_KEYS.items():
            if fsdp in keys:
                assert megatron in keys, (verdict, reason, fsdp)
        for where, text in user_texts().items():
            if fsdp in text:
                assert megatron in text, (where, fsdp)


def test_keys_that_move_together_are_tied_in_verls_config(config):
    for key, other, _ in verl_keys.MOVE_TOGETHER:
        assert str(config.keys[key]).startswith(f"${{oc.select:{other},"), (key, config.keys[key])


def test_the_dead_and_older_key_lists_are_current(config):
    for key in verl_keys.DEAD_KEYS:
        assert key.rstrip(".") in config.keys, f"{key} is gone from verl {VERL_VERSION}: drop it"
    for key, (_, instead) in verl_keys.OLDER_KEYS.items():
        assert key not in config.keys or key in verl_keys.DEAD_KEYS, key
        if "." in instead and " " not in instead:
            assert instead in config.keys, instead


def test_a_struck_out_key_is_one_not_to_use(config):
    """Docs may name a gone or dead key only struck out (~~key~~), and then it must really be
    gone or dead: a struck-out live key would hide a working setting."""
    seen = []
    for where, text in user_texts().items():
        for key in struck(text, config.roots):
            seen.append(key)
            dead = any(key == k or key.startswith(k) for k in verl_keys.DEAD_KEYS)
            assert dead or key not in config.keys, (where, key)
    assert "reward_model.micro_batch_size_per_gpu" in seen
    text = "~~`trainer.save_freq`~~ and ~~reward_model.use_dynamic_bsz~~"
    assert struck(text, config.roots) == ["trainer.save_freq", "reward_model.use_dynamic_bsz"]
    assert list(mentions(text, config.roots)) == []
