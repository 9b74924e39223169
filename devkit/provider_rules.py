"""Validators for OpenAI-style chat message lists, one per provider family.

The contract is ``shared/spec/provider-rules.md``: what real providers answer
with HTTP 400.  Every ``check_*`` function is pure, never raises on odd input,
and returns a list of :class:`Violation` (empty when the list would be
accepted).  ``Violation.message`` carries the provider's own error text
(abridged), so a fake server can answer with it.

Rule ids
--------
OpenAI (``check_openai``)
    O0  malformed request: empty list, a message that is not an object, an
        unknown role, a ``tool`` message without a string ``tool_call_id``
    O1  a ``tool`` message that does not follow an assistant ``tool_calls``
        run (nothing pending, e.g. first kept message is a tool result, or a
        result arriving after a user/system message interrupted the run)
    O2  an assistant ``tool_calls`` message whose ids were not all answered
        before the next non-tool message (or the end of the list).  Together
        with O1 this also enforces O4 (results contiguous right after the
        assistant; ``tool -> user`` after a complete run is fine)
    O3  a result whose id is not one of the previous assistant's call ids
    O5  two results for one id
    O6  ``tool_calls: []``, a malformed call, id longer than 40 characters,
        function name not matching ``^[a-zA-Z0-9_-]{1,64}$``, non-string
        ``arguments``
    O7  ``content`` null/missing except on an assistant with tool calls;
        content of a wrong type, an empty parts list, image parts outside a
        user message
    O8  ``name`` not matching ``^[a-zA-Z0-9_-]+$``

Mistral (``check_mistral``)
    M1  role transition not in the table (so ``tool -> user`` is rejected)
    M2  number of results differs from the number of calls of an assistant
        turn (a turn is closed by the next assistant message or the end)
    M3  result id unknown to the current assistant turn, or answered twice

Anthropic (``check_anthropic``, on the turns of :func:`to_anthropic`)
    A1  a ``tool_use`` with no ``tool_result`` at the start of the next user turn
    A2  a ``tool_result`` whose id is not a ``tool_use`` of the previous
        assistant turn
    A3  a ``tool_result`` placed after a text/image block in its user turn
        (real Anthropic answers with A1's text)
    A4  a ``tool_use`` id used twice in the request, or two results for one id
    A5  no turn at all, or a first turn that is not ``user``
    A6  two consecutive turns of the same role (cannot happen after merging;
        asserted anyway)
    A7  an empty text block
    A8  tool call ``arguments`` that are not a JSON object (a gateway must
        parse them into ``input`` and fails)
    A9  a ``tool_use`` id (or a ``tool_result``'s ``tool_use_id``) not
        matching ``^[a-zA-Z0-9_-]+$`` (ids such as ``functions.bash:0``
        written by other models; A6 in shared/spec/provider-rules.md)
    A10 a user or assistant message that says nothing (no text beyond
        whitespace, no image, no tool call), except an empty final assistant
        message (A7 in shared/spec/provider-rules.md); checked on the
        messages, since a real gateway sends them as they are, where
        :func:`to_anthropic` leaves an empty assistant out

Moonshot / Kimi (``check_moonshot``; DeepSeek rejects the same)
    K1  an assistant message with empty content and no tool calls

Gemini (``check_gemini``)
    G1  a function-call turn not right after a user or function-response turn
        (includes a history whose first turn is a function call)
    G2  a function-response turn not right after a function-call turn
    G3  number of responses differs from the number of calls of that turn
        (a call turn followed by no response turn counts as zero responses)
    G4  tool call ``arguments`` that are not a JSON object

Unknown message keys (``reasoning_content``, ``stopReason``, ...) are allowed
everywhere.  Content may be a string, ``None`` or a list of parts
(``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "Violation",
    "check_openai",
    "check_mistral",
    "check_anthropic",
    "check_gemini",
    "check_moonshot",
    "to_anthropic",
    "violations_added",
    "CHECKERS",
]


@dataclass(frozen=True)
class Violation:
    provider: str  # "openai" | "mistral" | "anthropic" | "gemini"
    rule: str  # e.g. "O2"
    index: Optional[int]  # index into the checked message list, None for list-level
    message: str  # the provider's error text (abridged)


OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")
_FUNC_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_MAX_ID_LEN = 40
_TOOL_USE_ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


# --------------------------------------------------------------------------
# small helpers shared by the checkers
# --------------------------------------------------------------------------


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, dict) else None


def _calls(msg: Any) -> list:
    """The tool calls of an assistant message as a list (never None)."""
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return []
    calls = msg.get("tool_calls")
    return calls if isinstance(calls, list) else []


def _call_id(call: Any) -> Any:
    return call.get("id") if isinstance(call, dict) else None


def _call_name(call: Any) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else ""


def _call_args(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    return fn.get("arguments") if isinstance(fn, dict) else None


def _parse_args(raw: Any) -> tuple[bool, Any]:
    """(ok, value) for a call's ``arguments`` as a gateway would parse them."""
    if raw is None or raw == "":
        return True, {}
    if isinstance(raw, dict):
        return True, raw
    if not isinstance(raw, str):
        return False, None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return False, None
    return isinstance(value, dict), value


def content_text(content: Any) -> str:
    """The plain text of a content value (string, None or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
        return "\n".join(out)
    return ""


def _ids_text(ids: Iterable[Any]) -> str:
    return ", ".join(str(i) for i in ids)


# --------------------------------------------------------------------------
# OpenAI
# --------------------------------------------------------------------------


def _openai_content(i: int, msg: dict, role: str, has_calls: bool) -> list[Violation]:
    out: list[Violation] = []

    def v(text: str) -> None:
        out.append(Violation("openai", "O7", i, text))

    content = msg.get("content") if "content" in msg else None
    if content is None:
        if not (role == "assistant" and has_calls):
            v("Invalid value for 'content': expected a string, got null.")
        return out
    if isinstance(content, str):
        return out
    if not isinstance(content, list):
        v(
            f"Invalid type for 'messages[{i}].content': expected one of a string or "
            f"array of objects, but got {type(content).__name__} instead."
        )
        return out
    if not content:
        v(
            f"Invalid 'messages[{i}].content': empty array. Expected an array with "
            "minimum length 1, but got an empty array instead."
        )
        return out
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            v(f"Invalid type for 'messages[{i}].content[{j}]': expected an object.")
            continue
        ptype = part.get("type")
        if ptype == "text":
            if not isinstance(part.get("text"), str):
                v(f"Missing required parameter: 'messages[{i}].content[{j}].text'.")
        elif ptype == "image_url":
            img = part.get("image_url")
            if not isinstance(img, dict) or not isinstance(img.get("url"), str):
                v(f"Missing required parameter: 'messages[{i}].content[{j}].image_url.url'.")
            elif role != "user":
                v(
                    f"Invalid 'messages[{i}]'. Image URLs are only allowed for messages "
                    f"with role 'user', but this message with role '{role}' contains an "
                    "image URL."
                )
        elif not isinstance(ptype, str):
            v(f"Missing required parameter: 'messages[{i}].content[{j}].type'.")
        # other part types (input_audio, file, refusal, ...) are left alone
    return out


def _openai_tool_calls(i: int, msg: dict) -> list[Violation]:
    out: list[Violation] = []

    def v(text: str) -> None:
        out.append(Violation("openai", "O6", i, text))

    if "tool_calls" not in msg or msg["tool_calls"] is None:
        return out
    calls = msg["tool_calls"]
    if not isinstance(calls, list):
        v(f"Invalid type for 'messages[{i}].tool_calls': expected an array.")
        return out
    if not calls:
        v(
            f"Invalid 'messages[{i}].tool_calls': empty array. Expected an array with "
            "minimum length 1, but got an empty array instead."
        )
        return out
    for j, call in enumerate(calls):
        p = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(call, dict):
            v(f"Invalid type for '{p}': expected an object.")
            continue
        cid = call.get("id")
        if not isinstance(cid, str) or not cid:
            v(f"Missing required parameter: '{p}.id'.")
        elif len(cid) > _MAX_ID_LEN:
            v(
                f"Invalid '{p}.id': string too long. Expected a string with maximum "
                f"length {_MAX_ID_LEN}, but got a string with length {len(cid)} instead."
            )
        if call.get("type") != "function":
            if "type" not in call:
                v(f"Missing required parameter: '{p}.type'.")
            else:
                v(f"Invalid value: '{call.get('type')}'. Supported values are: 'function'.")
        fn = call.get("function")
        if not isinstance(fn, dict):
            v(f"Missing required parameter: '{p}.function'.")
            continue
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNC_NAME_RE.fullmatch(name):
            v(
                f"Invalid '{p}.function.name': string does not match pattern. Expected a "
                "string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'."
            )
        if "arguments" not in fn:
            v(f"Missing required parameter: '{p}.function.arguments'.")
        elif not isinstance(fn["arguments"], str):
            v(
                f"Invalid type for '{p}.function.arguments': expected a string, but got "
                f"{type(fn['arguments']).__name__} instead."
            )
    return out


def check_openai(messages: Any) -> list[Violation]:
    """Rules O0-O8 of OpenAI Chat Completions (see the module docstring)."""
    out: list[Violation] = []
    if not isinstance(messages, list) or not messages:
        return [
            Violation(
                "openai",
                "O0",
                None,
                "Invalid 'messages': empty array. Expected an array with minimum "
                "length 1, but got an empty array instead.",
            )
        ]

    # The assistant tool_calls run that tool messages may currently answer.
    pending_index: Optional[int] = None
    pending_ids: list = []
    answered: set = set()

    def close_run() -> None:
        nonlocal pending_index, pending_ids, answered
        if pending_index is not None:
            missing = [c for c in pending_ids if c not in answered]
            if missing:
                out.append(
                    Violation(
                        "openai",
                        "O2",
                        pending_index,
                        "An assistant message with 'tool_calls' must be followed by tool "
                        "messages responding to each 'tool_call_id'. The following "
                        f"tool_call_ids did not have response messages: {_ids_text(missing)}",
                    )
                )
        pending_index, pending_ids, answered = None, [], set()

    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            close_run()
            out.append(Violation("openai", "O0", i, f"Invalid type for 'messages[{i}]': expected an object."))
            continue
        role = msg.get("role")
        if role not in OPENAI_ROLES:
            close_run()
            out.append(
                Violation(
                    "openai",
                    "O0",
                    i,
                    f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                    "'user', 'function', 'tool', and 'developer'.",
                )
            )
            continue

        if "name" in msg and msg["name"] is not None:
            name = msg["name"]
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                out.append(
                    Violation(
                        "openai",
                        "O8",
                        i,
                        f"Invalid 'messages[{i}].name': string does not match pattern. "
                        "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                    )
                )

        has_calls = bool(_calls(msg))
        out.extend(_openai_content(i, msg, role, has_calls))
        if role == "assistant":
            out.extend(_openai_tool_calls(i, msg))

        if role == "tool":
            tcid = msg.get("tool_call_id")
            if not isinstance(tcid, str):
                out.append(
                    Violation(
                        "openai",
                        "O0",
                        i,
                        f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                    )
                )
                continue
            if pending_index is None:
                out.append(
                    Violation(
                        "openai",
                        "O1",
                        i,
                        "Invalid parameter: messages with role 'tool' must be a response "
                        "to a preceeding message with 'tool_calls'.",
                    )
                )
            elif tcid not in pending_ids:
                out.append(
                    Violation(
                        "openai",
                        "O3",
                        i,
                        f"Invalid parameter: 'tool_call_id' of '{tcid}' not found in 'tool_calls' of previous message.",
                    )
                )
            elif tcid in answered:
                out.append(
                    Violation(
                        "openai",
                        "O5",
                        i,
                        f"Invalid parameter: Duplicate value for 'tool_call_id' of '{tcid}' in message[{i}]",
                    )
                )
            else:
                answered.add(tcid)
            continue

        # any non-tool message ends the run of results
        close_run()
        if role == "assistant" and has_calls:
            pending_index = i
            pending_ids = [_call_id(c) for c in _calls(msg)]
            answered = set()

    close_run()
    return out


# --------------------------------------------------------------------------
# Mistral
# --------------------------------------------------------------------------

_MISTRAL_NEXT = {
    "system": {"user", "assistant", "system"},
    "user": {"assistant", "system", "user"},
    "assistant": {"assistant", "user", "tool"},
    "tool": {"assistant", "tool"},
}


def check_mistral(messages: Any) -> list[Violation]:
    """Mistral's message-structure validation (rules M1-M3).

    Real Mistral (La Plateforme, and vLLM in Mistral tokenizer mode) also
    requires tool call ids to be exactly 9 alphanumerics.  That rule is
    deliberately NOT enforced here: Open WebUI and the usual gateways rewrite
    ids on the way out, and the filter never invents ids.
    """
    out: list[Violation] = []
    if not isinstance(messages, list):
        return out
    prev: Optional[str] = None
    # current assistant "turn": opened by every assistant message
    turn_index: Optional[int] = None
    turn_ids: list = []
    responses = 0
    seen: set = set()

    def close_turn() -> None:
        nonlocal turn_index, turn_ids, responses, seen
        if len(turn_ids) != responses:
            # results before any assistant message are anchored at the first of them
            idx = turn_index if turn_index is not None else first_tool_index
            out.append(Violation("mistral", "M2", idx, "Not the same number of function calls and responses"))
        turn_index, turn_ids, responses, seen = None, [], 0, set()

    first_tool_index: Optional[int] = None
    for i, msg in enumerate(messages):
        role = _role(msg)
        if role == "developer":
            role = "system"
        if prev is not None and (prev not in _MISTRAL_NEXT or role not in _MISTRAL_NEXT[prev]):
            out.append(Violation("mistral", "M1", i, f"Unexpected role '{role}' after role '{prev}'"))
        elif prev is None and role not in _MISTRAL_NEXT:
            out.append(Violation("mistral", "M1", i, f"Unexpected role '{role}'"))
        if role == "assistant":
            close_turn()
            turn_index = i
            turn_ids = [_call_id(c) for c in _calls(msg)]
        elif role == "tool":
            if turn_index is None and first_tool_index is None:
                first_tool_index = i
            responses += 1
            tcid = msg.get("tool_call_id")
            if tcid not in turn_ids:
                out.append(Violation("mistral", "M3", i, f"Unexpected tool call id {tcid} in tool results"))
            elif tcid in seen:
                out.append(Violation("mistral", "M3", i, f"Duplicate tool call id {tcid} in tool results"))
            seen.add(tcid)
        prev = role if isinstance(role, str) else str(role)
    close_turn()
    return out


# --------------------------------------------------------------------------
# Anthropic
# --------------------------------------------------------------------------


def _anthropic_blocks(msg: dict, role: str) -> list[dict]:
    content = msg.get("content")
    blocks: list[dict] = []
    if role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": msg.get("tool_call_id"),
                "content": content_text(content),
            }
        ]
    if role == "assistant":
        text = content_text(content)
        if text:
            blocks.append({"type": "text", "text": text})
        for call in _calls(msg):
            _ok, value = _parse_args(_call_args(call))
            blocks.append(
                {
                    "type": "tool_use",
                    "id": _call_id(call),
                    "name": _call_name(call),
                    "input": value if isinstance(value, dict) else {},
                }
            )
        return blocks
    # user
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                blocks.append({"type": "text", "text": part})
            elif isinstance(part, dict):
                if part.get("type") == "text":
                    blocks.append({"type": "text", "text": part.get("text") or ""})
                elif part.get("type") == "image_url":
                    img = part.get("image_url")
                    url = img.get("url") if isinstance(img, dict) else img
                    blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def _anthropic_convert(messages: Any) -> tuple[str, list[dict], list[list[int]]]:
    """(system_text, turns, source index of every block of every turn)."""
    system: list[str] = []
    turns: list[dict] = []
    srcs: list[list[int]] = []
    if not isinstance(messages, list):
        return "", turns, srcs
    for i, msg in enumerate(messages):
        role = _role(msg)
        if role in ("system", "developer"):
            text = content_text(msg.get("content"))
            if text:
                system.append(text)
            continue
        if role not in ("user", "assistant", "tool"):
            continue
        blocks = _anthropic_blocks(msg, role)
        if not blocks:
            continue
        arole = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == arole:
            turns[-1]["content"].extend(blocks)
            srcs[-1].extend([i] * len(blocks))
        else:
            turns.append({"role": arole, "content": blocks})
            srcs.append([i] * len(blocks))
    return "\n\n".join(system), turns, srcs


def to_anthropic(messages: Any) -> tuple[str, list[dict]]:
    """Convert an OpenAI-style list the way a gateway does for Anthropic.

    System/developer messages are hoisted into the returned system text;
    ``tool`` messages become ``tool_result`` blocks in a user turn; assistant
    ``tool_calls`` become ``tool_use`` blocks after any text; consecutive turns
    of the same role are merged by concatenating their blocks.  An assistant
    message with empty text and no calls adds no block, and a turn with no
    block is left out.
    """
    system, turns, _ = _anthropic_convert(messages)
    return system, turns


def says_nothing(msg: Any) -> bool:
    """Whether a message has no content a strict provider counts: no text
    beyond whitespace, no part of another kind (image, refusal), no call."""
    if not isinstance(msg, dict) or _calls(msg):
        return False
    content = msg.get("content")
    if isinstance(content, list):
        return not any(
            not isinstance(p, dict) or p.get("type") != "text" or (isinstance(p.get("text"), str) and p["text"].strip())
            for p in content
        )
    return content is None or (isinstance(content, str) and not content.strip())


def _anthropic_empty_messages(messages: Any) -> list[Violation]:
    """A10: every user and assistant message has content, but the final assistant message."""
    out: list[Violation] = []
    if not isinstance(messages, list):
        return out
    for i, msg in enumerate(messages):
        if _role(msg) not in ("user", "assistant") or not says_nothing(msg):
            continue
        content = msg.get("content")
        blank = content_text(content) != "" or (isinstance(content, list) and content != [])
        if _role(msg) == "assistant" and i == len(messages) - 1:
            if blank:  # a final assistant message is a prefill: it may be empty, not whitespace
                out.append(
                    Violation(
                        "anthropic", "A10", i, "messages: final assistant content cannot end with trailing whitespace"
                    )
                )
            continue
        text = (
            "messages: text content blocks must contain non-whitespace text"
            if blank
            else "messages: all messages must have non-empty content except for the optional final assistant message"
        )
        out.append(Violation("anthropic", "A10", i, text))
    return out


def _anthropic_ids(messages: Any) -> list[Violation]:
    """A9: tool_use ids (and the ids results answer) match ``^[a-zA-Z0-9_-]+$``."""
    out: list[Violation] = []
    if not isinstance(messages, list):
        return out
    for i, msg in enumerate(messages):
        ids = [_call_id(c) for c in _calls(msg)]
        if _role(msg) == "tool":
            ids = [msg.get("tool_call_id")]
        for cid in ids:
            if isinstance(cid, str) and not _TOOL_USE_ID_RE.fullmatch(cid):
                field = "tool_result.tool_use_id" if _role(msg) == "tool" else "tool_use.id"
                out.append(
                    Violation(
                        "anthropic", "A9", i, f"messages.{i}: {field}: String should match pattern '^[a-zA-Z0-9_-]+$'"
                    )
                )
    return out


def check_anthropic(messages: Any) -> list[Violation]:
    """Rules A1-A10 on the turns :func:`to_anthropic` produces (A9, A10 on the messages)."""
    _system, turns, srcs = _anthropic_convert(messages)
    out: list[Violation] = _anthropic_ids(messages) + _anthropic_empty_messages(messages)
    first_src = srcs[0][0] if srcs else None
    if not turns:
        out.append(Violation("anthropic", "A5", None, "messages: at least one message is required"))
        return out
    if turns[0]["role"] != "user":
        out.append(Violation("anthropic", "A5", first_src, 'messages: first message must use the "user" role'))
    for k in range(1, len(turns)):
        if turns[k]["role"] == turns[k - 1]["role"]:
            out.append(
                Violation(
                    "anthropic",
                    "A6",
                    srcs[k][0],
                    'messages: roles must alternate between "user" and "assistant", but found '
                    f'multiple "{turns[k]["role"]}" roles in a row',
                )
            )

    a1_text = (
        "messages: `tool_use` ids were found without `tool_result` blocks immediately "
        "after: {ids}. Each `tool_use` block must have a corresponding `tool_result` "
        "block in the next message."
    )
    use_seen: set = set()
    for k, turn in enumerate(turns):
        blocks = turn["content"]
        for b, block in enumerate(blocks):
            if block.get("type") == "text" and not block.get("text"):
                out.append(Violation("anthropic", "A7", srcs[k][b], "messages: text content blocks must be non-empty"))
        if turn["role"] == "assistant":
            for b, block in enumerate(blocks):
                if block.get("type") != "tool_use":
                    continue
                bid = block.get("id")
                if bid in use_seen:
                    out.append(Violation("anthropic", "A4", srcs[k][b], "messages: `tool_use` ids must be unique"))
                use_seen.add(bid)
            # A8: a gateway must json-parse arguments into `input`
            for i in sorted(set(srcs[k])):
                msg = messages[i]
                for call in _calls(msg):
                    ok, _ = _parse_args(_call_args(call))
                    if not ok:
                        out.append(
                            Violation(
                                "anthropic",
                                "A8",
                                i,
                                "messages: tool_use.input: Input should be a valid dictionary "
                                f"(arguments of {_call_id(call)} are not a JSON object)",
                            )
                        )
            # A1 / A3: answered at the start of the very next user turn
            nxt = turns[k + 1]["content"] if k + 1 < len(turns) and turns[k + 1]["role"] == "user" else []
            leading: set = set()
            later: set = set()
            in_lead = True
            for block in nxt:
                if block.get("type") == "tool_result" and in_lead:
                    leading.add(block.get("tool_use_id"))
                else:
                    in_lead = False
                    if block.get("type") == "tool_result":
                        later.add(block.get("tool_use_id"))
            for b, block in enumerate(blocks):
                if block.get("type") != "tool_use":
                    continue
                bid = block.get("id")
                if bid in leading:
                    continue
                rule = "A3" if bid in later else "A1"
                out.append(Violation("anthropic", rule, srcs[k][b], a1_text.format(ids=bid)))
        else:
            prev_uses: set = set()
            if k > 0 and turns[k - 1]["role"] == "assistant":
                prev_uses = {bl.get("id") for bl in turns[k - 1]["content"] if bl.get("type") == "tool_use"}
            got: set = set()
            for b, block in enumerate(blocks):
                if block.get("type") != "tool_result":
                    continue
                rid = block.get("tool_use_id")
                if rid not in prev_uses:
                    out.append(
                        Violation(
                            "anthropic",
                            "A2",
                            srcs[k][b],
                            "messages: unexpected `tool_use_id` found in `tool_result` blocks: "
                            f"{rid}. Each `tool_result` block must have a corresponding "
                            "`tool_use` block in the previous message.",
                        )
                    )
                elif rid in got:
                    out.append(
                        Violation(
                            "anthropic",
                            "A4",
                            srcs[k][b],
                            f"messages: each `tool_use` must have a single result. Found "
                            f"multiple `tool_result` blocks with id: {rid}",
                        )
                    )
                got.add(rid)
    return out


# --------------------------------------------------------------------------
# Moonshot (Kimi); DeepSeek alike
# --------------------------------------------------------------------------


def check_moonshot(messages: Any) -> list[Violation]:
    """Rule K1: an assistant message without tool calls must say something
    (what a reply stopped before its first token leaves in a chat's history)."""
    if not isinstance(messages, list):
        return []
    return [
        Violation(
            "moonshot",
            "K1",
            i,
            f"Invalid request: the message at position {i} with role 'assistant' must not be empty",
        )
        for i, msg in enumerate(messages)
        if _role(msg) == "assistant" and says_nothing(msg)
    ]


# --------------------------------------------------------------------------
# Gemini
# --------------------------------------------------------------------------


def _gemini_convert(messages: Any) -> list[dict]:
    """Turns ``{"kind": "user"|"model"|"function", "parts": [...], "src": [...]}``.

    user/model turns merge with a neighbour of the same kind; consecutive tool
    messages merge into one function-response turn, which never merges with
    a user turn.
    """
    turns: list[dict] = []
    if not isinstance(messages, list):
        return turns
    names: dict = {}
    for i, msg in enumerate(messages):
        role = _role(msg)
        parts: list[dict] = []
        if role in ("system", "developer") or role not in ("user", "assistant", "tool"):
            continue
        if role == "user":
            kind = "user"
            content = msg.get("content")
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "image_url":
                        parts.append({"inline_data": part.get("image_url")})
                    elif isinstance(part, dict) and part.get("type") == "text":
                        parts.append({"text": part.get("text") or ""})
            elif isinstance(content, str):
                parts.append({"text": content})
        elif role == "assistant":
            kind = "model"
            text = content_text(msg.get("content"))
            if text:
                parts.append({"text": text})
            for call in _calls(msg):
                names[_call_id(call)] = _call_name(call)
                parts.append({"function_call": {"name": _call_name(call)}})
        else:
            kind = "function"
            parts.append(
                {
                    "function_response": {
                        "name": names.get(msg.get("tool_call_id"), ""),
                        "response": {"content": content_text(msg.get("content"))},
                    }
                }
            )
        if not parts:
            continue
        if turns and turns[-1]["kind"] == kind:
            turns[-1]["parts"].extend(parts)
            turns[-1]["src"].extend([i] * len(parts))
        else:
            turns.append({"kind": kind, "parts": parts, "src": [i] * len(parts)})
    return turns


def _n_calls(turn: Optional[dict]) -> int:
    if not turn or turn["kind"] != "model":
        return 0
    return sum(1 for p in turn["parts"] if "function_call" in p)


def check_gemini(messages: Any) -> list[Violation]:
    """Rules G1-G4 of Gemini (through its OpenAI-compatible layer)."""
    out: list[Violation] = []
    turns = _gemini_convert(messages)
    for k, turn in enumerate(turns):
        prev = turns[k - 1] if k > 0 else None
        nxt = turns[k + 1] if k + 1 < len(turns) else None
        calls = _n_calls(turn)
        if calls:
            call_src = next(s for p, s in zip(turn["parts"], turn["src"]) if "function_call" in p)
            if prev is None or prev["kind"] not in ("user", "function"):
                out.append(
                    Violation(
                        "gemini",
                        "G1",
                        call_src,
                        "Please ensure that function call turn comes immediately after a user "
                        "turn or after a function response turn.",
                    )
                )
            responses = len(nxt["parts"]) if nxt and nxt["kind"] == "function" else 0
            if responses != calls:
                out.append(
                    Violation(
                        "gemini",
                        "G3",
                        nxt["src"][0] if nxt and nxt["kind"] == "function" else call_src,
                        "Please ensure that the number of function response parts is equal to "
                        "the number of function call parts of the function call turn.",
                    )
                )
            for i in sorted(set(turn["src"])):
                for call in _calls(messages[i]):
                    ok, _ = _parse_args(_call_args(call))
                    if not ok:
                        out.append(
                            Violation(
                                "gemini",
                                "G4",
                                i,
                                "Invalid JSON payload received. function_call.args: arguments of "
                                f"{_call_id(call)} are not a JSON object",
                            )
                        )
        if turn["kind"] == "function" and not _n_calls(prev):
            out.append(
                Violation(
                    "gemini",
                    "G2",
                    turn["src"][0],
                    "Please ensure that function response turn comes immediately after a function call turn.",
                )
            )
    return out


# --------------------------------------------------------------------------
# comparing before/after
# --------------------------------------------------------------------------

CHECKERS = {
    "openai": check_openai,
    "mistral": check_mistral,
    "anthropic": check_anthropic,
    "gemini": check_gemini,
    "moonshot": check_moonshot,
}


def violations_added(
    before: Any,
    after: Any,
    providers: Iterable[str] = ("mistral", "anthropic", "gemini"),
) -> list[Violation]:
    """Violations the transformation ``before -> after`` created.

    Definition ("do not create a violation where there was none"): for each
    provider in ``providers`` (by default mistral, anthropic and gemini), if
    ``before`` has no violation for that provider, every violation of
    ``after`` for it is returned; if ``before`` already had at least one, that
    provider is skipped entirely (the filter is not asked to repair a list a
    provider rejected anyway).  OpenAI is not in the default set because the
    filter's output must be valid for OpenAI unconditionally: check that with
    ``check_openai(after) == []``; pass ``providers=(..., "openai")`` to
    apply the same relative rule to it.
    """
    out: list[Violation] = []
    for provider in providers:
        check = CHECKERS[provider]
        if not check(before):
            out.extend(check(after))
    return out
