"""What every page shares: the style, the links (runbooks, docs, dashboards), what the
sidecar's pages say about the exporter itself (`Facts`, its sources, its header), a job's
name and path, durations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

from ...diagnosis.stall import StallLimit
from ...diagnosis.thresholds import seconds
from ...metrics.snapshot import Snapshot
from ...render.rules import BOUND_ALERTS, runbook_url

REGRESSION_ALERT = "RLHFJobRegression"
STALL_ALERT = "RLHFJobStalled"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em 2em;
color:#222;max-width:1100px}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em}
h3{font-size:1em;margin:1em 0 .3em}
a{color:#1f60c4}table{border-collapse:collapse}
td,th{padding:.25em .7em;text-align:left;vertical-align:middle;border-bottom:1px solid #e4e4e4}
th{font-weight:600;font-size:.9em;color:#555}
.verdict-box{border-left:8px solid #888;padding:.5em 1em;background:#f7f7f7;margin:.6em 0}
.verdict-box .big{font-size:1.25em;font-weight:600}
.cannot-show{font-size:.9em;color:#555;margin:.3em 0 .8em}.cannot-show ul{margin:.2em 0}
.tag{display:inline-block;padding:0 .5em;border-radius:3px;color:#fff;font-size:.9em}
.legend{font-size:.85em;margin:.3em 0}.sw{margin-right:1em;white-space:nowrap}
.sw i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-1px}
svg text.axis{font-size:10px;fill:#666}svg .grid{stroke:#ddd}svg text.marker{font-size:12px}
svg .run{stroke:#444;stroke-dasharray:3 3}
.up{color:#2d7d2d;font-weight:600}.down{color:#c4162a;font-weight:600}.starting{color:#6b6b6b}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto}.muted{color:#777}
.empty{color:#777;font-style:italic}td.name{min-width:9em;max-width:24em;overflow-wrap:anywhere}
h1,h2{overflow-wrap:anywhere}.demo{background:#fff4d6;padding:.4em .8em}
.hangs{border-left:8px solid #c4162a;padding:.5em 1em;background:#fbf1f1;margin:.6em 0}
.hangs pre{max-height:24em;font-size:.85em}.hangs details{margin:.2em 0}
.problems{border-left:8px solid #e0a800;padding:.4em 1em;background:#fff8e1;margin:.6em 0}
.problems ul{margin:.2em 0;padding-left:1.2em}.problems li{margin:.3em 0;overflow-wrap:anywhere}
"""
# the sidecar's pages only (`/`, a job's page): the report keeps CSS above, byte for byte
SIDECAR_CSS = """
.answer .state{margin:.1em 0 .3em}.answer .since{color:#555}.answer .changed{margin:.2em 0}
.answer .engines{font-size:.9em;color:#444}.gpu-time .sw i{opacity:1}
.gpu-time details{font-size:.9em}.demo .story{font-weight:600}
"""


@dataclass(frozen=True)
class Links:
    """Where the page points: the runbooks (the thresholds' `alerts.runbook_url`, as the
    rules do) and the docs and dashboards next to them."""

    runbook_base: str
    docs_base: str | None = None  # None: next to the runbooks (repo_base + "docs/")
    dashboards_base: str | None = None  # None: repo_base + "grafana/"

    @classmethod
    def served(cls) -> Links:
        """The exporter's own copies (`serve` answers /runbooks, /docs/, /grafana/)."""
        return cls("/runbooks", "/docs/", "/docs/#dashboards")

    @classmethod
    def of(cls, runbook_url: str, fallback: Links | None = None) -> Links:
        """A user's runbook URL wins; an unset one, or the default's reserved `.invalid`
        host (RFC 2606: it never resolves), is `fallback` (default: the served copies)."""
        if clickable(runbook_url):
            return cls(runbook_url)
        return fallback if fallback is not None else cls.served()

    @property
    def repo_base(self) -> str:  # .../blob/main/docs/runbooks.md -> .../blob/main/
        head, sep, _ = self.runbook_base.rpartition("/docs/")
        return head + "/" if sep else self.runbook_base.rsplit("/", 1)[0] + "/"

    @property
    def docs(self) -> str:
        return self.docs_base if self.docs_base is not None else self.repo_base + "docs/"

    @property
    def dashboards(self) -> str:
        if self.dashboards_base is not None:
            return self.dashboards_base
        return self.repo_base + "grafana/"

    def runbook(self, verdict: str | None, change: str | None = None) -> tuple[str, str]:
        """(url, alert name) of the runbook section for a verdict (a regression first)."""
        if change == "regression":
            return runbook_url(self.runbook_base, REGRESSION_ALERT), REGRESSION_ALERT
        alert = BOUND_ALERTS.get(verdict or "")
        if alert is None:
            return self.runbook_base or "#runbooks", "runbooks"
        return runbook_url(self.runbook_base, alert), alert


def clickable(url: str) -> bool:
    """Whether a URL leads somewhere a person can open: set, and not a `.invalid` host."""
    host = (urlsplit(url).hostname or "") if url else ""
    return bool(host) and not (host == "invalid" or host.endswith(".invalid"))


def _page(title: str, body: str, refresh: int | None = None, css: str = CSS) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">{meta}'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{css}</style></head><body>{body}</body></html>\n"
    )


def _tag(text: str, colour: str) -> str:
    return f'<span class="tag" style="background:{colour}">{escape(text)}</span>'


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _age(now: float, t: float | None) -> str:
    return "never" if t is None else f"{_duration(now - t)} ago"


def job_name(project: str, experiment: str) -> str:
    """A job's name as HTML: each part escaped and bidi-isolated (`<bdi>`), so a U+202E in
    one part cannot reorder the other or the text around it."""
    return f"<bdi>{_breakable(project)}</bdi> / <bdi>{_breakable(experiment)}</bdi>"


def _breakable(name: str) -> str:
    """A name escaped, with a line-break opportunity (`<wbr>`) after each `_`, `.` and `/`:
    a long name wraps at its separators, not character by character."""
    out = escape(name)
    for sep in ("_", ".", "/"):
        out = out.replace(sep, sep + "<wbr>")
    return out


def job_path(project: str, experiment: str) -> str:
    return f"/jobs/{quote(project, safe='')}/{quote(experiment, safe='')}"


def stalled_for(job: Mapping[str, Any], now: float, factor: float, minimum: float) -> float | None:
    """Seconds without a new step, when that is past the stall alert's limit (the rule's:
    diagnosis/stall.py, from the job's baseline step time and between-steps work); else None."""
    return StallLimit(factor, minimum).job_stalled_for(job, now)


@dataclass(frozen=True)
class Facts:
    """What the page says about the exporter itself."""

    version: str
    base_url: str  # http://host:port as the browser reached it
    sources_text: str
    demo: bool = False
    stall_factor: float = 3.0  # the thresholds' alerts.stall_factor and stall_min (seconds)
    stall_min: float = 600.0
    story: str = ""  # the demo: the incident now playing (demo/job.py `DemoJob.story`)
    # the demo: its job (project, experiment) and its clock (wall -> job time, demo/clock.py),
    # on which its stall is judged: its records say ~95 s a step, written every 0.7 s
    clock: tuple[str, str, Callable[[float], float]] | None = None

    def on_job_clock(self, job: Mapping[str, Any]) -> bool:
        c = self.clock
        return c is not None and (job.get("project"), job.get("experiment")) == (c[0], c[1])

    def stalled(self, job: Mapping[str, Any], now: float) -> float | None:
        if self.clock is not None and self.on_job_clock(job):
            at, last = self.clock[2], job.get("last_step_time")
            return StallLimit(self.stall_factor, self.stall_min).stalled_for(
                None if last is None else at(last),
                at(now),
                job.get("baseline_step_seconds"),
                job.get("between_steps_max"),
            )
        return stalled_for(job, now, self.stall_factor, self.stall_min)

    @classmethod
    def of(
        cls,
        version: str,
        base_url: str,
        sources: str,
        demo: bool,
        alerts: Mapping[str, Any],
        story: str = "",
        clock: tuple[str, str, Callable[[float], float]] | None = None,
    ) -> Facts:
        """With the stall deadline of the thresholds' `alerts` section (as the rule has it)."""
        factor = float(alerts.get("stall_factor", cls.stall_factor))
        minimum = seconds(alerts.get("stall_min", cls.stall_min))
        return cls(version, base_url, sources, demo, factor, minimum, story, clock)


def source_state(s: Snapshot) -> str:
    """`up`, `starting` (its first poll has not ended) or `down`: as `/` and
    `/api/v1/status` say it."""
    if s.up:
        return "up"
    if s.last_success is None and not s.errors and not s.duration:
        return "starting"
    return "down"


def sources_table(snapshots: Iterable[Snapshot], now: float) -> str:
    """Each source: its state, last success, the errors that happened (never a zero count)."""
    rows = []
    for s in snapshots:
        state = source_state(s)
        # a source that is not polled (push) is up from the start and has no last success
        unpolled = state == "up" and s.last_success is None
        last = "not polled: accepting" if unpolled else _age(now, s.last_success)
        state = f'<span class="{state}">{state}</span>'
        last_error = getattr(s, "last_error", None)  # a message, when the source keeps one
        errors = ", ".join(f"{r} ×{n}" for r, n in sorted(s.errors.items()) if n)
        err = escape(str(last_error)) if last_error else escape(errors) or "none"
        rows.append(
            f'<tr class="source" data-up="{int(s.up)}"><td>{escape(s.collector)}</td>'
            f"<td>{state}</td><td>{last}</td><td>{err}</td>"
            f"<td>{s.duration * 1000:.0f} ms</td></tr>"
        )
    if not rows:
        return "<p>No source is configured.</p>"
    return (
        "<table><tr><th>source</th><th>state</th><th>last success</th>"
        "<th>errors (reason ×count)</th><th>last collection took</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def facts_section(facts: Facts, links: Links) -> str:
    host = facts.base_url.split("://", 1)[-1]
    snippet = (
        "scrape_configs:\n"
        "  - job_name: rlhf-exporter\n"
        "    scrape_interval: 15s\n"
        "    static_configs:\n"
        f"      - targets: ['{host}']"
    )
    docs, dashboards = links.docs, links.dashboards
    return (
        "<h2>This exporter</h2>"
        f"<p>rlhf-exporter {escape(facts.version)}. Scrape URL: "
        f'<a href="/metrics"><code>{escape(facts.base_url)}/metrics</code></a>. Sources: '
        f"{escape(facts.sources_text)}.</p>"
        "<p>Add it to Prometheus (<code>prometheus.yml</code>):</p>"
        f'<pre class="scrape">{escape(snippet)}</pre>'
        f'<p><a href="/metrics">/metrics</a> · <a href="/api/v1/jobs">/api/v1/jobs</a> · '
        f'<a href="/api/v1/status">/api/v1/status</a> · '
        f'<a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a> · '
        f'<a href="{escape(docs)}">docs</a> (metrics, decision table) · '
        f'<a href="{escape(links.runbook_base)}">runbooks</a> · '
        f'<a href="{escape(dashboards)}">Grafana dashboards (JSON)</a></p>'
    )


def _header(facts: Facts) -> str:
    demo = (
        '<p class="demo"><b>Demo data.</b> The job, its GPUs and its Ray actors are simulated '
        "(<code>serve --demo</code>); nothing here is a real cluster."
        + (
            f' <span class="story">{escape(facts.story[:1].upper() + facts.story[1:])}.</span>'
            if facts.story
            else ""
        )
        + "</p>"
        if facts.demo
        else ""
    )
    return (
        '<h1><a href="/" style="color:inherit;text-decoration:none">rlhf-exporter</a></h1>'
        "<p class=muted>Where the step time of verl RLHF jobs goes, why, and whether a "
        "slowdown is a workload shift or a regression.</p>" + demo
    )
