"""Transcript repair (issue 2): each step on its own, the whole pipeline with
its RepairReport, the adversarial transcripts of provider-rules.md and the
openclaw errored-turn cases."""

from dataclasses import asdict

import pytest
from acc_builders import AS, IMG, TXT, A, S, T, U, call, frozen, last_user, systems

import async_context_compression as acc
from devkit.provider_rules import check_anthropic, check_gemini, check_mistral, check_openai, violations_added

LONG_A = "toolu_" + "a" * 60
LONG_B = "toolu_" + "a" * 59 + "b"  # same first 40 characters as LONG_A


def counts(report: acc.RepairReport) -> dict:
    """Only the counters that are not zero."""
    return {k: v for k, v in asdict(report).items() if v}


def repair(messages):
    """repair_transcript, checking on the way that the input is not mutated."""
    before = frozen(messages)
    out, report = acc.repair_transcript(messages)
    assert messages == before, "repair mutated its input"
    assert out is not messages
    return out, report


def assert_valid(before, after):
    assert check_openai(after) == []
    assert violations_added(before, after) == []


# -- RepairReport ----------------------------------------------------------------


def test_a_report_is_unchanged_until_a_count_is_set_and_describes_its_counts():
    report = acc.RepairReport()
    assert not report.changed()
    assert report.describe() == "nothing to repair"
    report.dropped_orphan_results = 2
    report.shortened_ids = 1
    assert report.changed()
    assert report.describe() == "dropped orphan results=2, shortened ids=1"


# -- drop_malformed_messages ---------------------------------------------------------


def test_entries_that_are_not_messages_with_a_role_are_dropped():
    report = acc.RepairReport()
    good = [S(), U(), AS()]
    messages = [good[0], "text", None, 42, {"content": "no role"}, {"role": None}, {"role": 3}, good[1], [U()], good[2]]
    out = acc.drop_malformed_messages(messages, report)
    assert out == good
    assert all(a is b for a, b in zip(out, good))
    assert counts(report) == {"dropped_malformed": 7}


# -- remove_empty_tool_calls -------------------------------------------------------


def test_empty_and_unusable_tool_calls_are_removed_and_their_turn_kept():
    report = acc.RepairReport()
    messages = [
        {"role": "assistant", "content": "hi", "tool_calls": []},
        {"role": "assistant", "content": "x", "tool_calls": None},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), {"id": ""}, "junk", call("b")]},
        A("c"),
    ]
    before = frozen(messages)
    out = acc.remove_empty_tool_calls(messages, report)
    assert messages == before
    assert out == [
        {"role": "assistant", "content": "hi"},
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        A("c"),
    ]
    assert out[4] is messages[4]
    assert counts(report) == {"removed_empty_tool_calls": 3, "dropped_unanswered_calls": 2}


# -- drop_errored_tool_turns -----------------------------------------------------


@pytest.mark.parametrize(
    "marker",
    [
        {"stopReason": "error"},
        {"stopReason": "aborted"},
        {"stop_reason": "error"},
        {"finish_reason": "aborted"},
        {"finish_reason": "ERROR"},
        {"error": {"message": "stream interrupted"}},
        {"error": "boom"},
    ],
)
def test_every_error_marker_drops_its_tool_calls_and_their_results(marker):
    report = acc.RepairReport()
    messages = [U("q"), A("e1", "e2", **marker), T("e1"), U("typed meanwhile"), T("e2"), AS("later"), U("next")]
    out = acc.drop_errored_tool_turns(messages, report)
    # the text-less turn stays as an empty reply: drop_empty_messages decides where it may go
    assert out == [U("q"), {"role": "assistant", "content": "", **marker}, U("typed meanwhile"), AS("later"), U("next")]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 2}


@pytest.mark.parametrize(
    "marker",
    [{"stopReason": "stop"}, {"finish_reason": "tool_calls"}, {"error": None}, {"error": ""}, {"stop_reason": 1}],
)
def test_drop_errored_tool_turns_keeps_healthy_turns(marker):
    report = acc.RepairReport()
    messages = [U(), A("a", **marker), T("a"), AS()]
    assert acc.drop_errored_tool_turns(messages, report) == messages
    assert not report.changed()


def test_drop_errored_keeps_errored_assistant_without_tool_calls():
    report = acc.RepairReport()
    messages = [U(), {"role": "assistant", "content": "partial answer", "stopReason": "error"}, U("retry")]
    assert acc.drop_errored_tool_turns(messages, report) == messages
    assert not report.changed()


def test_drop_errored_keeps_results_of_other_ids_in_its_span():
    # a result that does not belong to the errored turn is not its business:
    # pairing deals with it (here: an orphan)
    report = acc.RepairReport()
    messages = [U(), A("e", stopReason="error"), T("e"), T("other"), AS()]
    assert acc.drop_errored_tool_turns(messages, report) == [U(), {**AS(""), "stopReason": "error"}, T("other"), AS()]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 1}


# -- pair_tool_results ---------------------------------------------------------------


def test_pair_moves_displaced_results_back_to_their_call():
    report = acc.RepairReport()
    messages = [U(), A("a", "b"), T("a"), U("meanwhile"), S("late"), T("b"), AS()]
    out = acc.pair_tool_results(messages, report)
    assert out == [U(), A("a", "b"), T("a"), T("b"), U("meanwhile"), S("late"), AS()]
    assert counts(report) == {"moved_results": 1}


def test_pair_orders_results_by_call_order():
    report = acc.RepairReport()
    out = acc.pair_tool_results([U(), A("a", "b"), T("b"), T("a"), AS()], report)
    assert out == [U(), A("a", "b"), T("a"), T("b"), AS()]
    assert not report.changed()


def test_pair_drops_orphans_duplicates_and_unanswered_calls():
    report = acc.RepairReport()
    messages = [T("early"), U(), A("a", "b", "c"), T("a"), T("zzz"), T("a", "retry"), T("c"), AS(), T("late"), U()]
    out = acc.pair_tool_results(messages, report)
    assert out == [U(), A("a", "c"), T("a"), T("c"), AS(), U()]
    assert counts(report) == {
        "dropped_orphan_results": 3,
        "dropped_duplicate_results": 1,
        "dropped_unanswered_calls": 1,
    }


def test_pair_drops_duplicate_calls_in_one_turn():
    report = acc.RepairReport()
    out = acc.pair_tool_results([U(), A("a", "a"), T("a"), AS()], report)
    assert out == [U(), A("a"), T("a"), AS()]
    assert counts(report) == {"dropped_duplicate_calls": 1}


def test_pair_unanswered_calls_keep_the_assistant_text():
    report = acc.RepairReport()
    out = acc.pair_tool_results([U(), A("a", content="Let me check."), U("?")], report)
    assert out == [U(), {"role": "assistant", "content": "Let me check."}, U("?")]
    assert counts(report) == {"dropped_unanswered_calls": 1}


def test_pair_unanswered_calls_without_text_leave_an_empty_reply_for_drop_empty_messages():
    report = acc.RepairReport()
    out = acc.pair_tool_results([U(), A("a", content=None), A("b", content=[TXT("")]), U("?")], report)
    assert out == [U(), AS(""), AS([TXT("")]), U("?")]
    assert counts(report) == {"dropped_unanswered_calls": 2}
    out, report = repair([U(), A("a", content=None), A("b", content=[TXT("")]), U("?")])
    assert out == [U(), U("?")]
    assert counts(report) == {"dropped_unanswered_calls": 2, "dropped_empty_assistants": 2}


def test_pair_result_behind_a_later_assistant_turn_is_dropped_with_its_call():
    report = acc.RepairReport()
    out = acc.pair_tool_results([U(), A("a"), U("hm"), AS("meanwhile"), T("a"), U()], report)
    assert out == [U(), AS(""), U("hm"), AS("meanwhile"), U()]
    assert counts(report) == {"dropped_unanswered_calls": 1, "dropped_orphan_results": 1}


def test_pair_dedupes_per_turn_not_globally():
    """Some providers reuse ``exec_0`` on every turn: each turn's result is
    its own, not a duplicate of the previous turn's."""
    report = acc.RepairReport()
    messages = [
        U("one"),
        A("exec_0"),
        T("exec_0", "r1"),
        AS("a1"),
        U("two"),
        A("exec_0"),
        T("exec_0", "r2"),
        T("exec_0", "r2 again"),
        AS("a2"),
        U("three"),
        A("exec_0", "exec_1"),
        T("exec_1", "r3b"),
        T("exec_0", "r3a"),
        AS("a3"),
    ]
    out = acc.pair_tool_results(messages, report)
    assert out == [
        U("one"),
        A("exec_0"),
        T("exec_0", "r1"),
        AS("a1"),
        U("two"),
        A("exec_0"),
        T("exec_0", "r2"),
        AS("a2"),
        U("three"),
        A("exec_0", "exec_1"),
        T("exec_0", "r3a"),
        T("exec_1", "r3b"),
        AS("a3"),
    ]
    assert counts(report) == {"dropped_duplicate_results": 1}


# -- shorten_long_tool_call_ids ---------------------------------------------------


def test_shorten_long_ids_on_both_sides_deterministically():
    report = acc.RepairReport()
    messages = [U(), A(LONG_A, LONG_B, "short"), T(LONG_B), T(LONG_A), T("short"), AS()]
    out = acc.shorten_long_tool_call_ids(messages, report)
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert ids[2] == "short"
    assert all(len(i) <= 40 for i in ids)
    assert ids[0] != ids[1]  # same 40-char prefix, still distinct
    assert out[2]["tool_call_id"] == ids[1]
    assert out[3]["tool_call_id"] == ids[0]
    assert out[4] is messages[4]
    assert counts(report) == {"shortened_ids": 4}
    again = acc.shorten_long_tool_call_ids(frozen(messages), acc.RepairReport())
    assert again == out
    assert ids[0] == acc._short_call_id(LONG_A)


def test_shorten_leaves_ids_of_exactly_40_characters():
    cid = "c" * 40
    report = acc.RepairReport()
    messages = [U(), A(cid), T(cid)]
    assert acc.shorten_long_tool_call_ids(messages, report) == messages
    assert not report.changed()


# -- sanitize_names -------------------------------------------------------------------


def test_sanitize_function_and_message_names():
    report = acc.RepairReport()
    messages = [
        {"role": "user", "content": "hi", "name": "Ann Lee"},
        {"role": "user", "content": "hi", "name": "ok_name-1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a", "web search!"), call("b", "x" * 80), call("c", ""), call("d", "good_name")],
        },
    ]
    out = acc.sanitize_names(messages, report)
    assert out[0]["name"] == "Ann_Lee"
    assert out[1] is messages[1]
    assert [c["function"]["name"] for c in out[2]["tool_calls"]] == ["web_search_", "x" * 64, "tool", "good_name"]
    assert [c["function"]["arguments"] for c in out[2]["tool_calls"]] == ['{"q": "x"}'] * 4
    assert counts(report) == {"renamed_functions": 4}


def test_a_name_ending_in_a_newline_is_not_valid():
    # "$" in a regex also matches before a final newline; providers' patterns do not
    report = acc.RepairReport()
    messages = [
        {"role": "user", "content": "hi", "name": "ann\n"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", "search\n")]},
        {"role": "tool", "tool_call_id": "a", "content": "found"},
    ]
    out = acc.sanitize_names(messages, report)
    assert out[0]["name"] == "ann"  # trimmed (issue 29), not "ann_"
    assert out[1]["tool_calls"][0]["function"]["name"] == "search"
    assert not check_openai(out)


def test_sanitize_call_without_function_object():
    report = acc.RepairReport()
    out = acc.sanitize_names(
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function"}]}], report
    )
    assert out[0]["tool_calls"] == [{"id": "a", "type": "function", "function": {"name": "tool"}}]
    assert counts(report) == {"renamed_functions": 1}


# -- fix_null_content -----------------------------------------------------------------


def test_fix_null_content_only_where_providers_reject_it():
    report = acc.RepairReport()
    messages = [
        {"role": "system", "content": None},
        {"role": "user"},
        A("a"),  # content None with tool calls: allowed
        {"role": "tool", "tool_call_id": "a", "content": None},
        {"role": "assistant", "content": None},
    ]
    out = acc.fix_null_content(messages, report)
    assert out == [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        A("a"),
        {"role": "tool", "tool_call_id": "a", "content": ""},
        {"role": "assistant", "content": ""},
    ]
    assert out[2] is messages[2]
    assert counts(report) == {"fixed_null_content": 4}


# -- repair_transcript as a whole ----------------------------------------------------


def test_repair_valid_chat_is_unchanged_and_shares_messages():
    messages = [S(), U(), A("a", "b"), T("a"), T("b"), AS(), S("late"), U([TXT("look"), IMG()]), AS(), U()]
    out, report = repair(messages)
    assert out == messages
    assert all(a is b for a, b in zip(out, messages))
    assert not report.changed()


def test_repair_report_counts_everything_it_did():
    messages = [
        S(),
        "garbage",
        T("orphan"),
        U("q1"),
        A("a", "b", content=None),
        T("b"),
        U("typed meanwhile"),
        T("a"),
        T("a", "retry"),
        AS("a1"),
        U("q2"),
        A("e", stopReason="aborted"),
        T("e"),
        U("q3"),
        {"role": "assistant", "content": "x", "tool_calls": []},
        U("q4"),
        A(LONG_A, name="bad name"),
        T(LONG_A),
        {"role": "assistant", "content": None},
        U("q5"),
    ]
    out, report = repair(messages)
    short = acc._short_call_id(LONG_A)
    assert out == [
        S(),
        U("q1"),
        A("a", "b"),
        T("a"),
        T("b"),
        U("typed meanwhile"),
        AS("a1"),
        U("q2"),
        U("q3"),
        AS("x"),
        U("q4"),
        {"role": "assistant", "content": None, "tool_calls": [call(short, "bad_name")]},
        T(short),
        AS(acc.INTERRUPTED_REPLY),  # the empty reply stays between the result and the user (Mistral: no tool -> user)
        U("q5"),
    ]
    assert counts(report) == {
        "dropped_malformed": 1,
        "removed_empty_tool_calls": 1,
        "dropped_errored_turns": 1,
        "dropped_errored_results": 1,
        "dropped_orphan_results": 1,
        "dropped_duplicate_results": 1,
        "moved_results": 1,
        "shortened_ids": 2,
        "renamed_functions": 1,
        "fixed_null_content": 1,
        "marked_interrupted_replies": 1,
        "dropped_empty_assistants": 1,  # the errored turn, which said nothing
    }
    assert_valid(messages, out)


def test_repair_of_non_list_and_empty_inputs():
    assert acc.repair_transcript(None)[0] == []
    assert acc.repair_transcript({"role": "user"})[0] == []
    out, report = acc.repair_transcript([])
    assert out == [] and not report.changed()


def test_repair_is_idempotent_on_a_messy_chat():
    messages = [T("x"), U(), A("a", "b"), T("b"), S("late"), T("a"), T("a"), U(), A(LONG_A, "exec_0"), T(LONG_A), U()]
    once, _ = repair(messages)
    twice, report = repair(once)
    assert twice == once
    assert not report.changed()


# -- the adversarial transcripts of shared/spec/provider-rules.md ------------------------

ADVERSARIAL = {
    # 1. cut right after assistant(tool_calls), results dropped
    "1-cut-after-calls": (
        [S(), U("q"), A("a"), U("next")],
        [S(), U("q"), U("next")],
        {"dropped_unanswered_calls": 1, "dropped_empty_assistants": 1},
    ),
    "1-cut-after-calls-with-text": (
        [S(), U("q"), A("a", content="Checking."), U("next")],
        [S(), U("q"), AS("Checking."), U("next")],
        {"dropped_unanswered_calls": 1},
    ),
    "1-cut-at-end-of-list": (
        [S(), U("q"), A("a", "b")],
        [S(), U("q")],
        {"dropped_unanswered_calls": 2, "dropped_empty_assistants": 1},
    ),
    # 2. cut before the assistant: first kept message is a tool
    "2-leading-tool": (
        [S(), T("a"), T("b"), AS("done"), U("q")],
        [S(), AS("done"), U("q")],
        {"dropped_orphan_results": 2},
    ),
    # 3. parallel calls a, b with only a's result kept
    "3-partial-parallel": (
        [U("q"), A("a", "b"), T("a"), AS("r"), U("q2")],
        [U("q"), A("a"), T("a"), AS("r"), U("q2")],
        {"dropped_unanswered_calls": 1},
    ),
    # 4. [asst(a,b), tool a, user, tool b]
    "4-user-between-results": (
        [U("q"), A("a", "b"), T("a"), U("meanwhile"), T("b")],
        [U("q"), A("a", "b"), T("a"), T("b"), U("meanwhile")],
        {"moved_results": 1},
    ),
    # 5. [asst(a), tool a, user]: valid for OpenAI, left alone
    "5-tool-then-user": (
        [U("q"), A("a"), T("a"), U("q2")],
        [U("q"), A("a"), T("a"), U("q2")],
        {},
    ),
    # 6. the same result twice (retry)
    "6-duplicate-result": (
        [U("q"), A("a"), T("a", "first"), T("a", "retry"), AS("r")],
        [U("q"), A("a"), T("a", "first"), AS("r")],
        {"dropped_duplicate_results": 1},
    ),
    # 7. one id reused by two different assistant turns
    "7-id-reused-across-turns": (
        [U("1"), A("exec_0"), T("exec_0", "r1"), AS("a1"), U("2"), A("exec_0"), T("exec_0", "r2"), AS("a2")],
        [U("1"), A("exec_0"), T("exec_0", "r1"), AS("a1"), U("2"), A("exec_0_2"), T("exec_0_2", "r2"), AS("a2")],
        {"renamed_reused_ids": 1},
    ),
    # 8. ids over 40 characters
    "8-long-ids": (
        [U("q"), A(LONG_A), T(LONG_A), AS("r")],
        [U("q"), A(acc._short_call_id(LONG_A)), T(acc._short_call_id(LONG_A)), AS("r")],
        {"shortened_ids": 2},
    ),
    # 9. an assistant turn that ended in error/abort still holding calls and results
    "9-errored-turn": (
        [U("q"), A("a", stopReason="error"), T("a"), U("retry please"), A("b"), T("b"), AS("ok")],
        [U("q"), U("retry please"), A("b"), T("b"), AS("ok")],
        {"dropped_errored_turns": 1, "dropped_errored_results": 1, "dropped_empty_assistants": 1},
    ),
    # 10. a summary inserted between a call and its result
    "10-summary-between-call-and-result": (
        [S(), U("q"), A("a"), acc.build_summary_message("earlier"), T("a"), AS("r"), U("q2")],
        [S(), U("q"), A("a"), T("a"), acc.build_summary_message("earlier"), AS("r"), U("q2")],
        {"moved_results": 1},
    ),
    # 11. tool_calls: [] and content: null without calls
    "11-empty-calls-and-null-content": (
        [S(), U("q"), {"role": "assistant", "content": None, "tool_calls": []}, U("q2"), AS(None), U("q3")],
        [S(), U("q"), U("q2"), U("q3")],
        {"removed_empty_tool_calls": 1, "fixed_null_content": 2, "dropped_empty_assistants": 2},
    ),
    "11-null-content-of-system-and-tool": (
        [{"role": "system", "content": None}, U("q"), A("a"), T("a", None), AS("r")],
        [S(""), U("q"), A("a"), T("a", ""), AS("r")],
        {"fixed_null_content": 2},
    ),
    # 12. truncated JSON in arguments: nothing invented, nothing dropped
    "12-truncated-arguments": (
        [U("q"), A("a", arguments='{"q": "unfinish'), T("a"), AS("r")],
        [U("q"), A("a", arguments='{"q": "unfinish'), T("a"), AS("r")],
        {},
    ),
    # 13. system messages injected late by other filters
    "13-late-systems": (
        [S(), U("q"), A("a"), T("a"), S("injected"), AS("r"), S("rag"), U("q2")],
        [S(), U("q"), A("a"), T("a"), S("injected"), AS("r"), S("rag"), U("q2")],
        {},
    ),
    # 14. image parts and multimodal content lists
    "14-images": (
        [U([TXT("what is this"), IMG()]), AS("a cat"), U([IMG("https://x/y.png")])],
        [U([TXT("what is this"), IMG()]), AS("a cat"), U([IMG("https://x/y.png")])],
        {},
    ),
    # 15. a single message larger than the whole budget: repair leaves it (fit's job)
    "15-huge-message": (
        [S(), U("x" * 200_000)],
        [S(), U("x" * 200_000)],
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_each_hostile_transcript_is_repaired_to_its_expected_valid_and_final_list(name):
    messages, expected, expected_counts = ADVERSARIAL[name]
    out, report = repair(messages)
    assert out == expected
    assert counts(report) == expected_counts
    if all(isinstance(m["content"], str) for m in systems(messages)):
        assert systems(out) == systems(messages)
    assert last_user(out) == last_user(messages)
    assert_valid(messages, out)
    again, second = acc.repair_transcript(out)
    assert again == out and not second.changed()


def test_null_user_content_creates_no_anthropic_violation():
    messages = [S(), U("q"), AS("r"), U(None), AS("r2"), U("q3")]
    out, _ = repair(messages)
    assert check_openai(out) == []
    assert violations_added(messages, out) == []


def test_repair_never_makes_a_list_mistral_accepts_one_it_rejects():
    """[asst(a), tool a, user] is rejected by Mistral; repairing a Mistral-
    valid list never produces it."""
    messages = [S(), U("q"), A("a"), T("a"), AS("r"), U("q2")]
    assert check_mistral(messages) == []
    out, _ = repair(messages)
    assert check_mistral(out) == []


# -- the openclaw seed -----------------------------------------------------------------


def test_an_errored_tool_turn_is_dropped_and_a_user_message_inside_its_span_kept():
    messages = [
        U("run the build"),
        A("call_1", "call_2", stopReason="aborted"),
        T("call_1", "partial"),
        U("stop, do X instead"),
        T("call_2", "cancelled"),
        A("call_3"),
        T("call_3", "did X"),
        AS("Done X."),
        U("thanks"),
    ]
    out, report = repair(messages)
    assert out == [
        U("run the build"),
        U("stop, do X instead"),
        A("call_3"),
        T("call_3", "did X"),
        AS("Done X."),
        U("thanks"),
    ]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 2, "dropped_empty_assistants": 1}
    assert check_openai(out) == []
    assert check_anthropic(out) == []
    assert check_gemini(out) == []


def test_an_errored_assistant_reply_without_tool_calls_is_kept_as_it_is():
    errored = {"role": "assistant", "content": "I was cut off", "stopReason": "error", "errorMessage": "overloaded"}
    messages = [U("q"), errored, U("go on")]
    out, report = repair(messages)
    assert out == messages
    assert out[1] is errored
    assert not report.changed()


def test_a_second_result_of_a_dropped_errored_call_in_its_span_is_dropped_too():
    messages = [U("q"), A("x", stop_reason="error"), T("x", "r"), U("meanwhile"), T("x", "r again"), AS("ok"), U("q2")]
    out, report = repair(messages)
    assert out == [U("q"), U("meanwhile"), AS("ok"), U("q2")]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 2, "dropped_empty_assistants": 1}
    assert_valid(messages, out)


def test_a_result_of_a_dropped_errored_call_after_a_later_turn_is_dropped_too():
    messages = [U("q"), A("x", stopReason="error"), T("x", "r"), U("q2"), AS("a2"), T("x", "r again"), U("q3")]
    out, report = repair(messages)
    assert out == [U("q"), U("q2"), AS("a2"), U("q3")]
    assert counts(report) == {
        "dropped_errored_turns": 1,
        "dropped_errored_results": 1,
        "dropped_orphan_results": 1,
        "dropped_empty_assistants": 1,
    }
    assert check_openai(out) == []


def test_a_result_of_a_dropped_errored_call_inside_a_healthy_turn_is_dropped_too():
    messages = [
        U("q"),
        A("x", finish_reason="error"),
        T("x", "r"),
        U("q2"),
        A("y"),
        T("y", "ry"),
        T("x", "r again"),
        AS("a2"),
        U("q3"),
    ]
    out, report = repair(messages)
    assert out == [U("q"), U("q2"), A("y"), T("y", "ry"), AS("a2"), U("q3")]
    assert counts(report) == {
        "dropped_errored_turns": 1,
        "dropped_errored_results": 1,
        "dropped_orphan_results": 1,
        "dropped_empty_assistants": 1,
    }
    assert_valid(messages, out)


def test_a_healthy_turn_reusing_an_errored_turns_id_keeps_its_own_result():
    """The healthy turn owns its own result even with the errored turn's id."""
    messages = [
        U("q"),
        A("exec_0", stopReason="error"),
        T("exec_0", "bad"),
        U("q2"),
        A("exec_0"),
        T("exec_0", "good"),
        AS("a2"),
    ]
    out, report = repair(messages)
    assert out == [U("q"), U("q2"), A("exec_0"), T("exec_0", "good"), AS("a2")]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 1, "dropped_empty_assistants": 1}


def test_an_errored_middle_step_of_a_chain_goes_and_the_steps_around_it_stay():
    messages = [U("q"), A("a"), T("a"), A("b", stopReason="error"), T("b"), A("c"), T("c"), AS("done")]
    out, report = repair(messages)
    assert out == [U("q"), A("a"), T("a"), A("c"), T("c"), AS("done")]
    assert counts(report) == {"dropped_errored_turns": 1, "dropped_errored_results": 1, "dropped_empty_assistants": 1}
    assert_valid(messages, out)


# -- inputs are never mutated ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_every_step_leaves_its_input_alone(name):
    messages = frozen(ADVERSARIAL[name][0])
    for step in acc._REPAIR_STEPS:
        before = frozen(messages)
        step(messages, acc.RepairReport())
        assert messages == before, step.fix.__name__
