"""Retention (issue 28) on a real SQLite file and a real PostgreSQL schema: the sweep against Open WebUI's own chat and
user tables, its lease between workers, its batches beside a running event loop, and erasing everything.

Open WebUI's ``chat`` and ``user`` tables are stood in for by tables of the same names holding only ``id`` (all the
sweep reads of them).
"""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

import async_context_compression as acc

STALL_BUDGET = 0.020  # bench/bench.py: seconds the event loop may be held at once


async def owui_tables(engine, users=(), chats=()) -> dict:
    """Open WebUI's chat and user tables (ids only) with ``users`` and ``chats`` in them."""
    import sqlalchemy as sa

    md = sa.MetaData()
    tables = dict(
        user=sa.Table("user", md, sa.Column("id", sa.String(255), primary_key=True)),
        chat=sa.Table("chat", md, sa.Column("id", sa.String(255), primary_key=True)),
    )
    async with engine.begin() as conn:
        await conn.run_sync(md.create_all)
        if users:
            await conn.execute(sa.insert(tables["user"]), [{"id": u} for u in users])
        if chats:
            await conn.execute(sa.insert(tables["chat"]), [{"id": c} for c in chats])
    return tables


async def delete_rows(engine, table, ids) -> None:
    async with engine.begin() as conn:
        await conn.execute(table.delete().where(table.c.id.in_(list(ids))))


def record(user, chat, anchor="a", covered=3, created_at=0.0, text=None):
    return acc.SummaryRecord(
        user_id=user,
        chat_id=chat,
        anchor=anchor,
        head_count=1,
        covered_count=covered,
        fingerprint=f"fp-{covered}",
        summary=text or f"summary of {user}/{chat or anchor}",
        created_at=created_at,
    )


async def insert_lease(engine, scope: str) -> None:
    import sqlalchemy as sa

    table = acc._tables(None)["lease"]
    async with engine.begin() as conn:
        await conn.execute(sa.insert(table).values(scope=scope, holder="w", expires_at=time.time() + 600, failures=0))


async def all_rows(engine, name: str) -> list:
    import sqlalchemy as sa

    async with engine.connect() as conn:
        return [dict(r) for r in (await conn.execute(sa.text(f'SELECT * FROM "{name}"'))).mappings()]


def row_of(r: acc.SummaryRecord, created_at: float) -> dict:
    return {**{k: v for k, v in r.__dict__.items() if k != "id"}, "created_at": created_at}


async def bulk_summaries(engine, rows: list) -> None:
    """Summary rows written in one statement (10,000 saves one by one would take minutes)."""
    import sqlalchemy as sa

    table = acc._tables(None)["summary"]
    async with engine.begin() as conn:
        await conn.execute(sa.insert(table), rows)


async def test_the_sweep_removes_what_open_webui_no_longer_has_and_keeps_the_rest(db):
    engine = db.engine()
    owui = await owui_tables(engine, users=["alice", "bob"], chats=["kept", "deleted"])
    store = db.store(engine)
    old = time.time() - 40 * 86_400
    for r in (
        record("alice", "kept"),
        record("alice", "deleted"),
        record("bob", "kept"),  # bob's rows go with bob
        record("alice", "", anchor="recent-api"),
        record("alice", "", anchor="old-api", created_at=old),
    ):
        await store.save(r)
    # rows of a temporary chat left by 1.3.x (1.4 never writes them)
    await bulk_summaries(engine, [row_of(record("alice", "local:abc"), time.time())])
    for scope in ("alice:kept", "alice:deleted", "bob:kept"):
        assert await store.try_claim(scope, "w1", ttl=600)
    await insert_lease(engine, "alice:local:abc")  # left by 1.3.x too: 1.4 keeps these leases in memory
    assert await store.try_claim(acc.RETENTION_SCOPE, "sweeper", ttl=600)
    await delete_rows(engine, owui["chat"], ["deleted"])
    await delete_rows(engine, owui["user"], ["bob"])

    removed = await acc.RetentionSweeper(store).sweep_orphans(time.time() - 30 * 86_400, batch=2, pause=0)

    left = {(r["user_id"], r["chat_id"] or r["anchor"]) for r in await all_rows(engine, acc.SUMMARY_TABLE)}
    assert left == {("alice", "kept"), ("alice", "recent-api")}
    scopes = {r["scope"] for r in await all_rows(engine, acc.LEASE_TABLE)}
    assert scopes == {"alice:kept", acc.RETENTION_SCOPE}
    assert removed == 4 + 3


async def test_no_users_at_all_means_the_wrong_database_and_nothing_is_deleted(db):
    engine = db.engine()
    await owui_tables(engine)  # present but empty
    store = db.store(engine)
    await store.save(record("alice", "chat"))
    assert await acc.RetentionSweeper(store).sweep_orphans(time.time()) == 0
    assert len(await all_rows(engine, acc.SUMMARY_TABLE)) == 1


async def test_a_failing_sweep_is_a_store_fault_and_deletes_nothing(db):
    engine = db.engine()  # no Open WebUI tables here: the sweep's first read fails
    store = db.store(engine)
    await store.save(record("alice", "chat"))
    with pytest.raises(acc.StoreUnavailable) as failed:
        await acc.RetentionSweeper(store).sweep_orphans(time.time())
    assert failed.value.fault is acc.Fault.STORE_ERROR and store.fault is acc.Fault.STORE_ERROR
    assert len(await all_rows(engine, acc.SUMMARY_TABLE)) == 1


async def test_two_workers_never_sweep_at_once_and_the_second_rests(db):
    first, second = db.engine(), db.engine()  # two workers, each with its own pool
    owui = await owui_tables(first, users=["alice"], chats=[f"c{i}" for i in range(40)])
    writer = db.store(first)
    for i in range(40):
        await writer.save(record("alice", f"c{i}"))
    await delete_rows(first, owui["chat"], [f"c{i}" for i in range(0, 40, 2)])

    running, overlaps = [], []
    sweepers = [acc.RetentionSweeper(db.store(engine), every=60) for engine in (first, second)]
    for sweeper in sweepers:
        real = sweeper.sweep_orphans

        async def watched(*args, real=real, **kwargs):
            running.append(1)
            overlaps.append(len(running))
            try:
                await asyncio.sleep(0.3)  # long enough for the other worker to try meanwhile
                return await real(*args, batch=3, pause=0.01)
            finally:
                running.pop()

        sweeper.sweep_orphans = watched

    results = await asyncio.gather(*(s.sweep_once() for s in sweepers))
    assert sorted(results, key=str) == [20, None]  # one swept all 20 orphans, the other skipped
    assert overlaps == [1]
    # resting: neither sweeps again within half a period, though the sweep is over
    assert await asyncio.gather(*(s.sweep_once() for s in sweepers)) == [None, None]
    assert len(await all_rows(first, acc.SUMMARY_TABLE)) == 20


async def test_a_sweep_of_10000_summaries_never_holds_the_event_loop_past_the_stall_budget(db):
    engine = db.engine()
    users = [f"user-{i}" for i in range(100)]
    chats = [f"chat-{i}" for i in range(10_000)]
    owui = await owui_tables(engine, users=users, chats=chats)
    store = db.store(engine)
    await store.find("user-0", "chat-0", "a")  # our tables
    now = time.time()
    rows = [row_of(record(users[i % 100], chats[i], covered=3 + i % 5), now) for i in range(10_000)]
    await bulk_summaries(engine, rows)
    await delete_rows(engine, owui["chat"], chats[:9_000])

    gaps = [(0.0, 0.0)]
    done = asyncio.Event()

    async def ticker():  # as bench/bench.py's _held_during: wall clock and the loop thread's CPU per hold
        last, last_cpu = time.perf_counter(), time.thread_time()
        while not done.is_set():
            await asyncio.sleep(0)
            now, now_cpu = time.perf_counter(), time.thread_time()
            gaps.append((now - last, now_cpu - last_cpu))
            last, last_cpu = now, now_cpu

    gc.collect()
    gc.disable()  # a full collection of the suite's garbage is not the sweep's hold
    task = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)
        started = time.perf_counter()
        removed = await acc.RetentionSweeper(store).sweep_orphans(now - 86_400)
        elapsed = time.perf_counter() - started
    finally:
        done.set()
        await task
        gc.enable()
    assert removed == 9_000
    assert len(await all_rows(engine, acc.SUMMARY_TABLE)) == 1_000
    held_cpu = max(g[1] for g in gaps)
    assert held_cpu < STALL_BUDGET, (held_cpu, max(g[0] for g in gaps), elapsed)


async def test_erase_all_empties_every_table_of_the_filter_but_its_mark_and_its_memory(db):
    engine = db.engine()
    store = db.store(engine)
    await store.save(record("alice", "chat"))
    await store.save(record("alice", "temporary:t1"))  # memory only
    assert await store.try_claim("alice:chat", "w", ttl=60)
    await store.add_ratios([("k", "m", "exact", 1.1, time.time(), "u1")])

    await acc.RetentionSweeper(store).erase_all()

    for table in acc._tables(None)["metadata"].sorted_tables:  # but the mark every worker acts on (issue 35)
        left = [(r["model"], r["source"]) for r in await all_rows(engine, table.name)]
        assert left == ([("", acc.ERASED)] if table.name == acc.WINDOW_TABLE else []), table.name
    assert await store.find("alice", "temporary:t1", "a") == []


async def test_a_locked_database_is_store_busy_loses_nothing_and_the_next_sweep_succeeds(tmp_path):
    import sqlite3

    from sqlalchemy.ext.asyncio import create_async_engine

    path = tmp_path / "webui.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0.1})
    try:
        owui = await owui_tables(engine, users=["alice"], chats=["kept", "deleted"])
        store = acc.SummaryStore(lambda: engine)
        await store.save(record("alice", "kept"))
        await store.save(record("alice", "deleted"))
        await delete_rows(engine, owui["chat"], ["deleted"])
        locker = sqlite3.connect(str(path), isolation_level=None, timeout=5)
        locker.execute("BEGIN IMMEDIATE")  # a busy Open WebUI worker holding the write lock
        with pytest.raises(acc.StoreUnavailable) as failed:
            await acc.RetentionSweeper(store).sweep_orphans(time.time(), pause=0)
        assert failed.value.fault is acc.Fault.STORE_BUSY and store.fault is acc.Fault.STORE_BUSY
        locker.rollback()
        locker.close()
        assert {r["chat_id"] for r in await all_rows(engine, acc.SUMMARY_TABLE)} == {"kept", "deleted"}
        assert await acc.RetentionSweeper(store).sweep_orphans(time.time(), pause=0) == 1
        assert {r["chat_id"] for r in await all_rows(engine, acc.SUMMARY_TABLE)} == {"kept"}
        assert store.fault is None
    finally:
        await engine.dispose()
