"""Whole HTML pages: the sidecar's `/` and `/jobs/<project>/<experiment>`, and the
`diagnose --html` report. Self-contained (inline CSS and SVG, no script, nothing fetched),
so they work air-gapped in a pod and as a file attached to a bug report.

Inputs are plain values the callers already hold (job summaries with their `history` of
`StepPoint`s, source `Snapshot`s, run summaries), never live objects: a page is rendered
from immutable state and never waits on a source.

The modules, each a part of the pages: `common` (style, links, the exporter's facts and
sources), `answer` (the first screen's answer and the step charts), `stall` (the state line
and where a stalled job hangs), `index` (`/`), `job` (a job's page), `diagnose_report`
(`diagnose --html`). The names their callers use are the ones below.
"""

from .answer import cannot_show
from .common import Facts, Links, source_state
from .diagnose_report import ReportFile, ReportRun, report_page
from .index import attention, index_page
from .job import balance_words, doc_page, gpu_windows_section, job_page, move_text, not_found_page

__all__ = [
    "Facts",
    "Links",
    "ReportFile",
    "ReportRun",
    "attention",
    "balance_words",
    "cannot_show",
    "doc_page",
    "gpu_windows_section",
    "index_page",
    "job_page",
    "move_text",
    "not_found_page",
    "report_page",
    "source_state",
]
