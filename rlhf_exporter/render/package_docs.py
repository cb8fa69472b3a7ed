"""The package's copies of the docs and dashboards, so `serve` and `diagnose --html` link to
pages that exist with no network (`/runbooks#...`, `/docs/...`, `/grafana/...`).

A wheel carries only its package, so `rlhf_exporter/docs/` holds verbatim copies of
`docs/*.md` and `grafana/*.json` (package data): one source of truth, and `render --check`
fails when a copy differs. Runs last (ORDER 95), after the targets that write docs/ and
grafana/.
"""

from __future__ import annotations

from ..diagnosis import Thresholds
from . import repo_root

ORDER = 95
DEST = "rlhf_exporter/docs"
COPIES = {"docs": ("*.md", DEST), "grafana": ("*.json", f"{DEST}/grafana")}


def targets(thresholds: Thresholds) -> dict[str, str]:
    root = repo_root()
    out: dict[str, str] = {}
    for folder, (pattern, dest) in COPIES.items():
        for path in sorted((root / folder).glob(pattern)):
            if path.is_file():
                out[f"{dest}/{path.name}"] = path.read_text(encoding="utf-8")
    return out
