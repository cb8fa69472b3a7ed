"""Which format a scrape gets: the Accept header read into prometheus_client's encoder and
content type, and which formats write the same sample lines (docs/exposition.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.exposition import choose_encoder

Encoder = Callable[[Any], bytes]
EOF = b"# EOF\n"
SHARED = "lines"  # the line format of every format that writes text 0.0.4's sample lines
MAX_ACCEPT_ENTRIES = 16  # Accept entries looked at; the rest are ignored

_MEDIA_VERSIONS = {  # what prometheus_client writes, per media type
    "application/openmetrics-text": frozenset({"1.0.0", "2.0.0"}),
    "text/plain": frozenset({"0.0.4", "1.0.0"}),
}
_ESCAPINGS = frozenset({"underscores", "dots", "values", "allow-utf-8"})
# escaping schemes that leave the catalog's names and label values as text 0.0.4 writes them
# (tests/test_exposition_golden.py holds this to prometheus_client's output)
_SHARED_ESCAPINGS = frozenset({"", "underscores", "allow-utf-8"})


class Families:
    """Duck-types a registry for prometheus_client's encoders: collect() over fixed families."""

    def __init__(self, fams: Sequence[Any]):
        self._fams = fams

    def collect(self) -> Iterator[Any]:
        return iter(self._fams)


def encode(encoder: Encoder, fams: Sequence[Any]) -> bytes:
    """prometheus_client's encoding of these families, without OpenMetrics' `# EOF`."""
    out = encoder(Families(fams))
    return out[: -len(EOF)] if out.endswith(EOF) else out


def is_openmetrics(ctype: str) -> bool:
    return ctype.startswith("application/openmetrics-text")


def negotiate(accept: str | None) -> tuple[Encoder, str]:
    """prometheus_client's encoder and content type for this Accept header, fed only the
    entries it knows: a known media type whose version (when given) prometheus_client
    writes, a known escaping scheme (an unknown one is dropped, as prometheus_client would
    default it), q not 0. The entries are rewritten from these known values, so the content
    type never holds a byte of the header."""
    clean = []
    for entry in (accept or "").split(",")[:MAX_ACCEPT_ENTRIES]:
        media, *params = (t.strip() for t in entry.split(";"))
        versions = _MEDIA_VERSIONS.get(media.lower())
        if versions is None:
            continue
        keep, ok = [media.lower()], True
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "version":
                ok = ok and value in versions
                keep.append(f"version={value}")
            elif key == "escaping" and value in _ESCAPINGS:
                keep.append(f"escaping={value}")
            elif key == "q":
                ok = ok and _q(value) > 0
        if ok:
            clean.append(";".join(keep))
    return choose_encoder(",".join(clean))


def _q(value: str) -> float:
    try:
        q = float(value)
    except ValueError:
        return 1.0  # a malformed weight: the entry as if unweighted
    return q if 0.0 <= q <= 1.0 else 1.0


def escaping(ctype: str) -> str:
    """The escaping scheme a content type names ('' when none)."""
    for param in ctype.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip() == "escaping":
            return value.strip()
    return ""


def line_format(ctype: str) -> str:
    """The key under which this content type's sample lines are cached: `SHARED` when it
    writes the catalog's sample lines as text 0.0.4 does (lines.py writes those), its own
    content type otherwise (its lines encoded by prometheus_client). Only the OpenMetrics
    and text formats that `negotiate` serves are `SHARED`, and only with an escaping scheme
    that changes none of the catalog's names."""
    media = ctype.split(";")[0].strip()
    if media in _MEDIA_VERSIONS and escaping(ctype) in _SHARED_ESCAPINGS:
        return SHARED
    return ctype
