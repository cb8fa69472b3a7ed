#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system tools, a virtualenv, then pytest.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# promtool (prometheus) and amtool (prometheus-alertmanager) come from Debian's packages, and
# so do VictoriaMetrics and vmalert (victoria-metrics: the remote-write fleet test).
need=()
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

# Ray's tests start their own head (`ray start --head`) and always stop it.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
