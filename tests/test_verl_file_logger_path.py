"""`VERL_FILE_LOGGER_PATH`: verl's `file` logger writes one named file, whose path holds no
project or experiment (verl/utils/tracking.py:534 in 0.9.1). The exporter watches it by
default and takes the job's labels from its configuration, never from the path."""

from __future__ import annotations

import pytest

from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.settings import resolve
from rlhf_exporter.thresholds_file import ConfigError
from tests.support.serve import Exporter

LABELS = {"RLHF_EXPORTER_PROJECT": "math", "RLHF_EXPORTER_EXPERIMENT": "grpo-7b"}


def test_the_named_file_is_watched_with_labels_from_configuration():
    s = resolve(environ={"VERL_FILE_LOGGER_PATH": "/logs/run.jsonl", **LABELS})
    assert s.verl_file == ["/logs/run.jsonl"]
    assert (s.project, s.experiment) == ("math", "grpo-7b")


def test_without_labels_it_is_a_clear_configuration_error():
    with pytest.raises(ConfigError) as err:
        resolve(environ={"VERL_FILE_LOGGER_PATH": "/logs/run.jsonl"})
    text = str(err.value)
    assert "VERL_FILE_LOGGER_PATH=/logs/run.jsonl" in text
    assert "--project" in text and "trainer.experiment_name" in text
    with pytest.raises(ConfigError):  # one label is not enough
        resolve(environ={"VERL_FILE_LOGGER_PATH": "/x.jsonl", "RLHF_EXPORTER_PROJECT": "p"})


def test_an_explicit_verl_file_or_the_demo_wins():
    env = {"VERL_FILE_LOGGER_PATH": "/logs/run.jsonl"}
    s = resolve(environ={**env, "RLHF_EXPORTER_VERL_FILE": "/other.jsonl"})
    assert s.verl_file == ["/other.jsonl"]
    assert resolve(environ={**env, "RLHF_EXPORTER_DEMO": "true"}).verl_file is None
    assert resolve(environ={}).verl_file is None


@pytest.mark.slow
def test_serve_exports_the_file_under_the_configured_labels(tmp_path):
    log = tmp_path / "checkpoints" / "run.jsonl"  # the path says nothing of the job
    log.parent.mkdir()
    write_jsonl(log, [(REGIMES["sync_bound"], 2)])
    env = {"VERL_FILE_LOGGER_PATH": str(log), **LABELS}
    with Exporter(tmp_path, env=env) as exp:
        exp.wait_for(
            lambda: exp.value("rlhf_steps_total", project="math", experiment="grpo-7b") == 3,
            what="steps under the configured labels",
        )
        assert exp.value("rlhf_steps_total", project="checkpoints", experiment="run") is None
