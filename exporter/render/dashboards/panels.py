"""Panel helpers on top of grafana-foundation-sdk: one place for layout, queries and colours.

Only `rlhf-exporter render` imports this module (the SDK is a rendering dependency, never a
run-time one). Every panel id is given by the dashboard definition, so ids stay stable when
panels are added; the layout is computed here, left to right in rows of 24 columns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import (
    common as cb,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from . import style

BigValueColorMode = cm.BigValueColorMode
DATASOURCE_VAR = "datasource"
DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
WIDTH = 24


@dataclass(frozen=True)
class Q:
    """One Prometheus query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False  # tables, stats and bar gauges over the time range
    table: bool = False  # format=table (one column per label), for the fleet table


def query(q: Q, ref: str) -> prometheus.Dataquery:
    b = prometheus.Dataquery().expr(q.expr).ref_id(ref).datasource(DS)
    if q.legend:
        b = b.legend_format(q.legend)
    b = b.instant() if q.instant else b.range()
    if q.table:
        b = b.format(PromQueryFormat.TABLE)
    return b


def colour_by_thresholds() -> db.FieldColor:
    return db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)


def _colour(colour: str) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour})


def prop(id_: str, value: Any) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val=id_, value=value)


def colour_by_name(panel, colours: Mapping[str, str]):
    """Fixed colours for series whose display name is a key of `colours` (a verdict, a group)."""
    for name, colour in colours.items():
        panel = panel.override_by_name(name, [_colour(colour)])
    return panel


def value_mappings(texts: Mapping[int, tuple[str, str]]) -> list[dm.ValueMap]:
    """code -> (text, colour), as one Grafana value map."""
    return [
        dm.ValueMap(
            options={
                str(code): dm.ValueMappingResult(text=text, color=colour, index=i)
                for i, (code, (text, colour)) in enumerate(sorted(texts.items()))
            }
        )
    ]


def thresholds(base: str, *steps: tuple[float, str]) -> db.ThresholdsConfig:
    """Absolute thresholds: `base` colour below the first step."""
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps(
            [dm.Threshold(value=None, color=base)]
            + [dm.Threshold(value=v, color=c) for v, c in steps]
        )
    )


def threshold_line(panel, value: float, colour: str = style.BAD, below: str = "transparent"):
    """Draw a dashed line at `value` (a number from the thresholds file) on a time series."""
    return panel.thresholds(thresholds(below, (value, colour))).thresholds_style(
        cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED)
    )


def _common(panel, title: str, description: str, queries: Sequence[Q], unit: str | None):
    panel = panel.title(title).description(description).datasource(DS)
    for i, q in enumerate(queries):
        panel = panel.with_target(query(q, chr(ord("A") + i)))
    if unit:
        panel = panel.unit(unit)
    return panel


def _legend(
    placement=cm.LegendPlacement.BOTTOM, mode=cm.LegendDisplayMode.LIST, calcs: Iterable[str] = ()
):
    return (
        cb.VizLegendOptions()
        .show_legend(True)
        .placement(placement)
        .display_mode(mode)
        .calcs(list(calcs))
    )


def time_series(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str | None = None,
    stacked: bool = False,
    percent: bool = False,
    bars: bool = False,
    fill: int = 10,
    calcs: Iterable[str] = ("lastNotNull", "max"),
):
    p = _common(timeseries.Panel(), title, description, queries, unit)
    p = (
        p.line_width(1)
        .fill_opacity(fill)
        .span_nulls(True)
        .legend(_legend(mode=cm.LegendDisplayMode.TABLE, calcs=calcs))
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    if stacked or percent:
        p = p.stacking(
            cb.StackingConfig()
            .mode(cm.StackingMode.PERCENT if percent else cm.StackingMode.NORMAL)
            .group("A")
        ).fill_opacity(60)
    return p


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Q],
    mappings: Mapping[int, tuple[str, str]],
    row_height: float = 0.8,
):
    p = _common(statetimeline.Panel(), title, description, queries, None)
    return (
        p.mappings(value_mappings(mappings))
        .show_value(cm.VisibilityMode.AUTO)
        .merge_values(True)
        .row_height(row_height)
        .fill_opacity(85)
        .line_width(0)
        .color_scheme(
            db.FieldColor().mode(dm.FieldColorModeId.FIXED).fixed_color(style.NO_VALUE_COLOUR)
        )
        .legend(_legend())
    )


def bar_gauge(title: str, description: str, queries: Sequence[Q], unit: str | None = None):
    p = _common(bargauge.Panel(), title, description, queries, unit)
    return (
        p.display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .min(0)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def stat_panel(title: str, description: str, queries: Sequence[Q], unit: str | None = None):
    p = _common(stat.Panel(), title, description, queries, unit)
    return (
        p.color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .text_mode(cm.BigValueTextMode.AUTO)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def table_panel(title: str, description: str, queries: Sequence[Q]):
    return (
        _common(table.Panel(), title, description, queries, None)
        .align(cm.FieldTextAlignment.AUTO)
        .cell_options(cm.TableAutoCellOptions())
        .inspect(False)
        .show_header(True)
        .cell_height(cm.TableCellHeight.SM)
    )


def link(title: str, url: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(url)
        .keep_time(True)
        .include_vars(False)
    )


def said(alerts, template: str) -> str:
    """`template` filled from the thresholds file's alerts section, or '' when a key is absent."""
    try:
        return template.format_map(alerts)
    except (KeyError, ValueError):
        return ""


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

    def add(self, pid: int, panel, w: int, h: int) -> None:
        if self._x + w > WIDTH:
            self._newline()
        panel = panel.id(self._id(pid)).grid_pos(dm.GridPos(h=h, w=w, x=self._x, y=self._y))
        self.builder = self.builder.with_panel(panel)
        self._x += w
        self._line = max(self._line, h)
        if self._x >= WIDTH:
            self._newline()

    def variables(self, variables: Sequence[db.QueryVariable]) -> None:
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


def variables(project_metric: str = "rlhf_step") -> list[db.QueryVariable]:
    """datasource, then the optional cluster/namespace filters, then project and experiment."""

    def label_var(name: str, label: str, scope: str, all_value: str, description: str):
        return (
            db.QueryVariable(name)
            .label(label)
            .description(description)
            .datasource(DS)
            .query(
                f"label_values({project_metric}{{{scope}}}, {name})"
                if scope
                else f"label_values({project_metric}, {name})"
            )
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(all_value)
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )

    datasource = (
        db.DatasourceVariable(DATASOURCE_VAR)
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes rlhf-exporter.")
    )
    return [
        datasource,
        label_var(
            "cluster",
            "cluster",
            "",
            ".*",
            "Optional: a `cluster` target label. All (`.*`) also matches series without it.",
        ),
        label_var(
            "namespace",
            "namespace",
            'cluster=~"$cluster"',
            ".*",
            "Optional: a `namespace` target label. All (`.*`) also matches series without it.",
        ),
        label_var(
            "project",
            "project",
            'cluster=~"$cluster", namespace=~"$namespace"',
            ".+",
            "verl trainer.project_name.",
        ),
        label_var(
            "experiment",
            "experiment",
            'cluster=~"$cluster", namespace=~"$namespace", project=~"$project"',
            ".+",
            "verl trainer.experiment_name.",
        ),
    ]
