"""``/summarize <instructions>`` end to end without Open WebUI (issue 31): the
instructions reach the summarizer's prompt, every later rewrite of the chat's
summary follows them until the user gives others, and the chat model never
receives a summarize command, or its instructions, as a user turn."""

from __future__ import annotations

import json

from test_background_summary import FakeSummarizer, Worker, stored_chat, tiny_turn

import async_context_compression as acc

BUDGET = "keep the budget and the dates"
NAMES = "only the names"


def command(i: int, text: str) -> list:
    return [
        {"id": f"u{i}", "role": "user", "content": text},
        {"id": f"a{i}", "role": "assistant", "content": f"MK-{i:02d}04 Summary on its way."},
    ]


def system_of(w: Worker, call: int) -> str:
    return w.summarizer.calls[call]["messages"][0]["content"]


async def test_instructions_reach_the_summarizer_and_stay_until_replaced(db):
    w = Worker(db, summarizer=FakeSummarizer())
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, f"/summarize {BUDGET}")
    await w.outlet(chat)  # asked for: made below every threshold
    assert len(w.summarizer.calls) == 1
    assert f"<user_instructions>\n{BUDGET}\n</user_instructions>" in system_of(w, 0)

    chat += stored_chat(range(10, 16))  # grown past the threshold: a rewrite nobody asked for
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 2
    assert BUDGET in system_of(w, 1)

    chat += command(20, f"/summarise: {NAMES}") + tiny_turn(21)  # other instructions replace them
    await w.outlet(chat + command(22, "/summarize"))  # ... and a bare command keeps them
    assert len(w.summarizer.calls) == 3
    assert NAMES in system_of(w, 2) and BUDGET not in system_of(w, 2)
    assert len(await w.records(chat)) == 3


async def test_no_instructions_no_user_block(db):
    w = Worker(db, summarizer=FakeSummarizer())
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, "/summarize")
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 1
    assert "user_instructions" not in system_of(w, 0)
    assert system_of(w, 0) == acc.summary_instructions(256)


async def test_the_chat_model_never_receives_a_summarize_command(db):
    w = Worker(db, summarizer=FakeSummarizer())
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, f"/summarize {BUDGET}")
    await w.outlet(chat)
    [record] = await w.records(chat)
    chat += tiny_turn(10)
    # the command's turn is in the verbatim tail now, and the user asks again with other instructions
    sent, view = await w.inlet(chat, new_text=f"/总结 {NAMES}")
    assert any(acc.is_summary_message(m) for m in view), "the stored summary was not applied"
    users = [m["content"] for m in view if m["role"] == "user"]
    assert acc.SUMMARIZE_COMMAND_PAST in users and users[-1] == acc.SUMMARIZE_COMMAND_PROMPT
    assert not any(acc.is_summarize_command(text) for text in users)
    said = json.dumps([m for m in view if m["role"] != "system"], ensure_ascii=False)
    assert BUDGET not in said and NAMES not in said
    assert len(view) == len(sent) - record.covered_count + record.head_count + 1  # the same turns, none dropped
