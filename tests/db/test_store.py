"""SummaryStore on a real SQLite file and a real PostgreSQL server.

Every test runs on both (the ``db`` fixture); each engine made by
``db.engine()`` plays one Open WebUI worker with its own connection pool.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pg_support import lease_row
from race_worker import run_processes

import async_context_compression as acc


def record(user="u1", chat="chat-1", anchor="anchor-1", covered=5, head=1, summary=None, fp=None):
    return acc.SummaryRecord(
        user_id=user,
        chat_id=chat,
        anchor=anchor,
        head_count=head,
        covered_count=covered,
        fingerprint=fp or f"fp-{covered}",
        summary=summary or f"summary {user}/{chat}/{covered}",
        summary_tokens=3,
        model="m",
    )


async def table_names(engine) -> set:
    from sqlalchemy import inspect

    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))


# -- schema -------------------------------------------------------------------


async def test_schema_is_created_on_first_use(db):
    engine = db.engine()
    assert not {acc.SUMMARY_TABLE, acc.LEASE_TABLE} & await table_names(engine)
    store = db.store(engine)
    assert await store.find("u1", "chat-1", "anchor-1") == []
    assert {acc.SUMMARY_TABLE, acc.LEASE_TABLE} <= await table_names(engine)


async def test_schema_creation_twice_is_harmless(db):
    engine = db.engine()
    await db.store(engine).save(record(covered=3))
    # A second store on the same engine (a reloaded function) and a new engine
    # (another worker) both run create_all again on the existing tables.
    await db.store(engine).save(record(covered=4))
    await db.store().save(record(covered=5))
    found = await db.store().find("u1", "chat-1", "anchor-1")
    assert [r.covered_count for r in found] == [5, 4, 3]


async def test_concurrent_schema_creation_from_several_engines(db):
    stores = [db.store() for _ in range(4)]
    results = await asyncio.gather(*(s.find("u1", "chat-1", "anchor-1") for s in stores))
    assert results == [[]] * 4
    await asyncio.gather(*(s.save(record(covered=i + 2)) for i, s in enumerate(stores)))
    assert len(await stores[0].find("u1", "chat-1", "anchor-1")) == 4


# -- summaries ------------------------------------------------------------------


async def test_save_and_find_order(db):
    store = db.store()
    for covered in (5, 9, 7):
        await store.save(record(covered=covered))
    await store.save(record(chat="chat-2", covered=12))  # same opening, other chat
    await store.save(record(covered=9, summary="newer nine"))
    found = await store.find("u1", "chat-1", "anchor-1")
    # This chat's summaries first, most advanced first (newest first on a
    # tie), then other chats with the same opening.
    assert [(r.chat_id, r.covered_count) for r in found] == [
        ("chat-1", 9),
        ("chat-1", 9),
        ("chat-1", 7),
        ("chat-1", 5),
        ("chat-2", 12),
    ]
    assert found[0].summary == "newer nine"
    first = found[0]
    assert (first.user_id, first.anchor, first.head_count, first.fingerprint, first.model) == (
        "u1",
        "anchor-1",
        1,
        "fp-9",
        "m",
    )
    assert first.created_at > 0 and first.id is not None
    assert len(await store.find("u1", "chat-1", "anchor-1", limit=2)) == 2


async def test_pruning_keeps_the_newest_per_chat(db):
    store = db.store()
    total = acc.SUMMARIES_KEPT_PER_CHAT + 4
    for covered in range(2, 2 + total):
        await store.save(record(covered=covered))
    await store.save(record(chat="chat-2", anchor="anchor-2", covered=3))
    await store.save(record(user="u2", covered=3))
    found = await store.find("u1", "chat-1", "anchor-1", limit=100)
    assert sorted(r.covered_count for r in found) == list(range(2 + total - acc.SUMMARIES_KEPT_PER_CHAT, 2 + total))
    assert len(await store.find("u1", "chat-2", "anchor-2")) == 1
    assert len(await store.find("u2", "chat-1", "anchor-1")) == 1


async def test_user_isolation(db):
    store = db.store()
    await store.save(record(user="alice", covered=4, summary="alice's secret"))
    await store.save(record(user="bob", covered=6, summary="bob's secret"))
    alice = await store.find("alice", "chat-1", "anchor-1")
    bob = await store.find("bob", "chat-1", "anchor-1")
    assert [r.summary for r in alice] == ["alice's secret"]
    assert [r.summary for r in bob] == ["bob's secret"]
    # Same anchor from another chat id: still only the caller's own rows.
    assert [r.summary for r in await store.find("carol", "chat-9", "anchor-1")] == []
    assert [r.summary for r in await store.find("bob", "chat-9", "anchor-1")] == ["bob's secret"]


async def test_cloned_chat_finds_summaries_by_anchor(db):
    store = db.store()
    digests = [f"d{i}" for i in range(10)]
    anchor = acc.conversation_anchor(digests)
    await store.save(record(anchor=anchor, covered=6, fp=acc.prefix_fingerprint(digests, 6)))
    found = await store.find("u1", "clone-of-chat-1", anchor)
    assert [r.chat_id for r in found] == ["chat-1"]
    assert acc.choose_summary(found, digests) is found[0]
    # A chat with another opening does not see it.
    assert await store.find("u1", "other-chat", "anchor-x") == []


async def test_api_conversations_of_one_user_stay_apart(db):
    """API calls have no chat id (chat_id ''): their summaries are told apart
    by the conversation's anchor, for lookups and for pruning alike."""
    store = db.store()
    await store.save(record(chat="", anchor="api-x", covered=3, summary="x"))
    for anchor in ("api-y", "api-z", "api-w"):
        for covered in range(20, 20 + acc.SUMMARIES_KEPT_PER_CHAT + 1):
            await store.save(record(chat="", anchor=anchor, covered=covered))
    found = await store.find("u1", "", "api-x")
    assert [r.summary for r in found] == ["x"]
    assert len(await store.find("u1", "", "api-y", limit=100)) == acc.SUMMARIES_KEPT_PER_CHAT


async def test_summaries_survive_a_restart(db):
    engine = db.engine()
    await db.store(engine).save(record(covered=7, summary="before restart"))
    await db.store(engine).try_claim("scope-r", "worker-a", ttl=600)
    await engine.dispose()
    fresh = db.store()  # new engine, new store: a restarted worker
    assert [r.summary for r in await fresh.find("u1", "chat-1", "anchor-1")] == ["before restart"]
    assert (await lease_row(fresh, "scope-r"))["holder"] == "worker-a"


# -- leases ---------------------------------------------------------------------


async def test_live_lease_blocks_and_release_frees(db):
    store, other = db.store(), db.store()
    assert await store.try_claim("s1", "a", ttl=600)
    assert not await other.try_claim("s1", "b", ttl=600)
    assert not await store.try_claim("s1", "a", ttl=600)  # not re-entrant either
    assert await other.try_claim("s2", "b", ttl=600)  # other scopes are independent
    await other.release("s1", "b")  # not the holder: no effect
    assert (await lease_row(store, "s1"))["holder"] == "a"
    assert not await other.try_claim("s1", "b", ttl=600)
    await store.release("s1", "a")
    assert await lease_row(store, "s1") is None
    assert await other.try_claim("s1", "b", ttl=600)


async def test_expired_lease_is_taken_over(db):
    crashed, survivor = db.store(), db.store()
    assert await crashed.try_claim("s1", "crashed", ttl=0.3)
    assert not await survivor.try_claim("s1", "survivor", ttl=600)
    await asyncio.sleep(0.35)
    assert await survivor.try_claim("s1", "survivor", ttl=600)
    lease = await lease_row(survivor, "s1")
    assert lease["holder"] == "survivor" and lease["expires_at"] > time.time() + 500
    # The crashed worker's late release must not free the survivor's lease.
    await crashed.release("s1", "crashed")
    assert (await lease_row(survivor, "s1"))["holder"] == "survivor"


async def test_back_off_grows_and_expires(db):
    store = db.store()
    assert await store.try_claim("s1", "a", ttl=600)
    delay = await store.back_off("s1", "a", "model error", base=0.2, ceiling=0.5)
    assert delay == pytest.approx(0.2)
    lease = await lease_row(store, "s1")
    assert (lease["holder"], lease["failures"], lease["note"]) == ("back-off", 1, "model error")
    assert lease["expires_at"] <= time.time() + 0.2
    assert not await store.try_claim("s1", "b", ttl=600)  # backing off
    await asyncio.sleep(0.25)
    assert await store.try_claim("s1", "b", ttl=600)  # expired: retry allowed
    assert await store.back_off("s1", "b", "timeout", base=0.2, ceiling=0.5) == pytest.approx(0.4)
    assert (await lease_row(store, "s1"))["failures"] == 2
    await asyncio.sleep(0.45)
    assert await store.try_claim("s1", "c", ttl=600)
    assert await store.back_off("s1", "c", "timeout", base=0.2, ceiling=0.5) == pytest.approx(0.5)  # ceiling
    await asyncio.sleep(0.55)
    # A success releases the lease and forgets the failures.
    assert await store.try_claim("s1", "d", ttl=600)
    await store.release("s1", "d")
    assert await lease_row(store, "s1") is None
    assert await store.try_claim("s1", "e", ttl=600)
    assert await store.back_off("s1", "e", "x" * 400, base=0.2, ceiling=0.5) == pytest.approx(0.2)
    assert len((await lease_row(store, "s1"))["note"]) == 255


async def test_back_off_by_a_stale_holder_leaves_the_new_lease(db):
    store = db.store()
    assert await store.try_claim("s1", "old", ttl=0.1)
    await asyncio.sleep(0.15)
    assert await store.try_claim("s1", "new", ttl=600)
    await store.back_off("s1", "old", "timeout", base=60, ceiling=60)
    lease = await lease_row(store, "s1")
    assert lease["holder"] == "new" and lease["expires_at"] > time.time() + 500


async def test_concurrent_claims_in_one_process_have_one_winner(db):
    stores = [db.store() for _ in range(3)]
    await asyncio.gather(*(lease_row(s, "warm-up") for s in stores))
    for round_ in range(6):
        if round_ % 2:  # an expired lease: the takeover (UPDATE) path races
            assert await stores[0].try_claim(f"r{round_}", "crashed", ttl=-1)
        results = await asyncio.gather(
            *(s.try_claim(f"r{round_}", f"w{i}", ttl=600) for i, s in enumerate(stores) for _ in range(2))
        )
        assert sum(results) == 1, (round_, results)


async def test_two_processes_race_for_the_same_scope(db):
    """Two OS processes with their own engines claim the same 50 scopes at the
    same moment: every scope has exactly one winner. Odd rounds start from an
    expired lease (the conditional UPDATE races), even ones from no row (the
    INSERT races on the primary key)."""
    rounds = 50
    store = db.store()
    for i in range(1, rounds, 2):
        assert await store.try_claim(f"race-{i}", "crashed", ttl=-1)
    outputs = await run_processes(db.worker_args(), "claim", ["p1", "p2"], str(rounds))
    won = [set(o["won"]) for o in outputs]
    assert won[0] & won[1] == set()
    assert won[0] | won[1] == set(range(rounds))
    for i in range(rounds):
        holder = (await lease_row(store, f"race-{i}"))["holder"]
        assert holder == f"{'p1' if i in won[0] else 'p2'}:{i}"
