"""Honest health (issue 38): `/` never says a source is fine when it is not, and
`render --check` never claims "up to date" when it exits 1."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from rlhf_exporter.demo.simulator import DEMO_PLAN, write_jsonl
from tests.support.procs import exporter_cmd
from tests.support.serve import Exporter

ROOT = Path(__file__).resolve().parents[1]


def _verl_row(page: str) -> str:
    (row,) = re.findall(r'<tr class="source" data-up="\d">\s*<td>verl</td>.*?</tr>', page, re.S)
    return row


def test_a_missing_verl_file_is_down_with_its_reason_until_it_appears(tmp_path):
    log = tmp_path / "run.jsonl"
    args = ("--verl-file", str(log), "--project", "p", "--experiment", "e")
    with Exporter(tmp_path / "serve", *args) as exp:
        exp.wait_for(lambda: exp.value("rlhf_exporter_collector_up", collector="verl") == 0)
        row = _verl_row(exp.get("/").text)
        assert 'data-up="0"' in row and ">down<" in row and "file_missing" in row, row
        assert (
            exp.value(
                "rlhf_exporter_collector_errors_total", collector="verl", reason="file_missing"
            )
            == 1
        )
        write_jsonl(log, DEMO_PLAN[:3])
        exp.wait_for(lambda: exp.value("rlhf_exporter_collector_up", collector="verl") == 1)
        exp.wait_for(lambda: 'data-up="1"' in _verl_row(exp.get("/").text), what="/ says up")


def test_render_check_without_the_dashboards_extra_says_what_it_did_not_check(tmp_path):
    """The dashboards extra missing (its SDK hidden by a package that fails to import): the
    check names the target it could not compare, exits 1, and never says "up to date"."""
    shim = tmp_path / "shim" / "grafana_foundation_sdk"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'shim'}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        exporter_cmd("render", "--check"), capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "up to date" not in out.stdout + out.stderr
    assert "NOT checked: dashboards" in out.stdout and "dashboards` extra" in out.stderr
