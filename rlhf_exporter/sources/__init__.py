"""Sources: one module per input (verl files, push, Ray, NVML), one small interface.

Every source has `start()`, `stop()` and `snapshot()`. Slow work happens in the source's
own background thread; `snapshot()` only returns the last immutable `Snapshot`, so a scrape
never waits on a source.

The interface is in `base`. The package itself imports nothing, so a command that needs
one source (`diagnose` reads verl's files with `verl_reader`) does not load the others.
"""
