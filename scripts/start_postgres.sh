#!/usr/bin/env bash
# A throwaway PostgreSQL server for the summary-store tests.
#
#   scripts/start_postgres.sh [start]      start one in a new temp dir; prints
#                                          "PGDIR=<dir>" and then the DSN as the
#                                          last line of stdout
#   scripts/start_postgres.sh stop <dir>   stop it and delete <dir>
#   scripts/start_postgres.sh pause <dir>  stop it, keeping its data (fault tests:
#                                          "the database went away")
#   scripts/start_postgres.sh resume <dir> start it again on the same port
#
# Works on a fresh Debian machine as root (CI): installs the `postgresql`
# package only when initdb/pg_ctl are missing, and runs the server as a
# non-root user (PostgreSQL refuses root): the `postgres` system user, or
# `acc_pg`, created for the purpose. Trust authentication on 127.0.0.1 only,
# a free port, no durability (fsync off): test data only.
set -euo pipefail

PY="${PYTHON:-python3}"
DB_NAME="${ACC_PG_DB:-acc_test}"

log() { echo "start_postgres: $*" >&2; }

find_bin_dir() {
  local candidate dir
  candidate="$(command -v pg_ctl 2>/dev/null || true)"
  if [ -n "$candidate" ] && command -v initdb >/dev/null 2>&1; then
    dir="$(dirname "$(readlink -f "$candidate")")"
    if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

install_postgres() {
  if [ "$(id -u)" != 0 ]; then
    log "initdb/pg_ctl not found and not root: install PostgreSQL (apt-get install postgresql) or set ACC_TEST_PG_DSN"
    exit 1
  fi
  log "PostgreSQL not found; installing it with apt-get (once)"
  # Two test runs at once must not both run apt.
  exec 8>/tmp/.acc-start-postgres-apt.lock
  flock 8
  if find_bin_dir >/dev/null; then
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
}

# Runs a command as the server's user (itself when not root).
as_server_user() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u "$SERVER_USER" -- "$@"
  else
    "$@"
  fi
}

pick_server_user() {
  if [ "$(id -u)" != 0 ]; then
    SERVER_USER="$(id -un)"
  elif id -u postgres >/dev/null 2>&1; then
    SERVER_USER=postgres
  else
    if ! id -u acc_pg >/dev/null 2>&1; then
      useradd --system --no-create-home --shell /usr/sbin/nologin acc_pg
    fi
    SERVER_USER=acc_pg
  fi
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local bin dir port attempt
  bin="$(find_bin_dir || true)"
  if [ -z "$bin" ]; then
    install_postgres
    bin="$(find_bin_dir)"
  fi
  pick_server_user
  dir="$(mktemp -d "${TMPDIR:-/tmp}/acc-pg.XXXXXX")"
  chmod 700 "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown "$SERVER_USER" "$dir"
  fi
  cd "$dir"  # the server user may not be allowed into the caller's directory
  as_server_user "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 \
    --locale=C --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
  cat >"$dir/data/pg_hba.conf" <<'EOF'
local   all   all                 trust
host    all   all   127.0.0.1/32  trust
EOF
  for attempt in 1 2 3 4 5; do
    port="$(free_port)"
    cat >"$dir/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    if [ "$(id -u)" = 0 ]; then
      chown "$SERVER_USER" "$dir/data/postgresql.auto.conf" "$dir/data/pg_hba.conf"
    fi
    if as_server_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null 2>&1; then
      break
    fi
    log "start on port $port failed (attempt $attempt)"
    tail -n 5 "$dir/server.log" >&2 || true
    if [ "$attempt" = 5 ]; then
      exit 1
    fi
  done
  "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DB_NAME"
  echo "$bin" >"$dir/bindir"
  echo "$SERVER_USER" >"$dir/server_user"
  echo "PGDIR=$dir"
  echo "postgresql://postgres@127.0.0.1:$port/$DB_NAME"
}

stop() {
  local dir="${1:?usage: start_postgres.sh stop <dir>}"
  if [ ! -f "$dir/bindir" ]; then
    log "$dir is not a server made by this script"
    exit 1
  fi
  SERVER_USER="$(cat "$dir/server_user")"
  cd "$dir"
  as_server_user "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  cd /
  rm -rf "$dir"
}

pause_or_resume() {
  local what="$1" dir="${2:?usage: start_postgres.sh pause|resume <dir>}"
  if [ ! -f "$dir/bindir" ]; then
    log "$dir is not a server made by this script"
    exit 1
  fi
  SERVER_USER="$(cat "$dir/server_user")"
  cd "$dir"
  if [ "$what" = pause ]; then
    as_server_user "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  else
    as_server_user "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  pause|resume) pause_or_resume "$1" "${2:-}" ;;
  *) echo "usage: $0 [start] | stop <dir> | pause <dir> | resume <dir>" >&2; exit 2 ;;
esac
