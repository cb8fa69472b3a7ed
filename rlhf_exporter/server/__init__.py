"""HTTP for `serve`, and nothing else: /metrics, /healthz, /readyz, /, the push endpoint.

- `GET /metrics`: the sources' current snapshots in Prometheus text format (OpenMetrics when
  the scraper asks for it; gzip when accepted). The exposition is cached per job and per
  metric family (rlhf_exporter/metrics/exposition.py): a scrape re-encodes only the jobs whose
  series changed, and one that finds nothing new re-serves the same bytes; it never waits
  on a source.
- `GET /healthz`: 200 while the process serves HTTP (liveness).
- `GET /readyz`: 200 once a source has finished a first collection, successful or not (or
  when only the push endpoint is configured); 503 before (readiness). A source's health
  never makes the sidecar unready: that would take a KubeRay head pod out of its Service;
  a broken source is `rlhf_exporter_collector_up 0` instead. But an exporter whose settings
  give it no source that can ever see a verl job, nor a GPU (`Endpoints.blind`), answers 503
  for good, with one line naming the settings to add.
- `GET /api/v1/status`: the sources (state, last success, errors) and the set-up problems
  they see (a verl root one level off, a missing root, a file in another format, no source
  that can see a job), each with what to change (`Problem`).
- `GET /`: the job view (rlhf_exporter/view/): every job, who needs attention first, with
  sparklines, the sources' health and how to scrape; `GET /jobs/<project>/<experiment>` one
  job's step anatomy, verdict strip and markers; `GET /api/v1/jobs` the jobs as JSON;
  `GET /api/v1/jobs/<project>/<experiment>/stacks` a stalled job's stacks.
- `POST /api/v1/records`: verl records for jobs that cannot share a file (see
  rlhf_exporter/sources/push.py for the body and the answers).

Hostile requests: the job view's pages are cached by path (bounded in bytes,
`page_cache_bytes`), never by `Host` (a checked Host is put into the cached page at serve
time); `Accept-Encoding` weights are honoured (`gzip;q=0` gets plain text); a request with
`Transfer-Encoding` (no chunked bodies here) or a GET with a body is answered and its
connection closed, so its body is never parsed as the next request; failed token checks on
push and `/api/v1/windows` are rate-limited and counted (rlhf_exporter/auth.py).

Connections are bounded (`Server`): at most `http_max_connections` are served at once (one
thread each, as `http.server.ThreadingHTTPServer` does); a connection beyond that gets a
503 and is closed. A connection must send a request's headers (and a POST its body) within
`http_read_timeout` seconds, idle kept-alive ones included, or it is shut down. A
connection the client aborts, or one that times out, is logged once per kind of failure (in
the configured log format), then at debug level; never as a raw traceback.
The package: `endpoints.py` (what is served), `handler.py` (each path's answer,
`make_server`), `pages.py` and `page_cache.py` (the job view's pages), `connections.py`
(the connection cap and read deadlines).
"""

from .connections import Server
from .endpoints import EXPOSITION_WARM_INTERVAL, JOBS_API, Endpoints, JobsFn
from .handler import Handler, accepts_gzip, make_server, parse_listen
from .page_cache import HOST_MARK, PAGE_CACHE_BYTES, PageCache, clean_host
from .pages import job_view, landing_page

__all__ = [
    "EXPOSITION_WARM_INTERVAL",
    "HOST_MARK",
    "JOBS_API",
    "PAGE_CACHE_BYTES",
    "Endpoints",
    "Handler",
    "JobsFn",
    "PageCache",
    "Server",
    "accepts_gzip",
    "clean_host",
    "job_view",
    "landing_page",
    "make_server",
    "parse_listen",
]
