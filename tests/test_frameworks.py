"""Other frameworks read as verl: each one's table (rlhf_exporter/frameworks/), its printed
steps (sources/framework_console.py), its TensorBoard events (sources/tensorboard_reader.py),
and `diagnose` on them, against verl's records of the same windows."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.commands.diagnose import diagnose_stream, diagnose_tensorboard
from rlhf_exporter.diagnosis import BatchDiagnoser, Record
from rlhf_exporter.frameworks import TABLES, Translator, to_record
from rlhf_exporter.sources.framework_console import FrameworkConsoleReader, detect
from rlhf_exporter.sources.tensorboard_reader import TensorBoardReader
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.writers import JsonlWriter
from tests.support import framework_output as fo

TH = load_thresholds()


def _read(
    text: str | bytes, chunk: int = 1 << 20, **kw: Any
) -> tuple[list[Record], FrameworkConsoleReader]:
    data = text.encode() if isinstance(text, str) else text
    reader = FrameworkConsoleReader(**kw)
    out: list[Record] = []
    for i in range(0, len(data), chunk):
        out += reader.feed(data[i : i + chunk])
    out += reader.finish()
    return out, reader


def _verdicts(records: list[Record]) -> list[tuple[int, str, str | None, str]]:
    steps = BatchDiagnoser(TH).diagnose(records)
    return [(d.step, d.verdict, d.reason, d.to_json()["change"]) for d in steps]


def _verl(rows: list[dict[str, Any]]) -> list[Record]:
    return [Record(r["step"], r["data"]) for r in rows]


def _merged(records: list[Record]) -> list[Record]:
    """A step's records as one (as the diagnosers merge them: a later value wins)."""
    out: list[Record] = []
    for r in records:
        if out and out[-1].step == r.step:
            out[-1] = Record(r.step, {**out[-1].data, **r.data})
        else:
            out.append(r)
    return out


def _same(got: list[Record], want: list[Record]) -> None:
    got = _merged(got)
    assert [r.step for r in got] == [r.step for r in want]
    for g, w in zip(got, want, strict=True):
        assert g.data == pytest.approx(w.data), g.step


# -- the tables ------------------------------------------------------------------------------
def test_every_table_maps_to_timers_the_decision_table_names() -> None:
    named = TH.timer_groups
    for fw in TABLES.values():
        keys = [w.key for w in fw.windows]
        assert len(keys) == len(set(keys)), fw.name
        for w in fw.windows:
            assert w.key.startswith(fw.timer_prefixes), (fw.name, w.key)
            assert w.inside is None or w.inside in keys, (fw.name, w.key)
            if w.timer is not None:
                assert w.timer in named, (fw.name, w.timer)


def test_nested_timer_is_taken_out_of_its_parent_never_counted_twice() -> None:
    raw = {
        "timing/train/prepare_for_generation/total": 7.0,
        "timing/train/prepare_for_generation/transfer_and_update_weights": 5.0,
        "timing/train/generation": 30.0,
        "timing/train/total_step_time": 40.0,
    }
    data = to_record("nemo_rl", 3, raw).data
    assert data["timing_s/update_weights"] == 5.0
    assert data["timing_s/gen"] == 30.0
    assert data["timing_s/step"] == 40.0
    # the container's own 2 s are no window: left to the untimed remainder
    assert sum(v for k, v in data.items() if k != "timing_s/step") == 35.0


def test_no_step_total_means_the_sum_of_the_timers_unnamed_ones_included() -> None:
    raw = {"timeperf/rollout": 10.0, "timeperf/train_step": 5.0, "timeperf/new_thing": 1.0}
    raw |= {"timeperf/eval": 100.0, "ppo_actor/loss": 0.3}
    data = to_record("areal", 1, raw).data
    assert data["timing_s/step"] == 16.0  # eval is no window of the step
    assert data["timing_s/areal:timeperf/new_thing"] == 1.0  # unnamed: clipped by the table
    assert "ppo_actor/loss" not in data and "timeperf/eval" not in data


def test_what_a_framework_does_not_supply_stays_missing() -> None:
    data = to_record("roll", 1, {"time/step_total": 10.0, "time/step_generate": 6.0}).data
    assert "perf/total_num_tokens" not in data
    assert "perf/mfu/actor" not in data
    data = to_record("openrlhf", 1, {"timing/step_total": 10.0, "rollout/num_samples": None}).data
    assert "perf/total_num_tokens" not in data


def test_openrlhf_work_is_samples_times_their_total_length() -> None:
    """K as OpenRLHF's loop counts a step's tokens: every sample's prompt and response
    (`rollout/num_samples` x the actor's mean `total_length`), not the responses alone."""
    raw = {"timing/step_total": 90.0, "rollout/num_samples": 512.0, "total_length": 1200.0}
    raw |= {"rollout/response_length_mean": 1000.0}
    assert to_record("openrlhf", 1, raw).data["perf/total_num_tokens"] == 512 * 1200.0


# a window the decision table has a group for, by the framework's own words for it
OWN_GROUPS = {
    ("areal", "timeperf/teacher_logp", "timeperf/ref_logp"): "logprob",
    ("areal", "timeperf/checkpoint_for_recover", "timeperf/save"): "checkpoint",
    (
        "nemo_rl",
        "timing/train/logprob_inference_prep",
        "timing/train/policy_and_reference_logprobs",
    ): "logprob",
    ("nemo_rl", "timing/train/training_prep", "timing/train/policy_training"): "update",
    ("slime", "perf/save_model_time", None): "checkpoint",
}


@pytest.mark.parametrize("case", sorted(OWN_GROUPS, key=str), ids=lambda c: c[1])
def test_a_window_with_a_group_of_its_own_counts_there(case: tuple[str, str, str | None]) -> None:
    """Counted in its group beside that group's other window (their seconds add up), not
    as an unnamed timer clipped into `other`."""
    framework, key, beside = case
    raw = {key: 7.0, **({beside: 3.0} if beside else {})}
    data = to_record(framework, 1, raw).data
    assert not [k for k in data if ":" in k], data
    groups: dict[str, float] = {}
    for k, v in data.items():
        if k.startswith("timing_s/") and k != "timing_s/step":
            group = TH.timer_groups[k.removeprefix("timing_s/")]
            groups[group] = groups.get(group, 0.0) + v
    assert groups == {OWN_GROUPS[case]: 10.0 if beside else 7.0}


def test_a_table_names_only_keys_its_release_writes() -> None:
    """Every timer key a table names (windows, not windows, the step total) is one the
    release's code writes (framework-drift's reading of it); the one exception is named."""
    from rlhf_exporter.drift.frameworks import check, read_keys

    # set straight into the timing dict, not through its Timer (algorithms/grpo.py:3744)
    beside_the_timer = {"timing/train/valid_tokens_per_sec_per_gpu"}
    trees = Path(__file__).parent / "fixtures" / "frameworks" / "drift"
    for name, fw in TABLES.items():
        keys, _ = read_keys(name, trees / name)
        written = {k.key for k in check(name, keys)} | beside_the_timer
        named = {w.key for w in fw.windows} | set(fw.not_windows) | {fw.step_total}
        assert named - {None} <= written, (name, named - {None} - written)
        assert "perf/actor_train_tokens" not in fw.values.values()  # slime logs none


def test_hostile_values_are_missing_not_crashes() -> None:
    raw = {
        "timing/generation": "x",
        "timing/step_total": float("nan"),
        3: 4,
        "timing/ppo_train": -1,
    }
    data = to_record("openrlhf", 1, raw).data  # type: ignore[dict-item]
    assert "timing_s/gen" not in data and "timing_s/update_actor" not in data
    assert _verdicts([Record(1, data)]) == []  # no usable S: not classified


def test_lagged_key_lands_on_the_step_it_measured() -> None:
    t = Translator("roll")  # ROLL logs a step's total with the next step's metrics
    out: list[Record] = []
    out += t.feed(0, {"time/step_generate": 5.0, "time/step_total": 0})
    assert out == []  # held: its total comes with step 1
    out += t.feed(1, {"time/step_generate": 6.0, "time/step_total": 9.0})
    assert [r.step for r in out] == [0]
    assert out[0].data["timing_s/step"] == 9.0 and out[0].data["timing_s/gen"] == 5.0
    out += t.finish()
    assert [r.step for r in out] == [0, 1]
    assert "timing_s/step" not in out[1].data  # never logged: not classified, not guessed
    # a restart (a lower step) gives out what was held, in order
    t2 = Translator("roll")
    got = list(t2.feed(5, {"time/step_total": 1.0})) + list(t2.feed(1, {"time/step_total": 2.0}))
    assert [r.step for r in got] == [5]


# -- printed steps, every framework, every regime --------------------------------------------
PRINTED = fo.PRINTED


def _expected(framework: str, steps: list[fo.Step]) -> list[Record]:
    return _verl(fo.expected_records(framework, steps))


@pytest.mark.parametrize("framework", sorted(PRINTED))
@pytest.mark.parametrize("regime", fo.REGIMES)
def test_printed_steps_read_as_verl_records_of_the_same_windows(
    framework: str, regime: str
) -> None:
    steps = fo.regime(regime)
    text = PRINTED[framework][0](steps)
    assert detect(text.encode()[:4096]) == framework
    got, reader = _read(text)
    assert reader.framework == framework
    assert not reader.rejected
    _same(got, _expected(framework, steps))
    # and chunked at an awkward size, the same records
    again, _ = _read(text, chunk=37)
    assert again == got


@pytest.mark.parametrize("framework", sorted(PRINTED))
def test_scripted_verdicts(framework: str) -> None:
    expect = {"rollout": "rollout", "update": "update", "sync": "sync"}
    for regime, verdict in expect.items():
        got = _verdicts(_read(PRINTED[framework][0](fo.regime(regime)))[0])
        assert {v for _s, v, _r, _c in got} == {verdict}, (framework, regime)
    changes = {
        s: c for s, _v, _r, c in _verdicts(_read(PRINTED[framework][0](fo.regime("regression")))[0])
    }
    has_tokens = PRINTED[framework][1]["tokens"]
    assert changes[12] == ("regression" if has_tokens else "none"), framework


def test_a_foreign_framework_line_is_counted_not_read() -> None:
    text = fo.print_openrlhf(fo.regime("rollout", 3)) + fo.print_slime(fo.regime("rollout", 2))
    got, reader = _read(text)
    assert [r.step for r in got] == [1, 2, 3]
    assert reader.rejected["foreign_step"] == 4


def test_bad_lines_are_counted_and_the_good_ones_kept() -> None:
    good = fo.print_openrlhf(fo.regime("rollout", 2)).splitlines()
    text = "\n".join(
        [
            good[1],
            "✨ Global step 9: {'a': [1,",
            "✨ Global step 99999999999999999999999: {}",
            good[2],
        ]
    )
    got, reader = _read(text + "\n" + "x" * 3000 + "\n", max_line=1000)
    assert [r.step for r in got] == [1, 2]
    assert reader.rejected == Counter({"bad_step_line": 1, "bad_step": 1, "too_long": 1})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=60),
            st.sampled_from(
                [
                    b"\xe2\x9c\xa8 Global step 3: {'timing/step_total': 1.0}\n",
                    b"perf 2: {'perf/step_time': 3}\n",
                    b'metrics_tag: {"step": 1, "metrics": {"time/step_total": 2}}\n',
                    b"Train step 4/9 done.\nStats (1/1):\n",
                    "│ timeperf/rollout │ 1.0e+00 │\n╘═╛\n".encode(),
                    "===== Step 2/3 =====\n⏱️  Timing:\n  • Total step time: 2.00s\n".encode(),
                    b"\n",
                ]
            ),
        ),
        max_size=30,
    ),
    st.integers(min_value=1, max_value=64),
)
def test_hostile_bytes_never_crash_and_chunking_changes_nothing(
    parts: list[bytes], size: int
) -> None:
    data = b"".join(parts)
    whole, r1 = _read(data, max_line=128)
    chunked, r2 = _read(data, chunk=size, max_line=128)
    assert whole == chunked
    assert r1.rejected == r2.rejected
    assert r1.pending_bytes == 0
    steps = [r.step for r in whole]
    assert all(isinstance(s, int) for s in steps)


# -- TensorBoard events ----------------------------------------------------------------------
TB = {
    "openrlhf": {"tokens": True, "untimed": True},
    "verl": {"tokens": True, "untimed": True},
    "roll": {"tokens": False, "untimed": True},
    "nemo_rl": {"tokens": True, "untimed": True},
    "areal": {"tokens": False, "untimed": False},
}


@pytest.mark.parametrize("framework", sorted(TB))
def test_tensorboard_events_read_as_verl_records(framework: str, tmp_path: Path) -> None:
    steps = fo.regime("regression")
    fo.write_tensorboard(tmp_path / "run", fo.tensorboard_scalars(framework, steps))
    reader = TensorBoardReader(tmp_path)
    got = list(reader.poll()) + list(reader.finish())
    assert reader.framework == framework
    rows = fo.expected_records("roll", steps) if framework == "roll" else None
    want = _verl(rows or fo.verl_records(steps, **TB[framework]))
    if framework == "openrlhf":
        for r in want:
            r.data["response_length/mean"] = 400.0  # type: ignore[index]
    _same(got, want)
    assert _verdicts(got) == _verdicts(want)


def test_tensorboard_reads_what_was_appended_since_the_last_poll(tmp_path: Path) -> None:
    steps = fo.regime("rollout", 6)
    fo.write_tensorboard(tmp_path / "a", fo.tensorboard_scalars("openrlhf", steps[:3]))
    reader = TensorBoardReader(tmp_path)
    first = list(reader.poll())
    assert [r.step for r in first] == [1, 2]  # step 3 may still get scalars
    fo.write_tensorboard(tmp_path / "b", fo.tensorboard_scalars("openrlhf", steps[3:]))
    later = list(reader.poll()) + list(reader.finish())
    assert [r.step for r in later] == [3, 4, 5, 6]


def test_two_processes_event_files_merge_by_step(tmp_path: Path) -> None:
    """slime's rollout manager and trainer write one file each: one record a step."""
    rollout = [(s, {"perf/rollout_time": 50.0}) for s in range(4)]
    trainer = [(s, {"perf/actor_train_time": 20.0, "perf/step_time": 80.0}) for s in range(4)]
    fo.write_tensorboard(tmp_path / "r", rollout)
    fo.write_tensorboard(tmp_path / "t", trainer)
    reader = TensorBoardReader(tmp_path)
    got = list(reader.poll()) + list(reader.finish())
    assert [r.step for r in got] == [0, 1, 2, 3]
    assert all(r.data["timing_s/gen"] == 50.0 and r.data["timing_s/step"] == 80.0 for r in got)


def test_a_file_that_is_no_event_file_gives_no_record(tmp_path: Path) -> None:
    (tmp_path / "events.out.tfevents.1.x").write_bytes(b"\x00\x01garbage" * 500)
    reader = TensorBoardReader(tmp_path)
    assert list(reader.poll()) + list(reader.finish()) == []


# -- diagnose ---------------------------------------------------------------------------------
def _diagnose_bytes(data: bytes, input_format: str = "auto") -> list[dict[str, Any]]:
    out = io.StringIO()
    writer = JsonlWriter(out, False)
    n = diagnose_stream(io.BytesIO(data), "x", TH, 1 << 20, writer, input_format)  # type: ignore[arg-type]
    writer.close()
    assert n > 0
    return [d for line in out.getvalue().splitlines() if "step" in (d := json.loads(line))]


@pytest.mark.parametrize("framework", sorted(PRINTED))
def test_diagnose_detects_each_framework_and_agrees_with_verl(framework: str) -> None:
    steps = fo.regime("shift")
    got = _diagnose_bytes(PRINTED[framework][0](steps).encode())
    want = _verdicts(_expected(framework, steps))
    assert [(d["step"], d["verdict"], d["reason"], d["change"]) for d in got] == want
    forced = _diagnose_bytes(PRINTED[framework][0](steps).encode(), framework)
    assert forced == got


def test_diagnose_reads_roll_json_lines_and_an_event_directory(tmp_path: Path) -> None:
    steps = fo.regime("sync")
    got = _diagnose_bytes(fo.roll_jsonl(steps).encode())
    assert {d["verdict"] for d in got} == {"sync"}
    fo.write_tensorboard(tmp_path / "tb", fo.tensorboard_scalars("openrlhf", steps))
    out = io.StringIO()
    writer = JsonlWriter(out, False)
    assert diagnose_tensorboard(str(tmp_path / "tb"), TH, writer) == len(steps)
    writer.close()
    rows = [json.loads(x) for x in out.getvalue().splitlines()]
    assert {d["verdict"] for d in rows if "step" in d} == {"sync"}


def test_verl_output_still_reads_as_verl() -> None:
    text = b"step:1 - timing_s/step:10.0 - timing_s/gen:8.0\n"
    assert detect(text) is None
    got = _diagnose_bytes(text)
    assert got[0]["verdict"] == "rollout"


# -- serve's console route: which actors, which reader ----------------------------------------
def test_the_console_route_reads_a_framework_actor_with_its_reader() -> None:
    from rlhf_exporter.join.ports import TrainerActor
    from rlhf_exporter.sources.console import ConsoleSource
    from rlhf_exporter.sources.console_reader import ConsoleReader
    from rlhf_exporter.sources.roles import TRAINER_CLASSES

    for cls in ("PPOTrainer", "TrainingActor", "TaskRunner", "FullyAsyncTrainer"):
        assert TRAINER_CLASSES.fullmatch(cls), cls
    assert not TRAINER_CLASSES.fullmatch("RolloutRayActor")
    src = ConsoleSource.__new__(ConsoleSource)
    src.max_line = 1 << 20
    ppo = src._reader(TrainerActor("a", "openrlhf.trainer.PPOTrainer", "j", "", None))
    assert isinstance(ppo, FrameworkConsoleReader) and ppo.framework == "openrlhf"
    assert ppo.identity is None
    verl = src._reader(TrainerActor("b", "TaskRunner", "j", "", None))
    assert isinstance(verl, ConsoleReader)
    # an actor's own stdout: OpenRLHF's logger lines, read as verl records
    got = list(ppo.feed(fo.print_openrlhf(fo.regime("update", 3)).encode()))
    assert [r.step for r in got] == [1, 2, 3]
