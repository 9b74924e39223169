"""devkit.fake_provider: models with a tokenizer and a window of their own
(vLLM-like rejection, Ollama-like silent cut), over real HTTP."""

import json

import pytest
from test_fake_provider import chat, http, sse_events

from devkit.fake_provider import FakeProvider, ModelSpec, count_tokens, model_tokens, tools_tokens

VLLM = ModelSpec(ratio=1.3, window=2000, on_overflow="reject")
OLLAMA = ModelSpec(ratio=1.3, window=2000, on_overflow="cut", usage="ollama")
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Find things " * 20, "parameters": {}}}]


def U(text):
    return {"role": "user", "content": text}


def words(n):
    return " ".join(f"word{i % 97}" for i in range(n))


@pytest.fixture
def provider():
    p = FakeProvider(model_specs={"vllm-13": VLLM, "ollama-13": OLLAMA, "slim": {"ratio": 0.7}}).start()
    yield p
    p.stop()


def test_spec_models_are_listed_after_the_plain_ones(provider):
    _, body = http("GET", provider.base_url + "/models")
    assert [m["id"] for m in body["data"]] == ["fake-chat", "vllm-13", "ollama-13", "slim", "fake-summary"]


def test_respec_serves_a_modules_own_models_on_a_running_provider(provider):
    provider.respec({"win-8k": {"ratio": 1.3, "window": 8000}}, summary_models=("win-summary",))
    _, body = http("GET", provider.base_url + "/models")
    assert [m["id"] for m in body["data"]][-3:] == ["win-8k", "fake-summary", "win-summary"]
    msgs = [U(words(200))]
    status, body = chat(provider, msgs, model="win-8k")
    assert status == 200 and body["usage"]["prompt_tokens"] == model_tokens(msgs, None, ModelSpec(ratio=1.3))
    assert [r["kind"] for r in provider.requests[-1:]] == ["chat"]
    assert chat(provider, msgs, model="win-summary")[0] == 200
    assert [r["kind"] for r in provider.requests[-1:]] == ["summary"]


def test_model_tokens_scale_the_cl100k_count_with_tools():
    msgs = [U(words(300))]
    base = count_tokens(msgs) + tools_tokens(TOOLS)
    assert tools_tokens(TOOLS) > 20
    assert model_tokens(msgs, TOOLS, ModelSpec(ratio=1.3)) == round(base * 1.3)
    assert model_tokens(msgs, None, ModelSpec(ratio=0.7)) == round(count_tokens(msgs) * 0.7)
    assert model_tokens(msgs, None, ModelSpec(ratio=1.0, per_message=4)) == count_tokens(msgs) + 4


def test_usage_reports_the_models_own_count(provider):
    msgs = [U(words(200))]
    status, body = chat(provider, msgs, model="vllm-13", tools=TOOLS)
    assert status == 200
    own = model_tokens(msgs, TOOLS, VLLM)
    assert body["usage"]["prompt_tokens"] == own != count_tokens(msgs)
    entry = provider.requests[-1]
    assert entry["model_tokens"] == own == entry["reported_prompt"]
    assert entry["over_window"] is False and entry["cut"] is False and entry["window"] == 2000
    _, slim = chat(provider, msgs, model="slim")
    assert slim["usage"]["prompt_tokens"] == round(count_tokens(msgs) * 0.7)


def test_vllm_like_rejects_over_the_window_counting_max_tokens(provider):
    msgs = [U(words(600))]
    own = model_tokens(msgs, None, VLLM)
    assert own < 2000 < own + 900  # fits alone, not with the reply's room
    assert chat(provider, msgs, model="vllm-13")[0] == 200
    status, body = chat(provider, msgs, model="vllm-13", max_tokens=900)
    assert status == 400
    assert body["message"].startswith("This model's maximum context length is 2000 tokens. However, you requested")
    assert f"({own} in the messages, 900 in the completion)" in body["message"]
    entry = provider.requests[-1]
    assert entry["status"] == 400 and entry["over_window"] is True and entry["cut"] is False


def test_ollama_like_cuts_silently_and_reports_what_it_kept(provider):
    msgs = [U(words(2000))]
    own = model_tokens(msgs, None, OLLAMA)
    assert own > 2000
    status, body = chat(provider, msgs, model="ollama-13")
    assert status == 200
    assert body["usage"]["prompt_eval_count"] == 2000 and "prompt_tokens" not in body["usage"]
    entry = provider.requests[-1]
    assert entry["cut"] is True and entry["over_window"] is True and entry["reported_prompt"] == 2000
    # options.num_ctx sets the window, as with Ollama
    status, body = chat(provider, [U(words(100))], model="ollama-13", options={"num_ctx": 64})
    assert status == 200 and body["usage"]["prompt_eval_count"] == 64 and provider.requests[-1]["window"] == 64
    status, body = chat(provider, [U("hi")], model="ollama-13")
    assert provider.requests[-1]["cut"] is False and body["usage"]["prompt_eval_count"] == model_tokens(
        [U("hi")], None, OLLAMA
    )


def test_stream_usage_asked_for_openai_style_always_for_ollama(provider):
    msgs = [U(words(50))]
    _, raw = chat(provider, msgs, model="vllm-13", stream=True)
    assert not any("usage" in json.loads(e) for e in sse_events(raw)[:-1])
    _, raw = chat(provider, msgs, model="vllm-13", stream=True, stream_options={"include_usage": True})
    last = json.loads(sse_events(raw)[-2])
    assert last["usage"]["prompt_tokens"] == model_tokens(msgs, None, VLLM)
    _, raw = chat(provider, msgs, model="ollama-13", stream=True)
    last = json.loads(sse_events(raw)[-2])
    assert last["usage"]["prompt_eval_count"] == model_tokens(msgs, None, OLLAMA)


def test_bad_specs_are_refused():
    with pytest.raises(ValueError):
        ModelSpec(on_overflow="truncate")
    with pytest.raises(ValueError):
        ModelSpec(usage="anthropic")
    with pytest.raises(ValueError):
        ModelSpec(ratio=0)
