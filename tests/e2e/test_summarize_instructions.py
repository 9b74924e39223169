"""``/summarize <instructions>`` through a real Open WebUI (issue 31), over the
API: the summarizer's request carries the instructions, a later rewrite the
user asks for with a bare ``/summarize`` still carries them (they are read
from the chat's stored messages), and no chat request ever holds a summarize
command or its instructions as a user turn."""

from __future__ import annotations

import json

import pytest
from e2e_support import Conversation, text_of, wait_for

from devkit.openwebui import new_id

pytestmark = pytest.mark.e2e

ASKED = "keep the budget and the dates"
IN_PROMPT = f"<user_instructions>\n{ASKED}\n</user_instructions>"


def say(conv: Conversation, text: str) -> str:
    """One user turn with exactly ``text``, mirrored into the local history; returns the reply's id."""
    parent, user_id = conv.history.current_id, new_id()
    result = conv.client.chat_completion(
        text, model=conv.model, chat_id=conv.chat_id, parent_id=parent, user_message_id=user_id, system=conv.system
    )
    reply = result["response"]["choices"][0]["message"]["content"] or ""
    conv.history.user(text, parent_id=parent, message_id=user_id)
    return conv.history.assistant(reply, parent_id=user_id, message_id=result["assistant_id"])


def asked_summaries(provider, since: int) -> list:
    return [r for r in provider.requests[since:] if r["kind"] == "summary" and r["status"] == 200]


@pytest.mark.versions
def test_instructions_reach_the_summarizer_and_never_the_chat_model(acc, provider):
    conv = Conversation(acc, provider, seed=31)
    conv.add_turns(3, words=60)
    conv.store("summarize with instructions")
    start = len(provider.requests)

    say(conv, f"/summarize {ASKED}")
    first = wait_for(lambda: asked_summaries(provider, start), 60, what="the summary asked for")
    assert IN_PROMPT in text_of(first[-1]["messages"][-1]["content"])

    conv.turn(words=60)  # the command's turn is in the verbatim tail now
    again = len(provider.requests)
    say(conv, "/summarize")  # a bare command: the instructions still hold
    later = wait_for(lambda: asked_summaries(provider, again), 60, what="the second summary asked for")
    assert IN_PROMPT in text_of(later[-1]["messages"][-1]["content"])

    chats = [r for r in provider.requests[start:] if r["kind"] == "chat"]
    assert len(chats) >= 3
    for req in chats:
        assert req["status"] == 200, req.get("error")
        users = [text_of(m.get("content")) for m in req["messages"] if m.get("role") == "user"]
        assert not any(u.lstrip().lower().startswith("/summar") for u in users), users
        assert ASKED not in json.dumps(req["messages"]), "the chat model received the instructions"
