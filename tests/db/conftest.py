"""Databases for the summary-store tests: a SQLite file per test and a
throwaway PostgreSQL server per test session (a fresh schema per test).

The PostgreSQL server is started by ``scripts/start_postgres.sh`` (which
installs PostgreSQL with apt-get when it is missing), or taken from
``ACC_TEST_PG_DSN`` (``postgresql://user@host:port/db``) when that is set.
Tests get a :class:`Database` through the ``db`` fixture, parametrized over
both back ends, and make as many async engines on it as they need (each one
is like a separate Open WebUI worker's engine); all are disposed at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from pg_support import libpq_dsn, limited_role, pg_admin  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

START_POSTGRES = os.path.join(ROOT, "scripts", "start_postgres.sh")

pytest.importorskip("sqlalchemy", reason="the store tests need SQLAlchemy 2 (pip install 'sqlalchemy>=2')")


def async_pg_url(dsn: str) -> str:
    """Any PostgreSQL DSN as the URL of Open WebUI's async engine (psycopg 3)."""
    for prefix in ("postgresql+psycopg2://", "postgresql+psycopg://", "postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    raise ValueError(f"not a PostgreSQL DSN: {dsn!r}")


@pytest.fixture(scope="session")
def pg_url():
    """The async URL of a PostgreSQL database for this test session."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail("psycopg is not installed: pip install 'psycopg[binary]'")
    given = os.environ.get("ACC_TEST_PG_DSN", "").strip()
    if given:
        yield async_pg_url(given)
        return
    proc = subprocess.run(["bash", START_POSTGRES, "start"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"could not start PostgreSQL:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    pg_dir = next(line[len("PGDIR=") :] for line in lines if line.startswith("PGDIR="))
    try:
        yield async_pg_url(lines[-1])
    finally:
        subprocess.run(["bash", START_POSTGRES, "stop", pg_dir], capture_output=True, timeout=120)


@dataclass
class Database:
    """One empty database: a SQLite file, or a fresh PostgreSQL schema."""

    kind: str
    url: str
    connect_args: dict = field(default_factory=dict)
    schema: Optional[str] = None
    engines: list = field(default_factory=list)

    def engine(self) -> Any:
        """A new async engine on this database (a new 'worker')."""
        from sqlalchemy.ext.asyncio import create_async_engine

        if self.kind == "sqlite":
            engine = create_async_engine(self.url, connect_args=dict(self.connect_args))
        else:
            engine = create_async_engine(self.url, connect_args=dict(self.connect_args), pool_pre_ping=True)
        self.engines.append(engine)
        return engine

    def store(self, engine: Any = None) -> Any:
        """The filter's store (a ChatStore) on ``engine`` (a new engine when not given)."""
        import async_context_compression as acc

        engine = engine if engine is not None else self.engine()
        return acc.ChatStore(lambda: engine)

    def worker_args(self) -> list:
        """Command-line arguments that let another process open the same database."""
        return [self.kind, self.url, self.schema or ""]

    async def dispose(self) -> None:
        for engine in self.engines:
            await engine.dispose()
        self.engines.clear()


def _new_pg_schema(url: str) -> str:
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(libpq_dsn(url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def make_database(kind: str, tmp_path, request) -> Database:
    if kind == "sqlite":
        path = tmp_path / "webui.db"
        return Database(kind, f"sqlite+aiosqlite:///{path}", {"timeout": 10})
    url = request.getfixturevalue("pg_url")
    schema = _new_pg_schema(url)
    # the schema's name also names its connections, so the end of the test can find those left open
    return Database(kind, url, {"options": f"-csearch_path={schema}", "application_name": schema}, schema)


LEFTOVER_WAIT = 15.0  # seconds a test's leftover background task gets to end once cancelled


async def _end_leftover_tasks(database: Database) -> None:
    """Ends what a test left running on its loop (a retention sweep, a lease heartbeat), within bounds.

    pytest-asyncio's runner cancels leftover tasks too, but waits for them without a limit: a task cancelled inside a
    PostgreSQL query waits for the server to confirm the cancel, and one CI run hung 15 minutes there, after its test
    had passed. Here the wait is bounded; then the schema's connections still open are ended on the server, which
    ends any such wait; a task that still does not end is named with its stack."""
    me = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not me and not task.done()]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=LEFTOVER_WAIT)
    try:
        await asyncio.wait_for(database.dispose(), LEFTOVER_WAIT)
    except TimeoutError:
        warnings.warn("disposing the test's engines took over 15 s", RuntimeWarning, stacklevel=1)
    if database.kind == "postgres" and database.schema:
        _end_schema_connections(database)
    stuck = [task for task in left if not task.done()]
    if stuck:
        await asyncio.wait(stuck, timeout=LEFTOVER_WAIT)
    for task in (task for task in stuck if not task.done()):
        warnings.warn(f"a task outlived its test: {task!r}", RuntimeWarning, stacklevel=1)
        task.print_stack()


def _end_schema_connections(database: Database) -> None:
    import psycopg

    query = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()"
    )
    try:
        with psycopg.connect(libpq_dsn(database.url), autocommit=True, connect_timeout=10) as conn:
            conn.execute(query, (database.schema,))
    except psycopg.Error as exc:  # the server of a test that stopped it
        warnings.warn(f"could not end the test schema's connections: {exc}", RuntimeWarning, stacklevel=1)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def db(request, tmp_path):
    database = make_database(request.param, tmp_path, request)
    try:
        yield database
    finally:
        await _end_leftover_tasks(database)


@pytest.fixture
def own_pg():
    """A PostgreSQL server of this test's own, which the test may stop and
    start again (``pause()`` / ``resume()``, same port and data): the
    database going away under a running store."""
    proc = subprocess.run(["bash", START_POSTGRES, "start"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"could not start PostgreSQL:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    server = OwnPostgres(next(line[len("PGDIR=") :] for line in lines if line.startswith("PGDIR=")), lines[-1])
    try:
        yield server
    finally:
        subprocess.run(["bash", START_POSTGRES, "stop", server.pg_dir], capture_output=True, timeout=120)


@dataclass
class OwnPostgres:
    pg_dir: str
    dsn: str

    @property
    def url(self) -> str:
        return async_pg_url(self.dsn)

    def _ctl(self, what: str) -> None:
        proc = subprocess.run(["bash", START_POSTGRES, what, self.pg_dir], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

    def pause(self) -> None:
        self._ctl("pause")

    def resume(self) -> None:
        self._ctl("resume")
