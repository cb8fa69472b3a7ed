"""Words never claim more than the numbers: every sample trace's `diagnose` output (the
table and its summary) is scanned for a claim its own numbers or episodes contradict."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from rlhf_exporter.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = sorted(
    [p for p in (FIXTURES / "traces").glob("*.jsonl") if not p.name.endswith(".expected.jsonl")]
    + list((FIXTURES / "real_verl").glob("*/*.jsonl"))
)
TRACES = [p for p in TRACES if p.name != "vllm_series.jsonl"]


def diagnose(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", "--color", "never", "--wide", *args]) == 0
    return out.getvalue()


def keys_of(path: Path) -> set[str]:
    keys: set[str] = set()
    for line in path.read_text().splitlines()[:64]:
        try:
            keys |= set(json.loads(line).get("data", {}))
        except (ValueError, AttributeError):
            continue
    return keys


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_the_summary_never_claims_more_than_its_numbers(path):
    text = diagnose(str(path))
    # counts agree with their nouns
    assert not re.search(r"\b1 (records|classified steps|steps)\b", text), text
    assert not re.search(r"\bat steps \d+$", text, re.M), text
    assert not re.search(r"\(1-1\)|\bsteps (\d+)-\1\b", text), text
    rows = diagnose("--format", "jsonl", str(path)).splitlines()
    steps = [json.loads(r) for r in rows if '"type"' not in r]
    regressed = any(s["change"] == "regression" for s in steps)
    for answer in re.findall(r"answer:\s+(.*)", text):
        # a headline that lists a regression never says the throughput held
        if re.search(r"\b\d+ regressions?:", answer):
            assert not answer.startswith("Throughput held"), answer
    if regressed:
        assert "no regression and no workload shift" not in text, text
    # no baseline, no claim against it: the first steps of each run build it
    if "no regression and no workload shift against the job's own baseline" in text:
        assert re.search(r"\(\d+ steps? compared; the first \d+ built it\)", text), text
    # a reason a job has no use for is not a "cannot show"
    keys = keys_of(path)
    if not any("agent_loop/" in k for k in keys):
        assert "rollout/reward_in_loop cannot be seen" not in text, text
    if not any("tool_calls" in k for k in keys):
        assert "rollout/tool_calls cannot be seen" not in text, text


def test_a_run_too_short_for_a_baseline_says_so(tmp_path):
    """A 3-step log: no step was compared with anything, and the words say so."""
    trace = FIXTURES / "traces" / "regression_update_v1.jsonl"
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(trace.read_text().splitlines()[:3]) + "\n")
    text = diagnose(str(short))
    assert "no baseline yet" in text and "against the job's own baseline" not in text, text
    assert text.count("warming up") >= 2, text
    one = tmp_path / "one.jsonl"
    one.write_text(trace.read_text().splitlines()[0] + "\n")
    assert "summary of" in (t := diagnose("--summary", str(one))) and ": 1 record\n" in t, t


def test_a_runs_first_untimed_step_is_named_as_warm_up():
    """The real V1 job's first step is verl's agent-loop warm-up (mostly untimed): its advice
    says so rather than sending the reader to data movement."""
    text = diagnose(str(FIXTURES / "real_verl" / "v1" / "v1.jsonl"))
    first = next(line for line in text.splitlines() if re.match(r"\s+1\s", line))
    assert "warm-up" in first and "data movement" not in first, first


def test_a_run_that_logs_no_token_count_is_never_told_to_wait_for_a_baseline(tmp_path):
    """Steps without a token count never build a baseline: the words say the run cannot be
    judged, not that a baseline is coming after its 15 steps."""
    log = tmp_path / "p" / "e.jsonl"
    log.parent.mkdir()
    rows = [
        {
            "step": n,
            "data": {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/update_actor": 3.0},
        }
        for n in range(1, 16)
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = diagnose(str(log))
    assert "not judged: none of its 15 steps logged a token count" in text, text
    assert "no baseline yet" not in text, text


def test_the_page_never_promises_a_baseline_to_a_job_without_token_counts():
    from rlhf_exporter.view.pages.answer import warming_up

    job = {"verdict": "rollout", "baseline_ready": False, "baseline_needed": 5}
    assert warming_up({**job, "baseline_steps": 2, "steps": 2}) == (
        "warming up: no baseline yet: 2 of 5 steps"
    )
    never = warming_up({**job, "baseline_steps": 0, "steps": 15})
    assert never.startswith("no baseline: none of its steps logged a token count"), never
