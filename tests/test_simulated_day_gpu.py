"""A simulated day of a multi-node job's GPUs (issue 23), on tests/support/simday.py.

A verl job's head sidecar (its log, no GPUs) and a GPU worker sidecar (8 GPUs through the
fake `pynvml` at the import boundary; the worker knows the job it serves from configuration,
`--project`/`--experiment`, as it would from the head's windows) are scraped every simulated
15 s into a `promtool test rules` input with the repository's real rule files.

- Healthy GPUs for 24 hours: no alert at all (no GPU health alert, no idle GPUs).
- A GPU falls off the bus mid-run (NVML answers GpuIsLost; the driver reports XID 79) and
  the job's collective hangs: RLHFGPULost pages on time, and once. The job's stall alert
  fires too (the job stopped), but alerts/alertmanager.example.yaml's inhibit rule keeps it
  from paging: the pages are counted after that rule, read from the file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from rlhf_exporter.diagnosis.thresholds import seconds
from rlhf_exporter.sources.nvml import NvmlSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeGpu, make_module
from tests.support.simday import PAGES, SCRAPE, Day, FileSink, TraceJob

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "checkpoint_outside_one_step_off.jsonl"
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
HOUR = 3600
NV_OFFSET = 1000.0  # the fake driver's clock starts at 1000 s (NVML timestamps are never 0)
PROJECT, EXPERIMENT = "grpo", "v1"
INJECT = 40 * 60
LATE = 2 * SCRAPE
NVML_INTERVAL = 60.0


class Job:
    """The head (verl files) and one GPU worker (NVML) of one verl job."""

    def __init__(self, day: Day, tmp: Path, monkeypatch):
        c = day.clock
        self.gpus = [
            FakeGpu(i, util=[(0.0, 85.0)], start=NV_OFFSET, supports_samples=False)
            for i in range(8)
        ]
        module = make_module(self.gpus, lambda: day.clock() + NV_OFFSET)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        root = tmp / "logs"
        day.target("head:19839", [VerlFileSource(day.th, [root], clock=c)])
        self.nvml = NvmlSource(
            NVML_INTERVAL,
            roles=False,
            clock=lambda: c() + NV_OFFSET,
            wall=c,
            job=(PROJECT, EXPERIMENT),
        )
        day.target("worker-0:19839", [self.nvml])
        self.verl = TraceJob(
            TRACE,
            FileSink(root / PROJECT / f"{EXPERIMENT}.jsonl"),
            PROJECT,
            EXPERIMENT,
        )


def inhibited_pages(at: float, window: float, pages: dict[str, int]) -> dict:
    """A promtool check: the paging alerts that fired in `window` before `at`, counted
    after the Alertmanager example's inhibit rule whose source is RLHFGPULost (a target
    alert is dropped while a source alert with the same `equal` labels fires)."""
    config = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yaml").read_text())
    (rule,) = [
        r for r in config["inhibit_rules"] if 'alertname="RLHFGPULost"' in r["source_matchers"]
    ]
    source = ", ".join(rule["source_matchers"])
    target = ", ".join(rule["target_matchers"])
    equal = ", ".join(rule["equal"])
    firing = f'ALERTS{{alertstate="firing", severity=~"{PAGES}"}}'
    after = (
        f'({firing} unless {{__name__="ALERTS", {target}}})\n'
        f'or ({firing} and {{__name__="ALERTS", {target}}}\n'
        f'  unless on ({equal}) ALERTS{{alertstate="firing", {source}}})'
    )
    return {
        "expr": f"count by (alertname) (max_over_time(({after})[{int(window)}s:{SCRAPE}s]))",
        "eval_time": f"{int(at)}s",
        "exp_samples": [
            {"labels": f'{{alertname="{name}"}}', "value": n} for name, n in sorted(pages.items())
        ],
    }


def test_healthy_gpus_are_quiet_for_a_day(tmp_path, monkeypatch):
    day = Day(tmp_path, evaluation=60)
    job = Job(day, tmp_path, monkeypatch)
    day.run(24 * HOUR, [job.verl])
    # the day did what it says: the job stepped all day, every GPU reported its health
    assert job.verl.step > 600
    # served from 0 (issue 38), never grown
    assert {
        day.value("rlhf_gpu_errors_total", gpu=str(i), reason="gpu_is_lost") for i in range(8)
    } == {0.0}
    assert day.value("rlhf_gpu_xid_errors_total", gpu="0", xid="48") == 0.0
    ecc = day.value("rlhf_gpu_ecc_errors_total", gpu="7", error="uncorrected", scope="volatile")
    assert ecc == 0.0
    busy = day.value("rlhf_gpu_busy_seconds_total", gpu="0", project=PROJECT, experiment=EXPERIMENT)
    assert busy is not None and busy > 0.8 * 23 * HOUR
    day.expect_pages(at=24 * HOUR, window=24 * HOUR, pages={}, severities=".+")
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_lost_gpu_pages_once_and_its_stall_does_not(tmp_path, monkeypatch):
    cfg = yaml.safe_load((ROOT / "rlhf_exporter" / "thresholds.yaml").read_text())["alerts"]
    # promtool evaluates every group at the test's interval (it ignores a group's own), so
    # the day runs at the GPU groups' alerts.gpu_interval: the page's timing as Prometheus has it
    every = int(seconds(cfg["gpu_interval"]))
    day = Day(tmp_path, evaluation=every)
    job = Job(day, tmp_path, monkeypatch)

    def lose_gpu() -> None:
        job.gpus[3].fail = fake_pynvml.NVML_ERROR_GPU_IS_LOST
        job.gpus[3].xids.append(79)  # the driver's XID for a GPU that fell off the bus

    day.at(INJECT, lose_gpu)
    job.verl.hang_at = INJECT  # the job's collective waits for the lost GPU forever
    # the stall pages after max(factor x baseline, stall_min) + stall_for: run well past it
    end = INJECT + seconds(cfg["stall_min"]) + seconds(cfg["stall_for"]) + 30 * 60
    day.run(end, [job.verl])
    assert day.value("rlhf_gpu_errors_total", gpu="3", reason="gpu_is_lost", project=PROJECT)
    # the first poll that finds it, a scrape or two, then the GPU group's next round
    due = INJECT + NVML_INTERVAL + LATE + every
    lost = {"project": PROJECT, "experiment": EXPERIMENT, "gpu": "3", "instance": "worker-0:19839"}
    day.expect_firing(due, "RLHFGPULost", **lost)
    day.expect_firing(end, "RLHFGPULost", **lost)  # as long as the GPU stays lost
    day.expect_firing(end, "RLHFJobStalled", project=PROJECT, experiment=EXPERIMENT)
    # before the inhibition: the lost GPU and the stall it causes (XID 79 is RLHFGPULost's)
    day.expect_pages(at=end, window=end, pages={"RLHFGPULost": 1, "RLHFJobStalled": 1})
    # after the Alertmanager example's inhibit rule: one page, the cause
    day.checks.append(inhibited_pages(end, end, {"RLHFGPULost": 1}))
    # nothing before the GPU was lost (the poll at INJECT finds it: with gpu_is_lost served
    # from 0, issue 38, the alert's increase() sees that first failure at once)
    day.expect_pages(at=INJECT - 15, window=INJECT - 15, pages={}, severities=".+")
    result = day.check()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
