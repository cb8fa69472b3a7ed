"""Sources: one module per input (verl files, push, Ray, NVML), one small interface.

Every source has `start()`, `stop()` and `snapshot()`. Slow work happens in the source's
own background thread; `snapshot()` only returns the last immutable `Snapshot`, so a scrape
never waits on a source.
"""

from ..metrics.snapshot import Sample, Snapshot
from .base import PollingSource, PollResult, Source, SourceError

__all__ = ["PollResult", "PollingSource", "Sample", "Snapshot", "Source", "SourceError"]
