"""Which container py-spy needs rights in (issue 39), rendered by the real Helm engine.

Ray's agent runs py-spy in the Ray containers (ray-head, ray-worker), not in the exporter's
sidecar: the example RayJob's `stacks` values turn on Ray's stack endpoint on the head
(RAY_DASHBOARD_ENABLE_PROFILING=1) and add SYS_PTRACE to the Ray containers only; the sidecar
keeps every capability dropped, read-only and non-root whatever they say.
"""

from __future__ import annotations

from tests.support.rendered_pods import ray_pod_templates
from tests.test_helm import example_chart, rayjob_of, render  # noqa: F401 (a fixture)


def containers(objects: list[dict]) -> dict[str, dict[str, dict]]:
    return {
        pod: {c["name"]: c for c in t["spec"]["containers"]}
        for pod, t in ray_pod_templates(rayjob_of(objects)).items()
    }


def caps(container: dict) -> list[str]:
    return container.get("securityContext", {}).get("capabilities", {}).get("add", [])


def test_ptrace_goes_to_the_ray_containers_never_to_the_sidecar(example_chart):  # noqa: F811
    default = containers(render(chart=example_chart, namespace="ray-jobs"))
    on = containers(render({"stacks": {"ptrace": True}}, chart=example_chart, namespace="ray-jobs"))
    off = containers(render({"stacks": {"profiling": False}}, chart=example_chart,
                            namespace="ray-jobs"))  # fmt: skip
    head_env = {e["name"]: e.get("value") for e in default["head"]["ray-head"]["env"]}
    assert head_env["RAY_DASHBOARD_ENABLE_PROFILING"] == "1"  # on by default
    assert "RAY_DASHBOARD_ENABLE_PROFILING" not in {
        e["name"] for e in off["head"]["ray-head"]["env"]
    }
    for pods in (default, on):
        for pod, by_name in pods.items():
            ray = by_name["ray-head" if pod == "head" else "ray-worker"]
            assert caps(ray) == (["SYS_PTRACE"] if pods is on else [])
            sidecar = next(c for n, c in by_name.items() if n not in ("ray-head", "ray-worker"))
            ctx = sidecar["securityContext"]
            assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["runAsNonRoot"] is True
            assert ctx["readOnlyRootFilesystem"] is True and ctx["privileged"] is False
