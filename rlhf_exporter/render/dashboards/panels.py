"""Panel helpers on top of grafana-foundation-sdk: queries, panel kinds, colours, variables.

Only `rlhf-exporter render` imports this module (the SDK is a rendering dependency, never a
run-time one). Where panels go on a dashboard is `layout`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from . import style

BigValueColorMode = cm.BigValueColorMode
DATASOURCE_VAR = "datasource"
DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
WIDTH = 24
# The SDK's panel builders share no base class that has their methods (id, grid_pos, ...).
PanelBuilder = timeseries.Panel | stat.Panel | statetimeline.Panel | bargauge.Panel | table.Panel
P = TypeVar("P", timeseries.Panel, stat.Panel, statetimeline.Panel, bargauge.Panel, table.Panel)


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


fixed_colour = _colour


def prop(id_: str, value: Any) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val=id_, value=value)


def colour_by_name(panel: P, colours: Mapping[str, str]) -> P:
    """Fixed colours for series whose display name is a key of `colours` (a verdict, a group)."""
    for name, colour in colours.items():
        panel = panel.override_by_name(name, [_colour(colour)])
    return panel


def value_mappings(texts: Mapping[int, tuple[str, str]]) -> list[dm.ValueMapping]:
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


def threshold_line(
    panel: timeseries.Panel, value: float, colour: str = style.BAD, below: str = "transparent"
) -> timeseries.Panel:
    """Draw a dashed line at `value` (a number from the thresholds file) on a time series."""
    return panel.thresholds(thresholds(below, (value, colour))).thresholds_style(
        cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED)
    )


def dashed(panel: P, name_regex: str) -> P:
    """Series whose name matches `name_regex` drawn as a dashed line, outside the stack."""
    return panel.override_by_regexp(
        name_regex,
        [
            prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
            prop("custom.fillOpacity", 0),
            prop("custom.stacking", {"group": "baseline", "mode": "none"}),
            prop("custom.lineWidth", 2),
        ],
    )


def _common(panel: P, title: str, description: str, queries: Sequence[Q], unit: str | None) -> P:
    panel = panel.title(title).description(description).datasource(DS)
    for i, q in enumerate(queries):
        panel = panel.with_target(query(q, chr(ord("A") + i)))
    if unit:
        panel = panel.unit(unit)
    return panel


def _legend(
    placement: cm.LegendPlacement = cm.LegendPlacement.BOTTOM,
    mode: cm.LegendDisplayMode = cm.LegendDisplayMode.LIST,
    calcs: Iterable[str] = (),
) -> cb.VizLegendOptions:
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
) -> timeseries.Panel:
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
) -> statetimeline.Panel:
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


def bar_gauge(
    title: str, description: str, queries: Sequence[Q], unit: str | None = None
) -> bargauge.Panel:
    p = _common(bargauge.Panel(), title, description, queries, unit)
    return (
        p.display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .min(0)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def stat_panel(
    title: str, description: str, queries: Sequence[Q], unit: str | None = None
) -> stat.Panel:
    """A number now: its queries are instant (one evaluation, not one per point of a range
    that the panel reduces to its last value anyway)."""
    instant = [Q(q.expr, q.legend, instant=True, table=q.table) for q in queries]
    p = _common(stat.Panel(), title, description, instant, unit)
    return (
        p.color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .text_mode(cm.BigValueTextMode.AUTO)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def table_panel(title: str, description: str, queries: Sequence[Q]) -> table.Panel:
    return (
        _common(table.Panel(), title, description, queries, None)
        .align(cm.FieldTextAlignment.AUTO)
        .cell_options(cm.TableAutoCellOptions())
        .inspect(False)
        .show_header(True)
        .cell_height(cm.TableCellHeight.SM)
    )


def said(alerts: Mapping[str, Any], template: str) -> str:
    """`template` filled from the thresholds file's alerts section, or '' when a key is absent."""
    try:
        return template.format_map(alerts)
    except (KeyError, ValueError):
        return ""


def variables(
    project_metric: str = "rlhf_step", single_job: bool = False
) -> list[db.QueryVariable | db.DatasourceVariable]:
    """datasource, then the optional cluster/namespace filters, then project and experiment.
    `single_job`: project and experiment pick exactly one value (no "All"), so a bare link
    opens one job, never a sum of unrelated ones."""

    def label_var(
        name: str, label: str, scope: str, all_value: str, description: str
    ) -> db.QueryVariable:
        v = (
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
        )
        if single_job and name in ("project", "experiment"):
            return v.multi(False).include_all(False)
        return (
            v.multi(True)
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
            "verl trainer.project_name." + (" One job at a time." if single_job else ""),
        ),
        label_var(
            "experiment",
            "experiment",
            'cluster=~"$cluster", namespace=~"$namespace", project=~"$project"',
            ".+",
            "verl trainer.experiment_name.",
        ),
    ]
