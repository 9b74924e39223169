#!/usr/bin/env bash
# The version matrix: a representative end-to-end subset (tests marked
# `versions`: a long chat with background summaries, stored and live tool
# calls, a regenerated reply, an API call, no provider 400 anywhere) against
# each older Open WebUI this filter claims to support. The full suite already
# runs against the newest one (scripts/test.sh), so 0.12.4 is not repeated here.
#
#   bash scripts/test_versions.sh                 # the default matrix below
#   bash scripts/test_versions.sh 0.10.2 0.11.4   # chosen versions
#   ACC_VERSIONS="0.11.4" bash scripts/test.sh    # through the main command
#   bash scripts/test_versions.sh --list          # the versions it would run, and nothing else
#
# Each version's server runs from its own cached venv (scripts/setup_openwebui.sh,
# about a minute to install once, outside the checkout); pytest itself runs from
# the 0.12.4 venv and only the server under test changes (ACC_OPENWEBUI_PYTHON).
# One version at a time, one server at a time. Pytest arguments follow `--`:
#   bash scripts/test_versions.sh 0.9.0 -- -k request_hook
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest version declared in the filter's header, and a 0.11.x release.
DEFAULT_VERSIONS="$(sed -n 's/^required_open_webui_version: *//p' async_context_compression.py | head -n 1) 0.11.4"
CHOSEN=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  CHOSEN+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift  # the rest goes to pytest
read -r -a VERSIONS <<<"${CHOSEN[*]:-${ACC_VERSIONS:-$DEFAULT_VERSIONS}}"
if [ "${VERSIONS[0]:-}" = "--list" ]; then
  read -r -a VERSIONS <<<"${ACC_VERSIONS:-$DEFAULT_VERSIONS}"
  echo "${VERSIONS[*]}"
  exit 0
fi

RUNNER="$(OWUI_VERSION=0.12.4 bash scripts/setup_openwebui.sh | tail -n 1)"
STAMP="$(dirname "$RUNNER")/../.dev-requirements-$(sha256sum requirements-dev.txt | cut -c1-16)"
if [ ! -f "$STAMP" ]; then  # as scripts/test.sh does, for a standalone run
  "$RUNNER" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
  touch "$STAMP"
fi
export PYTHONDONTWRITEBYTECODE=1
failed=()
for version in "${VERSIONS[@]}"; do
  started=$(date +%s)
  server_python="$(OWUI_VERSION="$version" bash scripts/setup_openwebui.sh | tail -n 1)"
  echo "[versions] Open WebUI $version: $server_python (ready in $(($(date +%s) - started)) s)"
  if ACC_OPENWEBUI_PYTHON="$server_python" ACC_EXPECT_OPENWEBUI_VERSION="$version" \
    "$RUNNER" -m pytest tests/e2e -m versions -p no:cacheprovider "$@"; then
    echo "[versions] Open WebUI $version: passed in $(($(date +%s) - started)) s"
  else
    echo "[versions] Open WebUI $version: FAILED after $(($(date +%s) - started)) s"
    failed+=("$version")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "[versions] failed on: ${failed[*]}"
  exit 1
fi
echo "[versions] passed on: ${VERSIONS[*]}"
