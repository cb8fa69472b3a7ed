"""End to end: verl logs written line by line while a real `serve` runs; scraped series checked."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter

import pytest

from rlhf_exporter.demo.simulator import DEMO_PLAN, encode, records
from rlhf_exporter.diagnosis import VERDICTS, BatchDiagnoser
from rlhf_exporter.sources.verl_reader import RecordReader
from tests.support.serve import Exporter


def write_slowly(path, lines: list[bytes]) -> None:
    """Like verl: append one record at a time, some of them in two halves."""
    with open(path, "ab", buffering=0) as f:
        for i, line in enumerate(lines):
            if i % 5 == 0:
                f.write(line[: len(line) // 2])
                time.sleep(0.01)
                f.write(line[len(line) // 2 :])
            else:
                f.write(line)


def test_sample_traces_written_line_by_line(tmp_path, sample_traces, thresholds):
    with Exporter(tmp_path) as exp:
        expected_records = 0
        offline = {}
        for trace in sorted(sample_traces.glob("*.jsonl")):
            if trace.name.endswith(".expected.jsonl"):
                continue
            data = trace.read_bytes()
            reader = RecordReader()
            rs = list(reader.feed(data))
            expected_records += len(rs)
            offline[trace.stem] = list(BatchDiagnoser(thresholds).diagnose(rs))
            project = tmp_path / "verl" / "traces"
            project.mkdir(exist_ok=True)
            write_slowly(project / trace.name, data.splitlines(keepends=True))
        exp.wait_for(
            lambda: exp.value("rlhf_exporter_records_total", collector="verl") == expected_records,
            what="every trace record ingested",
        )
        text = exp.metrics_text()
        for name, diagnoses in offline.items():
            labels = {"project": "traces", "experiment": name}
            verdicts = Counter(d.verdict for d in diagnoses)
            for verdict in VERDICTS:
                assert (
                    exp.value("rlhf_bottleneck_steps_total", verdict=verdict, **labels)
                    == verdicts[verdict]
                ), (name, verdict)
            last = diagnoses[-1]
            assert exp.value("rlhf_bottleneck", verdict=last.verdict, **labels) == 1.0, name
            assert exp.value("rlhf_bottleneck", **labels) == 1.0  # exactly one verdict set
            assert exp.value("rlhf_step", **labels) == last.step
            expected = [
                json.loads(line)
                for line in (sample_traces / f"{name}.expected.jsonl").read_text().splitlines()
            ]
            final = expected[-1]
            if final["scored_verdict"]:
                assert exp.value("rlhf_bottleneck", verdict=final["verdict"], **labels) == 1.0, name
        assert exp.value("rlhf_exporter_record_errors_total", collector="verl") == 0  # known: at 0
        assert 'rlhf_exporter_jobs{collector="verl"}' in text


@pytest.fixture(scope="module")
def demo_exporter(tmp_path_factory, thresholds):
    """One exporter over a finished demo-plan log plus a half-written line."""
    tmp = tmp_path_factory.mktemp("demo")
    with Exporter(tmp) as exp:
        path = exp.verl_root / "proj" / "exp-a.jsonl"
        path.parent.mkdir()
        n = 0
        with open(path, "wb") as f:
            for record in records(DEMO_PLAN, seed=1):
                f.write(encode(record))
                n += 1
            f.write(b'{"step": 999, "data": {"timing_s/st')  # half-written: not a record yet
        exp.n = n
        exp.offline = list(
            BatchDiagnoser(thresholds).diagnose(
                RecordReader().feed(b"".join(encode(r) for r in records(DEMO_PLAN, seed=1)))
            )
        )
        exp.path = path
        exp.wait_for(lambda: exp.value("rlhf_exporter_records_total", collector="verl") == n)
        yield exp


def test_labels_and_counters(demo_exporter):
    exp = demo_exporter
    lab = {"project": "proj", "experiment": "exp-a"}
    assert exp.value("rlhf_steps_total", **lab) == exp.n  # one record per step, step 0 included
    assert exp.value("rlhf_step", **lab) == exp.n - 1
    last = exp.offline[-1]
    assert exp.value("rlhf_change", kind=last.change.change, **lab) == 1.0
    assert exp.value("rlhf_change", **lab) == 1.0
    regressions = Counter(d.change.regressed for d in exp.offline if d.change.regressed)
    assert regressions["update"] > 0  # the plan ends with a regression of update
    assert exp.value("rlhf_regression_steps_total", group="update", **lab) == regressions["update"]
    assert exp.value("rlhf_exporter_jobs", collector="verl") == 1
    assert exp.value("rlhf_exporter_collector_up", collector="verl") == 1
    # the half-written line is neither a record nor an error
    assert exp.value("rlhf_exporter_record_errors_total", collector="verl") == 0  # known: at 0


def test_promtool_check_metrics_is_clean(demo_exporter):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    body = demo_exporter.metrics_text()
    out = subprocess.run(
        [promtool, "check", "metrics"], input=body.encode(), capture_output=True, timeout=60
    )
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout.decode() + out.stderr.decode()
    )


def test_openmetrics_and_gzip(demo_exporter):
    r = demo_exporter.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    r = demo_exporter.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert r.headers.get("Content-Encoding") == "gzip"
    assert "rlhf_bottleneck{" in r.text  # requests decompressed it


def test_health_landing_page_and_jobs(demo_exporter):
    exp = demo_exporter
    assert exp.get("/healthz").status_code == 200
    assert exp.get("/readyz").text == "ready\n"
    page = exp.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
    last = exp.offline[-1]
    assert "exp-a" in page.text and last.verdict in page.text and 'href="/metrics"' in page.text
    jobs = exp.get("/api/v1/jobs").json()["jobs"]
    assert [(j["project"], j["experiment"]) for j in jobs] == [("proj", "exp-a")]
    assert (jobs[0]["verdict"], jobs[0]["change"]) == (last.verdict, last.change.change)
    assert exp.get("/nope").status_code == 404
    assert exp.get("/api/v1/records").status_code == 405


def test_a_new_record_reaches_the_next_scrape(demo_exporter):
    """Whatever /metrics caches, a new record is in the body once its poll has run.
    (That the cache is used at all is tested beside the collector; equal bodies from a
    server whose data did not change prove nothing about a cache.)"""
    exp = demo_exporter
    before = exp.value("rlhf_steps_total", project="proj", experiment="exp-a")
    with open(exp.path, "ab") as f:
        f.write(b'ep": null}}\n')  # completes step 999 (S missing: counted, not classified)
    exp.wait_for(
        lambda: exp.value("rlhf_steps_total", project="proj", experiment="exp-a") == before + 1
    )
    assert exp.value("rlhf_step", project="proj", experiment="exp-a") == 999
