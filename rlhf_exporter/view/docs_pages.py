"""The docs, runbooks and dashboards shipped with the package (rlhf_exporter/docs/, copies
made by `rlhf-exporter render`), as `serve` answers them and as the report embeds them:

    /runbooks            docs/runbooks.md   (each alert's section at #<alertname, lower case>)
    /docs/ , /docs/NAME  the docs, each docs/NAME.md
    /grafana/NAME.json   a dashboard to import into Grafana

A link between docs goes to the served page; a link to a file that is not served (the
repository's alerts/, examples/) keeps its text, without a link. Nothing is read from
outside the package; a name is looked up among the shipped files, never joined to a path.
"""

from __future__ import annotations

import re
from functools import lru_cache
from html import escape
from importlib import resources
from importlib.resources.abc import Traversable

from .markdown import anchor, to_html

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def _folder() -> Traversable:  # the shipped copies (also inside a zip)
    return resources.files("rlhf_exporter") / "docs"


@lru_cache(maxsize=1)
def doc_names() -> tuple[str, ...]:
    try:
        return tuple(sorted(p.name[:-3] for p in _folder().iterdir() if p.name.endswith(".md")))
    except (FileNotFoundError, NotADirectoryError):
        return ()


@lru_cache(maxsize=1)
def dashboard_names() -> tuple[str, ...]:
    try:
        folder = _folder() / "grafana"
        return tuple(sorted(p.name for p in folder.iterdir() if p.name.endswith(".json")))
    except (FileNotFoundError, NotADirectoryError):
        return ()


def markdown(name: str) -> str | None:
    if name not in doc_names():
        return None
    return (_folder() / f"{name}.md").read_text(encoding="utf-8")


def dashboard(name: str) -> bytes | None:
    if name not in dashboard_names():
        return None
    return (_folder() / "grafana" / name).read_bytes()


def served_link(target: str) -> str | None:
    """A docs link as `serve` answers it (None: not served, text only)."""
    if target.startswith(("http://", "https://", "#", "mailto:")):
        return target
    path, sep, frag = target.partition("#")
    path = path.removeprefix("./").removeprefix("docs/").removeprefix("../docs/")
    if path.startswith("../grafana/") and path[11:] in dashboard_names():
        return "/grafana/" + path[11:]
    name = path.removesuffix(".md")
    if path.endswith(".md") and name in doc_names():
        base = "/runbooks" if name == "runbooks" else f"/docs/{name}"
        return base + sep + frag
    return None


@lru_cache(maxsize=32)
def doc_html(name: str) -> str | None:
    """A doc as an HTML fragment with served links (None: no such doc)."""
    text = markdown(name)
    return None if text is None else to_html(text, served_link)


def docs_index() -> str:
    items = "".join(
        f'<li><a href="{"/runbooks" if n == "runbooks" else "/docs/" + n}">{escape(n)}</a></li>'
        for n in doc_names()
    )
    dashboards = "".join(
        f'<li><a href="/grafana/{escape(n)}">{escape(n)}</a> (import into Grafana)</li>'
        for n in dashboard_names()
    )
    return (
        f"<h1>Docs</h1><ul>{items}</ul>"
        f'<h2 id="dashboards">Grafana dashboards</h2><ul>{dashboards}</ul>'
    )


def valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def runbook_sections(alerts: list[str]) -> str:
    """The runbook sections of `alerts` (each `## Alert` to the next `## `), as HTML with the
    anchors a runbook link has: what the report embeds, so its links work offline."""
    text = markdown("runbooks")
    if text is None:
        return ""
    sections = re.split(r"(?m)^(?=## )", text)
    wanted = {anchor(a) for a in alerts}
    chosen = [
        s for s in sections if s.startswith("## ") and anchor(s[3:].splitlines()[0]) in wanted
    ]
    return "\n".join(to_html(s, lambda t: t if t.startswith("#") else None) for s in chosen)
