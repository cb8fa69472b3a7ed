"""Colours, units and labels the dashboards share: one verdict -> colour map for both boards.

Pure data (no Grafana SDK), so tests and other renderers can import it. A decision-table
group and the verdict of the same name share a colour, so a stacked step-time panel and the
verdict timeline read alike: blue is rollout wherever it appears.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...diagnosis import BALANCED, CHANGES, GROUPS, REASONS, UNKNOWN, VERDICTS

VERDICT_COLOURS: Mapping[str, str] = {
    "rollout": "#3274D9",  # blue: the trainer waits for samples
    "reward": "#A352CC",  # purple: a reward model scores the batch
    "logprob": "#37B5B5",  # teal: training-side inference
    "update": "#FF9830",  # orange: the optimizer
    "sync": "#E02F44",  # red: weights going back to the rollout engines
    "checkpoint": "#8C6D46",  # brown: saving
    "other": "#FADE2A",  # yellow: driver work and the untimed remainder
    BALANCED: "#73BF69",  # green: no window dominates, nothing to chase
    UNKNOWN: "#8E8E8E",  # grey: the step had no usable timing_s/step
}
"""The one verdict -> colour map. Groups use the colour of the verdict of the same name."""

CHANGE_COLOURS: Mapping[str, str] = {
    "steady": "#73BF69",  # green: in line with the job's baseline
    "workload_shift": "#5794F2",  # blue: more work, no window costs more than it explains
    "regression": "#E02F44",  # red: some window costs more than its work explains
}

ATTENTION: Mapping[str, tuple[int, str]] = {
    "failed": (5, "#E02F44"),  # red
    "stalled": (4, "#FF9830"),  # orange
    "regressed": (3, "#FADE2A"),  # yellow: running, and its last step regressed
    "running": (2, "#73BF69"),  # green
    "unknown": (1, "#8E8E8E"),  # grey: no step yet
    "finished": (0, "#5794F2"),  # blue: done
}
"""The fleet table's state column: a job's state (project_experiment_state:rlhf_job_state:max,
with regressed for a running job whose last step regressed) as a number whose order is what
needs attention first: the table sorts by it."""

NO_VALUE_COLOUR = "#8E8E8E"
OK, WARN, BAD = "#73BF69", "#FF9830", "#E02F44"

# Units (Grafana unit ids).
SECONDS = "s"
RATIO = "percentunit"
BYTES = "bytes"
TOKENS = "short"
PLAIN = "short"

assert set(VERDICT_COLOURS) == set(VERDICTS), "every verdict needs a colour"
assert set(CHANGE_COLOURS) == set(CHANGES), "every change kind needs a colour"


def verdict_codes() -> dict[str, int]:
    """verdict -> a small integer, for drawing the one-hot verdict as one state series."""
    return {v: i + 1 for i, v in enumerate(VERDICTS)}


def reason_codes() -> dict[tuple[str, str], int]:
    """(verdict, reason) -> an integer disjoint from the verdict codes (100 + 10 x v + r)."""
    out = {}
    for vi, verdict in enumerate(VERDICTS):
        for ri, reason in enumerate(REASONS[verdict]):
            out[(verdict, reason)] = 100 + 10 * vi + ri
    return out


def change_codes() -> dict[str, int]:
    """change kind -> integer (0 is `steady`)."""
    return {c: i for i, c in enumerate(CHANGES)}


def group_colours() -> dict[str, str]:
    return {g: VERDICT_COLOURS[g] for g in GROUPS}


def verdict_mappings() -> dict[int, tuple[str, str]]:
    return {code: (v, VERDICT_COLOURS[v]) for v, code in verdict_codes().items()}


def reason_mappings() -> dict[int, tuple[str, str]]:
    out = {code: (reason, VERDICT_COLOURS[v]) for (v, reason), code in reason_codes().items()}
    out[0] = ("no reason (balanced/unknown)", NO_VALUE_COLOUR)
    return out


def attention_mappings() -> dict[int, tuple[str, str]]:
    return {code: (name, colour) for name, (code, colour) in ATTENTION.items()}


def change_mappings() -> dict[int, tuple[str, str]]:
    return {code: (c, CHANGE_COLOURS[c]) for c, code in change_codes().items()}
