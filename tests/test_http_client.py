"""The one bounded HTTP client (rlhf_exporter/sources/http.py) against real sockets on
127.0.0.1 that misbehave: one deadline over everything, a cap on the decoded body, identity
encoding only, no redirects, one vocabulary of reasons."""

from __future__ import annotations

import gzip

import pytest

from rlhf_exporter.sources import http
from tests.support.raw_http import Conn, RawServer, answer

PAGE = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"


def failure(url: str, **kw) -> http.HttpFailure:
    c = http.Client(timeout=kw.pop("timeout", 0.5), max_bytes=kw.pop("max_bytes", 1 << 20))
    with pytest.raises(http.HttpFailure) as info:
        c.get(url)
    return info.value


def test_a_plain_answer_and_a_chunked_one_are_read() -> None:
    def script(conn: Conn) -> None:
        conn.request()
        conn.send(answer(PAGE))

    def chunked(conn: Conn) -> None:
        conn.request()
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        conn.send(head + b"5;ext=1\r\n# TYP\r\n" + b"%x\r\n" % (len(PAGE) - 5) + PAGE[5:])
        conn.send(b"\r\n0\r\nX-Trailer: 1\r\n\r\n")

    with RawServer(script) as plain, RawServer(chunked) as chunks:
        c = http.Client(timeout=2.0, max_bytes=1 << 20)
        assert c.get(plain.url + "/metrics") == PAGE
        assert c.get(chunks.url + "/metrics") == PAGE
        sent = plain.requests[0].lower()
        assert b"accept-encoding: identity" in sent and b"get /metrics http/1.1" in sent


@pytest.mark.parametrize("where", ["status line", "headers", "chunk-size line", "body"])
def test_a_trickling_server_is_cut_at_the_deadline(where: str) -> None:
    """Every byte comes well within the socket's timeout, so only a deadline over the whole
    read ends it: the server trickles for 4 s; a client without one reads it all."""
    body = PAGE * 2
    length = f"Content-Length: {len(body)}\r\n".encode()
    whole, slow = {
        "status line": (b"HTT", b"P/1.1 200 OK\r\n" + length + b"\r\n" + body),
        "headers": (
            b"HTTP/1.1 200 OK\r\n",
            b"X-Pad: " + b"p" * 60 + b"\r\n" + length + b"\r\n" + body,
        ),
        "chunk-size line": (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"%x" % len(body) + b" " * 60 + b"\r\n" + body + b"\r\n0\r\n\r\n",
        ),
        "body": (b"HTTP/1.1 200 OK\r\n" + length + b"\r\n", body),
    }[where]

    def script(conn: Conn) -> None:
        conn.request()
        conn.send(whole)  # then 40 bytes 0.1 s apart (4 s), then the rest at once
        if conn.trickle(slow[:40], every=0.1):
            conn.send(slow[40:])

    with RawServer(script) as server:
        exc = failure(server.url + "/metrics", timeout=0.5)
        server.wait_done()
    assert exc.reason == http.TIMEOUT, exc
    assert server.cut == 1  # the client hung up while the server still trickled


def test_an_error_answer_is_not_read_on() -> None:
    def script(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n")
        conn.trickle(b"e" * 200, every=0.02)

    with RawServer(script) as server:
        exc = failure(server.url)
        server.wait_done()
    assert exc.reason == http.HTTP_ERROR and exc.status == 500
    assert server.cut == 1  # the error body was not read on while it trickled


def _framings(status: bytes, body: bytes):
    """The same answer sized, chunked (in 1000-byte chunks) and delimited by the close."""

    def sized(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body)

    def chunked(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
        for i in range(0, len(body), 1000):
            part = body[i : i + 1000]
            conn.send(b"%x\r\n" % len(part) + part + b"\r\n")
        conn.send(b"0\r\n\r\n")

    def until_close(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.0 %s\r\n\r\n" % status + body)

    return [sized, chunked, until_close]


@pytest.mark.parametrize("framing", range(3), ids=["sized", "chunked", "until_close"])
def test_error_bytes_returns_a_refusals_words_cut_at_its_bound(framing: int) -> None:
    """Ray's dashboard says why it serves no stack in the body of a 403/500 (the stacks
    source tells them apart by it): with `error_bytes` the answer is returned, its body cut
    at the bound; without it the same answer is an http_error, its body unread."""
    words = b"Profiling is disabled: set RAY_DASHBOARD_ENABLE_PROFILING=1. "
    long = words * 200  # 12 KB
    with (
        RawServer(_framings(b"403 Forbidden", words)[framing]) as short_one,
        RawServer(_framings(b"500 Internal Server Error", long)[framing]) as long_one,
    ):
        c = http.Client(timeout=2.0, max_bytes=1 << 20)
        got = c.request(short_one.url + "/worker/traceback", error_bytes=4096)
        assert (got.status, got.body, got.truncated) == (403, words, False)
        got = c.request(long_one.url + "/worker/traceback", error_bytes=1000)
        assert (got.status, got.body, got.truncated) == (500, long[:1000], True)
        with pytest.raises(http.HttpFailure) as info:
            c.request(short_one.url + "/worker/traceback")
        assert info.value.reason == http.HTTP_ERROR and info.value.status == 403
        assert words not in str(info.value).encode()


def test_error_bytes_reads_no_more_than_its_bound_and_follows_no_redirect() -> None:
    def trickled(conn: Conn) -> None:  # an error body that never ends
        conn.request()
        conn.send(b"HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n" + b"e" * 100)
        conn.trickle(b"e" * 200, every=0.02)

    def moved(conn: Conn) -> None:
        conn.request()
        conn.send(answer(b"elsewhere", "302 Found", {"Location": "http://192.0.2.1/"}))

    with RawServer(trickled) as server, RawServer(moved) as other:
        c = http.Client(timeout=2.0, max_bytes=1 << 20)
        got = c.request(server.url, error_bytes=100)
        server.wait_done()
        assert (got.status, got.body, got.truncated) == (500, b"e" * 100, True)
        assert server.cut == 1  # hung up at the bound, not read on to the deadline
        with pytest.raises(http.HttpFailure) as info:
            c.request(other.url, error_bytes=100)
        assert info.value.reason == http.REDIRECT


@pytest.mark.parametrize("framing", range(3), ids=["sized", "chunked", "until_close"])
def test_truncate_keeps_the_head_of_a_long_answer(framing: int) -> None:
    body = bytes(range(256)) * 40  # 10 KB
    with (
        RawServer(_framings(b"200 OK", body)[framing]) as server,
        RawServer(_framings(b"200 OK", body[:500])[framing]) as small,
    ):
        c = http.Client(timeout=2.0, max_bytes=4000)
        got = c.request(server.url, truncate=True)
        assert (got.status, got.body, got.truncated) == (200, body[:4000], True)
        got = c.request(small.url, truncate=True)
        assert (got.body, got.truncated) == (body[:500], False)
        with pytest.raises(http.HttpFailure) as info:
            c.request(server.url)
        assert info.value.reason == http.TOO_LARGE


def test_an_encoded_answer_is_refused_and_never_decoded() -> None:
    bomb = gzip.compress(b"{}," * (1 << 20))  # 3 MiB of JSON in a few KB

    def script(conn: Conn) -> None:
        conn.request()
        conn.send(answer(bomb, headers={"Content-Encoding": "gzip"}))

    def transfer(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")

    with RawServer(script) as server, RawServer(transfer) as other:
        assert failure(server.url, max_bytes=len(bomb) + 10).reason == http.ENCODED
        assert failure(other.url).reason == http.ENCODED


def test_no_redirect_is_followed() -> None:
    def elsewhere(conn: Conn) -> None:
        conn.request()
        conn.send(answer(b'{"ray_version": "from another port"}'))

    with RawServer(elsewhere) as other:

        def script(conn: Conn) -> None:
            conn.request()
            conn.send(answer(b"", "302 Found", {"Location": other.url + "/"}))

        with RawServer(script) as server:
            exc = failure(server.url + "/api/version")
            assert exc.reason == http.REDIRECT and exc.status == 302
            assert other.connections == 0


def test_the_body_cap_holds_for_every_framing() -> None:
    big = b"x" * 5000

    def sized(conn: Conn) -> None:
        conn.request()
        conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {10**12}\r\n\r\n".encode())

    def chunked(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(10):
            conn.send(b"%x\r\n" % len(big) + big + b"\r\n")
        conn.send(b"0\r\n\r\n")

    def until_close(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.0 200 OK\r\n\r\n" + big * 10)

    def headers(conn: Conn) -> None:
        conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 20000)

    for script, reason in [
        (sized, http.TOO_LARGE),
        (chunked, http.TOO_LARGE),
        (until_close, http.TOO_LARGE),
        (headers, http.TOO_LARGE),
    ]:
        with RawServer(script) as server:
            assert failure(server.url, max_bytes=20000).reason == reason, script.__name__


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n",
    ],
)
def test_what_is_not_http_is_bad_http(raw: bytes) -> None:
    def script(conn: Conn) -> None:
        conn.request()
        conn.send(raw)

    with RawServer(script) as server:
        assert failure(server.url).reason == http.BAD_HTTP


def test_nothing_listening_is_unreachable_and_keep_alive_reuses_one_connection() -> None:
    with RawServer(lambda conn: None) as gone:
        url = gone.url
    assert failure(url).reason == http.UNREACHABLE

    def script(conn: Conn) -> None:
        while conn.request():
            conn.send(answer(PAGE))

    with RawServer(script) as server:
        c = http.Client(timeout=2.0, max_bytes=1 << 20, keep_alive=True)
        assert [c.get(server.url + "/metrics") for _ in range(3)] == [PAGE] * 3
        assert server.connections == 1 and len(server.requests) == 3
        c.close()


def test_a_kept_connection_the_server_closed_is_replaced_once() -> None:
    def script(conn: Conn) -> None:  # one answer per connection, then it closes
        conn.request()
        conn.send(answer(PAGE))

    with RawServer(script) as server:
        c = http.Client(timeout=2.0, max_bytes=1 << 20, keep_alive=True)
        assert [c.get(server.url) for _ in range(3)] == [PAGE] * 3
        assert server.connections == 3
        c.close()


def test_every_reason_is_in_the_one_vocabulary() -> None:
    assert set(http.REASONS) == {
        "timeout",
        "unreachable",
        "redirect",
        "http_error",
        "encoded",
        "too_large",
        "bad_http",
    }
