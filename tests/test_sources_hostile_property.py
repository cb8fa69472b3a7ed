"""Property tests of the sources' hostile surfaces: random engine pages, target lists and Ray
answers never crash a source, stay within their bounds, and keep the good records among them."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_exporter.sources.engine_targets import Targets
from rlhf_exporter.sources.engines import FAMILIES, MAX_COUNTER, MAX_GAUGE, parse
from rlhf_exporter.sources.labels import MAX_OUTSIDE_LABEL
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.ray_jobs import JobBook, tie

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

# -- engine pages ------------------------------------------------------------------------------
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "-0", "0x10", "1_0", "", "abc", "1e-400"]),
    st.integers(-(10**20), 10**20).map(str),
)
label_value = st.text(st.characters(codec="utf-8", exclude_characters='"\\\n'), max_size=20)
wanted_line = st.builds(
    lambda name, labels, value, ts: (
        name
        + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
        + f" {value}{ts}"
    ),
    st.sampled_from(sorted(FAMILIES)),
    st.lists(st.tuples(st.sampled_from(["engine", "model_name", "x"]), label_value), max_size=3),
    numbers,
    st.sampled_from(["", " 1700000000000", " x y"]),
)
junk_line = st.one_of(
    st.text(max_size=80).filter(lambda s: not s.startswith(tuple(FAMILIES))),
    st.sampled_from(
        [
            "# HELP vllm:num_requests_running x",
            "# TYPE vllm:x gauge",
            "vllm:num_requests_running_by_reason 5",
            'vllm:other{a="b"} 1',
        ]
    ),
)


@SETTINGS
@given(st.lists(st.one_of(wanted_line, junk_line), max_size=60), st.integers(1, 20))
def test_any_engine_page_parses_within_bounds(lines: list[str], max_series: int) -> None:
    body = "\n".join(lines).encode("utf-8", "surrogatepass")
    read = parse(body, 1.0, max_series=max_series)
    assert sum(read.dropped.values()) <= len(lines)
    if read.sample is None:
        assert read.error == "engine_parse_error"
        return
    for field in ("running", "waiting", "throughput", "preempted", "tokens", "kv"):
        v = getattr(read.sample, field)
        if v is None:
            continue
        assert math.isfinite(v) and v >= 0
        top = MAX_COUNTER if field in ("preempted", "tokens") else MAX_GAUGE
        assert v <= (1.0 if field == "kv" else top * 2 * max_series)


@SETTINGS
@given(st.lists(junk_line, max_size=40), st.integers(0, 10**6))
def test_a_good_engine_line_among_junk_is_kept(junk: list[str], running: int) -> None:
    lines = [*junk, f'vllm:num_requests_running{{engine="0"}} {running}', *junk]
    read = parse("\n".join(lines).encode(), 1.0)
    assert read.error is None and read.sample is not None and read.sample.running == running


# -- target lists ------------------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=30))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(
            st.sampled_from(
                [
                    "targets",
                    "labels",
                    "replica",
                    "engine",
                    "scrape_configs",
                    "job_name",
                    "static_configs",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=40,
)


def _write(path: Path, raw: bytes) -> None:
    path.write_bytes(raw)
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))  # a change is seen


@SETTINGS
@given(
    documents,
    st.sampled_from(["json", "yaml", "bytes"]),
    st.binary(max_size=200),
    st.integers(1, 16),
)
def test_any_target_list_is_read_within_bounds(tmp_path: Path, doc, how: str, raw: bytes,
                                               limit: int) -> None:  # fmt: skip
    data = {"json": lambda: json.dumps(doc).encode(), "yaml": lambda: yaml.safe_dump(doc).encode(),
            "bytes": lambda: raw}[how]()  # fmt: skip
    sd, prom = tmp_path / "sd.yaml", tmp_path / "prometheus.yml"
    _write(sd, data)
    _write(prom, data)
    errors: Counter[str] = Counter()
    got = Targets(file_sd=str(sd), prometheus_file=str(prom), reread=0.0).current(errors, limit)
    assert len(got) <= 2 * limit  # each list capped while built
    assert all(len(t.name) <= MAX_OUTSIDE_LABEL and len(t.engine) <= MAX_OUTSIDE_LABEL
               and not any(ord(c) < 32 or ord(c) == 127 for c in t.name) for t in got)  # fmt: skip


@SETTINGS
@given(st.lists(documents, max_size=5), st.lists(documents, max_size=5))
def test_a_good_group_among_junk_groups_is_kept(tmp_path: Path, before, after) -> None:
    good = {"targets": ["10.9.9.9:8000"], "labels": {"replica": "good"}}
    sd = tmp_path / "sd.json"
    _write(sd, json.dumps([*before, good, *after]).encode())
    got = Targets(file_sd=str(sd), reread=0.0).current(Counter(), 64)
    assert any(t.url == "http://10.9.9.9:8000/metrics" for t in got) or len(got) == 64


# -- Ray answers -------------------------------------------------------------------------------
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.sampled_from(
                [
                    "result",
                    "data",
                    "msg",
                    "total",
                    "num_after_truncation",
                    "node_id",
                    "node_ip",
                    "state",
                    "pid",
                    "class_name",
                    "ray_version",
                    "session_name",
                    "status",
                    "entrypoint",
                    "metadata",
                    "job_id",
                    "start_time",
                    "end_time",
                    "node_id_to_summary",
                    "cluster",
                    "summary",
                ]
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


class Scripted:
    """Stands in for the HTTP client: every GET answers the next scripted body."""

    def __init__(self, bodies: list[bytes]):
        self.bodies = bodies
        self.i = 0

    def get(self, url: str, **kw) -> bytes:
        body = self.bodies[self.i % len(self.bodies)]
        self.i += 1
        return body

    def close(self) -> None:
        pass


@SETTINGS
@given(st.lists(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=50)), min_size=1,
                max_size=10))  # fmt: skip
def test_any_ray_answer_is_a_counted_failure_or_a_poll_never_a_crash(bodies: list[bytes]) -> None:
    src = RaySource("http://127.0.0.1:1", node_ips=["127.0.0.1"])
    src._api.http = Scripted(bodies)  # type: ignore[assignment]
    for _ in range(3):
        snap = src.poll_once()
        assert snap.errors.get("exception", 0) == 0, snap.errors  # no bug reached
        for s in snap.samples:
            assert all(len(v) <= 200 for v in s.labels)


@SETTINGS
@given(st.lists(json_values, max_size=30), st.text(max_size=50))
def test_any_jobs_api_listing_keeps_the_good_entry(junk, entrypoint: str) -> None:
    tie({"entrypoint": entrypoint})  # never raises
    good = {"status": "SUCCEEDED", "submission_id": "good", "job_id": "02", "start_time": 10**15,
            "end_time": 10**15 + 1, "metadata": {"project": "p", "experiment": "e"}}  # fmt: skip
    book = JobBook()
    book.update([*junk, good])
    tied, _ = book.facts()
    assert tied[("p", "e")].submission == "good"


_PREFIXES = tuple(p for name in FAMILIES for p in (name.encode() + b"{", name.encode() + b" "))


@SETTINGS
@given(st.lists(st.one_of(wanted_line, junk_line), max_size=60), st.integers(1, 70))
def test_the_line_search_finds_what_a_split_would(lines: list[str], max_series: int) -> None:
    """wanted_lines (a search, no split) against the plain reading: split the page, keep the
    wanted families' lines, the first `max_series` of each."""
    from rlhf_exporter.sources.engines import wanted_lines

    body = "\n".join(lines).encode("utf-8", "surrogatepass")
    per: Counter[bytes] = Counter()
    want, over = [], 0
    for line in body.split(b"\n"):
        if line.startswith(_PREFIXES):
            name = line[: len(line) - len(line.lstrip(b"abcdefghijklmnopqrstuvwxyz:_"))]
            per[name] += 1
            if per[name] > max_series:
                over += 1
            else:
                want.append(line)
    got, excess = wanted_lines(body, max_series)
    assert sorted(got) == sorted(want) and excess == over


def _strings_only(doc):
    """What load_document keeps of a document: lists, mappings with string keys, strings."""
    if isinstance(doc, list):
        return [_strings_only(x) for x in doc]
    if isinstance(doc, dict):
        return {k: _strings_only(v) for k, v in doc.items() if isinstance(k, str)}
    return doc if isinstance(doc, str) else None


@SETTINGS
@given(documents, st.booleans())
def test_the_event_reader_reads_yaml_as_yaml_safe_load_does(doc, flow: bool) -> None:
    from rlhf_exporter.sources.engine_targets import load_document

    raw = yaml.safe_dump(doc, default_flow_style=flow).encode()
    if raw.lstrip().startswith((b"[", b"{", b'"')) or raw.strip() in (b"null", b"true"):
        return  # JSON-looking text goes to orjson first (same values where it is JSON)
    assert load_document(raw) == _strings_only(yaml.safe_load(raw))
