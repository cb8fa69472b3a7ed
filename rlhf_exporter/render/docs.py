"""docs/metrics.md from the metric catalog and docs/decision-table.md from the thresholds; their
prose is in templates/ (metrics.md, decision-table.md, decision-table-rows.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..diagnosis import Thresholds
from ..metrics.catalog import CATALOG, LABELS
from .template import fill, flat, sections, substitute, text

ORDER = 10
ROWS = "decision-table-rows.md"
MFU_REASONS = ("compute_bound", "low_mfu", "mfu_unknown")
HEADER = text("metrics.md")
"""docs/metrics.md's opening: what the catalog is, and the migration notes."""


def _group_of(doc: Mapping[str, Any], timer: str) -> str:
    """The group `groups` puts a timer in (`other` when none does)."""
    return next((g for g, ts in doc["groups"].items() if timer in ts), "other")


def metrics_markdown() -> str:
    lines = [HEADER]
    section = None
    for m in CATALOG:
        if m.section != section:
            section = m.section
            lines += [
                "",
                f"## {section}",
                "",
                "| name | type | labels | meaning |",
                "|---|---|---|---|",
            ]
        labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {m.help} |")
    lines += ["", "## Label names", "", "| label | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in LABELS.items()]
    return "\n".join(lines) + "\n"


def targets(thresholds: Thresholds) -> dict[str, str]:
    return {
        "docs/metrics.md": metrics_markdown(),
        "docs/decision-table.md": decision_table_markdown(thresholds),
    }


def decision_table_markdown(th: Thresholds) -> str:
    """docs/decision-table.md: the table as this version implements it, numbers included."""
    from ..diagnosis import GROUPS, REASONS
    from ..diagnosis.advice import CHANGE_MEANING, REASON_MEANING, VERDICT_MEANING, look_at
    from ..diagnosis.change import MEASURE_MEANING, MEASURES

    doc, ck = th.document, th.document["checkpoint"]
    values = flat(doc)
    rows = sections(ROWS)
    groups = []
    for g in GROUPS:
        timers = ", ".join(f"`{t}`" for t in doc["groups"].get(g, []))
        if g == "other":
            timers += ", " + rows["the timers of other"][0]
        groups.append(f"| `{g}` | {timers} | {VERDICT_MEANING[g]} |")
    reasons = []
    for verdict, names in REASONS.items():
        for reason in names:
            condition = substitute(rows[reason][0], values, ROWS) if reason in rows else "always"
            if reason in MFU_REASONS:
                condition += " " + rows[f"the MFU key of {verdict}"][0]
            reasons.append(
                f"| `{verdict}` | `{reason}` — {REASON_MEANING[reason]} | {condition} | "
                f"{look_at(verdict, reason)} |"
            )
    regrouped, split = rows["a regrouped timer"][0], rows["a split timer"][0]
    values |= {
        "group_rows": "\n".join(groups),
        "regrouped": "".join(
            " " + substitute(regrouped, {"timer": t, "marker": m, "group": g}, ROWS)
            for t, (m, g) in doc["regrouped_timers"].items()
            if m
        ),
        "ignored_timers": ", ".join(f"`{t}`" for t in doc["ignored_timers"]),
        "nested_timers": ", ".join(f"`{i}` in `{o}`" for i, o in doc["nested_timers"].items()),
        "split_timers": ", ".join(
            substitute(
                split,
                {"inner": i, "outer": o, "rest": r, "rest_group": _group_of(doc, r)},
                ROWS,
            )
            for i, (o, r) in doc["split_timers"].items()
        ),
        "inside_needs": ", ".join(f"a `{t}`" for t in ck["inside_needs"]),
        "separated_timers": ", ".join(f"`{t}`" for t in ck["separated_timers"]),
        "reason_rows": "\n".join(reasons),
        "measure_rows": "\n".join(
            f"| `{g}` | {'; '.join(MEASURE_MEANING[m] for m in ms)} |" for g, ms in MEASURES.items()
        ),
        **{f"{kind}_meaning": meaning for kind, meaning in CHANGE_MEANING.items()},
    }
    return fill("decision-table.md", values)
