"""The Helm chart's paths and the helpers that render it with the real Helm engine
(helm-python-sdk), shared by tests/test_helm.py and tests/test_image.py.

Only the helpers need helm-python-sdk: `example_chart` skips the test that asks for it where
the SDK is missing (`render` skips the test that calls it), so a module importing this one
skips nothing else."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.support import rendered_pods

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rlhf-exporter"
EXAMPLE = ROOT / "examples" / "verl-grpo-rayjob"
RELEASE, NAMESPACE = "rel", "mon"


def render(
    values: dict | None = None,
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    name: str = RELEASE,
) -> list[dict]:
    """Every object the chart renders with `values` (NOTES.txt left out)."""
    pytest.importorskip("helm_python")
    return rendered_pods.render(chart, values, name, namespace)


def only(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(objects: list[dict]) -> Counter:
    return Counter(o["kind"] for o in objects)


def container(pod_spec: dict, name: str) -> dict:
    found = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, (
        f"no single container {name!r} in {[c['name'] for c in pod_spec['containers']]}"
    )
    return found[0]


def rayjob_of(objects: list[dict]) -> dict:
    return only(objects, "RayJob")


def copy_example(tmp_path_factory) -> Path:
    """examples/verl-grpo-rayjob with this chart unpacked in charts/, as `helm dependency
    build` would leave it (the committed example holds no copy)."""
    where = tmp_path_factory.mktemp("example") / EXAMPLE.name
    shutil.copytree(EXAMPLE, where)
    shutil.copytree(CHART, where / "charts" / CHART.name)
    return where
