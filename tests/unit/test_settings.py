"""Valves, their resolution per model, user valves, status texts, and the
promise that inlet never raises into Open WebUI."""

import asyncio
import json

import pytest
from pydantic import ValidationError

import async_context_compression as acc


def run(coro):
    return asyncio.run(coro)


def test_valve_names_and_defaults_are_the_ones_admins_know():
    v = acc.Filter.Valves()
    assert (v.priority, v.compression_threshold_tokens, v.max_context_tokens) == (10, 64000, 128000)
    assert (v.keep_first, v.keep_last, v.summary_model, v.summary_model_max_context) == (1, 6, "", 0)
    assert (v.max_summary_tokens, v.summary_temperature, v.model_thresholds) == (2048, 0.1, "")
    assert (v.show_status, v.debug) == (True, False)
    for name, field in acc.Filter.Valves.model_fields.items():
        assert field.description and len(field.description) > 20, name
    u = acc.Filter.UserValves()
    assert (u.enabled, u.show_status) == (True, True)


@pytest.mark.parametrize(
    "values, words",
    [
        ({"max_context_tokens": -1}, "max_context_tokens"),
        ({"keep_last": -3}, "keep_last"),
        ({"summary_trigger_ratio": 3}, "summary_trigger_ratio"),
        ({"model_thresholds": "{not json"}, "model_thresholds is not valid JSON"),
        ({"model_thresholds": '{"gpt-4o": {"max_context_tokens": "lots"}}'}, "max_context_tokens='lots' ignored"),
        ({"model_thresholds": "[1, 2]"}, "must be a JSON object"),
    ],
)
def test_invalid_valves_are_refused_with_a_message_that_names_them(values, words):
    with pytest.raises(ValidationError) as info:
        acc.Filter.Valves(**values)
    assert words in str(info.value)


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
    text = " ".join(s.warnings)
    assert "compression_threshold_tokens (200000)" in text and "max_summary_tokens" in text


def test_no_cap_keeps_the_threshold_and_summary_defaults():
    s = acc.resolve_settings(acc.Filter.Valves(max_context_tokens=0), "m")
    assert (s.max_context, s.trigger_tokens, s.summary_model) == (0, 64000, "m")
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
    assert acc.user_language({"variables": {"{{USER_LANGUAGE}}": "fr-FR"}}) == "en"
    assert acc.status_text("zh", "usage", used=12345, budget=128000) == "上下文 12k / 128k tokens"
    assert acc.status_text("en", "usage", used=950, budget=0) == "Context 950 / no cap tokens"
    assert set(acc.STATUS_TEXTS["zh"]) == set(acc.STATUS_TEXTS["en"])


def test_inlet_shows_usage_in_the_status_line():
    events = []

    async def emitter(event):
        events.append(event)

    f = acc.Filter()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    run(
        f.inlet(
            body,
            __user__={"id": "u"},
            __event_emitter__=emitter,
            __metadata__={"variables": {"{{USER_LANGUAGE}}": "zh-CN"}},
        )
    )
    assert len(events) == 1 and events[0]["type"] == "status"
    assert events[0]["data"]["description"].startswith("上下文 ")


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
