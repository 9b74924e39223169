"""Open WebUI with the fake as an OLLAMA connection (OLLAMA_BASE_URLS, its native API).

The Open WebUI of the modules with fake local servers (conftest's ``local_servers``; before issue 45 one of this
module's own), the filter switched off meanwhile: it checks the devkit, not the product.
One chat turn through Open WebUI's API must reach the fake's ``/api/chat`` with the messages sent, and the
model entry Open WebUI keeps (what a filter gets as ``__model__``) must carry the ``ollama`` block that names the
connection by index (``urls``), not ``urlIdx``.
"""

from __future__ import annotations

import pytest
from e2e_support import FILTER_ID, retrying

from devkit.fake_provider import ollama_spec

pytestmark = pytest.mark.e2e

MODEL = "fake-llama:8b"
SPECS = {MODEL: ollama_spec(4096, trained=131072)}  # served by conftest's local_servers' Ollama


@pytest.fixture(scope="module")
def ollama_side(local_servers):
    """(the Ollama fake, an admin's client): conftest's Open WebUI with fake local servers, the filter switched off for
    this module (it checks the devkit and Open WebUI, not the product)."""
    _, client, fakes = local_servers
    retrying(lambda: client.set_function_state(FILTER_ID, active=False))
    yield fakes["ollama"], client
    retrying(lambda: client.set_function_state(FILTER_ID, active=True))


def test_a_chat_turn_reaches_the_fakes_native_api_with_its_messages(ollama_side):
    fake, client = ollama_side
    entry = next(m for m in client.models() if m["id"] == MODEL)
    assert entry["owned_by"] == "ollama" and "urlIdx" not in entry, entry
    assert entry["ollama"]["model"] == MODEL and entry["ollama"]["urls"] == [0], entry["ollama"]
    fake.clear()
    messages = [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "MK-ollama1 What is the capital of France?"},
    ]
    result = client.chat_completion(model=MODEL, messages=messages, stream=True)
    reply = result["response"]["choices"][0]["message"]["content"]
    assert reply.startswith("[fake-chat] 2 messages"), result["response"]
    chats = [r for r in fake.requests if r["kind"] == "chat"]
    assert len(chats) == 1, chats
    sent = chats[0]
    assert sent["api"] == "ollama" and sent["status"] == 200 and sent["stream"] is True, sent
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [(m["role"], m["content"]) for m in messages]
    assert fake.window_events() == {"requests": 1, "cut": 0, "dropped": 0, "rejected": 0}
    # Open WebUI hands on the prompt_eval_count of the last NDJSON line as the reply's usage
    usage = result["response"]["last_chunk"]["usage"]
    assert usage["prompt_eval_count"] == usage["prompt_tokens"] == sent["reported_prompt"] > 0, usage
