"""`promtool test rules` on the rule files of `rlhf_exporter.render.rules`: the harness every
rule test shares (copies of the rules without annotations, a test spec, promtool's verdict)."""

from __future__ import annotations

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
