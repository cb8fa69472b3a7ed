"""The exporter's own sample-line writer (rlhf_exporter/metrics/lines.py) pinned to
prometheus_client's output, byte for byte, on every catalog family with the hardest label
values and numbers: the whole /metrics body, for every content type `negotiate` serves, is
what client_python's generate_latest (text and OpenMetrics) writes for the same families
from a real registry. Also which content types share sample lines (`line_format`)."""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from rlhf_exporter.metrics import lines as direct
from rlhf_exporter.metrics.catalog import BY_NAME, COUNTER, GAUGE
from rlhf_exporter.metrics.exposition import Exposition
from rlhf_exporter.metrics.families import add_samples, families, new_family
from rlhf_exporter.metrics.negotiation import SHARED, encode, line_format, negotiate
from rlhf_exporter.metrics.snapshot import PackedSamples, Sample, Snapshot, pack

HARD_LABELS = ("", "a", 'quote " back \\ slash', "new\nline", "ünïcødé €𝄞", "\ufffd", "x" * 300)
HARD_VALUES = (
    0.0,
    -0.0,
    1.0,
    -1.5,
    1e-7,
    0.1,
    1e300,
    -1e-300,
    2.0**53 + 2,
    math.nan,
    math.inf,
    -math.inf,
    7,  # an int
    -(2**40),
)
JOB_LABELS = ("project", "experiment")


def hard_samples() -> list[Sample]:
    """Samples of every catalog family with the hardest label values and numbers."""
    return [
        Sample(
            metric.name,
            tuple(
                HARD_LABELS[(i + j + n) % len(HARD_LABELS)] + str(j)
                for n in range(len(metric.labels))
            ),
            v,
        )
        for i, metric in enumerate(BY_NAME.values())
        for j, v in enumerate(HARD_VALUES)
    ]


def snapshots() -> list[Snapshot]:
    """The hard samples as sources publish them: each job's samples packed in `parts`, the
    others in `rest`."""
    jobs: dict[tuple[str, ...], list[tuple[str, tuple[str, ...], float]]] = {}
    rest = []
    for s in hard_samples():
        if BY_NAME[s.name].labels[:2] == JOB_LABELS:
            jobs.setdefault(s.labels[:2], []).append((s.name, s.labels[2:], s.value))
        else:
            rest.append(s)
    parts = tuple(pack(head, rows) for head, rows in jobs.items())
    return [Snapshot("verl", True, rest=tuple(rest), parts=parts)]


class FixedCollector:
    def __init__(self, fams):
        self.fams = fams

    def collect(self) -> Iterator:
        return iter(self.fams)


def client_python(snaps, accept: str) -> bytes:
    """prometheus_client's own body for these snapshots' families, from a real registry."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FixedCollector(families(snaps)))
    encoder, _ = choose_encoder(accept)
    return encoder(registry)


SERVED = sorted(
    {
        negotiate(f"{media};version={v}" + (f";escaping={e}" if e else ""))[1]: (
            f"{media};version={v}" + (f";escaping={e}" if e else "")
        )
        for media, versions in (
            ("text/plain", ("0.0.4", "1.0.0")),
            ("application/openmetrics-text", ("1.0.0", "2.0.0")),
        )
        for v in versions
        for e in ("", "underscores", "dots", "values", "allow-utf-8")
    }.values()
)


def test_the_hard_samples_reach_the_direct_writer():
    # gauges and counters (no _created) are all the catalog holds: a histogram or a summary
    # would need its own golden samples here
    assert {m.type for m in BY_NAME.values()} == {GAUGE, COUNTER}
    samples = hard_samples()
    assert {s.name for s in samples} == set(BY_NAME)
    packed = snapshots()[0].parts
    assert packed and all(isinstance(p, PackedSamples) for p in packed)


@pytest.mark.parametrize("accept", SERVED)
def test_the_body_is_client_pythons_for_every_served_format(accept):
    snaps = snapshots()
    ex = Exposition([lambda: snaps[0]])
    body, ctype, _ = ex.render(accept)
    assert ctype == negotiate(accept)[1]
    want = client_python(snaps, accept)
    assert body == want and b"_created" not in body
    zipped, _, gz = ex.render(accept, want_gzip=True)
    assert gz and gzip.decompress(zipped) == body
    if line_format(ctype) == SHARED:  # written by lines.py, not by prometheus_client
        assert ex.stats["direct_fragments"] > 0
    assert not ex.dropped


def shared_sample_lines(accept: str) -> list[bytes]:
    """Each catalog family's sample lines for the hard samples, in this format, cut at the
    headers of one prometheus_client encoding."""
    encoder, _ = choose_encoder(accept)
    by_name: dict = {}
    add_samples(by_name, hard_samples())
    out, pos, lines = encode(encoder, list(by_name.values())), 0, []
    headers = [encode(encoder, [new_family(BY_NAME[n])]) for n in by_name]
    for i, header in enumerate(headers):
        assert out.startswith(header, pos)
        start = pos + len(header)
        end = out.find(headers[i + 1], start) if i + 1 < len(headers) else len(out)
        lines.append(out[start:end])
        pos = end
    return lines


@pytest.mark.parametrize("accept", SERVED)
def test_formats_that_share_lines_write_text_0_0_4s_sample_lines(accept):
    ctype = negotiate(accept)[1]
    if line_format(ctype) == SHARED:
        assert shared_sample_lines(accept) == shared_sample_lines("")
    else:
        assert line_format(ctype) == ctype


def test_escaping_dots_gets_lines_of_its_own():
    accept = "text/plain;version=1.0.0;escaping=dots"
    assert line_format(negotiate(accept)[1]) != SHARED
    assert shared_sample_lines(accept) != shared_sample_lines("")  # `_` written `__`


def test_the_golden_comparison_notices_a_writer_that_differs(monkeypatch):
    snaps = snapshots()
    want = client_python(snaps, "")

    def body() -> bytes:
        return Exposition([lambda: snaps[0]]).render("")[0]

    assert body() == want
    monkeypatch.setattr(direct, "_escape", lambda v: v)  # forgets to escape
    monkeypatch.setattr(direct, "_TEMPLATES", type(direct._TEMPLATES)())
    assert body() != want
    monkeypatch.undo()
    monkeypatch.setattr(direct, "floatToGoString", lambda v: repr(float(v)))  # 1e300, not 1e+300
    assert body() != want
