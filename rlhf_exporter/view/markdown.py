"""The project's Markdown docs as HTML, for `serve` (`/runbooks`, `/docs/...`) and the
`diagnose --html` report, so their links work with no network.

A small, strict subset of GitHub Markdown, as the docs use it: ATX headings (with GitHub's
anchors as ids, so `runbooks#rlhfjobstalled` lands on `## RLHFJobStalled`), fenced code,
pipe tables, `-`/`1.` lists, paragraphs; inline code, `**bold**`, `*em*` and links. Every
character of the source is escaped; a link's target is rewritten by the caller's `link`
(None: the text stays, without a link). Pure: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape

LinkRewrite = Callable[[str], str | None]
_INLINE = re.compile(
    r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)|(?<![\w*])\*([^*\s][^*]*)\*"
)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"^(\s*)(?:[-*]|\d+\.)\s+(.*)$")


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`."""
    text = re.sub(r"[`*\[\]()]", "", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def inline(text: str, link: LinkRewrite) -> str:
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(escape(text[at : m.start()]))
        code, bold, label, target, em = m.groups()
        if code is not None:
            out.append(f"<code>{escape(code)}</code>")
        elif bold is not None:
            out.append(f"<b>{inline(bold, link)}</b>")
        elif label is not None:
            href = link(target)
            shown = inline(label, link)
            out.append(f'<a href="{escape(href)}">{shown}</a>' if href is not None else shown)
        else:
            out.append(f"<i>{inline(em, link)}</i>")
        at = m.end()
    out.append(escape(text[at:]))
    return "".join(out)


def _table(rows: list[str], link: LinkRewrite) -> str:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    body = [r for r in cells[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r)]
    head = "".join(f"<th>{inline(c, link)}</th>" for c in cells[0])
    trs = "".join(
        "<tr>" + "".join(f"<td>{inline(c, link)}</td>" for c in r) + "</tr>" for r in body
    )
    return f"<table><tr>{head}</tr>{trs}</table>"


def to_html(text: str, link: LinkRewrite = lambda target: target) -> str:
    """The document as HTML (a fragment: headings, paragraphs, code, tables, lists)."""
    out: list[str] = []
    para: list[str] = []
    lines = text.splitlines()
    i = 0

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para), link)}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append(f"<pre>{escape(chr(10).join(lines[i + 1 : j]))}</pre>")
            i = j + 1
            continue
        heading = _HEADING.match(line)
        if heading:
            flush()
            level, title = len(heading.group(1)), heading.group(2)
            out.append(f'<h{level} id="{escape(anchor(title))}">{inline(title, link)}</h{level}>')
        elif line.lstrip().startswith("|"):
            flush()
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j], link))
            i = j
            continue
        elif _ITEM.match(line):
            flush()
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                m = _ITEM.match(lines[i])
                if m and len(m.group(1)) < 2:
                    items.append(m.group(2))
                elif items:
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{inline(t, link)}</li>" for t in items) + "</ul>")
            continue
        elif not line.strip():
            flush()
        elif line.startswith("<!--"):
            pass  # a generated file's note
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)
