"""Issue 12's property, against one real `serve`: hypothesis drives files and pushes with
hostile names, numbers, key floods and truncations. After every action /metrics answers,
`promtool check metrics` finds no parse error, RSS stays under RSS_BOUND, the healthy job is
still exported, and every valid record is counted exactly once (per job and in all).

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

from rlhf_exporter.jobs import clean_label
from tests.support.serve import Exporter

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
