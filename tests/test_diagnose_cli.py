"""`rlhf-exporter diagnose`: formats, inputs, exit codes, and errors a person can act on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_exporter.demo.simulator import REGIMES, regressed, shifted, write_jsonl


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "diagnose", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("logs") / "job.jsonl"
    sync = REGIMES["sync_bound"]
    write_jsonl(
        path,
        [
            (REGIMES["rollout_long_tail"], 8),
            (sync, 8),
            (shifted(sync, 1.6), 3),
            (sync, 3),
            (regressed(sync, "update_actor", 3.0), 3),
        ],
    )
    with open(path, "ab") as f:
        f.write(b"not json\n\xff\xfe\n")
    return path


def test_jsonl_is_the_contract(log):
    r = cli("--format", "jsonl", str(log))
    assert r.returncode == 0, r.stderr
    objects = [json.loads(line) for line in r.stdout.splitlines()]
    rows = [o for o in objects if "type" not in o]  # the per-step objects, unchanged
    episodes = [o for o in objects if "type" in o]
    assert len(rows) == 25
    assert objects[: len(rows)] == rows  # a file's steps first, then its episodes
    assert [(e["type"], e["kind"], e["first_step"], e["last_step"]) for e in episodes] == [
        ("episode", "regression", 9, 14),  # rollout-bound to sync-bound: sync costs more
        ("episode", "workload_shift", 17, 19),
        ("episode", "regression", 23, 25),
    ]
    assert episodes[2]["group"] == "update" and episodes[2]["ended"] == "ongoing"
    for row in rows:
        assert set(row) >= {"step", "verdict", "reason", "shares", "change", "regressed"}
        assert set(row["shares"]) == {
            "rollout",
            "reward",
            "logprob",
            "update",
            "sync",
            "checkpoint",
            "other",
        }
    assert rows[0]["verdict"] == "rollout" and rows[0]["reason"] == "long_tail"
    assert rows[10]["verdict"] == "sync" and rows[10]["reason"] == "weight_sync"
    assert {r["change"] for r in rows[16:19]} == {"workload_shift"}
    assert [(r["change"], r["regressed"]) for r in rows[22:25]] == [("regression", "update")] * 3
    assert (
        b"2 line(s) rejected" in r.stderr
        and b"invalid_json" in r.stderr
        and b"not_utf8" in r.stderr
    )


def test_table_shows_rows_summary_look_at_and_rejections(log):
    r = cli(str(log))
    out = r.stdout.decode()
    assert r.returncode == 0
    assert "look at next" in out and "response length cap" in out
    assert "bottleneck:" in out and "regression:  update costs more than its work explains" in out
    assert "at steps 23-25" in out and "workload:" in out and "17-19" in out
    assert "rejected lines: 2 (1 invalid_json, 1 not_utf8)" in out
    assert "\033[" not in out  # no colour when not a terminal


def test_json_document_has_files_runs_steps_and_summary(log):
    doc = json.loads(cli("--format", "json", str(log), str(log)).stdout)
    assert doc["summary"]["files"] == 2 and doc["summary"]["steps"] == 50
    run = doc["files"][0]["runs"][0]
    assert run["summary"]["dominant"]["verdict"] == "sync"
    # sync regressed at the switch to the sync-bound regime (3 s -> 42 s a step, while the
    # step got faster: v2 judges each group on its own), then update at 23-25
    assert run["summary"]["regressions"] == {
        "sync": [9, 10, 11, 12, 13, 14],
        "update": [23, 24, 25],
    }
    assert run["steps"][0]["evidence"]["generate_sequences_max"] > 0
    regressed = run["steps"][22]  # update 3x: most of its seconds are unexplained
    assert regressed["regressed"] == "update" and regressed["excess_seconds"]["update"] > 10
    assert doc["files"][0]["rejected"] == {"invalid_json": 1, "not_utf8": 1}


def test_stdin_and_several_files(log):
    r = cli("-f", "jsonl", "-", str(log), stdin=log.read_bytes())
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    rows = [row for row in rows if row.get("type") != "episode"]
    assert len(rows) == 50 and rows[0]["file"] == "-" and rows[-1]["file"] == str(log)


def test_restart_shows_as_a_new_run(tmp_path):
    path = tmp_path / "restarted.jsonl"
    write_jsonl(path, [(REGIMES["sync_bound"], 6)])
    with open(path, "ab") as f:
        f.write(path.read_bytes())
    rows = [json.loads(line) for line in cli("-f", "jsonl", str(path)).stdout.splitlines()]
    assert [r["run"] for r in rows] == [0] * 6 + [1] * 6


def test_no_readable_file_exits_1_some_readable_exits_0(tmp_path, log):
    r = cli(str(tmp_path / "missing.jsonl"))
    assert r.returncode == 1 and b"missing.jsonl: No such file" in r.stderr
    assert cli(str(tmp_path)).returncode == 1
    r = cli(str(tmp_path / "missing.jsonl"), str(log))
    assert r.returncode == 0 and b"No such file" in r.stderr


def test_inputs_without_a_verl_record_exit_1_and_gzip_is_named(tmp_path, log):
    import gzip

    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    other = tmp_path / "other.jsonl"
    other.write_text('{"level": "info", "msg": "hello"}\n{"a": 1}\n')
    packed = tmp_path / "job.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    for path in (empty, binary, other, packed):
        r = cli(str(path))
        assert r.returncode == 1, (path, r.stderr)
        assert b"no verl record found" in r.stderr
    r = cli(str(packed))
    assert b"gzip-compressed" in r.stderr and b"zcat" in r.stderr
    assert b"gzip" not in cli(str(other)).stderr
    # one good input among them: 0
    assert cli(str(empty), str(log)).returncode == 0


def test_usage_and_config_errors_exit_2(tmp_path, log):
    assert cli("--format", "xml", str(log)).returncode == 2
    for bad_size in ("-5", "0", "lots"):
        r = cli("--max-line-bytes", bad_size, str(log))
        assert r.returncode == 2 and b"--max-line-bytes" in r.stderr, bad_size
    bad = tmp_path / "bad.yaml"
    bad.write_text("verdict:\n  min_share: lots\n")
    r = cli("--thresholds", str(bad), str(log))
    assert r.returncode == 2
    assert b"verdict.min_share: expected a number, got 'lots'" in r.stderr
    assert b"Traceback" not in r.stderr


def test_config_changes_the_diagnosis(tmp_path, log):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("verdict:\n  min_share: 0.9\n")
    rows = [
        json.loads(line)
        for line in cli("-f", "jsonl", "--thresholds", str(cfg), str(log)).stdout.splitlines()
        if b'"type":"episode"' not in line
    ]
    assert {r["verdict"] for r in rows} == {"balanced"}


def test_no_argument_diagnoses_the_bundled_example():
    r = cli("--summary")
    assert r.returncode == 0 and b"bundled example" in r.stderr
    assert b"bottleneck:" in r.stdout


def test_help_explains_verdicts_and_reasons():
    out = cli("--help").stdout.decode()
    for word in (
        "rollout",
        "long_tail",
        "low_mfu",
        "weight_sync",
        "workload_shift",
        "regression",
        "exit status",
    ):
        assert word in out


def test_print_thresholds_is_a_valid_starting_point(tmp_path):
    text = cli("--print-thresholds").stdout
    cfg = tmp_path / "mine.yaml"
    cfg.write_bytes(text)
    assert cli("--thresholds", str(cfg), "--summary").returncode == 0


def test_python_dash_m_and_version():
    r = subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "--version"], capture_output=True, timeout=30
    )
    assert r.returncode == 0 and r.stdout.startswith(b"rlhf-exporter ")


def test_the_summary_says_what_the_log_cannot_show():
    """A -1 preemption count (verl's "not reported") is no evidence: the notice appears in the
    table's summary and in the JSON document, for the vendored sample trace that has it."""
    traces = Path(__file__).parent / "fixtures" / "traces"
    trace = traces / "agent_loop_preempted_unreported_v0.jsonl"
    r = cli(str(trace), "--summary")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "cannot show:" in out
    assert "rollout/preemption cannot be seen" in out and "-1" in out
    assert "rollout/tool_calls cannot be seen" not in out  # those are reported
    doc = json.loads(cli(str(trace), "--format", "json").stdout)
    (line,) = doc["files"][0]["cannot_show"]
    assert line.startswith("rollout/preemption cannot be seen")


def test_the_html_report_says_what_the_log_cannot_show(tmp_path):
    trace = (
        Path(__file__).parent / "fixtures" / "traces" / "agent_loop_preempted_unreported_v0.jsonl"
    )
    html = tmp_path / "report.html"
    r = cli(str(trace), "--summary", "--html", str(html))
    assert r.returncode == 0, r.stderr
    page = html.read_text()
    assert "cannot show" in page and "rollout/preemption cannot be seen" in page


def test_diagnose_loads_only_what_it_writes_with(log):
    """A `diagnose --format jsonl` run imports no source but verl's reader and no page: the
    package `__init__`s re-export nothing (they once loaded every source, the join, the
    settings and the pages: ~0.2 s of a diagnose's start)."""
    probe = (
        "import sys; from rlhf_exporter.cli import main; code = main(sys.argv[1:]); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('rlhf_exporter.'))))"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, "diagnose", "--format", "jsonl", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.splitlines()[-1].split())
    assert "rlhf_exporter.sources.verl_reader" in loaded  # the probe sees the run's modules
    assert not loaded & {
        "rlhf_exporter.sources.base",
        "rlhf_exporter.settings",
        "rlhf_exporter.join.board",
        "rlhf_exporter.view.pages",
        "rlhf_exporter.diagnosis.stacks",
    }
