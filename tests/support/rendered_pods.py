"""The example's pods as the rendered Helm chart defines them, run as local processes.

`render()` renders a chart with the real Helm engine (helm-python-sdk). `PodRun` takes one
rendered Ray pod template and gives the environment and arguments Kubernetes would start its
exporter sidecar with ($(VAR) expansion, downward-API fields, Secret references), with only
what cannot exist on this machine substituted, each named in `SUBSTITUTED` and applied
by the caller through `substitute()`, which fails on a variable it does not expect or on a
value that is not the kind it replaces (a DNS name of a Service, a mount path).

`scrape_config()` turns a rendered PodMonitor into the Prometheus scrape job that
prometheus-operator generates for it (its selection, target labels and relabelings), over
static targets carrying the Kubernetes service-discovery labels of the pods run here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

# what cannot exist here, and what replaces it (variable -> (the rendered value's pattern, why))
SUBSTITUTED: Mapping[str, tuple[str, str]] = {
    "RLHF_EXPORTER_LISTEN": (r"0\.0\.0\.0:\d+", "the pod's port -> a free 127.0.0.1 port"),
    "RLHF_EXPORTER_VERL_ROOT": (r"/[\w/.-]+", "the logs volume's mount path -> a tmp dir"),
    "RLHF_EXPORTER_RAY_ADDRESS": (
        r"http://(127\.0\.0\.1|[\w-]+-head-svc\.[\w-]+\.svc):8265",
        "the pod's Ray dashboard (localhost on the head, KubeRay's head Service on a worker) "
        "-> the test's Ray head, or a closed port where the test runs no Ray",
    ),
    "RLHF_EXPORTER_ENGINE_PROMETHEUS_FILE": (
        r"/[\w/.-]+\.ya?ml",
        "verl's rollout.prometheus.file on the engines volume -> the same file in a tmp dir",
    ),
    "RLHF_EXPORTER_GPU_WINDOWS_FROM": (
        r"http://[\w-]+\.[\w-]+\.svc:\d+",
        "the head sidecar's Service DNS name -> the head process's 127.0.0.1 URL",
    ),
}
# added, not substituted: the NVML fake at the `pynvml` import boundary (no GPU here)
ADDED = ("PYTHONPATH", "FAKE_PYNVML_SCENARIO")


def render(chart: Path, values: dict | None, name: str, namespace: str) -> list[dict]:
    import helm_python as helm

    with helm.Chart.load(str(chart)) as loaded:
        out = loaded.render(values=values, name=name, namespace=namespace)
    objects: list[dict] = []
    for path, text in sorted(out.items()):
        if not path.endswith("NOTES.txt"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def ray_pod_templates(rayjob: dict) -> dict[str, dict]:
    spec = rayjob["spec"]["rayClusterSpec"]
    out = {"head": spec["headGroupSpec"]["template"]}
    for group in spec["workerGroupSpecs"]:
        out[f"worker-{group['groupName']}"] = group["template"]
    return out


def sidecar(template: dict, name: str = "rlhf-exporter") -> dict:
    (found,) = [c for c in template["spec"]["containers"] if c["name"] == name]
    return found


def pod_env(
    container: dict, labels: Mapping[str, str], namespace: str, secrets: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values with $(VAR) expanded,
    downward-API labels and namespace, Secret keys (`secrets`: "name/key" -> value)."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            value = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(entry["value"])
            )
        elif "fieldRef" in entry["valueFrom"]:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            value = labels[label.group(1)] if label else {"metadata.namespace": namespace}[path]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            value = secrets[f"{ref['name']}/{ref['key']}"]
        env[entry["name"]] = value
    return env


def substitute(rendered: Mapping[str, str], **replacements: str) -> dict[str, str]:
    """`rendered` with the named variables replaced; each must be in SUBSTITUTED and its
    rendered value of the kind it names. Every other variable is kept as rendered."""
    out = dict(rendered)
    for var, value in replacements.items():
        pattern, _why = SUBSTITUTED[var]
        assert var in rendered, f"{var} is not in the rendered pod spec"
        assert re.fullmatch(pattern, rendered[var]), (var, rendered[var])
        out[var] = value
    return out


def _sanitize(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def sd_labels(pod: str, namespace: str, labels: Mapping[str, str], container: dict) -> dict:
    """The Kubernetes service-discovery labels (role pod) of the sidecar's first port."""
    out = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": container["ports"][0]["name"],
        "__meta_kubernetes_pod_container_port_number": str(container["ports"][0]["containerPort"]),
    }
    for key, value in labels.items():
        out[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        out[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    return out


def _relabel(rc: dict) -> dict:
    """prometheus-operator RelabelConfig (camelCase) -> Prometheus relabel_config."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "action": "action",
        "modulus": "modulus",
    }
    return {names[k]: v for k, v in rc.items()}


def scrape_config(
    monitor: dict, targets: list[tuple[str, dict]], interval: str | None = None
) -> dict:
    """The scrape job prometheus-operator generates for one PodMonitor endpoint (selection by
    matchLabels and port name; namespace, container, pod, job and endpoint target labels; the
    endpoint's relabelings and metricRelabelings), over static `targets`: (address, SD
    labels). `interval` replaces the monitor's (the only change: a test cannot wait 15 s)."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    keep = []
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        keep.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_pod_label_{_sanitize(key)}",
                    f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}",
                ],
                "regex": f"({re.escape(value)});true",
            }
        )
    names = monitor["spec"].get("namespaceSelector", {}).get("matchNames")
    if names:
        keep.append(
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_namespace"],
                "regex": "|".join(re.escape(n) for n in names),
            }
        )
    keep.append(
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": re.escape(endpoint["port"]),
        }
    )
    target_labels = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{ns}/{name}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    return {
        "job_name": f"podMonitor/{ns}/{name}/0",
        "scrape_interval": interval or endpoint.get("interval", "30s"),
        "scrape_timeout": interval or endpoint.get("scrapeTimeout", "10s"),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
        "static_configs": [{"targets": [addr], "labels": labels} for addr, labels in targets],
        "relabel_configs": keep
        + target_labels
        + [_relabel(r) for r in endpoint.get("relabelings", ())],
        "metric_relabel_configs": [_relabel(r) for r in endpoint.get("metricRelabelings", ())],
    }
