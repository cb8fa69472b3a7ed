"""`pynvml` for a sidecar started as a subprocess: put this folder first on PYTHONPATH and name
a JSON scenario in $FAKE_PYNVML_SCENARIO. Importing `pynvml` then yields the fake of
tests/support/fake_pynvml.py (`make_module`), so `rlhf-exporter serve` runs its real NVML
code against it, unchanged: the fake sits at the import boundary only.

The scenario (re-read when the file changes, so a test can script the GPUs after the
sidecar has started):

    {"sample_period": 0.05,
     "gpus": [{"util": [[EPOCH_SECONDS, PERCENT], ...],
               "processes": [[PID, USED_BYTES], ...]}, ...]}

Utilization follows the WALL clock: each GPU's `util` is a step function of epoch seconds
(a value holds from its time on), and the fake stamps its buffered samples in epoch
microseconds as NVML does. `processes` (optional, none when absent) is what
`nvmlDeviceGetComputeRunningProcesses` reports: real PIDs (e.g. Ray actors') make the
sidecar's GPU roles real. The number of GPUs is fixed by the file's first version.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.*

from tests.support.fake_pynvml import FakeClock, FakeGpu, make_module

SCENARIO = Path(os.environ["FAKE_PYNVML_SCENARIO"])
_cache: dict = {"mtime": None, "doc": None}


def _scenario() -> dict:
    mtime = SCENARIO.stat().st_mtime_ns
    if mtime != _cache["mtime"]:
        _cache["doc"] = json.loads(SCENARIO.read_text())
        _cache["mtime"] = mtime
    return _cache["doc"]


class ScenarioGpu(FakeGpu):
    """A FakeGpu whose utilization schedule (in epoch seconds) and processes are the scenario
    file's."""

    def percent(self, t: float) -> float:
        self.util = [tuple(u) for u in _scenario()["gpus"][self.index]["util"]]
        return super().percent(t)

    @property  # type: ignore[override]
    def processes(self) -> list[tuple[int, int | None]]:
        return [(int(p), m) for p, m in _scenario()["gpus"][self.index].get("processes", ())]

    @processes.setter
    def processes(self, value: object) -> None:
        pass  # FakeGpu's constructor sets its default: the scenario file decides


_doc = _scenario()
_gpus = [
    ScenarioGpu(i, start=0.0, sample_period=float(_doc.get("sample_period", 1 / 6)))
    for i in range(len(_doc["gpus"]))
]
sys.modules[__name__] = make_module(_gpus, FakeClock(start=time.time(), real=True))
