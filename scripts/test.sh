#!/usr/bin/env bash
# Runs the whole test suite: unit and property tests, the summary store on
# SQLite and a throwaway PostgreSQL, and the end-to-end suite inside a real
# Open WebUI from PyPI. Works on a fresh machine: everything it needs is
# installed here and cached outside the checkout for the next run.
# Extra arguments go to pytest (e.g. scripts/test.sh -k repair); without any,
# the e2e subset also runs against older Open WebUI versions (test_versions.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="$(bash scripts/setup_openwebui.sh | tail -n 1)"
STAMP="$(dirname "$PY")/../.dev-requirements-$(sha256sum requirements-dev.txt | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  "$PY" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
  touch "$STAMP"
fi

# The browser test drives Debian's Chromium (never a browser download): install
# it when missing and this machine can (root or sudo, apt-get); otherwise that
# one test is skipped and says why.
CHROMIUM="${ACC_CHROMIUM:-/usr/bin/chromium}"
if [ "${ACC_SKIP_E2E:-}" != "1" ] && [ ! -x "$CHROMIUM" ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="$(command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && echo sudo || true)"; fi
  if [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; then
    echo "[test] installing Chromium from Debian's packages for the browser test (once)…" >&2
    { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium; } >&2 \
      || echo "[test] could not install Chromium; the browser test will be skipped" >&2
  fi
fi

# The several-replica test (tests/e2e/test_replicas.py) and bench/load.py
# --replicas share one Redis from Debian's redis-server package: install it
# when missing, as for Chromium (scripts/start_redis.sh also installs it).
if [ "${ACC_SKIP_E2E:-}" != "1" ] && ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="$(command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && echo sudo || true)"; fi
  if [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; then
    echo "[test] installing redis-server from Debian's packages for the replica test (once)…" >&2
    { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q redis-server; } >&2 \
      || echo "[test] could not install redis-server; the replica test will fail and say so" >&2
  fi
fi

export PYTHONDONTWRITEBYTECODE=1
export ACC_OPENWEBUI_PYTHON="$PY"
# Lint and formatting first: cheap, and a failure names the line.
RUFF="$(dirname "$PY")/ruff"
"$RUFF" check --quiet .
"$RUFF" format --check --quiet .
if [ "$#" -gt 0 ] || [ "${ACC_SKIP_E2E:-}" = "1" ] || [ "${ACC_VERSIONS:-}" = "none" ]; then
  exec "$PY" -m pytest "$@"
fi
# The whole suite (no arguments): everything against 0.12.4 and the version
# matrix (scripts/test_versions.sh: the e2e subset against the oldest version
# the filter declares and a 0.11.x; ACC_VERSIONS="..." picks others, "none" skips),
# in two lanes at once, one per core. Most of an end-to-end test is waiting on
# servers, so one core runs the e2e modules on the session's Open WebUIs and the
# replicas, while the other runs every other test folder, the e2e modules that
# start their own deployment (listed here, the three sharing conftest's
# local_servers first; a new e2e module joins the first lane by default) and then the version matrix (its own servers, one at a time: the
# first lane is the longer one, so the matrix waits there no more). Each lane is
# one pytest session with its own fixtures and its own 25 slowest tests; the
# second lane's output is printed when it ends. Together the lanes collect
# exactly the tests `pytest` alone does, and the matrix runs after them.
OWN_DEPLOYMENTS=(
  tests/e2e/test_local_backends.py
  tests/e2e/test_served_window.py
  tests/e2e/test_ollama_connection.py
  tests/e2e/test_trust_between_users.py
  tests/e2e/test_retention.py
  tests/e2e/test_demo_check.py
)
SECOND=()
for dir in tests/*/; do
  [ "${dir%/}" != tests/e2e ] && SECOND+=("${dir%/}")
done
SECOND+=("${OWN_DEPLOYMENTS[@]}")
FIRST=(tests/e2e)
for module in "${OWN_DEPLOYMENTS[@]}"; do FIRST+=("--ignore=$module"); done

started=$(date +%s)
second_log="$(mktemp -t acc-second-lane.XXXXXX)"
{
  rc=0
  "$PY" -m pytest -p no:cacheprovider "${SECOND[@]}" || rc=$?
  echo "[test] second lane's pytest ended after $(($(date +%s) - started)) s"
  bash scripts/test_versions.sh || rc=$?
  echo "[test] second lane ended after $(($(date +%s) - started)) s"
  exit "$rc"
} >"$second_log" 2>&1 &
second_pid=$!
trap 'kill "$second_pid" 2>/dev/null || true' INT TERM
first=0
"$PY" -m pytest "${FIRST[@]}" || first=$?
echo "[test] first lane (e2e on the session servers, replicas) $([ "$first" = 0 ] && echo passed || echo FAILED) after $(($(date +%s) - started)) s; waiting for the second lane"
second=0
wait "$second_pid" || second=$?
echo "[test] ---- second lane: ${SECOND[*]} ----"
cat "$second_log"
rm -f "$second_log"
echo "[test] second lane (unit, project, devkit, db, e2e with their own deployments, version matrix) $([ "$second" = 0 ] && echo passed || echo FAILED); whole run $(($(date +%s) - started)) s"
[ "$first" = 0 ] && [ "$second" = 0 ]
