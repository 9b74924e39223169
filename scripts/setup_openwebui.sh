#!/usr/bin/env bash
# Builds (once) and reuses a virtual environment with a real Open WebUI from PyPI,
# kept outside the checkout because it is ~3 GB. Prints the venv's python path on
# the last line of stdout.
#
#   OWUI_VERSION=0.11.6 bash scripts/setup_openwebui.sh
#
# uv resolves and installs Open WebUI (about a minute for a fresh version, seconds
# for a second one that shares its cache); pip installs the CPU build of torch
# first, from the wheel this machine keeps on disk, because open-webui depends on
# torch and an unpinned torch pulls several GB of CUDA wheels. Plain pip is the
# fallback when uv cannot be had.
set -euo pipefail
OWUI_VERSION="${OWUI_VERSION:-0.12.4}"
CACHE_ROOT="${ACC_CACHE_DIR:-$HOME/.cache/async-context-compression}"
VENV="$CACHE_ROOT/openwebui-$OWUI_VERSION"
STAMP="$VENV/.complete"
PY="${PYTHON:-python3}"
TORCH="torch==2.13.0"

COMPILED="$VENV/.bytecode"
installed() { [ -f "$STAMP" ] && "$VENV/bin/python" -c "import open_webui" >/dev/null 2>&1; }
ready() { [ -f "$COMPILED" ] && installed; }

# uv installs without compiling bytecode, and the servers run with PYTHONDONTWRITEBYTECODE: without this step
# every worker of every start compiled Open WebUI and its dependencies from source again (a two-worker start on
# this machine: 90 s before, 53 s after). A venv built before this step gets it once, on its next use.
compile_bytecode() {
  echo "[setup] compiling Open WebUI $OWUI_VERSION's bytecode (once, about a minute)…" >&2
  local site
  site="$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true  # a few files of old syntax never compile
  touch "$COMPILED"
}

if ready; then
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# A lock so two runs (CI and a developer) never build the same venv at once.
exec 9>"$CACHE_ROOT/.openwebui-$OWUI_VERSION.lock"
flock 9
if ready; then
  echo "$VENV/bin/python"
  exit 0
fi
if installed; then
  compile_bytecode
  echo "$VENV/bin/python"
  exit 0
fi

# uv itself lives in a small venv of its own beside the servers.
UV="$CACHE_ROOT/uv/bin/uv"
if [ ! -x "$UV" ]; then
  "$PY" -m venv "$CACHE_ROOT/uv" >&2 && "$CACHE_ROOT/uv/bin/python" -m pip install --quiet uv >&2 || true
fi

# Versions older than 0.9.1 import aiosqlite without declaring it; PostgreSQL
# needs the sync driver beside the async one Open WebUI already brings.
EXTRAS=("aiosqlite" "psycopg2-binary")

rm -rf "$VENV"
echo "[setup] installing Open WebUI $OWUI_VERSION into $VENV (once)…" >&2
if [ -x "$UV" ]; then
  "$UV" venv --quiet --seed --python "$(command -v "$PY")" "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet "$TORCH" >&2
  UV_CACHE_DIR="$CACHE_ROOT/uv-cache" "$UV" pip install --quiet --python "$VENV/bin/python" \
    "open-webui==$OWUI_VERSION" "${EXTRAS[@]}" "$TORCH" >&2
else
  "$PY" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet "$TORCH" >&2
  "$VENV/bin/python" -m pip install --quiet "open-webui==$OWUI_VERSION" "${EXTRAS[@]}" >&2
fi
"$VENV/bin/python" -c "import open_webui, torch; assert torch.__version__.startswith('2.13.0')" >&2
touch "$STAMP"
compile_bytecode
echo "$VENV/bin/python"
