"""The job view's pages: `/` and `/jobs/<project>/<experiment>`, rendered from the
endpoints' immutable state (rlhf_exporter/view/)."""

from __future__ import annotations

from urllib.parse import unquote

from .. import __version__
from ..view.pages import Facts, Links, index_page, job_page, not_found_page
from .endpoints import Endpoints
from .page_cache import HOST_MARK


def with_host(page: bytes, host: str | None) -> bytes:
    return page.replace(HOST_MARK.encode(), host.encode()) if host else page


def _facts(endpoints: Endpoints, host: str | None) -> tuple[Facts, Links]:
    base = f"http://{host}" if host else ""
    facts = Facts.of(
        __version__,
        base,
        endpoints.sources_text,
        endpoints.demo,
        endpoints.alerts,
        story=endpoints.demo_story() if endpoints.demo_story is not None else "",
        clock=endpoints.demo_clock,
    )
    return facts, Links.of(endpoints.alerts.get("runbook_url", ""))  # else the served copies


def landing_page(endpoints: Endpoints, host: str | None = None) -> bytes:
    """`/`: every job, sorted by who needs attention (rendered from immutable state)."""
    snaps = [fn() for fn in endpoints.snapshot_fns]
    return index_page(endpoints.jobs(), snaps, *_facts(endpoints, host)).encode()


def job_view(endpoints: Endpoints, path: str, host: str | None = None) -> tuple[int, bytes]:
    """`/jobs/<project>/<experiment>`: (status, page)."""
    parts = path[len("/jobs/") :].split("/")
    if len(parts) != 2:
        return 404, not_found_page(path, "").encode()
    project, experiment = (unquote(p) for p in parts)
    for job in endpoints.jobs():
        if job["project"] == project and job["experiment"] == experiment:
            snaps = [fn() for fn in endpoints.snapshot_fns]
            joiner = endpoints.window_view
            windows = joiner.view.get((project, experiment)) if joiner is not None else None
            page = job_page(
                job,
                snaps,
                *_facts(endpoints, host),
                windows=windows,
                balance_limits=endpoints.balance_limits,
            )
            return 200, page.encode()
    return 404, not_found_page(project, experiment).encode()
