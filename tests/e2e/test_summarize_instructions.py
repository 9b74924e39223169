"""``/summarize <instructions>`` through a real Open WebUI (issue 31), over the
API: the summarizer's request carries the instructions, a later rewrite the
user asks for with a bare ``/summarize`` still carries them (they are read
from the chat's stored messages), and no chat request ever holds a summarize
command or its instructions as a user turn. A plain user steers the summary model only where Open WebUI's access
rules let that user use it (issue 35): without a grant the summary is made without the instructions and the status
line says why; with one, they count."""

from __future__ import annotations

import json
import secrets

import pytest
from e2e_support import CHAT_MODEL, SUMMARY_MODEL, Conversation, status_lines, text_of, wait_for

from devkit.openwebui import OpenWebUIClient, OpenWebUIError, new_id

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


LEFT_OUT = "your /summarize instructions were left out: you may not use the summary model"
EVERYONE = {"principal_type": "user", "principal_id": "*", "permission": "read"}


@pytest.fixture
def plain_user(acc, owui_server):
    """(client, id): a plain user (no admin bypass) whom Open WebUI lets use the chat model and not, until a test
    grants it, the summary model; the grants go again afterwards (the session's server is shared)."""
    email, password = f"plain-{secrets.token_hex(3)}@example.com", "Plain-" + secrets.token_urlsafe(9)
    account = acc.post(
        "/api/v1/auths/add", {"name": "Plain User", "email": email, "password": password, "role": "user"}
    )
    client = OpenWebUIClient(owui_server.base_url, timeout=180)
    client.signin(email, password)
    acc.post("/api/v1/models/model/access/update", {"id": CHAT_MODEL, "access_grants": [EVERYONE]})
    yield client, account["id"]
    for model in (CHAT_MODEL, SUMMARY_MODEL):
        try:
            acc.post("/api/v1/models/model/delete", {"id": model})
        except OpenWebUIError:
            pass  # never granted: no entry to delete


def summarize_as(conv: Conversation, provider, text: str) -> dict:
    """The summary request made for the command ``text``."""
    start = len(provider.requests)
    say(conv, text)
    return wait_for(lambda: asked_summaries(provider, start), 60, what=f"the summary asked for by {text!r}")[-1]


def test_a_user_who_may_not_use_the_summary_model_cannot_steer_it(acc, provider, plain_user):
    client, user_id = plain_user
    conv = Conversation(client, provider, seed=35)
    conv.add_turns(3, words=60)
    conv.store("steering a model out of reach")

    made = summarize_as(conv, provider, f"/summarize {ASKED}")
    assert ASKED not in json.dumps(made["messages"]), "instructions of a user without access reached the summarizer"
    wait_for(
        lambda: any(LEFT_OUT in line for line in status_lines(client, conv.chat_id)),
        30,
        what=f"the status line '...{LEFT_OUT}'",
    )

    # the admin grants the summary model to this user: the same command now steers it
    acc.post(
        "/api/v1/models/model/access/update",
        {
            "id": SUMMARY_MODEL,
            "access_grants": [{"principal_type": "user", "principal_id": user_id, "permission": "read"}],
        },
    )
    conv.turn(words=60)
    made = summarize_as(conv, provider, f"/summarize {ASKED}")
    assert IN_PROMPT in text_of(made["messages"][-1]["content"])
