"""Issue 12's property, against one real `serve`: hypothesis drives files and pushes with
hostile names, numbers, key floods and truncations. After every action /metrics answers,
`promtool check metrics` finds no parse error, RSS stays under RSS_BOUND, the healthy job is
still exported, and every valid record is counted exactly once (per job and in all).

Issue 26's surfaces too: random Accept headers against the same `serve` (a known content
type, bounded RSS), random windows answers from a fake head (never more than the board's
bound, only valid labels and decision-table groups, every valid new step posted), and
random directory trees with looping and dangling symlinks, unreadable folders and folders
removed mid-walk (the root never goes down, every valid job up to max_files is watched and
its records counted, the walk's memory bounded).

Few examples and no deadline keep it under a minute on a shared 2-core machine.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder

from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.diagnosis.thresholds import GROUPS
from rlhf_exporter.job.cleaning import clean_label
from rlhf_exporter.job.windows_wire import parse_board
from rlhf_exporter.join.board import WindowBoard
from rlhf_exporter.sources import verl_files
from rlhf_exporter.sources.remote_windows import RemoteWindowsSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.serve import Exporter
from tests.test_exposition import KNOWN_ACCEPTS
from tests.test_windows_hostile import FakeHead, json_answer

TOKEN = "prop-token"
RSS_BOUND = 300 << 20  # bytes; the chart's limit is 512 Mi
HUGE_STEP = 10**30  # not a step: the record is rejected (bad_step)
_ids = itertools.count()

# keys: verl's prefixes with hostile tails (lone surrogates, slashes, non-ASCII)
_tail = st.text(alphabet=st.sampled_from(["a", "b", "/", "\u00e9", "\udc80", "\ud800"]), max_size=6)
_key = st.builds(
    lambda p, t: p + t,
    st.sampled_from(["timing_s/", "perf/mfu/", "perf/", "fully_async/", "x/", ""]),
    _tail,
)
_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), True, None, "s", [1]]),
)
_data = st.dictionaries(_key, _value, max_size=6)
_records = st.lists(
    st.tuples(st.integers(0, 9).map(lambda x: x == 0), _data), min_size=1, max_size=5
)
_name = st.binary(min_size=1, max_size=6).map(
    lambda b: bytes(c for c in b if c not in b"/\0.") or b"n"
)
# push names: any text but surrogates (which JSON cannot carry); control characters get 400
_push_name = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)
_action = st.one_of(
    st.tuples(st.just("append"), _records, st.booleans()),  # (kind, records, key flood?)
    st.tuples(st.just("rewrite"), _records, st.booleans()),
    st.tuples(st.just("push"), _records, st.booleans()),
    st.tuples(st.just("garbage"), st.binary(max_size=40), st.just(False)),
)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prop")
    with Exporter(tmp, "--verl-interval", "0.1", env={"RLHF_EXPORTER_PUSH_TOKEN": TOKEN}) as e:
        (e.verl_root / "ok").mkdir()
        (e.verl_root / "ok" / "job.jsonl").write_text(
            '{"step":1,"data":{"timing_s/step":2.0,"timing_s/gen":1.0}}\n'
        )
        e.wait_for(lambda: e.value("rlhf_steps_total", project="ok") == 1)
        yield e


def _lines(records, first_step: int, marker: int, flood: bool) -> tuple[bytes, int, int]:
    """JSONL of the records; (bytes, valid records, next step)."""
    out, valid, step = [], 0, first_step
    for hostile, data in records:
        data = {**data, "marker": marker}
        if flood:
            data.update({f"timing_s/flood{i}": 1.0 for i in range(2000)})
        if hostile:
            s = HUGE_STEP
        else:
            s, step, valid = step, step + 1, valid + 1
        out.append(json.dumps({"step": s, "data": data}) + "\n")
    return "".join(out).encode(), valid, step


def _strict_json(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
        return True
    except orjson.JSONDecodeError:
        return False


def _check(exp: Exporter, totals: dict) -> None:
    r = exp.get("/metrics")
    assert r.status_code == 200
    text = r.text
    assert 'rlhf_steps_total{experiment="job",project="ok"} 1.0' in text
    if shutil.which("promtool"):
        out = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stdout + out.stderr  # parses, and no lint finding
    for line in open(f"/proc/{exp.popen.pid}/status"):
        if line.startswith("VmRSS:"):
            assert int(line.split()[1]) * 1024 < RSS_BOUND
    for collector, n in totals.items():
        exp.wait_for(
            lambda c=collector, n=n: exp.value("rlhf_exporter_records_total", collector=c) == n,
            timeout=15,
            what=f"records_total{{collector={collector}}} == {n}",
        )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=_name, pushed=_push_name, actions=st.lists(_action, min_size=1, max_size=4))
def test_hostile_files_and_pushes_never_break_the_exposition(exp, name, pushed, actions):
    n = next(_ids)
    push_project = f"push{n}" + pushed
    control = any(ord(c) < 32 or ord(c) == 127 for c in push_project)  # refused with 400
    project = b"h%d" % n + name
    label = clean_label(os.fsdecode(project))[0]
    folder = os.path.join(os.fsencode(exp.verl_root), project)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, b"f.jsonl")
    totals = {
        c: exp.value("rlhf_exporter_records_total", collector=c) or 0.0 for c in ("verl", "push")
    }
    file_steps = push_steps = 0  # valid records = steps (each opens a new step)
    next_step = push_next = 0
    for k, (kind, payload, flood) in enumerate(actions):
        if kind in ("append", "rewrite"):
            if kind == "rewrite":
                next_step = 0
            body, valid, next_step = _lines(payload, next_step, k, flood)
            with open(path, "ab" if kind == "append" else "wb") as f:
                f.write(body)
            file_steps += valid
            totals["verl"] += valid
        elif kind == "push":
            body, valid, step_after = _lines(payload, push_next, k, flood)
            recs = ",".join(body.decode().splitlines())
            head = json.dumps({"project": push_project, "experiment": "e"})[:-1]
            raw = f'{head},"records":[{recs}]}}'.encode()
            r = exp.push(raw, token=TOKEN)
            # a hostile step, or what strict JSON refuses (NaN, 1e400, a lone surrogate),
            # rejects the whole push
            if valid == len(payload) and _strict_json(raw) and not control:
                assert r.status_code == 200, r.text
                push_next, push_steps = step_after, push_steps + valid
                totals["push"] += valid
            else:
                assert r.status_code == 400
        else:
            with open(path, "ab") as f:
                f.write(payload.replace(b"\n", b"") + b"\n")
        _check(exp, totals)
        if file_steps:
            assert exp.value("rlhf_steps_total", project=label, experiment="f") == file_steps
        if push_steps:
            assert exp.value("rlhf_steps_total", project=push_project, experiment="e") == push_steps


# -- issue 26: the new surfaces ------------------------------------------------------------
_ascii = st.characters(min_codepoint=32, max_codepoint=126)  # what a header can carry
_accept_param = st.sampled_from(
    ["version=1.0.0", "version=2.0.0", "version=0.0.4", "version=x", "version=1.0.7", "q=0",
     "q=0.5", "q=x", "escaping=dots", "escaping=allow-utf-8", "escaping=<b>", "charset=utf-8"]
)  # fmt: skip
_accept_entry = st.builds(
    lambda media, params: ";".join([media, *params]),
    st.sampled_from(
        ["application/openmetrics-text", "text/plain", "*/*", "text/*", "application/json", ""]
    ),
    st.lists(st.one_of(_accept_param, st.text(_ascii, max_size=12)), max_size=4),
)
_accept = st.one_of(
    st.lists(_accept_entry, max_size=5).map(",".join),
    st.text(_ascii, max_size=80),
).map(str.strip)  # the HTTP client refuses a value with leading whitespace


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(accepts=st.lists(_accept, min_size=1, max_size=6), gz=st.booleans())
def test_random_accept_headers_get_a_known_format_in_bounded_memory(exp, accepts, gz):
    served = {choose_encoder(a)[1] for a in (*KNOWN_ACCEPTS, "application/openmetrics-text")}
    for accept in accepts:
        r = exp.get("/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip" if gz else ""})
        assert r.status_code == 200
        assert r.headers["Content-Type"] in served, (accept, r.headers["Content-Type"])
        assert 'project="ok"' in r.text  # the healthy job, in any escaping of its names
    for line in open(f"/proc/{exp.popen.pid}/status"):
        if line.startswith("VmRSS:"):
            assert int(line.split()[1]) * 1024 < RSS_BOUND


# windows answers: valid jobs and steps, and every kind of bad value a head could send
_group = st.one_of(
    st.sampled_from(["rollout", "reward", "logprob", "update", "sync", "checkpoint", "other"]),
    st.text(max_size=8),
)
_label_text = st.one_of(st.text(min_size=1, max_size=8), st.text(max_size=300))
_interval = st.tuples(st.text(min_size=1, max_size=8), _group, st.floats(0, 50), st.floats(0, 50))
_step = st.fixed_dictionaries(
    {
        "step": st.one_of(st.integers(0, 100), st.integers(), st.booleans()),
        "start": st.floats(0, 10),
        "end": st.one_of(st.floats(10, 20), st.floats(allow_nan=True)),
        "error_seconds": st.floats(0, 1),
        "intervals": st.lists(_interval.map(list), max_size=4),
    }
)
_job = st.fixed_dictionaries(
    {"project": _label_text, "experiment": _label_text, "steps": st.lists(_step, max_size=6)}
)
_answer = st.one_of(
    st.fixed_dictionaries({"jobs": st.lists(_job, max_size=5)}),
    st.just({"jobs": "x"}),
    st.just([]),
)


@pytest.fixture(scope="module")
def windows_head():
    current = [b""]
    head = FakeHead(lambda h: json_answer(current[0])(h))
    yield head, current
    head.close()


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answers=st.lists(_answer, min_size=1, max_size=4))
def test_random_windows_answers_stay_bounded_and_valid_steps_are_posted(windows_head, answers):
    head, current = windows_head
    board = WindowBoard(keep=4, max_jobs=3)
    src = RemoteWindowsSource(head.url, board, timeout=2)
    posted: dict = {}
    for doc in answers:
        current[0] = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if _ok(doc) else b"{"
        try:
            valid = parse_board(orjson.loads(current[0]), board.max_jobs, board.keep)
        except (ValueError, orjson.JSONDecodeError):
            valid = None
        snap = src.poll_once()
        assert snap.up == (valid is not None), snap.errors
        for labels, tl in valid or ():
            if tl.end > posted.get(labels, float("-inf")):
                posted[labels] = tl.end
        jobs = board.snapshot()
        assert len(jobs) <= board.max_jobs
        for (p, e), tls in jobs:
            assert len(tls) <= board.keep
            assert clean_label(p)[1] is None and clean_label(e)[1] is None
            assert all(iv.group in GROUPS for tl in tls for iv in tl.intervals)
        # every valid step newer than what was posted is on the board (the board keeps
        # the last `keep` of the last `max_jobs` jobs)
        if valid:
            newest = {labels: tl.end for labels, tl in valid}
            kept = dict(jobs)
            for labels in list(newest)[-board.max_jobs :]:
                if labels in kept and newest[labels] >= posted[labels]:
                    assert kept[labels][-1].end == posted[labels]


def _ok(doc) -> bool:
    try:
        orjson.dumps(doc)
        return True
    except (TypeError, orjson.JSONEncodeError):
        return False


# directory trees: jobs, looping and dangling symlinks, unreadable folders, deletions mid-walk
_entry = st.sampled_from(["job", "job", "loop", "dangling", "file_as_project", "locked", "vanish"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(_entry, min_size=1, max_size=8), polls=st.integers(1, 3))
def test_random_directory_trees_never_blind_the_root(tmp_path_factory, entries, polls):
    root = tmp_path_factory.mktemp("tree")
    expected: dict = {}
    vanish: list = []
    locked: list = []
    for i, kind in enumerate(entries):
        name = f"p{i}"
        if kind == "job":
            (root / name).mkdir()
            write_jsonl(root / name / "e.jsonl", [(REGIMES["balanced"], 2 + i)])
            expected[name, "e"] = len((root / name / "e.jsonl").read_bytes().splitlines())
        elif kind == "loop":
            (root / name).symlink_to(root / name)
        elif kind == "dangling":
            (root / name).symlink_to(root / "nowhere")
        elif kind == "file_as_project":
            (root / name).write_text("not a folder")
        elif kind == "locked":
            (root / name).mkdir()
            write_jsonl(root / name / "e.jsonl", [(REGIMES["balanced"], 3)])
            locked.append(str(root / name))
        else:  # a folder removed while the root is walked
            (root / name).mkdir()
            write_jsonl(root / name / "e.jsonl", [(REGIMES["balanced"], 3)])
            vanish.append(root / name)
    real = os.scandir

    def scandir(path="."):
        where = path if isinstance(path, int) else os.fspath(path)  # rmtree passes fds
        if where in locked:
            raise PermissionError(13, "Permission denied", path)
        it = real(path)
        if where == str(root):
            for folder in vanish:
                shutil.rmtree(folder, ignore_errors=True)
        return it

    verl_files.os.scandir = scandir  # type: ignore[attr-defined]
    try:
        src = VerlFileSource(load_thresholds(), [root], max_files=4)
        for _ in range(polls):
            snap = src.poll_once()
    finally:
        verl_files.os.scandir = real  # type: ignore[attr-defined]
    assert snap.up, snap.errors
    got = {p[0].labels[:2] for p in snap.parts if p}
    # every valid job is watched (up to max_files) and its records counted
    assert got <= set(expected) and len(got) == min(len(expected), 4)
    assert snap.records == sum(n for k, n in expected.items() if k in got)
    assert len(src._folders) <= 4 and len(src._folder_problems) <= 4
