"""Package code says what it does, not where it came from: no comment, docstring or string of
`rlhf_exporter/` cites one of this project's issue numbers, and no comment or docstring cites
an upstream source file by line (those go stale with each release: docs/verl-support.md cites
verl's source, and `verl-drift` keeps it current)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlhf_exporter"

ISSUE = re.compile(r"(?<!verl )\b[Ii]ssues? ?#?\d+|\(issue\b")
"""`issue 38`, `Issue #23`, `(issue`: this project's tracker (verl's own issues may be named)."""
HASH_NUMBER = re.compile(r"(?<![\w&])#\d{2,}\b")
"""`#37` in a comment or docstring: an issue or pull request by number."""
LINE_CITATION = re.compile(r"\b[\w./-]+\.py:\d+")
"""`fsdp_workers.py:860`: a source file by line."""

FRAME_EXAMPLES = {"rlhf_exporter/diagnosis/stacks.py"}
"""Files whose `file.py:line` is a stack frame's printed form, not a citation."""


def _texts(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, text) of every comment, docstring and other string literal of `path`."""
    source = path.read_text(encoding="utf-8")
    out = [
        (tok.start[0], "comment", tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    tree = ast.parse(source)
    statements = [  # a string alone as a statement: the docstring of a module, class,
        stmt  # function or attribute
        for node in ast.walk(tree)
        if isinstance(body := getattr(node, "body", None), list)
        for stmt in body
    ]
    docstrings = {
        id(stmt.value): stmt.value.value
        for stmt in statements
        if isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            kind = "docstring" if id(node) in docstrings else "string"
            out.append((node.lineno, kind, node.value))
    return out


def citations(path: Path, root: Path = ROOT) -> list[str]:
    """Every citation in `path`, as `file:line: kind cites 'text'`."""
    rel = path.relative_to(root).as_posix()
    found = []
    for line, kind, text in _texts(path):
        checks = [ISSUE] if kind == "string" else [ISSUE, HASH_NUMBER]
        if kind != "string" and rel not in FRAME_EXAMPLES:
            checks.append(LINE_CITATION)
        for pattern in checks:
            for match in pattern.finditer(text):
                found.append(f"{rel}:{line}: {kind} cites {match[0]!r}")
    return found


FILES = sorted(PKG.rglob("*.py"))


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Each pattern finds its kind of citation, and passes the words that only look alike."""
    source = (
        '"""A module (issue 12)."""\n'
        "X = 1  # counted apart, issue #37\n"
        "Y = 2  # see #48\n"
        "# verl/workers/fsdp_workers.py:860 logs it\n"
        'Z = "the value before Issue 38"\n'
        'W = "#73BF69 colour, verl issue #6693, socket.py:706 in a frame"\n'
    )
    sample = tmp_path / "rlhf_exporter" / "sample.py"
    sample.parent.mkdir()
    sample.write_text(source, encoding="utf-8")
    found = [c.split(": ", 1)[1] for c in citations(sample, tmp_path)]
    assert found == [
        "comment cites 'issue #37'",
        "comment cites '#37'",
        "comment cites '#48'",
        "comment cites 'verl/workers/fsdp_workers.py:860'",
        "docstring cites '(issue'",
        "string cites 'Issue 38'",
    ], found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_package_code_cites_no_issue_and_no_upstream_line(path: Path) -> None:
    found = citations(path)
    assert not found, "\n".join(found)
