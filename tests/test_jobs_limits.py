"""`Job`'s ingestion gate (issue 12): what never becomes a Sample, and how it is counted."""

from __future__ import annotations

import math

import pytest

from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.cleaning import clean_label
from rlhf_exporter.job.limits import Limits
from rlhf_exporter.job.state import Job
from rlhf_exporter.thresholds_file import load_thresholds


@pytest.fixture(scope="module")
def th():
    return load_thresholds(None)


def sane(job: Job) -> None:
    for s in job.samples():
        assert type(s.value) is float and math.isfinite(s.value), s
        for label in s.labels:
            label.encode("utf-8")  # raises on a lone surrogate
            assert label.isprintable(), s


@pytest.mark.parametrize(
    "text, want, reason",
    [
        ("plain", "plain", None),
        ("caf\u00e9", "caf\u00e9", None),
        ("a\udc80b", "a\ufffdb", "label_not_utf8"),
        ("new\nline", "new\ufffdline", "label_control_char"),
        ("\ud800\x7f", "\ufffd\ufffd", "label_not_utf8"),
    ],
)
def test_clean_label(text, want, reason):
    assert clean_label(text) == (want, reason)


def test_bad_steps_and_numbers_are_dropped_and_counted(th):
    job = Job("p", "e", th)
    recs = [
        Record(10**400, {}),
        Record(1, {"timing_s/step": 2.0, "perf/x": 10**400, "perf/y": math.nan}),
        Record(2, {"timing_s/step": math.inf, "perf/throughput": -math.inf}),
        Record(3, {"timing_s/step": 2.0}),
    ]
    assert job.feed(recs) == 3
    assert job.drops == {"bad_step": 1, "bad_number": 4}
    assert job.steps == 3
    sane(job)


def test_unknown_timers_mfu_stages_and_long_keys_are_capped(th):
    job = Job("p", "e", th, Limits(unknown_timers=3, key_chars=40))
    data = {f"timing_s/u{i}": 1.0 for i in range(10)}
    data.update({"timing_s/gen": 1.0, "timing_s/step": 20.0, "perf/mfu/actor": 0.4})
    data.update({"perf/mfu/bogus": 0.1, "timing_s/" + "x" * 50: 1.0, "timing_s/\udc80": 1.0})
    job.feed([Record(1, data)])
    phases = {s.labels[2] for s in job.samples() if s.name == "rlhf_phase_duration_seconds"}
    assert phases == {"gen", "u0", "u1", "u2"}  # known timers are not capped
    assert job.drops == {
        "too_many_timers": 8,  # u3..u9 and the cleaned \ufffd one
        "unknown_mfu_stage": 1,
        "key_too_long": 1,
        "label_not_utf8": 1,
    }
    stages = {s.labels[2] for s in job.samples() if s.name == "rlhf_mfu_ratio"}
    assert stages == {"actor"}
    sane(job)


def test_fully_async_idle_components_are_capped_per_job(th):
    """At most MAX_COMPONENTS `fully_async/<component>/idle_ratio` components per job (each
    one is a label value): the rest are dropped and counted, in every later record too."""
    from rlhf_exporter.job.limits import MAX_COMPONENTS

    job = Job("p", "e", th)
    extra = 4
    for step in (1, 2):
        data = {f"fully_async/c{i}/idle_ratio": 0.5 for i in range(MAX_COMPONENTS + extra)}
        job.feed([Record(step, {"timing_s/step": 10.0, "timing_s/gen": 5.0, **data})])
    got = {s.labels[2] for s in job.samples() if s.name == "rlhf_fully_async_idle_ratio"}
    assert got == {f"c{i}" for i in range(MAX_COMPONENTS)}
    assert job.drops == {"too_many_components": 2 * extra}
    sane(job)


def test_one_steps_merged_keys_are_bounded_and_used_keys_come_first(th):
    job = Job("p", "e", th, Limits(step_keys=10))
    for i in range(5):
        job.feed([Record(1, {f"junk/{i}_{k}": 1.0 for k in range(4)})])
    assert len(job._diagnoser.data) == 10  # 20 keys sent for step 1
    job.feed([Record(2, {**{f"junk/{k}": 1.0 for k in range(20)}, "timing_s/step": 3.0})])
    assert "timing_s/step" in job._diagnoser.data  # kept although it came last
    assert len(job._diagnoser.data) == 10
    assert job.drops["too_many_keys"] == 5 * 4 - 10 + 21 - 10
    assert job.last is not None and job.last.step == 2


def test_a_record_that_breaks_ingestion_is_dropped_alone(th):
    class Exploding(dict):
        def items(self):
            raise RuntimeError("boom")

    job = Job("p", "e", th)
    n = job.feed(
        [
            Record(1, {"timing_s/step": 1.0}),
            Record(2, Exploding()),
            Record(3, {"timing_s/step": 1.0}),
        ]
    )
    assert n == 2 and job.steps == 2
    assert job.drops == {"internal_error": 1}
    sane(job)


def test_labels_of_a_job_are_cleaned_and_counted(th):
    job = Job("p\udcff", "e\n", th)
    assert job.labels == ("p\ufffd", "e\ufffd")
    assert job.drops == {"label_not_utf8": 1}


def test_a_jobs_drops_are_handed_to_its_source_once(th):
    """The job keeps what it dropped until its source takes it: each drop reaches the
    source's record errors once, and the job keeps no counter of the source's."""
    job = Job("p\udcff", "e", th)
    job.feed([Record(1, {"timing_s/step": 1.0, "perf/x": math.nan})])
    assert job.take_drops() == {"label_not_utf8": 1, "bad_number": 1}
    assert not job.drops and job.take_drops() == {}
    job.feed([Record(2, {"timing_s/step": 1.0, "perf/x": math.inf})])
    assert job.take_drops() == {"bad_number": 1}


def test_a_file_sources_record_errors_hold_its_jobs_drops(th, tmp_path):
    """A job's drops reach `rlhf_exporter_record_errors_total` through its source's poll."""
    from rlhf_exporter.sources.verl_files import VerlFileSource

    log = tmp_path / "p" / "e.jsonl"
    log.parent.mkdir()
    log.write_text(
        '{"step": 1, "data": {"timing_s/step": 2.0, "perf/x": 1e999}}\n'
        '{"step": 2, "data": {"timing_s/step": 2.0, "perf/mfu/bogus": 0.1}}\n'
    )
    source = VerlFileSource(th, [tmp_path])
    first = source.poll()
    assert first.record_errors is not None
    assert first.record_errors.get("bad_number") == 1
    assert first.record_errors.get("unknown_mfu_stage") == 1
    again = source.poll()  # taken once: a second poll counts nothing twice
    assert again.record_errors == first.record_errors
