"""What the step-anatomy drawing should show for a step (the view tests, in process and in a
browser, read it the same way)."""

from __future__ import annotations

from rlhf_exporter.diagnosis import GROUPS


def expected_segments(d) -> list[str]:
    """Nonzero groups of a step, `other` without the untimed remainder, which is its own."""
    out = []
    for g in GROUPS:
        s = d.windows.group_seconds[g] - (d.windows.untimed_seconds if g == "other" else 0.0)
        if s > 1e-9:
            out.append(g)
    if d.windows.untimed_seconds > 1e-9:
        out.append("untimed")
    return out
