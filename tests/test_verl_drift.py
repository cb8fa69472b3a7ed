"""`rlhf-exporter verl-drift`: on verl 0.9.1 (installed without its dependencies) everything is
known; a timer, an MFU stage, a server name or a record format the project does not know
fails it; it reads directories, wheels and sdists, and the sample traces' keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.cli import main
from rlhf_exporter.drift.check import check_tree
from rlhf_exporter.drift.source import read_tree
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.verl_config import VERL_VERSION, verl_dir, verl_version

TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="module")
def verl() -> Path:
    root = verl_dir()
    if root is None or verl_version(root) != VERL_VERSION:
        why = f"verl {VERL_VERSION} is not installed: `pip install --no-deps verl=={VERL_VERSION}`"
        if os.environ.get("CI"):
            pytest.fail(why + " (scripts/test.sh does it)")
        pytest.skip(why)
    return root


def drift(*args: str, capsys) -> tuple[int, str]:
    code = main(["verl-drift", *args])
    return code, capsys.readouterr().out


def test_everything_verl_0_9_1_has_is_known(verl):
    """The CI check: the real command on the installed verl 0.9.1."""
    cmd = [sys.executable, "-m", "rlhf_exporter", "verl-drift", str(verl)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "0 unknown" in out and "UNKNOWN" not in out
    for line in (
        "ok      gen: group `rollout`",
        "ok      param_sync: group `sync`",  # marked_timer("timing_s/param_sync", ...)
        "ok      ref: group `logprob`",  # marked_timer(str(Role.RefPolicy), ...)
        "ok      rollouter/validate_time: fully-async's validation time",
        "ok      compute_score: agent-loop statistic",
        "ok      perf/mfu/actor_infer",
        "ok      VERL_FILE_LOGGER_ROOT",
        "ok      {step, data} by orjson.dumps, open(mode='wb')",
        "ok      {prefix}server_reward_{self.replica_rank}_{node_rank}{self.name_suffix}: "
        "discovery: reward",
    ):
        assert line in out, line


def test_json_output_lists_every_finding(verl, capsys):
    code, out = drift(str(verl), "--format", "json", capsys=capsys)
    doc = json.loads(out)
    assert code == 0 and doc["unknown"] == 0
    timers = {f["name"]: f for f in doc["findings"] if f["kind"] == "timer"}
    assert {"gen", "update_weights", "save_checkpoint", "testing", "switch_wait"} <= set(timers)
    # file:line and the place in the step, as verl 0.9.1 has them (verl-stream.md)
    assert "trainer/ppo/ray_trainer.py:1510 (inside step)" in timers["gen"]["where"]
    assert "trainer/ppo/v1/trainer_base.py:565 (via step)" in timers["gen"]["where"]
    assert "trainer/ppo/ray_trainer.py:1730 (outside step)" in timers["testing"]["where"]
    assert (
        "experimental/separation/ray_trainer.py:705 (not in step)"
        in (timers["save_checkpoint"]["where"])
    )  # the separated trainers save after `step`


NEW_RELEASE = """
from verl.utils.profiler import marked_timer

class FusedTrainer:
    def fit(self):
        metrics, timing_raw = {}, {}
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw):
                self._generate()
            with marked_timer("teacher_scoring", timing_raw):
                self._score()
        with marked_timer("testing", timing_raw):
            pass
        for key, mfu in self.mfu.items():
            metrics[f"perf/mfu/teacher_infer/{key}"] = mfu
        metrics["perf/mfu/actor"] = 0.4

    def _score(self):
        with marked_timer("student_gpu_to_cpu", self.timing_raw):
            pass
"""

NEW_SERVER = """
class GenRMReplica:
    def launch(self):
        name = f"vllm_server_genrm_{self.replica_rank}_{node_rank}"
        pool_name = f"rollout_pool_genrm_{self.replica_rank}"
"""

NEW_WORKER = """
class Worker:
    def generate_sequences(self, prompts):
        output = self.rollout.generate(prompts)
        output.meta_info["timing"] = {"dataplane/put": 0.1, "generate_sequences": 2.0}
        return output
"""

NEW_LOGGER = """
import os, json

class FileLogger:
    def __init__(self):
        self.filepath = os.getenv("VERL_LOG_FILE")
        self.fp = open(self.filepath, "a")

    def log(self, data, step):
        self.fp.write(json.dumps({"global_step": step, "metrics": data}) + "\\n")
"""


def make_tree(root: Path) -> Path:
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "workers" / "rollout").mkdir(parents=True)
    (root / "verl" / "utils").mkdir(parents=True)
    (root / "verl" / "trainer" / "fused_trainer.py").write_text(NEW_RELEASE)
    (root / "verl" / "workers" / "rollout" / "genrm.py").write_text(NEW_SERVER)
    (root / "verl" / "utils" / "tracking.py").write_text(NEW_LOGGER)
    (root / "verl" / "workers").joinpath("worker.py").write_text(NEW_WORKER)
    (root / "verl" / "broken.py").write_text("def (:\n")  # unparsable: skipped, counted
    return root


def test_a_timer_the_contract_does_not_name_fails_the_check(tmp_path, capsys):
    tree = make_tree(tmp_path / "src")
    code, out = drift(str(tree), capsys=capsys)
    assert code == 1
    assert "UNKNOWN teacher_scoring: not named by the decision table" in out
    assert "verl/trainer/fused_trainer.py:10 (inside step)" in out
    assert "UNKNOWN student_gpu_to_cpu" in out and "fused_trainer.py:19 (via _score)" in out
    assert "ok      gen: group `rollout`" in out and "ok      testing" in out
    assert "UNKNOWN perf/mfu/teacher_infer/{…}" in out and "ok      perf/mfu/actor" in out
    assert "perf/mfu/teacher_infer/:" not in out  # the f-string's head is not a stage of its own
    assert "UNKNOWN vllm_server_genrm_{self.replica_rank}_{node_rank}: unknown word(s) genrm" in out
    assert "rollout_pool_genrm" not in out  # a resource pool's name, not an actor's
    assert "UNKNOWN VERL_LOG_FILE" in out and "UNKNOWN VERL_FILE_LOGGER_PATH" in out
    assert "UNKNOWN {global_step, metrics} by json.dumps, open(mode='a')" in out
    assert "1 skipped" in out
    # a timer a worker hands over in meta_info["timing"] (merged into the step's timers)
    assert "UNKNOWN dataplane/put" in out and "worker.py:5 (meta_info timing)" in out


def test_the_same_tree_as_a_wheel_and_as_an_sdist(tmp_path, capsys):
    tree = make_tree(tmp_path / "src")
    wheel = tmp_path / "verl-9.9.9-py3-none-any.whl"
    sdist = tmp_path / "verl-9.9.9.tar.gz"
    with zipfile.ZipFile(wheel, "w") as z, tarfile.open(sdist, "w:gz") as t:
        for p in sorted(tree.rglob("*.py")):
            z.write(p, p.relative_to(tree).as_posix())
            t.add(p, "verl-9.9.9/" + p.relative_to(tree).as_posix())
    _, from_dir = drift(str(tree), "--unknown-only", capsys=capsys)
    for archive in (wheel, sdist):
        code, out = drift(str(archive), "--unknown-only", capsys=capsys)
        assert code == 1
        assert out.splitlines()[1:] == [
            line.replace("[verl/", "[verl-9.9.9/verl/") if archive == sdist else line
            for line in from_dir.splitlines()[1:]
        ]


def test_a_timer_named_in_the_users_thresholds_is_known(tmp_path, capsys):
    tree = make_tree(tmp_path / "src")
    cfg = tmp_path / "t.yaml"
    cfg.write_text("groups:\n  reward: [reward, verify, reward_calc, teacher_scoring]\n")
    _, out = drift(str(tree), "--thresholds", str(cfg), capsys=capsys)
    assert "ok      teacher_scoring: group `reward`" in out


def test_every_sample_trace_but_the_forks_is_known(capsys):
    names = sorted(p for p in TRACES.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))
    assert len(names) >= 12
    for path in names:
        code, out = drift(str(path), "--unknown-only", capsys=capsys)
        if path.stem == "fork_unnamed_nested_gen_v1":
            assert code == 1 and out.rstrip().endswith("1 unknown: my_dedup"), out
        else:
            assert code == 0, out


def test_a_log_with_a_new_mfu_stage_fails(tmp_path, capsys):
    log = tmp_path / "job.jsonl"
    log.write_text(
        json.dumps({"step": 1, "data": {"timing_s/step": 5.0, "perf/mfu/teacher_infer/x": 0.2}})
        + "\n"
    )
    code, out = drift(str(log), capsys=capsys)
    assert code == 1 and "UNKNOWN perf/mfu/teacher_infer/x" in out and "step 1" in out


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    assert main(["verl-drift", str(tmp_path / "nowhere")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 10)
    assert main(["verl-drift", str(junk)]) == 2
    assert "not a directory, a wheel or an sdist" in capsys.readouterr().err


def test_a_hostile_log_is_bounded_and_its_bad_lines_counted(tmp_path, capsys, monkeypatch):
    from rlhf_exporter.drift import check

    monkeypatch.setattr(check, "MAX_LOG_NAMES", 50)
    log = tmp_path / "flood.jsonl"
    lines = [json.dumps({"step": i, "data": {f"timing_s/t{i}": 1.0}}) for i in range(200)]
    lines += ["not json", json.dumps({"global_step": 1, "metrics": {}})]  # EasyR1-like
    log.write_text("\n".join(lines) + "\n")
    code, out = drift(str(log), "--unknown-only", capsys=capsys)
    assert code == 1
    assert "200 records read, 2 lines rejected" in out
    assert out.count("UNKNOWN t") == 50 and "UNKNOWN 150 more names" in out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(max_size=300) | st.text(max_size=300).map(str.encode), max_size=6))
def test_hostile_sources_and_logs_never_crash_the_check(tmp_path, blobs):
    """Property: any bytes, as Python files of a tree or as a log, give findings or exit 2,
    never a traceback."""
    tree = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh tree per example
    for i, blob in enumerate(blobs):
        (tree / f"m{i}.py").write_bytes(blob)
    found = read_tree(tree)
    assert found.files + found.skipped == len(blobs)
    check_tree(found, load_thresholds())
    log = tree / "x.jsonl"
    log.write_bytes(b"\n".join(blobs))
    assert main(["verl-drift", str(log)]) in (0, 1)
