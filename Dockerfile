# The rlhf-exporter image: Python slim, this repository installed with pip, a non-root user.
# Untested by CI: this project's machines have no Docker engine, so the image is never built
# there (tests/test_helm.py only checks that its user matches the chart's securityContext).
#   docker build -t ghcr.io/rlhf-exporter/rlhf-exporter:0.1.0 .
FROM python:3.11-slim

# Push off unless asked for (-e RLHF_EXPORTER_PUSH=true with RLHF_EXPORTER_PUSH_TOKEN): on a
# pod's address, push without a token is refused at start.
ENV RLHF_EXPORTER_PUSH=false \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY rlhf_exporter ./rlhf_exporter
RUN pip install . && cd / && rm -rf /src

# Numeric, so that Kubernetes' runAsNonRoot can verify it (the chart runs 10001:10001).
USER 10001:10001
WORKDIR /
EXPOSE 19839
ENTRYPOINT ["rlhf-exporter"]
# Outside a pod the exporter's own default (127.0.0.1) would be unreachable.
CMD ["serve", "--listen", "0.0.0.0:19839"]
