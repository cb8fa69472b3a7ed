"""On-call truth, in process: each health series and each job series means what it says.

No false page (push has no last-success time; a validation seen before does not stall),
no silent failure (a mis-mounted verl root or a missing dependency is a down collector
with its reason), and the settings parse durations as the thresholds file does.
"""

from __future__ import annotations

import pytest

from rlhf_exporter import settings as settings_mod
from rlhf_exporter.commands import serve as serve_mod
from rlhf_exporter.demo.simulator import REGIMES, encode, write_jsonl
from rlhf_exporter.diagnosis import Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.families import families
from rlhf_exporter.server import Endpoints
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import ConfigError, load_thresholds


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


def series(snapshots) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in families(snapshots):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_push_publishes_no_last_success_time(th):
    """Push is not polled: a start time that never moves would page as a stale collector."""
    now = [1000.0]
    push = PushSource(th, clock=lambda: now[0])
    push.start()
    now[0] += 3600
    got = series([push.snapshot()])
    assert got["rlhf_exporter_collector_up", (("collector", "push"),)] == 1.0
    assert not [k for k in got if k[0] == "rlhf_exporter_collector_last_success_timestamp_seconds"]


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_mis_mounted_verl_root_is_a_down_collector_with_a_reason(tmp_path, th, kind):
    root = tmp_path / "logs"
    if kind == "file":
        root.write_text("not a directory\n")
    other = tmp_path / "p" / "e.jsonl"
    other.parent.mkdir()
    write_jsonl(other, [(REGIMES["balanced"], 3)])
    src = VerlFileSource(th, [root], [(other, None, None)])
    for _ in range(5):
        snap = src.poll_once()
    reason = {"missing": "root_missing", "file": "root_not_a_directory"}[kind]
    assert not snap.up
    assert dict(snap.errors) == {reason: 1}  # counted once, not once per poll
    assert snap.last_success is None
    # the other input's job is still served
    names = {s.name for s in snap.samples if s.labels[:2] == ("p", "e")}
    assert "rlhf_steps_total" in names
    # readiness does not depend on it
    assert Endpoints([src.snapshot], ready_fns=[src.snapshot]).ready()
    # the volume appears: up again, with a last-success time
    if kind == "file":
        root.unlink()
    (root / "q").mkdir(parents=True)
    write_jsonl(root / "q" / "x.jsonl", [(REGIMES["balanced"], 2)])
    snap = src.poll_once()
    assert snap.up and snap.last_success is not None and dict(snap.errors) == {reason: 1}
    assert {s.labels[:2] for s in snap.samples if s.name == "rlhf_steps_total"} == {
        ("p", "e"),
        ("q", "x"),
    }


def test_job_expiry_takes_the_prometheus_duration_syntax():
    def resolve(**env):
        environ = {settings_mod.ENV_PREFIX + k.upper(): v for k, v in env.items()}
        return settings_mod.resolve(None, environ)

    assert resolve(job_expiry="10m").job_expiry == 600
    assert resolve(job_expiry="1h30m").job_expiry == 5400
    assert resolve(job_expiry="86400").job_expiry == 86400
    assert resolve(verl_interval="1500ms").verl_interval == 1.5
    with pytest.raises(ConfigError, match="RLHF_EXPORTER_JOB_EXPIRY"):
        resolve(job_expiry="ten minutes")
    with pytest.raises(ConfigError):
        resolve(job_expiry="0s")
    assert resolve(total_steps="500").total_steps == 500
    assert resolve(max_line_bytes="2MiB").max_line_bytes == 2 << 20
    for bad in ("-5", "-5K", "0MiB"):
        with pytest.raises(ConfigError, match="at least 1 byte"):
            resolve(max_line_bytes=bad)


def test_a_missing_optional_dependency_is_a_down_collector(monkeypatch):
    def no_ray():
        raise ImportError("No module named 'requests'")

    monkeypatch.setattr(serve_mod, "_ray", no_ray)
    s = settings_mod.resolve(
        None, {"RLHF_EXPORTER_LISTEN": "127.0.0.1:0", "RLHF_EXPORTER_NVML": "false"}
    )
    sidecar = serve_mod.Sidecar(s)
    try:
        assert [src.name for src in sidecar.sources] == ["push", "ray"]
        got = series([fn() for fn in sidecar.endpoints.snapshot_fns])
        assert got["rlhf_exporter_collector_up", (("collector", "ray"),)] == 0.0
        key = (("collector", "ray"), ("reason", "dependency_missing"))
        assert got["rlhf_exporter_collector_errors_total", key] == 1.0
        assert "ray (unavailable: dependency_missing)" in sidecar.endpoints.sources_text
    finally:
        sidecar.server.server_close()


def _record(n: int, **timers: float) -> Record:
    data = {f"timing_s/{k}": v for k, v in timers.items()}
    return Record(n, data)


def test_validation_and_checkpoint_between_steps_widen_the_stall_limit(th):
    now = [0.0]
    job = Job("p", "e", th, clock=lambda: now[0])
    samples = {s.name: s.value for s in job.samples()}
    assert "rlhf_between_steps_max_seconds" not in samples  # no step yet
    assert samples["rlhf_job_finished"] == 0.0
    job.feed([_record(1, step=60.0)])
    job.feed([_record(2, step=60.0, testing=900.0)])
    job.feed([_record(3, step=60.0, save_checkpoint=300.0, testing=200.0)])
    job.feed([_record(4, step=60.0)])
    samples = {s.name: s.value for s in job.samples()}
    assert samples["rlhf_between_steps_max_seconds"] == 900.0
    # a restart is a new run: what the old run did is not this run's evidence
    job.feed([_record(1, step=60.0)])
    assert {s.name: s.value for s in job.samples()}["rlhf_between_steps_max_seconds"] == 0.0


def test_a_finished_job_says_so(th):
    job = Job("p", "e", th, total_steps=3)
    for step in (1, 2):
        job.feed([_record(step, step=10.0)])
    assert {s.name: s.value for s in job.samples()}["rlhf_job_finished"] == 0.0
    job.feed([_record(3, step=10.0)])
    assert {s.name: s.value for s in job.samples()}["rlhf_job_finished"] == 1.0
    # without a total: the job may log the marker itself
    marked = Job("p", "m", th)
    marked.feed([_record(1, step=10.0), Record(2, {"rlhf_job_finished": 1})])
    assert {s.name: s.value for s in marked.samples()}["rlhf_job_finished"] == 1.0
    assert marked.summary()["finished"] is True


def test_push_jobs_get_the_total_too(th):
    push = PushSource(th, total_steps=2)
    for step in (1, 2):
        body = encode({"project": "p", "experiment": "e", "step": step, "data": {}})
        answer = push.handle(None, str(len(body)), lambda n, b=body: b[:n])
        assert answer.status == 200, answer
    finished = [s for s in push.snapshot().samples if s.name == "rlhf_job_finished"]
    assert [s.value for s in finished] == [1.0]
