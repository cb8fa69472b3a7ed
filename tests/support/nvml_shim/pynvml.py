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

Health, optional per GPU, on the same wall clock (issue 23):

    {"lost_at": EPOCH,                       # every call fails with GpuIsLost from then on
     "xids": [[EPOCH, CODE], ...],           # XID events delivered once their time passed
     "ecc_uncorrected": [[EPOCH, COUNT], ...],  # the volatile and aggregate counters' values
     "remapped_rows": [CORR, UNC, PENDING, FAILED],
     "throttle": MASK}                       # clock event reasons (bits as pynvml's)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.*

from tests.support.fake_pynvml import NVML_ERROR_GPU_IS_LOST, FakeClock, FakeGpu, make_module

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

    def _doc(self) -> dict:
        return _scenario()["gpus"][self.index]

    @property  # type: ignore[override]
    def fail(self) -> int | None:
        lost = self._doc().get("lost_at")
        return NVML_ERROR_GPU_IS_LOST if lost is not None and time.time() >= lost else None

    @fail.setter
    def fail(self, value: object) -> None:
        pass

    @property  # type: ignore[override]
    def xids(self) -> list[int]:
        """The events due and not yet read (the fake pops what it delivers)."""
        pending = self.__dict__.setdefault("_pending", [])
        due = [c for t, c in self._doc().get("xids", ()) if time.time() >= t]
        sent = self.__dict__.get("_sent", 0)
        pending += due[sent:]
        self.__dict__["_sent"] = len(due)
        return pending

    @xids.setter
    def xids(self, value: object) -> None:
        pass

    @property  # type: ignore[override]
    def ecc(self) -> dict[tuple[int, int], int]:
        count = 0
        for t, n in self._doc().get("ecc_uncorrected", ()):
            if time.time() >= t:
                count = int(n)
        return {(1, 0): count, (1, 1): count}

    @ecc.setter
    def ecc(self, value: object) -> None:
        pass

    @property  # type: ignore[override]
    def remapped_rows(self) -> tuple[int, int, int, int]:
        rows = self._doc().get("remapped_rows", (0, 0, 0, 0))
        return (int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3]))

    @remapped_rows.setter
    def remapped_rows(self, value: object) -> None:
        pass

    @property  # type: ignore[override]
    def throttle(self) -> int:
        return int(self._doc().get("throttle", 0))

    @throttle.setter
    def throttle(self, value: object) -> None:
        pass


_doc = _scenario()
_gpus = [
    ScenarioGpu(i, start=0.0, sample_period=float(_doc.get("sample_period", 1 / 6)))
    for i in range(len(_doc["gpus"]))
]
sys.modules[__name__] = make_module(_gpus, FakeClock(start=time.time(), real=True))
