"""Words never contradict their numbers (issue 38): every episode sentence and every run
headline, on every sample trace and the bundled example, says `rose`/`fell`/`held`,
`costlier`/`cheaper`, `slowed`/`got faster` only where its numbers move that way; and a
Hypothesis property drives every branch of the wording with arbitrary levels."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis.episodes import HELD, REGRESSION, Episode, Level, describe, headline
from tests.support.procs import exporter_cmd

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"
LOGS = sorted(p for p in TRACES.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))
LOGS.append(ROOT / "rlhf_exporter" / "examples" / "demo_job.jsonl")

NUM = r"(-?[\d,]+(?:\.\d+)?)"
MOVE = re.compile(rf"\b(rose|fell|held) {NUM} -> {NUM}[^(;,]*(?:\(([+-]\d+)%\))?")
ARROW = re.compile(rf"{NUM} -> {NUM}[^(;,]*\(([+-]?\d+)%\)")


def _span(text: str) -> tuple[float, float]:
    """The values a printed number may stand for (it was rounded to its decimals)."""
    value = float(text.replace(",", ""))
    half = 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0)
    return value - half, value + half


def _ratios(old: str, new: str) -> tuple[float, float]:
    """The least and the largest change (new / old - 1) the printed numbers allow."""
    (a0, a1), (b0, b1) = _span(old), _span(new)
    a0 = max(a0, 1e-9)
    return b0 / a1 - 1, b1 / a0 - 1


def contradictions(text: str) -> list[str]:
    """Every place where a direction word or a percentage disagrees with the numbers it
    stands beside (within what the rounding of the printed numbers allows)."""
    bad = []
    for verb, old, new, _pct in MOVE.findall(text):
        lo, hi = _ratios(old, new)
        if verb == "rose" and not hi >= HELD:
            bad.append(f"rose {old} -> {new}")
        if verb == "fell" and not lo <= -HELD:
            bad.append(f"fell {old} -> {new}")
        if verb == "held" and not (lo < HELD and hi > -HELD):
            bad.append(f"held {old} -> {new}")
    for old, new, pct in ARROW.findall(text):
        lo, hi = _ratios(old, new)
        p = int(pct) / 100
        if not lo - 0.005 <= p <= hi + 0.005:
            bad.append(f"{old} -> {new} is not {pct}%")
    if "slower for the same work" in text:
        bad.append("'slower for the same work' (the old, ambiguous wording)")
    return bad


def check_episode(e: dict) -> list[str]:
    text, b, d = e["summary"], e["before"], e["during"]
    bad = contradictions(text)
    if e["kind"] != REGRESSION or b is None:
        return bad
    if "costlier per token" in text and not d["cost"] > b["cost"]:
        bad.append("costlier, though the cost did not grow")
    if "the steps slowed" in text and not d["step_seconds"] > b["step_seconds"]:
        bad.append("the steps slowed, though the step time did not grow")
    if "got faster" in text and not d["step_seconds"] < b["step_seconds"]:
        bad.append("got faster, though the step time did not fall")
    if "throughput fell" in text and not d["throughput"] < b["throughput"]:
        bad.append("throughput fell, though it did not")
    if "fewer tokens per step" in text and not d["tokens"] < b["tokens"]:
        bad.append("fewer tokens, though there were not")
    if d["step_seconds"] < b["step_seconds"] * (1 - HELD) and "got faster" not in text:
        bad.append("the steps got faster and the sentence does not say so")
    return bad


def diagnose_json(path: Path) -> dict:
    r = subprocess.run(
        exporter_cmd("diagnose", "-f", "json", str(path)),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(r.stdout)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_no_episode_or_headline_contradicts_its_numbers(path):
    runs = [r for f in diagnose_json(path)["files"] for r in f["runs"]]
    assert runs
    for run in runs:
        s = run["summary"]
        assert s["headline"] and contradictions(s["headline"]) == [], s["headline"]
        for e in s["episodes"]:
            assert check_episode(e) == [], e["summary"]


def test_a_costlier_window_hidden_by_a_smaller_workload_says_so():
    """The bundled example's episodes 1 and 4: the update got costlier per token while the
    step time fell (1) or held with fewer tokens per step (4)."""
    s = diagnose_json(LOGS[-1])["files"][0]["runs"][0]["summary"]
    first, *_, fourth = [e for e in s["episodes"] if e["kind"] == REGRESSION]
    assert "yet the steps got faster: step time fell" in first["summary"]
    assert "hidden by" in first["summary"]
    assert "the step time held but throughput fell" in fourth["summary"]
    assert "fewer tokens per step" in fourth["summary"]


def test_the_headline_leads_with_the_throughput_change_then_episodes_then_verdicts():
    s = diagnose_json(TRACES / "regression_after_slowdown_v1.jsonl")["files"][0]["runs"][0]
    text = s["summary"]["headline"]
    assert text.startswith("Throughput fell ") and "(-3" in text
    assert text.index(
        "2 regressions, none recovered: rollout (steps 18-23), update (steps 34-39)"
    ) < text.index("verdicts: ")


# -- every branch, with arbitrary numbers -------------------------------------------------------
positive = st.floats(1.0, 5000.0, allow_nan=False)


@st.composite
def levels(draw):
    return Level(
        5,
        draw(positive),
        draw(st.one_of(st.none(), positive)),
        draw(st.one_of(st.none(), positive)),
        draw(st.one_of(st.none(), positive)),
        None,
        None,
    )


@settings(max_examples=300, deadline=None)
@given(
    before=st.one_of(st.none(), levels()),
    during=levels(),
    ended=st.sampled_from(["recovered", "absorbed", "ongoing"]),
)
def test_every_wording_branch_agrees_with_its_numbers(before, during, ended):
    e = Episode(
        REGRESSION,
        0,
        "update",
        10,
        15,
        (10, 15),
        before,
        during,
        None,
        ended,
        16,
        20,
        "tokens/GPU-s",
    )
    record = {
        "kind": REGRESSION,
        "summary": describe(e),
        "before": None if before is None else before._asdict(),
        "during": during._asdict(),
    }
    if before is not None and (
        before.cost is None
        or during.cost is None
        or before.throughput is None
        or during.throughput is None
        or before.tokens is None
        or during.tokens is None
    ):
        record["before"] = None  # a missing number: only the printed words are checked
    assert check_episode(record) == [], record["summary"]
    assert contradictions(headline([], [e], {"update": 3, "balanced": 1})) == []
