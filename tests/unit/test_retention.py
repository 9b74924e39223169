"""Retention rules without a database (issue 28): which chats Open WebUI saves, unsaved chats kept in memory only
(bounded), and the erase valve (run in the background, then switched off)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

import async_context_compression as acc

IDS = ["", "0b3c2f4e-1a2b-4c3d-9e8f-123456789abc", "temporary:abc", "local:sock-1", "channel:c1", "temporaryish", "api"]


@pytest.mark.skipif(importlib.util.find_spec("open_webui") is None, reason="Open WebUI is not installed here")
def test_saved_chat_ids_are_those_open_webui_saves():
    from open_webui.utils.chat_id import is_saved_chat_id

    for chat_id in IDS[1:]:
        assert acc.is_saved_chat_id(chat_id) == is_saved_chat_id(chat_id), chat_id
    assert acc.is_saved_chat_id("")  # an API call without a chat: stored, for api_summary_retention_days


def no_database():
    raise AssertionError("an unsaved chat reached the database")


def summary(chat: str, covered: int = 3, user: str = "u1") -> acc.SummaryRecord:
    return acc.SummaryRecord(user, chat, "anchor", 1, covered, f"fp{covered}", f"summary of {chat}")


async def test_unsaved_chats_are_summarized_and_leased_in_memory_only():
    store = acc.ChatStore(no_database)
    for chat in ("temporary:t1", "local:l1", "channel:c1"):
        for covered in (3, 5, 7):
            await store.save(summary(chat, covered))
        found = await store.find("u1", chat, "anchor")
        assert [r.covered_count for r in found] == [7, 5]  # the newest EPHEMERAL_KEPT_PER_CHAT
        assert await store.find("u2", chat, "anchor") == []  # another user's chat of that id has none
        scope = f"u1:{chat}"
        assert await store.try_claim(scope, "w1") and not await store.try_claim(scope, "w2")
        assert await store.renew(scope, "w1") and not await store.renew(scope, "w2")
        assert await store.back_off(scope, "w1", "timeout", 30, 1800) == 30
        assert not await store.try_claim(scope, "w2")  # backing off
        await store.release(scope, "back-off")
        assert await store.try_claim(scope, "w2")


async def test_memory_of_unsaved_chats_is_bounded():
    store = acc.ChatStore(no_database)
    for i in range(acc.EPHEMERAL_CHATS + 1):
        await store.save(summary(f"temporary:{i}"))
    assert await store.find("u1", "temporary:0", "a") == []
    assert await store.find("u1", f"temporary:{acc.EPHEMERAL_CHATS}", "a")
    assert len(store.ephemeral.records) == acc.EPHEMERAL_CHATS


class ErasableStore(acc.NullStore):
    """Its erase runs until ``gate`` is set: requests that come meanwhile find it running (they await the store too)."""

    def __init__(self, fail: bool = False):
        self.erased, self.fail, self.gate = 0, fail, asyncio.Event()

    async def erase_all(self):
        await self.gate.wait()
        if self.fail:
            raise acc.StoreUnavailable("locked", acc.Fault.STORE_BUSY)
        self.erased += 1


@pytest.mark.parametrize("fail", [False, True])
async def test_the_erase_valve_erases_in_the_background_then_switches_itself_off(monkeypatch, fail):
    switched = []

    async def switch_off(function_id, name):
        switched.append((function_id, name))

    monkeypatch.setattr(acc, "switch_valve_off", switch_off)
    f = acc.Filter()
    f.summaries.store = store = ErasableStore(fail)
    f.retention.erase_all = store.erase_all  # the sweeper's erase, stood in for
    f.valves.erase_stored_data = True
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):  # requests while the erase runs start no second one
        await f.inlet(dict(body), {"id": "u1"}, {"chat_id": "c1"}, __id__="acc_filter")
    store.gate.set()
    await f.retention.erasing
    assert store.erased == (0 if fail else 1)
    # a failed erase leaves the valve on: the next request tries again
    assert switched == ([] if fail else [("acc_filter", "erase_stored_data")])
    f.retention.task.cancel()


class CountingStore:
    """A store whose every lease is granted, counting the sweeps."""

    def __init__(self):
        self.sweeps, self.api_before = 0, []

    def hold(self, scope, holder, ttl=acc.LEASE_TTL, renew_every=acc.LEASE_RENEW):
        return acc.LeaseHold(self, scope, holder, ttl, renew_every)

    async def try_claim(self, scope, holder, ttl=acc.LEASE_TTL):
        return True

    async def renew(self, scope, holder, ttl=acc.LEASE_TTL):
        return True

    async def release(self, scope, holder):
        pass

    async def rest(self, scope, holder, seconds):
        pass

    async def sweep_orphans(self, api_before):
        self.sweeps += 1
        self.api_before.append(api_before)
        return 0


async def test_each_worker_runs_one_sweep_loop_which_ends_with_its_filter():
    import gc
    import time

    store = CountingStore()
    sweeper = acc.RetentionSweeper(store, every=1.0)
    sweeper.sweep_orphans = store.sweep_orphans  # the sweeper's SQL, counted instead
    sweeper.keep_running(7)
    loop_task = sweeper.task
    sweeper.keep_running(7)  # every request calls it: still one loop
    assert sweeper.task is loop_task
    await asyncio.sleep(2.8)
    assert 2 <= store.sweeps <= 4, store.sweeps
    assert all(abs(time.time() - before - 7 * 86_400) < 10 for before in store.api_before)
    del sweeper
    gc.collect()
    await asyncio.wait_for(loop_task, 3)  # the filter was replaced: its loop ends at its next wake-up
