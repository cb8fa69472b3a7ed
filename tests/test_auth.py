"""Bearer tokens (rlhf_exporter/auth.py): checked at start and never logged, failed
authentications rate-limited and counted in a series on push and windows, and the push
caps per token (or per client network), not per address."""

from __future__ import annotations

import threading

import pytest
import requests

from rlhf_exporter.auth import AuthGuard, check_token, client_key
from rlhf_exporter.job.windows_wire import WindowsApi
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.server import Endpoints, make_server
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.serve import Exporter, parse_samples

SECRET = "s3cret-XYZZY"


def test_a_token_with_a_trailing_newline_is_stripped():
    assert check_token(SECRET + "\n") == SECRET
    assert check_token("  " + SECRET + "\r\n") == SECRET


@pytest.mark.parametrize("bad", [SECRET + "\x00x", "s3cret XYZZY", "s3cretü-XYZZY", " \n"])
def test_a_token_no_header_can_carry_is_refused_without_being_shown(bad):
    with pytest.raises(ValueError) as err:
        check_token(bad)
    assert "XYZZY" not in str(err.value) and "s3cret" not in str(err.value)


def test_serve_strips_a_secret_files_newline_and_never_logs_the_token(tmp_path):
    with Exporter(tmp_path, env={"RLHF_EXPORTER_PUSH_TOKEN": SECRET + "\n"}) as e:
        plan = [{"step": 1, "data": {"timing_s/step": 1.0}}]
        ok = e.push({"project": "p", "experiment": "e", "records": plan}, token=SECRET)
        assert ok.status_code == 200, ok.text
        assert e.push({"project": "p", "experiment": "e", "records": plan}).status_code == 401
        log = e.output()
    assert "XYZZY" not in log


def test_serve_refuses_a_bad_token_at_start_without_showing_it(tmp_path):
    import subprocess

    from tests.support.procs import exporter_cmd

    out = subprocess.run(
        exporter_cmd("serve", "--no-ray", "--no-nvml", "--listen", "127.0.0.1:0"),
        env={**__import__("os").environ, "RLHF_EXPORTER_PUSH_TOKEN": "s3cret\x01XYZZY"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "push_token" in out.stderr and "XYZZY" not in out.stderr + out.stdout


def test_failed_authentications_are_rate_limited_per_client_and_in_all():
    now = [0.0]
    guard = AuthGuard(SECRET, "push", rate=5, rate_total=20, clock=lambda: now[0])
    wrong, right = "Bearer nope", f"Bearer {SECRET}"
    answers = [guard.check(wrong, "10.0.0.1") for _ in range(12)]
    assert [a.status for a in answers if a] == [401] * 10 + [429] * 2  # a burst of 2 x rate
    assert guard.check(right, "10.0.0.1").status == 429  # not even compared while throttled
    assert guard.check(right, "10.0.0.2") is None  # another client is not
    now[0] += 1.0  # 5 more tries a second
    assert [guard.check(wrong, "10.0.0.1").status for _ in range(6)] == [401] * 5 + [429]
    # many clients: the total rate bounds the guesses whatever the number of addresses
    now[0] += 100.0
    statuses = [guard.check(wrong, f"10.1.{i // 250}.{i % 250}").status for i in range(500)]
    assert statuses.count(401) == 40 and statuses.count(429) == 460
    assert guard.failures == {"unauthorized": 55, "auth_throttled": 464}


def test_clients_are_keyed_by_network_not_by_address():
    assert client_key("127.0.0.1") == client_key("127.0.0.2") == client_key("::1") == "loopback"
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key("2001:db8::1") == client_key("2001:db8::2") != client_key("2001:db9::1")


def test_push_caps_jobs_per_token_not_per_address():
    th = load_thresholds()
    plan = b'{"project": "p", "experiment": "%d", "records": [{"step": 1, "data": {}}]}'

    def push(src, i, client, token=None):
        body = plan % i
        auth = f"Bearer {token}" if token else None
        return src.handle(auth, str(len(body)), lambda n: body, client).status

    tokened = PushSource(th, token=SECRET, max_jobs_per_client=2)
    codes = [push(tokened, i, f"10.0.0.{i}", SECRET) for i in range(3)]
    assert codes == [200, 200, 429]  # three addresses, one token: one client
    anonymous = PushSource(th, max_jobs_per_client=2)
    codes = [push(anonymous, i, f"127.0.0.{i + 1}") for i in range(3)]
    assert codes == [200, 200, 429]  # every loopback address is one client
    assert push(anonymous, 9, "10.0.0.9") == 200


def test_windows_and_push_auth_failures_are_counted_in_a_series(tmp_path):
    th = load_thresholds()
    frozen = lambda: 0.0  # noqa: E731 - no refill while the test runs, however slow
    push = PushSource(th, token=SECRET, guard=AuthGuard(SECRET, "push", clock=frozen))
    api = WindowsApi(WindowBoard(), SECRET, AuthGuard(SECRET, "windows", clock=frozen))
    server = make_server(
        "127.0.0.1:0", Endpoints(snapshot_fns=[push.snapshot], push=push, windows_api=api)
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        s = requests.Session()
        codes = [
            s.get(
                url + "/api/v1/windows", headers={"Authorization": "Bearer x"}, timeout=5
            ).status_code
            for _ in range(15)
        ]
        assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}
        assert s.post(url + "/api/v1/records", data=b"{}", timeout=5).status_code == 401
        ok = s.get(
            url + "/api/v1/windows", headers={"Authorization": f"Bearer {SECRET}"}, timeout=5
        )
        assert ok.status_code == 429  # this client is throttled: the token is not compared
        values = parse_samples(s.get(url + "/metrics", timeout=5).text)
    finally:
        server.shutdown()
        server.server_close()

    def failures(endpoint, reason):
        key = frozenset({("endpoint", endpoint), ("reason", reason)})
        return values.get(("rlhf_exporter_auth_failures_total", key))

    assert failures("windows", "unauthorized") == 10
    assert failures("windows", "auth_throttled") == 6
    assert failures("push", "unauthorized") == 1
