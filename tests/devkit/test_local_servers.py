"""devkit.fake_provider as the local servers behind Open WebUI: Ollama (chatPrompt's whole-message drop, its native
API), llama-server (/props, /slots, meta.n_ctx_train, exceed_context_size_error), LM Studio (/api/v0/models)."""

import json

import pytest
from test_fake_provider import chat, http, root

from devkit.fake_provider import FakeProvider, ModelSpec, llamacpp_spec, lmstudio_spec, model_tokens, ollama_spec
from devkit.local_servers import OLLAMA_TOO_LONG, ollama_chat_prompt, tool_block_start

OLLAMA = ollama_spec(1000, trained=8192)
OLLAMA_STRICT = ollama_spec(300, too_long="error")
LLAMA = llamacpp_spec(1000, trained=131072)
LLAMA_OLD = llamacpp_spec(1000, numbers=False)
STUDIO = lmstudio_spec(1000, trained=32768)
WARM = ollama_spec(2048, preloaded=True, in_modelfile=True)


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def S(text):
    return {"role": "system", "content": text}


def CALL(cid):
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": cid, "type": "function", "function": {"name": "search", "arguments": "{}"}}],
    }


def RESULT(cid, text="found"):
    return {"role": "tool", "tool_call_id": cid, "content": text}


def words(n, tag="w"):
    return " ".join(f"{tag}{i % 89}" for i in range(n))


def turns(count, size=60):
    return [m for i in range(count) for m in (U(f"Q{i} " + words(size)), A(f"A{i} " + words(size)))]


def ollama_chat(provider, messages, model="ollama", **extra):
    """(status, [NDJSON objects] or the error body) of Ollama's native /api/chat."""
    status, body = http("POST", root(provider) + "/api/chat", dict(model=model, messages=messages, **extra))
    if status != 200 or isinstance(body, dict):
        return status, body
    return status, [json.loads(line) for line in body.splitlines() if line.strip()]


@pytest.fixture
def provider():
    specs = {"ollama": OLLAMA, "ollama-strict": OLLAMA_STRICT, "warm": WARM, "llama": LLAMA, "llama-old": LLAMA_OLD}
    p = FakeProvider(model_specs={**specs, "studio": STUDIO}).start()
    yield p
    p.stop()


# --- Ollama's chatPrompt, as a pure function --------------------------------------------------------------------


def fits_under(limit):
    return lambda kept: sum(len(m["content"]) for m in kept) <= limit


def test_whole_messages_go_from_the_front_and_system_messages_stay():
    msgs = [S("s" * 10), U("a" * 100), A("b" * 100), S("t" * 10), U("c" * 100), A("d" * 100), U("e" * 100)]
    kept, dropped = ollama_chat_prompt(msgs, fits_under(330))
    assert kept == [msgs[0], msgs[3], msgs[4], msgs[5], msgs[6]] and dropped == 2
    kept, dropped = ollama_chat_prompt(msgs, fits_under(10_000))
    assert kept == msgs and dropped == 0


def test_a_tool_result_never_stays_without_its_call():
    msgs = [U("a" * 100), CALL("c1"), RESULT("c1", "r" * 100), RESULT("c1", "q" * 50), U("e" * 100)]
    assert tool_block_start(msgs, 3) == 1 and tool_block_start(msgs, 2) == 1 and tool_block_start(msgs, 4) == 4
    kept, dropped = ollama_chat_prompt(msgs, fits_under(260))  # call + results = 150 + 100: fits
    assert kept == msgs[1:] and dropped == 1
    kept, dropped = ollama_chat_prompt(msgs, fits_under(200))  # starting at a result would split the pair
    assert kept == [msgs[4]] and dropped == 4


def test_the_last_message_stays_even_when_it_alone_does_not_fit():
    msgs = [S("s"), U("a" * 100), CALL("c1"), RESULT("c1", "r" * 500)]
    kept, dropped = ollama_chat_prompt(msgs, fits_under(100))
    assert kept == [msgs[0], msgs[2], msgs[3]] and dropped == 1  # the last result keeps its call


# --- Ollama over HTTP ----------------------------------------------------------------------------------------------


def test_ollama_v1_drops_old_messages_and_reports_what_it_kept(provider):
    msgs = [S("Be brief.")] + turns(12) + [U("Last question " + words(20))]
    whole = model_tokens(msgs, None, OLLAMA)
    assert whole > 1000
    status, body = chat(provider, msgs, model="ollama")
    assert status == 200
    entry = provider.requests[-1]
    kept = len(msgs) - entry["dropped"]
    assert entry["dropped"] > 0 and entry["cut"] and entry["over_window"] and not entry["rejected"]
    prompt = body["usage"]["prompt_tokens"]
    assert prompt == entry["reported_prompt"] == model_tokens([msgs[0]] + msgs[-(kept - 1) :], None, OLLAMA)
    assert 1000 - 200 < prompt < 1000  # under num_ctx, not at it: one message more would not have fitted
    assert body["choices"][0]["message"]["content"].startswith(f"[fake-chat] {kept} messages")  # it saw only these


def test_ollama_v1_takes_no_options_but_the_native_api_does(provider):
    msgs = turns(3)
    status, body = chat(provider, msgs, model="ollama", options={"num_ctx": 100})
    assert status == 200 and provider.requests[-1]["window"] == 1000 and provider.requests[-1]["dropped"] == 0
    two = model_tokens(msgs[-2:], None, OLLAMA)
    status, lines = ollama_chat(provider, msgs, options={"num_ctx": two + 1})
    entry = provider.requests[-1]
    assert status == 200 and entry["api"] == "ollama" and entry["window"] == two + 1 and entry["dropped"] == 4
    assert lines[-1]["done"] is True and lines[-1]["prompt_eval_count"] == model_tokens(msgs[-2:], None, OLLAMA)
    assert all(line["done"] is False for line in lines[:-1]) and "prompt_eval_count" not in lines[0]
    assert "".join(line["message"]["content"] for line in lines).startswith("[fake-chat] 2 messages")


def test_ollama_num_ctx_is_never_above_the_trained_size(provider):
    ollama_chat(provider, [U("hi")], options={"num_ctx": 100_000})
    assert provider.requests[-1]["window"] == 8192


def test_ollama_native_reply_without_stream_and_with_a_tool_call(provider):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    status, body = http(
        "POST",
        root(provider) + "/api/chat",
        {"model": "ollama", "messages": [U("CALL_TOOL_ROUNDS:search:2")], "tools": tools, "stream": False},
    )
    assert status == 200 and body["done"] is True and body["prompt_eval_count"] > 0
    call = body["message"]["tool_calls"][0]
    assert call["function"] == {"index": 0, "name": "search", "arguments": {"round": 1}}
    # Open WebUI sends the call back with its arguments as an object: the next round is counted from them
    native_call = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "found"}
    status, lines = ollama_chat(provider, [U("CALL_TOOL_ROUNDS:search:2"), native_call, result], tools=tools)
    assert status == 200 and lines[0]["message"]["tool_calls"][0]["function"]["arguments"] == {"round": 2}


def test_ollama_when_the_last_message_alone_does_not_fit(provider):
    msgs = [U("old " + words(50)), U("huge " + words(400))]
    status, body = chat(provider, msgs, model="ollama-strict")
    assert status == 400 and body["error"]["message"] == OLLAMA_TOO_LONG
    status, body = ollama_chat(provider, msgs, model="ollama-strict")
    assert status == 400 and body == {"error": OLLAMA_TOO_LONG}
    assert provider.requests[-1]["rejected"] and provider.requests[-1]["dropped"] == 1
    status, lines = ollama_chat(provider, msgs, options={"num_ctx": 300})  # too_long="cut": its last tokens
    assert status == 200 and lines[-1]["prompt_eval_count"] == 300 and provider.requests[-1]["cut"]


def test_ollama_probes_tags_show_and_ps_before_and_after_loading(provider):
    status, tags = http("GET", root(provider) + "/api/tags")
    assert status == 200 and [m["model"] for m in tags["models"]] == ["ollama", "ollama-strict", "warm"]
    assert http("GET", root(provider) + "/api/version") == (200, {"version": "0.30.1"})
    status, show = http("POST", root(provider) + "/api/show", {"model": "ollama"})
    assert show["model_info"]["llama.context_length"] == 8192 and "num_ctx" not in show["parameters"]
    _, show = http("POST", root(provider) + "/api/show", {"model": "warm"})
    assert "num_ctx                        2048" in show["parameters"]  # set in its Modelfile
    assert http("POST", root(provider) + "/api/show", {"model": "nope"})[0] == 404
    _, ps = http("GET", root(provider) + "/api/ps")
    assert [(m["model"], m["context_length"]) for m in ps["models"]] == [("warm", 2048)]  # preloaded only
    ollama_chat(provider, [U("hi")], options={"num_ctx": 4096})
    _, ps = http("GET", root(provider) + "/api/ps")
    assert {m["model"]: m["context_length"] for m in ps["models"]} == {"ollama": 4096, "warm": 2048}
    chat(provider, [U("hi")], model="ollama")  # its OpenAI endpoint reloads it with the configured size
    _, ps = http("GET", root(provider) + "/api/ps")
    assert {m["model"]: m["context_length"] for m in ps["models"]}["ollama"] == 1000
    assert [p["path"] for p in provider.probes][:3] == ["/api/tags", "/api/version", "/api/show"]


def test_ollama_native_api_serves_only_ollama_models(provider):
    assert ollama_chat(provider, [U("hi")], model="llama") == (404, {"error": "model 'llama' not found"})


# --- llama-server ------------------------------------------------------------------------------------------------


def test_llamacpp_publishes_trained_size_in_models_and_served_size_in_props_and_slots(provider):
    _, models = http("GET", provider.base_url + "/models")
    entry = next(m for m in models["data"] if m["id"] == "llama")
    assert entry["meta"]["n_ctx_train"] == 131072 and entry["owned_by"] == "llamacpp"
    status, props = http("GET", root(provider) + "/props")
    assert status == 200 and props["default_generation_settings"]["n_ctx"] == 1000
    _, props = http("GET", root(provider) + "/props?model=llama-old")
    assert props["model_alias"] == "llama-old"
    status, slots = http("GET", root(provider) + "/slots")
    assert status == 200 and [s["n_ctx"] for s in slots] == [1000]


def test_llamacpp_refuses_with_exceed_context_size_error_in_both_texts(provider):
    msgs = [U(words(1200))]
    own = model_tokens(msgs, None, LLAMA)
    status, body = chat(provider, msgs, model="llama")
    assert status == 400 and body["error"]["type"] == "exceed_context_size_error"
    assert body["error"]["n_prompt_tokens"] == own and body["error"]["n_ctx"] == 1000
    assert body["error"]["message"] == (
        f"request ({own} tokens) exceeds the available context size (1000 tokens), try increasing it"
    )
    status, body = chat(provider, msgs, model="llama-old")
    assert status == 400 and body["error"]["message"] == (
        "the request exceeds the available context size, try increasing it"
    )
    assert provider.requests[-1]["rejected"] and not provider.requests[-1]["cut"]
    assert chat(provider, [U("short")], model="llama", max_tokens=5000)[0] == 200  # the reply's room is not counted


# --- LM Studio -----------------------------------------------------------------------------------------------------


def test_lmstudio_tells_its_window_in_api_v0_models_only(provider):
    _, models = http("GET", provider.base_url + "/models")
    entry = next(m for m in models["data"] if m["id"] == "studio")
    assert set(entry) == {"id", "object", "created", "owned_by"}
    status, v0 = http("GET", root(provider) + "/api/v0/models")
    assert status == 200 and v0["data"][0]["state"] == "not-loaded" and "loaded_context_length" not in v0["data"][0]
    chat(provider, [U("hi")], model="studio")
    _, v0 = http("GET", root(provider) + "/api/v0/models")
    assert v0["data"][0]["loaded_context_length"] == 1000 and v0["data"][0]["max_context_length"] == 32768
    status, body = chat(provider, [U(words(1200))], model="studio")
    assert status == 400 and "context length of only 1000 tokens" in body["error"]


# --- switching probes off, counting what windows did ---------------------------------------------------------


def test_probes_can_be_switched_off_and_a_plain_server_answers_none(provider):
    provider.configure(probes_off=["/api/ps"])
    assert http("GET", root(provider) + "/api/ps")[0] == 404 and http("GET", root(provider) + "/props")[0] == 200
    provider.configure(probes_off="all")
    for path in ("/api/ps", "/props", "/slots", "/api/v0/models"):
        assert http("GET", root(provider) + path)[0] == 404, path
    assert http("POST", root(provider) + "/api/show", {"model": "ollama"})[0] == 404
    assert http("GET", root(provider) + "/api/tags")[0] == 200  # Open WebUI still lists the models
    with pytest.raises(ValueError):
        provider.configure(probes_off=["/nope"])
    with FakeProvider(model_specs={"vllm": ModelSpec(window=1000)}) as plain:
        for path in ("/api/tags", "/api/ps", "/props", "/slots", "/api/v0/models"):
            assert http("GET", root(plain) + path)[0] == 404, path
        assert ollama_chat(plain, [U("hi")], model="vllm")[0] == 404


def test_window_events_count_cuts_drops_and_rejections(provider):
    chat(provider, [U("hi")], model="ollama")
    assert provider.window_events() == {"requests": 1, "cut": 0, "dropped": 0, "rejected": 0}
    chat(provider, turns(12), model="ollama")
    dropped = provider.requests[-1]["dropped"]
    chat(provider, [U(words(1200))], model="llama")
    with provider.rejections_expected():
        chat(provider, [U(words(1200))], model="llama")
    assert provider.window_events() == {"requests": 3, "cut": 1, "dropped": dropped, "rejected": 1}
    assert provider.window_events(include_controls=True)["rejected"] == 2


# --- the Open WebUI harness ------------------------------------------------------------------------------------


def test_openwebui_server_environment_for_an_ollama_connection(monkeypatch):
    from devkit.owui_server import OpenWebUIServer

    for key in ("OPENAI_API_BASE_URLS", "OPENAI_API_KEYS", "OLLAMA_BASE_URLS"):
        monkeypatch.delenv(key, raising=False)
    env = OpenWebUIServer(python="python", provider_url=None, ollama_url="http://127.0.0.1:9").environment()
    assert env["ENABLE_OLLAMA_API"] == "true" and env["OLLAMA_BASE_URLS"] == "http://127.0.0.1:9"
    assert env["ENABLE_OPENAI_API"] == "false" and "OPENAI_API_BASE_URLS" not in env
    env = OpenWebUIServer(python="python", provider_url="http://127.0.0.1:9/v1").environment()
    assert env["ENABLE_OLLAMA_API"] == "false" and "OLLAMA_BASE_URLS" not in env
    assert env["ENABLE_OPENAI_API"] == "true" and env["OPENAI_API_BASE_URLS"] == "http://127.0.0.1:9/v1"
