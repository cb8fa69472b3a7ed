"""The Helm chart's copies of the alert rules and dashboards, from the repository's own files.

Helm reads nothing outside a chart, so `helm/rlhf-exporter/files/` holds verbatim copies of
the generated `alerts/*.rules.yaml` rule files (not alerts/alertmanager.example.yaml, which
is an Alertmanager config) and `grafana/*.json` dashboards: one source of truth
(the repository's files, themselves generated), and `render --check` fails when a copy differs.
This target runs last (ORDER 90), after the targets that write alerts/ and grafana/.
"""

from __future__ import annotations

from pathlib import Path

from ..diagnosis import Thresholds
from . import repo_root

ORDER = 90
CHART = "helm/rlhf-exporter"
# source folder in the repository -> (file pattern, folder inside the chart)
COPIES = {
    "alerts": ("*.rules.yaml", f"{CHART}/files/alerts"),
    "grafana": ("*.json", f"{CHART}/files/grafana"),
}


def copies(root: Path | None = None) -> dict[str, str]:
    """{chart-relative destination path: text} for every source file, read from `root`."""
    root = repo_root() if root is None else root
    out: dict[str, str] = {}
    for folder, (pattern, dest) in COPIES.items():
        for path in sorted((root / folder).glob(pattern)):
            if path.is_file():
                out[f"{dest}/{path.name}"] = path.read_text(encoding="utf-8")
    return out


def orphans(root: Path | None = None) -> list[str]:
    """Copies in the chart whose source is gone (render writes files but never deletes)."""
    root = repo_root() if root is None else root
    wanted = set(copies(root))
    found = []
    for _, (pattern, dest) in COPIES.items():
        found += [f"{dest}/{p.name}" for p in sorted((root / dest).glob(pattern)) if p.is_file()]
    return [rel for rel in found if rel not in wanted]


def targets(thresholds: Thresholds) -> dict[str, str]:
    return copies()
