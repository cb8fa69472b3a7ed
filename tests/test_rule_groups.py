"""The recording groups' order (issue 37): the window's records are split into several
groups so that each evaluates in a few % of its interval at 1,000 jobs x 24 h. A record is
read only by its own group's later rules or by a later group of the same file, so that
promtool (which evaluates the groups in file order at each step) and Prometheus (each group
on its own timer) read the same evaluation or at most one interval late, as before."""

from __future__ import annotations

import re

from rlhf_exporter.render import rules
from rlhf_exporter.render.rules.model import Context
from rlhf_exporter.render.rules.recording import recording
from rlhf_exporter.thresholds_file import load_thresholds


def _file_groups() -> dict[str, list[dict]]:
    return rules.rule_groups(load_thresholds())


def reads_before_defined(groups: list[dict]) -> list[tuple[str, str]]:
    """(group, record) for each record a rule reads before its file defines it (its own
    rule, a self-carry through last_over_time, is allowed)."""
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    seen: set[str] = set()
    bad = []
    for group in groups:
        for rule in group["rules"]:
            own = rule.get("record")
            for name in records - seen - {own}:
                if re.search(rf"{re.escape(name)}\b", rule["expr"]):
                    bad.append((group["name"], name))
            if own:
                seen.add(own)
    return bad


def test_a_record_is_read_only_after_it_is_defined():
    groups = _file_groups()[rules.RECORDING_FILE]
    assert reads_before_defined(groups) == []
    # the check can fail: the dominant reason before the reasons it reads
    reasons = {**groups[1], "rules": groups[1]["rules"][::-1]}
    assert reads_before_defined([groups[0], reasons, *groups[2:]]) == [
        ("rlhf-exporter.recording.reasons", groups[1]["rules"][0]["record"])
    ]


def test_the_window_records_are_split_and_every_one_is_kept():
    names = [g["name"] for g in _file_groups()[rules.RECORDING_FILE]]
    assert names[:3] == [
        "rlhf-exporter.recording",
        "rlhf-exporter.recording.reasons",
        "rlhf-exporter.recording.changes",
    ]
    every = {r["record"] for g in _file_groups()[rules.RECORDING_FILE] for r in g["rules"]}
    ctx = Context(load_thresholds(), 1.0)
    assert every == {r["record"] for r in recording(ctx)}
