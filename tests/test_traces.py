"""The sample verl logs in ../shared/traces, against their expected diagnosis.

Where a `scored_*` flag is true the label must match; where it is false the step sits on a
threshold and either answer is acceptable. Shares always match to 4 decimals.
"""

from __future__ import annotations

import json

import pytest

from exporter.diagnosis import BatchDiagnoser, StreamDiagnoser
from exporter.reader import RecordReader


def traces(shared):
    return sorted(p for p in shared.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))


def read(path):
    reader = RecordReader()
    records = list(reader.feed(path.read_bytes()))
    reader.finish()
    assert not reader.rejected, reader.rejected
    return records


def test_every_sample_trace_matches_its_expected_diagnosis(shared_traces, thresholds):
    checked = 0
    for path in traces(shared_traces):
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
    assert checked >= 400


def test_the_sidecar_stream_agrees_with_diagnose_on_every_trace(shared_traces, thresholds):
    for path in traces(shared_traces):
        records = read(path)
        batch = [d.to_json() for d in BatchDiagnoser(thresholds).diagnose(records)]
        sd = StreamDiagnoser(thresholds)
        stream = [e.diagnosis.to_json() for e in map(sd.feed, records) if e.diagnosis]
        assert stream == batch, path.name
