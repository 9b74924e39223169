"""Throwaway PostgreSQL and Redis servers for tests and benches of several
Open WebUI replicas (stdlib only; psycopg is imported only to run SQL).

* :class:`ThrowawayPostgres` wraps ``scripts/start_postgres.sh``: a server on
  a free loopback port in a temp dir, trust authentication, no durability.
* :class:`ThrowawayRedis` wraps ``scripts/start_redis.sh``: a server on a free
  loopback port in a temp dir, no persistence.
* :func:`replica_env` is the environment every replica of one deployment
  shares: the database (with ``DATABASE_SCHEMA``), Redis as the socket
  manager and the same ``WEBUI_SECRET_KEY``.

Both scripts install their Debian package when it is missing and they run as
root (or with sudo); otherwise starting fails with the reason.
"""

from __future__ import annotations

import atexit
import os
import subprocess
from typing import Optional

__all__ = ["ThrowawayPostgres", "ThrowawayRedis", "replica_env"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_POSTGRES = os.path.join(_ROOT, "scripts", "start_postgres.sh")
START_REDIS = os.path.join(_ROOT, "scripts", "start_redis.sh")


def _run_start(script: str, dir_key: str, what: str) -> tuple:
    proc = subprocess.run(["bash", script, "start"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"could not start {what} ({script}):\n{proc.stderr[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    directory = next(line[len(dir_key) + 1 :] for line in lines if line.startswith(dir_key + "="))
    return directory, lines[-1]


class ThrowawayPostgres:
    """``start()`` returns the superuser DSN (``postgresql://postgres@127.0.0.1:PORT/acc_test``)."""

    def __init__(self) -> None:
        self.dir: Optional[str] = None
        self.dsn: Optional[str] = None

    def start(self) -> "ThrowawayPostgres":
        self.dir, self.dsn = _run_start(START_POSTGRES, "PGDIR", "PostgreSQL")
        atexit.register(self.stop)
        return self

    def database_url(self, database: str) -> str:
        """The URL of another database on this server (same superuser)."""
        assert self.dsn, "start() first"
        return self.dsn.rsplit("/", 1)[0] + "/" + database

    def sql(self, *statements: str, database: Optional[str] = None) -> list:
        """Run ``statements`` (autocommit); a list with each one's rows (None without a result)."""
        import psycopg

        rows = []
        with psycopg.connect(self.database_url(database) if database else self.dsn, autocommit=True) as conn:
            for statement in statements:
                cur = conn.execute(statement)
                rows.append(cur.fetchall() if cur.description else None)
        return rows

    def create_database(self, name: str, schema: Optional[str] = None) -> str:
        """A fresh database (and ``schema`` in it); returns its URL."""
        self.sql(f'CREATE DATABASE "{name}"')
        if schema:
            self.sql(f'CREATE SCHEMA "{schema}"', database=name)
        return self.database_url(name)

    def stop(self) -> None:
        directory, self.dir = self.dir, None
        if directory:
            subprocess.run(["bash", START_POSTGRES, "stop", directory], capture_output=True, timeout=120)
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass


class ThrowawayRedis:
    """``start()``; ``url`` is ``redis://127.0.0.1:PORT/0``."""

    def __init__(self) -> None:
        self.dir: Optional[str] = None
        self.url: Optional[str] = None

    def start(self) -> "ThrowawayRedis":
        self.dir, self.url = _run_start(START_REDIS, "REDISDIR", "Redis")
        atexit.register(self.stop)
        return self

    def command(self, *args: str) -> list:
        """One Redis command over a plain socket (RESP); the reply's lines
        (e.g. ``['+PONG']``, ``['*2', '$4', 'save', '$0', '']``)."""
        import socket

        host_port = self.url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(payload.encode())
            return s.recv(65536).decode("utf-8", "replace").split("\r\n")[:-1]

    def stop(self) -> None:
        directory, self.dir = self.dir, None
        if directory:
            subprocess.run(["bash", START_REDIS, "stop", directory], capture_output=True, timeout=60)
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass


def replica_env(database_url: str, redis_url: str, schema: Optional[str] = None) -> dict:
    """What every replica of one deployment is started with, besides its
    shared ``WEBUI_SECRET_KEY`` (:func:`devkit.owui_server.start_replicas`
    gives them one): one database, Redis for the socket.io manager (events of
    a request served by one replica reach a browser held by another) and for
    Open WebUI's other shared state (``REDIS_URL``)."""
    env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "WEBSOCKET_MANAGER": "redis",
        "WEBSOCKET_REDIS_URL": redis_url,
        "ENABLE_WEBSOCKET_SUPPORT": "true",
    }
    if schema:
        env["DATABASE_SCHEMA"] = schema
    return env
