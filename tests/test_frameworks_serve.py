"""`serve` gives the scripted labels while each framework fixture is replayed through its
route: the `verl` source's root (`--verl-root`) with an event directory
`<root>/<project>/<experiment>/` (every framework's `tensorboard` logger) or ROLL's JSON lines
`<root>/<project>/<experiment>.jsonl`, written a line at a time between polls."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis.change import contract_change
from rlhf_exporter.frameworks import FRAMEWORKS
from rlhf_exporter.sources.tensorboard_reader import IDLE_POLLS
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds

ROOT = Path(__file__).resolve().parent / "fixtures" / "frameworks"
TH = load_thresholds()


def cases() -> list[Path]:
    """Each framework's event directories and ROLL's JSON lines that have expected labels."""
    out = []
    for expected in sorted(ROOT.glob("*/*.expected.jsonl")):
        stem = expected.name[: -len(".expected.jsonl")]
        for suffix in (".tfevents", ".jsonl"):
            source = expected.with_name(stem + suffix)
            if source.exists():
                out.append(source)
    return out


def expected_labels(source: Path) -> list[tuple[int, str, str | None, str]]:
    stem = source.name.rsplit(".", 1)[0]
    rows = source.with_name(stem + ".expected.jsonl").read_text(encoding="utf-8").splitlines()
    return [
        (d["step"], d["verdict"], d["reason"], d["change"])
        for line in rows
        if line.strip() and "step" in (d := json.loads(line))
    ]


def served_labels(src: VerlFileSource) -> list[tuple[int, str, str | None, str]]:
    (watched,) = src._watched.values()
    return [(p.step, p.verdict, p.reason, contract_change(p.change)) for p in watched.job._history]


CASES = cases()


@pytest.mark.parametrize("source", CASES, ids=[str(s.relative_to(ROOT)) for s in CASES])
def test_serve_gives_the_scripted_labels(source: Path, tmp_path: Path) -> None:
    project = tmp_path / "root" / source.parent.name.strip("_") / "job"
    project.parent.mkdir(parents=True)
    src = VerlFileSource(TH, [tmp_path / "root"])
    if source.is_dir():  # an event directory: as the logger left it
        shutil.copytree(source, project)
        for _ in range(IDLE_POLLS + 2):  # the last step, once its files went quiet
            src.poll_once()
    else:  # JSON lines, a line between two polls
        path = project.with_suffix(".jsonl")
        path.touch()
        for line in source.read_bytes().splitlines(keepends=True):
            with path.open("ab") as f:
                f.write(line)
            src.poll_once()
    assert served_labels(src) == expected_labels(source)
    # the framework, detected from the output: a label and on `/` (the job's summary)
    framework = source.parent.name if not source.parent.name.startswith("_") else None
    snap = src.poll_once()
    (info,) = [x for part in snap.parts for x in part if x.name == "rlhf_job_framework_info"]
    (summary,) = src.jobs()
    assert info.labels[2] == summary["framework"] == (framework or info.labels[2])
    assert info.labels[2] in FRAMEWORKS[1:] and info.value == 1.0


def test_there_are_event_directories_and_json_lines() -> None:
    assert {s.suffix for s in CASES} == {".tfevents", ".jsonl"}


def test_a_verl_job_is_labelled_verl(tmp_path: Path) -> None:
    path = tmp_path / "root" / "p" / "e.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"step": 1, "data": {"timing_s/step": 10.0, "timing_s/gen": 8.0}}\n')
    src = VerlFileSource(TH, [tmp_path / "root"])
    snap = src.poll_once()
    info = [x for part in snap.parts for x in part if x.name == "rlhf_job_framework_info"]
    assert [x.labels for x in info] == [("p", "e", "verl")]


def test_the_framework_is_on_the_landing_page(tmp_path: Path) -> None:
    from rlhf_exporter.view.pages import Facts, Links, index_page

    source = next(s for s in CASES if s.suffix == ".tfevents")
    shutil.copytree(source, tmp_path / "root" / "p" / "e")
    src = VerlFileSource(TH, [tmp_path / "root"])
    src.poll_once()
    (summary,) = src.jobs()
    page = index_page([summary], [], Facts("test", "http://127.0.0.1:9", "verl"), Links(""))
    assert f'<span class="muted framework">{summary["framework"]}</span>' in page
    assert summary["framework"] != "verl"
