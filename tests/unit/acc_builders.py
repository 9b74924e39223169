"""Small builders for OpenAI-style messages, shared by the unit tests.

Every builder returns a fresh dict, so a test can compare a list with one
built again the same way (``==``) and check that inputs were not mutated.
"""

from __future__ import annotations

import copy
from typing import Any, Optional


def S(text: str = "You are helpful.") -> dict:
    return {"role": "system", "content": text}


def U(text: Any = "hello") -> dict:
    return {"role": "user", "content": text}


def AS(text: Any = "answer") -> dict:
    return {"role": "assistant", "content": text}


def call(cid: str, name: str = "search", arguments: str = '{"q": "x"}') -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def A(*ids: str, content: Any = None, name: str = "search", arguments: str = '{"q": "x"}', **extra) -> dict:
    """An assistant turn calling one tool per id."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [call(cid, name, arguments) for cid in ids],
        **extra,
    }


def T(cid: str, text: Any = "result") -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": text}


def IMG(url: str = "data:image/png;base64,AAAA") -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def TXT(text: str) -> dict:
    return {"type": "text", "text": text}


def roles(messages: list) -> list:
    return [m.get("role") for m in messages]


def systems(messages: list) -> list:
    return [m for m in messages if isinstance(m, dict) and m.get("role") == "system"]


def last_user(messages: list) -> Optional[dict]:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return m
    return None


def frozen(value: Any) -> Any:
    """A deep copy to compare an input with after a call (no mutation)."""
    return copy.deepcopy(value)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def tok(message: dict) -> int:
    """A deterministic token function for fit tests: a quarter token per
    character of text and arguments, 100 per image, 4 per message."""
    content = message.get("content")
    images = 0
    if isinstance(content, list):
        images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
    arguments = sum(
        len((c.get("function") or {}).get("arguments") or "")
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    )
    return len(text_of(content)) // 4 + arguments // 4 + 100 * images + 4


def total(messages: list) -> int:
    return sum(tok(m) for m in messages)


def request_context(valves: Any, chat_id: str = "c", user_id: str = "u", model_id: str = "m") -> Any:
    """A RequestContext as the Filter builds one for a request, with the
    settings these valves give the model."""
    import async_context_compression as acc

    return acc.RequestContext(
        user={"id": user_id},
        user_id=user_id,
        chat_id=chat_id,
        model_id=model_id,
        language="en",
        settings=acc.resolve_settings(valves, model_id),
    )
