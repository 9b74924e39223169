"""The model's window found without configuration (issue 27): each provider's
convention of publishing it, each provider's text naming it in a rejection, a
silent cut read from the reported usage; the precedence of the sources; learned
windows shared through the store, forgotten when the model behind a name
changes; caps, thresholds and the summary model's window derived from it."""

from __future__ import annotations

import asyncio
import sys
import time
import types

import pytest
from acc_builders import SharedStore

import async_context_compression as acc
from devkit import probes
from devkit.fake_provider import ModelSpec, model_tokens

LONG = "The quarterly figures were compared with the plan in detail. " * 12


# -- published windows: each provider's /models entry -------------------------------


@pytest.mark.parametrize(
    "entry, window",
    [
        ({"id": "q", "object": "model", "owned_by": "vllm", "max_model_len": 16384}, 16384),  # vLLM
        ({"id": "q", "context_length": 16384, "top_provider": {"context_length": 8192}}, 16384),  # OpenRouter
        ({"id": "q", "top_provider": {"context_length": 16384}}, 16384),  # OpenRouter, the provider's only
        ({"id": "q", "type": "chat", "context_length": 16384}, 16384),  # Together
        ({"id": "q", "metadata": {"context_length": 16384, "max_tokens": 4096}}, 16384),  # DeepInfra
        ({"id": "q", "max_context_length": 16384, "capabilities": {}}, 16384),  # Mistral
        ({"id": "q", "max_context_length": 131072, "loaded_context_length": 16384}, 16384),  # LM Studio, loaded
        ({"id": "q", "context_window": 16384, "owned_by": "Meta"}, 16384),  # Groq
        ({"id": "q", "max_input_tokens": 16384}, 16384),  # LiteLLM
        ({"id": "q", "meta": {"vocab_type": 2, "n_ctx_train": 16384, "n_embd": 4096}}, 16384),  # llama.cpp
        ({"id": "q", "object": "model", "owned_by": "openai"}, 0),  # OpenAI itself publishes none
        ({"id": "q", "context_length": "16,384"}, 16384),
        ({"id": "q", "context_length": "lots"}, 0),
        ({"id": "q", "context_length": True}, 0),
        ({"id": "q", "context_length": 12}, 0),  # not a window
        ("not an entry", 0),
        (None, 0),
    ],
)
def test_each_providers_published_window_is_read(entry, window):
    assert acc.published_window(entry) == window


def test_open_webuis_model_entry_holds_the_providers_entry_and_settings_beat_it():
    model = {"id": "q", "openai": {"id": "q", "max_model_len": 16384}, "info": {"params": {}}}
    assert acc.model_published_window(model) == 16384
    windows = acc.ModelWindow()
    assert windows.find("q", model, acc.RequestParams.of({}, model)) == acc.Window(16384, "published")
    model["info"]["params"]["num_ctx"] = 8192  # the admin's setting in Open WebUI
    assert windows.find("q", model, acc.RequestParams.of({}, model)) == acc.Window(8192, "settings")
    assert windows.find("q", model, acc.RequestParams.of({"options": {"num_ctx": 4096}}, model)) == acc.Window(
        4096, "settings"
    )  # the request's
    assert windows.find("q", {"id": "q", "ollama": {"name": "q", "details": {}}}, acc.RequestParams()) == acc.NO_WINDOW


# -- windows named by rejections -------------------------------------------------------


@pytest.mark.parametrize(
    "error, window",
    [
        (  # OpenAI (and DeepSeek, Groq)
            "This model's maximum context length is 16385 tokens. However, your messages resulted in 17000 tokens. "
            "Please reduce the length of the messages.",
            16385,
        ),
        (  # vLLM, old and new shapes, as Open WebUI keeps the provider's error object
            {
                "object": "error",
                "message": "This model's maximum context length is 16384 tokens. However, you requested 17002 tokens "
                "(15002 in the messages, 2000 in the completion). Please reduce the length of the messages or "
                "completion.",
                "type": "BadRequestError",
                "code": 400,
            },
            16384,
        ),
        (
            {
                "message": "'max_tokens' or 'max_completion_tokens' is too large: 2048. This model's maximum context "
                "length is 16384 tokens and your request has 15000 input tokens (2048 > 16384 - 15000).",
                "type": "BadRequestError",
            },
            16384,
        ),
        (  # Anthropic
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            },
            200000,
        ),
        (  # Gemini
            "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
            1048576,
        ),
        ("The input token count exceeds the maximum number of tokens allowed 1048576.", 1048576),
        (  # Mistral
            "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
            32768,
        ),
        (  # LM Studio
            "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with "
            "context length of only 4096 tokens, which is not enough.",
            4096,
        ),
        (  # Text Generation Inference (Together, Hugging Face endpoints)
            "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8192. Given: 8000 `inputs` tokens "
            "and 512 `max_new_tokens`",
            8192,
        ),
        (  # llama.cpp's server: the size in the error object
            {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 17000,
                "n_ctx": 16384,
            },
            16384,
        ),
        ("the request exceeds the available context size, try increasing it", 0),  # no number: nothing learned
        ("Your input exceeds the context window of this model. Please adjust your input and try again.", 0),
        ("messages with role 'tool' must be a response to a preceeding message with 'tool_calls'", 0),
        ("This model's maximum context length is 7 tokens.", 0),  # not a window
        (None, 0),
        (["not", {"message": "a list"}], 0),
    ],
)
def test_the_window_a_rejection_names_is_read(error, window):
    assert acc.window_from_error(error) == window


# -- windows shown by a silent cut -----------------------------------------------------


def test_a_prompt_reported_well_under_what_was_sent_is_a_cut():
    # 4,000 counted at the model's 1.15 should report 4,600: Ollama kept 3,100 of it (whole messages dropped)
    assert acc.window_from_usage(3100, 4000, 1.15) == 3100
    assert acc.window_from_usage(3300, 4000, 1.15) == 0  # 72%: within the model's spread across chats
    # the chat's own ratio (its previous reply: 3,450 reported for 3,000 counted) tells a smaller drop
    assert acc.window_from_usage(3900, 4000, 1.15, previous=(3450, 3000)) == 3900
    assert acc.window_from_usage(4000, 4000, 1.15, previous=(3450, 3000)) == 0  # 87%: the chat's ratio moved
    # no ratio learned yet: taken as low as local tokenizers go (a chat in Chinese is no cut)
    assert acc.window_from_usage(2300, 4000, None) == 0
    assert acc.window_from_usage(2200, 4000, None) == 2200
    assert acc.window_from_usage(1500, 4000, 1.15) == 0  # under any num_ctx Ollama uses: a count without its cache
    assert acc.window_from_usage(3100, 4000, 1.15, cuts=False) == 0  # a provider that rejects rather than cuts
    # any server: the same report while the prompt grew is a token cut
    assert acc.window_from_usage(9000, 12000, 1.0, previous=(9000, 11000), cuts=False) == 9000
    assert acc.window_from_usage(9000, 11100, 1.0, previous=(9000, 11000), cuts=False) == 0  # the same prompt, nearly


def test_a_cut_is_read_per_chat_not_across_chats():
    windows = acc.ModelWindow()
    assert windows.observe("q", 9000, 9100, chat="a", cuts=False) == 0
    assert windows.observe("q", 9010, 9400, chat="b", cuts=False) == 0  # another chat of the same size
    assert windows.observe("q", 9005, 9500, chat="a", cuts=False) == 9005  # pinned in chat a
    assert windows.find("q", None, acc.RequestParams(), "anonymous").tokens == 9005  # the user's whose usage showed it


# -- caps from the window ---------------------------------------------------------------


@pytest.mark.parametrize(
    "admin, window, reply, cap",
    [
        (0, 16384, 2048, 14336),  # none set: the window less the reply's room
        (128000, 16384, 2048, 14336),  # 1.3's stored default never exceeds a known window
        (12000, 16384, 2048, 12000),  # a cap under the window is kept
        (0, 0, 0, acc.WINDOW_FALLBACK_CAP),  # nothing known: the fallback
        (50000, 0, 0, 50000),
    ],
)
def test_the_cap_follows_the_window(admin, window, reply, cap):
    assert acc.window_cap(admin, window, reply) == cap


def test_the_reply_room_is_the_requests_own_or_a_share_of_the_window():
    assert acc.RequestParams.of({}, None).reply_room(16384) == 2048
    assert acc.RequestParams.of({}, None).reply_room(1_000_000) == acc.REPLY_ROOM_MAX
    assert acc.RequestParams.of({"max_tokens": 1000}, None).reply_room(16384) == 1000
    assert acc.RequestParams.of({"options": {"num_predict": 500}}, None).reply_room(16384) == 500
    assert acc.RequestParams.of({}, {"info": {"params": {"max_tokens": 700}}}).reply_room(16384) == 700
    assert acc.RequestParams.of({"max_tokens": 99999}, None).reply_room(16384) == 8192  # at most half the window


@pytest.mark.parametrize("stored", [{}, {"compression_threshold_tokens": 64000, "max_context_tokens": 128000}])
def test_default_and_old_default_valves_fit_a_16k_model_and_summarize_before_the_cap(stored):
    valves = acc.Filter.Valves(**stored, summary_model="mini")
    s = acc.resolve_settings(valves, "q", None, acc.Window(16384, "published"), 2048, 8192)
    assert s.max_context == 14336 and s.trigger_tokens == int(14336 * 0.75)
    assert s.summary_window == 8192 and s.max_summary_tokens <= 8192 // 2
    assert s.warnings == ()  # the threshold follows the window's cap quietly


def test_an_admins_cap_and_threshold_under_the_window_are_kept():
    valves = acc.Filter.Valves(compression_threshold_tokens=6000, max_context_tokens=12000)
    s = acc.resolve_settings(valves, "q", None, acc.Window(16384, "published"), 2048)
    assert (s.max_context, s.trigger_tokens) == (12000, 6000)


def test_a_summary_models_own_valve_beats_its_found_window():
    valves = acc.Filter.Valves(summary_model="mini", summary_model_max_context=4000)
    assert acc.resolve_settings(valves, "q", None, acc.NO_WINDOW, 0, 8192).summary_window == 4000


# -- learned windows: precedence, sharing, correction, expiry -------------------------


def test_a_learned_window_holds_while_the_published_one_stays_the_same():
    windows = acc.ModelWindow()
    published = {"id": "q", "openai": {"max_model_len": 32768}}  # published wrong: the server runs with less
    assert windows.learn("q", 16384, "error", 32768)
    assert windows.find("q", published, acc.RequestParams.of({}, published)) == windows.learned["q"]
    replaced = {"id": "q", "openai": {"max_model_len": 65536}}  # another model behind the same name
    assert windows.find("q", replaced, acc.RequestParams.of({}, replaced)) == acc.Window(65536, "published")
    assert windows.learn("q", 16384, "error", 32768) is None  # the same again: nothing new


def test_learned_windows_age_out(monkeypatch):
    windows = acc.ModelWindow()
    windows.learn("q", 16384, "error")
    assert windows.find("q", None, acc.RequestParams()).tokens == 16384
    monkeypatch.setattr(acc, "WINDOW_LEARNED_TTL", 0.0)
    assert windows.find("q", None, acc.RequestParams()) == acc.NO_WINDOW


def test_a_prompt_larger_than_a_learned_window_forgets_it():
    windows = acc.ModelWindow()
    windows.learn("q", 16384, "cut", user="u1")
    windows.unsaved.clear()
    assert windows.observe("q", 20000, 20000, user="u1") == 0
    assert windows.find("q", None, acc.RequestParams(), "u1") == acc.NO_WINDOW and windows.unsaved == [
        ("q", "u1", None)
    ]


def test_a_window_learned_on_one_worker_is_used_by_another_after_its_next_read():
    store, one, two = SharedStore(), acc.ModelWindow(), acc.ModelWindow()

    async def run():
        await two.refresh(store.read_windows)
        one.learn("q", 16384, "error")
        await store.save_windows(one.unsaved)
        assert (
            two.find("q", None, acc.RequestParams()) == acc.NO_WINDOW
        )  # until it reads the store: the model's row ...
        await two.refresh_model(store.read_window, "q")
        assert two.find("q", None, acc.RequestParams()).tokens == 16384
        one.learn("r", 8192, "error")
        await store.save_windows(one.unsaved)
        two.read_at -= acc.WINDOWS_REFRESH  # ... or, every WINDOWS_REFRESH, every row
        await two.refresh(store.read_windows)
        assert two.find("r", None, acc.RequestParams()).tokens == 8192

    asyncio.run(run())


def test_a_request_that_comes_while_a_read_runs_goes_out_on_what_it_reads():
    """Two requests at once on one worker after an erase on another: the second must not go out on the window the
    read under way is about to forget (in a clean-clone run, it did: the first request began the read, the second
    skipped it and sent the chat trimmed to the erased 4k)."""
    store, two = SharedStore(), acc.ModelWindow()
    release = None

    async def slow_read():
        await release.wait()
        return await store.read_windows()

    async def run():
        nonlocal release
        release = asyncio.Event()
        two.learn("q", 4096, "error")
        await two.flush(store.save_windows)
        store.rows.clear()
        await store.save_windows([("", "", acc.Window(0, acc.ERASED, 0, time.time()))])
        two.read_at -= acc.WINDOWS_REFRESH
        first = asyncio.ensure_future(two.refresh(slow_read))
        await asyncio.sleep(0)  # the first request has begun the read
        second = asyncio.ensure_future(two.refresh(slow_read))
        await asyncio.sleep(0.05)
        assert not second.done()  # waits for the read under way
        release.set()
        await asyncio.gather(first, second)
        assert two.find("q", None, acc.RequestParams()) == acc.NO_WINDOW
        await two.refresh(slow_read)  # no read under way: nothing to wait for

    asyncio.run(run())


def test_a_window_is_told_once_for_the_reply_that_found_it():
    windows, window = acc.ModelWindow(), acc.Window(16384, "published")
    first = acc.window_notes(windows.news("q", window, "a1"))
    assert [n.text("en") for n in first] == ["window 16.4k, from the provider's model list"]
    assert acc.window_notes(windows.news("q", window, "a1")) == first  # the same reply's request hook says it too
    assert windows.news("q", window, "a2") == ()
    learned = acc.window_notes(windows.news("q", acc.Window(16384, "error"), "a3"))
    assert learned[0].text("de") == "Fenster 16.4k, aus dem Fehler des Anbieters gelernt"
    assert windows.news("q", acc.Window(8192, "settings"), "a4") == ()  # the admin's own setting


@pytest.mark.parametrize("key", ["w_published", "w_error", "w_cut", "w_served", "w_guessed"])
def test_window_texts_exist_in_every_language(key):
    for language, table in acc.STATUS_TEXTS.items():
        assert "{window}" in table[key], language


def test_the_store_keeps_one_row_per_model_and_forgets(tmp_path):
    sa = pytest.importorskip("sqlalchemy.ext.asyncio")
    pytest.importorskip("aiosqlite")

    async def run():
        engine = sa.create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'w.db'}")
        store = acc.SummaryStore(lambda: engine, schema=None)
        try:
            now = time.time()
            await store.save_windows([("q", "", acc.Window(32768, "cut", 0, now - 5))])
            await store.save_windows(
                [("q", "", acc.Window(16384, "error", 0, now)), ("r", "", acc.Window(4096, "cut"))]
            )
            rows = sorted(await store.read_windows())
            assert [(r[:3], r[5]) for r in rows] == [(("q", 16384, "error"), "")]  # "r" learned 1970: aged out
            assert await store.read_window("q") == rows and await store.read_window("r") == []
            await store.save_windows([("q", "", None)])
            assert await store.read_windows() == []
        finally:
            await engine.dispose()

    asyncio.run(run())


# -- through the Filter ----------------------------------------------------------------


def _chat(f, spec, turns, model=None, usage_key="prompt_eval_count", body_extra=None):
    """inlet, request, outlet of a growing chat against a model that cuts silently; (model tokens sent, reported)."""

    async def run():
        out = []
        stored = [{"role": "system", "content": "Be brief."}]
        for i in range(turns):
            stored.append({"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"})
            meta = {"chat_id": "c1", "message_id": f"a{i}"}
            body = {"model": "llama", "messages": [dict(m) for m in stored], **(body_extra or {})}
            body = await f.inlet(body, {"id": "u1"}, meta, None, model, None, "c1")
            body = await f.request(body, {"id": "u1"}, meta, None, model, "c1")
            own = model_tokens(body["messages"], None, spec)
            reported = min(own, spec.window)
            stored.append({"id": f"a{i}", "role": "assistant", "content": f"A{i} short."})
            outlet_messages = [dict(m) for m in stored[1:]]
            outlet_messages[-1]["usage"] = {usage_key: reported}
            await f.outlet(
                {"id": f"a{i}", "chat_id": "c1", "messages": outlet_messages}, {"id": "u1"}, meta, None, model
            )
            await f.wait_for_background(10)
            out.append((own, reported))
        return out

    return asyncio.run(run())


def test_default_valves_learn_an_ollama_like_cut_once_and_never_cut_again():
    f = acc.Filter()
    f.summaries.store = SharedStore()
    f.valves.summary_model = "none-such"  # summaries fail: only the cap protects
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    spec = ModelSpec(ratio=1.3, window=4096, on_overflow="cut", usage="ollama")
    replies = _chat(f, spec, 30)
    cut = [n for n, (own, _) in enumerate(replies) if own > spec.window]
    assert replies[-1][0] > 2500  # it grew to the window
    assert len(cut) <= 2, cut  # the first cut (or two, pinned) teaches the window ...
    assert not [n for n in cut if n > cut[0] + 1]  # ... and none comes after
    assert f.windows.find("llama", None, acc.RequestParams(), "u1").tokens == 4096
    assert f.summaries.store.rows[("llama", "u1")][1:3] == (4096, "cut")  # shared by the user's chats alone
    assert (
        f.windows.find("llama", None, acc.RequestParams(), "u2") == acc.NO_WINDOW
    )  # usage is the user's to write (issue 42)


def test_default_valves_fit_a_published_window_from_the_first_request():
    f = acc.Filter()
    f.summaries.store = SharedStore()
    f.valves.summary_model = "none-such"
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    spec = ModelSpec(ratio=1.3, window=4096, on_overflow="cut")
    model = {"id": "llama", "openai": {"id": "llama", "max_model_len": 4096}}
    replies = _chat(f, spec, 24, model=model, usage_key="prompt_tokens")
    assert replies[-1][0] > 2500
    assert all(own + acc.RequestParams.of({}, None).reply_room(4096) <= 4096 for own, _ in replies[1:]), replies
    assert replies[0][0] <= 4096


def _rejected_then_retried(f, monkeypatch, error_on, error, user="u1", failed_id="a9", model=None, sent_empty=False):
    """A chat whose reply ``a9`` (to ``user``'s request, sent by the filter) failed; the next turn follows it. Open WebUI
    answers ``failed_reply`` with ``error`` on message ``error_on`` ("" = no failed reply under the new turn: the
    error sits on a user message). ``sent_empty``: the next turn's list carries the failed reply as an empty assistant
    message (Open WebUI 0.9), not left out (0.10 and later). Returns the next turn's body."""
    asked = []

    async def failed_reply(chat_id, user_message_id):
        asked.append((chat_id, user_message_id))
        return ("c1", failed_id, error) if error_on else ("", "", None)

    monkeypatch.setattr(acc, "failed_reply", failed_reply)
    history = [
        m
        for i in range(12)
        for m in ({"role": "user", "content": f"Q{i} {LONG}"}, {"role": "assistant", "content": "A."})
    ]
    first = history + [{"role": "user", "content": f"Q12 {LONG}"}]

    async def run():
        meta = {"chat_id": "c1", "message_id": failed_id, "user_message_id": "u8"}
        await f.inlet({"model": "llama", "messages": first}, {"id": user}, meta, None, model, None, "c1")
        await f.request({"model": "llama", "messages": first}, {"id": user}, meta, None, model, "c1")
        await f.wait_for_background(10)  # the provider rejects it: no outlet
        meta = {"chat_id": "c1", "message_id": "a10", "user_message_id": "u9"}
        failed = [{"role": "assistant", "content": ""}] if sent_empty else []
        retried = first + failed + [{"role": "user", "content": f"Q13 {LONG}"}]  # the reply between them failed
        body = await f.inlet({"model": "llama", "messages": retried}, {"id": user}, meta, None, model, None, "c1")
        await f.wait_for_background(10)
        return body

    body = asyncio.run(run())
    assert asked == [("c1", "u9")]
    return body


def _window_filter():
    f = acc.Filter()
    f.summaries.store = SharedStore()
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    return f


TOO_LONG = {"message": "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens."}


def test_inlet_after_a_rejected_reply_learns_the_window_its_error_names(monkeypatch):
    f = _window_filter()
    body = _rejected_then_retried(f, monkeypatch, "a9", TOO_LONG)
    # the filter recorded what it sent, for any worker; its error named the prompt's size too: the record taught the
    # ratio of u1's requests with the window, and went (once per failed reply)
    assert "a9" not in f.summaries.store.sent and f.tokens.scale("llama", "exact", "u1") is not None
    assert f.windows.find("llama", None, acc.RequestParams()).tokens == 2048
    assert f.summaries.store.rows[("llama", "")][1:3] == (2048, "error")
    assert sum(f.counter.measure(body["messages"], "cl100k_base", True)) <= 2048 - acc.RequestParams.of(
        {}, None
    ).reply_room(2048)


def test_open_webui_0_9s_empty_failed_reply_in_the_list_still_teaches_the_window(monkeypatch):
    """Open WebUI 0.9 sends the failed reply along, empty, where later versions leave it out: the turn after a
    rejection learns the window its error names on either shape (the version matrix saw 0.9.0 rejected twice)."""
    f = _window_filter()
    body = _rejected_then_retried(f, monkeypatch, "a9", TOO_LONG, sent_empty=True)
    assert f.windows.find("llama", None, acc.RequestParams()).tokens == 2048
    assert sum(f.counter.measure(body["messages"], "cl100k_base", True)) <= 2048 - acc.RequestParams.of(
        {}, None
    ).reply_room(2048)


def test_a_reply_that_said_something_is_no_failed_reply():
    said = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A."}, {"role": "user", "content": "Q"}]
    assert not acc.reply_missing(said)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert not acc.reply_missing([*said[:1], {"role": "assistant", "content": "", "tool_calls": calls}, said[2]])
    assert acc.reply_missing([*said[:1], {"role": "assistant", "content": " "}, said[2]])
    assert acc.reply_missing([said[0], said[2]])


def test_a_record_the_store_did_not_keep_still_teaches_the_worker_that_sent_it(monkeypatch):
    """A loaded database can lose the background write of a sent request's record: the worker that sent the request
    keeps its own copy, so a turn landing there still learns the window the rejection named (CI saw three rejections
    in a row for the want of it)."""
    f = _window_filter()

    async def lost(request):
        raise TimeoutError("database busy")

    monkeypatch.setattr(f.summaries.store, "record_sent", lost)
    _rejected_then_retried(f, monkeypatch, "a9", TOO_LONG)
    assert not f.summaries.store.sent  # nothing reached the store
    assert f.windows.find("llama", None, acc.RequestParams()).tokens == 2048


def test_an_erase_forgets_the_workers_own_copy_of_a_sent_record():
    """The store's records go with an erase; the copy a worker kept of one must go too, or the next turn on that worker
    learns the erased window again (a clean-clone run saw one worker of two do so)."""
    windows = acc.ModelWindow()
    sent = acc.SentRequest("a9", "c1", "u1", "llama", 9000, time.time() - 5)
    assert windows.note_sent(sent, own_window=False) is sent and windows.sent_here("a9") is sent
    windows.forget_before(time.time())
    assert windows.sent_here("a9") is None


# -- trust between users (issue 35): who may teach or unteach a window every user's chats get ----------------------


def _stored_chat(monkeypatch, messages: dict) -> None:
    """Open WebUI's Chats, as ``failed_reply`` reads it: chat ``c1`` holds ``messages`` (id -> stored message)."""

    class Chats:
        @staticmethod
        async def get_messages_map_by_chat_id(chat_id):
            return messages if chat_id == "c1" else None

    for name in ("open_webui", "open_webui.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "open_webui.models.chats", types.SimpleNamespace(Chats=Chats))


def test_the_error_read_is_the_one_open_webui_stores_on_the_failed_reply(monkeypatch):
    error = {"content": {"message": "This model's maximum context length is 2048 tokens."}}
    _stored_chat(
        monkeypatch,
        {
            "u8": {"id": "u8", "role": "user", "parentId": None},
            "a9": {"id": "a9", "role": "assistant", "parentId": "u8", "content": "", "error": error},
            "u9": {"id": "u9", "role": "user", "parentId": "a9"},
        },
    )
    assert asyncio.run(acc.failed_reply("c1", "u9")) == ("c1", "a9", error["content"])
    assert asyncio.run(acc.failed_reply("temporary:c1", "u9")) == ("", "", None)  # nothing stored


def test_an_error_a_user_wrote_on_a_user_message_teaches_nothing(monkeypatch):
    """The user_message of a turn carries an ``error`` (Open WebUI stores its keys as sent) and the next turn follows
    it: that is no reply, and no provider rejected anything the filter sent."""
    forged = {"content": "This model's maximum context length is 256 tokens."}
    _stored_chat(
        monkeypatch,
        {
            "u8": {"id": "u8", "role": "user", "parentId": None, "error": forged},
            "u9": {"id": "u9", "role": "user", "parentId": "u8"},
        },
    )
    assert asyncio.run(acc.failed_reply("c1", "u9")) == ("", "", None)
    f = _window_filter()
    f.summaries.store.sent["u8"] = acc.SentRequest("u8", "c1", "u1", "llama", 9000)  # even under a recorded id
    history = [{"role": "user", "content": f"Q{i} {LONG}"} for i in range(14)]

    async def run():
        meta = {"chat_id": "c1", "message_id": "a10", "user_message_id": "u9"}
        await f.inlet({"model": "llama", "messages": history}, {"id": "u1"}, meta, None, None, None, "c1")

    asyncio.run(run())
    assert f.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW and not f.summaries.store.rows


def test_an_error_written_on_an_answered_reply_teaches_nothing(monkeypatch):
    """A reply the filter sent and saw answered (outlet ran) loses its record: an error its user writes on it later (a
    chat updated or imported through the API) is not the provider's. (The rejected reply's case is the test above.)"""
    f = _window_filter()
    history = [{"role": "user", "content": f"Q{i} {LONG}"} for i in range(14)]

    async def failed_reply(chat_id, user_message_id):
        return "c1", "a9", TOO_LONG  # the answered reply, its error written by its user

    monkeypatch.setattr(acc, "failed_reply", failed_reply)

    async def run():
        meta = {"chat_id": "c1", "message_id": "a9"}
        await f.request({"model": "llama", "messages": history}, {"id": "u1"}, meta, None, None, "c1")
        await f.wait_for_background(10)
        assert "a9" in f.summaries.store.sent
        reply = {"id": "a9", "role": "assistant", "content": "A.", "usage": {"prompt_tokens": 3000}}
        await f.outlet({"id": "a9", "chat_id": "c1", "messages": history + [reply]}, {"id": "u1"}, meta, None)
        await f.wait_for_background(10)
        assert f.summaries.store.sent == {}
        meta = {"chat_id": "c1", "message_id": "a10", "user_message_id": "u9"}
        turns = history + [{"role": "user", "content": "Q"}]
        await f.inlet({"model": "llama", "messages": turns}, {"id": "u1"}, meta, None, None, None, "c1")

    asyncio.run(run())
    assert f.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW and not f.summaries.store.rows


def test_an_error_naming_a_window_larger_than_what_was_sent_teaches_nothing(monkeypatch):
    f = _window_filter()
    large = {"message": "This model's maximum context length is 1000000 tokens."}  # the request was far smaller
    _rejected_then_retried(f, monkeypatch, "a9", large)
    assert f.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW


def test_an_error_of_another_chats_or_models_request_teaches_nothing():
    sent = acc.SentRequest("a9", "c1", "u1", "llama", 9000)
    assert acc.window_from_failed_reply(sent, "c1", "llama", TOO_LONG) == 2048
    assert acc.window_from_failed_reply(sent, "c2", "llama", TOO_LONG) == 0  # copied into another chat
    assert acc.window_from_failed_reply(sent, "c1", "qwen", TOO_LONG) == 0
    assert acc.window_from_failed_reply(None, "c1", "llama", TOO_LONG) == 0


def test_a_window_far_below_the_known_one_is_one_users_until_another_users_chats_show_it():
    windows, published = acc.ModelWindow(), {"id": "q", "openai": {"max_model_len": 32768}}
    assert windows.learn("q", 256, "error", 32768, user="mallory").tokens == 256
    assert windows.find("q", published, acc.RequestParams.of({}, published), "alice") == acc.Window(
        32768, "published"
    )  # alice's chats unchanged
    assert windows.find("q", published, acc.RequestParams.of({}, published), "mallory").tokens == 256  # mallory's own
    assert windows.learn("q", 8192, "error", 32768, user="alice").tokens == 8192  # another user, another window
    assert windows.find("q", published, acc.RequestParams.of({}, published), "bob") == acc.Window(32768, "published")
    assert windows.learn("q", 8000, "cut", 32768, user="bob").tokens == 8000  # a cut: bob's own, always
    assert windows.find("q", published, acc.RequestParams.of({}, published), "carol") == acc.Window(32768, "published")
    assert windows.learn("q", 8000, "error", 32768, user="bob").tokens == 8000  # a third agrees with alice: shared
    assert windows.find("q", published, acc.RequestParams.of({}, published), "carol").tokens == 8000
    assert (
        windows.find("q", published, acc.RequestParams.of({}, published), "mallory").tokens == 256
    )  # the lowest of its own and every user's
    assert windows.learn("q", 20000, "error", 32768, user="dave").tokens == 20000  # not far below: every user's
    assert windows.find("q", published, acc.RequestParams.of({}, published), "carol").tokens == 20000


def test_one_user_cannot_ratchet_a_learned_window_down():
    windows = acc.ModelWindow()
    windows.learn("q", 16384, "error", user="alice")  # nothing known before: every user's
    assert windows.learn("q", 4096, "error", user="mallory") is not None
    assert windows.find("q", None, acc.RequestParams(), "alice").tokens == 16384
    assert windows.learn("q", 4000, "error", user="mallory") is not None  # the same user again: still its own
    assert windows.find("q", None, acc.RequestParams(), "bob").tokens == 16384


def test_far_below_windows_are_persisted_per_user_and_read_by_every_worker():
    store, one, two = SharedStore(), acc.ModelWindow(), acc.ModelWindow()

    async def run():
        one.learn("q", 16384, "error", user="alice")
        one.learn("q", 2048, "error", user="mallory")
        await one.flush(store.save_windows)
        await two.refresh(store.read_windows)
        assert (
            two.find("q", None, acc.RequestParams(), "bob").tokens == 16384
            and two.find("q", None, acc.RequestParams(), "mallory").tokens == 2048
        )
        assert two.learn("q", 2100, "error", user="bob").tokens == 2048  # bob's chats agree, on another worker
        await two.flush(store.save_windows)
        assert sorted(store.rows) == [("q", "")] and store.rows[("q", "")][1] == 2048

    asyncio.run(run())


def test_a_removed_or_replaced_row_is_gone_from_every_worker_at_its_next_read():
    store, one, two = SharedStore(), acc.ModelWindow(), acc.ModelWindow()

    async def run():
        one.learn("q", 4096, "error", user="mallory")
        one.learn("r", 8192, "error", user="mallory")
        await one.flush(store.save_windows)
        await two.refresh(store.read_windows)
        assert (
            two.find("q", None, acc.RequestParams()).tokens == 4096
            and two.find("r", None, acc.RequestParams()).tokens == 8192
        )
        del store.rows[("q", "")]  # forgotten by another worker, or swept
        store.rows[("r", "")] = ("r", 16384, "error", 0, time.time(), "")  # replaced
        two.read_at -= acc.WINDOWS_REFRESH
        await two.refresh(store.read_windows)
        assert (
            two.find("q", None, acc.RequestParams()) == acc.NO_WINDOW
            and two.find("r", None, acc.RequestParams()).tokens == 16384
        )
        two.learn("s", 2048, "error")  # this worker's own, not saved yet, stays
        two.read_at -= acc.WINDOWS_REFRESH
        await two.refresh(store.read_windows)
        assert two.find("s", None, acc.RequestParams()).tokens == 2048

    asyncio.run(run())


def test_an_erase_is_acted_on_by_every_worker_at_its_next_read(monkeypatch):
    """Worker one erases; worker two, which read the windows and kept ratios and a temporary chat's summary, forgets
    them at its next read of the windows (within WINDOWS_REFRESH of its next request)."""
    one, two = acc.Filter(), acc.Filter()
    store = SharedStore()
    one.summaries.store = two.summaries.store = store
    two.tokens.add("llama", "exact", 1.3)
    two.summaries.store = acc.ChatStore(engine_getter=lambda: None)
    two.summaries.store.database = store  # its database is the shared stand-in; its memory its own

    async def run():
        await store.save_windows([("llama", "", acc.Window(2048, "error", 0, time.time() - 1))])
        record = acc.SummaryRecord("u1", "temporary:t", "", 0, 3, "fp", "summary", created_at=time.time() - 1)
        await two.summaries.store.save(record)
        body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
        await two.inlet(dict(body), {"id": "u1"}, {"chat_id": "c1"}, None)
        assert two.windows.find("llama", None, acc.RequestParams()).tokens == 2048
        store.rows.clear()  # what erase_all does to the tables, then its mark
        await store.save_windows([("", "", acc.Window(0, acc.ERASED, 0, time.time()))])
        two.windows.read_at -= acc.WINDOWS_REFRESH
        await two.inlet(dict(body), {"id": "u1"}, {"chat_id": "c1"}, None)
        assert two.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW
        assert two.tokens.scale("llama") is None
        assert await two.summaries.store.find("u1", "temporary:t", "") == []

    asyncio.run(run())


def test_the_erasing_worker_forgets_at_once(monkeypatch):
    switched = []

    async def switch_off(function_id, name):
        switched.append(name)

    monkeypatch.setattr(acc, "switch_valve_off", switch_off)
    f = acc.Filter()
    f.windows.learn("llama", 2048, "error")
    f.tokens.add("llama", "exact", 1.3)
    asyncio.run(f._erased("acc"))
    assert f.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW and f.tokens.scale("llama") is None
    assert switched == ["erase_stored_data"]


def _ollama_turn(f, reply_id, text, num_ctx, where):
    """One turn whose request sets ``num_ctx`` (in ``options`` or at the top level, as Open WebUI puts a chat's params
    for Ollama and OpenAI-compatible models), answered by a model that keeps the last ``num_ctx`` of its tokens."""

    async def run():
        meta, asked = {"chat_id": "c1", "message_id": reply_id}, {"num_ctx": num_ctx}
        body = {"model": "llama", "messages": [{"id": "u", "role": "user", "content": text}]}
        body.update({"options": asked} if where == "options" else asked)
        sent = await f.request(
            await f.inlet(dict(body), {"id": "u1"}, meta, None, None, None, "c1"), {"id": "u1"}, meta
        )
        reported = min(model_tokens(sent["messages"], None, ModelSpec(ratio=1.3)), num_ctx)
        reply = {"id": reply_id, "role": "assistant", "content": "A.", "usage": {"prompt_eval_count": reported}}
        await f.outlet({"id": reply_id, "chat_id": "c1", "messages": [*body["messages"], reply]}, {"id": "u1"}, meta)
        await f.wait_for_background(10)

    asyncio.run(run())


@pytest.mark.parametrize("where", ["options", "top"])
def test_a_chats_own_num_ctx_teaches_nothing_shared(where):
    """Ollama cuts a chat whose params set num_ctx 2048 at 2048 (its last message alone is over it): that says nothing
    of other chats' window."""
    f = _window_filter()
    _ollama_turn(f, "a1", LONG * 30, 2048, where)
    assert f.windows.find("llama", None, acc.RequestParams()) == acc.NO_WINDOW and not f.summaries.store.rows


@pytest.mark.parametrize("where", ["options", "top"])
def test_a_chats_own_larger_num_ctx_makes_no_one_forget_a_window(where):
    f = _window_filter()
    f.windows.learn("llama", 4096, "cut", user="u1")
    _ollama_turn(f, "a1", LONG * 50, 16384, where)  # 6,000 prompt tokens taken, over the learned 4096
    assert f.windows.find("llama", None, acc.RequestParams(), "u1").tokens == 4096


def test_without_a_chats_own_num_ctx_the_same_turns_teach_and_unteach():
    """The control of the two above: the same replies, the window not the chat's own, do teach and unteach."""
    f = _window_filter()
    model = {"id": "llama", "info": {"params": {"num_ctx": 2048}}}  # the admin's setting is every chat's

    async def run(reply_id, text, reported):
        meta = {"chat_id": "c1", "message_id": reply_id}
        body = {"model": "llama", "messages": [{"id": "u", "role": "user", "content": text}]}
        await f.request(dict(body), {"id": "u1"}, meta, None, model, "c1")
        reply = {"id": reply_id, "role": "assistant", "content": "A.", "usage": {"prompt_eval_count": reported}}
        await f.outlet({"id": reply_id, "chat_id": "c1", "messages": [*body["messages"], reply]}, {"id": "u1"}, meta)

    asyncio.run(run("a1", LONG * 30, 2048))
    assert f.windows.pending[("llama", "u1")].tokens == 2048  # usage teaches the user's own chats (issue 42)
    asyncio.run(run("a2", LONG * 50, 6000))
    assert ("llama", "u1") not in f.windows.pending


def test_the_admins_num_ctx_is_no_chats_own():
    admin = {"id": "llama", "info": {"params": {"num_ctx": 8192}}}
    assert not acc.RequestParams.of({"options": {"num_ctx": 8192}}, admin).own_window
    assert acc.RequestParams.of({"options": {"num_ctx": 2048}}, admin).own_window
    assert acc.RequestParams.of({"num_ctx": 2048}, {"id": "llama"}).own_window
    assert not acc.RequestParams.of({}, admin).own_window


def test_each_hook_call_reads_the_requests_parameters_once(monkeypatch):
    """Issue 46: inlet, the request hook and outlet each read what the request posted into one RequestParams; the
    window, the reply's room, the prompt bound and the chat's own window all come from it."""
    f, reads, of = _window_filter(), [], acc.RequestParams.of
    monkeypatch.setattr(acc.RequestParams, "of", lambda body, model=None: reads.append(body) or of(body, model))
    _ollama_turn(f, "a1", "A question.", 4096, "options")
    assert [b["options"]["num_ctx"] if "options" in b else b.get("id") for b in reads] == [4096, 4096, "a1"]


def test_long_turns_in_a_small_window_get_their_summary_before_the_next_turn_reaches_the_cap():
    """Turns of ~14% of a 16k window's cap: the rewrite may not wait for the fold deadline by the count without the
    next turn, or that turn meets the cap before the summary (e2e: a marker left out once in 26 turns)."""
    from acc_builders import EstimateOnly, RecordStore

    summaries = acc.BackgroundSummarizer(acc.Services(RecordStore(), EstimateOnly(), None))
    settings = acc.resolve_settings(acc.Filter.Valves(), "q", None, acc.Window(16384, "published"), 2048)
    ctx = acc.RequestContext(user={"id": "u"}, user_id="u", chat_id="c", model_id="q", language="en", settings=settings)
    turn = "Budget cache deploy engine filter gateway handler index. " * 150  # ~1,800 tokens
    canon, ids = [], []
    for i in range(40):
        canon += [{"role": "user", "content": f"Q{i} {turn}"}, {"role": "assistant", "content": f"A{i}."}]
        ids += [f"u{i}", f"a{i}"]
        summary = acc.SummaryRecord("u", "c", "", 0, 10, "", "Running summary. " * 50)
        branch = acc.replace(acc.Branch.of(canon, ids), base=summary)
        used = summaries.next_request_tokens(ctx, canon, summary.summary, 0, 10)
        step = acc.count_request(summaries.counter, [canon[-2]], settings.encoding, 0)  # a user turn
        if i >= 6 and used + step > acc.fold_deadline(settings):
            break
    assert used <= acc.fold_deadline(settings) < settings.max_context  # the case: only the next turn crosses it
    plan = asyncio.run(summaries.plan(ctx, branch))
    assert plan is not None and plan.start == 10
