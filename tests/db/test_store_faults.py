"""The summary store under the faults of real deployments (issues 8 and 14),
on a real SQLite file and a real PostgreSQL server:

- tables in Open WebUI's DATABASE_SCHEMA, for a role that may create only there;
- permission denied, database down and restarted, database locked: each a
  StoreUnavailable with its reason key, logged once, healed without a restart;
- the summary lease: short, renewed by a heartbeat while the work runs, freed
  within its TTL when the holder is killed (SIGKILL), released at the end;
- one short transaction per operation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest
from pg_support import admin_url_of, lease_row, limited_role, pg_admin
from test_store import record, table_names

import async_context_compression as acc

HERE = os.path.dirname(os.path.abspath(__file__))
FIX_TEXT = "set DATABASE_SCHEMA to a schema Open WebUI's role may create tables in, or GRANT CREATE"


def new_engine(url: str, **kwargs):
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine(url, **kwargs)


def store_warnings(caplog) -> list:
    return [
        r.getMessage() for r in caplog.records if r.name == "async_context_compression" and r.levelno >= logging.WARNING
    ]


def set_database_schema(monkeypatch, value):
    """DATABASE_SCHEMA as Open WebUI would have it: in the environment, and in
    its loaded settings module when that is imported in this process."""
    if value is None:
        monkeypatch.delenv("DATABASE_SCHEMA", raising=False)
    else:
        monkeypatch.setenv("DATABASE_SCHEMA", value)
    env = sys.modules.get("open_webui.env")
    if env is not None:
        monkeypatch.setattr(env, "DATABASE_SCHEMA", value, raising=False)


# -- DATABASE_SCHEMA ------------------------------------------------------------


@pytest.mark.postgres
async def test_tables_land_in_database_schema_for_a_role_locked_out_of_public(pg_url, monkeypatch):
    schema = "owui_" + uuid.uuid4().hex[:8]
    url = limited_role(pg_url, schema)
    engine = new_engine(url, pool_pre_ping=True)
    try:
        # precondition: this role really cannot create tables in public
        from sqlalchemy import text

        with pytest.raises(Exception, match="permission denied"):
            async with engine.begin() as conn:
                await conn.execute(text("CREATE TABLE public.acc_probe (x int)"))

        set_database_schema(monkeypatch, schema)
        store = acc.SummaryStore(lambda: engine)  # the schema comes from DATABASE_SCHEMA
        assert store.schema_for(engine) == schema
        await store.save(record(covered=4, summary="kept in the schema"))
        async with store.hold("alice:chat-1", "w1") as held:
            assert held
            assert (await lease_row(store, "alice:chat-1"))["holder"] == "w1"
        assert [r.summary for r in await store.find("u1", "chat-1", "anchor-1")] == ["kept in the schema"]
        assert store.fault is None

        async with engine.connect() as conn:
            from sqlalchemy import inspect

            in_schema = set(await conn.run_sync(lambda sync: inspect(sync).get_table_names(schema=schema)))
            in_public = set(await conn.run_sync(lambda sync: inspect(sync).get_table_names(schema="public")))
        assert {acc.SUMMARY_TABLE, acc.LEASE_TABLE} <= in_schema
        assert not {acc.SUMMARY_TABLE, acc.LEASE_TABLE} & in_public
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_role_that_may_not_alter_a_sent_table_1_7_made_keeps_the_store(pg_url, monkeypatch, caplog):
    """Issue 44 adds columns to the sent requests' table: a role that does not own the table 1.7 made (an admin made
    it, granting rows only) cannot add them; the store keeps working, only the records fail, and a warning says so."""
    schema = "owui_" + uuid.uuid4().hex[:8]
    url = limited_role(pg_url, schema)
    role = url.split("://", 1)[1].split("@", 1)[0]
    table = f'"{schema}".{acc.SENT_TABLE}'
    columns = "reply_id varchar(255) primary key, chat_id varchar(255) not null, user_id varchar(255) not null"
    columns += ", model varchar(255) not null, tokens integer not null, created_at double precision not null"
    grant = f'GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO "{role}"'
    pg_admin(admin_url_of(url, pg_url), f"CREATE TABLE {table} ({columns})", grant)
    set_database_schema(monkeypatch, schema)
    engine = new_engine(url, pool_pre_ping=True)
    store = acc.ChatStore(lambda: engine)
    caplog.set_level(logging.WARNING, logger="async_context_compression")
    try:
        await store.save(record(covered=4, summary="kept"))
        assert [r.summary for r in await store.find("u1", "chat-1", "anchor-1")] == ["kept"]
        with pytest.raises(acc.StoreUnavailable):
            await store.record_sent(acc.SentRequest("a9", "c1", "u1", "q", 9000, time.time(), 4000))
        await store.save(record(covered=6, summary="still kept"))
        assert any("not added" in w and "must be owner" in w for w in store_warnings(caplog))
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_without_the_schema_setting_the_fault_is_permission_denied_and_heals_after_a_grant(
    pg_url, monkeypatch, caplog
):
    monkeypatch.setattr(acc, "DENIED_RETRY", 0.5)
    set_database_schema(monkeypatch, None)
    url = limited_role(pg_url, None)
    role = url.split("://", 1)[1].split("@", 1)[0]
    engine = new_engine(url, pool_pre_ping=True)
    store = acc.SummaryStore(lambda: engine)
    caplog.set_level(logging.WARNING, logger="async_context_compression")
    try:
        for _ in range(3):
            with pytest.raises(acc.StoreUnavailable) as info:
                await store.find("u1", "chat-1", "anchor-1")
            assert info.value.fault == acc.Fault.STORE_DENIED
        with pytest.raises(acc.StoreUnavailable) as info:
            await store.try_claim("alice:chat-1", "w1")
        assert info.value.fault == acc.Fault.STORE_DENIED
        assert store.fault == acc.Fault.STORE_DENIED
        warnings = store_warnings(caplog)
        assert len(warnings) == 1, warnings  # once, with the fix an admin can apply
        assert FIX_TEXT in warnings[0] and "permission denied" in warnings[0]

        # the admin grants CREATE: the store heals by itself, no restart
        pg_admin(admin_url_of(url, pg_url), f'GRANT CREATE ON SCHEMA public TO "{role}"')
        await asyncio.sleep(0.6)
        await store.save(record(covered=3))
        assert len(await store.find("u1", "chat-1", "anchor-1")) == 1
        assert store.fault is None
        assert any("works again" in w for w in store_warnings(caplog))
    finally:
        await engine.dispose()


async def test_sqlite_ignores_a_schema_setting(tmp_path, monkeypatch):
    """SQLite has no schemas: DATABASE_SCHEMA set by mistake must not break it."""
    set_database_schema(monkeypatch, "owui")
    engine = new_engine(f"sqlite+aiosqlite:///{tmp_path / 'webui.db'}")
    try:
        store = acc.SummaryStore(lambda: engine)
        assert store.schema_for(engine) is None
        await store.save(record(covered=3))
        assert len(await store.find("u1", "chat-1", "anchor-1")) == 1
        assert {acc.SUMMARY_TABLE, acc.LEASE_TABLE} <= await table_names(engine)
    finally:
        await engine.dispose()


# -- database down, restarted -------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("pre_ping", [True, False], ids=["pre-ping", "no-pre-ping"])
async def test_postgres_restart_costs_only_the_calls_made_while_down(own_pg, pre_ping, caplog):
    """The pool's connections die with the server; after it is back, the very
    first call works (pre-ping, or one retry after the pool is invalidated)."""
    engine = new_engine(own_pg.url, pool_pre_ping=pre_ping, pool_size=3)
    store = acc.SummaryStore(lambda: engine)
    caplog.set_level(logging.WARNING, logger="async_context_compression")
    try:
        await asyncio.gather(*(store.save(record(covered=c)) for c in (3, 4, 5)))  # fills the pool
        own_pg.pause()
        for call in (store.find("u1", "chat-1", "anchor-1"), store.try_claim("s1", "w1"), store.save(record())):
            with pytest.raises(acc.StoreUnavailable) as info:
                await asyncio.wait_for(call, 20)
            assert info.value.fault == acc.Fault.STORE_DOWN
        assert store.fault == acc.Fault.STORE_DOWN
        own_pg.resume()
        assert len(await store.find("u1", "chat-1", "anchor-1")) == 3  # the first call after the restart
        assert await store.try_claim("s1", "w1")
        assert store.fault is None
        warnings = store_warnings(caplog)
        assert sum("unreachable" in w for w in warnings) == 1, warnings
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_postgres_down_before_the_first_call_creates_the_tables_later(own_pg):
    engine = new_engine(own_pg.url, pool_pre_ping=True)
    store = acc.SummaryStore(lambda: engine)
    try:
        own_pg.pause()
        with pytest.raises(acc.StoreUnavailable) as info:
            await store.find("u1", "chat-1", "anchor-1")
        assert info.value.fault == acc.Fault.STORE_DOWN
        own_pg.resume()
        assert await store.find("u1", "chat-1", "anchor-1") == []
        assert {acc.SUMMARY_TABLE, acc.LEASE_TABLE} <= await table_names(engine)
    finally:
        await engine.dispose()


# -- SQLite locked ---------------------------------------------------------------------


def lock_sqlite(path) -> sqlite3.Connection:
    """Another writer holding the database's write lock (as a busy Open WebUI worker would)."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def test_sqlite_lock_held_briefly_is_retried(tmp_path):
    path = tmp_path / "webui.db"
    engine = new_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0.1})
    store = acc.SummaryStore(lambda: engine)
    try:
        await store.save(record(covered=3))
        locker = lock_sqlite(path)
        asyncio.get_running_loop().call_later(0.25, locker.rollback)
        await store.save(record(covered=4))  # waits out the lock through retries
        assert await store.try_claim("s1", "w1")
        assert store.fault is None
        locker.close()
        assert [r.covered_count for r in await store.find("u1", "chat-1", "anchor-1")] == [4, 3]
    finally:
        await engine.dispose()


async def test_sqlite_lock_held_long_is_store_busy_and_nothing_is_half_written(tmp_path, caplog):
    path = tmp_path / "webui.db"
    engine = new_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0.1})
    store = acc.SummaryStore(lambda: engine)
    caplog.set_level(logging.WARNING, logger="async_context_compression")
    try:
        await store.save(record(covered=3))
        locker = lock_sqlite(path)
        started = time.monotonic()
        with pytest.raises(acc.StoreUnavailable) as info:
            await store.save(record(covered=9, summary="never stored"))
        assert info.value.fault == acc.Fault.STORE_BUSY
        assert time.monotonic() - started < 10
        with pytest.raises(acc.StoreUnavailable) as info:
            await store.try_claim("s1", "w1")
        assert info.value.fault == acc.Fault.STORE_BUSY
        assert store.fault == acc.Fault.STORE_BUSY
        # readers still work (WAL off here: the lock is a RESERVED one)
        assert [r.covered_count for r in await store.find("u1", "chat-1", "anchor-1")] == [3]
        locker.rollback()
        locker.close()
        assert await store.try_claim("s1", "w1")
        found = await store.find("u1", "chat-1", "anchor-1")
        assert [r.covered_count for r in found] == [3] and all(r.summary != "never stored" for r in found)
        assert sum("locked or busy" in w for w in store_warnings(caplog)) == 1
    finally:
        await engine.dispose()


def test_fault_classification_of_driver_errors():
    class PgError(Exception):
        def __init__(self, text, sqlstate):
            super().__init__(text)
            self.sqlstate = sqlstate

    assert acc.classify_store_error(PgError("permission denied for schema public", "42501")) == acc.Fault.STORE_DENIED
    assert acc.classify_store_error(PgError("canceling statement due to lock timeout", "55P03")) == acc.Fault.STORE_BUSY
    assert acc.classify_store_error(PgError("terminating connection", "57P01")) == acc.Fault.STORE_DOWN
    assert acc.classify_store_error(sqlite3.OperationalError("database is locked")) == acc.Fault.STORE_BUSY
    assert acc.classify_store_error(sqlite3.OperationalError("attempt to write a readonly database")) == (
        acc.Fault.STORE_DENIED
    )
    assert acc.classify_store_error(ConnectionRefusedError(111, "Connection refused")) == acc.Fault.STORE_DOWN
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = sqlite3.OperationalError("database is locked")
    assert acc.classify_store_error(wrapped) == acc.Fault.STORE_BUSY
    assert acc.classify_store_error(KeyError("a bug")) is None  # raised as it is, never hidden


async def test_no_database_is_store_absent():
    store = acc.SummaryStore(lambda: None)
    with pytest.raises(acc.StoreUnavailable) as info:
        await store.find("u1", "chat-1", "anchor-1")
    assert info.value.fault == acc.Fault.STORE_ABSENT


# -- the lease: short, with a heartbeat ------------------------------------------------------


async def test_hold_renews_while_the_work_runs_and_releases_at_the_end(db):
    store, other = db.store(), db.store()
    # a TTL several heartbeats long, so that a busy machine delaying one
    # heartbeat does not expire the lease (that is what the TTL is for)
    async with store.hold("s1", "w1", ttl=2.0, renew_every=0.3) as held:
        assert held and not held.lost
        first = (await lease_row(store, "s1"))["expires_at"]
        for _ in range(5):  # 5 s: more than twice the TTL
            await asyncio.sleep(1.0)
            assert not await other.try_claim("s1", "w2", ttl=30), "a live holder's lease expired under it"
        assert (await lease_row(store, "s1"))["expires_at"] > first + 2.0
        assert not held.lost
    assert await lease_row(store, "s1") is None
    assert await other.try_claim("s1", "w2", ttl=30)


async def test_hold_not_taken_yields_false_and_leaves_the_other_lease(db):
    store, other = db.store(), db.store()
    assert await other.try_claim("s1", "w2", ttl=30)
    async with store.hold("s1", "w1") as held:
        assert not held
    assert (await lease_row(store, "s1"))["holder"] == "w2"


async def test_hold_ends_in_a_back_off_that_stays(db):
    store = db.store()
    async with store.hold("s1", "w1", ttl=30, renew_every=0.1) as held:
        assert held
        delay = await store.back_off("s1", "w1", "timeout", base=5, ceiling=60)
        await asyncio.sleep(0.25)  # heartbeats after the back-off do not turn it back into a lease
    lease = await lease_row(store, "s1")
    assert (lease["holder"], lease["note"]) == ("back-off", "timeout")
    assert lease["expires_at"] <= time.time() + delay


async def test_hold_notices_a_lost_lease(db):
    store = db.store()
    async with store.hold("s1", "w1", ttl=30, renew_every=0.1) as held:
        await store.release("s1", "w1")  # as if it had expired and been taken over
        await asyncio.sleep(0.3)
        assert held.lost


async def test_killed_holder_frees_the_lease_within_its_ttl(db):
    """A worker holding the lease (heartbeat running) is killed with SIGKILL:
    no release ever comes; the lease frees within its TTL, not minutes."""
    ttl, renew = 2.0, 0.5
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "race_worker.py"), "hold", *db.worker_args(), "dead", str(ttl), str(renew)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert json.loads(line) == {"name": "dead", "held": True}, proc.stderr.read() if proc.poll() else line
        store = db.store()
        await asyncio.sleep(ttl + 0.5)  # alive and beating: still held after its TTL
        assert not await store.try_claim("hold-scope", "survivor", ttl=30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.time()
        while not await store.try_claim("hold-scope", "survivor", ttl=30):
            assert time.time() - killed < ttl + 1.0, "the dead holder's lease did not free within its TTL"
            await asyncio.sleep(0.1)
        assert (await lease_row(store, "hold-scope"))["holder"] == "survivor"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- one short transaction per operation --------------------------------------------------------


async def test_each_write_is_one_transaction(db):
    from sqlalchemy import event

    engine = db.engine()
    store = db.store(engine)
    await lease_row(store, "warm-up")  # tables made
    begins = []
    event.listen(engine.sync_engine, "begin", lambda conn: begins.append(1))

    async def count(call) -> int:
        begins.clear()
        await call
        return len(begins)

    assert await count(store.try_claim("s1", "w1")) == 1
    assert await count(store.renew("s1", "w1")) == 1
    assert await count(store.save(record(covered=3))) == 1
    assert await count(store.release("s1", "w1")) == 1
    assert await count(store.find("u1", "chat-1", "anchor-1")) == 1  # a read


async def test_tables_dropped_under_a_running_store_are_made_again(db):
    from sqlalchemy import text

    engine = db.engine()
    store = db.store(engine)
    await store.save(record(covered=3))
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE {acc.SUMMARY_TABLE}"))
        await conn.execute(text(f"DROP TABLE {acc.LEASE_TABLE}"))
    assert await store.find("u1", "chat-1", "anchor-1") == []
    assert await store.try_claim("s1", "w1")
    assert store.fault is None
