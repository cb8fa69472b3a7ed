"""The job view: HTML pages with inline SVG, drawn from immutable state.

One module draws (`draw`), one composes pages (`pages`); two callers: the sidecar's `/` and
`/jobs/<project>/<experiment>` (rlhf_exporter/server.py) and `diagnose --html`
(rlhf_exporter/commands/diagnose.py).
"""

from .pages import Facts, Links, ReportFile, ReportRun, index_page, job_page, report_page

__all__ = ["Facts", "Links", "ReportFile", "ReportRun", "index_page", "job_page", "report_page"]
