"""Two clusters in one store stay apart (issue 49): every join and aggregation keeps `cluster`.

A fleet remote-writes many clusters' Prometheus servers into one store, each with its own
`cluster` external label. Two clusters may both run `grpo/exp1` (or two namespaces of one
cluster), and two clusters may reuse a pod address (`instance`). A `by (project,
experiment)` or an `on (job, instance)` would merge them into one row, or join one cluster's
series to the other's. Every PromQL expression of the shipped rules (alerts/*.rules.yaml) and
dashboards (grafana/*.json) is parsed (promql_parser) and its groupings checked:

- a `by (...)`/`on (...)` that names a job (`project`, `experiment`) also names `cluster` and
  `namespace`; one that names a scrape target or a GPU (`job`, `instance`, `pod`, `uuid`,
  `gpu`, `collector`) also names `cluster`;
- no `without (...)`/`ignoring (...)` drops `cluster` or `namespace`;
- a rule's `by (...)` always names `cluster` (vmalert evaluates the rules over every cluster's
  series at once; each cluster's own Prometheus records the same output with its external
  label), and a rule aggregates nothing to one fleet-wide number.

Documented exceptions (`FLEET_WIDE`): the dashboards' fleet totals (`count by (verdict)`,
`sum by (group)`, a bare `count(...)`) sum over the clusters the `$cluster` variable selects,
on purpose: they name no job and no target. Alert annotation templates (`query` in
`description`) are not parsed here. `absent(up{...})` (RLHFExporterAbsent) is a function, not
a grouping: evaluated centrally it fires only when no cluster has an exporter (docs/fleet.md).

An absent `cluster` label groups as empty, so a single-cluster install keeps one series per
job: the promtool cases of tests/test_rules.py run these same rules on series without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import promql_parser
import pytest
import yaml

from rlhf_exporter.render import repo_root
from rlhf_exporter.render.addresses import FLEET_PATH, JOB_PATH
from tests.support import grafana_vars

ROOT = repo_root()
JOB_LABELS = {"project", "experiment"}
TARGET_LABELS = {"job", "instance", "pod", "uuid", "gpu", "collector"}
KEPT = {"cluster", "namespace"}
# Aggregations whose grouping names neither a job nor a target: fleet totals over the
# selected clusters (dashboards only). A rule never aggregates across clusters.
FLEET_WIDE = {"verdict", "group", "gpu_role", "role", "state", "reason", "phase", "alertname"}


def rule_exprs() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                yield f"{path.name} {name}", rule["expr"]


def dashboard_exprs(rel: str) -> Iterator[tuple[str, str]]:
    doc = json.loads((ROOT / rel).read_text())

    def walk(node: object, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            where = str(node.get("title", where))
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    yield where, value
                else:
                    yield from walk(value, where)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    for where, expr in walk(doc, rel):
        yield f"{Path(rel).name} {where!r}", grafana_vars.substitute(expr)


def groupings(expr: str) -> Iterator[tuple[str, list[str]]]:
    """(kind, labels) of every grouping in `expr`: kind is by, without, on, ignoring, or
    `bare` for an aggregation without one (labels empty); topk/bottomk keep their series and
    are left out when bare."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            mod = node.modifier
            if mod is None:
                if str(node.op) not in ("topk", "bottomk"):
                    found.append(("bare", []))
            else:
                kind = "by" if mod.type == promql_parser.AggModifierType.By else "without"
                found.append((kind, list(mod.labels)))
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                include = matching.type == promql_parser.LabelModifierType.Include
                found.append(("on" if include else "ignoring", list(matching.labels)))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return iter(found)


def problems(expr: str, *, rule: bool) -> list[str]:
    """What in `expr` would merge two clusters (or two namespaces) or join across them."""
    out = []
    for kind, labels in groupings(expr):
        have = set(labels)
        shown = f"{kind} ({', '.join(labels)})"
        if kind in ("without", "ignoring"):
            if have & KEPT:
                out.append(f"{shown} drops {sorted(have & KEPT)}")
            continue
        if kind == "bare":
            if rule:
                out.append("an aggregation without `by`/`without` merges every cluster")
            continue
        if have & JOB_LABELS and not have >= KEPT:
            out.append(f"{shown} names a job without {sorted(KEPT - have)}")
        elif have & TARGET_LABELS and "cluster" not in have:
            out.append(f"{shown} names a target without cluster")
        elif rule and "cluster" not in have:
            out.append(f"{shown}: a rule's grouping without cluster")
        elif not have & (JOB_LABELS | TARGET_LABELS | KEPT) and not have <= FLEET_WIDE:
            out.append(f"{shown}: neither a job, a target nor a documented fleet total")
    return out


def test_the_checker_catches_what_merges_clusters():
    """The check itself: the groupings the fleet dashboard shipped before issue 49 fail, and
    their fixed forms pass."""
    bad = {
        "max by (project, experiment) (rlhf_step)": "names a job",
        "x and on (project, experiment) topk(10, y)": "names a job",
        "x unless on (namespace, project, experiment, job, instance) y": "names a job",
        "x unless on (job, instance) (rlhf_job_state == 1)": "names a target",
        "sum by (instance, collector) (rate(rlhf_exporter_records_total[1m]))": "target",
        "sum without (cluster, instance) (x)": "drops",
        "x / ignoring (namespace) y": "drops",
        "max by (xid) (x)": "neither",
    }
    for expr, why in bad.items():
        found = problems(expr, rule=False)
        assert found and why in found[0], (expr, found)
    assert "a rule's grouping without cluster" in problems("sum by (group) (x)", rule=True)[0]
    assert problems("sum(x)", rule=True) and not problems("sum(x)", rule=False)
    good = [
        "max by (cluster, namespace, project, experiment) (rlhf_step)",
        "x unless on (cluster, job, instance) y",
        "sum by (verdict) (x)",
        "topk(10, x)",
        "sum without (instance, pod) (x) / ignoring (verdict) group_left () y",
    ]
    for expr in good:
        assert not problems(expr, rule=False), expr


def test_every_rule_keeps_clusters_apart():
    found = {where: p for where, expr in rule_exprs() if (p := problems(expr, rule=True))}
    assert not found, json.dumps(found, indent=1)


@pytest.mark.parametrize("rel", [FLEET_PATH, JOB_PATH])
def test_every_dashboard_query_keeps_clusters_apart(rel):
    found = {}
    for where, expr in dashboard_exprs(rel):
        if p := problems(expr, rule=False):
            found.setdefault(where, []).extend(p)
    assert not found, json.dumps(found, indent=1)


@pytest.mark.parametrize("rel", [FLEET_PATH, JOB_PATH])
def test_every_dashboard_selector_obeys_the_cluster_and_namespace_variables(rel):
    """A series selected without `$cluster`/`$namespace` would show the other clusters'
    series whatever the variables say (the job dashboard included: issue 49)."""
    doc = json.loads((ROOT / rel).read_text())
    raw = [t["expr"] for p in _panels(doc) for t in p.get("targets", [])]
    raw += [a["expr"] for a in doc["annotations"]["list"] if "expr" in a]
    assert raw
    for expr in raw:
        marked = expr.replace('"$cluster"', '"CLUSTERVAR"').replace('"$namespace"', '"NSVAR"')
        for vs in _selectors(grafana_vars.substitute(marked)):
            got = {(m.name, m.value) for m in vs.matchers.matchers}
            assert {("cluster", "CLUSTERVAR"), ("namespace", "NSVAR")} <= got, (vs.name, expr)


def _selectors(expr: str) -> list[promql_parser.VectorSelector]:
    seen: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            seen.append(node)
        elif isinstance(node, promql_parser.MatrixSelector):
            seen.append(node.vector_selector)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return seen


def _panels(doc: dict) -> list[dict]:
    out = []
    for p in doc["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out
