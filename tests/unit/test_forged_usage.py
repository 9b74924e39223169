"""Issue 42, item 2: the usage of a reply is read from outlet's body, which a client posts itself
(``POST /api/chat/completed``): forged usage teaches nothing another user's requests obey, and an outlet for a reply
the filter did not send for that user (another user's, or one already answered) teaches nothing at all.

Two workers share one store; mallory forges, alice's next request on the other worker is measured against a pair of
workers where no one forged."""

from __future__ import annotations

import asyncio
import sys
import time

from acc_builders import SharedStore

import async_context_compression as acc
from devkit import probes

TURN = "The quarterly figures were compared with the plan in detail, line by line. " * 40  # ~600 tokens
MODEL = {"id": "llama", "openai": {"id": "llama", "max_model_len": 32768}}  # a published window


def _workers(store):
    pair = []
    for _ in range(2):
        f = acc.Filter()
        f.summaries.store = store
        f.valves.summary_model = "none-such"  # no summaries: the cap alone decides what is sent
        assert probes.wait_ready(f.counter, "cl100k_base", 60)
        pair.append(f)
    return pair


def _chat(turns: int) -> list:
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"Q{i} {TURN}"}, {"role": "assistant", "content": f"A{i} {TURN}"}]
    return [*messages, {"role": "user", "content": "And now?"}]


async def _send(f, user: str, chat: str, reply_id: str, turns: int) -> dict:
    meta = {"chat_id": chat, "message_id": reply_id}
    body = {"model": "llama", "chat_id": chat, "messages": _chat(turns)}
    body = await f.inlet(body, {"id": user}, meta, None, MODEL, None, chat)
    return await f.request(body, {"id": user}, meta, None, MODEL, chat)


async def _outlet(f, user: str, chat: str, reply_id: str, usage: dict) -> None:
    reply = {"id": reply_id, "role": "assistant", "content": "A.", "usage": usage}
    body = {"id": reply_id, "chat_id": chat, "model": "llama", "messages": [*_chat(1), reply]}
    await f.outlet(body, {"id": user}, {"chat_id": chat, "message_id": reply_id}, None, MODEL)
    await f.wait_for_background(10)


async def _alices_next_request(f) -> int:
    """The number of messages alice's next request (25 turns, ~30k tokens) sends on ``f``, after it read what every
    worker saved (windows and every ratio saved so far)."""
    f.windows.read_at -= acc.WINDOWS_REFRESH
    f.tokens.minute = None
    await f.tokens.refresh(f.summaries.store.read_ratios, time.time() + 120)
    sent = await _send(f, "alice", "ca", "alice-1", 24)
    return len(sent["messages"])


def _attack(forge) -> tuple[int, int]:
    """alice's request on the other worker: (after mallory's ``forge``, with no one forging)."""

    async def run(forging: bool) -> int:
        store = SharedStore()
        one, two = _workers(store)
        await forge(one, two, forging)
        return await _alices_next_request(two)

    return asyncio.run(run(True)), asyncio.run(run(False))


async def _forged(f, user: str, n: int, usage) -> None:
    """``user``'s real request for reply ``n`` (12 turns), then that user's outlet body with ``usage(counted)``."""
    reply_id = f"{user}-{n}"
    await _send(f, user, f"c-{user}", reply_id, 12)
    counted = f.tokens.counted[reply_id][2]
    await _outlet(f, user, f"c-{user}", reply_id, usage(counted))


def test_a_forged_cut_changes_no_other_users_window(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "MODEL", {"id": "llama"})  # nothing published: the cut was news

    async def forge(one, two, forging):
        if forging:
            await _forged(one, "mallory", 1, lambda counted: {"prompt_eval_count": 2100})

    forged, honest = _attack(forge)
    assert honest > 40 and forged == honest, (forged, honest)


def test_two_accounts_agreeing_on_a_forged_cut_change_no_other_users_window():
    async def forge(one, two, forging):
        if forging:
            await _forged(one, "mallory", 1, lambda counted: {"prompt_eval_count": 2100})
            await _forged(two, "mallet", 1, lambda counted: {"prompt_eval_count": 2110})

    forged, honest = _attack(forge)
    assert forged == honest > 40, (forged, honest)


def test_a_forged_huge_prompt_erases_no_window_other_users_obey():
    async def forge(one, two, forging):
        one.windows.learn("llama", 8192, "error", 32768, user="bob", firm=0)  # a rejection's, every user's
        await one.windows.flush(one.summaries.store.save_windows)
        if forging:
            await _forged(one, "mallory", 1, lambda counted: {"prompt_tokens": 90000})

    forged, honest = _attack(forge)
    assert honest < 20 and forged == honest, (forged, honest)


def test_twelve_forged_replies_set_no_ratio_for_other_users():
    async def forge(one, two, forging):
        for n in range(12 if forging else 0):
            await _forged(one, "mallory", n, lambda counted: {"prompt_tokens": int(counted * 2.5)})

    forged, honest = _attack(forge)
    assert forged == honest > 40, (forged, honest)
    assert asyncio.run(_mallorys_own_ratio()) > 2.0  # the forger's own chats obey what it wrote


async def _mallorys_own_ratio() -> float:
    one, _ = _workers(SharedStore())
    for n in range(3):
        await _forged(one, "mallory", n, lambda counted: {"prompt_tokens": int(counted * 2.5)})
    return one.tokens.scale("llama", "exact", "mallory")


def test_an_outlet_for_another_users_reply_teaches_nothing():
    async def run(forging: bool) -> int:
        store = SharedStore()
        one, two = _workers(store)
        await _send(one, "alice", "ca", "alice-0", 12)  # alice's request; mallory posts an outlet for its reply id
        if forging:
            await _outlet(one, "mallory", "cm", "alice-0", {"prompt_eval_count": 2100})
        return await _alices_next_request(one)

    forged, honest = asyncio.run(run(True)), asyncio.run(run(False))
    assert forged == honest > 40, (forged, honest)


def test_a_replayed_outlet_teaches_nothing():
    async def run() -> tuple:
        one, _ = _workers(SharedStore())
        await _forged(one, "mallory", 1, lambda counted: {"prompt_tokens": counted})  # the real reply: 1.0
        await _outlet(one, "mallory", "c-mallory", "mallory-1", {"prompt_eval_count": 2100})  # posted again
        await _outlet(one, "mallory", "c-mallory", "mallory-1", {"prompt_tokens": 90000})
        return one.tokens.scale("llama", "exact", "mallory"), one.windows.find(
            "llama", MODEL, acc.RequestParams.of({}, MODEL), "mallory"
        )

    scale, window = asyncio.run(run())
    assert scale == 1.0 and window == acc.Window(32768, "published")


def test_a_cut_an_earlier_version_saved_for_every_user_is_not_applied():
    """An earlier version saved a cut read from usage (which a client writes) as every user's window: after the
    upgrade it is not read as one; a rejection's row beside it still is."""
    at = time.time()
    rows = [("llama", 2100, "cut", 0, at, ""), ("qwen", 8192, "error", 0, at, "")]
    windows = acc.ModelWindow()
    windows.snapshot(rows)
    assert "llama" not in windows.learned and windows.learned["qwen"].tokens == 8192
