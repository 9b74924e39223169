"""Verdicts of devkit.provider_rules on the spec's adversarial transcripts.

Each case lists the exact set of rule ids expected per provider; an empty set
means the provider accepts the list.
"""

import copy

import pytest

from devkit.provider_rules import (
    Violation,
    check_anthropic,
    check_gemini,
    check_mistral,
    check_moonshot,
    check_openai,
    to_anthropic,
    violations_added,
)

CHECKS = {
    "openai": check_openai,
    "mistral": check_mistral,
    "anthropic": check_anthropic,
    "gemini": check_gemini,
}


# --- message builders ----------------------------------------------------


def S(text="You are helpful."):
    return {"role": "system", "content": text}


def U(text="hello"):
    return {"role": "user", "content": text}


def A(text="ok"):
    return {"role": "assistant", "content": text}


def call(cid, name="search", arguments="{}"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def AC(*ids, content=None, arguments="{}"):
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [call(i, arguments=arguments) for i in ids],
    }


def T(cid, text="result"):
    return {"role": "tool", "tool_call_id": cid, "content": text}


LONG = "call_" + "x" * 45  # 50 chars

# name -> (messages, {provider: expected rule ids})
TRANSCRIPTS = {
    "01_cut_after_calls": (
        [S(), U(), AC("a"), U("next")],
        {"openai": {"O2"}, "mistral": {"M2"}, "anthropic": {"A1"}, "gemini": {"G3"}},
    ),
    "01b_list_ends_on_calls": (
        [U(), AC("a")],
        {"openai": {"O2"}, "mistral": {"M2"}, "anthropic": {"A1"}, "gemini": {"G3"}},
    ),
    "02_first_kept_is_tool": (
        [S(), T("a"), A("done"), U("next")],
        {"openai": {"O1"}, "mistral": {"M1", "M2", "M3"}, "anthropic": {"A2"}, "gemini": {"G2"}},
    ),
    "03_parallel_half_kept": (
        [U(), AC("a", "b"), T("a"), U("next")],
        {"openai": {"O2"}, "mistral": {"M1", "M2"}, "anthropic": {"A1"}, "gemini": {"G3"}},
    ),
    "04_user_inside_results": (
        [U(), AC("a", "b"), T("a"), U("next"), T("b")],
        {"openai": {"O1", "O2"}, "mistral": {"M1"}, "anthropic": {"A3"}, "gemini": {"G2", "G3"}},
    ),
    "05_tool_then_user": (
        [U(), AC("a"), T("a"), U("next")],
        {"openai": set(), "mistral": {"M1"}, "anthropic": set(), "gemini": set()},
    ),
    "06_duplicate_result": (
        [U(), AC("a"), T("a"), T("a", "retry")],
        {"openai": {"O5"}, "mistral": {"M2", "M3"}, "anthropic": {"A4"}, "gemini": {"G3"}},
    ),
    "07_id_reused_across_turns": (
        [U(), AC("a"), T("a"), A("x"), U("again"), AC("a"), T("a")],
        {"openai": set(), "mistral": set(), "anthropic": {"A4"}, "gemini": set()},
    ),
    "08_id_over_40": (
        [U(), AC(LONG), T(LONG)],
        {"openai": {"O6"}, "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "09_aborted_turn_with_calls": (
        [
            U(),
            AC("a", content="Let me look."),
            T("a", "Error: request aborted"),
            {"role": "assistant", "content": "", "error": {"content": "aborted"}},
            U("continue"),
        ],
        # the empty errored reply: Anthropic wants content in every message but a final assistant (A10)
        {"openai": set(), "mistral": set(), "anthropic": {"A10"}, "gemini": set()},
    ),
    "10_summary_between_call_and_result": (
        [U(), AC("a"), S("<conversation_summary>MK-1</conversation_summary>"), T("a"), A("x")],
        {"openai": {"O1", "O2"}, "mistral": {"M1"}, "anthropic": set(), "gemini": set()},
    ),
    "10b_summary_as_user_between": (
        [U(), AC("a"), U("[summary] MK-1"), T("a"), A("x")],
        {"openai": {"O1", "O2"}, "mistral": {"M1"}, "anthropic": {"A3"}, "gemini": {"G2", "G3"}},
    ),
    "11a_empty_tool_calls": (
        [U(), {"role": "assistant", "content": "x", "tool_calls": []}, U("next")],
        {"openai": {"O6"}, "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "11b_null_content_without_calls": (
        [U(), {"role": "assistant", "content": None}, U("next")],
        {"openai": {"O7"}, "mistral": set(), "anthropic": {"A10"}, "gemini": set()},
    ),
    "11c_missing_content_key": (
        [{"role": "user"}, A("x"), U("next")],
        {"openai": {"O7"}, "mistral": set(), "anthropic": {"A5", "A10"}, "gemini": set()},
    ),
    "12_truncated_json_arguments": (
        [U(), AC("a", arguments='{"query": "weath'), T("a"), A("x"), U("next")],
        {"openai": set(), "mistral": set(), "anthropic": {"A8"}, "gemini": {"G4"}},
    ),
    "13_late_system_after_assistant": (
        [S(), U(), A("x"), S("late filter note"), U("next")],
        {"openai": set(), "mistral": {"M1"}, "anthropic": set(), "gemini": set()},
    ),
    "13b_late_system_after_user": (
        [S(), U(), S("late filter note"), A("x"), U("next")],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "14_image_parts": (
        [
            S(),
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            A("a cat"),
            U("thanks"),
        ],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "15_single_huge_message": (
        [S(), U("word " * 200_000)],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    # --- valid shapes -----------------------------------------------------
    "valid_single_call": (
        [S(), U(), AC("a"), T("a"), A("answer"), U("next")],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "valid_parallel_any_order": (
        [U(), AC("a", "b", "c", content="checking"), T("c"), T("a"), T("b"), A("done")],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "valid_multi_step_chain": (
        [U(), AC("a"), T("a"), AC("b"), T("b"), AC("c", "d"), T("d"), T("c"), A("done"), U("next")],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "valid_ends_with_results": (
        [U(), AC("a"), T("a")],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
    "valid_unknown_keys": (
        [
            U(),
            dict(AC("a"), reasoning_content="thinking", stopReason="tool_use"),
            dict(T("a"), name="search"),
            dict(A("x"), reasoning_content="..."),
        ],
        {"openai": set(), "mistral": set(), "anthropic": set(), "gemini": set()},
    ),
}


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
@pytest.mark.parametrize("provider", sorted(CHECKS))
def test_transcript_verdict(name, provider):
    messages, expected = TRANSCRIPTS[name]
    frozen = copy.deepcopy(messages)
    got = CHECKS[provider](messages)
    assert {v.rule for v in got} == expected[provider], got
    assert all(isinstance(v, Violation) and v.provider == provider for v in got)
    assert all(v.message for v in got)
    assert messages == frozen  # checkers never mutate their input


# --- exact indices and error texts ----------------------------------------


def test_openai_indices_and_texts():
    msgs = [U(), AC("a", "b"), T("a"), U("next"), T("b")]
    got = check_openai(msgs)
    assert [(v.rule, v.index) for v in got] == [("O2", 1), ("O1", 4)]
    assert "did not have response messages: b" in got[0].message
    assert "must be a response to a preceeding message with 'tool_calls'" in got[1].message


def test_openai_wrong_id_and_long_id_text():
    got = check_openai([U(), AC("a"), T("zzz")])
    assert [(v.rule, v.index) for v in got] == [("O3", 2), ("O2", 1)]
    assert "'tool_call_id' of 'zzz' not found in 'tool_calls' of previous message" in got[0].message
    got = check_openai([U(), AC(LONG), T(LONG)])
    assert got[0].rule == "O6" and "maximum length 40" in got[0].message


def test_openai_duplicate_text():
    got = check_openai([U(), AC("call_1"), T("call_1"), T("call_1")])
    assert [(v.rule, v.index) for v in got] == [("O5", 3)]
    assert "Duplicate value for 'tool_call_id' of 'call_1'" in got[0].message


def test_openai_empty_and_malformed():
    assert [v.rule for v in check_openai([])] == ["O0"]
    assert [v.rule for v in check_openai([{"role": "bot", "content": "x"}])] == ["O0"]
    assert [v.rule for v in check_openai(["hello"])] == ["O0"]
    assert [v.rule for v in check_openai([U(), AC("a"), {"role": "tool", "content": "r"}])] == [
        "O0",
        "O2",
    ]
    got = check_openai([U(), {"role": "assistant", "content": "x", "tool_calls": []}])
    assert [(v.rule, v.index) for v in got] == [("O6", 1)]
    assert "empty array" in got[0].message


def test_openai_content_null_rules():
    assert check_openai([U(), AC("a"), T("a")]) == []  # null allowed with calls
    got = check_openai([U(), {"role": "assistant", "tool_calls": [call("a")]}, T("a")])
    assert got == []  # no content key on an assistant with calls is fine
    for role in ("user", "system", "tool"):
        m = {"role": role, "content": None}
        if role == "tool":
            msgs = [U(), AC("a"), dict(m, tool_call_id="a")]
        else:
            msgs = [m, U()]
        rules = [v.rule for v in check_openai(msgs)]
        assert rules == ["O7"], (role, rules)
        assert "expected a string, got null" in check_openai(msgs)[0].message
    # null content + empty calls: both problems reported
    assert {v.rule for v in check_openai([U(), {"role": "assistant", "content": None, "tool_calls": []}])} == {
        "O6",
        "O7",
    }


def test_openai_names_and_function_names():
    assert [v.rule for v in check_openai([dict(U(), name="bad name!")])] == ["O8"]
    assert check_openai([dict(U(), name="alice_01-x")]) == []
    bad = [U(), AC("a"), T("a")]
    bad[1]["tool_calls"][0]["function"]["name"] = "web.search"
    assert [v.rule for v in check_openai(bad)] == ["O6"]
    bad[1]["tool_calls"][0]["function"]["name"] = "x" * 65
    assert [v.rule for v in check_openai(bad)] == ["O6"]
    bad[1]["tool_calls"][0]["function"]["name"] = "x" * 64
    assert check_openai(bad) == []
    bad[1]["tool_calls"][0]["function"]["arguments"] = {"q": 1}
    assert [v.rule for v in check_openai(bad)] == ["O6"]


def test_openai_image_only_in_user():
    img = {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}}
    assert check_openai([{"role": "user", "content": [img]}]) == []
    got = check_openai([{"role": "system", "content": [img]}, U()])
    assert [v.rule for v in got] == ["O7"]
    assert [v.rule for v in check_openai([{"role": "user", "content": []}])] == ["O7"]


def test_openai_developer_role_ok():
    assert check_openai([{"role": "developer", "content": "rules"}, U()]) == []


def test_mistral_texts():
    got = check_mistral([U(), AC("a"), T("a"), U("next")])
    assert [(v.rule, v.index) for v in got] == [("M1", 3)]
    assert got[0].message == "Unexpected role 'user' after role 'tool'"
    got = check_mistral([U(), AC("a", "b"), T("a"), A("x")])
    assert [(v.rule, v.index) for v in got] == [("M2", 1)]
    assert got[0].message == "Not the same number of function calls and responses"
    got = check_mistral([U(), AC("a"), T("b")])
    assert [v.rule for v in got] == ["M3"]


def test_mistral_does_not_enforce_9_char_ids():
    assert check_mistral([U(), AC("call_abcdefghijkl"), T("call_abcdefghijkl")]) == []


def test_anthropic_conversion_shape():
    msgs = [
        S("sys one"),
        U("q"),
        AC("a", "b", content="Let me check."),
        T("a", "ra"),
        T("b", "rb"),
        U("and?"),
        {"role": "assistant", "content": ""},
        S("late"),
        U("more"),
        A("fine"),
    ]
    system, turns = to_anthropic(msgs)
    assert system == "sys one\n\nlate"
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in turns[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert turns[1]["content"][1]["id"] == "a"
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text", "text"]
    assert [b.get("tool_use_id") for b in turns[2]["content"][:2]] == ["a", "b"]
    # the converter leaves the empty reply out; a real gateway sends it, and Anthropic rejects it
    assert [(v.rule, v.index) for v in check_anthropic(msgs)] == [("A10", 6)]


def test_anthropic_text_before_results_and_empty_text():
    # a text block that lands before the results (assistant message lost)
    msgs = [U(), AC("a"), U("interjection"), T("a")]
    got = check_anthropic(msgs)
    assert [(v.rule, v.index) for v in got] == [("A3", 1)]
    assert "tool_use` ids were found without `tool_result` blocks immediately after: a" in got[0].message
    got = check_anthropic([U(""), A("x")])
    assert sorted(v.rule for v in got) == ["A10", "A7"]


# --- issue 29: ids in a foreign alphabet, messages that say nothing ----------


@pytest.mark.parametrize("cid", ["functions.bash:0", "call!1", "a.b", "x:y", "tool use", "ünï"])
def test_anthropic_rejects_tool_use_ids_outside_its_alphabet(cid):
    got = check_anthropic([U(), AC(cid), T(cid), A("done")])
    assert [(v.rule, v.index) for v in got] == [("A9", 1), ("A9", 2)]
    assert "String should match pattern '^[a-zA-Z0-9_-]+$'" in got[0].message
    assert check_openai([U(), AC(cid), T(cid), A("done")]) == []  # OpenAI takes them


@pytest.mark.parametrize("cid", ["call_0", "toolu_01AbC-d", "exec_0_2", "x" * 40])
def test_anthropic_takes_ids_inside_its_alphabet(cid):
    assert check_anthropic([U(), AC(cid), T(cid), A("done")]) == []


@pytest.mark.parametrize(
    "content", ["", None, [], "   ", "\n\t", [{"type": "text", "text": ""}], [{"type": "text", "text": " "}]]
)
def test_a_message_that_says_nothing_is_rejected_by_anthropic_and_moonshot_but_not_openai(content):
    messages = [U("q"), {"role": "assistant", "content": content}, U("next")]
    assert [(v.rule, v.index) for v in check_anthropic(messages)] == [("A10", 1)]
    assert "non-empty content" in check_anthropic(messages)[0].message or "non-whitespace" in (
        check_anthropic(messages)[0].message
    )
    got = check_moonshot(messages)
    assert [(v.rule, v.index) for v in got] == [("K1", 1)]
    assert got[0].message == "Invalid request: the message at position 1 with role 'assistant' must not be empty"
    if content is not None and content != []:
        assert check_openai(messages) == []


def test_an_empty_final_assistant_is_a_prefill_anthropic_allows_but_not_whitespace():
    assert check_anthropic([U("q"), A("")]) == []
    assert check_anthropic([U("q"), A(None)]) == []
    got = check_anthropic([U("q"), A("  ")])
    assert [v.rule for v in got] == ["A10"] and "trailing whitespace" in got[0].message
    assert [v.rule for v in check_moonshot([U("q"), A("")])] == ["K1"]


def test_messages_that_say_something_pass():
    messages = [
        U([{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]),
        A(" ok "),
        U("q"),
        AC("a", content=""),
        T("a", ""),
        A([{"type": "refusal", "refusal": "no"}]),
        U("next"),
    ]
    assert check_anthropic(messages) == []
    assert check_moonshot(messages) == []


def test_anthropic_first_turn_must_be_user():
    got = check_anthropic([S(), A("hello there"), U()])
    assert [(v.rule, v.index) for v in got] == [("A5", 1)]
    assert [v.rule for v in check_anthropic([S()])] == ["A5"]
    assert [v.rule for v in check_anthropic([])] == ["A5"]


def test_anthropic_orphan_result_text():
    got = check_anthropic([U(), A("x"), T("gone")])
    assert [(v.rule, v.index) for v in got] == [("A2", 2)]
    assert "unexpected `tool_use_id` found in `tool_result` blocks: gone" in got[0].message


def test_gemini_starts_with_function_call():
    got = check_gemini([S(), AC("a"), T("a"), A("x"), U()])
    assert [(v.rule, v.index) for v in got] == [("G1", 1)]
    assert "function call turn comes immediately after a user turn" in got[0].message


def test_gemini_call_after_model_text_is_merged_not_rejected():
    # model text then model call merge into one model turn after the user turn
    assert check_gemini([U(), A("thinking aloud"), AC("a"), T("a")]) == []


def test_gemini_count_mismatch_index():
    got = check_gemini([U(), AC("a", "b"), T("a"), A("x")])
    assert [(v.rule, v.index) for v in got] == [("G3", 2)]


def test_checkers_never_raise_on_garbage():
    garbage = [
        None,
        "str",
        [None, 1, "x"],
        [{"role": "tool"}],
        [{"role": "assistant", "tool_calls": "nope"}],
        [{"role": "assistant", "tool_calls": [None, {"id": 3}], "content": [1, {"type": 5}]}],
        [{"role": "user", "content": {"weird": True}}],
    ]
    for msgs in garbage:
        for check in CHECKS.values():
            check(msgs)  # must not raise
        to_anthropic(msgs)
    assert check_openai(None)[0].rule == "O0"


# --- violations_added ------------------------------------------------------


def test_violations_added_tool_user_created():
    before = [U(), AC("a"), T("a"), A("x"), U("next")]
    after = [U(), AC("a"), T("a"), U("next")]  # the assistant text was dropped
    got = violations_added(before, after)
    assert [(v.provider, v.rule) for v in got] == [("mistral", "M1")]


def test_violations_added_ignores_preexisting():
    before = [U(), AC("a"), T("a"), U("next")]  # already bad for mistral
    after = [U(), AC("a"), T("a"), U("next"), A("x"), U("more")]
    assert violations_added(before, after) == []


def test_violations_added_front_truncation():
    before = [S(), U(), AC("a"), T("a"), A("x"), U("next")]
    after = [S(), T("a"), A("x"), U("next")]  # cut between the call and its result
    got = violations_added(before, after)
    assert {(v.provider, v.rule) for v in got} == {
        ("mistral", "M1"),
        ("mistral", "M2"),
        ("mistral", "M3"),
        ("anthropic", "A2"),
        ("gemini", "G2"),
    }
    assert [v.rule for v in violations_added(before, after, providers=("openai",))] == ["O1"]


def test_violations_added_clean():
    before = [S(), U(), AC("a"), T("a"), A("x"), U("next")]
    after = [S("<conversation_summary>MK-1</conversation_summary>"), U("next")]
    assert violations_added(before, after) == []
