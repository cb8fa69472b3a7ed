"""Sources: one module per input (verl files, push, Ray, NVML), one small interface.

Every source has `start()`, `stop()` and `snapshot()`. Slow work happens in the source's
own background thread; `snapshot()` only returns the last immutable `Snapshot`, so a scrape
never waits on a source.
"""
from .base import PollingSource, PollResult, Sample, Snapshot, Source, SourceError

__all__ = ["PollingSource", "PollResult", "Sample", "Snapshot", "Source", "SourceError"]
