"""The Helm chart (helm/rlhf-exporter) and its examples, rendered by the real Helm v4 engine.

Helm runs in-process through PyPI helm-python-sdk (Helm's Go library, offline; no helm binary).
Core objects are checked with kubernetes-validate --strict (a missing schema fails), the
prometheus-operator objects with the cloudcoil models plus a check that the models dropped no
field (they ignore unknown ones), and the fields that matter are asserted one by one.
The rules and dashboards compared are the repository's own alerts/ and grafana/ files.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
prometheus_operator = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")

import rlhf_exporter  # noqa: E402
from rlhf_exporter import cli, options, settings  # noqa: E402
from rlhf_exporter.render import chart as chart_render  # noqa: E402
from rlhf_exporter.thresholds_file import load_thresholds  # noqa: E402
from tests.support import rendered_pods  # noqa: E402
from tests.support.chart import (  # noqa: E402
    CHART,
    EXAMPLE,
    NAMESPACE,
    RELEASE,
    container,
    copy_example,
    kinds,
    only,
    rayjob_of,
    render,
)
from tests.support.rendered_pods import ray_pod_templates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STANDALONE_VALUES = ROOT / "examples" / "standalone-values.yaml"
SHARED_VALUES = ROOT / "examples" / "shared-values.yaml"
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yaml"))
DASHBOARD_FILES = sorted((ROOT / "grafana").glob("*.json"))
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version() + ".0")
MONITORING = {
    "PodMonitor": prometheus_operator.PodMonitor,
    "ServiceMonitor": prometheus_operator.ServiceMonitor,
    "PrometheusRule": prometheus_operator.PrometheusRule,
}


# ---------------------------------------------------------------------------- helpers


def contained(small, big, where="") -> list[str]:
    """Paths of `small` that `big` lacks or holds differently (a model that dropped a field)."""
    if isinstance(small, dict) and isinstance(big, dict):
        out = []
        for key, value in small.items():
            if key not in big:
                out.append(f"{where}.{key}")
            else:
                out += contained(value, big[key], f"{where}.{key}")
        return out
    if isinstance(small, list) and isinstance(big, list) and len(small) == len(big):
        return [
            p for i, (a, b) in enumerate(zip(small, big)) for p in contained(a, b, f"{where}[{i}]")
        ]
    return [] if small == big else [where or "."]


def validate_pod_template(template: dict, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **template.get("metadata", {})},
        "spec": template["spec"],
    }
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)


def validate(obj: dict) -> None:
    """Core kinds: kubernetes-validate --strict (SchemaNotFoundError fails the test).
    prometheus-operator kinds: the cloudcoil model, and no field dropped by it.
    KubeRay kinds: every pod template as a core Pod."""
    api = obj["apiVersion"]
    if api.startswith("monitoring.coreos.com/"):
        model = MONITORING[obj["kind"]].model_validate(obj)
        dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
        assert contained(obj, dumped) == [], f"{obj['kind']} has fields the CRD does not know"
    elif api.startswith("ray.io/"):
        for name, template in ray_pod_templates(obj).items():
            validate_pod_template(template, name)
    else:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def serve_settings(ctr: dict, labels: dict | None = None, namespace: str = "ray-jobs"):
    """The exporter's Settings as Kubernetes would start this container: env with $(VAR)
    expansion and downward-API fields, then `rlhf-exporter <args>` parsed by the real CLI."""
    any_secret: defaultdict[str, str] = defaultdict(lambda: "a-secret-token")
    env = rendered_pods.pod_env(ctr, labels or {}, namespace, any_secret)
    known = {settings.env_name(o) for o in options.OPTIONS}
    unknown = sorted(k for k in env if k.startswith(settings.ENV_PREFIX) and k not in known)
    assert unknown == [], f"variables that `serve` does not know: {unknown}"
    args = cli.build_parser().parse_args(ctr["args"])
    assert args.command == "serve"
    return settings.resolve(args, environ=env), env


SIDECAR_ONLY_OFF = "RLHFExporterAbsent"  # the chart leaves it out in sidecar mode (issue 22)


def alert_groups(sidecar: bool = True) -> list[dict]:
    """The rule files' groups, as the chart renders them in sidecar mode (the default)."""
    groups = []
    for path in RULE_FILES:
        groups += (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups") or []
    if sidecar:
        for g in groups:
            g["rules"] = [r for r in g["rules"] if r.get("alert") != SIDECAR_ONLY_OFF]
    return groups


def alert_names() -> list[str]:
    return [r["alert"] for g in alert_groups() for r in g.get("rules", []) if "alert" in r]


def expected_kinds(
    *,
    workload: dict | None = None,
    monitor: str | None = "PodMonitor",
    service: bool = True,
    rules: bool = True,
    dashboards: bool = True,
) -> Counter:
    want = Counter(workload or {})
    if service:
        want["Service"] += 1
    if monitor:
        want[monitor] += 1
    if rules and alert_groups():
        want["PrometheusRule"] += 1
    if dashboards and DASHBOARD_FILES:
        want["ConfigMap"] += len(DASHBOARD_FILES)
    return +want


STANDALONE = {"mode": "standalone", "standalone": {"logs": {"existingClaim": "verl-logs"}}}


def all_features() -> dict:
    values = {
        "mode": "standalone",
        "commonLabels": {"team": "rl"},
        "image": {
            "repository": "registry.example.com/rlhf-exporter",
            "tag": "0.1.0-test",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "logFormat": "text",
        "logLevel": "debug",
        "extraEnv": [{"name": "RLHF_EXPORTER_RAY_PER_CLASS", "value": "true"}],
        "extraArgs": ["--verl-interval", "2"],
        "push": {"enabled": True, "tokenSecret": {"name": "push-token", "key": "token"}},
        "standalone": {
            "logs": {"existingClaim": "verl-logs", "subPath": "jobs", "mountPath": "/logs"},
            "rayAddress": "http://ray-cluster-head-svc.ray.svc:8265",
            "podAnnotations": {"example.com/owner": "rl-infra"},
            "podLabels": {"tier": "observability"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "obs", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/arch",
                                        "operator": "In",
                                        "values": ["amd64"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "priorityClassName": "observability",
            "serviceAccount": {"create": True, "name": "rlhf-exporter-sa", "automountToken": False},
        },
        "service": {
            "enabled": True,
            "type": "ClusterIP",
            "annotations": {"example.com/note": "metrics"},
        },
        "monitor": {
            "kind": "ServiceMonitor",
            "interval": "30s",
            "scrapeTimeout": "20s",
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "relabelings": [{"targetLabel": "cluster", "replacement": "training-a"}],
            "metricRelabelings": [
                {"sourceLabels": ["__name__"], "regex": "rlhf_debug_.*", "action": "drop"}
            ],
            "namespaceSelector": {"matchNames": [NAMESPACE, "ray-jobs"]},
        },
        "prometheusRule": {
            "enabled": True,
            "additionalLabels": {"release": "kube-prometheus-stack"},
        },
        "dashboards": {
            "enabled": True,
            "label": "grafana_dashboard",
            "labelValue": "1",
            "folderAnnotation": "grafana_folder",
            "folder": "RLHF training",
            "namespace": "grafana",
            "extraLabels": {"team": "rl"},
        },
    }
    names = alert_names()
    if names:
        values["prometheusRule"]["alerts"] = {names[0]: {"severity": "page", "for": "10m"}}
    return values


@pytest.fixture(scope="module")
def example_chart(tmp_path_factory) -> Path:
    """The example RayJob chart with this chart in its charts/ (tests/support/chart.py)."""
    return copy_example(tmp_path_factory)


def example_values(**exporter_values) -> dict:
    return {"rlhf-exporter": exporter_values} if exporter_values else {}


# ---------------------------------------------------------------------------- the chart itself


def test_chart_metadata_matches_the_package():
    with helm.Chart.load(str(CHART)) as loaded:
        meta = loaded.metadata
        schema = loaded.schema
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "rlhf-exporter"
    assert meta["appVersion"] == rlhf_exporter.__version__
    assert schema["additionalProperties"] is False


def test_chart_copies_rule_files_and_dashboards_only(tmp_path):
    """copies() of a made-up checkout: rule files and dashboards, verbatim, nothing else.
    (Whether the committed copies are current is test_render's one staleness check.)"""
    (tmp_path / "alerts").mkdir()
    (tmp_path / "grafana").mkdir()
    (tmp_path / "alerts" / "x.rules.yaml").write_text("groups: []  # x\n")
    (tmp_path / "alerts" / "alertmanager.example.yaml").write_text("route: {}\n")  # not rules
    (tmp_path / "grafana" / "d.json").write_text('{"title": "d"}\n')
    (tmp_path / "grafana" / "notes.md").write_text("not a dashboard\n")
    assert chart_render.copies(tmp_path) == {
        "helm/rlhf-exporter/files/alerts/x.rules.yaml": "groups: []  # x\n",
        "helm/rlhf-exporter/files/grafana/d.json": '{"title": "d"}\n',
    }
    assert chart_render.orphans(tmp_path) == []
    orphan = tmp_path / "helm" / "rlhf-exporter" / "files" / "grafana" / "gone.json"
    orphan.parent.mkdir(parents=True)
    orphan.write_text("{}\n")
    assert chart_render.orphans(tmp_path) == ["helm/rlhf-exporter/files/grafana/gone.json"]


def test_the_chart_has_one_copy_per_rule_file_and_dashboard():
    assert RULE_FILES and DASHBOARD_FILES
    want = {f"helm/rlhf-exporter/files/alerts/{p.name}" for p in RULE_FILES}
    want |= {f"helm/rlhf-exporter/files/grafana/{p.name}" for p in DASHBOARD_FILES}
    want.add(chart_render.LINKS)  # the base URLs the rules were rendered with
    assert set(chart_render.targets(load_thresholds(None))) == want
    assert chart_render.orphans(ROOT) == [], "chart files whose source is gone: delete them"


def test_render_check_detects_a_drifted_copy(tmp_path, capsys):
    if not RULE_FILES + DASHBOARD_FILES:
        pytest.skip("alerts/ and grafana/ are empty")
    assert cli.main(["render", "chart", "--root", str(tmp_path)]) == 0
    assert cli.main(["render", "chart", "--check", "--root", str(tmp_path)]) == 0
    victim = sorted((tmp_path / "helm" / "rlhf-exporter" / "files").rglob("*.*"))[0]
    victim.write_text(victim.read_text(encoding="utf-8") + "\n# edited by hand\n", encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["render", "chart", "--check", "--root", str(tmp_path)]) == 1
    assert victim.name in capsys.readouterr().err


def test_values_and_schema_describe_the_same_keys():
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert set(schema["properties"]) - {"global"} == set(values)

    def walk(vals, sch, where):
        props = sch.get("properties")
        if not isinstance(vals, dict) or props is None:
            return
        if sch.get("additionalProperties") is False:
            assert set(vals) <= set(props), (
                f"{where}: keys missing from the schema: {set(vals) - set(props)}"
            )
        for key, value in vals.items():
            if key in props:
                walk(value, props[key], f"{where}.{key}")

    walk(values, schema, "values")


def test_every_value_is_documented():
    """Each key of values.yaml has a comment right above it, or sits under a documented key."""
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    previous = ""
    for number, line in enumerate(
        (CHART / "values.yaml").read_text(encoding="utf-8").splitlines(), 1
    ):
        match = re.match(r"^(\s*)([A-Za-z0-9_.\-/\"]+):", line)
        if match and not line.lstrip().startswith(("#", "-")):
            indent = len(match.group(1))
            while documented and documented[-1][0] >= indent:
                documented.pop()
            has_comment = previous.lstrip().startswith("#")
            inherited = any(doc for _, doc in documented)
            leaf = not line.rstrip().endswith(":")
            if leaf and not (has_comment or inherited):
                undocumented.append(f"line {number}: {line.strip()}")
            documented.append((indent, has_comment or inherited))
        if line.strip():
            previous = line
    assert undocumented == []


def test_strict_lint_passes_for_every_values_set():
    for values in (
        None,
        all_features(),
        yaml.safe_load(STANDALONE_VALUES.read_text(encoding="utf-8")),
    ):
        report = helm.lint(str(CHART), values, strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], (problems, report["errors"])


# ---------------------------------------------------------------------------- values and modes


@pytest.mark.parametrize(
    "values, where",
    [
        ({"mode": "daemonset"}, "/mode"),
        ({"colour": "blue"}, "'colour' not allowed"),
        ({"port": "19839"}, "/port"),
        ({"image": {"repository": "x", "tagg": "1"}}, "'tagg' not allowed"),
        ({"monitor": {"kind": "ServiceMonitors"}}, "/monitor/kind"),
        ({"monitor": {"interval": "15 seconds"}}, "/monitor/interval"),
        (
            {"prometheusRule": {"alerts": {"AnyAlert": {"for": "soon"}}}},
            "/prometheusRule/alerts/AnyAlert/for",
        ),
        ({"prometheusRule": {"alerts": {"AnyAlert": {"enable": False}}}}, "'enable' not allowed"),
        ({"dashboards": {"labelValue": 1}}, "/dashboards/labelValue"),
        ({"sidecar": {"portName": "rlhf-exporter-metrics"}}, "/sidecar/portName"),
        ({"sidecar": {"gpuRoles": "yes"}}, "/sidecar/gpuRoles"),
        ({"standalone": {"rayAddress": "ray-head:8265"}}, "/standalone/rayAddress"),
        ({"securityContext": "restricted"}, "/securityContext"),
    ],
)
def test_schema_rejects_wrong_values_with_the_culprit(values, where):
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    message = str(caught.value)
    assert "schema" in message and where in message, message


def test_standalone_with_only_a_ray_address_reads_jobs_from_ray_with_no_volume():
    """The console route needs no logs volume: a standalone exporter given only the Ray
    dashboard mounts nothing but /tmp and reads every verl job on the cluster."""
    address = "http://ray-head-svc.ray.svc:8265"
    deployment = only(render({"mode": "standalone", "standalone": {"rayAddress": address}}),
                      "Deployment")  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RLHF_EXPORTER_RAY_ADDRESS"] == address and env["RLHF_EXPORTER_RAY_ACTORS"] == "true"
    assert "RLHF_EXPORTER_VERL_ROOT" not in env
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


@pytest.mark.parametrize(
    "values, needle",
    [
        ({"mode": "standalone"}, "standalone.rayAddress"),
        (
            {"monitor": {"kind": "ServiceMonitor"}, "service": {"enabled": False}},
            "service.enabled=true",
        ),
        (
            {"prometheusRule": {"alerts": {"NoSuchAlertAnywhere": {"enabled": False}}}},
            "NoSuchAlertAnywhere",
        ),
        ({**STANDALONE, "push": {"enabled": True}}, "push.tokenSecret.name"),
        ({"networkPolicy": {"enabled": True}}, "mode: standalone"),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(values, needle):
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    assert needle in str(caught.value)


@pytest.mark.parametrize(
    "values, want",
    [
        (None, dict()),
        ({"monitor": {"kind": "ServiceMonitor"}}, dict(monitor="ServiceMonitor")),
        (
            {"monitor": {"kind": "none"}, "service": {"enabled": False}},
            dict(monitor=None, service=False),
        ),
        (
            {"prometheusRule": {"enabled": False}, "dashboards": {"enabled": False}},
            dict(rules=False, dashboards=False),
        ),
        (STANDALONE, dict(workload={"Deployment": 1})),
        (
            {**STANDALONE, "monitor": {"kind": "ServiceMonitor"}},
            dict(workload={"Deployment": 1}, monitor="ServiceMonitor"),
        ),
        (
            {
                **STANDALONE,
                "standalone": {"logs": {"existingClaim": "x"}, "serviceAccount": {"create": True}},
            },
            dict(workload={"Deployment": 1, "ServiceAccount": 1}),
        ),
    ],
    ids=[
        "sidecar-default",
        "sidecar-servicemonitor",
        "sidecar-no-monitor",
        "no-rules-no-dashboards",
        "standalone",
        "standalone-servicemonitor",
        "standalone-serviceaccount",
    ],
)
def test_each_mode_renders_exactly_its_objects(values, want):
    objects = render(values)
    assert kinds(objects) == expected_kinds(**want)
    assert sum(o["kind"] in ("PodMonitor", "ServiceMonitor") for o in objects) <= 1
    for obj in objects:
        validate(obj)
        assert obj["metadata"].get("namespace") in (NAMESPACE, None)


def test_default_values_render_valid_objects():
    objects = render()
    assert objects, "the default values render nothing"
    for obj in objects:
        validate(obj)
    service = only(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"  # one endpoint per sidecar pod
    assert service["spec"]["selector"] == {  # scope=all: this release's sidecars only
        "app.kubernetes.io/component": "rlhf-exporter-sidecar",
        "rlhf-exporter.io/release": RELEASE,
    }
    monitor = only(objects, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "rlhf-metrics"
    assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_all_features_render_valid_objects():
    values = all_features()
    objects = render(values)
    assert kinds(objects) == expected_kinds(
        workload={"Deployment": 1, "ServiceAccount": 1}, monitor="ServiceMonitor"
    )
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["labels"]["team"] == "rl"

    deployment = only(objects, "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "rlhf-exporter-sa"
    assert only(objects, "ServiceAccount")["metadata"]["name"] == "rlhf-exporter-sa"
    assert pod["metadata"]["labels"]["tier"] == "observability"
    assert pod["spec"]["priorityClassName"] == "observability"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    ctr = container(pod["spec"], "exporter")
    assert ctr["image"] == "registry.example.com/rlhf-exporter:0.1.0-test"
    assert {"name": "verl-logs", "mountPath": "/logs", "readOnly": True, "subPath": "jobs"} in ctr[
        "volumeMounts"
    ]
    conf, _env = serve_settings(ctr)
    assert conf.verl_root == ["/logs"] and conf.verl_interval == 2.0
    assert (
        conf.ray
        and conf.ray_address == "http://ray-cluster-head-svc.ray.svc:8265"
        and conf.ray_per_class
    )
    assert conf.push and conf.push_token == "a-secret-token" and conf.log_format == "text"
    (token,) = [
        e for e in ctr["env"] if e["name"] == settings.env_name(options.BY_NAME["push_token"])
    ]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "push-token", "key": "token"}

    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE, "ray-jobs"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "20s")
    assert endpoint["relabelings"] == [
        RAY_CLUSTER_RELABELING,  # the chart's own, first (issue 22)
        {"targetLabel": "cluster", "replacement": "training-a"},
    ]
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert service["metadata"]["annotations"] == {"example.com/note": "metrics"}
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    for cm in (o for o in objects if o["kind"] == "ConfigMap"):
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "RLHF training"}
    if alert_names():
        rule = only(objects, "PrometheusRule")
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_standalone_deployment_is_one_secure_replica_serving_on_the_pod_network():
    objects = render(STANDALONE)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("shareProcessNamespace")
    ctr = container(pod, "exporter")
    assert_secure_container(ctr)
    (port,) = ctr["ports"]
    assert port == {"name": "metrics", "containerPort": options.DEFAULT_PORT, "protocol": "TCP"}
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    conf, env = serve_settings(ctr)
    assert conf.listen == f"0.0.0.0:{options.DEFAULT_PORT}"
    assert conf.verl_root == ["/verl-logs"]
    assert conf.nvml is False and conf.gpu_roles is False and conf.ray is False
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    (claim,) = [v for v in pod["volumes"] if v["name"] == "verl-logs"]
    assert claim["persistentVolumeClaim"] == {"claimName": "verl-logs", "readOnly": True}
    service = only(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def assert_secure_container(ctr: dict) -> None:
    sc = ctr["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctr["resources"]["requests"] and ctr["resources"]["limits"]
    assert set(ctr["resources"]["limits"]) >= {"cpu", "memory"}


def test_dockerfile_runs_as_the_user_the_chart_expects():
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    (user,) = re.findall(r"^USER\s+(\S+)", text, re.M)
    uid, _, gid = user.partition(":")
    assert int(uid) == values["securityContext"]["runAsUser"] != 0
    assert int(gid) == values["securityContext"]["runAsGroup"]
    # the listening address the chart also sets, from the image's environment (not CMD);
    # tests/test_image.py runs the built image with the chart's spec
    assert re.search(rf"^\s*RLHF_EXPORTER_LISTEN=0\.0\.0\.0:{options.DEFAULT_PORT}\b", text, re.M)
    assert re.search(r'^ENTRYPOINT \["rlhf-exporter"\]', text, re.M)


# ---------------------------------------------------------------------------- rules and dashboards


def test_prometheusrule_groups_equal_the_alert_files():
    if not alert_groups():
        pytest.skip("alerts/ holds no rule groups yet")
    # without a Service the runbook links stay as rendered (with one: the exporter's /runbooks)
    rule = only(render({"service": {"enabled": False}}), "PrometheusRule")
    validate(rule)
    assert rule["spec"]["groups"] == alert_groups()


def test_promtool_accepts_the_rendered_rules(tmp_path):
    if not alert_names():
        pytest.skip("alerts/ holds no alerts yet")
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    first = alert_names()[0]
    rule = only(
        render({"prometheusRule": {"alerts": {first: {"for": "7m", "severity": "page"}}}}),
        "PrometheusRule",
    )
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_per_alert_enable_severity_and_for_overrides():
    names = alert_names()
    if not names:
        pytest.skip("alerts/ holds no alerts yet")
    first, rest = names[0], names[1:]
    overrides = {first: {"severity": "page", "for": "17m"}}
    if rest:
        overrides[rest[0]] = {"enabled": False}
    values = {"prometheusRule": {"alerts": overrides}, "service": {"enabled": False}}
    groups = only(render(values), "PrometheusRule")["spec"]["groups"]
    rendered = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    originals = {r["alert"]: r for g in alert_groups() for r in g["rules"] if "alert" in r}
    assert rendered[first]["for"] == "17m"
    assert rendered[first]["labels"]["severity"] == "page"
    assert rendered[first]["expr"] == originals[first]["expr"]
    assert {k: v for k, v in rendered[first]["labels"].items() if k != "severity"} == {
        k: v for k, v in (originals[first].get("labels") or {}).items() if k != "severity"
    }
    if rest:
        assert rest[0] not in rendered
        assert set(rendered) == set(originals) - {rest[0]}
        for name in rest[1:]:
            assert rendered[name] == originals[name]
    records = [r for g in groups for r in g["rules"] if "record" in r]
    assert records == [r for g in alert_groups() for r in g["rules"] if "record" in r]


def test_disabling_every_alert_drops_the_prometheusrule_but_keeps_recording_rules():
    names = alert_names()
    if not names:
        pytest.skip("alerts/ holds no alerts yet")
    objects = render({"prometheusRule": {"alerts": {n: {"enabled": False} for n in names}}})
    recordings = [r for g in alert_groups() for r in g["rules"] if "record" in r]
    rules = [o for o in objects if o["kind"] == "PrometheusRule"]
    if recordings:
        kept = [r for g in rules[0]["spec"]["groups"] for r in g["rules"]]
        assert kept == recordings
    else:
        assert rules == []


def test_dashboard_configmaps_equal_the_grafana_files():
    if not DASHBOARD_FILES:
        pytest.skip("grafana/ holds no dashboards yet")
    maps = [o for o in render() if o["kind"] == "ConfigMap"]
    assert len(maps) == len(DASHBOARD_FILES)
    by_key = {key: (cm, text) for cm in maps for key, text in cm["data"].items()}
    assert sorted(by_key) == [p.name for p in DASHBOARD_FILES]
    for path in DASHBOARD_FILES:
        cm, text = by_key[path.name]
        assert len(cm["data"]) == 1
        assert text == path.read_text(encoding="utf-8")
        json.loads(text)
        assert len(json.dumps(cm).encode()) < 1 << 20  # a ConfigMap holds at most 1 MiB
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "RLHF"}
        validate(cm)


def test_dashboard_label_and_folder_are_configurable():
    if not DASHBOARD_FILES:
        pytest.skip("grafana/ holds no dashboards yet")
    values = {
        "dashboards": {
            "label": "example.com/dashboard",
            "labelValue": "yes",
            "folderAnnotation": "k8s-sidecar-target-directory",
            "folder": "/tmp/dashboards/rlhf",
        }
    }
    for cm in (o for o in render(values) if o["kind"] == "ConfigMap"):
        assert cm["metadata"]["labels"]["example.com/dashboard"] == "yes"
        assert "grafana_dashboard" not in cm["metadata"]["labels"]
        assert cm["metadata"]["annotations"] == {
            "k8s-sidecar-target-directory": "/tmp/dashboards/rlhf"
        }


# ---------------------------------------------------------------------------- the examples


def test_standalone_example_values_render_valid_objects():
    values = yaml.safe_load(STANDALONE_VALUES.read_text(encoding="utf-8"))
    objects = render(values)
    assert kinds(objects) == expected_kinds(workload={"Deployment": 1}, monitor="ServiceMonitor")
    for obj in objects:
        validate(obj)
    conf, _ = serve_settings(
        container(only(objects, "Deployment")["spec"]["template"]["spec"], "exporter")
    )
    assert conf.ray_address == values["standalone"]["rayAddress"]


def test_example_rayjob_includes_the_sidecar_on_the_head_and_every_gpu_worker(example_chart):
    objects = render(chart=example_chart, namespace="ray-jobs")
    assert kinds(objects) == expected_kinds(  # scope=job: the job's objects only
        workload={"RayJob": 1, "PersistentVolumeClaim": 1, "Service": 1},
        monitor=None,
        service=False,
        rules=False,
        dashboards=False,
    )
    for obj in objects:
        validate(obj)  # the RayJob's pod templates as core Pods, sidecar included
    values = yaml.safe_load((EXAMPLE / "values.yaml").read_text(encoding="utf-8"))
    rayjob = rayjob_of(objects)
    assert 'trainer.logger=\'["console","file"]\'' in rayjob["spec"]["entrypoint"]
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    logs_root = runtime_env["env_vars"]["VERL_FILE_LOGGER_ROOT"]
    pvc = only(objects, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]

    shared = yaml.safe_load((SHARED_VALUES).read_text(encoding="utf-8"))
    monitor = only(render(shared, namespace="ray-jobs", name="rlhf-exporter"), "PodMonitor")
    actor_exporters = 0
    templates = ray_pod_templates(rayjob)
    # the head sidecar's Service (the workers' gpuWindowsFrom): the head pod, its port
    head_svc = only(objects, "Service")
    head_labels = {**templates["head"]["metadata"]["labels"], "ray.io/node-type": "head"}
    assert head_svc["spec"]["selector"].items() <= head_labels.items()  # KubeRay adds node-type
    for name, template in templates.items():
        if name != "head":
            worker_labels = {**template["metadata"]["labels"], "ray.io/node-type": "worker"}
            assert not head_svc["spec"]["selector"].items() <= worker_labels.items()
    (svc_port,) = head_svc["spec"]["ports"]
    head_side = container(templates["head"]["spec"], "rlhf-exporter")
    assert svc_port["targetPort"] == head_side["ports"][0]["name"]
    windows_url = f"http://{RELEASE}-rlhf-head.ray-jobs.svc:{svc_port['port']}"
    for name, template in templates.items():
        spec = template["spec"]
        role = "head" if name == "head" else "worker"
        ray = spec["containers"][0]
        side = container(spec, "rlhf-exporter")
        assert_secure_container(side)
        assert side["image"] == f"ghcr.io/rlhf-exporter/rlhf-exporter:{rlhf_exporter.__version__}"
        ports = [p["name"] for c in spec["containers"] for p in c.get("ports", [])]
        assert len(ports) == len(set(ports)) and "metrics" not in [p["name"] for p in side["ports"]]
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= template["metadata"]["labels"].items()
        )
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == side["ports"][0]["name"]
        assert {"name": "VERL_FILE_LOGGER_ROOT", "value": logs_root} in ray["env"]
        # values.yaml asks for GPU roles, so the pod shares its PID namespace
        assert spec["shareProcessNamespace"] is True
        conf, env = serve_settings(side, labels={"ray.io/cluster": "grpo-grpo-x7k2p"})
        assert conf.listen == f"0.0.0.0:{options.DEFAULT_PORT}"
        actor_exporters += bool(conf.ray and conf.ray_actors)
        if role == "head":
            mount, engines = side["volumeMounts"]  # the logs, verl's list of the engines
            assert mount["readOnly"] is True and mount["mountPath"] == logs_root
            for m in (mount, engines):
                assert m["readOnly"] is True
                assert m["name"] in [v["name"] for v in spec["volumes"]]
                assert m["name"] in [m["name"] for m in ray["volumeMounts"]]
            assert conf.engine_prometheus_file == f"{engines['mountPath']}/prometheus.yml"
            assert conf.verl_root == [logs_root]
            assert conf.ray_address == "http://127.0.0.1:8265"
            assert conf.push is False  # push is off unless enabled (with a token Secret)
            assert conf.nvml is values["rlhf-exporter"]["sidecar"]["head"]["nvml"] is False
            assert conf.gpu_roles is False  # no NVML on this head: nothing to attribute
        else:
            assert "nvidia.com/gpu" in ray["resources"]["limits"]
            assert "nvidia.com/gpu" not in side["resources"].get("limits", {})
            assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
            assert "volumeMounts" not in side
            assert conf.verl_root is None and conf.push is False
            assert conf.nvml is True and conf.gpu_roles is True
            assert conf.ray is True and conf.ray_actors is False
            assert conf.ray_address == "http://grpo-grpo-x7k2p-head-svc.ray-jobs.svc:8265"
            assert conf.gpu_windows_from == windows_url  # wired to the head by default
    assert actor_exporters == 1, "Ray actors must be exported by the head sidecar only"


def test_two_jobs_in_one_namespace_get_one_set_of_rules_dashboards_and_scrapes(example_chart):
    """The shared release once, two job releases of the example: every alert, dashboard uid
    and monitor exists once, and each job's pods are selected by exactly one monitor."""
    ns = "ray-jobs"
    shared = yaml.safe_load(SHARED_VALUES.read_text(encoding="utf-8"))
    releases = {
        "rlhf-exporter": render(shared, namespace=ns, name="rlhf-exporter"),
        "grpo": render(chart=example_chart, namespace=ns, name="grpo"),
        "grpo-2": render(
            {"verl": {"experiment": "second"}}, chart=example_chart, namespace=ns, name="grpo-2"
        ),
    }
    everything = [o for objects in releases.values() for o in objects]
    for obj in everything:
        validate(obj)
    names = Counter((o["kind"], o["metadata"]["name"]) for o in everything)
    assert [k for k, n in names.items() if n > 1] == []
    alerts = Counter(
        r["alert"]
        for o in everything
        if o["kind"] == "PrometheusRule"
        for g in o["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    )
    assert alerts and set(alerts.values()) == {1} and sorted(alerts) == sorted(alert_names())
    uids = Counter(
        json.loads(text)["uid"]
        for o in everything
        if o["kind"] == "ConfigMap"
        for text in o["data"].values()
    )
    assert len(uids) == len(DASHBOARD_FILES) and set(uids.values()) == {1}
    monitors = [o for o in everything if o["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert len(monitors) == 1
    assert monitors[0]["spec"]["namespaceSelector"] == {"matchNames": [ns]}
    # every sidecar pod of both jobs is selected, by that one monitor, once
    selector = monitors[0]["spec"]["selector"]["matchLabels"]
    pods = [
        (release, name, template["metadata"]["labels"])
        for release in ("grpo", "grpo-2")
        for name, template in ray_pod_templates(rayjob_of(releases[release])).items()
    ]
    assert len(pods) == 4 and all(selector.items() <= labels.items() for _, _, labels in pods)
    # and a scope=all release in the same namespace selects its own pods, not theirs
    alone = only(render({"scope": "all"}, namespace=ns, name="solo"), "PodMonitor")
    own = alone["spec"]["selector"]["matchLabels"]
    assert not any(own.items() <= labels.items() for _, _, labels in pods)


def test_scope_other_than_all_is_for_sidecars():
    with pytest.raises(helm.HelmRenderError) as caught:
        render(
            {"mode": "standalone", "scope": "job", "standalone": {"logs": {"existingClaim": "x"}}}
        )
    assert "scope=job" in str(caught.value)


def test_values_comment_names_only_real_alerts():
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    named = set(re.findall(r"\b(RLHF[A-Za-z]+):", text))
    assert named and named <= set(alert_names()), named - set(alert_names())


def test_example_without_gpu_roles_claims_no_shared_pid_namespace(example_chart):
    rayjob = rayjob_of(
        render(
            example_values(sidecar={"gpuRoles": False}), chart=example_chart, namespace="ray-jobs"
        )
    )
    for name, template in ray_pod_templates(rayjob).items():
        assert "shareProcessNamespace" not in template["spec"]
        conf, _ = serve_settings(container(template["spec"], "rlhf-exporter"))
        assert conf.gpu_roles is False
        if name != "head":
            assert conf.ray is False and conf.ray_actors is False and conf.nvml is True


def test_example_worker_ray_address_can_be_set(example_chart):
    values = example_values(sidecar={"worker": {"rayAddress": "http://head.ray.svc:8265"}})
    rayjob = rayjob_of(render(values, chart=example_chart, namespace="ray-jobs"))
    worker = ray_pod_templates(rayjob)["worker-gpu"]["spec"]
    conf, env = serve_settings(container(worker, "rlhf-exporter"))
    assert conf.ray_address == "http://head.ray.svc:8265"
    assert "RAY_CLUSTER_NAME" not in env


def test_example_worker_reads_the_heads_gpu_windows_when_wired(example_chart):
    """Issue 17: worker sidecars read the head sidecar's step windows (with the push token)."""
    url = "http://rlhf-head.ray-jobs.svc:9400"
    cluster = {"ray.io/cluster": "c"}
    values = example_values(sidecar={"worker": {"gpuWindowsFrom": url}})
    rayjob = rayjob_of(render(values, chart=example_chart, namespace="ray-jobs"))
    worker = ray_pod_templates(rayjob)["worker-gpu"]["spec"]
    conf, env = serve_settings(container(worker, "rlhf-exporter"), labels=cluster)
    assert conf.gpu_windows_from == url and conf.push is False
    head = ray_pod_templates(rayjob)["head"]["spec"]
    head_conf, head_env = serve_settings(container(head, "rlhf-exporter"), labels=cluster)
    assert head_conf.gpu_windows_from is None
    # the token the head's API checks (push's) travels to the worker from the same Secret
    assert ("RLHF_EXPORTER_PUSH_TOKEN" in env) == ("RLHF_EXPORTER_PUSH_TOKEN" in head_env)
    # with a token Secret (push itself still off), the head's windows API asks for it and
    # the workers send it
    guarded = rayjob_of(
        render(
            {"rlhf-exporter": {"push": {"tokenSecret": {"name": "rlhf-token"}}}},
            chart=example_chart,
            namespace="ray-jobs",
        )
    )
    for template in ray_pod_templates(guarded).values():
        conf, env = serve_settings(container(template["spec"], "rlhf-exporter"), labels=cluster)
        assert conf.push_token == "a-secret-token" and conf.push is False
    unwired = rayjob_of(
        render(
            example_values(sidecar={"worker": {"gpuWindowsFrom": ""}}),
            chart=example_chart,
            namespace="ray-jobs",
        )
    )
    worker = ray_pod_templates(unwired)["worker-gpu"]["spec"]
    conf, env = serve_settings(container(worker, "rlhf-exporter"), labels=cluster)
    assert conf.gpu_windows_from is None and "RLHF_EXPORTER_PUSH_TOKEN" not in env


def test_example_chart_lints_strictly(example_chart):
    report = helm.lint(str(example_chart), None, strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], (problems, report["errors"])


def test_example_declares_this_chart_as_its_dependency():
    meta = yaml.safe_load((EXAMPLE / "Chart.yaml").read_text(encoding="utf-8"))
    (dep,) = meta["dependencies"]
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert dep["name"] == chart_meta["name"] and dep["version"] == chart_meta["version"]
    assert (EXAMPLE / dep["repository"].removeprefix("file://")).resolve() == CHART.resolve()


def test_sidecar_template_rejects_an_unknown_role(example_chart, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(example_chart, broken)
    text = (broken / "templates" / "rayjob.yaml").read_text(encoding="utf-8")
    (broken / "templates" / "rayjob.yaml").write_text(
        text.replace('"role" "worker"', '"role" "gpu"'), encoding="utf-8"
    )
    with pytest.raises(helm.HelmRenderError) as caught:
        render(chart=broken)
    assert 'role must be "head" or "worker"' in str(caught.value)


def test_readme_shows_both_examples_and_the_gpu_caveats():
    text = (CHART / "README.md").read_text(encoding="utf-8")
    for needle in (
        'include "rlhf-exporter.sidecar"',
        "examples/verl-grpo-rayjob",
        "examples/standalone-values.yaml",
        "NVIDIA_VISIBLE_DEVICES",
        "shareProcessNamespace",
        "ReadWriteMany",
        "/api/v1/records",
        "PodMonitor",
        "rlhf-exporter render chart",
    ):
        assert needle in text, needle


def test_push_is_off_by_default_and_a_network_policy_admits_only_the_given_peers():
    (ctr,) = [
        c
        for o in render(STANDALONE)
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    conf, _env = serve_settings(ctr)
    assert conf.push is False
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    objects = render({**STANDALONE, "networkPolicy": {"enabled": True, "from": peers}})
    policy = only(objects, "NetworkPolicy")
    validate(policy)
    deployment = only(objects, "Deployment")
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == peers
    assert rule["ports"] == [{"port": options.DEFAULT_PORT, "protocol": "TCP"}]
    assert policy["spec"]["policyTypes"] == ["Ingress"]


RAY_CLUSTER_RELABELING = {
    "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
    "targetLabel": "ray_cluster",
}


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitors_label_every_target_with_its_ray_cluster(kind):
    """Alertmanager groups Ray and exporter alerts per KubeRay cluster: the monitor copies the
    pod's ray.io/cluster label to `ray_cluster` (issue 22); the user's relabelings follow."""
    monitor = only(render({"monitor": {"kind": kind}}), kind)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    assert endpoint["relabelings"] == [RAY_CLUSTER_RELABELING]


def _annotations(rule: dict, key: str) -> dict[str, str]:
    return {
        r["alert"]: r["annotations"][key]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r and key in r.get("annotations", {})
    }


def test_runbook_base_url_is_settable_and_the_default_is_the_exporters_own_runbooks():
    base = "https://wiki.example.com/rlhf/runbooks"
    rule = only(render({"prometheusRule": {"runbookBaseUrl": base + "/"}}), "PrometheusRule")
    urls = _annotations(rule, "runbook_url")
    assert urls and all(u == f"{base}#{a.lower()}" for a, u in urls.items())
    # unset: the exporter's /runbooks behind the chart's Service (it serves them)
    objects = render()
    svc = only(objects, "Service")
    port = svc["spec"]["ports"][0]["port"]
    own = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{port}/runbooks"
    urls = _annotations(only(objects, "PrometheusRule"), "runbook_url")
    assert urls and all(u == f"{own}#{a.lower()}" for a, u in urls.items())
    # no Service: as rendered, a reserved name (RFC 2606: never someone else's page)
    bare = only(render({"service": {"enabled": False}, "monitor": {"kind": "PodMonitor"}}),
                "PrometheusRule")  # fmt: skip
    hosts = {u.split("/")[2] for u in _annotations(bare, "runbook_url").values()}
    assert hosts == {"rlhf-exporter.invalid"}


def test_grafana_url_sets_every_dashboard_link_at_install_time():
    """With prometheusRule.grafanaUrl and runbookBaseUrl set, no alert links to example.com
    or .invalid, and each dashboard_url keeps its path and the alert's label templates."""
    grafana = "https://grafana.corp.test/grafana"
    values = {"prometheusRule": {"grafanaUrl": grafana + "/",
                                 "runbookBaseUrl": "https://wiki.corp.test/rlhf"}}  # fmt: skip
    rule = only(render(values), "PrometheusRule")
    default = _annotations(only(render(), "PrometheusRule"), "dashboard_url")
    urls = _annotations(rule, "dashboard_url")
    assert urls and set(urls) == set(default)
    for alert, url in urls.items():
        assert url.startswith(grafana + "/d/rlhf-job/rlhf-job?var-project={{"), url
        assert url.removeprefix(grafana) == default[alert].removeprefix(
            "http://grafana.example.com"
        )
    text = yaml.safe_dump(rule)
    assert "example.com" not in text and ".invalid" not in text


def test_the_head_sidecar_reads_no_gpu_by_default():
    """A KubeRay head usually has no GPU: NVML there would be a collector down for good."""
    from yaml import safe_load

    values = safe_load((CHART / "values.yaml").read_text())
    assert values["sidecar"]["head"]["nvml"] is False


def test_exporter_absent_is_left_out_of_sidecar_mode_only():
    """Between two jobs no sidecar exists: absence is normal there (issue 22)."""

    def names(values):
        rule = only(render(values), "PrometheusRule")
        return {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}

    assert "RLHFExporterAbsent" not in names({})  # sidecar is the default mode
    assert "RLHFExporterAbsent" in names(
        {"prometheusRule": {"alerts": {"RLHFExporterAbsent": {"enabled": True}}}}
    )
    standalone = yaml.safe_load(STANDALONE_VALUES.read_text())
    assert "RLHFExporterAbsent" in names(standalone)


def test_a_ray_token_secret_reaches_every_container_that_reads_ray(example_chart):
    """Issue 38: a Ray cluster with token authentication; the chart's `ray.tokenSecret` is
    sent by every exporter that reads Ray's dashboard (standalone, head and, with gpuRoles,
    worker sidecars), and by none that does not."""
    secret = {"name": "ray-auth", "key": "auth_token"}
    standalone = {
        **STANDALONE,
        "standalone": {**STANDALONE["standalone"], "rayAddress": "http://h:8265"},
    }
    deploy = only(render({**standalone, "ray": {"tokenSecret": secret}}), "Deployment")
    ctr = container(deploy["spec"]["template"]["spec"], "exporter")
    conf, env = serve_settings(ctr)
    assert conf.ray and conf.ray_token == "a-secret-token"
    ref = next(e for e in ctr["env"] if e["name"] == "RLHF_EXPORTER_RAY_TOKEN")
    assert ref["valueFrom"]["secretKeyRef"] == secret
    conf, env = serve_settings(container(
        only(render(standalone), "Deployment")["spec"]["template"]["spec"], "exporter"
    ))  # fmt: skip
    assert conf.ray and conf.ray_token is None  # no Secret: no token
    no_ray = only(render({**STANDALONE, "ray": {"tokenSecret": secret}}), "Deployment")
    conf, env = serve_settings(container(no_ray["spec"]["template"]["spec"], "exporter"))
    assert not conf.ray and "RLHF_EXPORTER_RAY_TOKEN" not in env
    cluster = {"ray.io/cluster": "c"}
    for roles, reads in ((False, {"head"}), (True, {"head", "worker-gpu"})):
        values = example_values(ray={"tokenSecret": secret}, sidecar={"gpuRoles": roles})
        rayjob = rayjob_of(render(values, chart=example_chart, namespace="ray-jobs"))
        for name, template in ray_pod_templates(rayjob).items():
            conf, env = serve_settings(container(template["spec"], "rlhf-exporter"), cluster)
            assert conf.ray == (name in reads), name
            assert (conf.ray_token == "a-secret-token") == (name in reads), name
