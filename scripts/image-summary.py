"""Print the layers of an oci-archive and what is big in each (uncompressed bytes by folder),
and write them to a JSON file. scripts/build-image.sh runs it after the build:

    python3 scripts/image-summary.py ARCHIVE OUT.json IMAGE REVISION
"""

from __future__ import annotations

import collections
import json
import sys
import tarfile


def layers(archive: str) -> list[dict]:
    out = []
    with tarfile.open(archive) as tar:

        def blob(digest: str):
            return tar.extractfile("blobs/" + digest.replace(":", "/"))

        index = json.load(tar.extractfile("index.json"))
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            folders: collections.Counter[str] = collections.Counter()
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as content:
                for member in content:
                    parts = member.name.removeprefix("./").split("/")
                    folders["/".join(parts[:3])] += member.size
            out.append(
                {
                    "compressed": layer["size"],
                    "uncompressed": sum(folders.values()),
                    "largest": folders.most_common(4),
                }
            )
    return out


def main(archive: str, out: str, image: str, revision: str) -> None:
    found = layers(archive)
    packed = sum(layer["compressed"] for layer in found)
    unpacked = sum(layer["uncompressed"] for layer in found)
    print(
        f"build-image: {image}: {len(found)} layers, {packed / 1e6:.1f} MB compressed, "
        f"{unpacked / 1e6:.1f} MB unpacked",
        file=sys.stderr,
    )
    for layer in found:
        big = ", ".join(f"/{name} {size / 1e6:.1f}" for name, size in layer["largest"])
        print(
            f"build-image:   {layer['compressed'] / 1e6:6.1f} MB "
            f"({layer['uncompressed'] / 1e6:.1f} MB unpacked): {big}",
            file=sys.stderr,
        )
    summary = {
        "image": image,
        "archive": archive,
        "revision": revision,
        "compressed_bytes": packed,
        "uncompressed_bytes": unpacked,
        "layers": found,
    }
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
