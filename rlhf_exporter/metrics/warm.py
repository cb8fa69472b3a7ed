"""The warm thread: re-encodes what changed off the scrape path, a few times a second and at
once after a source's poll, and builds a format's body when its next scrape is near
(docs/exposition.md)."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

WARM_FOR = 600.0  # seconds after its last scrape that a format is kept warm
BUILD_AHEAD = 2.0  # seconds before a format's next expected scrape that its body is built
MAX_LEAD = 5.0  # seconds: one build's time counted towards the lead at most


class Warm(Protocol):
    def warm(self) -> None: ...


def scrape_near(now: float, when: float, before: float | None, lead: float) -> bool:
    """Whether a format last scraped at `when` (and at `before` the time before) will be
    scraped within `lead` seconds: Prometheus scrapes at a steady interval, so the next one
    is expected a period after the last; without a period, always."""
    period = when - before if before is not None else 0.0
    return not (period > lead and now < when + period - lead)


def start(target: Warm, interval: float, woken: threading.Event) -> threading.Thread:
    """A daemon thread calling `target.warm()` every `interval` seconds and whenever `woken`
    is set; it ends once `target` is garbage-collected."""
    thread = threading.Thread(
        target=_loop, args=(weakref.ref(target), interval, woken), name="exposition", daemon=True
    )
    thread.start()
    return thread


def _loop(ref: weakref.ReferenceType[Warm], interval: float, woken: threading.Event) -> None:
    while True:
        woken.wait(interval)
        woken.clear()
        target = ref()
        if target is None:
            return
        try:
            target.warm()
        except Exception:  # never let the warm thread die: scrapes then render themselves
            log.exception("warming the exposition failed")
        del target
