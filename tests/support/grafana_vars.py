"""Grafana's template variables in a dashboard query, replaced so that Prometheus (or
VictoriaMetrics) can run it: every test and bench that runs the shipped panels' PromQL.
Also every panel of a dashboard, the collapsed rows' own panels included."""

from __future__ import annotations

from typing import Any


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A dashboard's panels, each collapsed row followed by the panels it holds."""
    return [q for p in doc["panels"] for q in (p, *p.get("panels", []))]


def substitute(
    expr: str,
    *,
    rate_interval: str = "1m",
    interval: str = "15s",
    range_: str = "1h",
    project: str = ".*",
    experiment: str = ".*",
) -> str:
    """`expr` with $__rate_interval, $__interval, $__range, $cluster, $namespace ($cluster
    and $namespace: every one), $project and $experiment replaced; a variable left over
    fails (a panel using one this does not know)."""
    values = {
        "$__rate_interval": rate_interval,
        "$__interval": interval,
        "$__range": range_,
        "$cluster": ".*",
        "$namespace": ".*",
        "$project": project,
        "$experiment": experiment,
    }
    for var in sorted(values, key=len, reverse=True):  # longest first: no prefix is cut
        expr = expr.replace(var, values[var])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr
