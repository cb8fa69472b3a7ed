"""POST /api/v1/records against a real server: accepted, 400, 401, 409, 411, 413; all-or-nothing."""

from __future__ import annotations

import http.client
import socket

import pytest

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from tests.support.serve import Exporter

TOKEN = "s3cret-token"
JOB = {"project": "pushed", "experiment": "run-1"}


def plan(n=6, seed=0):
    return list(records([(REGIMES["update_low_mfu"], n)], seed=seed))


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("push")
    (tmp / "verl" / "filed").mkdir(parents=True)
    (tmp / "verl" / "filed" / "job.jsonl").write_bytes(b"")
    with Exporter(tmp, "--push-token", TOKEN, "--push-max-bytes", "64KiB") as e:
        yield e


def errors(exp, reason):
    return exp.value("rlhf_exporter_record_errors_total", collector="push", reason=reason) or 0


def test_accepted_batch_and_single_record(exp):
    rs = plan()
    r = exp.push({**JOB, "records": rs[:-1]}, token=TOKEN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == len(rs) - 1 and body["step"] == rs[-2]["step"] and body["run"] == 0
    r = exp.push({**JOB, **rs[-1]}, token=TOKEN)  # one record: step and data at the top level
    assert r.status_code == 200 and r.json()["accepted"] == 1
    assert r.json()["verdict"] == "update"
    assert exp.value("rlhf_steps_total", **JOB) == len(rs)
    assert exp.value("rlhf_bottleneck", verdict="update", **JOB) == 1.0
    assert exp.value("rlhf_bottleneck_reason", verdict="update", reason="low_mfu", **JOB) == 1.0
    assert exp.value("rlhf_exporter_jobs", collector="push") >= 1
    assert exp.value("rlhf_exporter_records_total", collector="push") >= len(rs)
    assert any(
        j["experiment"] == "run-1" and j["source"] == "push"
        for j in exp.get("/api/v1/jobs").json()["jobs"]
    )


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        ({"experiment": "x", "records": [{"step": 1, "data": {}}]}, "'project'"),
        ({**JOB, "records": []}, "non-empty list"),
        (
            {**JOB, "records": [{"step": 1, "data": {}}, {"step": -1, "data": {}}]},
            "records[1]: 'step'",
        ),
        ({**JOB, "records": [{"step": 1, "data": []}]}, "'data' must be an object"),
        ({**JOB, "records": [{"step": True, "data": {}}]}, "'step' must be an integer"),
        ({**JOB, "records": [{"step": 1, "data": {}, "extra": 1}]}, "unknown key"),
        ({**JOB, "recrods": [{"step": 1, "data": {}}]}, "unknown key(s) recrods"),
        ({**JOB, "project": "a\nb", "step": 1, "data": {}}, "control characters"),
    ],
)
def test_bad_bodies_are_400_and_change_nothing(exp, body, needle):
    before = exp.samples()
    jobs = {
        k: v
        for k, v in before.items()
        if k[0].startswith("rlhf_") and not k[0].startswith("rlhf_exporter")
    }
    r = exp.push(body, token=TOKEN)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"], r.json()
    after = exp.samples()
    assert {k: v for k, v in after.items() if k in jobs} == jobs
    assert not [
        k
        for k in after
        if k[0].startswith("rlhf_") and not k[0].startswith("rlhf_exporter") and k not in jobs
    ]


def test_a_bad_record_late_in_a_batch_rejects_the_whole_batch(exp):
    job = {"project": "pushed", "experiment": "atomic"}
    rs = plan(4)
    r = exp.push({**job, "records": rs + [{"step": "five", "data": {}}]}, token=TOKEN)
    assert r.status_code == 400
    assert exp.value("rlhf_steps_total", **job) is None  # not even the good records


def test_wrong_or_missing_token_is_401(exp):
    before = errors(exp, "unauthorized")
    rs = plan(2)
    for token in (None, "wrong", TOKEN + "x", ""):
        r = exp.push({"project": "pushed", "experiment": "unauth", "records": rs}, token=token)
        assert r.status_code == 401, token
        assert "WWW-Authenticate" in r.headers
    r = exp.push(
        {"project": "pushed", "experiment": "unauth", "records": rs},
        headers={"Authorization": f"Basic {TOKEN}"},
    )
    assert r.status_code == 401
    assert exp.value("rlhf_steps_total", project="pushed", experiment="unauth") is None
    assert errors(exp, "unauthorized") == before + 5


def test_over_the_limit_is_413_without_reading_the_body(exp):
    big = {
        "project": "pushed",
        "experiment": "big",
        "records": [{"step": 1, "data": {"x": "a" * (70 << 10)}}],
    }
    r = exp.push(big, token=TOKEN)
    assert r.status_code == 413 and "push_max_bytes" in r.json()["error"]
    assert exp.value("rlhf_steps_total", project="pushed", experiment="big") is None
    # a client that claims a huge body and sends nothing: answered at once, from the header
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(
            b"POST /api/v1/records HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: 999999999\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_missing_content_length_is_411(exp):
    conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=5)
    conn.putrequest("POST", "/api/v1/records")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"0\r\n\r\n")
    assert conn.getresponse().status == 411
    conn.close()


def test_a_job_read_from_a_file_cannot_be_pushed(exp):
    exp.wait_for(lambda: exp.value("rlhf_exporter_jobs", collector="verl") == 1)
    r = exp.push({"project": "filed", "experiment": "job", "records": plan(1)}, token=TOKEN)
    assert r.status_code == 409


def test_push_can_be_disabled(tmp_path):
    with Exporter(tmp_path, "--no-push") as e:
        assert e.push({**JOB, "records": plan(1)}).status_code == 404
        assert e.value("rlhf_exporter_collector_up", collector="push") is None


def test_a_file_job_wins_its_name_over_a_push(exp):
    """A push cannot squat the name of a file job that appears later (issue 12): the file's
    job replaces the pushed one, later pushes get 409, and there is one series."""
    job = {"project": "pushed", "experiment": "first"}
    assert exp.push({**job, "records": plan(2)}, token=TOKEN).status_code == 200
    path = exp.verl_root / "pushed" / "first.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"".join(encode(r) for r in plan(5)))
    exp.wait_for(lambda: exp.value("rlhf_steps_total", **job) == 6)  # the file's steps only
    assert (
        exp.value("rlhf_exporter_record_errors_total", collector="push", reason="job_displaced")
        == 1
    )
    assert exp.push({**job, "records": plan(1)}, token=TOKEN).status_code == 409
    assert (
        exp.get("/metrics").text.count('rlhf_steps_total{experiment="first",project="pushed"}') == 1
    )
