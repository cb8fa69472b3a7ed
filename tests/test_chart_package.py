"""The release path as the README writes it (issue 48): the chart package and the example
packaged with it (scripts/package-artifacts.py) render with the real Helm engine, with the
README's values file: the image from the user's registry, links that work, and a
standalone exporter that needs nothing but the Ray dashboard's address."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.support.chart import CHART, only

ROOT = Path(__file__).resolve().parents[1]
helm = pytest.importorskip("helm_python")
spec = importlib.util.spec_from_file_location(
    "package_artifacts", ROOT / "scripts/package-artifacts.py"
)
assert spec is not None and spec.loader is not None
artifacts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(artifacts)


def readme_values() -> dict:
    """The values file the README's Kubernetes section gives, verbatim."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## On Kubernetes") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "README.md's Kubernetes section has no values file"
    return yaml.safe_load(block.group(1))


def rendered(package: Path, values: dict) -> list[dict]:
    with helm.Chart.load(str(package)) as chart:
        out = chart.render(values=values, name="rlhf", namespace="monitoring")
    return [d for path, t in sorted(out.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(t) if d]  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("artifacts")
    record = artifacts.build(out, image_dir=out / "no-image")
    return out, record


def test_packages_are_reproducible_and_recorded(built, tmp_path):
    out, record = built
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    chart, example = f"rlhf-exporter-{version}.tgz", f"verl-grpo-rayjob-{version}.tgz"
    again = artifacts.build(tmp_path, image_dir=tmp_path / "no-image")
    assert record[chart] == again[chart] and record[example] == again[example]  # same bytes
    assert json.loads((out / "artifacts.json").read_text()) == record
    assert record["image"]["built"] is False and "build-image.sh" in record["image"]["why"]
    with tarfile.open(out / chart) as tar:
        names = tar.getnames()
    assert "rlhf-exporter/Chart.yaml" in names and "rlhf-exporter/files/alerts/links.yaml" in names
    assert all(n.startswith("rlhf-exporter/") for n in names)
    with tarfile.open(out / example) as tar:  # the file:// dependency, resolved to the package
        assert f"verl-grpo-rayjob/charts/{chart}" in tar.getnames()


def test_the_readme_install_renders_a_watched_cluster_with_working_links(built):
    """`helm install` of the package with the README's values: a standalone exporter that
    reads every verl job on the Ray cluster (no volume), the image from the user's registry,
    every alert linking to the user's Grafana and runbooks."""
    out, record = built
    values = readme_values()
    (chart,) = [n for n in record if n.startswith("rlhf-exporter-")]
    objects = rendered(out / chart, values)
    deployment = only(objects, "Deployment")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"port-forward deploy/{deployment['metadata']['name']} " in readme
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith(values["image"]["repository"] + ":")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RLHF_EXPORTER_RAY_ADDRESS"] == values["standalone"]["rayAddress"]
    assert "RLHF_EXPORTER_VERL_ROOT" not in env  # no logs volume needed
    assert all(v.get("name") != "verl-logs" for v in pod["volumes"])
    rules = yaml.safe_dump(only(objects, "PrometheusRule"))
    assert "example.com" not in rules and ".invalid" not in rules
    assert values["prometheusRule"]["grafanaUrl"].rstrip("/") + "/d/rlhf-job/" in rules


def test_the_example_package_renders_from_its_bundled_dependency(built):
    out, record = built
    (example,) = [n for n in record if n.startswith("verl-grpo-rayjob-")]
    objects = rendered(out / example, {})
    rayjob = only(objects, "RayJob")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert any(c["name"] == "rlhf-exporter" for c in head["containers"])


def test_an_image_archive_is_recorded_by_its_manifest_digest(tmp_path):
    """scripts/build-image.sh leaves an OCI archive and image.json: the record names the
    image and its manifest digest (what a registry serves it under)."""
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    digest = "sha256:" + "ab" * 32
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": digest}]}).encode()
    archive = image_dir / "rlhf-exporter-0.1.0.oci.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, io.BytesIO(index))
    (image_dir / "image.json").write_text(json.dumps({"image": "r/rlhf-exporter:0.1.0"}))
    got = artifacts.image_record(image_dir)
    assert got["built"] is True and got["manifest_digest"] == digest
    assert got["reference"] == "r/rlhf-exporter:0.1.0"
