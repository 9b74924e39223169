"""Valves are accepted from anything stored: this filter's values of any
version, the older community filter's under the same id, and values typed
in the admin UI that are out of range or unreadable. What was carried over,
ignored or corrected is explained (log and status line), never raised:
Open WebUI builds Valves(**stored) before every hook."""

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import async_context_compression as acc

# What the older filter (same function id) leaves stored in Open WebUI.
OLDER_FILTER_VALVES = {
    "priority": 10,
    "compression_threshold_tokens": 64000,
    "max_context_tokens": 128000,
    "keep_first": 0,
    "keep_last": 6,
    "summary_model": None,
    "summary_model_max_context": 0,
    "max_summary_tokens": 16384,
    "summary_temperature": 0.3,
    "model_thresholds": "gpt-4:8000:32000,gpt-4o:90000:120000",
    "debug_mode": True,
    "show_token_usage_status": True,
    "token_usage_status_threshold": 80,
    "summary_llm_timeout_seconds": 45,
    "summary_fail_mode": "silent",
    "compression_style": "aggressive",
    "enable_tool_output_trimming": True,
    "tool_trim_threshold_chars": 600,
    "show_debug_log": False,
}


def notes_text(valves) -> str:
    return " | ".join(str(n) for n in valves._notes)


def test_the_older_filters_stored_valves_load_and_mean_the_same():
    v = acc.Filter.Valves(**OLDER_FILTER_VALVES)
    assert v.summary_model == "" and v.keep_first == 0
    assert v.debug is True and v.show_status is True
    assert v.summary_timeout_seconds == 45
    assert v.status_usage_threshold == pytest.approx(0.8)
    assert v.summary_style == "concise"  # its "aggressive"
    s = acc.resolve_settings(v, "gpt-4o")
    assert (s.threshold, s.max_context, s.status_usage_threshold) == (90000, 120000, pytest.approx(0.8))
    assert (acc.resolve_settings(v, "gpt-4").threshold, acc.resolve_settings(v, "gpt-4").max_context) == (8000, 32000)
    assert acc.resolve_settings(v, "other").max_context == 128000
    text = notes_text(v)
    assert "carried over from the older filter: compression_style → summary_style, debug_mode → debug" in text
    assert "summary_llm_timeout_seconds → summary_timeout_seconds" in text
    assert "token_usage_status_threshold → status_usage_threshold" in text
    assert (
        "not used by this filter, ignored: enable_tool_output_trimming, show_debug_log, summary_fail_mode, "
        "tool_trim_threshold_chars" in text
    )
    # the same Notes reach the status line, in the user's language
    assert [str(w) for w in s.warnings[:2]] == [str(n) for n in v._notes]
    assert s.warnings[0].text("zh").startswith("已沿用旧版过滤器的设置：compression_style → summary_style")


def test_the_older_filters_notes_are_logged_once(caplog):
    acc._LOGGED_NOTES.clear()
    with caplog.at_level(logging.WARNING, logger="async_context_compression"):
        for _ in range(3):
            acc.Filter.Valves(**OLDER_FILTER_VALVES)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("carried over from the older filter" in line for line in lines) == 1, lines
    assert sum("ignored: enable_tool_output_trimming" in line for line in lines) == 1, lines


def test_saving_after_the_upgrade_keeps_only_our_names_and_round_trips():
    # Open WebUI saves Valves(**form).model_dump(exclude_unset=True)
    dumped = acc.Filter.Valves(**OLDER_FILTER_VALVES).model_dump(exclude_unset=True)
    assert set(dumped) <= set(acc.Filter.Valves.model_fields)
    assert dumped["summary_timeout_seconds"] == 45 and dumped["status_usage_threshold"] == pytest.approx(0.8)
    again = acc.Filter.Valves(**dumped)
    assert again._notes == ()  # nothing left to explain once saved
    assert again.model_dump() == acc.Filter.Valves(**OLDER_FILTER_VALVES).model_dump()
    # the admin form sends every field: that saves as it came
    form = acc.Filter.Valves().model_dump()
    assert acc.Filter.Valves(**form).model_dump(exclude_unset=True) == form


def test_old_and_new_names_together_keep_the_new_value():
    v = acc.Filter.Valves(debug=False, debug_mode=True, summary_timeout_seconds=60, summary_llm_timeout_seconds=45)
    assert (v.debug, v.summary_timeout_seconds) == (False, 60)
    assert "ignored: debug_mode, summary_llm_timeout_seconds" in notes_text(v)


@pytest.mark.parametrize(
    "raw, table",
    [
        ("llama3:8b:7000:8000\nqwen:1000:2000", {"llama3:8b": (7000, 8000), "qwen": (1000, 2000)}),
        ("gpt-4:8000:32000, gpt-4o : 90000 : 120000 ;", {"gpt-4": (8000, 32000), "gpt-4o": (90000, 120000)}),
    ],
)
def test_the_older_model_thresholds_list_is_read(raw, table):
    parsed, problems = acc.parse_model_thresholds(raw)
    assert problems == []
    assert {m: (e["compression_threshold_tokens"], e["max_context_tokens"]) for m, e in parsed.items()} == table


def test_a_half_readable_list_is_explained_not_half_used():
    parsed, problems = acc.parse_model_thresholds("gpt-4:8000:32000,gpt-4o=90000")
    assert parsed == {} and "model_thresholds cannot be read" in str(problems[0])


@pytest.mark.parametrize(
    "values, field, value, words",
    [
        (
            {"max_context_tokens": "lots"},
            "max_context_tokens",
            0,
            "max_context_tokens = 'lots' is not valid (expected int); using 0",
        ),
        (
            {"show_status": "maybe"},
            "show_status",
            True,
            "show_status = 'maybe' is not valid (expected bool); using True",
        ),
        ({"summary_temperature": float("nan")}, "summary_temperature", 0.1, "summary_temperature = nan is not valid"),
        ({"keep_first": [1]}, "keep_first", 1, "keep_first = [1] is not valid"),
        ({"max_context_tokens": "9000"}, "max_context_tokens", 9000, None),
        ({"debug": "on"}, "debug", True, None),
        ({"keep_last": 4.6}, "keep_last", 5, None),
        ({"summary_model": 7}, "summary_model", "7", None),
    ],
)
def test_values_of_the_wrong_type_are_converted_or_replaced_and_explained(values, field, value, words):
    v = acc.Filter.Valves(**values)
    assert getattr(v, field) == value
    if words is None:
        assert v._notes == ()
    else:
        assert words in notes_text(v)
        assert any(words in str(w) for w in acc.resolve_settings(v, "m").warnings)


@pytest.mark.parametrize(
    "values, attribute, used, words",
    [
        (
            {"summary_trigger_ratio": 3},
            "trigger_tokens",
            128000,  # the whole fallback cap: no window is known
            "summary_trigger_ratio = 3.0 is not valid (expected 0.1–1.0)",
        ),
        ({"max_summary_tokens": 1}, "max_summary_tokens", 64, "max_summary_tokens = 1 is not valid (expected 64–"),
        ({"summary_low_water": 3}, "low_water", 0.9, "summary_low_water = 3.0 is not valid (expected 0.1–0.9)"),
        ({"summary_timeout_seconds": 10**12}, "summary_timeout", 86400.0, "summary_timeout_seconds = 1000000000000"),
        ({"max_context_tokens": 10**30}, "max_context", 1_000_000_000, "is not valid (expected 0–1000000000)"),
        ({"status_usage_threshold": 80}, "status_usage_threshold", 0.8, "status_usage_threshold = 80.0"),
        ({"status_usage_threshold": -1}, "status_usage_threshold", 0.0, "status_usage_threshold = -1.0"),
        ({"summary_style": "Faithful"}, "summary_style", "faithful", None),
        (
            {"summary_style": "short"},
            "summary_style",
            "balanced",
            "summary_style = 'short' is not valid (expected concise / balanced / faithful)",
        ),
    ],
)
def test_values_out_of_range_are_kept_as_typed_and_corrected_per_request(values, attribute, used, words):
    v = acc.Filter.Valves(**values)
    assert v._notes == () and v.model_dump(exclude_unset=True) == values
    s = acc.resolve_settings(v, "m")
    assert getattr(s, attribute) == used
    text = " | ".join(str(w) for w in s.warnings)
    assert (words in text) if words else text == ""


def test_new_valves_reach_the_settings():
    v = acc.Filter.Valves(
        summary_style="faithful",
        summary_prompt="  Keep every ticket number.  ",
        summary_model_params='{"chat_template_kwargs": {"enable_thinking": false}, "top_p": 0.9}',
        status_usage_threshold=0.5,
        summary_low_water=0.3,
    )
    s = acc.resolve_settings(v, "m")
    assert (s.summary_style, s.summary_prompt, s.status_usage_threshold, s.low_water) == (
        "faithful",
        "Keep every ticket number.",
        0.5,
        0.3,
    )
    assert s.summary_model_params == {"chat_template_kwargs": {"enable_thinking": False}, "top_p": 0.9}
    assert s.warnings == ()
    d = acc.resolve_settings(acc.Filter.Valves(), "m")
    assert (d.summary_style, d.summary_prompt, d.summary_model_params, d.status_usage_threshold) == (
        "balanced",
        "",
        {},
        0.0,
    )


@pytest.mark.parametrize(
    "raw, params, words",
    [
        ("{enable_thinking: false}", {}, "summary_model_params cannot be read"),
        ("[1]", {}, "summary_model_params cannot be read (not a JSON object)"),
        ('{"model": "x", "messages": [], "seed": 1}', {"seed": 1}, "the filter sets messages, model itself"),
    ],
)
def test_unusable_summary_model_params_are_accepted_and_explained(raw, params, words):
    v = acc.Filter.Valves(summary_model_params=raw)
    assert v.summary_model_params == raw
    s = acc.resolve_settings(v, "m")
    assert s.summary_model_params == params
    assert any(words in str(w) for w in s.warnings), [str(w) for w in s.warnings]


def test_a_dict_stored_by_older_versions_still_loads():
    v = acc.Filter.Valves(model_thresholds={"gpt-4o": {"max_context_tokens": 9000}})
    assert json.loads(v.model_thresholds) == {"gpt-4o": {"max_context_tokens": 9000}}
    assert acc.resolve_settings(v, "gpt-4o").max_context == 9000


def test_valves_that_are_not_a_mapping_give_the_defaults():
    assert acc.Filter.Valves.model_validate(None).model_dump() == acc.Filter.Valves().model_dump()
    assert acc.Filter.Valves.model_validate([("debug", True)]).debug is False
    v = acc.Filter.Valves(debug=True)
    assert acc.Filter.Valves.model_validate(v) is v


def test_user_valves_accept_anything():
    u = acc.Filter.UserValves(enabled="off", show_status=None, theme="dark")
    assert (u.enabled, u.show_status) == (False, True)
    assert "ignored: theme" in notes_text(u)
    assert any("ignored: theme" in str(w) for w in acc.resolve_settings(acc.Filter.Valves(), "m", u).warnings)


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", "0", "1", "true", "80", "gpt-4:8000:32000", '{"a": {"max_context_tokens": 5}}', "{"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.floats(), st.text(max_size=5)), max_size=3),
)
stored_values = st.dictionaries(
    st.sampled_from(sorted(acc.Filter.Valves.model_fields) + sorted(acc.LEGACY_VALVES) + ["junk", ""]), _values
)


@settings(max_examples=300, deadline=None)
@given(stored_values)
def test_valves_never_raise_whatever_is_stored(values):
    v = acc.Filter.Valves(**values)
    saved = v.model_dump(exclude_unset=True)  # what Open WebUI stores on save
    assert set(saved) <= set(acc.Filter.Valves.model_fields)
    again = acc.Filter.Valves(**saved)
    assert again.model_dump() == v.model_dump()  # a save round-trips
    s = acc.resolve_settings(v, "any-model")
    for warning in s.warnings:
        for language in acc.STATUS_TEXTS:
            assert acc.status_text(language, "settings", reason=warning)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["enabled", "show_status", "junk"]), _values))
def test_user_valves_never_raise(values):
    u = acc.Filter.UserValves(**values)
    assert isinstance(u.enabled, bool) and isinstance(u.show_status, bool)


@pytest.mark.parametrize(
    "share, cap, used, shown",
    [
        (0.0, 1000, 10, True),
        (0.0, 0, 10, True),
        (0.8, 1000, 799, False),
        (0.8, 1000, 800, True),
        (0.8, 0, 10**6, True),  # 0: the window's cap, here the fallback
        (1.0, 1000, 1000, True),
    ],
)
def test_usage_is_shown_from_the_threshold_share_of_the_cap(share, cap, used, shown):
    s = acc.resolve_settings(acc.Filter.Valves(status_usage_threshold=share, max_context_tokens=cap), "m")
    assert acc.usage_shown(s, used) is shown
