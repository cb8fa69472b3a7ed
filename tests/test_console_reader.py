"""sources/console_reader.py: each element of verl's console format, and hostile input."""

from __future__ import annotations

import re

import pytest

from rlhf_exporter.sources.console_reader import (
    MAX_KEYS,
    ConsoleReader,
    Identity,
    looks_console,
    parse_value,
)

P = b"\x1b[36m(TaskRunner pid=123)\x1b[0m "


def read(data: bytes, **kw) -> tuple[list[tuple[int, dict]], ConsoleReader]:
    r = ConsoleReader(**kw)
    out = [(rec.step, dict(rec.data)) for rec in r.feed(data)]
    r.finish()
    return out, r


def one(data: bytes) -> dict:
    (rec,), _ = read(data)
    return rec[1]


@pytest.mark.parametrize(
    "text, want",
    [
        ("5", 5),
        ("-3", -3),
        ("0.1", 0.1),
        ("1e-05", 1e-05),
        ("1e+16", 1e16),
        ("np.float64(0.123)", 0.123),
        ("np.float32(0.1)", 0.1),
        ("np.int64(5)", 5),
        ("np.int32(-5)", -5),
        ("np.uint8(7)", 7),
        ("np.longdouble('0.5')", 0.5),
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        ("np.float64(nan)", None),
        ("np.float64(-inf)", None),
        ("True", True),
        ("False", False),
    ],
)
def test_values(text, want):
    got = parse_value(text)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "text",
    ["1_000", " 5", "0x10", "(1+2j)", "Decimal('0.1')", "np.complex128(1j)", "abc", "9" * 500],
)
def test_no_number_is_bad(text):
    data, r = read(b"step:1 - a:" + text.encode() + b" - b:" + text.encode() + b" - c:1\n")
    assert data == [(1, {"a": None, "b": None, "c": 1})]
    assert r.rejected == {"bad_value": 1}  # once a line


def test_a_step_line_alone_and_a_repeated_key():
    assert read(b"step:7\n")[0] == [(7, {})]
    assert one(b"step:1 - a:1 - a:2\n") == {"a": 2}


def test_keys_split_on_the_last_colon_and_a_key_holding_the_separator():
    assert one(b"step:1 - eval:acc:0.5 - a - b:2\n") == {"eval:acc": 0.5, "a - b": 2}


@pytest.mark.parametrize(
    "line",
    [
        b"step:x - a:1",
        b"step:1.5 - a:1",
        b"step: - a:1",
        b"step:1 - a",
        b"step:1 - a:",
        b"step:1 - ",
    ],
)
def test_malformed_step_lines(line):
    data, r = read(line + b"\n")
    assert data == [] and r.rejected == {"bad_step_line": 1}


@pytest.mark.parametrize(
    "step", [b"%d" % (2**53 + 1), b"%d" % (-(2**53) - 1), b"9" * 30, b"9" * 5000]
)
def test_steps_out_of_range(step):
    data, r = read(b"step:" + step + b" - a:1\n")
    assert data == [] and r.rejected == {"bad_step": 1}


def test_too_many_keys_and_many_keys():
    fields = b" - ".join(b"k%d:1" % i for i in range(MAX_KEYS + 1))
    data, r = read(b"step:1 - " + fields + b"\n")
    assert data == [] and r.rejected == {"bad_step_line": 1}
    fields = b" - ".join(b"invented/key_%d:np.float64(%d.5)" % (i, i) for i in range(MAX_KEYS))
    data, r = read(b"step:2 - " + fields + b"\n")
    assert len(data[0][1]) == MAX_KEYS and not r.rejected


def test_ray_prefix_forms():
    for prefix in (
        P,
        b"(TaskRunner pid=123) ",
        b"(TaskRunner pid=123, ip=10.0.0.2) ",
        b"\x1b[36m(TaskRunnerV1 pid=123, ip=10.0.0.2)\x1b[0m ",
        b"(main.<locals>.TaskRunner pid=1) ",
        b"(FullyAsyncTrainer pid=1, ip=10.0.0.2, node=abc) ",
        b"2026-12-05T09:00:00.123456789Z (OneStepTaskRunner pid=1) ",
    ):
        data, r = read(prefix + b"step:1 - a:np.float64(0.5)\n")
        assert data == [(1, {"a": 0.5})], prefix
        assert not r.rejected


def test_another_actors_step_is_foreign():
    data, r = read(b"(WorkerDict pid=9) step:3 - a:1\n(pid=9) step:4 - a:1\n")
    assert data == [] and r.rejected == {"foreign_step": 2}


def test_trainers_pattern():
    data, r = read(b"(MyTrainer pid=9) step:3 - a:1\n", trainers=re.compile("MyTrainer"))
    assert data == [(3, {"a": 1})]
    data, r = read(b"(TaskRunner pid=9) step:3 - a:1\n", trainers=re.compile("MyTrainer"))
    assert data == [] and r.rejected == {"foreign_step": 1}
    data, r = read(b"(TaskRunnerX pid=9) step:3 - a:1\n")  # anchored
    assert data == []


def test_ansi_osc_and_dedup_suffix():
    line = (
        b"\x1b]0;title\x07" + P + b"step:2 - a:1\x1b[32m [repeated 3x across cluster] (Ray "
        b"deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or "
        b"see https://docs.ray.io/en/master/x.html#log-deduplication for more options.)\x1b[0m\n"
    )
    assert read(line)[0] == [(2, {"a": 1})]
    assert read(P + b"step:2 - a:1 [repeated 3x across cluster]\n")[0] == [(2, {"a": 1})]


def test_carriage_returns():
    assert read(b"bar 10%\rbar 90%\rstep:4 - a:1\n")[0] == [(4, {"a": 1})]
    assert read(b"step:4 - a:1\r\n")[0] == [(4, {"a": 1})]
    assert read(b"step:4 - a:1\rbar 10%\n")[0] == []  # rewritten by a progress bar


def test_actor_marker_and_unprefixed_lines():
    out, r = read(b":job_id:01000000\n:actor_name:TaskRunner\nstep:1 - a:1\n")
    assert out == [(1, {"a": 1})] and r.actor_class == "TaskRunner"
    out, r = read(b":job_id:01000000\n:actor_name:WorkerDict\nstep:1 - a:1\n")
    assert out == [] and r.rejected == {"foreign_step": 1} and r.actor_class == "WorkerDict"
    out, r = read(b"step:1 - a:1\n")  # kubectl logs of a trainer's pod
    assert out == [(1, {"a": 1})] and r.actor_class is None
    out, r = read(P + b"step:1 - a:1\n")
    assert r.actor_class == "TaskRunner"


def test_vllm_chatter_and_step_words_are_not_rejections():
    data = (
        b"(AsyncvLLMServer pid=7) INFO Received request: prompt: 'step: 1 - x:y'\n"
        b"INFO 12-05 [logger.py] global step:3 done\n"
        b"Training Progress: 100%|##########| 3/3\n"
    )
    out, r = read(data)
    assert out == [] and not r.rejected and r.lines == 3


def test_identity_from_the_config_dump():
    dump = (
        b" 'trainer': {'balance_batch': True,\n"
        b"             'experiment_name': 'gsm8k',\n"
        b"             'project_name': 'verl_examples',\n"
    )
    _out, r = read(b"".join(P + line for line in dump.splitlines(keepends=True)) + P + b"step:1\n")
    assert r.identity == Identity("verl_examples", "gsm8k")
    # None is skipped (a nested copy may be null), the first real one wins
    _, r = read(b"'project_name': None,\n'project_name': 'a',\n'project_name': 'b',\n")
    assert r.identity == Identity("a", None)
    # another actor's dump is not the job's
    _, r = read(b"(WorkerDict pid=1) 'project_name': 'no',\n")
    assert r.identity is None
    # looked for only until the first step line
    _, r = read(b"step:1\n'project_name': 'late',\n")
    assert r.identity is None


def test_identity_is_known_before_the_first_record_is_yielded():
    r = ConsoleReader()
    seen = [r.identity for _ in r.feed(b"'project_name': 'p',\n'experiment_name': 'e',\nstep:1\n")]
    assert seen == [Identity("p", "e")]


def test_a_wrapped_name():
    data = (
        P + b"             'experiment_name': ('a very long experiment name that pprint '\n"
        b"(WorkerDict pid=9) unrelated line\n"
        + P
        + b"                                 'wrapped over lines'),\n"
        + P
        + b"             'project_name': 'p',\n"
    )
    _, r = read(data)
    assert r.identity == Identity("p", "a very long experiment name that pprint wrapped over lines")
    # a step line ends an unfinished wrap and still counts
    out, r = read(b"'experiment_name': ('abc'\nstep:1 - a:1\n")
    assert out == [(1, {"a": 1})] and r.identity is None


def test_a_line_split_across_chunks():
    data = P + b"step:1 - a:np.float64(0.5) - b:np.int64(5)\n" + P + b"step:2 - a:1\n"
    whole = read(data)[0]
    for cut in range(1, len(data)):
        r = ConsoleReader()
        got = [(x.step, dict(x.data)) for x in r.feed(data[:cut])]
        got += [(x.step, dict(x.data)) for x in r.feed(data[cut:])]
        assert got == whole, cut


def test_a_100_mb_line_is_skipped_and_counted():
    data = b"step:1 - a:1\n" + b"x" * (100 << 20) + b"\nstep:2 - a:1\n"
    out, r = read(data)
    assert [s for s, _ in out] == [1, 2] and r.rejected == {"too_long": 1}
    # and in 1 MiB chunks
    r = ConsoleReader()
    got = [
        rec.step for i in range(0, len(data), 1 << 20) for rec in r.feed(data[i : i + (1 << 20)])
    ]
    assert got == [1, 2] and r.rejected == {"too_long": 1}
    assert r.pending_bytes == 0


def test_a_step_line_too_long_inside_a_chunk():
    data = b"step:1 - a:1\nstep:2 - " + b"k:1 - " * 300 + b"z:1\nstep:3 - a:1\n"
    out, r = read(data, max_line=1000)
    assert [s for s, _ in out] == [1, 3] and r.rejected == {"too_long": 1}


def test_a_gigabyte_without_a_newline_costs_bounded_memory():
    r = ConsoleReader()
    piece = b"\x00garbage" * (1 << 17)  # 1 MiB
    most = 0
    for _ in range(1024):
        assert list(r.feed(piece)) == []
        most = max(most, r.pending_bytes)
    assert most <= r.max_line
    assert next(iter(r.feed(b"\nstep:5 - a:1\n"))).step == 5
    assert r.rejected == {"too_long": 1}


def test_binary_garbage_never_raises():
    import random

    rnd = random.Random(7)
    blob = bytes(rnd.randrange(256) for _ in range(200_000))
    blob += b"\nstep:\xff\xfe - a:1\nstep:1 - \xff:1\n"
    out, _r = read(blob)
    assert out == [(1, {"\ufffd": 1})]


def test_hostile_numbers():
    data = b"step:1 - a:1e999 - b:-1e999 - c:np.float64(1e400) - d:-5 - e:" + b"1" * 300 + b"\n"
    out, r = read(data)
    assert out == [(1, {"a": None, "b": None, "c": None, "d": -5, "e": int("1" * 300)})]
    assert not r.rejected


def test_truncation_and_reset():
    r = ConsoleReader()
    assert list(r.feed(b"step:1 - a:1\nstep:2 - a")) != []
    assert r.pending_bytes > 0
    r.reset()  # the file was truncated: the half line is not glued to what comes next
    assert r.pending_bytes == 0
    assert [x.step for x in r.feed(b"step:3 - a:1\n")] == [3]
    list(r.feed(b"step:4 - a:1"))
    r.finish()
    assert r.rejected == {"incomplete_line": 1}
    r = ConsoleReader()
    list(r.feed(b"vllm chatter without newline"))
    r.finish()
    assert not r.rejected


def test_counts_lines_and_records():
    _out, r = read(b"a\nb\nstep:1\nstep:2 - x:1\n")
    assert r.lines == 4 and r.records == 2


def test_looks_console():
    assert not looks_console(b'{"step": 1, "data": {}}\n')
    assert not looks_console(b'\xef\xbb\xbf\n{"step": 1}')
    assert not looks_console(b"")
    assert not looks_console(b"\x1f\x8b\x08\x00\x00")
    assert looks_console(P + b"step:1 - a:1\n")
    assert looks_console(b":job_id:01000000\n:actor_name:TaskRunner\n")
    assert looks_console(b"2026-12-05 08:59:43,219\tINFO job_manager.py:581 -- Runtime env\n")
    assert looks_console(b'{"not": "verl"}\nstep:1 - a:1\n')
