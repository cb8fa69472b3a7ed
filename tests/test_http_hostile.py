"""HTTP-level hostile input against an in-process server on 127.0.0.1 (rlhf_exporter/server.py):
the landing page's cache vs random Host headers, content negotiation's echo, gzip;q=0, and
requests smuggled after a GET body or a TE+CL POST."""

from __future__ import annotations

import random
import socket
import threading

import pytest
import requests

from rlhf_exporter.server import Endpoints, PageCache, make_server
from rlhf_exporter.server import pages as server_mod
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.thresholds_file import load_thresholds


@pytest.fixture
def serve():
    made = []

    def start(endpoints: Endpoints) -> str:
        srv = make_server("127.0.0.1:0", endpoints, read_timeout=2.0)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def test_random_host_headers_neither_render_nor_grow_the_page_cache(serve, monkeypatch):
    renders = [0]
    real = server_mod.index_page

    def counting(*a, **kw):
        renders[0] += 1
        return real(*a, **kw) + "x" * 100_000  # a big fleet's page

    monkeypatch.setattr(server_mod, "index_page", counting)
    pages = PageCache(ttl=60.0, max_bytes=1 << 20)
    url = serve(Endpoints(snapshot_fns=[], pages=pages))
    s = requests.Session()
    rnd = random.Random(1)
    for i in range(300):
        host = f"h{rnd.randrange(10**9)}.example:{1000 + i}"
        page = s.get(url + "/", headers={"Host": host}, timeout=5).text
        assert f"{host}/metrics" in page  # the page still names the host it was reached by
    assert renders[0] == 1  # one render: the Host never keys the cache
    assert pages.size <= 1 << 20
    for i in range(40):  # many job paths: bounded in bytes, the oldest evicted
        s.get(url + f"/jobs/p/{'e' * 50}{i}", timeout=5)
    assert pages.size <= 1 << 20


def test_a_host_header_that_is_not_a_host_never_reaches_the_page(serve):
    url = serve(Endpoints(snapshot_fns=[]))
    for bad in ('evil"><script>x</script>', "a b", "x" * 300, "host\u202e:1"):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: " + bad.encode() + b"\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := c.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert bad.encode() not in data and b"<script>x" not in data


def test_version_x_is_served_and_nothing_of_accept_is_echoed(serve):
    url = serve(Endpoints(snapshot_fns=[]))
    for accept in ("text/plain;version=x", "application/openmetrics-text;version=1.0.99"):
        r = requests.get(url + "/metrics", headers={"Accept": accept}, timeout=5)
        assert r.status_code == 200
        assert "1.0.99" not in r.headers["Content-Type"] and "=x" not in r.headers["Content-Type"]


@pytest.mark.parametrize(
    "header,gzipped",
    [
        ("gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("*;q=0", False),
        ("notgzip", False),
        ("x-gzip", True),
    ],
)
def test_accept_encoding_weights_are_honoured(serve, header, gzipped):
    url = serve(Endpoints(snapshot_fns=[]))
    r = requests.get(url + "/metrics", headers={"Accept-Encoding": header}, stream=True, timeout=5)
    assert (r.headers.get("Content-Encoding") == "gzip") is gzipped


def _exchange(url: str, raw: bytes) -> bytes:
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(raw)
        c.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := c.recv(65536):
                data += chunk
        except OSError:
            pass
    return data


def test_a_get_body_is_not_parsed_as_the_next_request(serve):
    url = serve(Endpoints(snapshot_fns=[]))
    smuggled = b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: "
        + str(len(smuggled)).encode()
        + b"\r\n\r\n"
        + smuggled
    )
    data = _exchange(url, raw)
    assert data.count(b"HTTP/1.1 ") == 1 and b'"jobs"' not in data


def test_te_and_cl_on_a_post_are_refused_not_smuggled(serve):
    push = PushSource(load_thresholds())
    url = serve(Endpoints(snapshot_fns=[push.snapshot], push=push))
    smuggled = b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = (
        b"POST /api/v1/records HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 5\r\n\r\n0\r\n\r\n" + smuggled
    )
    data = _exchange(url, raw)
    assert data.startswith(b"HTTP/1.1 411") and data.count(b"HTTP/1.1 ") == 1
    assert b'"jobs"' not in data and b"Connection: close" in data
