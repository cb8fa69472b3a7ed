"""The Grafana dashboards (grafana/*.json): generated, committed, well formed, honest PromQL.

Metric names are checked against the exporter's catalog and the recording rules that
alerts/*.yaml defines, both read from the code and the rule files at test time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import promql_parser
import pytest
import yaml

from rlhf_exporter.diagnosis import CHANGES, VERDICTS, Thresholds
from rlhf_exporter.metrics.catalog import BY_NAME, NAMES
from rlhf_exporter.render import repo_root
from rlhf_exporter.render.addresses import FLEET_PATH, JOB_PATH
from rlhf_exporter.render.dashboards import targets
from rlhf_exporter.render.dashboards.style import CHANGE_COLOURS, VERDICT_COLOURS
from rlhf_exporter.thresholds_file import default_document
from tests.support import grafana_vars

ROOT = repo_root()
PATHS = (JOB_PATH, FLEET_PATH)
TARGET_LABELS = {"cluster", "namespace", "job", "instance", "pod"}  # added by Prometheus
# Prometheus's own series for alert state; the fleet table counts firing alerts per job.
PROMETHEUS_SERIES = {"ALERTS": {"alertname", "alertstate", "severity", "project", "experiment"}}


def recording_rules() -> dict[str, set[str] | None]:
    """record name -> None (labels unknown) for every rule in alerts/*.yaml."""
    out: dict[str, set[str] | None] = {}
    for path in sorted((ROOT / "alerts").glob("*.y*ml")):
        doc = yaml.safe_load(path.read_text()) or {}
        for group in doc.get("groups", []) if isinstance(doc, dict) else []:
            for rule in group.get("rules", []):
                if "record" in rule:
                    out[rule["record"]] = None
    return out


@pytest.fixture(scope="module")
def generated(thresholds):
    return targets(thresholds)


@pytest.fixture(scope="module", params=PATHS)
def board(request, generated):
    return request.param, json.loads(generated[request.param])


def panels(board: dict) -> list[dict]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def substitute(expr: str) -> str:
    return grafana_vars.substitute(expr, interval="30s", project=".+", experiment=".+")


def exprs(board: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation."""
    out = [
        (f"panel {p['id']} {t['refId']}", t["expr"])
        for p in panels(board)
        for t in p.get("targets", [])
    ]
    out += [(f"annotation {a['name']}", a["expr"]) for a in board["annotations"]["list"]]
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
            assert m, (
                f"variable {v['name']}: expected label_values(selector, label), got {v['query']!r}"
            )
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        elif isinstance(node, promql_parser.MatrixSelector):
            found.append(node.vector_selector)

    promql_parser.walk(promql_parser.parse(substitute(expr)), visit)
    return found


def test_output_is_the_same_in_other_processes(tmp_path, generated):
    """Fresh interpreters with other hash seeds write the same bytes as this one, so no
    output depends on the iteration order of a set of strings. (Seeds 0, 1 and 3 order even
    a three-string set three different ways.) Whether the committed files are current is
    test_render's one check."""
    for seed in ("0", "1", "3"):
        root = tmp_path / seed
        out = subprocess.run(
            [sys.executable, "-m", "rlhf_exporter", "render", "dashboards", "--root", str(root)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        for rel, text in generated.items():
            assert (root / rel).read_text(encoding="utf-8") == text, f"seed {seed}: {rel}"


def test_output_is_canonical_json(generated):
    for text in generated.values():
        assert (
            text
            == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        )


def test_ids_are_unique_and_every_target_has_a_ref_id(board):
    name, doc = board
    ids = [p["id"] for p in panels(doc)]
    assert all(isinstance(i, int) and i > 0 for i in ids), ids
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    for p in panels(doc):
        if p["type"] == "row":
            continue
        refs = [t.get("refId") for t in p["targets"]]
        assert p["targets"], f"{name} panel {p['id']} has no query"
        assert all(refs) and len(refs) == len(set(refs)), f"{name} panel {p['id']}: refIds {refs}"


def test_ids_are_stable(generated):
    """Ids follow from each row's number (row + position): a link to ?viewPanel=301 keeps working."""
    job = json.loads(generated[JOB_PATH])
    by_id = {p["id"]: p["title"] for p in panels(job)}
    assert by_id[101] == "Verdict and reason over time"
    assert by_id[301] == "Throughput"


def test_grid_positions_do_not_overlap(board):
    name, doc = board
    boxes = [(p["id"], p["gridPos"]) for p in panels(doc)]
    for pid, g in boxes:
        assert (
            g["x"] >= 0 and g["y"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24
        ), (pid, g)
    for (a, ga), (b, gb) in combinations(boxes, 2):
        apart = (
            ga["x"] + ga["w"] <= gb["x"]
            or gb["x"] + gb["w"] <= ga["x"]
            or ga["y"] + ga["h"] <= gb["y"]
            or gb["y"] + gb["h"] <= ga["y"]
        )
        assert apart, f"{name}: panels {a} {ga} and {b} {gb} overlap"


def test_datasource_variable_everywhere_and_no_hard_coded_uid(board):
    name, doc = board
    seen = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "datasource":
                    seen.append((path, v))
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(doc, "")
    for path, ds in seen:
        if path.startswith(".templating") and not isinstance(ds, dict):
            continue
        assert isinstance(ds, dict) and ds.get("uid") == "${datasource}", (
            f"{name}{path}: datasource {ds}"
        )
    for p in panels(doc):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    var = {v["name"]: v for v in doc["templating"]["list"]}
    assert var["datasource"]["type"] == "datasource" and var["datasource"]["query"] == "prometheus"
    assert "uid" not in json.dumps(var["datasource"])


def test_variables(board):
    name, doc = board
    var = {v["name"]: v for v in doc["templating"]["list"]}
    assert list(var) == ["datasource", "cluster", "namespace", "project", "experiment"]
    for n in ("project", "experiment"):
        if name == JOB_PATH:  # one job: a bare link never sums unrelated jobs' step times
            assert not var[n]["multi"] and not var[n]["includeAll"], n
            assert "allValue" not in var[n] and not var[n].get("current"), n
        else:
            assert var[n]["multi"] and var[n]["includeAll"], n
    for n in ("cluster", "namespace"):
        # "All" must also match series that have no such target label at all
        assert var[n]["includeAll"] and re.fullmatch(var[n]["allValue"], ""), n


def test_every_query_parses_and_names_only_known_series(board):
    name, doc = board
    rules = recording_rules()
    known = set(NAMES) | set(rules) | set(PROMETHEUS_SERIES)
    for where, expr in exprs(doc):
        try:
            found = selectors(expr)
        except Exception as exc:  # promql_parser raises ValueError on syntax errors
            pytest.fail(f"{name} {where}: does not parse: {exc}\n{expr}")
        assert found, f"{name} {where}: selects no series"
        for vs in found:
            assert vs.name in known, f"{name} {where}: unknown series {vs.name!r}"
            if vs.name in BY_NAME:
                allowed = set(BY_NAME[vs.name].labels) | TARGET_LABELS
            elif vs.name in PROMETHEUS_SERIES:
                allowed = PROMETHEUS_SERIES[vs.name] | TARGET_LABELS
            else:
                continue  # a recording rule: its labels are the rule's business
            for m in vs.matchers.matchers:
                assert m.name in allowed, f"{name} {where}: {vs.name} has no label {m.name!r}"


def test_label_values_in_matchers_exist():
    """Matchers on verdict/kind/group name values the decision table really produces."""
    from rlhf_exporter.diagnosis import GROUPS, REASONS

    allowed = {
        "verdict": set(VERDICTS),
        "kind": set(CHANGES),
        "group": set(GROUPS),
        "reason": {r for rs in REASONS.values() for r in rs},
    }
    for rel in PATHS:
        doc = json.loads((ROOT / rel).read_text())
        for where, expr in exprs(doc):
            for vs in selectors(expr):
                for m in vs.matchers.matchers:
                    # a GPU series' `reason` is NVML's (error or throttle reason), not the
                    # decision table's: tests/test_nvml_source.py checks those names
                    if m.name == "reason" and vs.name.startswith("rlhf_gpu_"):
                        continue
                    if m.name in allowed and vs.name.startswith("rlhf_"):
                        values = m.value.split("|")
                        assert set(values) <= allowed[m.name], f"{rel} {where}: {m.name}={m.value}"


def test_every_panel_explains_itself(board):
    name, doc = board
    for p in panels(doc):
        if p["type"] != "row":
            assert len(p.get("description", "")) >= 60, f"{name} panel {p['id']} {p['title']!r}"
            assert p["title"]


def _colours_for(doc: dict, names: set[str]) -> dict[str, set[str]]:
    """Every colour given to one of `names` by a value mapping or a by-name override."""
    out: dict[str, set[str]] = {}
    for p in panels(doc):
        fc = p.get("fieldConfig", {})
        mapping_lists = [fc.get("defaults", {}).get("mappings", [])]
        for o in fc.get("overrides", []):
            for prop in o["properties"]:
                if prop["id"] == "mappings":
                    mapping_lists.append(prop["value"])
                if prop["id"] == "color" and o["matcher"]["options"] in names:
                    out.setdefault(o["matcher"]["options"], set()).add(prop["value"]["fixedColor"])
        for mappings in mapping_lists:
            for m in mappings:
                for result in m.get("options", {}).values():
                    if result.get("text") in names:
                        out.setdefault(result["text"], set()).add(result["color"])
    return out


def test_a_verdict_has_one_colour_on_both_dashboards(generated):
    colours: dict[str, set[str]] = {}
    for rel in PATHS:
        found = _colours_for(json.loads(generated[rel]), set(VERDICTS))
        assert set(found) == set(VERDICTS), (
            f"{rel}: verdicts without a colour: {set(VERDICTS) - set(found)}"
        )
        for v, cs in found.items():
            colours.setdefault(v, set()).update(cs)
    assert colours == {v: {VERDICT_COLOURS[v]} for v in VERDICTS}
    assert len(set(VERDICT_COLOURS.values())) == len(VERDICTS), "two verdicts share a colour"
    changes = _colours_for(json.loads(generated[JOB_PATH]), set(CHANGES))
    assert changes == {c: {CHANGE_COLOURS[c]} for c in CHANGES}


def test_job_dashboard_covers_the_issue(generated):
    titles = {p["title"] for p in panels(json.loads(generated[JOB_PATH]))}
    for needed in (
        "Verdict and reason over time",
        "Step time by decision-table group",
        "Share of the step per group",
        "Throughput",
        "Tokens per step",
        "Cost per token by group against the baseline",
        "MFU by stage",
        "Agent loop: generate_sequences max and mean",
        "Preemptions",
        "Tool and score time per sample",
        "Weight-sync time",
        "Untimed remainder",
        "GPU busy ratio",
        "GPU memory used per GPU",
        "GPU memory by role",
        "Ray actors by role and state",
        "Collector up",
    ):
        assert needed in titles, needed


def test_fleet_table_links_each_job_to_the_job_dashboard(generated):
    fleet = json.loads(generated[FLEET_PATH])
    job = json.loads(generated[JOB_PATH])
    table = next(p for p in panels(fleet) if p["type"] == "table")
    links = [
        prop["value"]
        for o in table["fieldConfig"]["overrides"]
        for prop in o["properties"]
        if prop["id"] == "links"
    ]
    assert links, "the jobs table has no data links"
    url = links[0][0]["url"]
    assert url.startswith(f"/d/{job['uid']}/")
    assert (
        "var-project=${__data.fields.project}" in url
        and "var-experiment=${__data.fields.experiment}" in url
    )
    renamed = next(t for t in table["transformations"] if t["id"] == "organize")["options"][
        "renameByName"
    ]
    assert {f"Value #{t['refId']}" for t in table["targets"]} == set(renamed)
    assert all(t["format"] == "table" and t["instant"] for t in table["targets"])
    for needed in (
        "verdict",
        "reason",
        "throughput",
        "step time",
        "since last step",
        "GPU busy",
        "firing alerts",
    ):
        assert needed in renamed.values(), needed


def _threshold_steps(doc: dict, pid: int) -> list:
    p = next(p for p in panels(doc) if p["id"] == pid)
    return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_threshold_lines_follow_the_thresholds_file():
    custom = Thresholds.from_documents(
        default_document(),
        {
            "verdict": {"min_share": 0.42},
            "change": {"cost_ratio": 1.5},
            "reason": {"mfu_compute_bound": 0.25},
            "alerts": {"gpu_idle_ratio": 0.2},
        },
    )
    job = json.loads(targets(custom)[JOB_PATH])
    assert 0.42 in _threshold_steps(job, 202)
    assert 1.5 in _threshold_steps(job, 306)
    assert 0.25 in _threshold_steps(job, 401)
    assert 0.2 in _threshold_steps(job, 601)
    assert "0.42" in next(p for p in panels(job) if p["id"] == 202)["description"]


def test_serving_never_imports_the_grafana_sdk():
    """The SDK is a render-time dependency: serve, diagnose and --help work without it."""
    code = (
        "import sys; sys.modules['grafana_foundation_sdk'] = None\n"
        "import rlhf_exporter.render.dashboards, rlhf_exporter.cli\n"
        "from rlhf_exporter.render import generators; generators()\n"
        "try:\n    rlhf_exporter.cli.main(['--help'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr


def test_rendering_without_the_sdk_says_what_to_install():
    code = (
        "import sys; sys.modules['grafana_foundation_sdk'] = None\n"
        "from rlhf_exporter.thresholds_file import load_thresholds\n"
        "from rlhf_exporter.render.dashboards import targets\n"
        "targets(load_thresholds())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode != 0 and "grafana-foundation-sdk" in out.stderr


# ------------------------------------------------------------------------------------------
# Grafana 11.6's own schema (tests/fixtures/grafana-schema: generated from npm @grafana/schema)

SCHEMA = Path(__file__).parent / "fixtures" / "grafana-schema" / "grafana-11.6.0.schema.json"
PANEL_SCHEMA_KEY = {"state-timeline": "statetimeline"}


@pytest.fixture(scope="module")
def grafana_schema():
    doc = json.loads(SCHEMA.read_text())
    # The TypeScript type closes AnnotationQuery, but Grafana's CUE schema leaves it open
    # ("unless datasources have migrated to the target+mapping, they just spread their query
    # into the base object"): a Prometheus annotation's expr/step/titleFormat live there.
    doc["dashboard"]["definitions"]["AnnotationQuery"]["additionalProperties"] = True
    return doc


def _errors(schema: dict, instance, partial: bool = False) -> list[str]:
    import jsonschema

    out = []
    for e in jsonschema.Draft7Validator(schema).iter_errors(instance):
        if partial and e.validator == "required":
            continue  # an override sets one property, not all of them
        out.append(f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}")
    return out


def test_dashboards_match_grafana_11_6_schema(board, grafana_schema):
    name, doc = board
    errors = _errors(grafana_schema["dashboard"], doc)
    for p in panels(doc):
        if p["type"] == "row":
            continue
        schemas = grafana_schema["panels"][PANEL_SCHEMA_KEY.get(p["type"], p["type"])]
        errors += [
            f"panel {p['id']} options {e}" for e in _errors(schemas["options"], p["options"])
        ]
        if "fieldConfig" in schemas:
            custom = p["fieldConfig"]["defaults"].get("custom", {})
            errors += [
                f"panel {p['id']} custom {e}" for e in _errors(schemas["fieldConfig"], custom)
            ]
            for o in p["fieldConfig"]["overrides"]:
                for prop in o["properties"]:
                    if prop["id"].startswith("custom."):
                        partial = {prop["id"][len("custom.") :]: prop["value"]}
                        errors += [
                            f"panel {p['id']} override {prop['id']} {e}"
                            for e in _errors(schemas["fieldConfig"], partial, partial=True)
                        ]
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_schema_check_catches_a_wrong_field(grafana_schema, generated):
    doc = json.loads(generated[JOB_PATH])
    assert not _errors(grafana_schema["dashboard"], doc)
    doc["panels"][1]["gridPos"]["w"] = "wide"
    doc["graphTooltip"] = "crosshair"
    errors = _errors(grafana_schema["dashboard"], doc)
    assert any(e.startswith("panels/1:") for e in errors), errors
    assert any(e.startswith("graphTooltip:") for e in errors), errors
    options = grafana_schema["panels"]["timeseries"]["options"]
    assert _errors(
        options,
        {
            "legend": {"showLegend": True, "displayMode": "list", "placement": "top", "calcs": []},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    )


# ------------------------------------------------------------------------------------------
# Alerts and dashboards (issue 24)


def shipped_alerts() -> list[str]:
    """Every alert of the rendered rule files (alerts/*.rules.yaml)."""
    names = []
    for path in sorted((ROOT / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [r["alert"] for r in group["rules"] if "alert" in r]
    return names


def panel_by_title(doc: dict, title: str) -> dict:
    (p,) = [p for p in panels(doc) if p.get("title") == title]
    return p


def test_firing_alerts_counts_every_alert_the_bundle_ships(generated, tmp_path):
    """The fleet's "Firing alerts" names exactly the shipped alerts, and counts job-less
    ones (exporter, Ray) with the jobs' ones; pending alerts and other bundles' do not count
    (promtool evaluates the panel's own query)."""
    fleet = json.loads(generated[FLEET_PATH])
    (target,) = panel_by_title(fleet, "Firing alerts")["targets"]
    named = set()
    for sel in selectors(target["expr"]):
        for m in sel.matchers.matchers:
            if m.name == "alertname":
                named.add(frozenset(m.value.split("|")))
    assert named == {frozenset(shipped_alerts())}, named
    assert len(shipped_alerts()) >= 15

    def alert(name: str, state: str = "firing", **labels: str) -> dict:
        inner = ", ".join(f'{k}="{v}"' for k, v in {**labels, "alertname": name}.items())
        return {"series": f'ALERTS{{alertstate="{state}", {inner}}}', "values": "1x5"}

    inputs = [
        alert("RLHFJobStalled", project="p", experiment="e", severity="critical"),
        alert("RLHFExporterDown", instance="i:1", severity="warning"),
        alert("RLHFRayActorsDied", instance="i:1", role="trainer", severity="critical"),
        alert("RLHFExporterAbsent", severity="warning"),
        alert("RLHFJobRegression", "pending", project="p", experiment="e"),
        alert("KubePodCrashLooping", namespace="ns", severity="warning"),
    ]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": substitute(target["expr"]),
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": 4}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "firing.test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_job_dashboard_shows_the_jobs_alerts_as_annotations(generated):
    job = json.loads(generated[JOB_PATH])
    (a,) = [a for a in job["annotations"]["list"] if a["name"] == "Alerts"]
    (sel,) = selectors(a["expr"])
    matchers = {m.name: m.value for m in sel.matchers.matchers}
    assert sel.name == "ALERTS" and matchers["alertstate"] == "firing"
    assert matchers["project"] == ".+" and matchers["experiment"] == ".+"  # the job's variables
    assert a["expr"].count("$project") == 1 and "{{alertname}}" in a["titleFormat"]
