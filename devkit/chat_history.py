"""Chat histories built the way Open WebUI stores them.

:class:`ChatHistory`: ``history.messages`` keyed by id with
``parentId``/``childrenIds``, ``history.currentId``, and assistant replies with
native tool calls in ``output`` (``function_call`` with ``status: completed``,
``function_call_output``, ``message``).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any, Optional

__all__ = [
    "ChatHistory",
    "new_id",
    "new_marker",
]


def new_id() -> str:
    return str(uuid.uuid4())


def new_marker() -> str:
    return "MK-" + secrets.token_hex(4)


class _Current:
    def __repr__(self) -> str:
        return "<current>"


_CURRENT: Any = _Current()


class ChatHistory:
    """A chat as Open WebUI stores it; messages are appended under ``current_id``.

    >>> h = ChatHistory("fake-chat")
    >>> u = h.user("hello")
    >>> a = h.assistant("hi")
    >>> h.to_chat()["history"]["currentId"] == a
    True
    """

    def __init__(self, model: str, system: Optional[str] = None) -> None:
        self.model = model
        self.system = system
        self.messages: dict = {}
        self.current_id: Optional[str] = None
        self._clock = int(time.time()) - 100000

    def _tick(self) -> int:
        self._clock += 7
        return self._clock

    def _add(self, message: dict, parent_id: Any) -> str:
        parent = self.current_id if parent_id is _CURRENT else parent_id
        message["parentId"] = parent
        message.setdefault("childrenIds", [])
        if parent is not None:
            self.messages[parent]["childrenIds"].append(message["id"])
        self.messages[message["id"]] = message
        self.current_id = message["id"]
        return message["id"]

    def user(self, content: str, parent_id: Any = _CURRENT, message_id: Optional[str] = None) -> str:
        """Append a user message under ``parent_id`` (default: the current message; None: a root)."""
        return self._add(
            {
                "id": message_id or new_id(),
                "role": "user",
                "content": content,
                "timestamp": self._tick(),
                "models": [self.model],
            },
            parent_id,
        )

    def assistant(
        self,
        content: str,
        parent_id: Any = _CURRENT,
        message_id: Optional[str] = None,
        output: Optional[list] = None,
        usage: Optional[dict] = None,
    ) -> str:
        message = {
            "id": message_id or new_id(),
            "role": "assistant",
            "content": content,
            "model": self.model,
            "modelName": self.model,
            "modelIdx": 0,
            "timestamp": self._tick(),
            "done": True,
        }
        if output is not None:
            message["output"] = output
        if usage is not None:
            message["usage"] = usage
        return self._add(message, parent_id)

    def assistant_tools(
        self,
        steps: list,
        final_text: str,
        parent_id: Any = _CURRENT,
        message_id: Optional[str] = None,
    ) -> str:
        """An assistant reply with native tool calls stored in ``output``.

        ``steps`` is a list of rounds; each round is a list of
        ``(name, arguments, result_text)`` calls made in parallel, optionally
        preceded by a string (text the model said before that round).
        Multi-step = several rounds; parallel = several calls in one round.
        """
        output: list = []
        for round_ in steps:
            calls = list(round_)
            if calls and isinstance(calls[0], str):
                output.append(_message_item(calls.pop(0)))
            for name, arguments, _result in calls:
                call_id = "call_" + secrets.token_hex(6)
                output.append(
                    {
                        "type": "function_call",
                        "id": call_id,
                        "call_id": call_id,
                        "name": name,
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        "status": "completed",
                    }
                )
                output[-1]["_result"] = _result
            # results follow the whole round, like the native loop stores them
            for item in [i for i in output if i.get("_result") is not None]:
                output.append(
                    {
                        "type": "function_call_output",
                        "id": "fco_" + secrets.token_hex(6),
                        "call_id": item["call_id"],
                        "output": [{"type": "input_text", "text": str(item.pop("_result"))}],
                        "status": "completed",
                    }
                )
        output.append(_message_item(final_text))
        text_parts = [
            part["text"]
            for item in output
            if item.get("type") == "message"
            for part in item.get("content", [])
            if part.get("type") == "output_text"
        ]
        return self.assistant("\n".join(text_parts), parent_id=parent_id, message_id=message_id, output=output)

    def branch(self, leaf_id: str) -> list:
        """Messages from the root to ``leaf_id``."""
        chain = []
        cursor: Optional[str] = leaf_id
        while cursor:
            chain.append(self.messages[cursor])
            cursor = self.messages[cursor].get("parentId")
        return list(reversed(chain))

    def to_chat(self, title: Optional[str] = None) -> dict:
        chat: dict = {
            "title": title or "Test chat",
            "models": [self.model],
            "history": {"messages": json.loads(json.dumps(self.messages)), "currentId": self.current_id},
            "messages": json.loads(json.dumps(self.branch(self.current_id))) if self.current_id else [],
            "params": {},
            "files": [],
            "tags": [],
            "timestamp": int(time.time() * 1000),
        }
        if self.system:
            chat["params"]["system"] = self.system
        return chat


def _message_item(text: str) -> dict:
    return {
        "type": "message",
        "id": "msg_" + secrets.token_hex(6),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text}],
    }
