"""Four shapes providers reject that repair used to send (issue 29), each step on its own and the whole
Filter.inlet path as Open WebUI calls it:

1. dropping an errored tool turn made ``tool -> user`` (Mistral) and lost the text the user saw;
2. tool-call ids outside ``[a-zA-Z0-9_-]`` (``functions.bash:0``), which Anthropic rejects;
3. replies that say nothing (a reply stopped before its first token), which Anthropic, Moonshot and DeepSeek reject;
4. tool names with whitespace around them became ``_read_``, a tool the model does not have.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import asdict

import pytest
from acc_builders import AS, IMG, TXT, A, S, T, U, call, frozen, make_filter

import async_context_compression as acc
from devkit.provider_rules import CHECKERS, check_mistral

MARKED = AS(acc.INTERRUPTED_REPLY)


def counts(report: acc.RepairReport) -> dict:
    return {k: v for k, v in asdict(report).items() if v}


def repair(messages: list) -> tuple[list, acc.RepairReport]:
    before = frozen(messages)
    out, report = acc.repair_transcript(messages)
    assert messages == before, "repair mutated its input"
    again, second = acc.repair_transcript(out)
    assert again == out and not second.changed(), second.describe()
    return out, report


def rejected_by(messages: list) -> dict:
    """Each provider's rules that ``messages`` breaks (empty: every provider accepts it)."""
    return {name: sorted({v.rule for v in check(messages)}) for name, check in CHECKERS.items() if check(messages)}


def errored(*ids: str, content, **marker) -> dict:
    return A(*ids, content=content, **(marker or {"stopReason": "error"}))


# -- 1. errored tool turns -----------------------------------------------------------------------------------------


def test_the_issues_errored_turn_keeps_its_text_and_makes_no_tool_to_user():
    # [assistant(call a), tool a, assistant "let me also check…" (call b, errored), user]
    messages = [U("q"), A("a"), T("a"), errored("b", content="let me also check…"), U("and?")]
    assert check_mistral(messages)  # b has no result: Mistral counts calls and results (M2)
    out, report = repair(messages)
    assert out == [U("q"), A("a"), T("a"), {**AS("let me also check…"), "stopReason": "error"}, U("and?")]
    assert counts(report) == {"dropped_errored_turns": 1}
    assert rejected_by(out) == {}


def test_an_errored_turn_that_said_nothing_leaves_a_marked_reply_where_going_would_make_tool_to_user():
    for content in (None, "", "  ", [TXT("")]):
        out, report = repair([U("q"), A("a"), T("a"), errored("b", content=content), T("b", "partial"), U("and?")])
        assert out == [U("q"), A("a"), T("a"), {**MARKED, "stopReason": "error"}, U("and?")]
        assert counts(report) == {
            "dropped_errored_turns": 1,
            "dropped_errored_results": 1,
            "marked_interrupted_replies": 1,
        }
        assert rejected_by(out) == {}


@pytest.mark.parametrize(
    "messages, expected",
    [
        # first step of the turn, with text and a result: the text stays, the call and its result go
        (
            [U("q"), errored("b", content="Checking."), T("b"), AS("done"), U("next")],
            [U("q"), {**AS("Checking."), "stopReason": "error"}, AS("done"), U("next")],
        ),
        # first step, no text: nothing to keep, and nothing to bridge (user -> user is fine everywhere)
        ([U("q"), errored("b", content=None), T("b"), U("next")], [U("q"), U("next")]),
        # last message of the list (a tool loop's request): the text stays as the last reply
        (
            [U("q"), A("a"), T("a"), errored("b", content="Let me see.", finish_reason="aborted")],
            [U("q"), A("a"), T("a"), {**AS("Let me see."), "finish_reason": "aborted"}],
        ),
        # last, no text: the list ends with the healthy step's result, as a tool loop does
        ([U("q"), A("a"), T("a"), errored("b", content="")], [U("q"), A("a"), T("a")]),
        # parallel calls, partial results (c answered, d not): both calls and c's result go
        (
            [U("q"), errored("c", "d", content="Two at once.", error={"message": "boom"}), T("c"), U("next")],
            [U("q"), {**AS("Two at once."), "error": {"message": "boom"}}, U("next")],
        ),
        # between a healthy turn's parallel results: b is left unanswered and goes, its result an orphan
        (
            [U("q"), A("a", "b"), T("a"), errored("c", content="Also…"), T("b"), U("next")],
            [U("q"), A("a"), T("a"), {**AS("Also…"), "stopReason": "error"}, U("next")],
        ),
        # between two healthy steps of one chain, no text: the chain goes on
        (
            [U("q"), A("a"), T("a"), errored("b", content=None), T("b"), A("c"), T("c"), AS("done"), U("next")],
            [U("q"), A("a"), T("a"), A("c"), T("c"), AS("done"), U("next")],
        ),
    ],
)
def test_an_errored_turn_in_every_position(messages, expected):
    out, _ = repair(messages)
    assert out == expected
    assert not any(m.get("tool_calls") and acc._is_errored_assistant(m) for m in out)
    assert all(v.rule != "M1" for v in check_mistral(out))  # no tool -> user, no tool -> system
    assert {name: rules for name, rules in rejected_by(out).items() if name != "mistral"} == {}


def test_drop_errored_tool_turns_on_its_own_keeps_the_turn_as_a_plain_reply():
    report = acc.RepairReport()
    messages = [U("q"), errored("a", "b", content="Working…"), T("b"), T("a"), U("?")]
    out = acc.drop_errored_tool_turns(messages, report)
    assert out == [U("q"), {**AS("Working…"), "stopReason": "error"}, U("?")]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 2}
    # a text-less one stays as an empty reply (never null content: O7), for drop_empty_messages to judge
    out = acc.drop_errored_tool_turns([U("q"), errored("a", content=None), U("?")], acc.RepairReport())
    assert out == [U("q"), {**AS(""), "stopReason": "error"}, U("?")]


# -- 2. tool-call ids in a foreign alphabet ---------------------------------------------------------------------------


def test_the_issues_foreign_ids_are_renamed_on_both_sides_validly_and_the_same_every_time():
    ids = ["functions.bash:0", "call!1", "a.b", "a:b"]
    messages = [U("q"), A(*ids), *(T(i, f"r{i}") for i in ids), AS("done"), U("next")]
    assert rejected_by(messages) == {"anthropic": ["A9"]}
    out, report = repair(messages)
    new = [c["id"] for c in out[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in out[2:6]] == new
    assert [m["content"] for m in out[2:6]] == [f"r{i}" for i in ids]
    assert new[0].startswith("functions_bash_0_")
    assert len(set(new)) == 4  # a.b and a:b read alike but stay two ids
    assert all(len(i) <= 40 for i in new)
    assert counts(report) == {"renamed_foreign_ids": 8}
    assert not report.noticeable()  # nobody reads ids: the status line says nothing
    assert rejected_by(out) == {}
    assert repair(copy.deepcopy(messages))[0] == out  # deterministic: the prompt cache stays warm


def test_renaming_foreign_ids_leaves_valid_ids_and_their_messages_alone():
    report = acc.RepairReport()
    messages = [U("q"), A("call_1", "toolu_01-x"), T("call_1"), T("toolu_01-x"), A("x.y"), T("x.y"), AS("ok")]
    out = acc.replace_foreign_tool_call_ids(messages, report)
    assert out[1] is messages[1] and out[2] is messages[2] and out[3] is messages[3]
    assert out[4]["tool_calls"][0]["id"] == out[5]["tool_call_id"] == acc._native_call_id("x.y")
    assert counts(report) == {"renamed_foreign_ids": 2}


def test_foreign_ids_compose_with_shortening_and_uniqueness():
    long_foreign = "functions.read_file:" + "7" * 40  # over 40 characters and foreign
    messages = [
        U("1"),
        A("functions.bash:0"),
        T("functions.bash:0", "r1"),
        AS("a1"),
        U("2"),
        A("functions.bash:0", long_foreign),  # the model numbers its calls anew every turn
        T(long_foreign, "r3"),
        T("functions.bash:0", "r2"),
        AS("a2"),
        U("3"),
    ]
    out, report = repair(messages)
    first, second = out[1]["tool_calls"][0]["id"], [c["id"] for c in out[5]["tool_calls"]]
    assert first == acc._native_call_id("functions.bash:0")
    assert second == [first + "_2", acc._short_call_id(long_foreign)]
    assert [out[6]["tool_call_id"], out[7]["tool_call_id"]] == second
    assert [out[6]["content"], out[7]["content"]] == ["r2", "r3"]
    assert rejected_by(out) == {}


# -- 3. replies that say nothing ----------------------------------------------------------------------------------------

NOTHING = ["", None, [], "   ", "\n\t", [TXT("")], [TXT(" "), TXT("")]]


@pytest.mark.parametrize("content", NOTHING)
def test_a_reply_that_says_nothing_goes(content):
    messages = [S(), U("q"), AS("a1"), U("q2"), {"role": "assistant", "content": content}, U("q3")]
    out, report = repair(messages)
    assert out == [S(), U("q"), AS("a1"), U("q2"), U("q3")]  # two users in a row: every provider takes it
    assert report.dropped_empty_assistants == 1
    assert rejected_by(out) == {}


@pytest.mark.parametrize("content", NOTHING)
def test_an_empty_final_reply_goes_too(content):
    # Anthropic would take "" there as a prefill, but a prefill of nothing asks for nothing, and Moonshot rejects it
    out, _ = repair([U("q"), {"role": "assistant", "content": content}])
    assert out == [U("q")]


def test_a_reply_that_says_nothing_after_tool_results():
    stopped = AS("")  # the reply after the results, stopped before its first token
    # before the next user message it stays, marked: going would make tool -> user (Mistral)
    out, report = repair([U("q"), A("a"), T("a"), stopped, U("why did you stop?")])
    assert out == [U("q"), A("a"), T("a"), MARKED, U("why did you stop?")]
    assert counts(report) == {"marked_interrupted_replies": 1}
    assert rejected_by(out) == {}
    # before a late system message it goes: Mistral rejects that system message after an assistant as after a tool
    messages = [U("q"), A("a"), T("a"), stopped, S("late"), U("next")]
    assert [v.rule for v in check_mistral(messages)] == ["M1"]
    out, _ = repair(messages)
    assert out == [U("q"), A("a"), T("a"), S("late"), U("next")]
    # before the chain's next step, or at the end of a tool loop's request, it just goes
    out, _ = repair([U("q"), A("a"), T("a"), stopped, A("b"), T("b"), AS("done")])
    assert out == [U("q"), A("a"), T("a"), A("b"), T("b"), AS("done")]
    assert repair([U("q"), A("a"), T("a"), stopped])[0] == [U("q"), A("a"), T("a")]
    # several in a row leave one marked reply
    out, report = repair([U("q"), A("a"), T("a"), AS(""), AS(None), U("?")])
    assert out == [U("q"), A("a"), T("a"), MARKED, U("?")]
    assert counts(report) == {"fixed_null_content": 1, "dropped_empty_assistants": 1, "marked_interrupted_replies": 1}


def test_a_tool_turn_whose_calls_all_went_and_said_nothing_makes_no_tool_to_user():
    # the results of the last step were lost: its calls go, and with them the reply, but not into tool -> user
    out, _ = repair([U("q"), A("a"), T("a"), A("b"), U("next")])
    assert out == [U("q"), A("a"), T("a"), MARKED, U("next")]
    assert rejected_by(out) == {}


def test_leaving_out_a_reply_that_said_nothing_is_not_called_a_tool_call_repair():
    # the stopped reply stays in the chat's history: every later turn would say "tool-call history repaired" again
    for messages in (
        [U("q"), AS(""), U("again")],
        [U("q"), A("a"), T("a"), AS(""), U("again")],
        [U("q"), U(" "), U("")],
    ):
        _, report = repair(messages)
        assert report.changed() and not report.noticeable(), report.describe()
    # an errored tool turn is a tool-call repair
    _, report = repair([U("q"), errored("b", content="Checking."), T("b"), U("again")])
    assert report.noticeable()


def test_a_user_message_that_says_nothing_goes_unless_it_is_the_first_or_the_latest():
    messages = [S(), U(""), AS("hi"), U("  "), U([TXT("")]), AS("ok"), U([IMG()]), AS("a cat"), U("")]
    out, report = repair(messages)
    # the first stays (without it an assistant would open the chat: Anthropic A5, Gemini G1), the latest is the
    # request itself; an image says something
    assert out == [S(), U(""), AS("hi"), AS("ok"), U([IMG()]), AS("a cat"), U("")]
    assert counts(report) == {"dropped_empty_users": 2}


def test_system_messages_that_say_nothing_stay():
    # every system message is kept verbatim; gateways to Anthropic and Gemini fold them into one system text
    out, report = repair([S(""), U("q"), S("   "), AS("a"), U("q2")])
    assert out == [S(""), U("q"), S("   "), AS("a"), U("q2")]
    assert not report.changed()


def test_drop_empty_messages_returns_its_input_when_everything_says_something():
    messages = [S(""), U("q"), A("a", content=""), T("a", ""), AS([{"type": "refusal", "refusal": "no"}]), U("q2")]
    assert acc.drop_empty_messages(messages, acc.RepairReport()) == messages
    step = next(s for s in acc._REPAIR_STEPS if s.fix is acc.drop_empty_messages)
    assert step(messages, acc.RepairReport()) is messages


# -- 4. tool names with whitespace around them ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fixed",
    [(" read ", "read"), ("read\n", "read"), ("\tweb search ", "web_search"), ("   ", "tool"), ("a.b ", "a_b")],
)
def test_a_tool_name_is_trimmed_before_it_is_made_valid(name, fixed):
    report = acc.RepairReport()
    messages = [
        U("q"),
        {"role": "assistant", "content": None, "tool_calls": [call("a", name)]},
        T("a"),
        {**AS("ok"), "name": name},
    ]
    out = acc.sanitize_names(messages, report)
    assert out[1]["tool_calls"][0]["function"]["name"] == fixed
    assert out[3]["name"] == fixed
    assert report.renamed_functions == 2


# -- the whole inlet path, as Open WebUI calls it ----------------------------------------------------------------------


def _inlet(messages: list) -> list:
    f = make_filter(counter="estimate")
    body = {"model": "gpt-4o", "messages": copy.deepcopy(messages), "stream": True}
    out = asyncio.run(
        f.inlet(
            body,
            __user__={"id": "u1", "role": "user"},
            __metadata__={"chat_id": "chat-29", "message_id": "m-29", "params": {"function_calling": "native"}},
            __event_emitter__=None,
        )
    )
    return out["messages"]


def test_inlet_a_chat_with_a_reply_stopped_before_its_first_token():
    # Open WebUI passes the stopped reply on as it is stored: content ""
    sent = _inlet([S(), U("Write a poem."), AS(""), U("Please try again.")])
    assert sent == [S(), U("Write a poem."), U("Please try again.")]
    assert rejected_by(sent) == {}


def test_inlet_a_chat_whose_tool_round_was_stopped():
    sent = _inlet([S(), U("q"), A("a"), T("a", "found"), AS(""), U("Go on.")])
    assert sent == [S(), U("q"), A("a"), T("a", "found"), MARKED, U("Go on.")]
    assert rejected_by(sent) == {}


def test_inlet_the_issues_errored_turn():
    sent = _inlet([S(), U("q"), A("a"), T("a"), errored("b", content="let me also check…"), U("and?")])
    assert sent[-2:] == [{**AS("let me also check…"), "stopReason": "error"}, U("and?")]
    assert rejected_by(sent) == {}


def test_inlet_a_chat_switched_from_a_model_that_writes_foreign_ids():
    chat = [
        S(),
        U("List the files."),
        A("functions.bash:0", name=" bash "),
        T("functions.bash:0", "a.txt"),
        AS("There is a.txt."),
        U("And now?"),
    ]
    sent = _inlet(chat)
    again = _inlet(chat + [AS("Still a.txt."), U("Thanks.")])
    new_id = sent[2]["tool_calls"][0]["id"]
    assert new_id == sent[3]["tool_call_id"] and new_id.startswith("functions_bash_0_")
    assert sent[2]["tool_calls"][0]["function"]["name"] == "bash"
    assert again[: len(sent)] == sent  # the next turn sends the same ids
    assert rejected_by(sent) == {}
