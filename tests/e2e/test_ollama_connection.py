"""Open WebUI with the fake as an OLLAMA connection (OLLAMA_BASE_URLS, its native API), no OpenAI one.

A second Open WebUI, started for this module only, without the filter: it checks the devkit, not the product.
One chat turn through Open WebUI's API must reach the fake's ``/api/chat`` with the messages sent, and the
model entry Open WebUI keeps (what a filter gets as ``__model__``) must carry the ``ollama`` block that names the
connection by index (``urls``), not ``urlIdx``.
"""

from __future__ import annotations

import os

import pytest

from devkit.fake_provider import FakeProvider, ollama_spec
from devkit.openwebui import OpenWebUIClient, OpenWebUIServer, ensure_offline_tiktoken

pytestmark = pytest.mark.e2e

MODEL = "fake-llama:8b"


@pytest.fixture(scope="module")
def ollama_side(owui_python):
    fake = FakeProvider(model_specs={MODEL: ollama_spec(4096, trained=131072)}).start()
    server = OpenWebUIServer(
        python=owui_python,
        provider_url=None,
        ollama_url=fake.root_url,
        tiktoken_cache_dir=ensure_offline_tiktoken(owui_python),
    )
    server.start(timeout=600)
    try:
        client = OpenWebUIClient(server.base_url, timeout=120)
        client.signup("ollama@example.com", "Ollama-Passw0rd!", "Ollama Admin")
        client.wait_for_models([MODEL], timeout=90)
        yield fake, client
    finally:
        server.stop()
        fake.stop()
        if not os.environ.get("ACC_KEEP_E2E_DATA"):
            server.cleanup()


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
