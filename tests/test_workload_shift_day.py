"""A workload shift at mid-day raises no bound alert at any time after it (issue 24).

A rollout-bound job (the vendored `rollout_long_tail_v0` trace, cycled) runs for a day under
the real exporter code (tests/support/simday.py). At 12 h its responses become 3x longer:
every response length triples, the tokens per step grow with them, rollout time grows 3.4x
(longer sequences cost more than linearly, but not past the regression test's 1.2 x cost per
unit of work), the token-proportional windows grow with the tokens. The exporter labels the
first steps `workload_shift`; the job's tokens per second of step time fall to about 0.75 x
their morning value, below `alerts.bound_throughput_ratio`. The 6 h throughput reference must
not compare the new work with the old: no bound alert may fire at any time of the day.

The same harness without the shift (a flat day) and with a real slowdown at the same time
(the rollout window 1.6 x longer per unit of work, no shift: a regression, then a lower
throughput) show the rules still see what they should: the slowdown fires the costs branch.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlhf_exporter.render.rules import BOUND_ALERTS
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support.simday import SCRAPE, Day, FileSink, TraceJob

HOUR = 3600
SHIFT_AT = 12 * HOUR
TRACE = Path(__file__).parent / "fixtures" / "traces" / "rollout_long_tail_v0.jsonl"
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")

TOKEN_WINDOWS = ("old_log_prob", "ref", "adv", "update_actor")  # cost grows with the tokens


def longer_responses(data: dict, factor: float, gen_factor: float) -> dict:
    """One step's record with responses `factor` x longer (verl's own keys)."""
    out = dict(data)
    prompt, response = data["prompt_length/mean"], data["response_length/mean"]
    tokens = (prompt + factor * response) / (prompt + response)
    for key in ("mean", "max", "min"):
        out[f"response_length/{key}"] = data[f"response_length/{key}"] * factor
    out["perf/total_num_tokens"] = round(data["perf/total_num_tokens"] * tokens)
    grown = {"gen": gen_factor, **{w: tokens for w in TOKEN_WINDOWS}}
    extra = 0.0
    for window, f in grown.items():
        key = f"timing_s/{window}"
        if key in data:
            out[key] = data[key] * f
            extra += data[key] * (f - 1)
    for key in (
        "timing_s/agent_loop/generate_sequences/max",
        "timing_s/agent_loop/generate_sequences/mean",
        "timing_s/agent_loop/generate_sequences/min",
    ):
        if key in data:
            out[key] = data[key] * gen_factor
    out["timing_s/step"] = data["timing_s/step"] + extra
    out["perf/time_per_step"] = out["timing_s/step"]
    n_gpus = data["perf/total_num_tokens"] / (data["perf/throughput"] * data["timing_s/step"])
    out["perf/throughput"] = out["perf/total_num_tokens"] / (out["timing_s/step"] * n_gpus)
    return out


@dataclass
class ChangingJob(TraceJob):
    """A TraceJob whose steps planned after `change_at` have longer responses."""

    change_at: float = SHIFT_AT
    factor: float = 1.0  # response length factor
    gen_factor: float = 1.0  # rollout time factor

    def _plan(self, after: float) -> None:
        super()._plan(after)
        if after >= self.change_at and (self.factor != 1.0 or self.gen_factor != 1.0):
            self._next = [
                {**r, "data": longer_responses(r["data"], self.factor, self.gen_factor)}
                for r in self._next
            ]
            self.next_at = after + self._busy(self._next)


def run_day(tmp_path: Path, factor: float, gen_factor: float) -> Day:
    day = Day(tmp_path, evaluation=60)
    root = tmp_path / "logs"
    root.mkdir()
    day.target("head:19839", [VerlFileSource(day.th, [root], clock=day.clock)])
    job = ChangingJob(
        TRACE, FileSink(root / "p" / "e.jsonl"), "p", "e", factor=factor, gen_factor=gen_factor
    )
    day.run(24 * HOUR, [job])
    return day


def counter_at(day: Day, name: str, t: float) -> float:
    k = int(t // SCRAPE)
    (values,) = [v for (n, _), v in day.series.items() if n == name]
    return float(values[k])


def tokens_per_step_second(day: Day, start: float, end: float) -> float:
    tokens = counter_at(day, "rlhf_tokens_total", end) - counter_at(day, "rlhf_tokens_total", start)
    step = counter_at(day, "rlhf_step_seconds_total", end) - counter_at(
        day, "rlhf_step_seconds_total", start
    )
    return tokens / step


def bound_alerts_regex() -> str:
    return "|".join(BOUND_ALERTS.values())


def expect_no_bound_alert(day: Day, since: float, until: float) -> None:
    day.checks.append(
        {
            "expr": (
                f'count(max_over_time(ALERTS{{alertname=~"{bound_alerts_regex()}"}}'
                f"[{int(until - since)}s]))"
            ),
            "eval_time": f"{int(until)}s",
            "exp_samples": [],
        }
    )


def test_a_workload_shift_at_mid_day_raises_no_bound_alert(tmp_path):
    day = run_day(tmp_path, factor=3.0, gen_factor=3.4)
    # the exporter saw the shift, and the throughput fell below the costs branch's ratio
    shifts = day.value("rlhf_change_steps_total", kind="workload_shift")
    assert shifts is not None and shifts >= 3, shifts
    assert (day.value("rlhf_change_steps_total", kind="regression") or 0) == 0
    # no bound alert, pending or firing, from the shift to the end of the day
    expect_no_bound_alert(day, SHIFT_AT, 24 * HOUR)
    # the shift's evidence: tokens per second of step time over the 6 h after it, against
    # the 6 h before
    before = tokens_per_step_second(day, SHIFT_AT - 6 * HOUR, SHIFT_AT)
    after = tokens_per_step_second(day, SHIFT_AT + HOUR, SHIFT_AT + 7 * HOUR)
    assert after < 0.8 * before, (after, before)
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_real_slowdown_at_mid_day_still_fires_the_costs_branch(tmp_path):
    """The same day with the rollout window 1.6 x slower for the same work: no workload
    shift, the throughput falls below 0.8 x the reference, RLHFJobRolloutBound fires (and
    not before the slowdown)."""
    day = run_day(tmp_path, factor=1.0, gen_factor=1.6)
    assert (day.value("rlhf_change_steps_total", kind="workload_shift") or 0) == 0
    expect_no_bound_alert(day, 0, SHIFT_AT)
    day.checks.append(
        {
            "expr": (
                'count by (alertname) (max_over_time(ALERTS{alertstate="firing", '
                f'alertname=~"{bound_alerts_regex()}"}}[{4 * HOUR}s]))'
            ),
            "eval_time": f"{SHIFT_AT + 4 * HOUR}s",
            "exp_samples": [{"labels": '{alertname="RLHFJobRolloutBound"}', "value": 1}],
        }
    )
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
