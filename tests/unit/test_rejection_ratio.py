"""Issue 44: a rejection teaches all it says (the window and that request's ratio, the latter its user's own), and a
worker that has learned nothing yet of a model for a user reads that user's ratio before it fits a request."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from acc_builders import SharedStore

import async_context_compression as acc
from devkit import probes
from devkit.fake_provider import ModelSpec, model_tokens

LONG = "The quarterly figures were compared with the plan in detail. " * 12
MODEL = {"id": "llama", "openai": {"id": "llama", "max_model_len": 4096}}  # published: fitted from the first request
SPEC = ModelSpec(ratio=1.3, window=4096, on_overflow="reject")


def _worker(store: SharedStore) -> acc.Filter:
    f = acc.Filter()
    f.summaries.store = store
    f.valves.summary_model = "none-such"
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    return f


def _history(turns: int) -> list:
    return [
        m
        for i in range(turns)
        for m in ({"role": "user", "content": f"Q{i} {LONG}"}, {"role": "assistant", "content": f"A{i}."})
    ]


def _too_long(sent: acc.SentRequest, ratio: float) -> dict:
    """vLLM's rejection of ``sent``, had the model counted ``ratio`` tokens per counted one."""
    own = round(sent.counted * ratio)
    return {
        "object": "error",
        "message": f"This model's maximum context length is 2048 tokens. However, you requested {own + 512} tokens "
        f"({own} in the messages, 512 in the completion). Please reduce the length of the messages or completion.",
        "type": "BadRequestError",
        "code": 400,
    }


def _rejected_then_next_turn(f, monkeypatch, error_of, failed_id="a9", user="u1", next_user="u1", turns_after=1):
    """``user``'s request for reply a9 goes out and is rejected (no outlet); the next turn(s) of ``next_user`` follow
    the failed reply ``failed_id``, whose stored error is ``error_of(store)``. Returns the next turn's body."""

    async def failed_reply(chat_id, user_message_id):
        return "c1", failed_id, error_of(f.summaries.store)

    monkeypatch.setattr(acc, "failed_reply", failed_reply)
    first = _history(12) + [{"role": "user", "content": f"Q12 {LONG}"}]

    async def run():
        meta = {"chat_id": "c1", "message_id": "a9", "user_message_id": "u8"}
        await f.inlet({"model": "llama", "messages": first}, {"id": user}, meta, None, None, None, "c1")
        await f.request({"model": "llama", "messages": first}, {"id": user}, meta, None, None, "c1")
        await f.wait_for_background(10)
        body = None
        for turn in range(turns_after):
            meta = {"chat_id": "c1", "message_id": f"b{turn}", "user_message_id": f"v{turn}"}
            retried = first + [{"role": "user", "content": f"Q13 {LONG}"}]
            body = await f.inlet(
                {"model": "llama", "messages": retried}, {"id": next_user}, meta, None, None, None, "c1"
            )
            await f.wait_for_background(10)
        return body

    return asyncio.run(run())


@pytest.mark.parametrize(
    "error, prompt",
    [
        ("This model's maximum context length is 16384 tokens. However, you requested 19226 tokens "
         "(18226 in the messages, 1000 in the completion).", 18226),  # vLLM, OpenAI before 2024
        ("This model's maximum context length is 16385 tokens. However, your messages resulted in 17000 tokens.", 17000),
        ("This model's maximum context length is 16384 tokens and your request has 15000 input tokens", 15000),  # vLLM
        ({"type": "error", "error": {"message": "prompt is too long: 208310 tokens > 200000 maximum"}}, 208310),
        ("The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", 1200000),
        ("Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length", 40000),
        ("`inputs` tokens + `max_new_tokens` must be <= 8192. Given: 8000 `inputs` tokens and 512 `max_new_tokens`", 8000),
        ({"error": {"message": "request (17000 tokens) exceeds the available context size (16384 tokens), try "
                    "increasing it", "type": "exceed_context_size_error", "n_ctx": 16384}}, 17000),  # llama.cpp
        ({"code": 400, "message": "the request exceeds the available context size, try increasing it",
          "type": "exceed_context_size_error", "n_prompt_tokens": 17000, "n_ctx": 16384}, 17000),
        ("This model's maximum context length is 16384 tokens. However, you requested 19226 tokens.", 19226),
        ("the request exceeds the available context size, try increasing it", 0),
        ("This model's maximum context length is 16384 tokens.", 0),
        (None, 0),
    ],
)  # fmt: skip
def test_the_prompt_size_each_providers_rejection_names_is_read(error, prompt):
    assert acc.prompt_from_error(error) == prompt


def test_a_rejection_naming_both_numbers_teaches_that_users_ratio_and_no_other_users(monkeypatch):
    f = _worker(SharedStore())
    body = _rejected_then_next_turn(f, monkeypatch, lambda store: _too_long(store.sent["a9"], 1.3))
    assert f.tokens.scale("llama", "exact", "u1") == pytest.approx(1.3, abs=0.01)
    assert f.tokens.scale("llama", "exact", "u2") is None and f.tokens.scale("llama", "exact", "") is None
    saved = f.summaries.store.ratios
    assert [(row[1], row[2], row[5]) for row in saved] == [("llama", "exact", "u1")]  # saved as u1's alone
    assert f.windows.find("llama", None, acc.RequestParams(), "u1").tokens == 2048  # the window as before
    # the turn went out fitted in the model's real tokens: 1.3x of what was counted fits the learned window
    room = acc.RequestParams.of({}, None).reply_room(2048)
    assert model_tokens(body["messages"], None, SPEC) <= 2048 - room


def test_a_rejection_teaches_its_ratio_once(monkeypatch):
    f = _worker(SharedStore())
    errors = []

    def error_of(store):  # the record goes once it taught: the same stored error read again
        errors.append(errors[0] if errors else _too_long(store.sent["a9"], 1.3))
        return errors[-1]

    _rejected_then_next_turn(f, monkeypatch, error_of, turns_after=3)
    assert len(f.summaries.store.ratios) == 1 and "a9" not in f.summaries.store.sent


def test_forged_error_text_on_a_reply_the_filter_did_not_send_teaches_no_ratio(monkeypatch):
    """The chat's messages are its users' to write: an error naming sizes on a reply the filter recorded no request
    for (a7), or on one recorded for another user's request, teaches nobody's ratio."""
    forged = {"message": "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens "
              "(8488 in the messages, 512 in the completion)."}  # fmt: skip
    f = _worker(SharedStore())
    _rejected_then_next_turn(f, monkeypatch, lambda store: forged, failed_id="a7")
    assert not f.summaries.store.ratios and f.tokens.scale("llama", "exact", "u1") is None
    g = _worker(SharedStore())
    _rejected_then_next_turn(g, monkeypatch, lambda store: forged, user="u1", next_user="u2")
    assert not g.summaries.store.ratios
    assert g.tokens.scale("llama", "exact", "u1") is None and g.tokens.scale("llama", "exact", "u2") is None


def test_a_record_without_a_count_teaches_the_window_only():
    """A record written by 1.7 (no count) or an error without the prompt's size: no ratio."""
    old = acc.SentRequest("a9", "c1", "u1", "llama", 9000)
    error = _too_long(acc.SentRequest("a9", "c1", "u1", "llama", 9000, counted=4000), 1.3)
    assert acc.ratio_from_failed_reply(old, "c1", "llama", error, "u1") is None
    assert acc.window_from_failed_reply(old, "c1", "llama", error) == 2048
    counted = dataclasses.replace(old, counted=4000)
    assert acc.ratio_from_failed_reply(counted, "c1", "llama", error, "u1") == ("exact", pytest.approx(1.3))
    assert acc.ratio_from_failed_reply(counted, "c1", "llama", error, "u2") is None  # another user's request
    assert acc.ratio_from_failed_reply(counted, "c2", "llama", error, "u1") is None  # copied into another chat
    wild = {"message": "However, you requested 900000 tokens (900000 in the messages, 0 in the completion)."}
    assert acc.ratio_from_failed_reply(counted, "c1", "llama", wild, "u1") == ("exact", acc.RATIO_CEILING)


def _answered(f, store, user: str, reply: str, ratio: float) -> None:
    """``user``'s request for ``reply`` goes out on worker ``f`` and is answered with usage at ``ratio``."""
    chat = _history(3) + [{"role": "user", "content": f"Q3 {LONG}"}]

    async def run():
        meta = {"chat_id": "c1", "message_id": reply}
        body = await f.inlet({"model": "llama", "messages": chat}, {"id": user}, meta, None, MODEL, None, "c1")
        body = await f.request(body, {"id": user}, meta, None, MODEL, "c1")
        counted = f.tokens.counted[reply][2]  # what the request hook counted for it
        answer = {"id": reply, "role": "assistant", "content": "A.", "usage": {"prompt_tokens": round(counted * ratio)}}
        await f.outlet({"id": reply, "chat_id": "c1", "messages": chat + [answer]}, {"id": user}, meta, None)
        await f.wait_for_background(10)

    asyncio.run(run())


def test_a_second_worker_with_no_ratio_reads_the_users_before_fitting_a_long_request():
    store = SharedStore()
    one, two = _worker(store), _worker(store)
    _answered(one, store, "u1", "r1", 1.3)
    assert one.tokens.scale("llama", "exact", "u1") == pytest.approx(1.3, abs=0.01)
    assert [row[5] for row in store.ratios] == ["u1"] and store.user_reads == [("llama", "u1")]  # one's, before it
    store.user_reads.clear()
    long_chat = _history(30) + [{"role": "user", "content": f"Q30 {LONG}"}]  # over the window at 1:1 and 1.3x

    async def run():
        meta = {"chat_id": "c1", "message_id": "r2"}
        body = await two.inlet({"model": "llama", "messages": long_chat}, {"id": "u1"}, meta, None, MODEL, None, "c1")
        body = await two.request(body, {"id": "u1"}, meta, None, MODEL, "c1")
        other = {"chat_id": "c2", "message_id": "r3"}
        await two.inlet({"model": "llama", "messages": long_chat}, {"id": "u2"}, other, None, MODEL, None, "c2")
        await two.inlet({"model": "llama", "messages": long_chat}, {"id": "u2"}, other, None, MODEL, None, "c2")
        return body

    body = asyncio.run(run())
    assert (
        model_tokens(body["messages"], None, SPEC) + acc.RequestParams.of({}, None).reply_room(4096) <= 4096
    )  # not sent at 1:1
    assert two.tokens.scale("llama", "exact", "u1") == pytest.approx(1.3, abs=0.01)  # u1's, read before fitting
    assert two.tokens.scale("llama", "exact", "u2") is None  # u1's ratio is not u2's
    assert store.user_reads.count(("llama", "u2")) == 1  # nothing known for u2: read once this minute, not per request
    assert store.user_reads.count(("llama", "u1")) == 1


def test_a_keys_read_is_done_once_a_minute_and_a_failing_store_costs_no_request():
    t, reads = acc.ModelTokens(), []

    async def read(model, user):
        reads.append((model, user))
        return [("w:1", model, "exact", 1.25, 10.0, user), ("w:2", model, "exact", 2.0, 11.0, "someone else")]

    async def broken(model, user):
        raise acc.StoreUnavailable("down", acc.Fault.STORE_DOWN)

    async def run():
        await t.read_unknown(broken, "m", "u1", now=60.0)
        assert t.scale("m", "exact", "u1") is None
        await t.read_unknown(read, "m", "u1", now=61.0)  # the same minute: not read again
        assert reads == [] and t.scale("m", "exact", "u1") is None
        await t.read_unknown(read, "m", "u1", now=121.0)
        await t.read_unknown(read, "m", "u1", now=181.0)  # known now: no read at all
        assert reads == [("m", "u1")] and t.scale("m", "exact", "u1") == pytest.approx(1.25)
        assert t.scale("m", "exact", "someone else") is None

    asyncio.run(run())
