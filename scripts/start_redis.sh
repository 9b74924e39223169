#!/usr/bin/env bash
# A throwaway Redis for the several-replica tests and bench (Open WebUI's
# WEBSOCKET_MANAGER=redis / REDIS_URL).
#
#   scripts/start_redis.sh [start]      start one in a new temp dir; prints
#                                       "REDISDIR=<dir>" and then the URL as the
#                                       last line of stdout
#   scripts/start_redis.sh stop <dir>   stop it and delete <dir>
#
# Works on a fresh Debian machine as root (CI): installs the `redis-server`
# package only when the binary is missing. Loopback only, a free port, no
# persistence (no RDB snapshots, no AOF): test data only.
set -euo pipefail

PY="${PYTHON:-python3}"

log() { echo "start_redis: $*" >&2; }

install_redis() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=sudo
    else
      log "redis-server not found and not root: install it (apt-get install redis-server)"
      exit 1
    fi
  fi
  log "redis-server not found; installing it with apt-get (once)"
  exec 8>/tmp/.acc-start-redis-apt.lock
  flock 8
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq redis-server >&2
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local dir port attempt bin cli
  if ! command -v redis-server >/dev/null 2>&1; then
    install_redis
  fi
  bin="$(command -v redis-server)"
  cli="$(command -v redis-cli || true)"
  dir="$(mktemp -d "${TMPDIR:-/tmp}/acc-redis.XXXXXX")"
  chmod 700 "$dir"
  for attempt in 1 2 3 4 5; do
    port="$(free_port)"
    cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
protected-mode yes
port $port
dir $dir
save ""
appendonly no
daemonize yes
pidfile $dir/redis.pid
logfile $dir/server.log
CONF
    if "$bin" "$dir/redis.conf" >/dev/null 2>&1; then
      local i
      for i in $(seq 1 100); do
        if [ -n "$cli" ]; then
          if "$cli" -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            break 2
          fi
        elif "$PY" -c 'import socket,sys; s=socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1); s.sendall(b"PING\r\n"); sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)' "$port" 2>/dev/null; then
          break 2
        fi
        sleep 0.1
      done
    fi
    log "start on port $port failed (attempt $attempt)"
    tail -n 5 "$dir/server.log" >&2 || true
    [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
    if [ "$attempt" = 5 ]; then
      exit 1
    fi
  done
  echo "$port" >"$dir/port"
  echo "REDISDIR=$dir"
  echo "redis://127.0.0.1:$port/0"
}

stop() {
  local dir="${1:?usage: start_redis.sh stop <dir>}" pid i
  if [ ! -f "$dir/port" ]; then
    log "$dir is not a server made by this script"
    exit 1
  fi
  if [ -f "$dir/redis.pid" ]; then
    pid="$(cat "$dir/redis.pid")"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

case "${1:-start}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 [start] | stop <dir>" >&2; exit 2 ;;
esac
