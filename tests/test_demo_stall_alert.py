"""The live demo's stall pages: RLHFJobStalled fires within its first five minutes, at the
instants `/` says stalled, and resolves when the job steps again.

`serve --demo` writes one step every 0.7 s of wall time whose record says ~95 s. The pages
judge its stall on the demo job's clock (rlhf_exporter/demo/clock.py), and the job exports
its last step's time aged on that clock (join/ports.py `JobClock.aged`), so that the shipped
rules, evaluated on the wall clock, judge the same stall. Here the demo job (scenario `all`),
its simulated GPUs and Ray actors and the real verl source, wired as `serve --demo` wires
them, run on a simulated wall clock at the live pace (tests/support/simday.py: no sleeping),
scraped every 15 s into `promtool test rules` with the real rule files at their real
thresholds (rules evaluated every scrape). After each scrape, `/`'s judgement is taken from
the verl source's job summary as the pages take it (`Facts.stalled`). The verl source is
polled once a scrape (live, every second), so each 15 s of records is read at once: the
stall is seen up to 15 s later than live, and the alert with it.
"""

from __future__ import annotations

import re
import shutil

import pytest

from rlhf_exporter.demo import scenario as scenario_module
from rlhf_exporter.demo.devices import DemoDevices
from rlhf_exporter.demo.job import EXPERIMENT, PROJECT, DemoJob
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.view.pages import Facts
from tests.support.simday import SCRAPE, Day
from tests.test_demo_alerts import DemoRun

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")

STEP = 0.7  # serve --demo's seconds a step
INSTANCE = "demo:19839"
MINUTES = 60  # about eight and a half loops of the demo (7 minutes each)
STALL_FOR = 120  # alerts.stall_for: the rule's `for:`
JOB = f'project="{PROJECT}", experiment="{EXPERIMENT}"'
STALLED = f'project_experiment_state:rlhf_job_state:max{{state="stalled", {JOB}}}'
FIRING = f'ALERTS{{alertname="RLHFJobStalled", alertstate="firing", {JOB}}}'
# what else fires in MINUTES at the live pace, each an incident of the scenario table: the
# rollout actor's restart and death (no `for:`, a minute's) from 6-7 minutes in, once their
# phases have played; the regressions and the rollout's over-provisioning from 11-17 minutes
# in, once loops of their incidents (every 7 minutes) fill their windows and 10-15 minutes
# of `for:`. No other alert (RLHFJobUnwatched, RLHFJobThroughputBelowBaseline, ...) fires.
ALSO_FIRING = (
    ("RLHFRayActorsDied", 'role="rollout"'),
    ("RLHFRayActorsRestarting", 'role="rollout"'),
    *(
        ("RLHFJobRegression", f'group="{group}", {JOB}')
        for group in ("logprob", "other", "reward", "rollout", "sync", "update")
    ),
    ("RLHFRolloutOverprovisioned", JOB),
)


def _named_by_the_scenario() -> set[str]:
    """The alerts the scenario table (rlhf_exporter/demo/scenario.py) names."""
    return set(re.findall(r"\bRLHF[A-Za-z]+", scenario_module.__doc__ or ""))


def _intervals(instants: list[float]) -> list[tuple[float, float]]:
    """Runs of consecutive scrape instants, as (first, last)."""
    runs: list[tuple[float, float]] = []
    for t in instants:
        if runs and t - runs[-1][1] == SCRAPE:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs


def _count_at(day: Day, at: float, expr: str, expected: int) -> None:
    day.checks.append(
        {
            "expr": f"count({expr})",
            "eval_time": f"{int(at)}s",
            "exp_samples": [{"labels": "{}", "value": expected}] if expected else [],
        }
    )


def test_the_live_demo_pages_its_stall_when_the_page_says_stalled(tmp_path):
    day = Day(tmp_path)
    c = day.clock
    root = tmp_path / "demo-root"
    job = DemoJob(root, step_seconds=STEP, th=day.th)
    run = DemoRun(job, STEP)
    board = WindowBoard()  # as `serve --demo` wires it: the job posts, the devices join
    devices = DemoDevices(job, clock=c, wall=c, windows=board, th=day.th)
    verl = VerlFileSource(
        day.th, [root], clock=c, windows=board, job_clock=job.clock, job_clock_roots=[root]
    )
    day.target(INSTANCE, [verl, devices])
    facts = Facts.of(
        "t", "", "demo", True, day.th.alerts, clock=(PROJECT, EXPERIMENT, job.clock.at)
    )

    page: dict[float, bool] = {}  # scrape instant -> `/` says the demo job is stalled
    end = MINUTES * 60
    for k in range(end // SCRAPE + 1):
        now = float(k * SCRAPE)
        day.run(now, [run])  # one scrape, its polls first
        (summary,) = verl.jobs()
        page[now] = facts.stalled(summary, now) is not None
    assert run.loops == 8

    stalls = _intervals([t for t, stalled in page.items() if stalled])
    assert len(stalls) == run.loops + 1  # one a loop (the ninth loop's has begun), no other
    assert all(z - a >= STALL_FOR + 60 for a, z in stalls[:-1])  # each long enough to page

    # the alert reads the recorded state (another rule group), of this evaluation or of the
    # one before (promtool's order of groups): pending for its `for:`, then firing until
    # that evaluation sees a step again. An instant where the two orders differ is not
    # checked: the alert agrees with the page within one scrape.
    def firing(t: float, lag: float) -> bool:
        return any(a + STALL_FOR + lag <= t <= z + lag for a, z in stalls)

    first_fired = min(t for t in page if firing(t, SCRAPE))
    assert first_fired <= 300, first_fired  # within the demo's first five minutes

    # at every scrape instant, Prometheus's job state and the alert agree with the page
    checked = 0
    for t, stalled in page.items():
        _count_at(day, t, STALLED, int(stalled))
        if firing(t, 0) == firing(t, SCRAPE):
            _count_at(day, t, FIRING, int(firing(t, 0)))
            checked += firing(t, 0)
    assert checked >= 8 * run.loops  # each loop's stall fires for minutes

    # in the first five minutes, no other alert fires; in MINUTES, only the scripted ones
    assert {"RLHFJobStalled", *(a for a, _ in ALSO_FIRING)} <= _named_by_the_scenario()
    by = "count by (alertname, group, role, project, experiment)"
    for at, fired in ((300, ()), (end, ALSO_FIRING)):
        day.checks.append(
            {
                "expr": f'{by} (max_over_time(ALERTS{{alertstate="firing"}}[{at + SCRAPE}s]))',
                "eval_time": f"{at}s",
                "exp_samples": [
                    {"labels": f"{{alertname={a!r}, {labels}}}".replace("'", '"'), "value": 1}
                    for a, labels in (("RLHFJobStalled", JOB), *fired)
                ],
            }
        )
    result = day.check()
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
