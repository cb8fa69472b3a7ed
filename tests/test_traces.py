"""Sample verl logs against their expected diagnosis: the ones vendored in
tests/fixtures/traces (every clone) and all of ../shared/traces (where it exists).

Where a `scored_*` flag is true the label must match; where it is false the step sits on a
threshold and either answer is acceptable. Shares always match to 4 decimals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import BatchDiagnoser, StreamDiagnoser
from rlhf_exporter.sources.verl_reader import RecordReader

VENDORED = Path(__file__).parent / "fixtures" / "traces"


def traces(folder):
    return sorted(p for p in folder.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))


def read(path):
    reader = RecordReader()
    records = list(reader.feed(path.read_bytes()))
    reader.finish()
    assert not reader.rejected, reader.rejected
    return records


def check_against_expected(folder, thresholds) -> int:
    checked = 0
    for path in traces(folder):
        expected = [
            json.loads(line)
            for line in path.with_suffix(".expected.jsonl").read_text().splitlines()
        ]
        got = [d.to_json() for d in BatchDiagnoser(thresholds).diagnose(read(path))]
        assert [g["step"] for g in got] == [e["step"] for e in expected], path.name
        for g, e in zip(got, expected):
            where = f"{path.name} step {e['step']}"
            if e["scored_verdict"]:
                assert g["verdict"] == e["verdict"], where
            if e["scored_reason"]:
                assert g["reason"] == e["reason"], where
            if e["scored_change"]:
                assert (g["change"], g["regressed"]) == (e["change"], e["regressed"]), where
            assert g["shares"] == pytest.approx(e["shares"], abs=1e-4), where
            checked += 1
    return checked


def check_stream_agrees(folder, thresholds) -> None:
    for path in traces(folder):
        records = read(path)
        batch = [d.to_json() for d in BatchDiagnoser(thresholds).diagnose(records)]
        sd = StreamDiagnoser(thresholds)
        stream = [e.diagnosis.to_json() for e in map(sd.feed, records) if e.diagnosis]
        assert stream == batch, path.name


def test_vendored_traces_match_their_expected_diagnosis(thresholds):
    # the three traces that show decision table v2, and fully-async's two records a step
    names = {p.stem for p in traces(VENDORED)}
    assert {
        "checkpoint_outside_one_step_off",
        "regression_after_slowdown_v1",
        "long_tail_workload_v0",
        "fully_async_rollout",
    } <= names
    assert check_against_expected(VENDORED, thresholds) >= 150


def test_vendored_traces_stream_agrees_with_diagnose(thresholds):
    check_stream_agrees(VENDORED, thresholds)


def test_v2_traces_show_what_v2_changed(thresholds):
    def labels(name):
        return [
            d.to_json()
            for d in BatchDiagnoser(thresholds).diagnose(read(VENDORED / f"{name}.jsonl"))
        ]

    one_step_off = labels("checkpoint_outside_one_step_off")
    assert not any(d["verdict"] == "checkpoint" for d in one_step_off)  # saved after `step`
    after_slowdown = labels("regression_after_slowdown_v1")
    assert any(d["regressed"] == "update" for d in after_slowdown)
    long_tail = labels("long_tail_workload_v0")
    assert not any(d["regressed"] == "rollout" for d in long_tail)
    assert any(d["change"] == "workload_shift" for d in long_tail)


def test_every_shared_trace_matches_its_expected_diagnosis(shared_traces, thresholds):
    assert check_against_expected(shared_traces, thresholds) >= 500


def test_the_sidecar_stream_agrees_with_diagnose_on_every_shared_trace(shared_traces, thresholds):
    check_stream_agrees(shared_traces, thresholds)
