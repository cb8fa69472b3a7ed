"""bench/README.md is the current figures, one section per bench script, each with the
command that reproduces it; the history is bench/HISTORY.md, linked from CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
README = (BENCH / "README.md").read_text(encoding="utf-8")


def test_the_readme_stays_short():
    assert len(README.splitlines()) < 400


def test_every_bench_script_has_a_section_with_its_command():
    scripts = {p.name for p in BENCH.glob("*.py")}
    sections = set(re.findall(r"^## `([a-z_]+\.py)", README, flags=re.M))
    assert scripts == sections, (scripts - sections, sections - scripts)
    for name in scripts:
        assert f"python bench/{name}" in README, name


def test_every_command_names_a_script_that_exists():
    named = set(re.findall(r"python bench/([a-z_]+\.py)", README))
    assert named and all((BENCH / name).is_file() for name in named), named


def test_the_links_to_the_history_and_the_changelog_hold():
    for text, base in ((README, BENCH), ((ROOT / "CHANGELOG.md").read_text("utf-8"), ROOT)):
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
        assert links, base
        for link in links:
            assert (base / link).resolve().is_file(), link
    assert "(HISTORY.md)" in README
    assert "bench/HISTORY.md" in (ROOT / "CHANGELOG.md").read_text("utf-8")
