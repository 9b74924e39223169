"""ModelBudget (issue 46): a model's window and ratio for a request asked of one object. The counting path (exact
or estimated) is asked of the counter where a ratio is read or noted, never handed along as a flag."""

from __future__ import annotations

import asyncio

import pytest

import async_context_compression as acc


def _budget(loaded: set):
    return acc.ModelBudget(acc.ModelWindow(), acc.ModelTokens(), lambda encoding: encoding in loaded)


def _own(cap=15000):
    valves = acc.Filter.Valves(max_context_tokens=cap, compression_threshold_tokens=9000)
    return acc.resolve_settings(valves, "m")


def test_the_ratio_applied_is_the_one_of_the_path_the_request_is_counted_on():
    loaded = set()
    budget = _budget(loaded)
    budget.tokens.add("m", "exact", 1.3, "u")
    budget.tokens.add("m", "estimate", 0.9, "u")
    own = _own()
    assert budget.counted(own, "m", "u", 0).scale == pytest.approx(0.9)  # the tokenizer not loaded: estimated
    loaded.add(own.encoding)
    assert budget.counted(own, "m", "u", 0).scale == pytest.approx(1.3)  # loaded now: the exact path's ratio
    assert budget.counted(own, "m", "someone else", 0).scale == 1.0  # a user's ratio is that user's alone


def test_a_request_is_noted_on_the_path_it_was_counted_on_and_its_record_sized_at_the_ratio():
    loaded = {"cl100k_base"}
    budget = _budget(loaded)
    sent = acc.SentRequest("r1", "chat", "u", "m", 0, 0.0, 4000)
    record = budget.note_sent(sent, "cl100k_base", 0, own=False)
    assert budget.tokens.counted["r1"][1] == "exact" and record is not None
    assert record.path == "exact" and record.tokens == int(4000 * acc.RATIO_CEILING)  # nothing learned yet
    budget.tokens.add("m", "estimate", 1.2, "u")
    record = budget.note_sent(acc.replace(sent, reply_id="r2"), "o200k_base", 0, own=False)  # not loaded here
    assert budget.tokens.counted["r2"][1] == "estimate"
    assert record.path == "estimate" and record.tokens == int(4000 * 1.2 * (1 + acc.SENT_MARGIN))
    assert budget.note_sent(acc.replace(sent, reply_id=""), "cl100k_base", 0, own=False) is None  # no reply: none


def test_a_window_the_request_set_is_the_one_its_outlet_plans_in():
    budget = _budget(set())
    own = acc.Window(4096, "settings")
    assert budget.window("r1", own) == own
    assert budget.window("r1", acc.NO_WINDOW) == own  # outlet: Open WebUI gives it no num_ctx
    assert budget.window("r2", acc.NO_WINDOW) == acc.NO_WINDOW and budget.window("", own) == own


def test_a_reply_teaches_the_ratio_once():
    class Store:
        def __init__(self):
            self.saved = []

        async def add_ratios(self, rows):
            self.saved.extend(rows)

        async def save_windows(self, rows):
            pass

    budget, store = _budget({"cl100k_base"}), Store()
    budget.note_sent(acc.SentRequest("r1", "", "u", "m", 0, 0.0, 1000), "cl100k_base", 0, own=False)
    reply = {"id": "r1", "usage": {"prompt_tokens": 1300}}

    async def run():
        recorded, learning = await budget.after_reply(store, reply, "r1", None, "chat", "u")
        assert recorded is False and learning is not None
        await learning
        again = await budget.after_reply(store, reply, "r1", None, "chat", "u")
        assert again == (False, None)  # once per reply

    asyncio.run(run())
    assert budget.tokens.scale("m", "exact", "u") == pytest.approx(1.3) and len(store.saved) == 1
