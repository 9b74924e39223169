"""The ratios of ModelTokens in the store (issue 19): shared by every worker
(each engine here plays one), pruned per model and path, read back by a
worker that never saw a reply of the model. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import pytest

import async_context_compression as acc
from devkit import probes


def rows(model="llama", path="exact", n=3, ratio=1.3, worker="w1", user="u1"):
    return [(f"{worker}:{i}", model, path, ratio + i / 1000, float(i), user) for i in range(n)]


async def test_ratios_saved_by_one_worker_are_read_by_another(db):
    one, two = db.store(db.engine()), db.store(db.engine())
    await one.add_ratios(rows(n=3))
    read = await two.read_ratios()
    assert sorted(r[0] for r in read) == ["w1:0", "w1:1", "w1:2"]
    tokens = acc.ModelTokens()
    tokens.snapshot(read, minute=1)
    assert tokens.scale("llama", "exact", "u1") == pytest.approx(1.301)
    assert tokens.scale("qwen", "exact", "u1") is None and tokens.scale("llama", "exact", "u2") is None  # one user's


async def test_each_model_and_path_keeps_its_newest_samples(db):
    store = db.store()
    for batch in range(4):
        await store.add_ratios(rows(n=5, worker=f"w{batch}", ratio=1.0 + batch))
    await store.add_ratios(rows(model="qwen", path="estimate", n=2, ratio=0.8))
    read = await store.read_ratios()
    llama = [r for r in read if r[1] == "llama"]
    assert len(llama) == acc.RATIO_SAMPLES
    assert {r[0].split(":")[0] for r in llama} == {"w1", "w2", "w3"}  # the oldest batch pruned first
    assert [r[2] for r in read if r[1] == "qwen"] == ["estimate", "estimate"]


async def test_workers_adding_at_once_lose_nothing_they_keep(db):
    stores = [db.store(db.engine()) for _ in range(3)]
    await stores[0].add_ratios(rows(n=1, worker="seed"))  # the schema once, first
    await asyncio.gather(*(s.add_ratios(rows(n=3, worker=f"w{i}")) for i, s in enumerate(stores)))
    read = await stores[0].read_ratios()
    assert len([r for r in read if r[1] == "llama"]) == 10  # 1 + 9, under RATIO_SAMPLES: none pruned


async def test_the_filter_saves_and_refreshes_through_the_store(db):
    f = acc.Filter()
    f.summaries.store = db.store()
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    text = "The quarterly figures were compared with the plan in detail. " * 20
    meta = {"chat_id": "c1", "message_id": "a1"}
    msgs = [{"role": "user", "content": text}]
    body = await f.request({"model": "llama", "messages": msgs}, {"id": "u1"}, meta, None, None, "c1")
    counted = acc.count_request(f.counter, body["messages"], "cl100k_base", acc.TOKENS_PER_REQUEST)
    reply = {"id": "a1", "role": "assistant", "content": "ok", "usage": {"prompt_tokens": round(counted * 1.4)}}
    await f.outlet({"id": "a1", "chat_id": "c1", "messages": msgs + [reply]}, {"id": "u1"}, meta)
    await f.wait_for_background(10)
    assert [r[1:3] for r in await f.store.read_ratios()] == [("llama", "exact")]
    other = acc.Filter()  # another worker: applies it from the next minute's snapshot on, as every worker does
    other.summaries.store = db.store(db.engine())
    await other.inlet({"model": "llama", "messages": msgs}, {"id": "u2"}, {}, None)
    assert other.tokens.scale("llama", "exact", "u1") is None  # this minute's snapshot predates the sample
    await other.tokens.refresh(other.store.read_ratios, time.time() + 60 + acc.RATIOS_SETTLE)
    assert other.tokens.scale("llama", "exact", "u1") == pytest.approx(1.4, rel=0.01)
    assert other.tokens.scale("llama", "exact", "u2") is None  # usage is the user's to write: u1's alone (issue 42)


async def test_a_database_of_the_previous_version_upgrades_keeping_what_is_still_trustworthy(db):
    """The previous version's every-user ratios (``acc_model_tokens``) and every-user cut, both read from usage a client
    can write, are not carried over; its windows from a rejection are. Nothing fails on the way."""
    import sqlalchemy as sa

    engine = db.engine()
    old = sa.MetaData()
    ratios = sa.Table(
        "acc_model_tokens",
        old,
        *(sa.Column("id", sa.Integer, primary_key=True), sa.Column("key", sa.String(64))),
        *(sa.Column("model", sa.String(255)), sa.Column("path", sa.String(16))),
        *(sa.Column("ratio", sa.Float), sa.Column("created_at", sa.Float)),
    )
    async with engine.begin() as conn:
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(ratios), [dict(key="w:1", model="llama", path="exact", ratio=2.5, created_at=1.0)])
    store = db.store(engine)
    now = time.time()
    await store.save_windows(
        [("llama", "", acc.Window(2100, "cut", 0, now)), ("qwen", "", acc.Window(8192, "error", 0, now))]
    )
    await store.add_ratios(rows(n=1, user="u1"))
    tokens, windows = acc.ModelTokens(), acc.ModelWindow()
    tokens.snapshot(await store.read_ratios(), minute=1)
    windows.snapshot(await store.read_windows())
    assert tokens.scale("llama", "exact", "") is None and tokens.scale("llama", "exact", "u1") == pytest.approx(1.3)
    assert "llama" not in windows.learned and windows.learned["qwen"].tokens == 8192
