"""Faults: the exporter stays up, serves every healthy job, and counts each fault once."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from tests.support.serve import Exporter


def lines(n: int, seed: int = 0) -> list[bytes]:
    return [encode(r) for r in records([(REGIMES["update_low_mfu"], n)], seed=seed)]


def unprivileged() -> tuple[str, ...]:
    """As root, run the exporter without the capabilities that bypass file permissions."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    return (setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search")


def err(exp, reason):
    return exp.value("rlhf_exporter_record_errors_total", collector="verl", reason=reason)


def wait_for_polls(exp, n: int) -> None:
    """Return once the verl collector has finished at least `n` more successful polls (each
    one moves its last-success timestamp), rather than sleeping for a guess of n intervals."""
    name = "rlhf_exporter_collector_last_success_timestamp_seconds"
    seen = {exp.value(name, collector="verl")}

    def passed() -> bool:
        seen.add(exp.value(name, collector="verl"))
        return len(seen) > n

    exp.wait_for(passed, what=f"{n} more polls of the verl collector")


@pytest.mark.slow
def test_faults_are_counted_and_healthy_jobs_served(tmp_path):
    root = tmp_path / "verl"
    good = lines(5)
    # a healthy job
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "healthy.jsonl").write_bytes(b"".join(good))
    # garbage and binary lines between good records
    (root / "bad").mkdir()
    (root / "bad" / "garbage.jsonl").write_bytes(
        good[0]
        + b"not json at all\n"
        + good[1]
        + b"\xff\xfe\x00\x01binary\n"
        + b"[1, 2]\n"
        + b'{"step": "x", "data": {}}\n'
        + good[2]
    )
    # a 50 MiB line (no newline for 50 MiB), then good records
    with open(root / "bad" / "huge.jsonl", "wb") as f:
        f.write(good[0])
        f.write(b'{"step": 1, "data": {"x": "' + b"a" * (50 << 20) + b'"}}\n')
        f.write(b"".join(good[2:]))
    # a permission-denied file
    denied = root / "bad" / "denied.jsonl"
    denied.write_bytes(b"".join(good))
    denied.chmod(0)
    # a directory where a file should be
    (root / "bad" / "dir.jsonl").mkdir()
    os.mkfifo(root / "bad" / "pipe.jsonl")  # opening a FIFO for reading would block a naive poller
    # 200 jobs in one project
    (root / "many").mkdir()
    for i in range(200):
        (root / "many" / f"job{i:03d}.jsonl").write_bytes(b"".join(lines(2, seed=i)))
    # a file that will be deleted and recreated
    (root / "ok" / "flaky.jsonl").write_bytes(b"".join(good[:3]))

    with Exporter(tmp_path, prefix=unprivileged()) as exp:
        total = len(good) + 3 + 1 + (len(good) - 2) + 200 * 3 + 3
        exp.wait_for(
            lambda: exp.value("rlhf_exporter_records_total", collector="verl") == total,
            timeout=60,
            what="every readable record",
        )
        scrape = exp.samples()  # one scrape for the many checks below (23k series)

        def v(name, **labels):
            found = [
                x for (n, lab), x in scrape.items() if n == name and set(labels.items()) <= lab
            ]
            return sum(found) if found else None

        assert v("rlhf_steps_total", project="ok", experiment="healthy") == len(good)
        assert v("rlhf_steps_total", project="bad", experiment="garbage") == 3
        assert v("rlhf_steps_total", project="bad", experiment="huge") == len(good) - 1
        assert (
            len([k for k in scrape if k[0] == "rlhf_steps_total" and ("project", "many") in k[1]])
            == 200
        )
        errors = {
            dict(lab)["reason"]: x
            for (n, lab), x in scrape.items()
            if n == "rlhf_exporter_record_errors_total" and ("collector", "verl") in lab and x
        }  # known reasons are served at 0 from the start: the others
        assert errors == {
            "invalid_json": 1,
            "not_utf8": 1,
            "not_object": 1,
            "bad_step": 1,
            "too_long": 1,
            "permission_denied": 1,
            "not_a_file": 2,
        }, errors
        assert exp.value("rlhf_exporter_collector_up", collector="verl") == 1
        assert exp.get("/healthz").status_code == 200

        # delete, wait several polls, recreate
        (root / "ok" / "flaky.jsonl").unlink()
        exp.wait_for(lambda: err(exp, "file_deleted") == 1)
        wait_for_polls(exp, 5)  # still counted once
        assert err(exp, "file_deleted") == 1
        assert exp.value("rlhf_steps_total", project="ok", experiment="flaky") == 3  # still served
        (root / "ok" / "flaky.jsonl").write_bytes(b"".join(good))
        exp.wait_for(
            lambda: exp.value("rlhf_steps_total", project="ok", experiment="flaky") == 3 + len(good)
        )
        assert exp.value("rlhf_run", project="ok", experiment="flaky") == 1
        # problems were counted once and logged once, not once per poll
        assert err(exp, "permission_denied") == 1
        log = exp.output()
        assert log.count("cannot open") == 1, log[-3000:]
        assert log.count("file deleted") == 1
        assert (
            exp.value("rlhf_exporter_jobs", collector="verl") == 1 + 1 + 2 + 200
        )  # denied/dir/pipe: never read


def test_a_job_unchanged_past_job_expiry_is_not_exported(tmp_path):
    root = tmp_path / "verl"
    (root / "p").mkdir(parents=True)
    old = root / "p" / "finished.jsonl"
    old.write_bytes(b"".join(lines(3)))
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))
    live = root / "p" / "live.jsonl"
    live.write_bytes(b"".join(lines(3)))
    with Exporter(tmp_path, "--job-expiry", "3") as exp:
        exp.wait_for(lambda: exp.value("rlhf_exporter_records_total", collector="verl") == 8)
        assert exp.value("rlhf_steps_total", experiment="finished") is None
        assert exp.value("rlhf_steps_total", experiment="live") == 4
        assert exp.value("rlhf_exporter_jobs", collector="verl") == 1
        # the finished job comes back when it is written again; the live one expires
        with open(old, "ab") as f:
            f.write(encode({"step": 9, "data": {}}))
        exp.wait_for(lambda: exp.value("rlhf_steps_total", experiment="finished") == 5)
        exp.wait_for(lambda: exp.value("rlhf_steps_total", experiment="live") is None, timeout=10)
