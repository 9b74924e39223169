"""Deterministic chats for the benchmark, in the two shapes the filter sees.

``make_chat(n, seed)`` returns an inlet body (the active branch as Open WebUI
sends it to the model: system prompt, users, assistants, expanded tool calls
and results, ending with the user's new message) of exactly ``n`` messages,
and ``outlet_body(chat)`` the same conversation as outlet receives it (stored
messages with ids; each tool-using reply folded into one assistant message
whose ``output`` holds the calls, the results and the answer).

Content comes from ``bench.corpus``: English, CJK, code and JSON questions and
answers, tool chains with parallel calls, large tool outputs (logs, tables,
base64), and now and then an image.
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import zlib

from bench.corpus import make_text

MODEL = "gpt-4-turbo"  # a cl100k_base model: exact counts work offline

SYSTEM_PROMPT = (
    "You are a careful assistant for a software team. Answer in the user's language, "
    "show code in fenced blocks, cite tool results you rely on, and say when you are unsure. "
    "Tools: search (web search), run_python (executes code in a sandbox), read_file (reads a "
    "file of the repository), query_db (read-only SQL on the analytics replica)."
)
TOOLS = ("search", "run_python", "read_file", "query_db")
USER_MIX = (("english", 50), ("chinese", 15), ("japanese", 5), ("korean", 5), ("code", 15), ("json", 5), ("mixed", 5))
ASSISTANT_MIX = (("english", 50), ("chinese", 15), ("code", 25), ("mixed", 10))
TOOL_MIX = (("tool_output", 70), ("json", 30))


def _png(width: int, height: int) -> str:
    """A tiny valid PNG data URL whose header says width x height."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    raw += chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + raw).decode()


def _pick(rng: random.Random, mix) -> str:
    return rng.choices([c for c, _ in mix], weights=[w for _, w in mix])[0]


def _length(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _user(rng: random.Random, scale: float = 1.0) -> dict:
    text = make_text(_pick(rng, USER_MIX), _length(rng, 20, 1500 * scale), rng)
    if rng.random() < 0.02:
        size = rng.choice([(512, 512), (1024, 768), (2048, 1536)])
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": _png(*size)}},
            ],
        }
    return {"role": "user", "content": text}


def _assistant(rng: random.Random, scale: float = 1.0) -> dict:
    return {
        "role": "assistant",
        "content": make_text(_pick(rng, ASSISTANT_MIX), _length(rng, 100 * scale, 4000 * scale), rng),
    }


def _tool_round(rng: random.Random, calls: int, scale: float = 1.0) -> list:
    ids = ["call_" + "".join(rng.choices("0123456789abcdef", k=24)) for _ in range(calls)]
    call_message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {
                    "name": rng.choice(TOOLS),
                    "arguments": json.dumps(
                        {"query": make_text("english", _length(rng, 10, 200), rng), "limit": rng.randint(1, 50)}
                    ),
                },
            }
            for cid in ids
        ],
    }
    results = []
    for cid in ids:
        size = _length(rng, 10_000, 20_000) if rng.random() < 0.05 else _length(rng, 200, 6000)
        size = max(10, int(size * scale))
        results.append({"role": "tool", "tool_call_id": cid, "content": make_text(_pick(rng, TOOL_MIX), size, rng)})
    return [call_message, *results]


def make_chat(n: int, seed: int = 0, scale: float = 1.0) -> list:
    """Exactly ``n`` messages (n >= 2): system prompt, turns, the new user
    message. ``scale`` shrinks (or grows) every message's length."""
    rng = random.Random(f"chat:{n}:{seed}:{scale}")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    remaining = n - 2
    while remaining > 0:
        if remaining >= 4 and rng.random() < 0.3:
            calls = rng.choice([1, 1, 1, 2, 3])
            rounds = 2 if rng.random() < 0.2 else 1
            size = 1 + rounds * (1 + calls) + 1
            if size <= remaining and remaining - size != 1:
                messages.append(_user(rng, scale))
                for _ in range(rounds):
                    messages.extend(_tool_round(rng, calls, scale))
                messages.append(_assistant(rng, scale))
                remaining -= size
                continue
        if remaining == 1 or remaining == 3:
            messages.append(_user(rng, scale))  # a user message whose reply failed
            remaining -= 1
            continue
        messages.append(_user(rng, scale))
        messages.append(_assistant(rng, scale))
        remaining -= 2
    messages.append(_user(rng, scale))
    assert len(messages) == n, (len(messages), n)
    return messages


def inlet_body(messages: list, chat_id: str) -> dict:
    return {"model": MODEL, "messages": messages, "stream": True, "chat_id": chat_id}


def outlet_body(messages: list, chat_id: str, reply: str = "Done.") -> dict:
    """The chat after the model answered, as outlet receives it."""
    stored = []
    i = 0
    rng = random.Random(chat_id)
    while i < len(messages):
        message = messages[i]
        mid = "".join(rng.choices("0123456789abcdef", k=32))
        if message.get("role") == "assistant" and message.get("tool_calls"):
            output, answer = [], ""
            while i < len(messages) and (messages[i].get("role") == "tool" or messages[i].get("tool_calls")):
                current = messages[i]
                if current.get("role") == "tool":
                    output.append(
                        {
                            "type": "function_call_output",
                            "call_id": current["tool_call_id"],
                            "output": [{"type": "input_text", "text": current["content"]}],
                        }
                    )
                else:
                    for call in current["tool_calls"]:
                        output.append(
                            {
                                "type": "function_call",
                                "call_id": call["id"],
                                "name": call["function"]["name"],
                                "arguments": call["function"]["arguments"],
                                "status": "completed",
                            }
                        )
                i += 1
            if i < len(messages) and messages[i].get("role") == "assistant":
                answer = messages[i]["content"]
                output.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
                )
                i += 1
            stored.append({"id": mid, "role": "assistant", "content": answer, "output": output})
            continue
        stored.append({"id": mid, **message})
        i += 1
    stored.append({"id": "reply-" + chat_id, "role": "assistant", "content": reply})
    return {"model": MODEL, "messages": stored, "chat_id": chat_id, "session_id": "bench", "id": "reply-" + chat_id}


# -- chats that need repair on every request (issue 10) -------------------------------

REPAIR_USER_MIX = (("english", 30), ("chinese", 25), ("japanese", 10), ("korean", 10), ("mixed", 15), ("code", 10))


def _reused_round(rng: random.Random, calls: int, round_no: int, scale: float, unanswered: bool) -> list:
    """A tool round whose ids restart every round (``functions.search:0``,
    as Kimi through vLLM or OpenRouter sends them); with ``unanswered``, the
    last call never got its result (a crashed tool)."""
    names = [rng.choice(TOOLS) for _ in range(calls)]
    ids = [f"functions.{name}:{k}" for k, name in enumerate(names)]
    call_message = {
        "role": "assistant",
        "content": make_text("chinese", _length(rng, 5, 60 * scale), rng) if rng.random() < 0.3 else "",
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": json.dumps(
                        {"query": make_text("mixed", _length(rng, 5, 80), rng), "round": round_no}, ensure_ascii=False
                    ),
                },
            }
            for cid, name in zip(ids, names)
        ],
    }
    answered = ids[:-1] if unanswered else ids
    results = [
        {
            "role": "tool",
            "tool_call_id": cid,
            "content": make_text(_pick(rng, TOOL_MIX), _length(rng, 40, 2000 * scale), rng),
        }
        for cid in answered
    ]
    return [call_message, *results]


def make_repair_chat(n: int, seed: int = 0, scale: float = 1.0) -> list:
    """Exactly ``n`` messages (n >= 2) that repair must change on every
    request: tool-call ids reused by every round, now and then a call that
    was never answered, tool chains of several steps, and text in many
    scripts (CJK, Hangul, emoji). ``scale`` shrinks every message."""
    rng = random.Random(f"repair:{n}:{seed}:{scale}")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    remaining = n - 2
    round_no = 0
    while remaining > 0:
        if remaining >= 5 and rng.random() < 0.5:
            calls = rng.choice([1, 2, 2, 3])
            unanswered = calls > 1 and rng.random() < 0.3
            steps = 2 if rng.random() < 0.3 else 1
            size = 1 + steps * (1 + calls) - (1 if unanswered else 0) + 1
            if size <= remaining and remaining - size != 1:
                messages.append(
                    {
                        "role": "user",
                        "content": make_text(_pick(rng, REPAIR_USER_MIX), _length(rng, 10, 400 * scale), rng),
                    }
                )
                for step in range(steps):
                    messages.extend(_reused_round(rng, calls, round_no, scale, unanswered and step == steps - 1))
                    round_no += 1
                messages.append(
                    {
                        "role": "assistant",
                        "content": make_text(_pick(rng, ASSISTANT_MIX), _length(rng, 40, 1500 * scale), rng) + " ✅",
                    }
                )
                remaining -= size
                continue
        if remaining in (1, 3):
            messages.append(
                {"role": "user", "content": make_text(_pick(rng, REPAIR_USER_MIX), _length(rng, 10, 400 * scale), rng)}
            )
            remaining -= 1
            continue
        messages.append(
            {"role": "user", "content": make_text(_pick(rng, REPAIR_USER_MIX), _length(rng, 10, 400 * scale), rng)}
        )
        messages.append(
            {
                "role": "assistant",
                "content": make_text(_pick(rng, ASSISTANT_MIX), _length(rng, 40, 1500 * scale), rng) + " 🙂",
            }
        )
        remaining -= 2
    messages.append(
        {"role": "user", "content": make_text(_pick(rng, REPAIR_USER_MIX), _length(rng, 10, 400 * scale), rng)}
    )
    assert len(messages) == n, (len(messages), n)
    return messages
