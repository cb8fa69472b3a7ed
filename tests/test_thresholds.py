"""The thresholds file: defaults, partial overrides, and errors that name the key."""

from __future__ import annotations

import pytest

from rlhf_exporter.thresholds_file import ConfigError, load_thresholds


def write(tmp_path, text: str):
    path = tmp_path / "thresholds.yaml"
    path.write_text(text)
    return path


def test_partial_override_keeps_every_other_default(tmp_path):
    th = load_thresholds(write(tmp_path, "verdict:\n  min_share: 0.5\n"))
    assert th.min_share == 0.5
    assert th.min_margin == 0.05 and th.cost_ratio == 1.2


def test_timer_groups_can_be_extended(tmp_path):
    th = load_thresholds(write(tmp_path, "groups:\n  rollout: [gen, my_rollout_timer]\n"))
    assert th.timer_groups["my_rollout_timer"] == "rollout"


def test_empty_file_means_defaults(tmp_path):
    assert load_thresholds(write(tmp_path, "")).min_share == 0.35


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "verdict:\n  min_shar: 0.5\n",
            "verdict.min_shar: unknown key (did you mean 'verdict.min_share'?)",
        ),
        ("verdict:\n  min_share: high\n", "verdict.min_share: expected a number, got 'high'"),
        ("verdict:\n  min_share: -0.1\n", "verdict.min_share: must not be negative"),
        ("verdict: 3\n", "verdict: expected a mapping"),
        ("change:\n  min_baseline_steps: 20\n", "change.min_baseline_steps: must not exceed"),
        ("change:\n  baseline_steps: 2.5\n", "change.baseline_steps: must be a whole number"),
        ("groups:\n  update: [gen]\n", "groups.update: timer 'gen' is already in groups.rollout"),
        ("groups:\n  tools: [x]\n", "groups.tools: unknown group"),
        ("groups:\n  rollout: gen\n", "groups.rollout: expected a list of timer names"),
        ("alerts:\n  window: soon\n", "alerts.window: expected a duration"),
        ("- a\n- b\n", "expected a mapping of keys"),
        ("verdict: [unclosed\n", "invalid YAML (line"),
    ],
)
def test_bad_files_name_the_key_and_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_thresholds(write(tmp_path, text))
    assert message in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_thresholds(tmp_path / "nope.yaml")


def test_one_duration_syntax_for_the_file_the_rules_and_the_dashboards():
    from rlhf_exporter.diagnosis.thresholds import seconds
    from rlhf_exporter.render import rules
    from rlhf_exporter.render.dashboards import queries

    assert seconds("10m") == 600 and seconds("1500ms") == 1.5 and seconds("2h") == 7200
    assert seconds(30) == 30.0
    assert rules.seconds is seconds and queries.seconds is seconds
    with pytest.raises(ValueError, match="not a duration"):
        seconds("10 minutes")
