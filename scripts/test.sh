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
# in three lanes at once on the two cores: most of an end-to-end test is waiting
# on servers, which a third lane fills (issue 45). The first lane runs the e2e
# modules on the session's Open WebUIs (a new e2e module joins it by default).
# The second runs every other test folder, the e2e modules listed in
# OWN_DEPLOYMENTS (the four sharing conftest's local_servers first), then the
# matrix's first version. The third runs the modules in THIRD_LANE, each starting
# a deployment of its own (PostgreSQL, Redis, replicas, the demo), then the
# matrix's other versions. Each lane is one pytest session (or one per version) with its own
# fixtures and 25 slowest tests; the second and third lanes' output is printed
# when they end. Together the lanes collect exactly the tests `pytest` alone does,
# and the matrix runs after them.
OWN_DEPLOYMENTS=(
  tests/e2e/test_local_backends.py
  tests/e2e/test_served_window.py
  tests/e2e/test_ollama_connection.py
  tests/e2e/test_trust_between_users.py
  tests/e2e/test_retention.py
)
THIRD_LANE=(
  tests/e2e/test_replicas.py
  tests/e2e/test_faults_pg.py
  tests/e2e/test_demo_check.py
)
SECOND=()
for dir in tests/*/; do
  [ "${dir%/}" != tests/e2e ] && SECOND+=("${dir%/}")
done
SECOND+=("${OWN_DEPLOYMENTS[@]}")
FIRST=(tests/e2e)
for module in "${OWN_DEPLOYMENTS[@]}" "${THIRD_LANE[@]}"; do FIRST+=("--ignore=$module"); done
read -r -a VERSIONS <<<"$(bash scripts/test_versions.sh --list)"

started=$(date +%s)
# lane NAME PYTEST-ARGS... -- VERSIONS...: one pytest session, then the versions' matrix, in the background;
# its output goes to a log printed when the run ends
lane() {
  local name="$1" log
  shift
  log="$(mktemp -t "acc-$name-lane.XXXXXX")"
  LOGS+=("$name:$log")
  {
    local rc=0 args=() versions=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    [ "$#" -gt 0 ] && shift
    versions=("$@")
    "$PY" -m pytest -p no:cacheprovider "${args[@]}" || rc=$?
    echo "[test] $name lane's pytest ended after $(($(date +%s) - started)) s"
    if [ "${#versions[@]}" -gt 0 ]; then
      bash scripts/test_versions.sh "${versions[@]}" || rc=$?
    fi
    echo "[test] $name lane ended after $(($(date +%s) - started)) s"
    exit "$rc"
  } >"$log" 2>&1 &
  PIDS+=("$!")
}
LOGS=()
PIDS=()
lane second "${SECOND[@]}" -- "${VERSIONS[@]:0:1}"
lane third "${THIRD_LANE[@]}" -- "${VERSIONS[@]:1}"
trap 'kill "${PIDS[@]}" 2>/dev/null || true' INT TERM
first=0
"$PY" -m pytest "${FIRST[@]}" || first=$?
echo "[test] first lane (e2e on the session servers) $([ "$first" = 0 ] && echo passed || echo FAILED) after $(($(date +%s) - started)) s; waiting for the others"
others=0
for n in "${!PIDS[@]}"; do
  rc=0
  wait "${PIDS[$n]}" || rc=$?
  name="${LOGS[$n]%%:*}"
  echo "[test] ---- $name lane ----"
  cat "${LOGS[$n]#*:}"
  rm -f "${LOGS[$n]#*:}"
  echo "[test] $name lane $([ "$rc" = 0 ] && echo passed || echo FAILED)"
  [ "$rc" = 0 ] || others=1
done
echo "[test] whole run $(($(date +%s) - started)) s: first lane $([ "$first" = 0 ] && echo passed || echo FAILED), the others $([ "$others" = 0 ] && echo passed || echo FAILED)"
[ "$first" = 0 ] && [ "$others" = 0 ]
