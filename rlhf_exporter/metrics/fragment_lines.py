"""Each fragment's sample lines per family, in a format's line format: written by lines.py
for the shared line format, else encoded by prometheus_client and cut at the family headers;
what fails to encode is left out and counted (docs/exposition.md)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .catalog import BY_NAME
from .chunks import Fragment, families_of
from .families import add_samples, new_family
from .lines import lines as direct_lines
from .negotiation import SHARED, Encoder, encode, line_format
from .snapshot import Sample

log = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds: a collector's render failure is logged at most this often


class FragmentLines:
    """Encodes fragments' lines, with the caches that spare re-encoding unchanged families."""

    def __init__(self, stats: Counter[str], dropped: Counter[tuple[str, str]], direct: bool):
        self.stats = stats
        self.dropped = dropped  # (collector, reason) -> samples
        self.direct = direct  # the shared line format written by lines.py
        self.headers: dict[tuple[str, str], bytes] = {}
        # (line format, one family's samples of one fragment) -> their lines: a job's families
        # that a new step left as they were (equal samples) are not encoded again
        self.family_lines: dict[tuple[str, tuple[Sample, ...]], bytes] = {}
        self._failed_logged: dict[str, float] = {}  # collector -> when a failure was logged

    def forget(self, ctype: str, lkey: str | None) -> None:
        """Drop this content type's headers and, given its line format, that format's lines."""
        self.headers = {k: v for k, v in self.headers.items() if k[0] != ctype}
        if lkey is not None:
            self.family_lines = {k: v for k, v in self.family_lines.items() if k[0] != lkey}

    def header(self, encoder: Encoder, ctype: str, name: str) -> bytes:
        key = (ctype, name)
        header = self.headers.get(key)
        if header is None:
            header = self.headers[key] = encode(encoder, [new_family(BY_NAME[name])])
        return header

    def lines(self, frag: Fragment, encoder: Encoder, ctype: str) -> None:
        """Encode the fragment's sample lines per family in this format's line format,
        unless it has them (or a chunk holds them)."""
        key = line_format(ctype)
        if key in frag.lines:
            return
        if key == SHARED and self.direct:
            # a whole job written directly costs less than hashing its families to find the
            # unchanged ones; None: a malformed sample, prometheus_client's checked path
            direct = direct_lines(frag.samples)
            if direct is not None:
                self.stats["samples_encoded"] += len(frag.samples)
                self.stats["direct_fragments"] += 1
                frag.counted = True
                frag.lines[key] = direct
                return
        groups = families_of(frag.samples)
        if groups is None:  # a malformed sample: the fragment as a whole, its drops counted
            lines = self._encode(frag, frag.samples, encoder, ctype)[0]
        else:
            lines = self._by_family(frag, groups, key, encoder, ctype)
            frag.families = tuple(groups.values())
        frag.counted = True
        frag.lines[key] = lines

    def _by_family(
        self,
        frag: Fragment,
        groups: dict[str, tuple[Sample, ...]],
        key: str,
        encoder: Encoder,
        ctype: str,
    ) -> dict[str, bytes]:
        """A new step changes some of a job's families only: the others' lines are reused."""
        cache = self.family_lines
        lines, missed = {}, []
        for name, fam in groups.items():
            hit = cache.get((key, fam))
            if hit is None:
                missed.append(fam)
            else:
                self.stats["family_hits"] += 1
                lines[name] = hit
        if missed:
            fresh, dropped = self._encode(frag, [s for f in missed for s in f], encoder, ctype)
            if not dropped:  # every sample served: its family's lines can be reused
                for fam in missed:
                    cache[key, fam] = fresh[fam[0].name]
            lines.update(fresh)
        return lines

    def _encode(
        self, frag: Fragment, samples: Sequence[Any], encoder: Encoder, ctype: str
    ) -> tuple[dict[str, bytes], int]:
        """These samples' lines per family, encoded by prometheus_client, and how many were
        left out (counted in `dropped` once per fragment)."""
        dropped: Counter[tuple[str, str]] = Counter()
        by_name: dict[str, Any] = {}
        self.stats["samples_encoded"] += len(samples)
        try:
            add_samples(by_name, samples, frag.collector, dropped)
            lines = self._split(encoder, ctype, by_name)
        except Exception:  # a bug: these families are left out, every other one is served
            lines, failed = {}, 0
            if len(by_name) > 1:  # family by family: only those that fail are left out
                for name, fam in by_name.items():
                    try:
                        lines.update(self._split(encoder, ctype, {name: fam}))
                    except Exception:
                        failed += len(fam.samples)
            else:
                failed = len(samples) or len(frag.samples)
            self._log_failure(frag.collector, failed)
            dropped = Counter({(frag.collector, "render_failed"): failed})
        if not frag.counted:
            self.dropped.update(dropped)
        return lines, sum(dropped.values())

    def _log_failure(self, collector: str, failed: int) -> None:
        """Logged once a minute per collector (with its traceback): never a flood."""
        now = time.monotonic()
        quiet = now - self._failed_logged.get(collector, -LOG_EVERY) < LOG_EVERY
        if not quiet:
            self._failed_logged[collector] = now
        log.log(
            logging.DEBUG if quiet else logging.ERROR,
            "could not encode %d samples of %s (counted as render_failed; logged at most "
            "once a minute per collector)",
            failed,
            collector,
            exc_info=not quiet,
        )

    def prune(self, frags: Sequence[Fragment]) -> None:
        """Forget the family lines no current fragment holds, once they are an eighth of the
        cache (their keys hold replaced samples alive: at 1,000 jobs each stale family is
        a few KB)."""
        if not self.family_lines:  # the direct lines use no family cache: nothing to prune
            return
        live = sum(len(f.families) * len(f.lines) for f in frags)  # per format
        if len(self.family_lines) <= live + live // 8 + 1024:
            return
        self.stats["family_prunes"] += 1
        keep = {(c, fam) for f in frags for fam in f.families for c in f.lines}
        self.family_lines = {k: v for k, v in self.family_lines.items() if k in keep}

    def _split(self, encoder: Encoder, ctype: str, by_name: dict[str, Any]) -> dict[str, bytes]:
        """Each family's sample lines, cut from one encoding of all of them at the headers."""
        if not by_name:
            return {}
        names = list(by_name)
        out = encode(encoder, list(by_name.values()))
        lines: dict[str, bytes] = {}
        pos = 0
        for i, name in enumerate(names):
            header = self.header(encoder, ctype, name)
            if not out.startswith(header, pos):
                raise ValueError(f"{name}: the encoder's output does not start with its header")
            start = pos + len(header)
            if i + 1 < len(names):
                end = out.find(self.header(encoder, ctype, names[i + 1]), start)
                if end < 0:
                    raise ValueError(f"{names[i + 1]}: header not found in the encoder's output")
            else:
                end = len(out)
            lines[name] = out[start:end]
            pos = end
        return lines
