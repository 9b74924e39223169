"""Issue 29 in a real Open WebUI 0.12.4: a model that enforces Anthropic's, Moonshot's and Mistral's rules as well as
OpenAI's (a gateway to Claude, Kimi or Mistral) gets the next turn of

* a chat holding a reply stopped before its first token (content "", after a plain answer and after a tool round, or
  only whitespace), sent as API clients and temporary chats send it (for saved chats Open WebUI 0.12.4 itself leaves
  out a stored reply with no content and no output; earlier versions do not);
* a chat whose stored tool calls carry ids another model wrote (``functions.bash:0``), switched to this model:

with no 400, with every tool-call id in ``[a-zA-Z0-9_-]``, and the same ids on the next turn. With the filter off the
same turn is rejected, so the checks can fail.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import pytest
from e2e_support import FILTER_ID, STRICT_MODEL, Conversation, provider_errors

from devkit.owui_client import OpenWebUIError
from devkit.provider_rules import CHECKERS

pytestmark = pytest.mark.e2e

ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


@dataclass
class Turn:
    requests: list


def S(text: str = "You are the e2e assistant.") -> dict:
    return {"role": "system", "content": text}


def U(text: str) -> dict:
    return {"role": "user", "content": text}


def AS(text: str) -> dict:
    return {"role": "assistant", "content": text}


def A(cid: str) -> dict:
    call = {"id": cid, "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def T(cid: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": "found it"}


def rejected(turn) -> list:
    """What the provider rejected in the turn's requests, or what any provider's rules object to in them."""
    problems = [f"{r['status']}: {r['error']}" for r in provider_errors(turn.requests)]
    for request in turn.requests:
        for name, check in CHECKERS.items():
            problems += [f"{name} {v.rule}: {v.message}" for v in check(request["messages"])]
    return problems


def sent_ids(turn) -> list:
    messages = turn.requests[0]["messages"]
    return [c["id"] for m in messages for c in m.get("tool_calls") or []] + [
        m["tool_call_id"] for m in messages if m["role"] == "tool"
    ]


def chat_through(acc, provider, messages: list) -> tuple[list, str]:
    """One API call (no chat_id: Open WebUI passes the messages on as they are, as for other clients and temporary
    chats; for saved chats 0.12.4 leaves out a stored reply with no content and no output itself): the provider
    requests it made, and the error Open WebUI answered with ("" for none)."""
    start = len(provider.requests)
    error = ""
    try:
        acc.chat_completion(model=STRICT_MODEL, messages=copy.deepcopy(messages), timeout=120)
    except OpenWebUIError as exc:
        error = str(exc)
    return [r for r in provider.requests[start:] if r["kind"] == "chat"], error


STOPPED = {
    "after-an-answer": [S(), U("Write a poem."), AS("Roses…"), U("Another one."), AS(""), U("Please try again.")],
    "after-a-tool-round": [S(), U("Find it."), A("call_1"), T("call_1"), AS(""), U("Go on.")],
    "whitespace-only": [S(), U("Write a poem."), AS("\n"), U("Please try again.")],
}


@pytest.mark.parametrize("name", sorted(STOPPED))
def test_the_turn_after_a_reply_stopped_before_its_first_token_is_accepted(acc, provider, name):
    requests, error = chat_through(acc, provider, STOPPED[name])
    assert error == "" and requests, error
    assert rejected(Turn(requests)) == []


@pytest.mark.parametrize("name", sorted(STOPPED))
def test_without_the_filter_the_stopped_reply_is_rejected(acc, provider, name):
    acc.set_function_state(FILTER_ID, active=False, is_global=True)
    try:
        with provider.rejections_expected():
            requests, error = chat_through(acc, provider, STOPPED[name])
    finally:
        acc.set_function_state(FILTER_ID, active=True, is_global=True)
    assert "HTTP 400" in error and ("must not be empty" in error or "non-empty" in error or "non-whitespace" in error)


def foreign_id_chat(acc, provider, seed: int) -> Conversation:
    conv = Conversation(acc, provider, seed=seed, model=STRICT_MODEL)
    conv.add_user(words=30)
    mid = conv.add_tools([["bash", "bash"]], final="Both listings are in.")
    for n, item in enumerate(i for i in conv.history.messages[mid]["output"] if i["type"] == "function_call"):
        old, new = item["call_id"], f"functions.bash:{n}"  # what another model wrote
        for other in conv.history.messages[mid]["output"]:
            if other.get("call_id") == old:
                other["call_id"] = new
                other["id"] = new if other["type"] == "function_call" else other["id"]
    conv.add_user(words=30)
    conv.add_assistant(words=10)
    conv.store(title="switched model")
    return conv


def test_a_chat_with_foreign_tool_call_ids_switched_to_a_model_that_enforces_them(acc, provider):
    conv = foreign_id_chat(acc, provider, seed=31)
    first = conv.turn(words=20)
    second = conv.turn(words=20)
    assert rejected(first) == [] and rejected(second) == []
    ids = sent_ids(first)
    assert len(ids) == 4 and all(ID_RE.fullmatch(i) for i in ids), ids
    assert all(i.startswith("functions_bash_") for i in ids), ids
    assert sent_ids(second) == ids  # the next turn sends the same ids: the prompt cache stays warm


def test_without_the_filter_the_foreign_ids_are_rejected(acc, provider):
    conv = foreign_id_chat(acc, provider, seed=32)
    acc.set_function_state(FILTER_ID, active=False, is_global=True)
    try:
        with provider.rejections_expected(), pytest.raises(OpenWebUIError) as raised:
            conv.turn(words=20)
    finally:
        acc.set_function_state(FILTER_ID, active=True, is_global=True)
    assert "HTTP 400" in str(raised.value) and "should match pattern" in str(raised.value)
