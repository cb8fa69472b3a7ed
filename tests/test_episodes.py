"""Change episodes (rlhf_exporter/diagnosis/episodes.py): the per-step change labels told as
a person would, checked against the sample traces' expected labels, then in the places a
person reads them (the diagnose summary; `/` and the job view are in tests/test_view.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import BatchDiagnoser
from rlhf_exporter.diagnosis.episodes import (
    ABSORBED,
    GAP,
    ONGOING,
    RECOVERED_AT,
    describe,
    episodes,
)
from rlhf_exporter.diagnosis.history import StepPoint
from rlhf_exporter.diagnosis.thresholds import GROUPS
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.procs import exporter_cmd

TRACES = Path(__file__).parent / "fixtures" / "traces"
ROOT = Path(__file__).resolve().parents[1]


def expected_stretches(path: Path) -> list[tuple[str, str | None, int, int]]:
    """(kind, group, first, last) of the expected labels, stretches of one label joined
    across at most GAP unlabelled steps (the episodes' rule)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out: dict[tuple[str, str | None], list[list[int]]] = {}
    for i, row in enumerate(rows):
        if row["change"] == "none":  # the traces' labels (the spec's word for steady)
            continue
        key = (row["change"], row["regressed"])
        runs = out.setdefault(key, [])
        if runs and i - runs[-1][1] <= GAP + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return sorted(
        (k, g, rows[a]["step"], rows[z]["step"]) for (k, g), rs in out.items() for a, z in rs
    )


def diagnose_json(path: Path) -> dict:
    r = subprocess.run(
        exporter_cmd("diagnose", "-f", "json", str(path)),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    "path", sorted(p for p in TRACES.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))
)
def test_every_trace_names_its_episodes(path):
    """Each expected stretch of change labels is one episode, whose summary names its steps,
    its cost (regressions), its throughput or time-per-token effect, and how it ended."""
    (run,) = diagnose_json(path)["files"][0]["runs"]
    got = run["summary"]["episodes"]
    want = expected_stretches(path.with_suffix(".expected.jsonl"))
    assert sorted((e["kind"], e["group"], e["first_step"], e["last_step"]) for e in got) == want
    for e in got:
        text = e["summary"]
        steps = (
            f"step {e['first_step']}"  # a one-step episode
            if e["first_step"] == e["last_step"]
            else f"steps {e['first_step']}-{e['last_step']}"
        )
        one = e["first_step"] == e["last_step"] and f"at step {e['first_step']};" in text
        assert steps in text or f"from step {e['first_step']}" in text or one, text
        assert "step time" in text and "%" in text, text
        if e["kind"] == "regression":
            assert "s per million tokens" in text and "tokens/GPU-s" in text, text
        else:
            assert "time per token" in text, text
        assert any(
            w in text for w in ("recovered at step", "the baseline absorbed", "ongoing at step")
        ), text
        assert e["look_at"], e


def test_a_regression_the_baseline_absorbed_is_not_called_recovered():
    """regression_after_slowdown_v1: rollout is labelled at steps 18-23 only, but it stays
    slow through the rest of the run (steps 24-33 before update regresses, and on)."""
    (run,) = diagnose_json(TRACES / "regression_after_slowdown_v1.jsonl")["files"][0]["runs"]
    rollout, update = run["summary"]["episodes"]
    assert (rollout["group"], rollout["ended"], rollout["ended_at"]) == ("rollout", ABSORBED, 23)
    assert rollout["slow_through"] >= 33
    assert "still slow through step 50" in rollout["summary"]
    assert "recovered at" not in rollout["summary"] and "not recovered" in rollout["summary"]
    # the step went from about 100 s to about 133 s, the throughput fell by a quarter
    before, during = rollout["before"], rollout["during"]
    assert 95 < before["step_seconds"] < 105 and 128 < during["step_seconds"] < 138
    assert -0.30 < during["throughput"] / before["throughput"] - 1 < -0.20
    assert "(-25%)" in rollout["summary"]
    assert update["group"] == "update" and (update["first_step"], update["last_step"]) == (34, 39)


def _points(spec: list[tuple[str, str | None, float, float, float]]) -> list[StepPoint]:
    """(change, regressed, update seconds, tokens, response mean) per step: other windows
    fixed, 16 GPUs."""
    out = []
    for step, (change, regressed, update, tokens, response) in enumerate(spec, 1):
        seconds = dict.fromkeys(GROUPS, 0.0)
        seconds.update(rollout=40.0 * tokens / 1e6, update=update)
        total = sum(seconds.values())
        out.append(
            StepPoint(
                0,
                step,
                "update",
                None,
                total,
                tuple(seconds[g] for g in GROUPS),
                0.0,
                change,
                regressed,
                tokens,
                tokens / total / 16,
                response,
                response * 2,
            )
        )
    return out


def test_a_regression_that_recovers_says_at_which_step():
    n = ("steady", None, 30.0, 1e6, 900.0)
    r = ("regression", "update", 60.0, 1e6, 900.0)
    (e,) = episodes(_points([n] * 6 + [r, r, n, r] + [n] * 4))  # one gap joins two stretches
    assert (e.first, e.last, e.steps) == (7, 10, (7, 8, 10))
    assert e.ended == RECOVERED_AT and e.ended_at == 11
    assert "recovered at step 11" in describe(e)
    assert "update 30.0 -> 60.0 s per million tokens (+100%)" in describe(e)
    assert "the steps slowed: step time rose 70 -> 100 s (+43%)" in describe(e)


def test_an_episode_at_the_end_of_a_run_is_ongoing():
    n = ("steady", None, 30.0, 1e6, 900.0)
    r = ("regression", "update", 60.0, 1e6, 900.0)
    (e,) = episodes(_points([n] * 6 + [r, r]))
    assert e.ended == ONGOING and "ongoing at step 8" in describe(e)


def test_a_workload_shift_says_what_grew_and_whether_the_time_per_token_changed():
    n = ("steady", None, 30.0, 1e6, 900.0)
    w = ("workload_shift", None, 42.0, 1.4e6, 1260.0)  # 40 % more of everything
    (e,) = episodes(_points([n] * 6 + [w] * 3 + [n] * 3))
    text = describe(e)
    assert "responses 40% longer" in text and "40% more tokens per step" in text, text
    assert "from step 7" in text and "time per token unchanged" in text, text
    assert e.ended == RECOVERED_AT and e.ended_at == 10


def test_the_summary_tells_every_episode_and_what_to_look_at():
    r = subprocess.run(
        exporter_cmd("diagnose", "--summary", str(TRACES / "regression_after_slowdown_v1.jsonl")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = r.stdout
    assert "episode 1:   rollout costlier per token at steps 18-23" in out
    assert "episode 2:   update costlier per token at steps 34-39" in out
    assert out.count("      look at:   what changed at step") == 2
    # a mostly balanced run: the runner-up windows and what to check in each
    assert "look at:     no window dominates; the largest are rollout" in out
    assert "update (" in out


def test_episodes_of_the_sidecar_history_match_the_batch_ones():
    """The sidecar's points (built by job/state.py from the same records) give the same episodes
    as `diagnose` (the view draws them from the job's history)."""
    from rlhf_exporter.diagnosis.history import point

    data = (TRACES / "regression_after_slowdown_v1.jsonl").read_bytes()
    steps = list(BatchDiagnoser(load_thresholds()).diagnose(RecordReader().feed(data)))
    got = [(e.group, e.first, e.last) for e in episodes([point(d) for d in steps])]
    assert got == [("rollout", 18, 23), ("update", 34, 39)]


def test_the_html_report_lists_the_steps_and_names_every_episode(tmp_path):
    out = tmp_path / "report.html"
    subprocess.run(
        exporter_cmd(
            "diagnose",
            "--summary",
            str(TRACES / "regression_after_slowdown_v1.jsonl"),
            "--html",
            str(out),
        ),
        capture_output=True,
        timeout=60,
        check=True,
    )
    page = out.read_text()
    # the headline names both regressions, each with its steps
    assert "regression: rollout (steps 18-23), update (steps 34-39)" in page
    assert "at steps 18-23" in page and "at steps 34-39" in page and "step(s)" not in page
    assert page.count('<li class="episode">') == 2 and page.count("<b>Look at:</b>") == 2
    assert "still slow through step 50" in page
    # a mostly balanced run: what to look at, from its largest windows
    assert "Look at next:</b> no window dominates; the largest are rollout" in page


@pytest.mark.slow
def test_index_and_job_view_tell_the_episodes(tmp_path):
    from tests.support.serve import Exporter

    with Exporter(tmp_path) as exp:
        d = exp.verl_root / "proj"
        d.mkdir()
        (d / "slow.jsonl").write_bytes((TRACES / "regression_after_slowdown_v1.jsonl").read_bytes())
        exp.wait_for(lambda: exp.value("rlhf_step", project="proj", experiment="slow") == 50)
        for page in (exp.get("/").text, exp.get("/jobs/proj/slow").text):
            # the job keeps its last 60 steps: both episodes are in them
            assert page.count('<li class="episode">') == 2, page
            assert "rollout costlier per token at steps 18-23" in page
            assert "update costlier per token at steps 34-39" in page
            assert page.count("<b>Look at:</b> what changed at step") == 2
        job = exp.get("/jobs/proj/slow").text
        last = json.loads(
            (TRACES / "regression_after_slowdown_v1.expected.jsonl").read_text().splitlines()[-1]
        )
        if last["verdict"] == "balanced":  # the current verdict: what to look at anyway
            assert "Look at next:</b> no window dominates; the largest are" in job


def test_an_episode_with_nothing_before_it_claims_no_recovery():
    """The job view keeps the last 60 steps: an episode at their start has no level before
    it, so it says when its labels stopped, not that it recovered."""
    from rlhf_exporter.diagnosis.episodes import ENDED

    n = ("steady", None, 30.0, 1e6, 900.0)
    r = ("regression", "update", 60.0, 1e6, 900.0)
    (e,) = episodes(_points([r, r] + [n] * 4))
    assert e.before is None and e.ended == ENDED and e.ended_at == 2
    assert "labelled until step 2" in describe(e) and "recovered" not in describe(e)
