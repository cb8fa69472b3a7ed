"""The windows API between sidecars under a hostile head (or anything on the plain-HTTP path
to it): every value the head sends is checked as strictly as a pushed record, the
transport follows no redirect with the token and has a deadline, and a flapping head
cannot flood the worker's log. Fake heads are real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from rlhf_exporter import logs
from rlhf_exporter.diagnosis.thresholds import GROUPS
from rlhf_exporter.diagnosis.timeline import Interval, Timeline
from rlhf_exporter.job.windows_wire import WIRE_BODY_BYTES, WindowsApi, board_json, parse_board
from rlhf_exporter.join.board import WindowBoard, WindowJoiner
from rlhf_exporter.metrics.exposition import Exposition
from rlhf_exporter.sources.remote_windows import RemoteWindowsSource


def step_json(step: int, group: str = "rollout", timer: str = "gen", t0: float = 1000.0) -> dict:
    start = t0 + 10 * step
    return {
        "step": step,
        "start": start,
        "end": start + 5,
        "error_seconds": 0.1,
        "intervals": [[timer, group, start, start + 5]],
    }


def answer(*jobs: tuple[str, str, list[dict]]) -> dict:
    return {"jobs": [{"project": p, "experiment": e, "steps": s} for p, e, s in jobs]}


class FakeHead:
    """A real HTTP server whose every answer is `respond(handler)`'s doing."""

    def __init__(self, respond):
        head = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                head.requests.append(dict(self.headers))
                respond(self)

            def log_message(self, *a):
                pass

        self.requests: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def json_answer(body: bytes):
    def respond(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return respond


@pytest.fixture
def head():
    heads: list[FakeHead] = []

    def make(respond) -> FakeHead:
        heads.append(FakeHead(respond))
        return heads[-1]

    yield make
    for h in heads:
        h.close()


# -- the answer's values ---------------------------------------------------------------------
BAD_ANSWERS = {
    "invented group": answer(("p", "e", [step_json(1, group="my-group-1")])),
    "lone surrogate group": answer(("p", "e", [step_json(1, group="rollout\ud800")])),
    "lone surrogate job": answer(("p\udc80", "e", [step_json(1)])),
    "control char job": answer(("p\n# forged", "e", [step_json(1)])),
    "long job name": answer(("p" * 257, "e", [step_json(1)])),
    "empty job name": answer(("", "e", [step_json(1)])),
    "long timer": answer(("p", "e", [step_json(1, timer="t" * 257)])),
    "too many steps": answer(("p", "e", [step_json(i) for i in range(1025)])),
    "too many jobs": answer(*((f"p{i}", "e", [step_json(1)]) for i in range(65))),
    "repeated job": answer(("p", "e", [step_json(1)]), ("p", "e", [step_json(2)])),
    "negative step": answer(("p", "e", [step_json(-1)])),
    "huge step": answer(("p", "e", [{**step_json(1), "step": 2**60}])),
    "end before start": answer(("p", "e", [{**step_json(1), "end": 0.0}])),
    "bool step": answer(("p", "e", [{**step_json(1), "step": True}])),
}


@pytest.mark.parametrize("name", sorted(BAD_ANSWERS))
def test_a_bad_value_rejects_the_whole_answer(name):
    doc = BAD_ANSWERS[name]
    with pytest.raises(ValueError) as err:
        parse_board(orjson.loads(json.dumps(doc)))  # the bytes a head would send
    assert "\ud800" not in str(err.value) and "forged" not in str(err.value)


def test_a_head_keeping_more_steps_gives_the_newest_ones():
    doc = answer(("p", "e", [step_json(i) for i in range(100)]), ("q", "e", [step_json(1)]))
    got = parse_board(doc, max_steps=32)
    assert [tl.step for labels, tl in got if labels == ("p", "e")] == list(range(68, 100))
    assert [tl.step for labels, tl in got if labels == ("q", "e")] == [1]


def test_every_decision_table_group_is_accepted():
    doc = answer(("p", "e", [step_json(i, group=g) for i, g in enumerate(GROUPS)]))
    assert [tl.intervals[0].group for _, tl in parse_board(doc)] == list(GROUPS)


def test_a_head_inventing_groups_creates_no_series_on_the_worker(head):
    n = [0]

    def respond(h):  # every answer new groups (the attack: 71,552 series in 5 s)
        n[0] += 1
        steps = [step_json(n[0] * 40 + i, group=f"g{n[0]}_{i}") for i in range(30)]
        json_answer(json.dumps(answer(("p", "e", steps))).encode())(h)

    fake = head(respond)
    board = WindowBoard()
    src = RemoteWindowsSource(fake.url, board, timeout=2)
    for _ in range(5):
        snap = src.poll_once()
    assert not snap.up and snap.errors.get("bad_answer") == 5
    assert board.recent(("p", "e")) == ()


def test_the_joiner_keeps_counters_of_the_boards_jobs_only():
    board = WindowBoard(keep=4, max_jobs=2)
    joiner = WindowJoiner(board, horizon=20.0)  # one job at a time ran here
    for i in range(10):  # ten jobs, one after the other: the board keeps the last two
        t = 1000.0 + 100 * i
        joiner.add_samples("gpu0", "rollout", [(t - 1 + k / 2, 1.0) for k in range(30)])
        board.post(
            (f"p{i}", "e"), Timeline(1, t, t + 10, (Interval("gen", "rollout", t, t + 10),), 0)
        )
        joiner.join(t + 14)
    jobs = {s.labels[:2] for s in joiner.samples()}
    assert jobs == {("p8", "e"), ("p9", "e")}


# -- the head's answer: bounded in bytes, encoded once per change ------------------------------
def test_the_heads_answer_fits_the_workers_cap_and_keeps_the_newest_steps():
    board = WindowBoard()
    timers = [f"timer_number_{k}" for k in range(39)]
    for j in range(64):
        for step in range(32):
            t = 1764600000.123456 + 100 * step  # epoch times: ~18 characters each
            ivs = tuple(
                Interval(name, "other", t + k / 3, t + (k + 1) / 3) for k, name in enumerate(timers)
            )
            board.post((f"project-{j}", "experiment-name"), Timeline(step, t, t + 39, ivs, 0.5))
    body = board_json(board)
    assert len(body) <= WIRE_BODY_BYTES  # 64 jobs x 32 steps x 39 timers: ~9 MB before
    parsed = parse_board(orjson.loads(body))
    assert {labels for labels, _ in parsed} == {
        (f"project-{j}", "experiment-name") for j in range(64)
    }
    kept = {tl.step for _, tl in parsed}
    assert 31 in kept and 0 not in kept  # the oldest left out, the newest kept


def test_the_head_never_sends_what_its_workers_refuse():
    """A job on the head that logged odd timer keys or has a long name must not make every
    worker refuse the head's whole answer (and lose every job's windows)."""
    board = WindowBoard()
    t = 1000.0
    ivs = (
        Interval("timing\nkey\ud800", "rollout", t, t + 1),
        Interval("t" * 400, "update", t + 1, t + 2),
    )
    board.post(("p" * 300, "e\x1b[31m"), Timeline(1, t, t + 2, ivs, 0.0))
    board.post(("ok", "e"), Timeline(1, t, t + 2, ivs[:1], 0.0))
    parsed = parse_board(orjson.loads(board_json(board)))
    assert len(parsed) == 2 and parsed[1][0] == ("ok", "e")


def test_the_heads_answer_is_encoded_once_per_change():
    board = WindowBoard()
    api = WindowsApi(board, None)
    board.post(("p", "e"), Timeline(1, 0.0, 1.0, (Interval("gen", "rollout", 0.0, 1.0),), 0.0))
    first = [api.handle(None) for _ in range(20)]
    assert api.stats["answers_encoded"] == 1 and all(a == first[0] for a in first)
    board.post(("p", "e"), Timeline(2, 1.0, 2.0, (Interval("gen", "rollout", 1.0, 2.0),), 0.0))
    assert api.handle(None) != first[0] and api.stats["answers_encoded"] == 2


def test_an_unchanged_answer_is_not_parsed_again(head):
    fake = head(json_answer(json.dumps(answer(("p", "e", [step_json(1)]))).encode()))
    src = RemoteWindowsSource(fake.url, WindowBoard(), timeout=2)
    for _ in range(4):
        assert src.poll_once().up
    assert src.stats["parsed"] == 1 and src.stats["unchanged"] == 3


# -- the transport ------------------------------------------------------------------------------
def test_no_redirect_is_followed_with_the_token(head):
    elsewhere = head(json_answer(b'{"jobs": []}'))

    def redirect(h):
        h.send_response(302)
        h.send_header("Location", elsewhere.url + "/api/v1/windows")
        h.send_header("Content-Length", "0")
        h.end_headers()

    fake = head(redirect)
    src = RemoteWindowsSource(fake.url, WindowBoard(), token="s3cret", timeout=2)
    snap = src.poll_once()
    assert not snap.up and snap.errors.get("redirect") == 1
    assert fake.requests and fake.requests[0]["Authorization"] == "Bearer s3cret"
    assert elsewhere.requests == []  # the token went nowhere else


def test_a_trickling_head_times_out_with_an_error_counted(head):
    stop = threading.Event()

    def trickle(h):
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX: " + b"a" * 1000:
            if stop.wait(0.2):
                return
            try:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
            except OSError:
                return

    fake = head(trickle)
    src = RemoteWindowsSource(fake.url, WindowBoard(), timeout=1.0)
    done: list = []
    t = threading.Thread(target=lambda: done.append(src.poll_once()), daemon=True)
    started = time.monotonic()
    t.start()
    t.join(10)
    stop.set()
    assert done, "the poll hung on a trickling head"
    assert time.monotonic() - started < 5
    assert not done[0].up and done[0].errors.get("timeout") == 1


def test_a_flapping_head_cannot_flood_the_log(head):
    good = json.dumps(answer(("p", "e", [step_json(1)]))).encode()
    bad = json.dumps(answer(("x" * (3 << 20), "e", [step_json(1)]))).encode()
    n = [0]

    def respond(h):
        n[0] += 1
        json_answer(bad if n[0] % 2 else good)(h)

    fake = head(respond)
    stream = io.StringIO()
    logs.configure("text", "info", stream)
    try:
        src = RemoteWindowsSource(fake.url, WindowBoard(), timeout=5)
        for _ in range(10):
            src._last_digest = b""  # as if each good answer were new
            src.poll_once()
    finally:
        logging.getLogger().handlers.clear()
    text = stream.getvalue()
    assert src.snapshot().errors.get("bad_answer") == 5  # every one counted
    assert text.count("failed (bad_answer)") == 1  # logged once, not once per flap
    assert len(text) < 4000  # never the 3 MB label


def test_the_exposition_of_a_worker_survives_any_accepted_answer():
    """What parse_board accepts always encodes: no label it lets through breaks /metrics."""
    board = WindowBoard()
    joiner = WindowJoiner(board)
    joiner.add_samples("gpu0", "rollout", [(1000 + t / 2, 0.5) for t in range(400)])
    doc = answer(('ünï cødé €𝄞 "q" \\', "e" * 200, [step_json(1, timer="t" * 256)]))
    for labels, tl in parse_board(orjson.loads(json.dumps(doc))):
        board.post(labels, tl)
    joiner.join(2000.0)
    samples = tuple(joiner.samples())
    assert samples
    from rlhf_exporter.metrics.snapshot import Snapshot

    snap = Snapshot("nvml", True, rest=samples)
    ex = Exposition([lambda: snap])
    body = ex.render()[0]
    assert b"rlhf_window_gpu_busy_seconds_total" in body and not ex.dropped
