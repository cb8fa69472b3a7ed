"""The Markdown templates the generated docs and runbooks are filled from
(rlhf_exporter/render/template.py, rlhf_exporter/render/templates/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import Thresholds
from rlhf_exporter.render import template
from rlhf_exporter.render.docs import decision_table_markdown
from rlhf_exporter.render.rules import Context, all_alerts
from rlhf_exporter.render.rules.output import runbooks_markdown
from rlhf_exporter.thresholds_file import default_document

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]


def test_a_placeholder_without_a_value_fails_the_render() -> None:
    with pytest.raises(template.TemplateError, match=r"no value for \$\{window\}"):
        template.substitute("over ${window}", {"verdict": "rollout"})


def test_only_braced_names_are_placeholders() -> None:
    text = "{{ $labels.project }} costs $5; `rate(x[5m])` over ${window} (${verdict.min_share})"
    filled = template.substitute(text, {"window": "30m", "verdict.min_share": 0.35})
    assert filled == "{{ $labels.project }} costs $5; `rate(x[5m])` over 30m (0.35)"


def test_sections_join_wrapped_lines_and_keep_list_items_apart() -> None:
    parsed = template.parse(
        "a comment before the first heading\n\n"
        "## Meaning\n\nOne paragraph\nwrapped on two lines.\n\nA second one.\n\n"
        "## Immediate mitigation\n\n1. First,\n   wrapped.\n2. Second.\n\n"
        "## What to change\n\n- `a.b`: one\n  more line\n- two\n"
    )
    assert parsed == {
        "Meaning": ("One paragraph wrapped on two lines.", "A second one."),
        "Immediate mitigation": ("First, wrapped.", "Second."),
        "What to change": ("`a.b`: one more line", "two"),
    }


def test_every_template_ships_in_the_wheel() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["rlhf_exporter"]
    package = ROOT / "rlhf_exporter"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    templates = set(template.FOLDER.rglob("*.md"))
    assert templates and templates <= shipped, sorted(map(str, templates - shipped))


def test_every_alert_has_its_runbook_template_and_none_is_orphaned() -> None:
    names = {a.name for a in all_alerts(Context(Thresholds.from_documents(default_document())))}
    files = {p.stem for p in (template.FOLDER / "runbooks").glob("*.md")}
    bound = {n for n in names if n.endswith("Bound")}
    missing, orphaned = names - bound - files, files - {"bound", "shared"} - names
    assert not missing, f"write the runbook as render/templates/runbooks/<Alert>.md: {missing}"
    assert not orphaned, f"no alert reads these runbook templates: {orphaned}"
    for alert in all_alerts(Context(Thresholds.from_documents(default_document()))):
        assert alert.runbook.meaning and alert.runbook.change, alert.name


def test_the_thresholds_reach_the_prose() -> None:
    """Every number a template prints comes from the thresholds: other thresholds, other words."""
    th = Thresholds.from_documents(
        default_document(),
        {
            "alerts": {"stall_factor": 7, "stall_min": "25m", "gpu_idle_ratio": 0.15},
            "verdict": {"min_share": 0.41},
            "engine": {"kv_full": 0.97},
            "reason": {"preempted_max": 3},
            "balance": {"trainer_starved_idle": 0.45},
        },
    )
    runbooks, table = runbooks_markdown(Context(th)), decision_table_markdown(th)
    assert "max(7 x the job's baseline step time, 25m)" in runbooks
    assert "is below 0.15 while the job makes steps" in runbooks
    assert "`balance.trainer_starved_idle` (0.45)" in runbooks
    assert "below **0.41** (`verdict.min_share`)" in table
    assert "KV cache ≥ 0.97 with requests waiting" in table
    assert "KV ≥ **0.97** (`engine.kv_full`)" in table
    assert "`agent_loop/num_preempted/max` > 3 (verl writes −1" in table
