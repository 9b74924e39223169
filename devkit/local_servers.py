"""What the local model servers behind Open WebUI answer, as plain functions for :mod:`devkit.fake_provider`.

Stdlib only; nothing here knows HTTP. Each function models one observable behaviour of one server, as read from
that server's source (LM Studio's from reports: its server is closed source):

* Ollama: :func:`ollama_chat_prompt` (``server/prompt.go`` ``chatPrompt``: which messages survive a prompt over
  ``num_ctx``), :func:`openai_messages` (its native messages counted as OpenAI's), the bodies of ``/api/tags``,
  ``/api/show``, ``/api/ps`` and the NDJSON lines of ``/api/chat``.
* llama-server: ``/props``, ``/slots``, the ``meta`` of its ``/v1/models`` entries, ``exceed_context_size_error``.
* LM Studio: its ``/api/v0/models`` entries and its refusal of a prompt over the loaded context.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, Optional

__all__ = [
    "OLLAMA_VERSION",
    "OLLAMA_TOO_LONG",
    "tool_block_start",
    "ollama_chat_prompt",
    "openai_messages",
    "ollama_tag",
    "ollama_show",
    "ollama_ps_entry",
    "ollama_chat_lines",
    "llamacpp_meta",
    "llamacpp_props",
    "llamacpp_slots",
    "llamacpp_too_long",
    "lmstudio_model",
    "lmstudio_too_long",
]

OLLAMA_VERSION = "0.30.1"  # the first that reports the cached prefix in prompt_eval_count too
# no number in it: Ollama does not say how long the prompt or the context is
OLLAMA_TOO_LONG = "the prompt is longer than the context length currently available to the model"
_MODIFIED = "2026-01-01T00:00:00Z"
_SIZE = 4_920_734_720
_PARAMS = 8_030_261_248


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, dict) else None


# --------------------------------------------------------------------------
# Ollama
# --------------------------------------------------------------------------


def tool_block_start(messages: list, index: int) -> int:
    """Where a prompt starting at ``index`` must start instead so that no tool result loses its call.

    A tool message (and the tool messages just before it) belongs to the assistant turn whose ``tool_calls``
    asked for it; a run of tool results without such a turn is left as it is."""
    if index <= 0 or index >= len(messages) or _role(messages[index]) != "tool":
        return index
    start = index
    while start > 0 and _role(messages[start - 1]) == "tool":
        start -= 1
    caller = start - 1
    if caller >= 0 and _role(messages[caller]) == "assistant" and messages[caller].get("tool_calls"):
        return caller
    return index


def ollama_chat_prompt(messages: list, fits: Callable[[list], bool]) -> tuple[list, int]:
    """(the messages Ollama keeps, how many it dropped) of a request: invariant "whole messages go, oldest first".

    It drops ever more messages from the front, keeping the system messages of the dropped part in front, until
    what is left ``fits``; a tool result never stays without its call; at least the last message (with the call
    it answers) stays even when it does not fit, and what happens then is the caller's business."""
    last = len(messages) - 1
    for index in range(len(messages)):
        start = tool_block_start(messages, index)
        systems = [m for m in messages[:start] if _role(m) == "system"]
        kept = systems + list(messages[start:])
        if index == last or fits(kept):
            return kept, start - len(systems)
    return [], 0


def _openai_call(call: Any, index: int) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return call
    arguments = fn.get("arguments")
    return {
        "id": call.get("id") or f"call_{index}",
        "type": "function",
        "function": {
            "name": fn.get("name", ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
        },
    }


def openai_messages(native: Any) -> Any:
    """Ollama's native chat messages in OpenAI's shape (arguments as JSON text, images as parts), for counting."""
    if not isinstance(native, list):
        return native
    out = []
    for msg in native:
        if not isinstance(msg, dict):
            out.append(msg)
            continue
        converted = {k: v for k, v in msg.items() if k not in ("tool_calls", "images")}
        calls = msg.get("tool_calls")
        if isinstance(calls, list) and calls:
            converted["tool_calls"] = [_openai_call(c, i) for i, c in enumerate(calls)]
        images = msg.get("images")
        if isinstance(images, list) and images:
            parts = [{"type": "text", "text": msg.get("content") or ""}]
            converted["content"] = parts + [{"type": "image_url", "image_url": {"url": "data:,"}} for _ in images]
        out.append(converted)
    return out


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _details() -> dict:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "8.0B",
        "quantization_level": "Q4_K_M",
    }


def ollama_tag(name: str) -> dict:
    """One model of ``GET /api/tags``: no context size in it."""
    return {
        "name": name,
        "model": name,
        "modified_at": _MODIFIED,
        "size": _SIZE,
        "digest": _digest(name),
        "details": _details(),
    }


def ollama_show(name: str, trained: Optional[int], modelfile_num_ctx: Optional[int]) -> dict:
    """``POST /api/show``: the trained size under ``<arch>.context_length``; ``num_ctx`` only when the Modelfile
    sets it (a server default, ``OLLAMA_CONTEXT_LENGTH`` or the memory-based one, shows nowhere here)."""
    parameters = 'stop                           "<|eot_id|>"'
    if modelfile_num_ctx:
        parameters = f"num_ctx                        {modelfile_num_ctx}\n" + parameters
    info: dict = {"general.architecture": "llama", "general.parameter_count": _PARAMS}
    if trained:
        info["llama.context_length"] = trained
    return {
        "license": "",
        "modelfile": f'# Modelfile generated by "ollama show"\nFROM {name}\n',
        "parameters": parameters,
        "template": "{{ .Prompt }}",
        "details": _details(),
        "model_info": info,
        "capabilities": ["completion", "tools"],
        "modified_at": _MODIFIED,
    }


def ollama_ps_entry(name: str, context_length: int, now: Optional[float] = None) -> dict:
    """One model of ``GET /api/ps``: the ``context_length`` it was LOADED with (the last request's ``num_ctx``)."""
    expires = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((now or time.time()) + 300)) + ".000000+00:00"
    return {**ollama_tag(name), "expires_at": expires, "size_vram": _SIZE, "context_length": context_length}


def ollama_chat_lines(
    model: str, content: str, tool_calls: Optional[list], prompt_eval_count: int, eval_count: int
) -> list:
    """The objects of an ``/api/chat`` answer, one NDJSON line each; the last (``done``) carries the counts."""
    created = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

    def line(message: dict, **extra: Any) -> dict:
        return {"model": model, "created_at": created, "message": {"role": "assistant", **message}, **extra}

    lines = []
    if tool_calls:
        native = [
            {
                "id": call["id"],
                "function": {
                    "index": i,
                    "name": call["function"]["name"],
                    "arguments": json.loads(call["function"]["arguments"]),
                },
            }
            for i, call in enumerate(tool_calls)
        ]
        lines.append(line({"content": "", "tool_calls": native}, done=False))
    else:
        words = content.split(" ")
        for i in range(0, len(words), 3):
            piece = " ".join(words[i : i + 3]) + (" " if i + 3 < len(words) else "")
            lines.append(line({"content": piece}, done=False))
    lines.append(
        line(
            {"content": ""},
            done=True,
            done_reason="stop",
            total_duration=1_000_000,
            load_duration=100_000,
            prompt_eval_count=prompt_eval_count,
            prompt_eval_duration=500_000,
            eval_count=eval_count,
            eval_duration=400_000,
        )
    )
    return lines


# --------------------------------------------------------------------------
# llama.cpp llama-server
# --------------------------------------------------------------------------


def llamacpp_meta(n_ctx_train: Optional[int]) -> dict:
    """The ``meta`` of a ``/v1/models`` entry: the TRAINED size, not the ``-c`` the server runs with."""
    return {
        "vocab_type": 2,
        "n_vocab": 128256,
        "n_ctx_train": n_ctx_train,
        "n_embd": 4096,
        "n_params": _PARAMS,
        "size": _SIZE,
    }


def _slot(index: int, n_ctx: Optional[int]) -> dict:
    return {"id": index, "n_ctx": n_ctx, "is_processing": False, "params": {"n_predict": -1, "temperature": 0.8}}


def llamacpp_props(model: str, n_ctx: Optional[int], slots: int = 1) -> dict:
    """``GET /props``: ``default_generation_settings`` is the first slot's, so its ``n_ctx`` is the served size."""
    return {
        "default_generation_settings": _slot(0, n_ctx),
        "total_slots": slots,
        "model_alias": model,
        "model_path": f"/models/{model}.gguf",
        "modalities": {"vision": False, "audio": False},
        "build_info": "b7000-fake",
    }


def llamacpp_slots(n_ctx: Optional[int], slots: int = 1) -> list:
    """``GET /slots``: one entry per slot (``-np N``), each with its own ``n_ctx``."""
    return [_slot(i, n_ctx) for i in range(slots)]


def llamacpp_too_long(n_prompt: int, n_ctx: int, numbers: bool = True) -> dict:
    """The 400 body of a prompt over ``n_ctx``; builds before late 2025 left the sizes out of the message."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
        if numbers
        else "the request exceeds the available context size, try increasing it"
    )
    return {
        "error": {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt,
            "n_ctx": n_ctx,
        }
    }


# --------------------------------------------------------------------------
# LM Studio
# --------------------------------------------------------------------------


def lmstudio_model(name: str, loaded: Optional[int], maximum: Optional[int]) -> dict:
    """One model of ``GET /api/v0/models``: ``loaded_context_length`` only while loaded."""
    entry = {
        "id": name,
        "object": "model",
        "type": "llm",
        "publisher": "fake",
        "arch": "llama",
        "compatibility_type": "gguf",
        "quantization": "Q4_K_M",
        "state": "loaded" if loaded else "not-loaded",
        "max_context_length": maximum,
    }
    if loaded:
        entry["loaded_context_length"] = loaded
    return entry


def lmstudio_too_long(n_prompt: int, n_ctx: int) -> dict:
    """LM Studio's refusal (seen in reports, not in its source, which is closed) of a prompt over the context."""
    return {
        "error": f"Trying to keep the first {n_prompt} tokens when context the overflows. However, the model is "
        f"loaded with context length of only {n_ctx} tokens, which is not enough. Try to load the model with a "
        "larger context length, or provide a shorter input"
    }
