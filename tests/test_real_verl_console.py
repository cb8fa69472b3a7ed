"""Issue 47, replayed without verl: what real verl 0.9.1 runs printed (verl's `console` logger,
`step:N - key:value - ...`) reads exactly as what their `file` logger wrote.

tests/fixtures/real_verl/<run>/ holds, beside the run's JSONL, what Ray kept of its output
(tests/real_verl/harness.py, regenerated with the fixtures): `driver.log`, the job driver's
log (`<session>/logs/job-driver-<submission id>.log`: the entrypoint's output with the lines
Ray forwards from the job's actors, `(TaskRunner pid=N) step:1 - ...`) and `trainer.out`,
the trainer actor's own stdout (the `worker-*.out` whose first lines carry
`:actor_name:TaskRunner`/`TaskRunnerV1`: what the console source streams by actor id).

- `diagnose --format jsonl` reads both exactly as it reads the JSONL.
- `ConsoleReader` (sources/console_reader.py) yields, record by record, the file logger's
  records: the same steps, the same keys, the same numbers, fed whole or a few bytes at a
  time; its `identity` is the project and experiment verl printed in its resolved config.

The rule, from verl's two loggers (verl/utils/logger/aggregate_logger.py's
`concat_dict_to_str` prints only `numbers.Number` values, with `pprint.pformat`: under NumPy 2
`np.float64(0.17491699755191803)`, `np.int64(5)`; verl/utils/tracking.py's `FileLogger`
writes every value with orjson, NaN and infinities as `null`) and the reader's (a printed
`nan`/`inf` or bool is left out): every JSONL value that is a number (not a bool) is in the
console record, equal (==, no tolerance: pformat's repr round-trips); a JSONL value that is
`null`, a bool, a string or a list is absent from the console record (None is accepted);
the console record has no other key.
"""

from __future__ import annotations

import json
import subprocess
from numbers import Number
from pathlib import Path
from typing import Any

import pytest

from rlhf_exporter.sources.verl_reader import RecordReader
from tests.support.procs import exporter_cmd

FIXTURES = Path(__file__).parent / "fixtures" / "real_verl"
PROJECT = "realverl"
# the real runs that logged steps (the hang's trainer was stopped after its first)
RUNS = ("legacy", "v1", "hang")
PRINTED = ("trainer.out", "driver.log")


def _jsonl(name: str) -> Path:
    return FIXTURES / name / f"{name}.jsonl"


def _diagnose(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        exporter_cmd("diagnose", "--format", "jsonl", str(path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _file_records(name: str) -> list:
    return list(RecordReader().feed(_jsonl(name).read_bytes()))


def same_record(console: Any, file: Any) -> list[str]:
    """How a console record differs from the file logger's (empty: it does not)."""
    if console.step != file.step:
        return [f"step {console.step} != {file.step}"]
    out = []
    for key, want in file.data.items():
        got = console.data.get(key)
        if isinstance(want, Number) and not isinstance(want, bool):
            if key not in console.data:
                out.append(f"step {file.step}: {key} missing (file: {want!r})")
            elif got != want:
                out.append(f"step {file.step}: {key} = {got!r}, file: {want!r}")
        elif got is not None:  # the JSONL's null, a bool, a string: left out when printed
            out.append(f"step {file.step}: {key} = {got!r}, file: {want!r} (not a number)")
    for key in console.data.keys() - file.data.keys():
        out.append(f"step {file.step}: {key} = {console.data[key]!r} only printed")
    return out


@pytest.mark.parametrize("printed", PRINTED)
@pytest.mark.parametrize("name", RUNS)
def test_diagnose_reads_the_printed_steps_as_the_jsonl(name, printed):
    want = _diagnose(_jsonl(name))
    assert any("step" in row for row in want)
    got = _diagnose(FIXTURES / name / printed)
    assert got == want


@pytest.mark.parametrize("name", RUNS)
def test_console_reader_yields_the_file_loggers_records(name):
    from rlhf_exporter.sources.console_reader import ConsoleReader

    want = _file_records(name)
    assert want
    data = (FIXTURES / name / "trainer.out").read_bytes()
    reader = ConsoleReader()
    got = list(reader.feed(data))
    assert [r.step for r in got] == [r.step for r in want]
    diffs = [d for g, w in zip(got, want) for d in same_record(g, w)]
    assert not diffs, diffs[:20]
    ident = reader.identity
    assert ident is not None
    assert (ident.project, ident.experiment) == (PROJECT, name)
    # the same records, fed a few bytes at a time (as a stream brings them)
    small = ConsoleReader()
    pieces = [r for i in range(0, len(data), 97) for r in small.feed(data[i : i + 97])]
    assert [(r.step, dict(r.data)) for r in pieces] == [(r.step, dict(r.data)) for r in got]
    assert small.identity == ident


@pytest.mark.parametrize("name", RUNS)
def test_the_printed_logs_are_small_and_hold_the_steps(name):
    """Both printed logs are kept whole (the real bytes) and stay small; each holds every
    step the file logged."""
    steps = [r.step for r in _file_records(name)]
    for printed in PRINTED:
        data = (FIXTURES / name / printed).read_bytes()
        assert len(data) < 1 << 20, (printed, len(data))
        for step in steps:
            assert f"step:{step} - ".encode() in data, (printed, step)
    head = (FIXTURES / name / "trainer.out").read_bytes()[:4096]
    assert b":actor_name:TaskRunner" in head
