"""What a job read from another framework's output cannot show is said in that framework's
own words and keys (its table's `cannot_show`, rlhf_exporter/frameworks/tables.py), never
as the verl keys its records were translated into; and a line is listed only while the
job's own keys have not supplied what it names.

Checked where a user reads it: `diagnose`'s JSON summary, the same files through serve's
`verl` route (the job summary behind `/` and the job page), and the job page's HTML."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from rlhf_exporter.commands.diagnose import diagnose_stream, diagnose_tensorboard
from rlhf_exporter.diagnosis.advice import missing_evidence
from rlhf_exporter.frameworks import TABLES
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.writers import JsonWriter

TH = load_thresholds()
ROOT = Path(__file__).resolve().parent / "fixtures" / "frameworks"
# a verl key named as what cannot be shown: a timer, an agent-loop key, an MFU key
VERL_WORDS = re.compile(
    r"timing_s/|agent_loop/|perf/mfu/|perf/total_num_tokens|response_length/max"
)


def _console(framework: str) -> Path:
    return ROOT / framework / "regression.console.log"


def _diagnosed(path: Path) -> list[str]:
    out = io.StringIO()
    writer = JsonWriter(out)
    if path.is_dir():
        diagnose_tensorboard(str(path), TH, writer)
    else:
        with path.open("rb") as stream:
            diagnose_stream(stream, str(path), TH, 1 << 20, writer)
    writer.close()
    (f,) = json.loads(out.getvalue())["files"]
    return list(f["cannot_show"])


@pytest.mark.parametrize("framework", sorted(TABLES))
def test_diagnose_names_the_frameworks_gaps_in_its_own_keys(framework: str) -> None:
    for path in (_console(framework), ROOT / framework / "regression.tfevents"):
        lines = _diagnosed(path)
        assert lines, path
        assert not [line for line in lines if VERL_WORDS.search(line)], (path, lines)
        assert lines == list(missing_evidence(set(), TABLES[framework].cannot_show)), path


def test_roll_says_it_has_no_token_count_so_no_change() -> None:
    lines = _diagnosed(ROOT / "roll" / "regression.jsonl")
    assert any("regression" in x and "time/step_total" not in x and "token" in x for x in lines)


def test_a_gap_the_jobs_keys_fill_is_not_listed() -> None:
    gaps = TABLES["openrlhf"].cannot_show
    every = missing_evidence(set(), gaps)
    filled = missing_evidence({"perf/mfu/actor"}, gaps)
    assert len(filled) == len(every) - 1
    assert not [x for x in filled if "update" in x and "MFU" in x]
    # and a verl job's lines are verl's, unchanged
    assert missing_evidence(set()) == missing_evidence(set(), None)


@pytest.mark.parametrize("framework", ["roll", "slime"])
def test_serve_and_the_job_page_say_the_same(framework: str, tmp_path: Path) -> None:
    from rlhf_exporter.view.pages import Facts, Links, job_page

    shutil.copytree(ROOT / framework / "regression.tfevents", tmp_path / "root" / "p" / "e")
    src = VerlFileSource(TH, [tmp_path / "root"])
    for _ in range(40):
        src.poll_once()
    (summary,) = src.jobs()
    assert summary["framework"] == framework
    assert list(summary["cannot_show"]) == _diagnosed(ROOT / framework / "regression.tfevents")
    page = job_page(summary, [], Facts("test", "http://127.0.0.1:9", "verl"), Links(""))
    box = page.split('<div class="cannot-show">', 1)[1].split("</div>", 1)[0]
    assert not VERL_WORDS.search(box), box
