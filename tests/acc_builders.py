"""The builders and fakes every test folder shares (tests/unit, tests/db):
OpenAI-style message builders, a request context, a token counter that
never loads tiktoken, a summary store that only answers ``find``, a scripted
summarizer, and one Filter factory. ``tests/conftest.py`` makes this module
importable as ``acc_builders`` from any test.

Every message builder returns a fresh dict, so a test can compare a list with
one built again the same way (``==``) and check that inputs were not mutated.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
from typing import Any, Optional

import async_context_compression as acc


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


def request_context(valves: Any, chat_id: str = "c", user_id: str = "u", model_id: str = "m") -> acc.RequestContext:
    """A RequestContext as the Filter builds one for a request, with the
    settings these valves give the model."""
    return acc.RequestContext(
        user={"id": user_id},
        user_id=user_id,
        chat_id=chat_id,
        model_id=model_id,
        language="en",
        settings=acc.resolve_settings(valves, model_id),
    )


# -- a chat for recall (issue 36): facts a summary may drop

CITIES = ("Berlin", "Munich", "Lisbon", "Porto", "Oslo", "Madrid", "Rome", "Vienna", "Dublin", "Prague")


def warehouse_chat() -> list:
    """Ten turns about ten warehouses: each reply names an access code; then a Chinese turn with its own code."""
    canon = []
    for i, city in enumerate(CITIES):
        canon.append(U(f"What should we write down about the {city} warehouse? Please keep it short."))
        canon.append(
            AS(
                f"The access code for the {city} warehouse is BX-{4400 + i}. The loading dock opens at {6 + i} am."
                f"\n\nShipping from {city} usually takes {i + 2} days, and the team is happy with that."
            )
        )
    canon.append(U("柏林仓库的门禁密码是 ZK-9981，请记住。"))
    canon.append(AS("好的，我记下了。"))
    return canon


# -- fakes --------------------------------------------------------------------------


class EstimateOnly(acc.TokenCounter):
    """A TokenCounter that never loads tiktoken: every count is the estimator's."""

    def start_loading(self, encoding: str) -> None:
        return None


class RecordStore(acc.NullStore):
    """A summary store that only answers ``find``: with ``records`` (whatever
    the chat and anchor), or by raising ``error`` when one is given; the rest
    of the store contract keeps nothing (NullStore)."""

    def __init__(self, records=(), error: Optional[BaseException] = None):
        self.records, self.error = list(records), error

    async def find(self, user_id, chat_id, anchor, limit=16):
        if self.error:
            raise self.error
        return list(self.records)


class SharedStore(acc.NullStore):
    """What the workers share through the store, as SummaryStore keeps it (tests/db checks that one): window rows
    (``rows``: (model, user) -> row), the records of requests sent (``sent``), ratio rows (``ratios``), and the
    (model, user) of each read of a user's ratios (``user_reads``); no summary, no lease."""

    def __init__(self):
        self.rows: dict = {}
        self.sent: dict = {}
        self.ratios: list = []
        self.user_reads: list = []

    async def save_windows(self, rows):
        for model, user, window in rows:
            if window is None:
                self.rows.pop((model, user), None)
            else:
                self.rows[(model, user)] = (model, *dataclasses.astuple(window), user)

    async def read_windows(self):
        return list(self.rows.values())

    async def read_window(self, model):
        return [row for (m, _), row in self.rows.items() if m == model]

    async def record_sent(self, request):
        self.sent[request.reply_id] = request

    async def read_sent(self, reply_id):
        return self.sent.get(reply_id)

    async def forget_sent(self, reply_id):
        self.sent.pop(reply_id, None)

    async def add_ratios(self, rows):
        self.ratios += rows

    async def read_ratios(self):
        return list(self.ratios)

    async def read_user_ratios(self, model, user):
        self.user_reads.append((model, user))
        return [row for row in self.ratios if (row[1], row[5]) == (model, user)]


MARK = re.compile(r"MK-\d{4}")


class FakeSummarizer:
    """A stand-in for ``Filter.summaries.complete``. Records every call; answers with
    every marker (``MK-0000``) it was shown, unless a scripted behaviour (an
    exception, a string, or ("sleep", seconds)) is queued for the call. With a ``gate``
    (an asyncio.Event), no call answers before the gate is set."""

    def __init__(self, delay: float = 0.0, padding: str = "", gate: Optional[asyncio.Event] = None):
        self.calls: list = []
        self.script: list = []
        self.delay = delay
        self.padding = padding
        self.gate = gate

    async def __call__(self, request, user, model, messages, max_tokens, temperature, **extra):
        self.calls.append(
            {
                "user": user,
                "model": model,
                "messages": copy.deepcopy(messages),
                "max_tokens": max_tokens,
                "temperature": temperature,
                **extra,
            }
        )
        step = self.script.pop(0) if self.script else None
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, tuple) and step[0] == "sleep":
            await asyncio.sleep(step[1])
        if isinstance(step, str):
            return step
        seen = MARK.findall(messages[-1]["content"])
        return "Running summary: " + " ".join(dict.fromkeys(seen)) + self.padding

    def new_section(self, call: int) -> str:
        """The 'new messages' part of one call's input."""
        content = self.calls[call]["messages"][-1]["content"]
        return content.split("New messages to fold in:\n", 1)[1]

    def previous_section(self, call: int) -> str:
        content = self.calls[call]["messages"][-1]["content"]
        return content.split("Previous summary:\n", 1)[1].split("\n\nNew messages to fold in:", 1)[0]


def make_filter(
    cap: Optional[int] = None, *, counter: Optional[str] = None, store: Any = None, complete: Any = None, **valves
) -> acc.Filter:
    """A Filter for one test. ``cap`` is ``max_context_tokens``; other keyword
    arguments set valves as given (no validation: a test may go below a
    valve's minimum). ``counter``: None keeps the Filter's own counter (it
    loads tiktoken in the background), "estimate" never loads tiktoken,
    "exact" waits until cl100k_base is loaded. ``store`` and ``complete``
    replace the summary store and the summarizer when given."""
    f = acc.Filter()
    if counter == "estimate":
        f.summaries.counter = EstimateOnly()
    if store is not None:
        f.summaries.store = store
    if complete is not None:
        f.summaries.complete = complete
    if cap is not None:
        f.valves.max_context_tokens = cap
    for key, value in valves.items():
        setattr(f.valves, key, value)
    if counter == "exact":
        from devkit.probes import wait_ready

        assert wait_ready(f.counter, "cl100k_base", 60)
    return f


async def lines_written(f: acc.Filter) -> None:
    """Waits for the status lines the filter writes while the model answers
    (outlet would wait for them; a test that reads them before outlet waits here)."""
    if f.services.lines.writing:
        await asyncio.wait(list(f.services.lines.writing))
