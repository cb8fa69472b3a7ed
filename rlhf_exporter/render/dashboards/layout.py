"""Where panels go: a dashboard's shared header, its rows, and the grid they are laid out on.

In the style of grafana-foundation-sdk's examples, a dashboard module is a list of row
functions, each returning a `Row` of `Cell`s (a panel built by one small function, and its
size); `Board.add_row` lays the cells out left to right in rows of 24 columns.

Panel ids are assigned, never typed: a row's id is its number (100, 200, ...), and the n-th
panel under it gets the row's id + n. A link to `?viewPanel=301` stays valid when a row is
added (it takes a number of its own) or a panel is appended to a row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from .panels import DS, WIDTH, PanelBuilder, variables

TAGS = ("rlhf", "verl", "rlhf-exporter")


@dataclass(frozen=True)
class Cell:
    """One panel on the grid: the panel, and its width and height."""

    panel: PanelBuilder
    w: int
    h: int


@dataclass(frozen=True)
class Row:
    """A collapsible row title and the panels under it, in reading order; `id` is the row's
    number, from which its panels' ids follow (`Board.add_row`)."""

    id: int
    title: str
    cells: Sequence[Cell]


def header(
    uid: str,
    title: str,
    description: str,
    link_title: str,
    link_url: str,
    single_job: bool = False,
) -> Board:
    """What both dashboards share: tags, time range, refresh, crosshair, the data source and
    cluster/namespace/project/experiment variables (`single_job`: project and experiment
    single-select, without "All"), and one link to the other dashboard."""
    board = Board(uid, title, description, TAGS)
    board.variables(variables(single_job=single_job))
    board.link(link_title, link_url)
    return board


def link(title: str, url: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(url)
        .keep_time(True)
        .include_vars(False)
    )


class Board:
    """A dashboard under construction: rows and panels, laid out in reading order."""

    def __init__(self, uid: str, title: str, description: str, tags: Sequence[str]):
        self.builder = (
            db.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(list(tags))
            .editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .time("now-6h", "now")
            .refresh("30s")
            .timezone("browser")
        )
        self._x = self._y = self._line = 0
        self._ids: set[int] = set()
        self._annotation_titles: dict[str, str] = {}

    def _id(self, pid: int) -> int:
        if pid in self._ids or pid < 1:
            raise ValueError(f"panel id {pid} is used twice (or < 1)")
        self._ids.add(pid)
        return pid

    def _newline(self) -> None:
        if self._x:
            self._x, self._y, self._line = 0, self._y + self._line, 0

    def row(self, pid: int, title: str) -> None:
        self._newline()
        self.builder = self.builder.with_row(
            db.Row(title).id(self._id(pid)).grid_pos(dm.GridPos(h=1, w=WIDTH, x=0, y=self._y))
        )
        self._y += 1

    def add_row(self, row: Row) -> None:
        self.row(row.id, row.title)
        for n, cell in enumerate(row.cells, start=1):
            self.add(row.id + n, cell.panel, cell.w, cell.h)

    def add(self, pid: int, panel: PanelBuilder, w: int, h: int) -> None:
        if self._x + w > WIDTH:
            self._newline()
        panel = panel.id(self._id(pid)).grid_pos(dm.GridPos(h=h, w=w, x=self._x, y=self._y))
        self.builder = self.builder.with_panel(panel)
        self._x += w
        self._line = max(self._line, h)
        if self._x >= WIDTH:
            self._newline()

    def variables(self, variables: Sequence[db.QueryVariable | db.DatasourceVariable]) -> None:
        for v in variables:
            self.builder = self.builder.with_variable(v)

    def annotate(self, name: str, expr: str, colour: str, title: str) -> None:
        a = (
            db.AnnotationQuery()
            .name(name)
            .datasource(DS)
            .enable(True)
            .icon_color(colour)
            .expr(expr)
        )
        self.builder = self.builder.annotation(a)
        self._annotation_titles[name] = title

    def link(self, title: str, url: str) -> None:
        self.builder = self.builder.link(link(title, url))

    def json(self) -> str:
        """The dashboard as committed: sorted keys, two-space indent, trailing newline."""
        doc = json.loads(json.dumps(self.builder.build(), cls=JSONEncoder))
        doc.setdefault("annotations", {}).setdefault("list", [])
        for item in doc["annotations"]["list"]:
            title = self._annotation_titles.get(item.get("name"))
            if title:
                item["titleFormat"] = title
        for var in doc.get("templating", {}).get("list", []):
            if var.get("type") != "interval":  # the SDK writes interval fields on every variable
                for key in ("auto", "auto_count", "auto_min"):
                    var.pop(key, None)
        doc["id"] = None
        return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
