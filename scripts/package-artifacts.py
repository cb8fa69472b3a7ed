"""The release artifacts CI builds and records: the Helm chart package, the example chart
packaged with that package as its dependency, and the container image's digest.

    .venv/bin/python scripts/package-artifacts.py [--out build/artifacts]

Writes OUT/rlhf-exporter-<version>.tgz and OUT/verl-grpo-rayjob-<version>.tgz (gzip tar
archives laid out as `helm package` lays them out: one top folder named after the chart,
`.helmignore` honoured, the example's `file://` dependency resolved to the package under
its charts/), byte-reproducible (sorted entries, fixed times and owners), and
OUT/artifacts.json: each file's sha256, and the image built by scripts/build-image.sh
(build/image/*.oci.tar: its reference and manifest digest), or why there is none. This
project publishes neither: push the image to your registry and install the package
(README.md, "On Kubernetes").
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "rlhf-exporter"
EXAMPLE = ROOT / "examples" / "verl-grpo-rayjob"
IMAGE_DIR = ROOT / "build" / "image"
MTIME = 0  # fixed: the same tree gives the same bytes


def ignored(chart: Path) -> list[str]:
    path = chart / ".helmignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _skip(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        p = pattern.rstrip("/")
        if any(fnmatch.fnmatch(part, p) for part in parts) or fnmatch.fnmatch(rel, p):
            return True
    return False


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), MTIME, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def package(chart: Path, extra: dict[str, bytes] | None = None) -> tuple[str, bytes]:
    """(file name, bytes) of the chart's package; `extra`: more files, by path in the chart."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text(encoding="utf-8"))
    name, version = meta["name"], meta["version"]
    patterns = ignored(chart)
    files = {
        str(p.relative_to(chart)): p.read_bytes()
        for p in chart.rglob("*")
        if p.is_file() and not _skip(str(p.relative_to(chart)), patterns)
    }
    files.update(extra or {})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            _add(tar, f"{name}/{rel}", files[rel])
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=MTIME) as gz:
        gz.write(raw.getvalue())
    return f"{name}-{version}.tgz", out.getvalue()


def image_record(image_dir: Path = IMAGE_DIR) -> dict[str, object]:
    """The image scripts/build-image.sh built: its reference and manifest digest."""
    summary = image_dir / "image.json"
    archives = sorted(image_dir.glob("*.oci.tar"))
    if not summary.exists() or not archives:
        return {
            "built": False,
            "why": f"no image in {image_dir} (sudo bash scripts/build-image.sh)",
        }
    facts = json.loads(summary.read_text(encoding="utf-8"))
    with tarfile.open(archives[-1]) as tar:
        member = tar.extractfile("index.json")
        index = json.load(member) if member is not None else {}
    manifests = index.get("manifests") or [{}]
    return {
        "built": True,
        "reference": facts.get("image"),
        "manifest_digest": manifests[0].get("digest"),
        "archive": archives[-1].name,
        "archive_sha256": sha256(archives[-1].read_bytes()),
        "revision": facts.get("revision"),
        "compressed_bytes": facts.get("compressed_bytes"),
    }


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def build(out: Path, image_dir: Path = IMAGE_DIR) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    chart_name, chart = package(CHART)
    example_name, example = package(EXAMPLE, {f"charts/{chart_name}": chart})
    record: dict[str, object] = {}
    for name, data in ((chart_name, chart), (example_name, example)):
        (out / name).write_bytes(data)
        record[name] = {"sha256": sha256(data), "bytes": len(data)}
    record["image"] = image_record(image_dir)
    (out / "artifacts.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "artifacts")
    args = parser.parse_args(argv)
    record = build(args.out)
    for name, facts in record.items():
        print(f"{name}: {json.dumps(facts)}")
    print(f"recorded in {args.out / 'artifacts.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
