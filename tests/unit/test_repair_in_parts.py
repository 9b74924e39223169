"""A chat is repaired in full once, then only in what is new (issue 10).

Chats whose history needs repair on every request (ids reused every round,
unanswered calls) cost a full repair per request. ``repair_in_parts`` cuts a
list where ``repair_cut`` allows and remembers the first part's repair
(``RepairedPart``) for the next request of the chat, which starts with the
same messages. The invariants:

* repairing the parts, each with the ``RepairContext`` the parts before it
  left, gives exactly what repairing the whole list gives, at every cut
  ``repair_cut`` could choose (list and report);
* a remembered part is used only for a list that starts with its messages
  (by value), so a wrong or stale entry costs time, never a wrong list;
* reused tool-call ids are renamed from the turns before only, so the ids of
  older turns never change when new turns arrive;
* ``RepairMemo`` stays within its bounds.
"""

from __future__ import annotations

import asyncio
import copy

from acc_builders import AS, IMG, A, S, T, U
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_paths import any_message, near_valid_chats
from test_properties import chats, clean_chats
from test_unique_ids import chats_with_reused_ids

import async_context_compression as acc

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

all_kinds_of_chats = st.one_of(
    chats(), clean_chats(), chats_with_reused_ids(), near_valid_chats(), st.lists(any_message, max_size=10)
)


def cuts_allowed(messages: list) -> list:
    """Every index ``repair_cut`` may return for some extension of the list:
    a non-errored assistant message with a user message after it."""
    out = []
    for c, m in enumerate(messages):
        if acc._role(m) == "assistant" and not acc._is_errored_assistant(m):
            if any(acc._role(later) == "user" for later in messages[c + 1 :]):
                out.append(c)
    return out


def repaired_in_two_parts(messages: list, cut: int):
    context = acc.RepairContext(user_follows=True)
    first, first_report = acc.repair_transcript(messages[:cut], context)
    context.user_follows = False
    second, second_report = acc.repair_transcript(messages[cut:], context)
    return first + second, acc.merge_reports(first_report, second_report)


@SETTINGS
@given(all_kinds_of_chats, st.data())
def test_two_parts_repair_to_what_the_whole_list_repairs_to(chat, data):
    cuts = cuts_allowed(chat)
    if not cuts:
        return
    cut = data.draw(st.sampled_from(cuts))
    whole, whole_report = acc.repair_transcript(chat)
    parts, parts_report = repaired_in_two_parts(chat, cut)
    assert parts == whole
    assert parts_report == whole_report


def test_a_cut_before_the_latest_user_message_carries_that_one_follows():
    chat = [U(None), AS("a"), U("the request")]  # an empty old user message goes, the request stays
    assert acc.repair_cut(chat) == 1
    assert repaired_in_two_parts(chat, 1) == acc.repair_transcript(chat)
    assert acc.repair_transcript(chat)[0] == [AS("a"), U("the request")]


def test_no_cut_at_an_errored_turn_whose_drop_joins_the_spans_around_it():
    late_result = [U("1"), A("x"), U("meanwhile"), A("y", stopReason="error"), T("x"), U("2")]
    whole, _ = acc.repair_transcript(late_result)
    assert whole[1]["tool_calls"][0]["id"] == "x" and whole[2] == T("x")  # moved back to its call
    assert acc.repair_cut(late_result) == 1  # not 3
    assert repaired_in_two_parts(late_result, 1)[0] == whole
    assert repaired_in_two_parts(late_result, 3)[0] != whole  # why such a cut is not allowed


@SETTINGS
@given(all_kinds_of_chats)
def test_repair_cut_is_an_allowed_cut(chat):
    cut = acc.repair_cut(chat)
    assert cut == 0 or cut in cuts_allowed(chat)
    assert cut == max(cuts_allowed(chat), default=0)


@SETTINGS
@given(all_kinds_of_chats, all_kinds_of_chats)
def test_a_grown_chat_repaired_with_its_last_requests_part_is_repaired_as_a_whole(first, more):
    _, _, part = acc.repair_in_parts(copy.deepcopy(first), None)
    grown = copy.deepcopy(first) + copy.deepcopy(more)  # a new request: new objects, same values
    out, report, _ = acc.repair_in_parts(grown, part)
    whole, whole_report = acc.repair_transcript(copy.deepcopy(grown))
    assert out == whole
    assert report == whole_report


@SETTINGS
@given(all_kinds_of_chats, all_kinds_of_chats)
def test_a_part_of_another_chat_changes_nothing(one, other):
    _, _, part = acc.repair_in_parts(one, None)
    out, report, _ = acc.repair_in_parts(other, part)
    assert (out, report) == acc.repair_transcript(other)


def reused_chat(turns: int) -> list:
    messages = [S()]
    for turn in range(turns):
        messages += [U(f"q{turn}"), A("exec_0", "exec_1"), T("exec_0", f"r{turn}"), T("exec_1"), AS(f"a{turn}")]
    return messages + [U("now")]


def repaired_again(messages: list, part) -> tuple:
    """repair_in_parts, and how many messages it repaired (not reused)."""
    counts = []
    real = acc.repair_transcript

    def counting(messages, context=None):
        counts.append(len(messages))
        return real(messages, context)

    acc.repair_transcript = counting
    try:
        out, report, next_part = acc.repair_in_parts(messages, part)
    finally:
        acc.repair_transcript = real
    return out, report, next_part, sum(counts)


def test_the_next_request_reuses_the_part_and_repairs_only_what_is_new():
    first = reused_chat(30)
    _, _, part = acc.repair_in_parts(first, None)
    assert part is not None and len(part.source) == len(first) - 2  # cut at the last answer
    grown = copy.deepcopy(first)[:-1] + [U("now"), A("exec_0"), T("exec_0", "new"), AS("done"), U("next")]
    out, _, _, repaired = repaired_again(grown, part)
    assert repaired == len(grown) - len(part.source)
    assert out == acc.repair_transcript(grown)[0]


def test_open_webui_editing_the_dicts_it_was_sent_does_not_lose_the_part():
    """Open WebUI appends RAG context and system prompts to the first system
    message, and text to the first user message, in place, after inlet."""
    first = reused_chat(5)
    first[1] = U([{"type": "text", "text": "q0"}])  # a user message of parts
    pristine = copy.deepcopy(first)
    sent, _, part = acc.repair_in_parts(first, None)
    sent[0]["content"] += "\nRAG context"
    sent[1]["content"][0]["text"] = "prepended\n" + sent[1]["content"][0]["text"]
    for message in sent:
        if message.get("role") == "tool":
            message["content"] = "edited"
    out, _, _, repaired = repaired_again(copy.deepcopy(pristine) + [AS("more"), U("next")], part)
    assert repaired == 2 + (len(pristine) - len(part.source))
    assert out == acc.repair_transcript(pristine + [AS("more"), U("next")])[0]


def test_a_system_prompt_whose_text_changes_keeps_the_part_and_is_sent_as_it_is_now():
    first = [S("It is 10:00.")] + reused_chat(5)[1:]
    _, _, part = acc.repair_in_parts(first, None)
    now = [S("It is 10:01.")] + copy.deepcopy(first[1:])
    out, _, _, repaired = repaired_again(now, part)
    assert repaired == len(now) - len(part.source)
    assert out == acc.repair_transcript(now)[0] and out[0] == S("It is 10:01.")
    named = [{"role": "system", "content": "It is 10:02.", "name": "x"}] + copy.deepcopy(first[1:])
    _, _, _, repaired = repaired_again(named, part)
    assert repaired == len(named)  # not a plain system message: compared as any other


def test_a_repaired_message_edited_after_sending_is_not_reused_edited():
    first = [S(), U([{"type": "text", "text": "q"}, "bare"])] + reused_chat(3)[2:]  # a part to repair
    pristine = copy.deepcopy(first)
    sent, _, part = acc.repair_in_parts(first, None)
    assert sent[1]["content"][1] == {"type": "text", "text": "bare"}
    sent[1]["content"][1]["text"] = "edited after sending"
    again, _, _, _ = repaired_again(copy.deepcopy(pristine), part)
    assert again == acc.repair_transcript(pristine)[0]


def test_the_list_sent_holds_this_requests_messages_and_never_the_dicts_sent_before():
    first = reused_chat(3)
    pristine = copy.deepcopy(first)
    out_first, _, part = acc.repair_in_parts(first, None)
    again = copy.deepcopy(pristine)
    out, _, _ = acc.repair_in_parts(again, part)
    ids_now = {id(m) for m in again}
    for message in out:
        assert id(message) in ids_now or all(message is not m for m in out_first + part.repaired)
    # Open WebUI changing the dicts it was sent does not reach the next request
    for message in out_first + out:
        message["content"] = "changed after sending"
    out_next, _, _ = acc.repair_in_parts(copy.deepcopy(pristine), part)
    assert out_next == acc.repair_transcript(pristine)[0]


def test_a_changed_old_message_means_the_part_is_not_used():
    first = reused_chat(5)
    _, _, part = acc.repair_in_parts(first, None)
    edited = copy.deepcopy(first)
    edited[7]["tool_calls"][0]["id"] = "exec_9"  # an old turn edited (or another chat under the key)
    edited[8]["tool_call_id"] = "exec_9"
    out, report, _ = acc.repair_in_parts(edited, part)
    assert (out, report) == acc.repair_transcript(edited)
    assert out[7]["tool_calls"][0]["id"] == "exec_9" and out[8]["tool_call_id"] == "exec_9"


@SETTINGS
@given(chats_with_reused_ids(), chats_with_reused_ids())
def test_the_ids_of_older_turns_never_change_when_turns_are_added(first, more):
    """Prompt caches and the provider's view of the history stay stable; and
    it is what lets a list be repaired in parts."""
    old, _ = acc.repair_transcript(first)
    grown, _ = acc.repair_transcript(first + more)
    assert old == grown[: len(old)] or _latest_user_differs(first)


def _latest_user_differs(messages: list) -> bool:
    # fix_null_content keeps only the latest user message without content; these chats have none
    return any(m.get("role") == "user" and m.get("content") is None for m in messages)


def test_an_id_a_later_turn_brings_does_not_rename_an_earlier_turn():
    first = [U("1"), A("x"), T("x"), AS(), U("2"), A("x"), T("x"), AS(), U("3")]
    grown = first + [A("x_2"), T("x_2"), AS(), U("4")]  # the provider itself sends x_2 now
    old, _ = acc.repair_transcript(first)
    new, _ = acc.repair_transcript(grown)
    assert [c["id"] for m in old if m.get("tool_calls") for c in m["tool_calls"]] == ["x", "x_2"]
    assert new[: len(old)] == old
    assert [c["id"] for m in new if m.get("tool_calls") for c in m["tool_calls"]] == ["x", "x_2", "x_2_2"]
    assert [m["tool_call_id"] for m in new if m["role"] == "tool"] == ["x", "x_2", "x_2_2"]


def test_the_memo_stays_within_its_bounds():
    memo = acc.RepairMemo(size=3, max_messages=100)
    for n in range(10):
        _, _, part = acc.repair_in_parts(reused_chat(4), None)  # 22 messages, part of 20
        memo.keep(f"chat{n}", part)
        assert len(memo) <= 3 and memo._messages <= 100
    assert memo.get("chat9") is not None and memo.get("chat0") is None
    _, _, big = acc.repair_in_parts(reused_chat(30), None)
    memo.keep("big", big)  # more messages than the whole memo may hold: not kept
    assert memo.get("big") is None and memo._messages == sum(len(p.source) for p in memo._parts.values())


def test_the_memo_is_bounded_in_the_text_it_keeps_alive_images_included():
    memo = acc.RepairMemo(size=10, max_messages=10_000, max_chars=50_000)
    for n in range(6):
        chat = reused_chat(2)
        chat[1] = U([{"type": "text", "text": "look"}, IMG("data:image/png;base64," + "A" * 20_000)])
        _, _, part = acc.repair_in_parts(chat, None)
        assert part.chars > 20_000
        memo.keep(f"chat{n}", part)
        assert memo._chars <= 50_000
    assert len(memo) == 2 and memo.get("chat5") is not None
    document = reused_chat(2)
    document[1] = U("x" * 60_000)
    memo.keep("document", acc.repair_in_parts(document, None)[2])
    assert memo.get("document") is None and memo._chars == sum(p.chars for p in memo._parts.values())


def test_token_cache_entries_are_remembered_by_position_for_the_next_request():
    counter = acc.TokenCounter()
    first = reused_chat(3)
    sent, _, part = acc.repair_in_parts(first, None)
    entries = part.entries_of("cl100k_base")
    assert entries == []
    counter.cached_sizes(sent, "cl100k_base", entries)
    assert len(entries) == len(sent) and all(e is not None for e in entries)
    part.note_entries("cl100k_base", entries)
    grown = copy.deepcopy(first) + [AS("more"), U("next")]
    sent_next, _, part_next = acc.repair_in_parts(grown, part)
    known = part_next.entries_of("cl100k_base")
    assert known[0] is None  # the system prompt: its text may change between requests, counted again
    assert known[1 : len(part)] == entries[1 : len(part)]
    assert known[len(part) :] == [None] * (len(part_next) - len(part))
    assert part_next.entries_of("o200k_base") == []
    # the entries known by position are what the cache gives for those very messages
    fresh: list = []
    counter.cached_sizes(sent_next, "cl100k_base", fresh)
    assert all(a is b for a, b in zip(known[1 : len(part)], fresh[1:]))


def test_known_entries_spare_the_cache_key_and_give_the_same_sizes():
    counter = acc.TokenCounter()
    chat = reused_chat(4)
    entries: list = []
    sizes, _ = counter.cached_sizes(chat, "cl100k_base", entries)
    keys = []
    real = acc._cache_key
    acc._cache_key = lambda m, e: keys.append(m) or real(m, e)
    try:
        again, _ = counter.cached_sizes(chat + [U("new")], "cl100k_base", list(entries))
    finally:
        acc._cache_key = real
    assert again[: len(sizes)] == sizes and keys == [U("new")]


def test_inlet_with_the_memo_sends_what_a_fresh_filter_sends_turn_after_turn():
    async def run():
        remembering = acc.Filter()
        chat = reused_chat(2)
        for turn in range(6):
            body = {"model": "gpt-4o", "messages": copy.deepcopy(chat)}
            sent = await remembering.inlet(copy.deepcopy(body), {"id": "u"}, {"chat_id": "c"})
            fresh = await acc.Filter().inlet(copy.deepcopy(body), {"id": "u"}, {"chat_id": "c"})
            assert sent["messages"] == fresh["messages"]
            chat = chat + [A("exec_0", "exec_1"), T("exec_0", f"t{turn}"), AS(f"x{turn}"), U(f"u{turn}")]
        assert len(remembering.repairs) == 1

    asyncio.run(run())


def test_api_conversations_without_a_chat_id_each_keep_their_own_part():
    async def run():
        f = acc.Filter()
        one, other = reused_chat(3), [S(), U("other")] + reused_chat(3)[2:]
        for chat in (one, other, one + [AS("x"), U("y")], other + [AS("x"), U("y")]):
            body = {"model": "gpt-4o", "messages": copy.deepcopy(chat)}
            sent = await f.inlet(body, {"id": "agent"}, {})
            assert sent["messages"] == acc.repair_transcript(chat)[0]
        assert len(f.repairs) == 2  # one per conversation, not one slot per user

    asyncio.run(run())


def test_a_malformed_opening_falls_back_to_the_users_slot():
    assert acc.opening_anchor([{"role": "assistant", "tool_calls": ["junk"]}, U()]) == ""
    assert acc.opening_anchor([U("a"), AS("b"), U("c")]) != acc.opening_anchor([U("x"), AS("b"), U("c")])


def test_two_api_conversations_of_one_user_keep_separate_state():
    async def run():
        f = acc.Filter()
        one = [S("short"), U("one"), AS("a"), U("b")]
        other = [S("a much longer system prompt " * 40), U("other"), AS("a"), U("b")]
        for chat in (one, other):
            await f.inlet({"model": "gpt-4o", "messages": copy.deepcopy(chat)}, {"id": "agent"}, {})
        states = list(f.summaries.chats.values())
        assert len(states) == 2 and states[0].overhead < states[1].overhead
        states[1].last_fault = acc.Fault.STORE_DOWN  # as a failed summary of the other conversation leaves it
        lines = []

        async def emitter(event):
            lines.append(event["data"]["description"])

        for chat in (one, other):
            await f.request({"model": "gpt-4o", "messages": copy.deepcopy(chat)}, {"id": "agent"}, {}, emitter)
        assert ["unavailable" in line for line in lines] == [False, True]

    asyncio.run(run())
