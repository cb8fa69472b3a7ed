# The rlhf-exporter image: Debian bookworm's python3, the exporter and its pinned dependencies in
# a virtualenv, a non-root user. One file, two ways to get the base (docs/image.md):
#   docker build -t ghcr.io/rlhf-exporter/rlhf-exporter:0.1.0 .          # debian:bookworm-slim
#   bash scripts/build-image.sh     # CI: a debootstrap'ed bookworm as BASE, buildah, no daemon
# Both bases are Debian 12 "bookworm", so both builds install the same python3 (3.11) from
# Debian's archive, and the same wheels (image/requirements.txt, installed by hash).
# The base by digest (a tag moves; a digest is the bytes that were checked): the image index
# docker resolved for debian:bookworm-slim. Update it with
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/debian:bookworm-slim
# (or `crane digest`), and review Debian's changes before committing the new one.
ARG BASE=docker.io/library/debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

# ------------------------------------------------------------------ build stage (not shipped)
FROM ${BASE} AS build
# PIP_CERT: a CA bundle path for pip when a TLS-intercepting proxy sits before PyPI (the CI
# build mounts the host's bundle there); PIP_INDEX_URL: a PyPI mirror. Both optional.
ARG PIP_CERT=""
ARG PIP_INDEX_URL=""
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
# /opt/build: pip (Debian's ensurepip) and the pinned wheel builders; /opt/rlhf-exporter: the
# shipped virtualenv, created without pip (the build venv's pip installs into it).
COPY image/requirements.txt image/build-requirements.txt /tmp/lock/
RUN python3 -m venv /opt/build \
 && python3 -m venv --without-pip /opt/rlhf-exporter \
 && /opt/build/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      --only-binary :all: ${PIP_CERT:+--cert "$PIP_CERT"} ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} \
      -r /tmp/lock/build-requirements.txt \
 && /opt/build/bin/pip --python /opt/rlhf-exporter/bin/python install --no-cache-dir \
      --disable-pip-version-check --require-hashes --only-binary :all: --no-deps \
      ${PIP_CERT:+--cert "$PIP_CERT"} ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} \
      -r /tmp/lock/requirements.txt
# The exporter itself last, so that a layer cache (docker build) rebuilds only these layers
# after a code change.
ARG VERSION=0.1.0
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY rlhf_exporter ./rlhf_exporter
RUN /opt/build/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
      --no-build-isolation -w /tmp/wheel . \
 && /opt/build/bin/pip --python /opt/rlhf-exporter/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --no-index /tmp/wheel/*.whl \
 && /opt/build/bin/pip --python /opt/rlhf-exporter/bin/python check \
 && /opt/rlhf-exporter/bin/python -c "import rlhf_exporter as e, sys; sys.exit(None if e.__version__ == '${VERSION}' else f'package {e.__version__} != VERSION ${VERSION}')"

# ------------------------------------------------------------------ the image
# What changes with the code comes last (the virtualenv, the revision label): everything above
# it is reused from a layer cache (docker build; scripts/build-image.sh caches only the base).
FROM ${BASE}
# python3 only (no pip, no compilers); apt's lists and caches removed in the same layer.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log \
 && groupadd --gid 10001 rlhf-exporter \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin rlhf-exporter

# Every setting of `serve` is also a variable RLHF_EXPORTER_<KEY> (flags win). The listening
# address lives here, not in CMD: `docker run IMAGE serve --verl-root /logs` replaces CMD and
# still listens on the container's network. Push is off unless asked for
# (RLHF_EXPORTER_PUSH=true with RLHF_EXPORTER_PUSH_TOKEN). The root is read-only under the
# chart: no bytecode is written at run time (the wheels' is compiled at install).
ENV PATH=/opt/rlhf-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RLHF_EXPORTER_LISTEN=0.0.0.0:19839 \
    RLHF_EXPORTER_PUSH=false \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
EXPOSE 19839
WORKDIR /
ENTRYPOINT ["rlhf-exporter"]
CMD ["serve"]

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="rlhf-exporter" \
      org.opencontainers.image.description="Prometheus exporter for verl RLHF training jobs: where the step time goes" \
      org.opencontainers.image.source="https://github.com/rlhf-exporter/rlhf-exporter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# Numeric, so that Kubernetes' runAsNonRoot can verify it (the chart runs 10001:10001).
USER 10001:10001

# Owned by root, read-only to the user: the exporter writes nothing under its own files.
COPY --from=build /opt/rlhf-exporter /opt/rlhf-exporter
# The commit the image is built from (scripts/build-image.sh: git rev-parse HEAD, "-dirty"
# with uncommitted changes); `docker build --build-arg REVISION=$(git rev-parse HEAD)`.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
