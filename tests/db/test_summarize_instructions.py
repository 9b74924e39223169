"""``/summarize <instructions>`` end to end without Open WebUI (issue 31): the
instructions reach the summarizer's request, every later rewrite of the chat's
summary follows them until the user gives others, and the chat model never
receives a summarize command, or its instructions, as a user turn. Issue 35:
they reach the summarizer as the user's words, never as its system prompt, and
a user who may not use the summary model gets a summary without them."""

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


def request_of(w: Worker, call: int) -> str:
    return w.summarizer.calls[call]["messages"][-1]["content"]


async def test_instructions_reach_the_summarizer_and_stay_until_replaced(db):
    w = Worker(db, summarizer=FakeSummarizer())
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, f"/summarize {BUDGET}")
    await w.outlet(chat)  # asked for: made below every threshold
    assert len(w.summarizer.calls) == 1
    assert request_of(w, 0).endswith(f"<user_instructions>\n{BUDGET}\n</user_instructions>")
    assert BUDGET not in system_of(w, 0)

    chat += stored_chat(range(10, 16))  # grown past the threshold: a rewrite nobody asked for
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 2
    assert request_of(w, 1).endswith(f"<user_instructions>\n{BUDGET}\n</user_instructions>")

    chat += command(20, f"/summarise: {NAMES}") + tiny_turn(21)  # other instructions replace them
    await w.outlet(chat + command(22, "/summarize"))  # ... and a bare command keeps them
    assert len(w.summarizer.calls) == 3
    assert request_of(w, 2).endswith(f"<user_instructions>\n{NAMES}\n</user_instructions>")
    assert len(await w.records(chat)) == 3


async def test_no_instructions_no_user_block(db):
    w = Worker(db, summarizer=FakeSummarizer())
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, "/summarize")
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 1
    assert "user_instructions" not in system_of(w, 0) + request_of(w, 0)
    assert system_of(w, 0) == acc.summary_instructions(256)


async def test_a_user_denied_the_summary_model_gets_a_summary_without_instructions_and_is_told(db):
    """Issue 35: the summary call bypasses Open WebUI's model access check, so instructions would let a user steer a
    model they may not use and read its answer; they are left out, the summary is still written, and the line says
    why."""
    w = Worker(db, summarizer=FakeSummarizer())
    asked = []

    async def denied(ctx, ids):
        asked.append((ctx.user_instructions, list(ids)))
        return "", True

    w.filter.summaries.instructions = denied
    chat = [m for i in range(4) for m in tiny_turn(i)] + command(9, f"/summarize {BUDGET}")
    await w.outlet(chat)
    assert asked and asked[0][0] == BUDGET and "u9" in asked[0][1]
    assert len(w.summarizer.calls) == 1
    assert BUDGET not in json.dumps(w.summarizer.calls[0]["messages"])
    assert "user_instructions" not in system_of(w, 0) + request_of(w, 0)
    assert len(await w.records(chat)) == 1  # the summary itself is written
    done = w.statuses()[-1]
    assert done.startswith(acc.STATUS_TEXTS["en"]["summary_plain"].split("{")[0]) and "summary model" in done


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
    said = json.dumps(view, ensure_ascii=False)  # nor as system text
    assert BUDGET not in said and NAMES not in said
    assert len(view) == len(sent) - record.covered_count + record.head_count + 1  # the same turns, none dropped
