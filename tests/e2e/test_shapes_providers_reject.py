"""Issue 29 in a real Open WebUI 0.12.4: a model that enforces Anthropic's, Moonshot's and Mistral's rules as well as
OpenAI's (a gateway to Claude, Kimi or Mistral) gets the next turn of

* a chat whose last reply was stopped before its first token (Open WebUI stores it with content ""), after a plain
  answer and after a tool round;
* a chat whose stored tool calls carry ids another model wrote (``functions.bash:0``), switched to this model:

with no 400, with every tool-call id in ``[a-zA-Z0-9_-]``, and the same ids on the next turn. With the filter off the
same turn is rejected, so the checks can fail.
"""

from __future__ import annotations

import re

import pytest
from e2e_support import FILTER_ID, STRICT_MODEL, Conversation, provider_errors

from devkit.provider_rules import CHECKERS

pytestmark = pytest.mark.e2e

ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


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


def stopped_chat(acc, provider, seed: int, tool_round: bool) -> Conversation:
    conv = Conversation(acc, provider, seed=seed, model=STRICT_MODEL)
    conv.add_user(words=30)
    if tool_round:
        conv.add_tools([["search"]], final="")  # the answer after the results was stopped: no text at all
    conv.add_assistant(words=10)
    conv.add_user(words=30)
    conv.history.assistant("")  # stopped before its first token
    conv.store(title="stopped reply")
    return conv


@pytest.mark.parametrize("tool_round", [False, True], ids=["after-an-answer", "after-a-tool-round"])
def test_the_turn_after_a_reply_stopped_before_its_first_token_is_accepted(acc, provider, tool_round):
    conv = stopped_chat(acc, provider, seed=29, tool_round=tool_round)
    turn = conv.turn(words=20)
    assert turn.requests, "the chat request never reached the provider"
    assert rejected(turn) == []
    sent = turn.requests[0]["messages"]
    assert not any(m["role"] == "assistant" and m.get("content") == "" and not m.get("tool_calls") for m in sent)


def test_without_the_filter_the_stopped_reply_is_rejected(acc, provider):
    conv = stopped_chat(acc, provider, seed=30, tool_round=False)
    acc.set_function_state(FILTER_ID, active=False, is_global=True)
    try:
        turn = conv.turn(words=20)
    finally:
        acc.set_function_state(FILTER_ID, active=True, is_global=True)
    assert any("must not be empty" in p or "non-empty content" in p for p in rejected(turn)), rejected(turn)


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
        turn = conv.turn(words=20)
    finally:
        acc.set_function_state(FILTER_ID, active=True, is_global=True)
    assert any("should match pattern" in p for p in rejected(turn)), rejected(turn)
