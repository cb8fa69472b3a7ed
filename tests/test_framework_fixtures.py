"""The frameworks' own output (tests/fixtures/frameworks/, written by each framework's vendored
logging code: docs/frameworks.md#fixtures) diagnosed as each regime was built: the verdict,
reason and change of every step, from the console output, the TensorBoard events and ROLL's
JSON lines alike."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rlhf_exporter.cli import main

ROOT = Path(__file__).parent / "fixtures" / "frameworks"
FRAMEWORKS = ("openrlhf", "areal", "nemo_rl", "slime", "roll")
REGIMES = ("rollout_bound", "update_bound", "sync_bound", "regression", "workload_shift")
OUTPUTS = [
    (fw, regime, kind)
    for fw in FRAMEWORKS
    for regime in REGIMES
    for kind in ("console.log", "tfevents") + (("jsonl",) if fw == "roll" else ())
]


def _expected(fw: str, regime: str) -> list[dict[str, object]]:
    text = (ROOT / fw / f"{regime}.expected.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _diagnose(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(["diagnose", "--format", "jsonl", str(path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [r for r in rows if "verdict" in r]  # the steps (not the run's summary lines)


@pytest.mark.parametrize(("fw", "regime", "kind"), OUTPUTS)
def test_each_output_diagnoses_as_its_regime_was_built(
    fw: str, regime: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _diagnose(ROOT / fw / f"{regime}.{kind}", capsys)
    want = _expected(fw, regime)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert (g["verdict"], g["reason"], g["change"], g.get("regressed")) == (
            w["verdict"],
            w["reason"],
            w["change"],
            w["regressed"],
        ), (fw, regime, kind, w["step"])


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_regimes_are_what_they_say(fw: str) -> None:
    """The answer key itself (expected.py's arithmetic on regimes.py): one verdict a regime,
    the regression at the run's steps 11-14 in rollout, the shift from step 11."""
    for regime, verdict, reason in (
        ("rollout_bound", "rollout", "generation"),
        ("update_bound", "update", "mfu_unknown"),  # none of them logs MFU this run
        ("sync_bound", "sync", "weight_sync"),
    ):
        assert {(r["verdict"], r["reason"]) for r in _expected(fw, regime)} == {(verdict, reason)}
    first = _expected(fw, "regression")[0]["step"]
    assert isinstance(first, int)
    changes = {
        r["step"] - first + 1: (r["change"], r["regressed"]) for r in _expected(fw, "regression")
    }  # type: ignore[operator]
    shifts = {r["step"] - first + 1: r["change"] for r in _expected(fw, "workload_shift")}  # type: ignore[operator]
    if fw == "roll":  # no token count: no change can be judged; the last step has no total
        assert set(changes.values()) == {("none", None)} and set(shifts.values()) == {"none"}
        assert len(changes) == 15
        return
    assert {i for i, c in changes.items() if c == ("regression", "rollout")} == {11, 12, 13, 14}
    assert {i for i, c in changes.items() if c[0] != "regression"} == set(range(1, 17)) - {
        11,
        12,
        13,
        14,
    }
    assert {i for i, c in shifts.items() if c == "workload_shift"} == set(range(11, 17))


@pytest.mark.parametrize(
    "pinned", sorted(ROOT.glob("vendor/*/PINNED.json")), ids=lambda p: p.parent.name
)
def test_vendored_code_is_unchanged_from_its_release(pinned: Path) -> None:
    doc = json.loads(pinned.read_text())
    assert doc["release"]
    for source in doc["files"].values():
        for e in source["excerpts"]:
            text = (pinned.parent / e["file"]).read_text()
            assert hashlib.sha256(text.encode()).hexdigest() == e["sha256"], e["file"]
            if e["first"] is not None:
                assert text.count("\n") == e["last"] - e["first"] + 1, e["file"]
            else:
                assert text.count("\n") == source["lines"], e["file"]


def test_every_output_is_small() -> None:
    files = [p for p in ROOT.rglob("*") if p.is_file() and "_unit" not in p.parts]
    assert len(files) > 100
    assert max(p.stat().st_size for p in files) < 100_000
