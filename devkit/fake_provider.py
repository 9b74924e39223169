"""A strict fake OpenAI-compatible model server for tests and demos.

Stdlib only.  ``FakeProvider().start()`` serves, on a background thread,

* ``GET  /v1/models``            every chat and summary model (OpenAI list format)
* ``POST /v1/chat/completions``  JSON, or SSE with ``"stream": true``
* ``GET  /health``               ``{"status": "ok"}``
* ``GET  /control``              the current configuration
* ``POST /control``              JSON with any of summary_delay, summary_fail,
                                 chat_delay, context_window, reply_text,
                                 summary_format
                                 (a key given as null resets that setting)
* ``GET  /control/requests``     the request log (see :attr:`FakeProvider.requests`)
* ``POST /control/clear``        empty the request log

and, for the models served as a local server serves them (``ModelSpec.backend``; each path answers 404 when no
model of its kind is served, or when switched off with ``probes_off``):

* Ollama (:func:`ollama_spec`): ``GET /api/tags``, ``GET /api/version``, ``POST /api/show`` (trained size),
  ``GET /api/ps`` (the LOADED context: a model is loaded by its first request unless ``preloaded``), and
  ``POST /api/chat`` (its native API, NDJSON when streamed, ``prompt_eval_count`` in the last line)
* llama-server (:func:`llamacpp_spec`): ``GET /props`` (``default_generation_settings.n_ctx``), ``GET /slots``,
  ``meta.n_ctx_train`` in ``/v1/models`` (the trained size, which may be far above the served one)
* LM Studio (:func:`lmstudio_spec`): ``GET /api/v0/models`` (``loaded_context_length``, ``max_context_length``)

Every chat-completion request is validated with
:func:`devkit.provider_rules.check_openai`; a violation is answered with HTTP
400 and OpenAI's error body carrying the provider's own text.  With a
``context_window`` a prompt that is too long is answered 400
``context_length_exceeded``.

Models that enforce other providers' rules too (``model_rules``: model ->
names of :data:`devkit.provider_rules.CHECKERS`, e.g. ``("anthropic",
"moonshot")`` for a model reached through a gateway to Claude, or Kimi):
their requests are also checked with those rules and a violation answered
400 with that provider's text (tool-call ids outside ``[a-zA-Z0-9_-]``,
messages that say nothing, ``tool -> user`` for ``"mistral"``, ...).

Models with their own tokenizer and window (``model_specs``, see
:class:`ModelSpec`): their prompt is counted in the model's own tokens
(``ratio`` x the cl100k count of messages and tool schemas), reported back
as usage (OpenAI's ``prompt_tokens`` or Ollama's ``prompt_eval_count``, in
JSON replies and in SSE), and a prompt over the window is either refused
with the backend's 400 (``on_overflow="reject"``: vLLM's, the reply's
``max_tokens`` counted in; llama-server's ``exceed_context_size_error``;
LM Studio's), or shortened as Ollama does (``on_overflow="drop"``: whole
messages from the front, see :func:`devkit.local_servers.ollama_chat_prompt`,
the model then answers what was kept), or cut to its last tokens
(``on_overflow="cut"``, which no real server does to several messages).  Each
request's log entry says ``model_tokens``, ``window``, ``over_window``,
``cut``, ``dropped`` (messages) and ``rejected``;
:meth:`FakeProvider.window_events` adds them up, :attr:`FakeProvider.probes`
lists the probe requests.  A spec may publish its window in its ``/v1/models`` entry under one
provider's field (``publish``, e.g. ``"max_model_len"`` as vLLM,
``"meta.n_ctx_train"`` as llama.cpp) and reject in vLLM's old flat error shape
or in the nested ``{"error": {...}}`` shape of OpenAI and current vLLM
(``error_shape``).

Summary requests (model in ``summary_models``, or a system message containing
"running summary") get a deterministic summary: in strict mode one that
repeats every ``MK-<alnum>`` marker of the input, first seen first; in
friendly mode (the demo's) an extractive one, a numbered line per message it
covers with that message's first sentence, names and numbers, carried forward
from round to round, plus the sentences the user's ``/summarize`` instructions
name (``summary_format`` switches either way; ``"lossy"`` keeps only half of the
facts it is shown, the sentences naming a value like ``QK-4471``, chosen by a
hash of the value: see :func:`lossy_summary`).  Chat requests get a
deterministic echo of the message count and of the markers found in system
messages holding ``<conversation_summary``; ``CALL_TOOL:<name>`` in the last
user message of a request with ``tools`` yields a tool call; ``CALL_TOOL_ROUNDS:<name>:<n>`` there makes an agent that
calls the tool in ``n`` rounds, one at a time (arguments ``{"round": k}``, k one more than the highest round among the
calls after that message), then answers.

Run standalone: ``python -m devkit.fake_provider --port 8099 --mode friendly``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from devkit import local_servers as local  # type: ignore
    from devkit.provider_rules import CHECKERS, check_openai, content_text  # type: ignore
    from devkit.tiktoken_cache import CL100K_URL, cl100k_cache_path, ensure_offline_cl100k  # type: ignore
else:
    from . import local_servers as local
    from .provider_rules import CHECKERS, check_openai, content_text
    from .tiktoken_cache import CL100K_URL, cl100k_cache_path, ensure_offline_cl100k

__all__ = [
    "FakeProvider",
    "ModelSpec",
    "ollama_spec",
    "llamacpp_spec",
    "lmstudio_spec",
    "count_tokens",
    "model_tokens",
    "token_counter_name",
    "find_markers",
    "extractive_summary",
    "lossy_summary",
    "lossy_keeps",
    "FACT_VALUE_RE",
    "MARKER_RE",
]

MARKER_RE = re.compile(r"\bMK-[A-Za-z0-9]+\b")
SUMMARY_PHRASE = "running summary"
SUMMARY_FAILS = (None, "500", "timeout", "empty", "reasoning")
MODES = ("strict", "friendly")
_CALL_TOOL_RE = re.compile(r"CALL_TOOL:([A-Za-z0-9_-]{1,64})")
_CALL_TOOL_ROUNDS_RE = re.compile(r"CALL_TOOL_ROUNDS:([A-Za-z0-9_-]{1,64}):(\d{1,3})")
_UNSET: Any = object()
# what each local server publishes about its window; each can be switched off (404) with ``probes_off``
PROBES = {
    "/api/tags": "ollama",
    "/api/version": "ollama",
    "/api/show": "ollama",
    "/api/ps": "ollama",
    "/props": "llamacpp",
    "/slots": "llamacpp",
    "/api/v0/models": "lmstudio",
}
_IMAGE_TOKENS = 85  # what OpenAI charges for a low-detail image

# --------------------------------------------------------------------------
# token counting
# --------------------------------------------------------------------------

_encoder_lock = threading.Lock()
_encoder: Any = _UNSET


def _load_encoder() -> Any:
    """cl100k_base if it loads from a local file, else None (never the network)."""
    try:
        import hashlib
        import tempfile

        try:
            ensure_offline_cl100k()
        except Exception:
            pass
        if os.environ.get("TIKTOKEN_CACHE_DIR"):
            blob = cl100k_cache_path(os.environ["TIKTOKEN_CACHE_DIR"])
        else:  # tiktoken's own default cache location
            blob = os.path.join(
                os.environ.get("DATA_GYM_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "data-gym-cache"),
                hashlib.sha1(CL100K_URL.encode()).hexdigest(),
            )
        if not os.path.isfile(blob):
            return None
        import tiktoken

        return tiktoken.get_encoding("cl100k_base")
    except Exception:
        return None


def _get_encoder() -> Any:
    global _encoder
    with _encoder_lock:
        if _encoder is _UNSET:
            _encoder = _load_encoder()
        return _encoder


def token_counter_name() -> str:
    """``"tiktoken:cl100k_base"`` or ``"chars/4"``: what :func:`count_tokens` uses."""
    return "tiktoken:cl100k_base" if _get_encoder() is not None else "chars/4"


def _message_pieces(msg: Any) -> tuple[list[str], int]:
    """(strings to tokenize, fixed extra tokens) of one message."""
    if not isinstance(msg, dict):
        return [json.dumps(msg, default=str)], 0
    pieces: list[str] = []
    extra = 0
    role = msg.get("role")
    if isinstance(role, str):
        pieces.append(role)
    content = msg.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                extra += _IMAGE_TOKENS
    text = content_text(content)
    if text:
        pieces.append(text)
    name = msg.get("name")
    if isinstance(name, str) and name:
        pieces.append(name)
        extra += 1
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                for key in ("name", "arguments"):
                    if isinstance(fn.get(key), str):
                        pieces.append(fn[key])
    if isinstance(msg.get("tool_call_id"), str):
        pieces.append(msg["tool_call_id"])
    return pieces, extra


def count_tokens(messages: Any) -> int:
    """Prompt tokens the OpenAI way: 3 per message + its text + 3 for the reply priming.

    Text is counted with cl100k_base when it loads offline, else as
    ``len(text) // 4`` per message.  ``tools`` definitions are not counted.
    """
    if not isinstance(messages, list):
        return 0
    enc = _get_encoder()
    total = 3
    for msg in messages:
        pieces, extra = _message_pieces(msg)
        total += 3 + extra
        if enc is not None:
            total += sum(len(enc.encode(p, disallowed_special=())) for p in pieces)
        else:
            total += len("".join(pieces)) // 4
    return total


def tools_tokens(tools: Any) -> int:
    """cl100k tokens of the tool schemas as JSON (chars/4 without the file)."""
    if not tools:
        return 0
    text = json.dumps(tools, separators=(",", ":"), sort_keys=True)
    enc = _get_encoder()
    return len(enc.encode(text, disallowed_special=())) if enc is not None else len(text) // 4


BACKENDS = ("", "ollama", "llamacpp", "lmstudio")
OVERFLOWS = ("reject", "cut", "drop")


@dataclass(frozen=True)
class ModelSpec:
    """A chat model with a tokenizer and a window of its own, served as one kind of server serves it.

    ratio: its tokens per cl100k token (Llama/Qwen/Mistral-like: 0.7-1.5).
    window: its context window in its own tokens (None: unlimited): vLLM's ``max_model_len``; Ollama's configured
    ``num_ctx`` (Modelfile, ``OLLAMA_CONTEXT_LENGTH`` or the default), used when a request sends none;
    llama-server's served ``n_ctx`` per slot (``-c``); LM Studio's ``loaded_context_length``.
    on_overflow: "reject" (400 with the backend's own error), "drop" (Ollama's ``chatPrompt``: whole messages
    dropped from the front, see :func:`devkit.local_servers.ollama_chat_prompt`) or "cut" (the whole prompt cut
    to its last ``window`` tokens and reported as exactly the window: no real server does this to a prompt of
    several messages; kept for the tests written against it).
    usage: "openai" (``usage.prompt_tokens``) or "ollama"
    (``usage.prompt_eval_count``/``eval_count``, always, streams included).
    per_message: extra tokens of its chat template per message (the ratio is
    then not the same for every request, as with real templates).
    publish: the field of its ``/v1/models`` entry that holds its window, a
    dotted path for nested ones ("" = published nowhere).
    error_shape: "flat" (vLLM before 0.10: ``{"object": "error", "message"}``)
    or "nested" (OpenAI, current vLLM: ``{"error": {"message", ...}}``).
    backend: "" (vLLM / any OpenAI-compatible server), "ollama", "llamacpp" or "lmstudio": which probe endpoints
    list the model, what its ``/v1/models`` entry holds and which error text a rejection carries.
    trained: the size it was trained for (Ollama's ``/api/show``, llama-server's ``meta.n_ctx_train``, LM Studio's
    ``max_context_length``); None: the window. Ollama never serves more than it: a larger ``num_ctx`` is lowered.
    preloaded: loaded before the first request (Ollama's ``/api/ps`` lists a model only once loaded; LM Studio
    says ``not-loaded`` until then).
    too_long: what Ollama does when the last message alone does not fit: "cut" (its tokens) or "error" (400).
    numbers: llama-server names the sizes in its message (builds from late 2025 on) or not (older builds).
    in_modelfile: Ollama's ``/api/show`` lists ``num_ctx`` among the model's parameters (set in its Modelfile).
    """

    ratio: float = 1.0
    window: Optional[int] = None
    on_overflow: str = "reject"
    usage: str = "openai"
    per_message: int = 0
    publish: str = ""
    error_shape: str = "flat"
    backend: str = ""
    trained: Optional[int] = None
    preloaded: bool = False
    too_long: str = "cut"
    numbers: bool = True
    in_modelfile: bool = False

    def __post_init__(self) -> None:
        if self.on_overflow not in OVERFLOWS:
            raise ValueError(f"on_overflow must be one of {OVERFLOWS}")
        if self.usage not in ("openai", "ollama"):
            raise ValueError("usage must be 'openai' or 'ollama'")
        if not self.ratio > 0:
            raise ValueError("ratio must be > 0")
        if self.error_shape not in ("flat", "nested"):
            raise ValueError("error_shape must be 'flat' or 'nested'")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        if self.too_long not in ("cut", "error"):
            raise ValueError("too_long must be 'cut' or 'error'")

    @property
    def trained_size(self) -> Optional[int]:
        return self.trained if self.trained is not None else self.window

    def num_ctx(self, requested: Any = None) -> Optional[int]:
        """Ollama's window for a request: its ``options.num_ctx``, else the configured one, never above trained."""
        size = requested if isinstance(requested, int) and requested > 0 else self.window
        if size is None or self.trained is None:
            return size
        return min(size, self.trained)

    def published(self) -> dict:
        """The fields its ``/v1/models`` entry adds: the window under ``publish``; llama-server's ``meta``."""
        if self.backend == "llamacpp":
            return {"owned_by": "llamacpp", "meta": local.llamacpp_meta(self.trained_size)}
        if self.backend == "ollama":
            return {"owned_by": "library"}
        if self.backend == "lmstudio":
            return {"owned_by": "organization_owner"}
        if not self.publish or self.window is None:
            return {}
        *outer, last = self.publish.split(".")
        entry: dict = {last: self.window}
        for key in reversed(outer):
            entry = {key: entry}
        return entry


def ollama_spec(window: int, **fields: Any) -> ModelSpec:
    """An Ollama model: drops whole messages to fit ``num_ctx`` (``window`` when the request sends none)."""
    return ModelSpec(window=window, backend="ollama", on_overflow="drop", **fields)


def llamacpp_spec(n_ctx: int, **fields: Any) -> ModelSpec:
    """A llama-server model served with ``-c n_ctx``: 400 ``exceed_context_size_error`` when a prompt is over."""
    return ModelSpec(window=n_ctx, backend="llamacpp", on_overflow="reject", **fields)


def lmstudio_spec(loaded: int, **fields: Any) -> ModelSpec:
    """An LM Studio model loaded with ``loaded`` tokens of context: refuses a prompt over it."""
    return ModelSpec(window=loaded, backend="lmstudio", on_overflow="reject", **fields)


def model_tokens(messages: Any, tools: Any, spec: ModelSpec) -> int:
    """The prompt in ``spec``'s own tokens: messages and tool schemas."""
    base = count_tokens(messages) + tools_tokens(tools)
    count = len(messages) if isinstance(messages, list) else 0
    return int(round(base * spec.ratio)) + spec.per_message * count


def _reply_room(body: dict) -> int:
    """The tokens a request reserves for its reply (vLLM adds them to the prompt)."""
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    for value in (body.get("max_tokens"), body.get("max_completion_tokens"), options.get("num_predict")):
        if isinstance(value, int) and value > 0:
            return value
    return 0


# --------------------------------------------------------------------------
# deterministic replies
# --------------------------------------------------------------------------


def _all_texts(msg: Any) -> list[str]:
    if not isinstance(msg, dict):
        return []
    out = [content_text(msg.get("content"))]
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                out.append(fn["arguments"])
    return out


def find_markers(messages: Any, predicate: Optional[Callable[[dict], bool]] = None) -> list[str]:
    """Every ``MK-`` marker in ``messages`` (those matching ``predicate``), deduplicated."""
    seen: dict = {}
    for msg in messages if isinstance(messages, list) else []:
        if predicate is not None and not (isinstance(msg, dict) and predicate(msg)):
            continue
        for text in _all_texts(msg):
            for m in MARKER_RE.findall(text):
                seen.setdefault(m, None)
    return list(seen)


def _first_sentence(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    m = re.search(r"(?<=[.!?])\s", text)
    sentence = text[: m.start()] if m else text
    return sentence if len(sentence) <= limit else sentence[: limit - 1] + "…"


def _is_summary_holder(msg: dict) -> bool:
    return msg.get("role") in ("system", "developer") and "<conversation_summary" in content_text(msg.get("content"))


def _summary_text(messages: list, mode: str) -> str:
    lines = [f"Summary of {len(messages)} messages."]
    if mode == "friendly":
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                gist = _first_sentence(content_text(msg.get("content")))
                if gist:
                    lines.append(f"- {gist}")
    markers = find_markers(messages)
    if markers:
        lines.append("Markers: " + " ".join(markers))
    return "\n".join(lines)


# -- the extractive summary (the demo's): what a reader can check line by line ------------------

SUMMARY_FORMATS = ("markers", "extractive", "lossy")
# the filter's summarizer prompt (async_context_compression.build_summarizer_messages): previous summary, new blocks,
# then the user's instructions
_PREVIOUS = "Previous summary:\n"
_NEW = "\n\nNew messages to fold in:\n"
_INSTRUCTIONS_RE = re.compile(r"<user_instructions>\s*(.*?)\s*</user_instructions>", re.DOTALL)
# one rendered message: "[#id] role (name):", "[#id] tool result of f:", "(part k of n) [#id] user continued:"
_BLOCK_HEAD = (
    r"(?:\(part (\d+) of \d+\) )?(?:\[#[^\]\n]*\] )?(user|assistant|tool|system|developer)"
    r"(?: \([^)\n]*\))?(?: result of ([^\n:]*))?(?: continued)?:"
)
_BLOCK_HEAD_RE = re.compile(_BLOCK_HEAD + r"[ \t]*\n?")
_BLOCK_START_RE = re.compile(r"(?:\A|\n\n)(?=" + _BLOCK_HEAD + r")")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?。！？])\s+")
# a name: a capitalized word inside a sentence, or any word with two capitals (MK-ab12, API); a number: digits
_FACT_RE = re.compile(r"(?<![\w-])(?:[A-Z][\w'’-]*[A-Z0-9][\w'’-]*|[A-Z][a-z][\w'’-]*|[\w-]*\d[\w,./:-]*\w|\d)")
_NOT_NAMES = frozenset({"I", "I'm", "I’m", "I'll", "I've", "OK"})
_STOP_WORDS = frozenset(
    "keep only also focus please summary summarize summarise mention include about what which with from that this "
    "those these them they their then than into onto over under every each more most less least just make sure".split()
)
_SUMMARY_HEAD_RE = re.compile(r"^Summary of (\d+) messages?\.", re.MULTILINE)
_MESSAGE_LINE_RE = re.compile(r"^(\d+)\. (.+)$", re.MULTILINE)
_KEPT_LINE_RE = re.compile(r"^- (.+) \(message (\d+)\)$", re.MULTILINE)


def _sentences(text: str) -> list:
    return [s for s in _SENTENCE_END_RE.split(" ".join(text.split())) if s]


def _facts(text: str) -> list:
    """Every name and number of ``text``, first seen first: capitalized words that do not open a sentence, words
    with two capitals or a digit, numbers."""
    found: dict = {}
    for sentence in _sentences(text):
        for m in _FACT_RE.finditer(sentence):
            word = m.group(0).rstrip(".,:;")
            before = MARKER_RE.sub("", sentence[: m.start()]).rstrip()  # a marker before a word opens nothing
            opens = (not before or before[-1] in ".!?:;\"“'‘(") and not re.search(r"\d|[A-Z].*[A-Z]", word)
            if word and not opens and word not in _NOT_NAMES:
                found.setdefault(word, None)
    return list(found)


def _keywords(instructions: str) -> list:
    """The words an instruction names ("keep the budget and the dates" -> budget, date), as stems."""
    words = re.findall(r"[^\W\d_]{4,}", instructions.lower()) + re.findall(r"[\u4e00-\u9fff]{2,}", instructions)
    stems = [w[:-1] if w.endswith("s") and len(w) > 4 else w for w in words if w not in _STOP_WORDS]
    return list(dict.fromkeys(stems))


def _parse_blocks(text: str) -> list:
    """The filter's rendered messages -> [(role, tool, text)]; a continued piece of a long message joins its first."""
    out: list = []
    text = text.strip()
    starts = [m.end() for m in _BLOCK_START_RE.finditer(text)]
    for chunk in (text[a:b].rstrip("\n") for a, b in zip(starts, starts[1:] + [len(text)])):
        m = _BLOCK_HEAD_RE.match(chunk)
        if m is None:
            continue
        part, role, tool, body = m.group(1), m.group(2), m.group(3), chunk[m.end() :]
        if part and part != "1" and out:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + " " + body)
        else:
            out.append((role, tool, body))
    return out


def _summary_request(messages: list) -> tuple:
    """(previous summary, [(role, tool, text)] of the messages to fold in, the user's instructions) of a request:
    the filter's own prompt read apart, any other request taken message by message."""
    last = content_text(messages[-1].get("content")) if messages and isinstance(messages[-1], dict) else ""
    found = _INSTRUCTIONS_RE.search(last)  # the filter puts them last in its request, as the user's words
    instructions = found.group(1) if found else ""
    last = last[: found.start()] if found else last
    if last.startswith(_PREVIOUS) and _NEW in last:
        previous, new = last[len(_PREVIOUS) :].split(_NEW, 1)
        return ("" if previous.strip() == "(none yet)" else previous.strip()), _parse_blocks(new), instructions
    plain = [m for m in messages if isinstance(m, dict) and m.get("role") not in ("system", "developer")]
    return "", [(m.get("role"), None, " ".join(_all_texts(m))) for m in plain], instructions


def _message_line(role: str, tool: Optional[str], text: str, named: set, clip: int) -> str:
    """One folded message: who, its first sentence, then its names and numbers not said before in the summary."""
    text = re.sub(r"^-> calls ", "calls ", text.strip(), flags=re.MULTILINE)
    first = _first_sentence(text, clip) if text.strip() else "(no text)"
    new = [f for f in _facts(text) if f not in named and f not in first]
    named.update(_facts(text))
    who = f"{role} ({tool.strip()})" if tool else role
    facts = ", ".join(new)
    facts = facts if len(facts) <= 2 * clip else facts[: 2 * clip - 1] + "…"  # shortened with the lines
    return f"{who}: {first}" + (f" [{facts}]" if facts else "")


def extractive_summary(messages: list, max_tokens: int = 0) -> str:
    """An honest summary a fake can write: every message it covers as one numbered line (its first sentence, then
    every name and number it adds), the lines of the previous summary carried forward, so "Summary of N messages"
    shows N lines; with the user's instructions, the sentences that name what they ask for, kept whole. Lines are
    shortened, never dropped, to stay near ``max_tokens``; every MK- marker shown stays."""
    previous, blocks, instructions = _summary_request(messages)
    carried = [m.group(2) for m in _MESSAGE_LINE_RE.finditer(previous)] if _SUMMARY_HEAD_RE.search(previous) else []
    earlier = previous if previous and not carried else ""  # a summary not written here (Open WebUI's own)
    keywords = _keywords(instructions)
    kept: dict = {}
    for text, at in ((m.group(1), int(m.group(2))) for m in _KEPT_LINE_RE.finditer(previous)):
        if any(k in text.lower() for k in keywords):
            kept.setdefault(text, at)
    texts = [re.sub(r"^[^:]*: | \[[^\]]*\]$", "", line) for line in carried] + [text for _, _, text in blocks]
    for n, text in enumerate(texts, 1):  # what earlier rounds folded too: instructions given later apply to it
        for sentence in _sentences(text):
            said = any(k[:40] in sentence or sentence[:40] in k for k in kept)  # a reply quoting it, say
            if not said and any(k in sentence.lower() for k in keywords):
                kept.setdefault(sentence, n)
    kept = dict(sorted(kept.items(), key=lambda item: item[1]))
    markers = find_markers(messages)
    for clip in (160, 100, 60, 30):
        named: set = set()
        for line in carried:
            named.update(_facts(line))
        lines = [f"Summary of {len(carried) + len(blocks)} message{'' if len(carried) + len(blocks) == 1 else 's'}."]
        if earlier:
            lines.append(f"Earlier summary: {_first_sentence(earlier, clip)}")
        if kept:  # each part a paragraph of its own, so Markdown renders two lists, not one
            lines += ["", f'Kept as asked ("{_first_sentence(instructions, 120)}"):']
            lines += [f"- {_first_sentence(text, max(clip, 120))} (message {at})" for text, at in kept.items()]
        lines += ["", "Messages:"]
        lines += [
            f"{n}. {line if len(line) <= clip + 60 else line[: clip + 59] + '…'}" for n, line in enumerate(carried, 1)
        ]
        lines += [
            f"{n}. {_message_line(role, tool, text, named, clip)}"
            for n, (role, tool, text) in enumerate(blocks, len(carried) + 1)
        ]
        text = "\n".join(lines)
        if not max_tokens or len(text) // 4 <= max_tokens:
            break
    unseen = [m for m in markers if m not in text]
    return text + ("\nMarkers: " + " ".join(unseen) if unseen else "")


# -- the lossy summary: a summarizer that keeps only part of what it reads, as real ones do ------------------------

FACT_VALUE_RE = re.compile(r"\b[A-Z]{2}-\d{4}\b")  # a fact's value: QK-4471 (an MK- marker has hex after the dash)


def lossy_keeps(value: str) -> bool:
    """Whether the lossy summary keeps a fact holding ``value``: half of all values, fixed by a hash of the value."""
    return hashlib.blake2b(value.encode(), digest_size=2).digest()[0] % 2 == 0


def lossy_summary(messages: list) -> str:
    """A summary that keeps only the facts (sentences naming a value like QK-4471) whose values ``lossy_keeps``, with
    the facts of the previous summary; the rest of what it read is one line of topics."""
    previous, blocks, _ = _summary_request(messages)
    kept = [line for line in previous.splitlines() if line.startswith("- ")]
    for _, _, text in blocks:
        for sentence in _sentences(text):
            values, line = FACT_VALUE_RE.findall(sentence), f"- {sentence}"
            if values and all(lossy_keeps(v) for v in values) and line not in kept:
                kept.append(line)
    return "\n".join(["Summary: the team went over operations, travel and suppliers.", *kept])


def _chat_text(messages: list, mode: str) -> str:
    markers = find_markers(messages, _is_summary_holder)
    has_summary = any(isinstance(m, dict) and _is_summary_holder(m) for m in messages)
    if mode == "friendly":
        last_user = next(
            (
                content_text(m.get("content"))
                for m in reversed(messages)
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )
        gist = _first_sentence(last_user, 120)
        text = "Happy to help with that. "
        if gist:
            text += f'You asked: "{gist}" '
        text += (
            f"I'm a fake model, so here is a friendly placeholder answer; I can see "
            f"{len(messages)} message{'' if len(messages) == 1 else 's'}"
        )
        text += " and a conversation summary." if has_summary else "."
        return text
    return f"[fake-chat] {len(messages)} messages; summary markers: " + (" ".join(markers) if markers else "none")


def _tool_call_request(body: dict, messages: list) -> Optional[str]:
    """The tool name to call, when the request asks for one."""
    if not body.get("tools") or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None  # after a tool result the model answers text
    m = _CALL_TOOL_RE.search(content_text(last.get("content")))
    return m.group(1) if m else None


def _agent_round(body: dict, messages: list) -> Optional[tuple[str, int]]:
    """(tool name, round) of an agent asked for ``CALL_TOOL_ROUNDS:<name>:<n>`` whose rounds are not done yet."""
    if not body.get("tools"):
        return None
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1)
    if last_user < 0:
        return None
    m = _CALL_TOOL_ROUNDS_RE.search(content_text(messages[last_user].get("content")))
    if not m:
        return None
    done = 0
    for msg in messages[last_user + 1 :]:
        for call in (msg.get("tool_calls") or []) if isinstance(msg, dict) else []:
            try:
                done = max(done, int(json.loads(call["function"]["arguments"]).get("round", 0)))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    return (m.group(1), done + 1) if done < int(m.group(2)) else None


class RequestLog(list):
    """The request log as it was when read, each entry copied as it is read: a test reading the tail of a long log
    (``provider.requests[start:]``, polled ten times a second) copies only that, not the whole log each time."""

    def __init__(self, entries, lock):
        super().__init__(entries)
        self._lock = lock

    def _copy(self, entry: dict) -> dict:
        with self._lock:  # a request being handled still changes its entry
            return copy.deepcopy(entry)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return RequestLog(super().__getitem__(index), self._lock)
        return self._copy(super().__getitem__(index))

    def __iter__(self):
        return (self._copy(entry) for entry in super().__iter__())

    def __reversed__(self):
        return (self._copy(entry) for entry in super().__reversed__())


def _chat_delay(cfg: dict, messages: list) -> Optional[float]:
    """Seconds a chat request waits before its answer: ``chat_delay``, or longer where ``hold`` names its last user
    message's text."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    last = str(users[-1].get("content") or "") if users else ""
    if cfg["hold"] and cfg["hold"][0] in last:
        return max(cfg["chat_delay"] or 0.0, cfg["hold"][1])
    return cfg["chat_delay"]


def _probe_paths(value: Any) -> tuple:
    """``probes_off`` checked: paths of PROBES, or "all" for every probe that tells a window."""
    if value is None:
        return ()
    if value == "all":
        return tuple(p for p in PROBES if p not in ("/api/tags", "/api/version"))
    paths = (value,) if isinstance(value, str) else tuple(value)
    unknown = [p for p in paths if p not in PROBES]
    if unknown:
        raise ValueError(f"probes_off: unknown paths {unknown}; known: {sorted(PROBES)}")
    return paths


def _error_message(payload: dict) -> str:
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("message"))
    return str(error if error is not None else payload.get("message"))


def _reject_for(spec: ModelSpec, own: int, window: int, room: int) -> Optional[tuple[int, dict]]:
    """(status, body) of the backend's refusal of ``own`` prompt tokens (``room`` for the reply), or None."""
    if spec.backend == "llamacpp":  # the prompt must leave at least one token for the reply
        return (400, local.llamacpp_too_long(own, window, spec.numbers)) if own >= window else None
    if spec.backend == "lmstudio":
        return (400, local.lmstudio_too_long(own, window)) if own > window else None
    if own + room <= window:
        return None
    error = {
        "message": f"This model's maximum context length is {window} tokens. However, you "
        f"requested {own + room} tokens ({own} in the messages, {room} in the completion). "
        "Please reduce the length of the messages or completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    return 400, {"error": error} if spec.error_shape == "nested" else {"object": "error", **error}


def _fit(spec: ModelSpec, messages: Any, body: dict, native: bool) -> dict:
    """What ``spec``'s server does with this prompt. Keys: model_tokens (the whole prompt), window, over_window,
    kept (the messages the model sees), dropped (messages), cut (anything lost), reported (the prompt size it
    reports), reject ((status, body) or None)."""
    tools = body.get("tools")
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    own = model_tokens(messages, tools, spec)
    out = {"model_tokens": own, "window": spec.window, "over_window": False, "kept": messages, "dropped": 0}
    out.update(cut=False, reported=own, reject=None)
    if spec.on_overflow == "drop":  # Ollama's OpenAI endpoint takes no options: its configured num_ctx
        window = out["window"] = spec.num_ctx(options.get("num_ctx") if native else None)
        if window is None or own <= window:
            return out
        kept, dropped = local.ollama_chat_prompt(messages, lambda k: model_tokens(k, tools, spec) <= window)
        size = model_tokens(kept, tools, spec)
        out.update(over_window=True, kept=kept, dropped=dropped, cut=dropped > 0, reported=size)
        if size > window and spec.too_long == "error":
            out["reject"] = (400, _error_body(local.OLLAMA_TOO_LONG, "invalid_request_error"))
        elif size > window:  # the last message alone is over: its runner keeps the last num_ctx tokens
            out.update(cut=True, reported=window)
        return out
    if spec.on_overflow == "cut":
        num_ctx = options.get("num_ctx")
        window = out["window"] = num_ctx if isinstance(num_ctx, int) and num_ctx > 0 else spec.window
        if window is not None and own > window:
            out.update(over_window=True, cut=True, reported=window)
        return out
    if spec.window is not None:
        out["reject"] = _reject_for(spec, own, spec.window, _reply_room(body))
        out["over_window"] = out["reject"] is not None or own > spec.window
    return out


def _error_body(message: str, etype: str, param: Any = None, code: Any = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


# --------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeProvider/1.0"
    provider: "FakeProvider"  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing --------------------------------------------------------
    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw.decode("utf-8")) if raw else {}

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _query(self, key: str) -> Optional[str]:
        values = parse_qs(urlsplit(self.path).query).get(key)
        return values[0] if values else None

    # -- routes ----------------------------------------------------------
    def do_GET(self) -> None:
        p = self.provider
        path = self._path()
        try:
            if path in ("/v1/models", "/models"):
                self._send_json(200, p._models_payload())
            elif path == "/health":
                self._send_json(200, {"status": "ok"})
            elif path == "/control":
                self._send_json(200, p.config)
            elif path == "/control/requests":
                self._send_json(200, list(p.requests))
            elif path in PROBES:
                status, payload = p._probe(path, self._query("model"))
                self._send_json(status, payload)
            else:
                self._send_json(404, _error_body(f"Unknown path {path}", "invalid_request_error"))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self) -> None:
        p = self.provider
        path = self._path()
        try:
            if path in ("/v1/chat/completions", "/chat/completions"):
                p._handle_chat(self)
            elif path == "/api/chat" and p._serves("/api/chat"):
                p._handle_chat(self, api="ollama")
            elif path == "/api/show":
                body = self._read_json()
                name = body.get("model") or body.get("name") if isinstance(body, dict) else None
                status, payload = p._probe(path, name)
                self._send_json(status, payload)
            elif path == "/control":
                try:
                    body = self._read_json()
                    if not isinstance(body, dict):
                        raise ValueError("expected a JSON object")
                    p.configure(**body)
                except (ValueError, TypeError) as exc:
                    self._send_json(400, _error_body(str(exc), "invalid_request_error"))
                    return
                self._send_json(200, p.config)
            elif path == "/control/clear":
                self._read_json()
                p.clear()
                self._send_json(200, {"ok": True})
            else:
                self._send_json(404, _error_body(f"Unknown path {path}", "invalid_request_error"))
        except (BrokenPipeError, ConnectionResetError):
            pass


class FakeProvider:
    """A strict fake OpenAI-compatible server; see the module docstring."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "strict",
        context_window: Optional[int] = None,
        chat_models: tuple = ("fake-chat",),
        summary_models: tuple = ("fake-summary",),
        model_specs: Optional[dict] = None,
        model_rules: Optional[dict] = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.model_rules: dict = {name: tuple(rules) for name, rules in (model_rules or {}).items()}
        unknown = {r for rules in self.model_rules.values() for r in rules} - set(CHECKERS)
        if unknown:
            raise ValueError(f"unknown provider rules {sorted(unknown)}; known: {sorted(CHECKERS)}")
        self.host = host
        self.port = port
        self.mode = mode
        self.model_specs: dict = {
            name: spec if isinstance(spec, ModelSpec) else ModelSpec(**spec)
            for name, spec in (model_specs or {}).items()
        }
        self.chat_models = tuple(dict.fromkeys(tuple(chat_models) + tuple(self.model_specs) + tuple(self.model_rules)))
        self.summary_models = tuple(summary_models)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._log: list[dict] = []
        self._controls = 0  # open rejections_expected() blocks
        self._ids = itertools.count(1)
        self._probe_log: list[dict] = []
        # model -> the context it is loaded with (Ollama, LM Studio): what /api/ps and /api/v0/models report
        self._loaded: dict = {
            name: spec.num_ctx() for name, spec in self.model_specs.items() if spec.preloaded and spec.backend
        }
        self._cfg: dict = {
            "summary_delay": None,
            "summary_fail": None,
            "chat_delay": None,
            "hold": None,
            "context_window": None,
            "reply_text": None,
            "summary_format": None,
            "probes_off": (),
        }
        self.configure(context_window=context_window)
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def respec(self, model_specs: dict, summary_models: tuple = ()) -> "FakeProvider":
        """Serve more models from now on (a test module's own, on the session's provider and server): ``model_specs``
        as the constructor takes them, ``summary_models`` among the summarizers. Open WebUI lists them at its next
        read of ``/v1/models`` (its model cache lasts a second)."""
        specs = {n: s if isinstance(s, ModelSpec) else ModelSpec(**s) for n, s in model_specs.items()}
        with self._lock:
            self.model_specs = {**self.model_specs, **specs}
            self.chat_models = tuple(dict.fromkeys(self.chat_models + tuple(specs)))
            self.summary_models = tuple(dict.fromkeys(self.summary_models + tuple(summary_models)))
            self._loaded.update({n: s.num_ctx() for n, s in specs.items() if s.preloaded and s.backend})
        return self

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "FakeProvider":
        if self._server is not None:
            return self
        _get_encoder()  # load the tokenizer now, not inside the first timed request
        handler = type("FakeProviderHandler", (_Handler,), {"provider": self})
        server = ThreadingHTTPServer((self.host, self.port), handler)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._stop.clear()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"fake-provider-{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; handlers sleeping in a delay or "timeout" wake up at once."""
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "FakeProvider":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def default_summary_format(self) -> str:
        """The demo's (friendly) summaries are extractive; strict mode's repeat markers, as the tests read them."""
        return "extractive" if self.mode == "friendly" else "markers"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server without ``/v1``: what Ollama's connection (``OLLAMA_BASE_URLS``) and the probes use."""
        return f"http://{self.host}:{self.port}"

    # -- control ---------------------------------------------------------
    def configure(
        self,
        *,
        summary_delay: Any = _UNSET,
        summary_fail: Any = _UNSET,
        chat_delay: Any = _UNSET,
        hold: Any = _UNSET,
        context_window: Any = _UNSET,
        reply_text: Any = _UNSET,
        summary_format: Any = _UNSET,
        probes_off: Any = _UNSET,
    ) -> None:
        """Change behaviour; an argument left out is unchanged, ``None`` resets it.

        summary_delay / chat_delay: seconds to sleep before answering.
        hold: (text, seconds): a chat request whose last user message holds ``text`` sleeps that long before its answer
        (one user's turns held while another's are not).
        summary_fail: None, "500", "timeout", "empty" or "reasoning".
        context_window: max prompt tokens, None for unlimited.
        reply_text: fixed content for chat replies, None for the default echo.
        summary_format: "markers" (every marker seen; strict mode's default), "extractive" (a line per message
        folded, see ``extractive_summary``; friendly mode's default) or "lossy" (only half of the facts it is shown,
        see ``lossy_summary``); None for the mode's default.
        probes_off: paths of :data:`PROBES` answered 404 as by a server without them, or "all" for every one that
        tells a window (all but ``/api/tags`` and ``/api/version``, which Open WebUI needs to list Ollama models).
        """
        updates = {
            "summary_delay": summary_delay,
            "summary_fail": summary_fail,
            "chat_delay": chat_delay,
            "hold": hold,
            "context_window": context_window,
            "reply_text": reply_text,
            "summary_format": summary_format,
            "probes_off": probes_off,
        }
        updates = {k: v for k, v in updates.items() if v is not _UNSET}
        if "probes_off" in updates:
            updates["probes_off"] = _probe_paths(updates["probes_off"])
        for key in ("summary_delay", "chat_delay"):
            if key in updates and updates[key] is not None:
                updates[key] = float(updates[key])
                if updates[key] < 0:
                    raise ValueError(f"{key} must be >= 0")
        if updates.get("hold") is not None:
            text, seconds = updates["hold"]
            updates["hold"] = (str(text), float(seconds))
        if "context_window" in updates and updates["context_window"] is not None:
            updates["context_window"] = int(updates["context_window"])
        if "summary_fail" in updates:
            fail = updates["summary_fail"]
            if fail is not None:
                fail = str(fail)
            if fail not in SUMMARY_FAILS:
                raise ValueError(f"summary_fail must be one of {SUMMARY_FAILS}")
            updates["summary_fail"] = fail
        if updates.get("summary_format") not in (None, *SUMMARY_FORMATS):
            raise ValueError(f"summary_format must be one of {SUMMARY_FORMATS}")
        if "reply_text" in updates and updates["reply_text"] is not None:
            updates["reply_text"] = str(updates["reply_text"])
        with self._lock:
            self._cfg.update(updates)

    @property
    def config(self) -> dict:
        with self._lock:
            return dict(self._cfg, mode=self.mode)

    @property
    def requests(self) -> list[dict]:
        """Every chat-completion request so far (copies), oldest first.

        Keys: model, kind ("chat"|"summary"), api ("openai" or "ollama": the
        native ``/api/chat``), messages (OpenAI's shape, as sent), tools, stream,
        status (None while still being handled), error (text or None), rules
        (rule ids of a validation failure), tokens, time (epoch seconds at
        arrival), duration (seconds, None while handled), control (sent inside
        ``rejections_expected``); for models with a spec: model_tokens, window,
        over_window, cut, dropped, rejected, reported_prompt.
        """
        with self._lock:
            return RequestLog(self._log, self._lock)

    def clear(self) -> None:
        with self._lock:
            self._log.clear()
            self._probe_log.clear()

    @property
    def probes(self) -> list[dict]:
        """Every request to a path of :data:`PROBES` so far: path, model (asked for, or None), status, time."""
        with self._lock:
            return copy.deepcopy(self._probe_log)

    def window_events(self, *, include_controls: bool = False) -> dict:
        """What the windows did to the chat requests so far: "requests", "cut" (requests that lost messages or
        tokens), "dropped" (messages lost in all), "rejected" (refused as too long); requests inside
        ``rejections_expected`` are left out unless ``include_controls``."""
        with self._lock:
            done = [r for r in self._log if include_controls or not r["control"]]
            return {
                "requests": len(done),
                "cut": sum(1 for r in done if r["cut"]),
                "dropped": sum(r["dropped"] for r in done),
                "rejected": sum(1 for r in done if r["rejected"]),
            }

    def loaded(self) -> dict:
        """model -> the context it is loaded with, for the Ollama and LM Studio models loaded so far."""
        with self._lock:
            return dict(self._loaded)

    @contextlib.contextmanager
    def rejections_expected(self):
        """Requests that arrive inside the block are logged with ``control`` True: a test's run without the filter,
        whose 400s are what it shows, not a fault of the filter (a whole-run check leaves them out)."""
        with self._lock:
            self._controls += 1
        try:
            yield
        finally:
            with self._lock:
                self._controls -= 1

    def wait_for_requests(self, count: int, *, kind: Optional[str] = None, timeout: float = 5.0) -> list[dict]:
        """Wait until at least ``count`` finished requests (of ``kind``) are logged."""
        deadline = time.monotonic() + timeout
        while True:
            done = [r for r in self.requests if r["status"] is not None and (kind is None or r["kind"] == kind)]
            if len(done) >= count or time.monotonic() >= deadline:
                return done
            time.sleep(0.02)

    # -- internals -------------------------------------------------------
    def _models_payload(self) -> dict:
        models = list(dict.fromkeys(self.chat_models + self.summary_models))
        return {
            "object": "list",
            "data": [
                {
                    "id": m,
                    "object": "model",
                    "created": 0,
                    "owned_by": "fake-provider",
                    **(self.model_specs[m].published() if m in self.model_specs else {}),
                }
                for m in models
            ],
        }

    def _models_of(self, backend: str) -> list:
        return [name for name, spec in self.model_specs.items() if spec.backend == backend]

    def _serves(self, path: str) -> bool:
        """A real server of that kind answers ``path``: the fake hosts one of its models and it is not off."""
        backend = "ollama" if path == "/api/chat" else PROBES[path]
        return bool(self._models_of(backend)) and path not in self.config["probes_off"]

    def _mark_loaded(self, model: str, spec: ModelSpec, window: Optional[int]) -> None:
        """A request loads its model (Ollama: with the request's num_ctx, reloading it when that differs)."""
        if spec.backend in ("ollama", "lmstudio"):
            with self._lock:
                self._loaded[model] = window

    def _probe(self, path: str, model: Optional[str]) -> tuple[int, Any]:
        """(status, body) of a probe endpoint, logged in :attr:`probes`."""
        status, payload = self._probe_answer(path, model)
        with self._lock:
            self._probe_log.append({"path": path, "model": model, "status": status, "time": time.time()})
        return status, payload

    def _probe_answer(self, path: str, model: Optional[str]) -> tuple[int, Any]:
        if not self._serves(path):
            return 404, _error_body(f"Unknown path {path}", "invalid_request_error")
        backend = PROBES[path]
        names = self._models_of(backend)
        loaded = self.loaded()
        if path == "/api/tags":
            return 200, {"models": [local.ollama_tag(name) for name in names]}
        if path == "/api/version":
            return 200, {"version": local.OLLAMA_VERSION}
        if path == "/api/ps":
            return 200, {"models": [local.ollama_ps_entry(name, loaded[name]) for name in names if name in loaded]}
        if path == "/api/v0/models":
            entries = [
                local.lmstudio_model(name, loaded.get(name), self.model_specs[name].trained_size) for name in names
            ]
            return 200, {"object": "list", "data": entries}
        if model is not None and model not in names:
            if path == "/api/show":
                return 404, {"error": f"model '{model}' not found"}
            return 400, {"error": {"code": 400, "message": "model not found", "type": "invalid_request_error"}}
        name = model or names[0]  # llama-server serves one model unless a router asks for another
        spec = self.model_specs[name]
        if path == "/api/show":
            return 200, local.ollama_show(name, spec.trained_size, spec.window if spec.in_modelfile else None)
        if path == "/props":
            return 200, local.llamacpp_props(name, spec.window)
        return 200, local.llamacpp_slots(spec.window)

    def _sleep(self, seconds: Optional[float]) -> bool:
        """Sleep unless stopped; True when the server is stopping."""
        if seconds:
            return self._stop.wait(seconds)
        return self._stop.is_set()

    def _is_summary(self, model: Any, messages: Any) -> bool:
        if model in self.summary_models:
            return True
        if not isinstance(messages, list):
            return False
        return any(
            isinstance(m, dict)
            and m.get("role") in ("system", "developer")
            and SUMMARY_PHRASE in content_text(m.get("content")).lower()
            for m in messages
        )

    def _handle_chat(self, h: _Handler, api: str = "openai") -> None:
        """One chat request: ``api`` "openai" (``/v1/chat/completions``) or "ollama" (Ollama's native ``/api/chat``)."""
        native = api == "ollama"
        started = time.time()
        t0 = time.monotonic()
        entry: dict = {
            "model": None,
            "kind": "chat",
            "api": api,
            "messages": None,
            "tools": None,
            "stream": False,
            "status": None,
            "error": None,
            "rules": [],
            "tokens": None,
            "time": started,
            "duration": None,
            "model_tokens": None,
            "window": None,
            "over_window": False,
            "control": self._controls > 0,
            "cut": False,
            "dropped": 0,
            "rejected": False,
            "reported_prompt": None,
        }

        def finish(status: int, error: Optional[str] = None) -> None:
            with self._lock:
                entry["status"] = status
                entry["error"] = error
                entry["duration"] = time.monotonic() - t0

        def fail(status: int, message: str, etype: str, param: Any = None, code: Any = None) -> None:
            finish(status, message)
            h._send_json(status, {"error": message} if native else _error_body(message, etype, param, code))

        try:
            body = h._read_json()
        except (ValueError, UnicodeDecodeError):
            body = None
        with self._lock:
            self._log.append(entry)
            cfg = dict(self._cfg)
        if not isinstance(body, dict):
            fail(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly.)",
                "invalid_request_error",
            )
            return
        model = body.get("model")
        messages = local.openai_messages(body.get("messages")) if native else body.get("messages")
        stream = bool(body.get("stream", native))  # Ollama streams unless told not to
        with self._lock:
            entry["model"] = model
            entry["messages"] = copy.deepcopy(messages)
            entry["tools"] = copy.deepcopy(body.get("tools"))  # tool schemas count against the window too
            entry["stream"] = stream
            entry["kind"] = "summary" if self._is_summary(model, messages) else "chat"
        kind = entry["kind"]

        spec = self.model_specs.get(model)
        known = model in self.chat_models + self.summary_models
        if not known or (native and (spec is None or spec.backend != "ollama")):
            if native:
                fail(404, f"model '{model}' not found", "not_found")
                return
            fail(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                None,
                "model_not_found",
            )
            return
        violations = [] if native else check_openai(messages)
        for rules in () if native else self.model_rules.get(model, ()):
            violations += CHECKERS[rules](messages)
        if violations:
            with self._lock:
                entry["rules"] = [v.rule for v in violations]
            fail(400, violations[0].message, "invalid_request_error", "messages")
            return
        tokens = count_tokens(messages)
        with self._lock:
            entry["tokens"] = tokens
        reported = tokens
        if spec is not None:
            fit = _fit(spec, messages, body, native)
            self._mark_loaded(model, spec, fit["window"])
            with self._lock:
                entry.update({k: fit[k] for k in ("model_tokens", "window", "over_window", "cut", "dropped")})
                entry["rejected"] = fit["reject"] is not None
                entry["reported_prompt"] = fit["reported"]
            if fit["reject"] is not None:
                status, payload = fit["reject"]
                finish(status, "over the window")
                if native:  # Ollama's own API: a bare message
                    payload = {"error": _error_message(payload)}
                h._send_json(status, payload)
                return
            messages, reported = fit["kept"], fit["reported"]  # the model answers what it was left with
        window = cfg["context_window"]
        if spec is None and window is not None and tokens > window:
            with self._lock:
                entry["rejected"] = True
            fail(
                400,
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "messages",
                "context_length_exceeded",
            )
            return

        tool_name: Optional[str] = None
        arguments = "{}"
        if kind == "summary":
            if self._sleep(cfg["summary_delay"]):
                return finish(503, "server stopped")
            failure = cfg["summary_fail"]
            if failure == "500":
                fail(
                    500,
                    "The server had an error while processing your request. Sorry about that!",
                    "server_error",
                )
                return
            if failure == "timeout":
                self._stop.wait(600)
                finish(503, "server stopped")
                return
            if failure == "empty":
                content = ""
            elif failure == "reasoning":
                content = "<think>I should summarize the conversation so far.</think>"
            elif (cfg["summary_format"] or self.default_summary_format) == "extractive":
                content = extractive_summary(messages, body.get("max_tokens") or 0)
            elif cfg["summary_format"] == "lossy":
                content = lossy_summary(messages)
            else:
                content = _summary_text(messages, self.mode)
        else:
            if self._sleep(_chat_delay(cfg, messages)):
                return finish(503, "server stopped")
            tool_name = _tool_call_request(body, messages)
            agent = _agent_round(body, messages)
            if agent:
                tool_name, arguments = agent[0], json.dumps({"round": agent[1]})
            if tool_name:
                content = ""
            elif cfg["reply_text"] is not None:
                content = cfg["reply_text"]
            else:
                content = _chat_text(messages, self.mode)

        n = next(self._ids)
        tool_calls = None
        if tool_name:
            # 9 alphanumerics: acceptable to every provider, Mistral included
            tool_calls = [
                {
                    "id": f"call{n:05d}"[-9:],
                    "type": "function",
                    "function": {"name": tool_name, "arguments": arguments},
                }
            ]
        completion_tokens = max(1, len(content) // 4) if content else (1 if tool_calls else 0)
        if native:
            self._send_ollama(h, model, content, tool_calls, reported, completion_tokens, stream, finish)
            return
        if spec is not None and spec.usage == "ollama":
            usage = {"prompt_eval_count": reported, "eval_count": completion_tokens}
        else:
            usage = {
                "prompt_tokens": reported,
                "completion_tokens": completion_tokens,
                "total_tokens": reported + completion_tokens,
            }
        reply_id = f"chatcmpl-fake{n}"
        created = int(started)
        finish_reason = "tool_calls" if tool_calls else "stop"
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            include_usage = include_usage or (spec is not None and spec.usage == "ollama")  # Ollama always reports
            try:
                # the log is complete before the client can see the end of the reply
                self._send_stream(
                    h,
                    reply_id,
                    created,
                    model,
                    content,
                    tool_calls,
                    finish_reason,
                    usage if include_usage else None,
                    before_done=lambda: finish(200),
                )
            except (BrokenPipeError, ConnectionResetError):
                finish(499, "client disconnected")
        else:
            message: dict = {"role": "assistant", "content": None if tool_calls else content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            payload = {
                "id": reply_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": usage,
            }
            finish(200)  # logged before the client can read the reply
            h._send_json(200, payload)

    @staticmethod
    def _send_ollama(
        h: _Handler,
        model: str,
        content: str,
        tool_calls: Optional[list],
        prompt_eval_count: int,
        eval_count: int,
        stream: bool,
        finish: Callable[..., None],
    ) -> None:
        """Ollama's ``/api/chat`` answer: NDJSON lines, or the last line alone when not streamed."""
        lines = local.ollama_chat_lines(model, content, tool_calls, prompt_eval_count, eval_count)
        if not stream:
            done = dict(lines[-1])
            done["message"] = {**done["message"], "content": content}
            if tool_calls:
                done["message"]["tool_calls"] = lines[0]["message"]["tool_calls"]
            finish(200)
            h._send_json(200, done)
            return
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/x-ndjson")
            h.send_header("Connection", "close")
            h.end_headers()
            for i, line in enumerate(lines):
                if i == len(lines) - 1:
                    finish(200)  # logged before the client can see the end
                h.wfile.write(json.dumps(line).encode() + b"\n")
                h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            finish(499, "client disconnected")

    @staticmethod
    def _send_stream(
        h: _Handler,
        reply_id: str,
        created: int,
        model: str,
        content: str,
        tool_calls: Optional[list],
        finish_reason: str,
        usage: Optional[dict],
        before_done: Callable[[], None],
    ) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        h.end_headers()

        def chunk(delta: dict, reason: Optional[str] = None, **extra: Any) -> None:
            payload = {
                "id": reply_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }
            payload.update(extra)
            h.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            h.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        if tool_calls:
            for i, call in enumerate(tool_calls):
                head = {
                    "index": i,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""},
                }
                chunk({"tool_calls": [head]})
                chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
        else:
            words = re.findall(r"\S+\s*|\s+", content)
            for i in range(0, len(words), 3):
                chunk({"content": "".join(words[i : i + 3])})
        chunk({}, finish_reason)
        if usage is not None:
            payload = {
                "id": reply_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            h.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        before_done()
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description="Strict fake OpenAI-compatible server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8099)
    ap.add_argument("--mode", choices=MODES, default="strict")
    ap.add_argument("--context-window", type=int, default=None)
    ap.add_argument(
        "--chat-model", action="append", dest="chat_models", help="chat model id (repeatable; default fake-chat)"
    )
    ap.add_argument(
        "--summary-model",
        action="append",
        dest="summary_models",
        help="summary model id (repeatable; default fake-summary)",
    )
    ap.add_argument(
        "--model-rules",
        action="append",
        default=[],
        metavar="MODEL=PROVIDER[,PROVIDER]",
        help="a chat model that also enforces these providers' rules, e.g. fake-claude=anthropic (repeatable)",
    )
    args = ap.parse_args(argv)
    model_rules = {}
    for entry in args.model_rules:
        name, _, rules = entry.partition("=")
        model_rules[name.strip()] = tuple(r.strip() for r in rules.split(",") if r.strip())
    provider = FakeProvider(
        host=args.host,
        port=args.port,
        mode=args.mode,
        context_window=args.context_window,
        chat_models=tuple(args.chat_models or ("fake-chat",)),
        summary_models=tuple(args.summary_models or ("fake-summary",)),
        model_rules=model_rules,
    ).start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(provider.base_url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
