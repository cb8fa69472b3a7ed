#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system tools, a virtualenv, then pytest.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# promtool (prometheus) and amtool (prometheus-alertmanager) come from Debian's packages, and
# so do VictoriaMetrics and vmalert (victoria-metrics: the remote-write fleet test).
need=()
# Debian's headless Chromium drives the job view's browser tests (tests/test_view_browser.py).
command -v chromium-headless-shell >/dev/null 2>&1 || need+=(chromium-headless-shell)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing ${need[*]} (Debian packages)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "warning: ${need[*]} missing and not root: tests that need them will skip" >&2
  fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# verl's generated configuration is test data (tests/test_verl_config_keys.py reads its YAML
# files, never imports it): the wheel is pure Python, installed without its dependencies
# (torch, vLLM, ...), which pip cannot express in pyproject.toml.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps 'verl==0.9.1'

# Lint, format and type checks first (configured in pyproject.toml); SKIP_LINT=1 skips them
# when re-running a few tests.
if [ "${SKIP_LINT:-0}" != 1 ]; then
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy
fi

# ---- The container image (issue 27; docs/image.md) ---------------------------------------
# Built from Debian's packages (debootstrap) with buildah, no Docker daemon or registry, and
# run by tests/test_image.py as the chart runs it. The debootstrap tarball and the base image
# are cached in /var/cache/rlhf-exporter-image; the image is rebuilt on every run (~2 min).
# Under CI=true (.ci/run) the image tests fail when it is missing; elsewhere they skip.
# SKIP_IMAGE=1 skips the build (the tests then use the last image built), and so does naming
# test files of which none is tests/test_image.py.
build_image=1
for arg in "$@"; do case "$arg" in tests/*|*.py|*::*) build_image=0 ;; esac; done
for arg in "$@"; do case "$arg" in *test_image*) build_image=1 ;; esac; done
if [ "${SKIP_IMAGE:-0}" != 1 ] && [ "$build_image" = 1 ]; then
  image_need=()
  for tool in buildah debootstrap umoci; do
    command -v "$tool" >/dev/null 2>&1 || image_need+=("$tool")
  done
  if [ "$(id -u)" != 0 ]; then
    echo "warning: not root: the image is not built (scripts/build-image.sh needs root); tests/test_image.py will skip, or fail under CI=true" >&2
  else
    if [ ${#image_need[@]} -gt 0 ]; then
      echo "installing ${image_need[*]} (Debian packages, for the container image)" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${image_need[@]}" >/dev/null
    fi
    bash scripts/build-image.sh
  fi
fi
# ---- end of the container image block ----------------------------------------------------

# Ray's tests start their own head (`ray start --head`) and always stop it.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
