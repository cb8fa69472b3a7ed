"""`promtool test rules` on the rule files of `rlhf_exporter.render.rules`: the harness every
rule test shares (copies of the rules without annotations, a test spec, promtool's verdict)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from .prometheus import binary


def without_annotations(tmp_path: Path, files: dict[str, list[dict]]) -> list[Path]:
    """`files` (path in the repository -> rule groups, as `rules.rule_groups` returns them)
    written under `tmp_path` without annotations: promtool compares annotations exactly, so
    the logic cases leave them out (the template cases check the committed files')."""
    out = []
    for rel, groups in files.items():
        for group in groups:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        path = tmp_path / Path(rel).name
        path.write_text(yaml.safe_dump({"groups": groups}))
        out.append(path)
    return out


def eval_order(rule_files: list[Path]) -> list[str]:
    """The groups of `rule_files` for promtool's `group_eval_order`: each after every group
    whose records it reads, otherwise in file order (groups that read each other's records,
    one of them always a minute stale, raise ValueError). Without it promtool evaluates the
    groups of one time in a Go map's order: an alert on a record sees this minute's record
    in one run and the last minute's in another, and a case at a transition passes or fails
    by chance. A real Prometheus runs each group on its own timer, so there an alert may
    follow its record one evaluation later than these tests show."""
    groups = [
        group
        for path in rule_files
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    ]
    writes = {g["name"]: {r["record"] for r in g["rules"] if "record" in r} for g in groups}
    reads = {
        g["name"]: set().union(
            *(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r["expr"]) for r in g["rules"])
        )
        for g in groups
    }
    order: list[str] = []
    todo = [g["name"] for g in groups]
    while todo:
        ready = [
            name
            for name in todo
            if not any(writes[other] & reads[name] for other in todo if other != name)
        ]
        if not ready:
            raise ValueError(f"groups that read each other's records: {todo}")
        order.append(ready[0])
        todo.remove(ready[0])
    return list(dict.fromkeys(order))  # a name two files share is listed once


def run_rule_tests(
    tmp_path: Path, rule_files: list[Path], tests: list[dict], spec_name: str = "tests.yaml"
) -> subprocess.CompletedProcess:
    """`tests` against `rule_files` at a 1m evaluation interval; fails the test with
    promtool's output unless every case passes (skips where promtool is not installed)."""
    spec = tmp_path / spec_name
    spec.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(p) for p in rule_files],
                "evaluation_interval": "1m",
                "group_eval_order": eval_order(rule_files),
                "tests": tests,
            },
            sort_keys=False,
        )
    )
    out = subprocess.run(
        [binary("promtool"), "test", "rules", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    return out
