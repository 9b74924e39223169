"""The status line says what the model received: the figures of the list
actually sent (by the request hook, after Open WebUI added tools), what the
summary stands for, what was left out, the faults the request met, and
settings notes on turns 1, 11, 21, ...: the same on every worker."""

from __future__ import annotations

import asyncio

import pytest
from acc_builders import RecordStore, make_filter

import async_context_compression as acc
from devkit.probes import messages_tokens

LONG = "The quarterly figures were compared with the plan in detail. " * 40


def _chat(turns: int) -> list:
    chat = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        chat += [{"role": "user", "content": f"Q{i} {LONG}"}, {"role": "assistant", "content": f"A{i} {LONG}"}]
    return chat + [{"role": "user", "content": "And now?"}]


def _hooks(f: acc.Filter, messages: list, tools=None, language="en", user=None):
    """inlet then request, as Open WebUI 0.11.2+ calls them; returns the
    list the provider would get and the status lines shown."""
    lines: list = []

    async def emit(event):
        lines.append(event["data"]["description"])

    user = user or {"id": "u1"}
    meta = {"chat_id": "c1", "variables": {"{{USER_LANGUAGE}}": language}}

    async def run():
        body = await f.inlet({"model": "gpt-4", "messages": messages}, user, meta, emit, None, None, "c1")
        if tools:
            body = {**body, "tools": tools}
        return await f.request(body, user, meta, emit, None, "c1")

    return asyncio.run(run()), lines


def test_the_line_states_the_tokens_of_the_list_sent_with_its_tools():
    f = make_filter(8000, counter="exact", store=RecordStore(), compression_threshold_tokens=4000)
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": LONG}} for i in range(3)]
    body, lines = _hooks(f, _chat(2), tools=tools)
    assert len(lines) == 1  # the request hook's line only: inlet's would omit the tools
    sent = messages_tokens(f.counter, body["messages"], "cl100k_base") + f.counter.tools_tokens(tools, "cl100k_base")
    assert f.counter.tools_tokens(tools, "cl100k_base") > 1000
    assert lines[0].startswith(f"{acc.format_tokens(sent)} / 8.0k")


def test_messages_left_out_by_inlet_and_request_add_up():
    f = make_filter(2500, counter="exact", store=RecordStore(), compression_threshold_tokens=1250)
    tools = [{"type": "function", "function": {"name": "t", "description": LONG}}]
    body, lines = _hooks(f, _chat(6), tools=tools)
    [line] = lines
    left_out = 13 - (len(body["messages"]) - 1)  # 12 history messages + the question; system aside
    assert acc.status_text("en", "left_out", messages=left_out) in line


def test_a_turn_that_alone_does_not_fit_the_cap_is_said_and_older_turns_left_out_are_not_called_so():
    # issue 37: in a small window the user must learn that the message itself was cut, not only older turns
    f = make_filter(2500, counter="exact", store=RecordStore(), compression_threshold_tokens=1250)
    _, lines = _hooks(f, _chat(6))
    assert acc.status_text("en", "turn_over") not in lines[0]  # older turns went, the question fits
    huge = _chat(1)[:-1] + [{"role": "user", "content": "Read this. " + LONG * 6}]
    _, lines = _hooks(f, huge)
    assert acc.status_text("en", "turn_over") in lines[0], lines


def test_switched_off_for_the_user_shows_no_line_at_all():
    f = make_filter(2500, counter="exact", store=RecordStore(), compression_threshold_tokens=1250)
    valves = f.UserValves(show_status=False)
    _, lines = _hooks(f, _chat(6), user={"id": "u1", "valves": valves})
    assert lines == []


def test_a_store_fault_is_said_on_every_request_that_met_it():
    f = make_filter(2500, counter="exact", store=RecordStore(), compression_threshold_tokens=1250)
    f.summaries.store = RecordStore(error=acc.StoreUnavailable("down", acc.Fault.STORE_DOWN))
    _, first = _hooks(f, _chat(6))
    _, second = _hooks(f, _chat(6))
    down = acc.status_text("en", "summaries_down", reason="r_store_down")
    assert down in first[0] and first == second  # the line is the request's, not this worker's memory
    f.summaries.store = RecordStore()
    _, healed = _hooks(f, _chat(6))
    assert down not in healed[0]


def test_a_store_fault_in_a_background_summary_is_said_by_its_line_when_it_happens():
    down = acc.StoreUnavailable("down", acc.Fault.STORE_DOWN)
    f = make_filter(2500, counter="exact", store=RecordStore(error=down), compression_threshold_tokens=1250)
    lines: list = []

    async def emit(event):
        lines.append(event["data"]["description"])

    async def run():
        body = {"model": "gpt-4", "chat_id": "c1", "messages": _chat(6)[1:]}  # outlet's messages
        await f.outlet(body, {"id": "u1"}, {"chat_id": "c1"}, emit)
        await f.wait_for_background(10)

    asyncio.run(run())
    assert lines and acc.status_text("en", "summaries_down", reason="r_store_down") in lines[-1], lines


def test_the_usage_part_is_hidden_below_the_share_but_trims_are_said():
    f = make_filter(
        2500,
        counter="exact",
        store=RecordStore(),
        compression_threshold_tokens=1250,
        status_usage_threshold=0.99,
        max_summary_tokens=256,
    )
    _, quiet = _hooks(f, _chat(1))
    assert quiet == []  # well under 99 % of the cap, nothing else to say
    _, trimmed = _hooks(f, _chat(6))
    [line] = trimmed
    assert " tokens sent" not in line and "left out to fit" in line
    f.valves.status_usage_threshold = 0.5
    _, shown = _hooks(f, _chat(6))
    assert " / 2.5k tokens sent" in shown[0]


@pytest.mark.parametrize("language", ["en", "zh", "ja", "ko", "fr", "de", "es", "pt", "ru", "it", "pl"])
def test_every_part_is_in_the_users_language(language):
    sent = acc.SentOutcome(
        used=1200, cap=4000, covered=12, left_out=1, over_cap=True, repaired=True, fault=acc.Fault.STORE_DENIED
    )
    line = acc.status_line(language, sent)
    for key, values in [
        ("in_summary", {"messages": 12}),
        ("left_out", {"messages": 1}),
        ("over_cap", {}),
        ("repaired", {}),
    ]:
        assert acc.status_text(language, key, **values) in line
    if language != "en":
        assert acc.status_text("en", "r_store_denied") not in line


def test_failure_reasons_have_their_own_words():
    for fault in acc.Fault:  # every fault the user is told of has its words in every language
        for table in acc.STATUS_TEXTS.values():
            assert not fault.key or fault.key in table
    inlet = acc.SentOutcome(used=7, cap=9, covered=3, left_out=2, turn=11)
    assert acc.SentOutcome(used=5, cap=9, left_out=1, turn=2).after(inlet) == (
        acc.SentOutcome(used=5, cap=9, covered=3, left_out=3, turn=11)  # inlet counted the turns before the summary
    )


def test_a_settings_note_is_said_on_turn_1_and_every_tenth_turn_after_by_every_worker():
    def worker():
        return make_filter(
            2500, counter="exact", store=RecordStore(), compression_threshold_tokens=1250, max_summary_tokens=2048
        )  # corrected: more than half the cap

    one, two = worker(), worker()
    for turns, due in [(0, True), (1, False), (9, False), (10, True), (11, False), (20, True)]:
        _, line = _hooks(one, _chat(turns))  # _chat(n) ends at user turn n + 1
        _, again = _hooks(one, _chat(turns))  # the same turn again on the worker that said it
        _, elsewhere = _hooks(two, _chat(turns))
        assert ("max_summary_tokens" in line[0]) is due, (turns, line)
        assert line == again == elsewhere
    one.valves.max_summary_tokens = 4000  # a different correction, said on the next due turn
    _, changed = _hooks(one, _chat(20))
    assert "max_summary_tokens (4000)" in changed[0]


def test_renamed_ids_alone_are_not_called_a_repair():
    # Some providers reuse ids every round: renaming them is routine and
    # would otherwise put "repaired" under every reply.
    call = {"id": "exec_0", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    chat = [{"role": "system", "content": "s"}]
    for i in range(3):
        chat += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [dict(call)]},
            {"role": "tool", "tool_call_id": "exec_0", "content": f"out {i}"},
            {"role": "assistant", "content": f"done {i}"},
        ]
    chat.append({"role": "user", "content": "next"})
    f = make_filter(8000, counter="exact", store=RecordStore(), compression_threshold_tokens=4000)
    body, lines = _hooks(f, chat)
    ids = [c["id"] for m in body["messages"] for c in m.get("tool_calls") or []]
    assert len(set(ids)) == 3  # made unique
    assert acc.status_text("en", "repaired") not in lines[0]
