#!/usr/bin/env bash
# Builds (once) and reuses a virtual environment with a real Open WebUI from PyPI,
# kept outside the checkout because it is ~3 GB and takes minutes to install.
# Prints the venv's python path on the last line of stdout.
set -euo pipefail
OWUI_VERSION="${OWUI_VERSION:-0.12.4}"
CACHE_ROOT="${ACC_CACHE_DIR:-$HOME/.cache/async-context-compression}"
VENV="$CACHE_ROOT/openwebui-$OWUI_VERSION"
STAMP="$VENV/.complete"
PY="${PYTHON:-python3}"

if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import open_webui" >/dev/null 2>&1; then
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# A lock so two runs (CI and a developer) never build the same venv at once.
exec 9>"$CACHE_ROOT/.openwebui-$OWUI_VERSION.lock"
flock 9
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import open_webui" >/dev/null 2>&1; then
  echo "$VENV/bin/python"
  exit 0
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
# CPU torch first: open-webui depends on torch, and an unpinned torch pulls GBs of CUDA wheels.
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0" >&2
"$VENV/bin/python" -m pip install --quiet "open-webui==$OWUI_VERSION" >&2
"$VENV/bin/python" -c "import open_webui" >&2
touch "$STAMP"
echo "$VENV/bin/python"
