"""Every alert's summary and description are Markdown (render/templates/runbooks/<Alert>.md,
`## Summary` and `## Description`); the rule modules keep the PromQL and the Go-template pieces,
passed in as placeholder values."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import Thresholds
from rlhf_exporter.render import template
from rlhf_exporter.render.rules import Alert, Context, all_alerts
from rlhf_exporter.render.rules.model import alert_prose, fragment
from rlhf_exporter.render.rules.output import runbooks_markdown
from rlhf_exporter.thresholds_file import default_document

RULES = Path(template.__file__).with_name("rules")
ALERT_MODULES = [
    RULES / f"{m}.py" for m in ("operations", "decision", "gpuhealth", "gpuwindows", "remotewrite")
]
SENTENCE = re.compile(r"[A-Za-z']+(?: [A-Za-z']+){3,}")
"""Four words in a row: prose, which belongs in a template."""
SECTION_READERS = {"alert_prose", "fragment", "runbook", "shared_prose"}


def default_alerts() -> list[Alert]:
    return all_alerts(Context(Thresholds.from_documents(default_document())))


def _prose_names(function: ast.FunctionDef) -> set[str]:
    """The names a function assigns from `alert_prose(...)`."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "alert_prose"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def test_summary_and_description_come_from_the_template_helper() -> None:
    """`Alert(summary=..., description=...)` takes `text.summary` and `text.description` of a
    `text = alert_prose(...)` in the same function: never a string, an f-string or a sum."""
    calls = 0
    for path in ALERT_MODULES:
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef):
                continue
            names = _prose_names(function)
            for call in ast.walk(function):
                if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Alert"):
                    continue
                calls += 1
                given = {k.arg: k.value for k in call.keywords}
                for field in ("summary", "description"):
                    value = given.get(field)
                    where = f"{path.name}:{call.lineno} {function.name}() {field}="
                    assert isinstance(value, ast.Attribute) and value.attr == field, (
                        f"{where} must be `text.{field}` from alert_prose(): write the words in "
                        "its template (render/templates/runbooks/<Alert>.md)"
                    )
                    assert isinstance(value.value, ast.Name) and value.value.id in names, where
    assert calls >= 20  # every alert function was read


def test_no_sentence_is_written_in_an_alert_module() -> None:
    """No string literal of the rule modules (docstrings and section names aside) holds four
    words in a row outside its Go-template actions, its backquoted PromQL and its PromQL
    comments."""
    found = []
    for path in ALERT_MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        section_names = {  # a template's section names the prose, it is not prose
            id(arg)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in SECTION_READERS
            for arg in node.args
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docstrings | section_names:
                continue
            text = re.sub(r"\{\{.*?\}\}|`[^`]*`|#[^\n]*", " ", node.value)
            found += [f"{path.name}:{node.lineno}: {m}" for m in SENTENCE.findall(text)]
    assert not found, found


def test_the_probe_finds_a_sentence() -> None:
    """The check above would fail on the kind of literal it forbids."""
    text = "{{ $labels.instance }} in cluster {{ $labels.cluster }} is behind in writing"
    stripped = re.sub(r"\{\{.*?\}\}|`[^`]*`|#[^\n]*", " ", text)
    assert SENTENCE.findall(stripped) == ["is behind in writing"]


def test_every_alert_template_has_a_summary_and_a_description() -> None:
    runbooks = template.FOLDER / "runbooks"
    alert_templates = sorted(p for p in runbooks.glob("*.md") if p.stem != "shared")
    assert len(alert_templates) >= 20
    for path in alert_templates:
        parsed = template.sections(f"runbooks/{path.name}")
        assert len(parsed.get("Summary", ())) == 1, f"{path.name}: one ## Summary paragraph"
        assert parsed.get("Description"), f"{path.name}: a ## Description"


def test_a_template_without_the_sections_fails_the_render() -> None:
    with pytest.raises(template.TemplateError, match="## Summary"):
        alert_prose("shared", {})


def test_a_fragment_without_its_values_or_its_section_fails() -> None:
    with pytest.raises(template.TemplateError, match=r"no value for \$\{stage\}"):
        fragment("bound", "MFU", {})
    with pytest.raises(template.TemplateError, match="no section"):
        fragment("bound", "no such fragment")


def test_every_annotation_is_filled_and_its_go_template_blocks_close() -> None:
    opens = re.compile(r"\{\{-? ?(?:if|with|range)\b")
    ends = re.compile(r"\{\{-? ?end\b")
    for alert in default_alerts():
        for name, text in {
            "summary": alert.summary,
            "description": alert.description,
            **alert.annotations,
        }.items():
            assert text and "${" not in text, (alert.name, name)
            assert len(opens.findall(text)) == len(ends.findall(text)), (alert.name, name)
            assert text.count("{{") == text.count("}}"), (alert.name, name)
        assert "\n" not in alert.summary, alert.name


def test_the_alert_sections_stay_out_of_the_runbooks() -> None:
    runbooks = runbooks_markdown(Context(Thresholds.from_documents(default_document())))
    assert "Fragment" not in runbooks and "{{" not in runbooks
    assert "## Summary" not in runbooks and "## Description" not in runbooks


def test_the_thresholds_reach_the_alert_text() -> None:
    """Other thresholds, other words in the summaries and descriptions."""
    th = Thresholds.from_documents(
        default_document(),
        {
            "alerts": {
                "stall_factor": 7,
                "stall_min": "25m",
                "gpu_idle_ratio": 0.15,
                "pending_for": "7m",
                "bound_throughput_ratio": 0.65,
            },
            "balance": {"trainer_starved_idle": 0.45},
        },
    )
    text = {a.name: a.summary + "\n" + a.description for a in all_alerts(Context(th))}
    assert "max(7 x its baseline step time of" in text["RLHFJobStalled"]
    assert ", 25m) + its longest validation" in text["RLHFJobStalled"]
    assert "(below 15%) while the job kept making steps" in text["RLHFGPUsIdleWhileStepping"]
    assert "in PENDING_CREATION for 7m on the cluster" in text["RLHFRayActorsPending"]
    assert "(costs when below 65%, unless a workload shift)" in text["RLHFJobRolloutBound"]
    assert "(threshold 0.45), from NVML's own busy time" in text["RLHFTrainerStarved"]
    assert "XID 63, 92 or 94 in the last" in text["RLHFGPUNeedsReset"]


def test_each_bound_alert_fills_the_one_bound_template_with_its_own_evidence() -> None:
    bound = {a.name: a for a in default_alerts() if a.name.endswith("Bound")}
    assert len(bound) == 6
    rollout, update = bound["RLHFJobRolloutBound"], bound["RLHFJobUpdateBound"]
    assert "is rollout-bound" in rollout.summary and "is update-bound" in update.summary
    assert "agent-loop generate_sequences max/mean" in rollout.description
    assert "agent-loop" not in update.description
    assert "last step's MFU (perf/mfu/actor)" in update.description
    assert "untimed driver time is" in bound["RLHFJobDriverOverheadBound"].description
    for alert in bound.values():
        meaning, moved, costs, reason, evidence = alert.description.split("\n")
        assert "of the classified steps of" in meaning and "Not moved:" in moved, alert.name
        assert costs.startswith("Throughput: ") and "Dominant reason:" in reason, alert.name
        assert evidence.startswith("Evidence: the "), alert.name
