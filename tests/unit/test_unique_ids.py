"""Tool-call ids are unique across the turns of one request (issue 10).

Some providers reuse ids every round (``exec_0``; Kimi through vLLM or
OpenRouter). Pairing already works per turn; repair also renames a reused id,
on the call and on its results alike, so a gateway converting to Anthropic's
format (which rejects a ``tool_use`` id used twice, rule A4) accepts the list.
"""

from __future__ import annotations

from acc_builders import AS, A, S, T, U
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_context_compression as acc
from devkit.provider_rules import CHECKERS, check_anthropic

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def call_ids(messages: list) -> list:
    return [c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]


def all_violations(messages: list) -> dict:
    return {name: check(messages) for name, check in CHECKERS.items() if check(messages)}


def test_a_reused_id_is_renamed_on_the_call_and_its_results_and_the_first_use_keeps_it():
    messages = [
        U("1"),
        A("exec_0", "exec_1"),
        T("exec_0", "r1"),
        T("exec_1", "r1b"),
        AS("a1"),
        U("2"),
        A("exec_0", "exec_1"),
        T("exec_0", "r2"),
        T("exec_1", "r2b"),
        AS("a2"),
        U("3"),
        A("exec_0"),
        T("exec_0", "r3"),
        AS("a3"),
        U("4"),
    ]
    out, report = acc.repair_transcript(messages)
    assert call_ids(out) == ["exec_0", "exec_1", "exec_0_2", "exec_1_2", "exec_0_3"]
    assert [m["tool_call_id"] for m in out if m["role"] == "tool"] == call_ids(out)
    assert [m["content"] for m in out if m["role"] == "tool"] == ["r1", "r1b", "r2", "r2b", "r3"]
    assert report.renamed_reused_ids == 3
    assert check_anthropic(messages) and not all_violations(out)


def test_renaming_is_deterministic_so_every_request_of_the_chat_sends_the_same_ids():
    messages = [U("1"), A("exec_0"), T("exec_0"), AS("a1"), U("2"), A("exec_0"), T("exec_0"), AS("a2"), U("3")]
    first, _ = acc.repair_transcript(messages)
    grown, _ = acc.repair_transcript(messages + [A("exec_0"), T("exec_0"), AS("a3"), U("4")])
    assert first == acc.repair_transcript([dict(m) for m in messages])[0]
    assert grown[: len(first)] == first


def test_a_renamed_id_never_takes_an_id_the_request_already_uses():
    messages = [U("1"), A("x"), T("x"), AS(), U("2"), A("x_2"), T("x_2"), AS(), U("3"), A("x"), T("x"), AS(), U("4")]
    out, _ = acc.repair_transcript(messages)
    ids = call_ids(out)
    assert len(set(ids)) == len(ids) == 3
    assert ids[:2] == ["x", "x_2"] and ids[2] not in ("x", "x_2")


def test_a_renamed_id_stays_within_40_characters():
    long_id = "c" * 40
    messages = [U("1"), A(long_id), T(long_id), AS(), U("2"), A(long_id), T(long_id), AS(), U("3")]
    out, _ = acc.repair_transcript(messages)
    ids = call_ids(out)
    assert ids[0] == long_id and len(ids[1]) == 40 and ids[1] != long_id
    assert not all_violations(out)


def test_unique_ids_are_left_alone():
    messages = [S(), U("1"), A("a"), T("a"), AS(), U("2"), A("b"), T("b"), AS(), U("3")]
    out, report = acc.repair_transcript(messages)
    assert all(x is y for x, y in zip(out, messages)) and len(out) == len(messages)
    assert not report.changed()


# -- property: chats every provider would accept but for their reused ids -----------

REUSED = ["exec_0", "exec_1", "exec_0_2", "call_1", "c" * 40, "c" * 38 + "_2", "toolu_" + "x" * 50]


@st.composite
def chats_with_reused_ids(draw) -> list:
    """Valid for every provider except for ids that several turns share (A4),
    with chains of several steps, parallel calls and a tool loop in progress."""
    messages = [S("system")] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 6))):
        messages.append(U(f"question {turn}"))
        for _step in range(draw(st.integers(0, 2))):
            ids = draw(st.lists(st.sampled_from(REUSED), min_size=1, max_size=3, unique=True))
            messages.append(A(*ids, content=draw(st.sampled_from([None, "let me look"]))))
            messages.extend(T(cid, f"result of {cid} in turn {turn}") for cid in draw(st.permutations(ids)))
        messages.append(AS(f"answer {turn}"))
    messages.append(U("the new question"))
    if draw(st.booleans()):
        ids = draw(st.lists(st.sampled_from(REUSED), min_size=1, max_size=2, unique=True))
        messages.append(A(*ids))
        messages.extend(T(cid, f"result of {cid} now") for cid in ids)
    return messages


@SETTINGS
@given(chats_with_reused_ids())
def test_repaired_chats_with_reused_ids_pass_every_providers_rules(chat):
    out, _ = acc.repair_transcript(chat)
    assert all_violations(out) == {}
    ids = call_ids(out)
    assert len(set(ids)) == len(ids)
    assert all(len(cid) <= 40 for cid in ids)


@SETTINGS
@given(chats_with_reused_ids())
def test_each_result_stays_with_its_own_call_after_renaming(chat):
    out, _ = acc.repair_transcript(chat)
    calls_in = [m for m in chat if m.get("tool_calls")]
    calls_out = [i for i, m in enumerate(out) if m.get("tool_calls")]
    assert len(calls_in) == len(calls_out)  # nothing to drop in these chats
    for before, at in zip(calls_in, calls_out):
        ids = [c["id"] for c in out[at]["tool_calls"]]
        results = out[at + 1 : at + 1 + len(ids)]
        assert [r["tool_call_id"] for r in results] == ids
        # each result's text names the id it answered in the input
        answered = [r["content"].split()[2] for r in results]
        assert answered == [c["id"] for c in before["tool_calls"]]


@SETTINGS
@given(chats_with_reused_ids())
def test_renaming_is_final(chat):
    once, _ = acc.repair_transcript(chat)
    twice, report = acc.repair_transcript(once)
    assert twice == once and not report.changed()


@SETTINGS
@given(chats_with_reused_ids(), chats_with_reused_ids())
def test_the_ids_of_older_turns_never_change_when_turns_are_added(first, more):
    """Prompt caches and the provider's view of the history stay stable: a
    turn's ids depend only on the turns before it."""
    old, _ = acc.repair_transcript(first)
    grown, _ = acc.repair_transcript(first + more)
    # fix_null_content keeps only the latest user message without content
    latest_user_empty = any(m.get("role") == "user" and m.get("content") is None for m in first)
    assert old == grown[: len(old)] or latest_user_empty


def test_an_id_a_later_turn_brings_does_not_rename_an_earlier_turn():
    first = [U("1"), A("x"), T("x"), AS(), U("2"), A("x"), T("x"), AS(), U("3")]
    grown = first + [A("x_2"), T("x_2"), AS(), U("4")]  # the provider itself sends x_2 now
    old, _ = acc.repair_transcript(first)
    new, _ = acc.repair_transcript(grown)
    assert call_ids(old) == ["x", "x_2"]
    assert new[: len(old)] == old
    assert call_ids(new) == ["x", "x_2", "x_2_2"]
    assert [m["tool_call_id"] for m in new if m["role"] == "tool"] == ["x", "x_2", "x_2_2"]
