"""Consecutive sub-steps of one fully-async record, placed together on the GPU signal.

`timeline.Placer` lays a record's sub-steps after its anchor with each timer split evenly
between them: every sub-step edge inside the run is an estimate, off by the sub-steps' own
spread, which `gpufit.place_untimed` alone cannot correct (it keeps each timeline's edges).
Here the run is one sequence: its windows in order, the untimed time of every sub-step and
the driver's gaps between sub-steps all free (`place_untimed` on the whole run, whose outer
edges stay, then `gpufit.fit_durations` on its windows), so each busy window lands on its
busy stretch wherever the sub-step edges really were. Each sub-step then takes back its
windows; the untimed stretch between two sub-steps' windows is shared in the proportions the
even layout gave it (the first's trailing gap, the driver's gap between them, the second's
leading gap), so `other` keeps about its R and the gap between sub-steps stays unattributed.

Pure: no I/O, bounded work (MAX_RUN, MAX_RUN_WINDOWS).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .gpufit import QUANTA, Busy, fit_durations, place_untimed
from .timeline import SHIFT_TIMER, UNTIMED, Interval, Timeline

MAX_RUN = 8  # sub-steps placed together at most (the dynamic programme grows with the run)
MAX_RUN_WINDOWS = 32  # windows placed together at most (bounded work on any head's timelines)
RUN_QUANTA = 3  # a run's R in at most this many times QUANTA quanta (the fit refines the edges)


def place_substeps(
    tls: Sequence[Timeline], busy: Busy, quanta: int = QUANTA
) -> tuple[Timeline, ...]:
    """The sub-steps `tls` (one record's, in order) placed together (the module's
    docstring). A run that overlaps, or a sub-step without a window, is placed sub-step by
    sub-step; the shifted sub-step (the one that syncs) alone."""
    held = next(
        (i for i, tl in enumerate(tls) if any(iv.timer == SHIFT_TIMER for iv in tl.intervals)),
        None,
    )
    if held is not None and len(tls) > 1:
        # the shifted sub-step ends at the previous record, the others start after it: each
        # side is placed with its own anchor, the shifted one alone
        sides = (tls[:held], tls[held : held + 1], tls[held + 1 :])
        return tuple(x for side in sides if side for x in place_substeps(side, busy, quanta))
    if not tls:
        return ()
    size = _piece(tls)
    if size < len(tls):
        return (
            *place_substeps(tls[:size], busy, quanta),
            *place_substeps(tls[size:], busy, quanta),
        )
    joined = _joined(tls)
    if joined is None:
        if len(tls) == 1:
            return (place_untimed(tls[0], busy, quanta),)
        return tuple(x for t in tls for x in place_substeps([t], busy, quanta))
    run, counts, leads, trails = joined
    placed = place_untimed(run, busy, quanta * min(len(tls), RUN_QUANTA))
    windows = fit_durations([iv for iv in placed.intervals if iv.timer != UNTIMED], placed, busy)
    # each sub-step's placed windows, then its edges inside the untimed stretches
    groups, k = [], 0
    for c in counts:
        groups.append(windows[k : k + c])
        k += c
    edges = _edges(tls, groups, run, leads, trails)
    return tuple(
        _laid(tl, ws, edges[2 * i], edges[2 * i + 1])
        for i, (tl, ws) in enumerate(zip(tls, groups, strict=True))
    )


def _piece(tls: Sequence[Timeline]) -> int:
    """How many of `tls` are placed together: at most MAX_RUN sub-steps and MAX_RUN_WINDOWS
    windows (a longer run goes in pieces, each piece's outer edges the estimates)."""
    size = windows_seen = 0
    for size, tl in enumerate(tls, 1):
        windows_seen += sum(1 for iv in tl.intervals if iv.timer != UNTIMED)
        if size > 1 and (size > MAX_RUN or windows_seen > MAX_RUN_WINDOWS):
            size -= 1
            break
    return size


def _joined(
    tls: Sequence[Timeline],
) -> tuple[Timeline, list[int], list[float], list[float]] | None:
    """The run as one timeline (the driver's gaps between sub-steps as untimed time), with
    each sub-step's number of windows and its leading and trailing untimed seconds; None
    when a sub-step has no window or overlaps the one before."""
    intervals: list[Interval] = []
    counts: list[int] = []
    leads: list[float] = []
    trails: list[float] = []
    for i, tl in enumerate(tls):
        timed = [iv for iv in tl.intervals if iv.timer != UNTIMED]
        if not timed or (i and tl.start < tls[i - 1].end):
            return None
        if i and tl.start > tls[i - 1].end:
            intervals.append(Interval(UNTIMED, "other", tls[i - 1].end, tl.start))
        intervals.extend(tl.intervals)
        counts.append(len(timed))
        leads.append(timed[0].start - tl.start)
        trails.append(tl.end - timed[-1].end)
    run = Timeline(
        tls[0].step, tls[0].start, tls[-1].end, tuple(intervals), max(t.error_seconds for t in tls)
    )
    return run, counts, leads, trails


def _edges(
    tls: Sequence[Timeline],
    groups: list[list[Interval]],
    run: Timeline,
    leads: list[float],
    trails: list[float],
) -> list[float]:
    """Each sub-step's start and end, in turn. Each keeps its own untimed seconds (its share
    of the record's R, a logged fact): what its windows leave between them, the rest at its
    two ends in the even layout's proportions, as far as the neighbours' windows leave room.
    An estimated outer edge (the run's) no longer decides how much `other` a sub-step gets:
    its slop, often the next sub-step's busy start, stays unattributed."""
    m = len(tls)
    want_lead, want_trail = [], []
    for i, (tl, ws) in enumerate(zip(tls, groups, strict=True)):
        r = sum(iv.end - iv.start for iv in tl.intervals if iv.timer == UNTIMED)
        inner = sum(max(0.0, y.start - x.end) for x, y in itertools.pairwise(ws))
        rest = max(0.0, r - inner)
        ends = leads[i] + trails[i]
        lead = rest * leads[i] / ends if ends > 0.0 else rest / 2
        want_lead.append(lead)
        want_trail.append(rest - lead)
    edges = []
    for i in range(m + 1):
        lo = groups[i - 1][-1].end if i else run.start
        hi = groups[i][0].start if i < m else run.end
        room = max(0.0, hi - lo)
        trail = want_trail[i - 1] if i else 0.0
        lead = want_lead[i] if i < m else 0.0
        if i == 0:
            trail, lead = 0.0, min(lead, room)
        elif i == m:
            trail = min(trail, room)
        elif trail + lead > room:
            scale = room / (trail + lead)
            trail, lead = trail * scale, lead * scale
        if i:
            edges.append(lo + trail)
        if i < m:
            edges.append(hi - lead)
    return edges


def _laid(tl: Timeline, ws: list[Interval], start: float, end: float) -> Timeline:
    """Sub-step `tl` from `start` to `end` with its placed windows, untimed between them."""
    ivs: list[Interval] = []
    t = start
    for iv in ws:
        if iv.start > t:
            ivs.append(Interval(UNTIMED, "other", t, iv.start))
        ivs.append(iv)
        t = iv.end
    if end > t:
        ivs.append(Interval(UNTIMED, "other", t, end))
    return tl._replace(start=start, end=end, intervals=tuple(ivs))
