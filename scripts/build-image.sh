#!/usr/bin/env bash
# Build the exporter's image without a Docker daemon or a registry, as CI does (docs/image.md):
#   1. base: `debootstrap --variant=minbase bookworm` from Debian's archive, slimmed as Debian's
#      own bookworm-slim image is, kept as a tarball in the cache        (cached, ~3 min once)
#   2. that tarball imported as a local base image into buildah's storage (cached)
#   3. `buildah bud` of ./Dockerfile on that base: both stages rebuilt on every run (~100 s)
#   4. the image written as an oci-archive a user can push (skopeo copy oci-archive:... docker://...)
# Idempotent: a second run reuses the cached base, rebuilds the image and rewrites the archive.
#
# Usage: bash scripts/build-image.sh            (as root: debootstrap and buildah's vfs storage)
# Settings (environment):
#   RLHF_IMAGE_CACHE   cache of the debootstrap tarball and buildah's storage
#                      (default /var/cache/rlhf-exporter-image)
#   RLHF_IMAGE_OUT     where the oci-archive and image.json go (default build/image, git-ignored)
#   DEBIAN_MIRROR      Debian archive for debootstrap (default https://deb.debian.org/debian)
#   DEBIAN_KEYRING     the keyring debootstrap checks the archive's Release signature with
#                      (default /usr/share/keyrings/debian-archive-keyring.gpg, from the
#                      Debian package debian-archive-keyring); every package it installs is
#                      then checked against the signed Release's hashes, whatever the mirror
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm  # Debian 12: the release of the Dockerfile's default BASE (debian:bookworm-slim)
CACHE=${RLHF_IMAGE_CACHE:-/var/cache/rlhf-exporter-image}
OUT=${RLHF_IMAGE_OUT:-$PWD/build/image}
MIRROR=${DEBIAN_MIRROR:-https://deb.debian.org/debian}
KEYRING=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# inside the image, apt reads the archive over http (minbase has no CA certificates) and
# checks it with the same keyring (Signed-By below)
IMAGE_MIRROR=${DEBIAN_IMAGE_MIRROR:-http://deb.debian.org/debian}
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)

START=$SECONDS
STEP="start"
step() {
  STEP=$1
  echo "build-image: [$(date -u +%T)] $1" >&2
}
done_step() { echo "build-image:   done in $(($SECONDS - $1)) s" >&2; }
fail() {
  echo "build-image: FAILED: $*" >&2
  exit 1
}
trap 'rc=$?; [ $rc = 0 ] || echo "build-image: FAILED at step \"$STEP\" (exit $rc); see the output above" >&2' EXIT

[ -s "$KEYRING" ] || fail "no keyring at $KEYRING: install the Debian package debian-archive-keyring (or set DEBIAN_KEYRING); debootstrap never runs unchecked"
[ "$(id -u)" = 0 ] || fail "must run as root (debootstrap, and buildah's vfs storage with chroot isolation)"
for tool in buildah debootstrap tar sha256sum python3; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (scripts/test.sh installs the Debian packages buildah and debootstrap)"
done

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' rlhf_exporter/__init__.py)
[ -n "$VERSION" ] || fail "no __version__ in rlhf_exporter/__init__.py"
# The chart's image.repository: the name the built image gets, so that the chart's default
# reference (repository:appVersion) is this image.
REPOSITORY=$(sed -n 's/^  repository: *\([^ #]*\).*$/\1/p' helm/rlhf-exporter/values.yaml | head -n1)
[ -n "$REPOSITORY" ] || fail "no image.repository in helm/rlhf-exporter/values.yaml"
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  REVISION="$REVISION-dirty"
fi
IMAGE="$REPOSITORY:$VERSION"
mkdir -p "$CACHE" "$OUT"
B=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)

# ------------------------------------------------------------------ 1. the debootstrap tarball
BASE_TAR="$CACHE/debootstrap-$SUITE-minbase-$ARCH.tar"
step "base root filesystem: debootstrap --variant=minbase --keyring=$KEYRING $SUITE ($MIRROR)"
t=$SECONDS
if [ -s "$BASE_TAR" ]; then
  echo "build-image:   cached: $BASE_TAR" >&2
else
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rc=$?; rm -rf "$rootfs"; [ $rc = 0 ] || echo "build-image: FAILED at step \"$STEP\" (exit $rc); see the output above" >&2' EXIT
  # --keyring: the Release file's signature is checked (and debootstrap fails when it cannot
  # be), and each package against the signed hashes; --force-check-gpg refuses to go on
  # without a signature
  debootstrap --variant=minbase --arch="$ARCH" --keyring="$KEYRING" --force-check-gpg \
    "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$CACHE/debootstrap.log" >&2; fail "debootstrap failed (log: $CACHE/debootstrap.log)"; }
  # What Debian's bookworm-slim image does (debuerreotype --slimify): no docs but copyright
  # files, no man pages or locales, for later dpkg installs too; apt keeps no caches.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf 'Acquire::Languages "none";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  printf 'APT::AutoRemove::SuggestsImportant "false";\n' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
  # The suites Debian's image uses: the release, its updates and its security fixes.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $IMAGE_MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{groff,info,linda,lintian,locale,man}/* \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf
  : >"$rootfs/etc/machine-id"
  tar --numeric-owner --xattrs --sort=name -C "$rootfs" -cf "$BASE_TAR.part" .
  mv "$BASE_TAR.part" "$BASE_TAR"
  rm -rf "$rootfs"
  echo "build-image:   $(du -h "$BASE_TAR" | cut -f1) $BASE_TAR" >&2
fi
done_step $t

# ------------------------------------------------------------------ 2. the local base image
BASE_IMAGE="localhost/rlhf-exporter-base:$SUITE-minbase-$(sha256sum "$BASE_TAR" | cut -c1-12)"
step "base image: $BASE_IMAGE"
t=$SECONDS
if "${B[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "build-image:   cached" >&2
else
  ctr=$("${B[@]}" from --quiet scratch)
  mnt=$("${B[@]}" mount "$ctr")
  tar --numeric-owner --xattrs -xpf "$BASE_TAR" -C "$mnt"
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config --created-by "debootstrap --variant=minbase $SUITE $MIRROR (scripts/build-image.sh)" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label "org.opencontainers.image.description=debootstrap --variant=minbase $SUITE" "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
fi
done_step $t

# ------------------------------------------------------------------ 3. the exporter's image
step "image: buildah bud --build-arg BASE=$BASE_IMAGE -t $IMAGE (revision $REVISION)"
t=$SECONDS
ca=()
# A TLS-intercepting proxy before PyPI: give the build's pip this machine's CA bundle.
for bundle in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$bundle" ] && [ -s "$bundle" ]; then
    ca=(--volume "$bundle:/run/build-ca.pem:ro" --build-arg PIP_CERT=/run/build-ca.pem)
    break
  fi
done
# No --layers: with vfs every cached step still copies the whole root into a new container and
# deletes it afterwards, which measured slower (~180 s) than building both stages afresh
# (~100 s: apt and pip run each time) on this machine. What is cached is the base.
"${B[@]}" bud --isolation chroot --pull=never --format oci -f Dockerfile \
  --build-arg "BASE=$BASE_IMAGE" --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" \
  ${PIP_INDEX_URL:+--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"} "${ca[@]}" \
  -t "$IMAGE" . \
  || fail "buildah bud failed"
done_step $t

# ------------------------------------------------------------------ 4. the oci-archive
ARCHIVE="$OUT/rlhf-exporter-$VERSION.oci.tar"
step "oci-archive: $ARCHIVE"
t=$SECONDS
rm -f "$ARCHIVE.part"
"${B[@]}" push --quiet "$IMAGE" "oci-archive:$ARCHIVE.part:$IMAGE"
mv "$ARCHIVE.part" "$ARCHIVE"
# The previous build of this tag (now untagged) goes; the base stays (vfs keeps a full copy
# of the root for every layer: this bounds the storage to the base and the last image).
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
python3 scripts/image-summary.py "$ARCHIVE" "$OUT/image.json" "$IMAGE" "$REVISION"
done_step $t
echo "build-image: done in $((SECONDS - START)) s; push with: skopeo copy oci-archive:$ARCHIVE docker://$IMAGE" >&2
