"""Valves, their resolution per model, user valves, status texts, and the
promise that inlet never raises into Open WebUI."""

import asyncio
import json
import re
from pathlib import Path

import pytest
from acc_builders import lines_written

import async_context_compression as acc


def run(coro):
    return asyncio.run(coro)


def test_valve_names_and_defaults_are_the_ones_admins_know():
    v = acc.Filter.Valves()
    assert (v.priority, v.compression_threshold_tokens, v.max_context_tokens) == (10, 0, 0)  # 0: from the window
    assert (v.keep_first, v.keep_last, v.summary_model, v.summary_model_max_context) == (1, 6, "", 0)
    assert (v.max_summary_tokens, v.summary_temperature, v.model_thresholds) == (2048, 0.1, "")
    assert (v.show_status, v.debug) == (True, False)
    for name, field in acc.Filter.Valves.model_fields.items():
        assert field.description and len(field.description) > 20, name
    u = acc.Filter.UserValves()
    assert (u.enabled, u.show_status) == (True, True)


@pytest.mark.parametrize(
    "values, name, kept, words",
    [
        (
            {"max_context_tokens": -1},
            "max_context_tokens",
            -1,
            "max_context_tokens = -1 is not valid (expected 0–1000000000); using 0",
        ),
        ({"keep_last": -3}, "keep_last", -3, "keep_last = -3 is not valid (expected 0–10000); using 0"),
        (
            {"summary_trigger_ratio": 3},
            "summary_trigger_ratio",
            3.0,
            "summary_trigger_ratio = 3.0 is not valid (expected",
        ),
        (
            {"summary_low_water": 0},
            "summary_low_water",
            0.0,
            "summary_low_water = 0.0 is not valid (expected 0.1–0.9); using 0.1",
        ),
        ({"model_thresholds": "{not json"}, "model_thresholds", "{not json", "model_thresholds cannot be read"),
        (
            {"model_thresholds": '{"gpt-4o": {"max_context_tokens": "lots"}}'},
            "model_thresholds",
            '{"gpt-4o": {"max_context_tokens": "lots"}}',
            "model_thresholds entry ignored: 'gpt-4o'.max_context_tokens='lots'",
        ),
        ({"model_thresholds": "[1, 2]"}, "model_thresholds", "[1, 2]", "not a JSON object"),
    ],
)
def test_invalid_valves_are_kept_as_typed_and_explained_per_request(values, name, kept, words):
    v = acc.Filter.Valves(**values)  # never refused: the admin sees what they typed
    assert getattr(v, name) == kept
    assert v.model_dump(exclude_unset=True) == {name: kept}  # and a save keeps it
    warnings = acc.resolve_settings(v, "gpt-4o").warnings
    assert any(words in str(w) for w in warnings), [str(w) for w in warnings]


def test_thresholds_stored_as_a_dict_by_older_versions_still_load():
    v = acc.Filter.Valves(model_thresholds={"gpt-4o": {"max_context_tokens": 9000}})
    assert json.loads(v.model_thresholds) == {"gpt-4o": {"max_context_tokens": 9000}}
    assert acc.resolve_settings(v, "gpt-4o").max_context == 9000


def test_per_model_overrides_exact_then_longest_prefix():
    v = acc.Filter.Valves(
        model_thresholds=json.dumps(
            {
                "llama*": {"max_context_tokens": 7000},
                "llama3*": {"max_context_tokens": 6000, "compression_threshold_tokens": 3000},
                "llama3:8b": {"max_context_tokens": 5000, "encoding": "o200k_base"},
            }
        )
    )
    assert acc.resolve_settings(v, "llama3:8b").max_context == 5000
    assert acc.resolve_settings(v, "llama3:8b").encoding == "o200k_base"
    assert acc.resolve_settings(v, "llama3:70b").max_context == 6000
    assert acc.resolve_settings(v, "llama3:70b").trigger_tokens == 3000
    assert acc.resolve_settings(v, "llama2").max_context == 7000
    assert acc.resolve_settings(v, "mistral").max_context == 128000


def test_impossible_combinations_fall_back_safely_and_say_why():
    v = acc.Filter.Valves(compression_threshold_tokens=200000, max_context_tokens=100000, max_summary_tokens=60000)
    s = acc.resolve_settings(v, "m")
    assert s.trigger_tokens == 75000  # summary_trigger_ratio 0.75 of the cap
    assert s.max_summary_tokens < 50000
    text = " ".join(str(w) for w in s.warnings)
    assert "compression_threshold_tokens (200000) is not below max_context_tokens (100000)" in text
    assert "summaries start at 75% of the cap" in text and "max_summary_tokens (60000)" in text
    zh = " ".join(w.text("zh") for w in s.warnings)
    assert "改为在上限的 75% 时开始摘要" in zh and "max_summary_tokens（60000）" in zh


def test_no_window_known_falls_back_to_the_old_default_cap_quietly():
    s = acc.resolve_settings(acc.Filter.Valves(max_context_tokens=0), "m")
    assert (s.max_context, s.trigger_tokens, s.summary_model) == (acc.WINDOW_FALLBACK_CAP, 96000, "m")
    assert s.warnings == ()


def test_summary_model_window_comes_from_its_own_override():
    v = acc.Filter.Valves(summary_model="mini", model_thresholds='{"mini": {"max_context_tokens": 16000}}')
    s = acc.resolve_settings(v, "big")
    assert (s.summary_model, s.summary_window) == ("mini", 16000)
    assert acc.resolve_settings(acc.Filter.Valves(summary_model_max_context=9000), "big").summary_window == 9000


def test_user_can_hide_the_status_line_and_turn_the_filter_off():
    user_valves = acc.Filter.UserValves(show_status=False)
    assert acc.resolve_settings(acc.Filter.Valves(), "m", user_valves).show_status is False
    f = acc.Filter()
    f.valves.max_context_tokens = 10
    broken = {
        "model": "m",
        "messages": [
            {"role": "tool", "tool_call_id": "x", "content": "orphan"},
            {"role": "user", "content": "hi " * 50},
        ],
    }
    off = {"id": "u", "valves": acc.Filter.UserValves(enabled=False)}
    assert run(f.inlet(broken, __user__=off)) is broken
    assert run(f.outlet(broken, __user__=off)) is broken


def test_status_texts_follow_the_ui_language():
    metadata = {"variables": {"{{USER_LANGUAGE}}": "zh-CN"}}
    assert acc.user_language(metadata) == "zh"
    assert acc.user_language({"variables": {"{{USER_LANGUAGE}}": "fr-FR"}}) == "fr"
    assert acc.user_language({"variables": {"{{USER_LANGUAGE}}": "nl-NL"}}) == "en"
    assert acc.user_language({}, {"info": {"language": "pt-BR"}}) == "pt"
    assert acc.status_text("zh", "sent", used=12345, cap=128000) == "已发送 12.3k / 128k tokens"
    assert acc.status_text("en", "sent", used=950, cap=0) == "950 tokens sent"
    assert acc.status_text("de", "left_out", messages=1) == "1 Nachricht weggelassen, um das Limit einzuhalten"


def test_every_language_has_every_text_with_the_same_placeholders():
    english = acc.STATUS_TEXTS["en"]
    assert set(acc.STATUS_TEXTS) == {"en", "zh", "ja", "ko", "fr", "de", "es", "pt", "ru", "it", "pl"}
    assert set(acc.MESSAGE_NOUNS) == set(acc.STATUS_TEXTS)
    for language, table in acc.STATUS_TEXTS.items():
        assert set(table) == set(english), language
        for key, text in table.items():
            assert set(re.findall(r"{(\w+)}", text)) == set(re.findall(r"{(\w+)}", english[key])), (language, key)
            if language != "en" and not key.startswith("r_internal"):
                assert text != english[key], (language, key)  # translated, not copied


@pytest.mark.parametrize(
    "language, counts",
    [
        ("en", {1: "1 message", 2: "2 messages", 0: "0 messages"}),
        ("fr", {0: "0 message", 1: "1 message", 2: "2 messages"}),
        (
            "ru",
            {
                1: "1 сообщение",
                3: "3 сообщения",
                5: "5 сообщений",
                11: "11 сообщений",
                21: "21 сообщение",
                22: "22 сообщения",
            },
        ),
        ("pl", {1: "1 wiadomość", 2: "2 wiadomości", 5: "5 wiadomości", 12: "12 wiadomości", 22: "22 wiadomości"}),
        ("zh", {1: "1 条消息", 7: "7 条消息"}),
        ("ko", {3: "메시지 3개"}),
    ],
)
def test_message_counts_use_the_languages_plural_forms(language, counts):
    for n, phrase in counts.items():
        assert acc.messages_phrase(language, n) == phrase


def test_settings_notes_are_translated_in_the_status_line():
    s = acc.resolve_settings(acc.Filter.Valves(keep_last=-3), "m")
    [warning] = s.warnings
    assert str(warning) == "keep_last = -3 is not valid (expected 0–10000); using 0"
    assert (
        acc.status_text("ja", "settings", reason=warning)
        == "設定：keep_last = -3 は無効です（0–10000 を指定してください）。0 を使用します"
    )
    assert (
        acc.status_text("zh", "summary_failed", reason=acc.Fault.TIMEOUT, retry="8s")
        == "摘要失败：摘要模型超时 · 8s 后重试"
    )


def test_status_text_never_raises():
    assert acc.status_text("en", "no such key", a=1) == "no such key a=1"
    assert acc.status_text("xx", "summary_done", messages=2) == "Summary updated: covers 2 messages"
    assert acc.status_text("ru", "settings") == "Настройки: ?"  # a value missing
    assert acc.status_text("en", "sent", used="many", cap=object()).endswith("tokens sent")
    assert acc.status_text(None, None) is not None


def test_inlet_shows_usage_in_the_status_line():
    events = []

    async def emitter(event):
        events.append(event)

    f = acc.Filter()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    meta = {"variables": {"{{USER_LANGUAGE}}": "zh-CN"}}

    async def turn():
        sent = await f.inlet(body, __user__={"id": "u"}, __event_emitter__=emitter, __metadata__=meta)
        await lines_written(f)
        if acc.request_hook_follows():  # Open WebUI 0.11.2+: the request hook's line is the one shown
            assert events == []
            await f.request(sent, __user__={"id": "u"}, __event_emitter__=emitter, __metadata__=meta)
            await lines_written(f)

    run(turn())
    assert len(events) == 1 and events[0]["type"] == "status"
    assert events[0]["data"]["description"].startswith("已发送 ")


def _hook(f: acc.Filter):
    # the hook whose line is shown: the request hook from Open WebUI 0.11.2, else inlet
    return f.request if acc.request_hook_follows() else f.inlet


def test_a_status_line_being_written_does_not_hold_up_the_request_but_outlet_waits_for_it():
    # Open WebUI writes a status into the chat row under a row lock that
    # another worker may hold: the reply must not wait for it, outlet must.
    written, events = asyncio.Event(), []

    async def locked_row(event):
        await written.wait()
        events.append(event["data"]["description"])

    async def turn():
        f = acc.Filter()
        meta = {"chat_id": "c1", "message_id": "m1"}
        body = {"model": "m", "chat_id": "c1", "messages": [{"role": "user", "content": "hello"}]}
        await asyncio.wait_for(_hook(f)(body, __user__={"id": "u"}, __event_emitter__=locked_row, __metadata__=meta), 5)
        assert events == []  # the request went on while its line waits
        reply = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "hi"}]}
        outlet = asyncio.ensure_future(f.outlet(reply, __user__={"id": "u"}, __metadata__=meta))
        await asyncio.sleep(0.05)
        assert not outlet.done()
        written.set()
        await asyncio.wait_for(outlet, 5)
        assert len(events) == 1

    run(turn())


def test_a_chats_status_lines_are_written_in_the_order_of_its_requests():
    # A native tool loop calls the request hook before each model call: a
    # slow first write must not let the second line land first.
    first_may_finish, events = asyncio.Event(), []

    async def emitter(event):
        if not events and not first_may_finish.is_set():
            first_may_finish.set()
            await asyncio.sleep(0.05)
        events.append(event["data"]["description"])

    async def loop():
        f = acc.Filter()
        meta = {"chat_id": "c1", "message_id": "m1"}
        short = [{"role": "user", "content": "hello"}]
        longer = [*short, {"role": "assistant", "content": "word " * 400}, {"role": "user", "content": "more"}]
        for messages in (short, longer):
            body = {"model": "m", "chat_id": "c1", "messages": messages}
            await _hook(f)(body, __user__={"id": "u"}, __event_emitter__=emitter, __metadata__=meta)
        await lines_written(f)
        return f

    run(loop())
    assert len(events) == 2
    used = [int(re.search(r"\d+", line).group()) for line in events]
    assert used[0] < used[1]  # the short request's line first


def test_inlet_never_raises_and_sends_the_safest_list(monkeypatch):
    events = []

    async def emitter(event):
        events.append(event["data"]["description"])

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    f = acc.Filter()
    chat = [{"role": "tool", "tool_call_id": "x", "content": "orphan"}, {"role": "user", "content": "q"}]
    monkeypatch.setattr(acc, "protected_head_end", broken)
    out = run(f.inlet({"model": "m", "messages": chat}, __user__={"id": "u"}, __event_emitter__=emitter))
    assert out["messages"] == [{"role": "user", "content": "q"}]  # still repaired
    assert events and "RuntimeError: boom" in events[-1]
    monkeypatch.setattr(acc, "repair_transcript", broken)
    body = {"model": "m", "messages": chat}
    assert run(f.inlet(body, __user__={"id": "u"}, __event_emitter__=emitter)) is body  # as it came


@pytest.mark.parametrize(
    "body", [None, 42, "text", {}, {"messages": None}, {"messages": "x"}, {"messages": [None, 3, "a"]}]
)
def test_inlet_request_and_outlet_accept_any_body(body):
    f = acc.Filter()
    for hook in (f.inlet, f.request, f.outlet):
        run(hook(body, __user__={"id": "u"}))


def test_docs_list_every_valve():
    # the README's valve table moved to docs/en/overview.md (issue 31: a short README)
    readme = (Path(__file__).resolve().parents[2] / "docs" / "en" / "overview.md").read_text(encoding="utf-8")
    for name in list(acc.Filter.Valves.model_fields) + list(acc.Filter.UserValves.model_fields):
        assert f"`{name}`" in readme, name
    for name in acc.LEGACY_VALVES:
        assert f"`{name}`" in readme, name
