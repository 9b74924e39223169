"""Trust between users (issue 35) in a real SQLite file and a real PostgreSQL schema: the rows that let every worker
tell what the filter saw happen (the requests it sent, by reply), the windows one user's chats alone showed, the
erase's mark, their sweep and erase, and a database that 1.4 made (its window table, none of the new ones)."""

from __future__ import annotations

import asyncio
import time

import pytest
from test_retention import all_rows, delete_rows, owui_tables

import async_context_compression as acc


def window(tokens: int, source: str = "error", at: float = 0.0) -> acc.Window:
    return acc.Window(tokens, source, 0, at or time.time())


async def test_windows_of_every_users_chats_and_of_one_users_are_read_by_another_worker(db):
    one, two = db.store(db.engine()), db.store(db.engine())
    await one.save_windows([("q", "", window(16384)), ("q", "mallory", window(256)), ("r", "alice", window(2048))])
    rows = sorted(await two.read_windows(), key=lambda r: (r[0], r[5]))
    assert [(r[0], r[1], r[5]) for r in rows] == [("q", 16384, ""), ("q", 256, "mallory"), ("r", 2048, "alice")]
    assert sorted(r[5] for r in await two.read_window("q")) == ["", "mallory"]
    await one.save_windows([("q", "mallory", None), ("q", "", window(8192, "served"))])  # forgotten, replaced
    assert [(r[0], r[1], r[2], r[5]) for r in await two.read_window("q")] == [("q", 8192, "served", "")]
    worker = acc.ModelWindow()
    worker.snapshot(await two.read_windows())
    assert (
        worker.find("q", None, acc.RequestParams(), "mallory").tokens == 8192
        and worker.find("r", None, acc.RequestParams(), "alice").tokens == 2048
    )


async def test_learned_windows_age_out_but_the_erase_mark_stays(db):
    store = db.store()
    old = time.time() - acc.WINDOW_LEARNED_TTL - 60
    mark = ("", "", acc.Window(0, acc.ERASED, 0, old))
    await store.save_windows([mark, ("q", "", window(4096, at=old)), ("q", "bob", window(1024, at=old))])
    await store.save_windows([("r", "", window(8192))])
    assert sorted((r[0], r[2]) for r in await store.read_windows()) == [("", acc.ERASED), ("r", "error")]


async def test_a_sent_request_is_read_by_any_worker_until_answered_or_old(db):
    one, two = db.store(db.engine()), db.store(db.engine())
    sent = acc.SentRequest("a9", "c1", "alice", "llama", 9000, time.time())
    await one.record_sent(sent)
    assert await two.read_sent("a9") == sent
    await one.record_sent(acc.SentRequest("a9", "c1", "alice", "llama", 12000, time.time()))  # the loop's next call
    assert (await two.read_sent("a9")).tokens == 12000
    await two.forget_sent("a9")  # answered
    assert await one.read_sent("a9") is None
    await one.record_sent(acc.SentRequest("old", "c1", "alice", "llama", 9000, time.time() - acc.SENT_KEPT - 1))
    assert await two.read_sent("old") is None  # too old to be the turn before this one
    await one.record_sent(acc.SentRequest("new", "c1", "alice", "llama", 9000, time.time()))
    assert [r["reply_id"] for r in await all_rows(db.engines[0], acc.SENT_TABLE)] == ["new"]  # the old one went


async def test_the_sweep_removes_what_users_gone_left_and_old_records(db):
    engine = db.engine()
    owui = await owui_tables(engine, users=["alice", "mallory"])
    store = db.store(engine)
    await store.save_windows([("q", "alice", window(2048)), ("q", "mallory", window(256)), ("q", "", window(16384))])
    now = time.time()
    for reply, user, at in (("a1", "alice", now), ("a2", "mallory", now), ("a3", "alice", now - acc.SENT_KEPT - 5)):
        await store.record_sent(acc.SentRequest(reply, "c1", user, "llama", 9000, at))  # the old one last: it stays
    await delete_rows(engine, owui["user"], ["mallory"])

    removed = await acc.RetentionSweeper(store).sweep_orphans(time.time() - 30 * 86_400, pause=0)

    assert removed == 3
    assert sorted((r["model"], r["user_id"]) for r in await all_rows(engine, acc.USER_WINDOW_TABLE)) == [("q", "alice")]
    assert [r["reply_id"] for r in await all_rows(engine, acc.SENT_TABLE)] == ["a1"]
    assert [r["model"] for r in await all_rows(engine, acc.WINDOW_TABLE)] == ["q"]  # every user's window stays


async def test_erase_all_leaves_only_its_mark_and_every_worker_forgets_at_its_next_read(db):
    engine = db.engine()
    one, two = db.store(engine), db.store(db.engine())
    await one.save_windows([("q", "", window(4096, at=time.time() - 1)), ("q", "mallory", window(256))])
    await one.record_sent(acc.SentRequest("a9", "c1", "alice", "llama", 9000, time.time()))
    await one.add_ratios([("w:1", "q", "exact", 1.3, time.time() - 1, "u1")])
    other = acc.ModelWindow()  # another worker, which read the windows before the erase
    other.snapshot(await two.read_windows())
    assert other.find("q", None, acc.RequestParams()).tokens == 4096

    await acc.RetentionSweeper(one).erase_all()

    for table in acc._tables(None)["metadata"].sorted_tables:
        left = [(r["model"], r["source"]) for r in await all_rows(engine, table.name)]
        assert left == ([("", acc.ERASED)] if table.name == acc.WINDOW_TABLE else []), table.name
    other.snapshot(await two.read_windows())
    assert (
        other.find("q", None, acc.RequestParams()) == acc.NO_WINDOW
        and other.find("q", None, acc.RequestParams(), "mallory") == acc.NO_WINDOW
    )
    assert other.erased_at > 0
    # a worker that had not heard of the erase saves a window it learned before it: no worker applies it
    await two.save_windows([("q", "", window(4096, at=other.erased_at - 1))])
    other.snapshot(await one.read_windows())
    assert other.find("q", None, acc.RequestParams()) == acc.NO_WINDOW


async def test_a_database_1_4_made_gets_the_new_tables_beside_its_window_table(db):
    import sqlalchemy as sa

    engine = db.engine()
    md = sa.MetaData()
    old = sa.Table(  # acc_model_window as 1.4 made it, with a row it learned
        acc.WINDOW_TABLE,
        md,
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("published", sa.Integer, nullable=False, default=0),
        sa.Column("learned_at", sa.Float, nullable=False),
    )
    async with engine.begin() as conn:
        await conn.run_sync(md.create_all)
        await conn.execute(
            sa.insert(old).values(model="q", tokens=8192, source="cut", published=0, learned_at=time.time())
        )
    store = db.store(engine)
    await store.save_windows([("q", "mallory", window(256))])
    await store.record_sent(acc.SentRequest("a9", "c1", "alice", "q", 9000, time.time()))
    assert sorted((r[1], r[5]) for r in await store.read_windows()) == [(256, "mallory"), (8192, "")]
    assert await store.read_sent("a9") is not None


@pytest.mark.parametrize("user", ["", "alice"])
async def test_long_model_and_user_ids_are_cut_to_the_columns(db, user):
    store = db.store()
    model = "m" * 300
    await store.save_windows([(model, user, window(4096))])
    assert [(r[0], r[5]) for r in await store.read_window(model)] == [(model[:255], user)]


def _sent_table_of_1_7(md):
    import sqlalchemy as sa

    return sa.Table(  # acc_sent_request as 1.6 and 1.7 made it: no count, no path
        acc.SENT_TABLE,
        md,
        sa.Column("reply_id", sa.String(255), primary_key=True),
        sa.Column("chat_id", sa.String(255), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


async def test_a_sent_table_1_7_made_gets_the_count_and_path_columns_and_its_writers_still_fit(db):
    """Issue 44: the record keeps what the filter counted (the ratio a rejection naming the prompt's size teaches).
    A table of 1.6/1.7 gets the columns on first use; a worker still on 1.7 (a rolling upgrade) writes rows without
    them, which read as count 0 (teaching the window only); two stores upgrading at once both work."""
    import sqlalchemy as sa

    engine = db.engine()
    md = sa.MetaData(schema=db.schema)
    old = _sent_table_of_1_7(md)
    async with engine.begin() as conn:
        await conn.run_sync(md.create_all)
        await conn.execute(sa.insert(old).values(reply_id="a1", chat_id="c1", user_id="alice", model="q", tokens=9000,
                                                 created_at=time.time()))  # fmt: skip
    one, two = db.store(engine), db.store(db.engine())
    sent = acc.SentRequest("a9", "c1", "alice", "q", 9000, time.time(), 4321, "estimate")
    await asyncio.gather(one.record_sent(sent), two.read_sent("a1"))  # both make the schema at once
    assert await two.read_sent("a9") == sent
    assert (await one.read_sent("a1")).counted == 0  # the 1.7 worker's row: no count, no ratio from it
    async with engine.begin() as conn:  # a 1.7 worker writes after the upgrade: the defaults fill the new columns
        await conn.execute(sa.insert(old).values(reply_id="a2", chat_id="c1", user_id="alice", model="q", tokens=9000,
                                                 created_at=time.time()))  # fmt: skip
    assert (await two.read_sent("a2")).counted == 0 and (await two.read_sent("a2")).path == "exact"
    columns = {c["name"] for c in await _columns(db.engine(), acc.SENT_TABLE, db.schema)}
    assert {"counted", "path"} <= columns
    third = db.store(db.engine())  # a store made later finds them there: nothing added twice
    await third.record_sent(acc.SentRequest("a3", "c1", "bob", "q", 9000, time.time(), 10, "exact"))
    assert (await one.read_sent("a3")).counted == 10


async def _columns(engine, table: str, schema) -> list:
    import sqlalchemy as sa

    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: sa.inspect(sync).get_columns(table, schema=schema))


async def test_one_users_ratios_of_one_model_are_read_alone(db):
    store = db.store()
    now = time.time()
    rows = [("w:1", "q", "exact", 1.3, now, "alice"), ("w:2", "q", "exact", 2.0, now, "bob")]
    rows += [("w:3", "r", "exact", 1.1, now, "alice"), ("w:4", "q", "replayed", 2.5, now, "alice")]
    await store.add_ratios(rows)
    assert [r[3] for r in await store.read_user_ratios("q", "alice")] == [1.3]
    assert await store.read_user_ratios("q", "carol") == []
    tokens = acc.ModelTokens()
    await tokens.read_unknown(store.read_user_ratios, "q", "alice")
    assert tokens.scale("q", "exact", "alice") == pytest.approx(1.3) and tokens.scale("q", "exact", "bob") is None
