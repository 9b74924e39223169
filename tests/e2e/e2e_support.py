"""Helpers for the end-to-end suite: chats driven turn by turn through a real
Open WebUI, with every provider request checked against what the user sent.

Every user message (and every tool result) carries a unique ``MK-<hex>``
marker; the strict fake summarizer repeats each marker it is shown. A request
to the chat model must therefore contain every marker of its branch: verbatim
where the message was kept, inside the ``<conversation_summary`` system text
where it was dropped. Markers of messages on other branches must not appear.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from devkit.fake_provider import ModelSpec, ollama_spec
from devkit.openwebui import (
    ChatHistory,
    OpenWebUIClient,
    OpenWebUIError,
    OpenWebUIServer,
    ensure_offline_tiktoken,
    new_id,
)

MARKER_RE = re.compile(r"\bMK-[A-Za-z0-9]+\b")
SUMMARY_TAG = "<conversation_summary"
CHAT_MODEL = "fake-chat"
SUMMARY_MODEL = "fake-summary"
# Models with a tokenizer and a window of their own (issue 19): 1.3x cl100k in a 16k window,
# one rejecting with vLLM's 400, one served as Ollama serves it (whole messages dropped silently over its num_ctx,
# prompt_eval_count reported).
VLLM_MODEL = "fake-vllm-13x-16k"
OLLAMA_MODEL = "fake-ollama-13x-16k"
MODEL_SPECS = {
    VLLM_MODEL: ModelSpec(ratio=1.3, window=16384, on_overflow="reject", per_message=2),
    OLLAMA_MODEL: ollama_spec(16384, ratio=1.3, usage="ollama", per_message=2),
}
# tests/e2e/test_model_tokens.py's runs on two workers (issue 44): a model each that nothing has learned yet, listed by
# the session's two-worker server from its start (conftest's shared_two_workers)
RATIO_RUNS = {
    f"vllm-13x-16k-run{n}": ModelSpec(ratio=1.3, window=16384, on_overflow="reject", per_message=2) for n in (1, 2, 3)
}
# How often each worker of a two-worker server the tests start reads the windows every worker shares: the product's
# WINDOWS_REFRESH (10 s), shortened through ACC_TEST_WINDOWS_REFRESH so a test waits 2 s for it, not 10 (issue 45)
WINDOWS_REFRESH = 2.0
# The "minute" in which every worker applies one snapshot of the shared ratios: the product's RATIOS_MINUTE (60 s),
# shortened through ACC_TEST_RATIOS_MINUTE so a test waits about 10 s for a ratio to apply everywhere, not 30-60 (issue 45)
RATIOS_MINUTE = 10.0
# How long a summary lease lives without a heartbeat on the servers the tests start: the product's LEASE_TTL (30 s,
# renewed every 10), shortened through ACC_TEST_LEASE_TTL (renewed every third of it) so a test waits for a killed
# holder's lease about 15 s, not 30 (issue 45)
LEASE_TTL = 15.0
LEASE_RENEW = LEASE_TTL / 3
# A model reached through a gateway to Claude, or Kimi, or Mistral (issue 29): it also enforces those providers' rules
# (tool-call ids in [a-zA-Z0-9_-], no message that says nothing, no tool -> user).
STRICT_MODEL = "fake-claude-kimi-mistral"
MODEL_RULES = {STRICT_MODEL: ("anthropic", "moonshot", "mistral")}
FILTER_ID = "async_context_compression"

# Low thresholds so a few turns of ~250 tokens cross them.
E2E_VALVES = {
    "compression_threshold_tokens": 1500,
    "max_context_tokens": 3000,
    "keep_last": 4,
    "keep_first": 1,
    "summary_model": SUMMARY_MODEL,
    "summary_timeout_seconds": 30,
    "debug": True,
}

_WORDS = (
    "alpha budget cache deploy engine filter gateway handler index journal kernel ledger metric network "
    "option parser queue record schema token update vector window yield zone archive backlog cluster "
    "dataset export feature graph header input join key label model node output payload query region "
    "sample table upload value worker layout branch commit review release version migrate rollback"
).split()


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("content") or ""))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return "" if content is None else str(content)


def message_texts(message: dict) -> str:
    out = [text_of(message.get("content"))]
    for call in message.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        out.append(str(fn.get("arguments") or ""))
    return "\n".join(out)


def markers_in(text: str) -> set:
    return set(MARKER_RE.findall(text or ""))


def new_marker() -> str:
    return "MK-" + secrets.token_hex(4)


def filler(rng: random.Random, words: int) -> str:
    picked = [rng.choice(_WORDS) for _ in range(words)]
    sentences = []
    for i in range(0, len(picked), 12):
        chunk = picked[i : i + 12]
        sentences.append(" ".join(chunk).capitalize() + ".")
    return " ".join(sentences)


def user_text(marker: str, rng: random.Random, words: int = 170) -> str:
    """A user message: its marker first, then filler (~1.3 tokens a word)."""
    return f"{marker} Please keep note of {marker}. {filler(rng, words)}"


def request_markers(req: dict) -> set:
    found: set = set()
    for m in req.get("messages") or []:
        if isinstance(m, dict):
            found |= markers_in(message_texts(m))
    return found


def summary_text(req: dict) -> str:
    return "\n".join(
        text_of(m.get("content"))
        for m in req.get("messages") or []
        if isinstance(m, dict) and m.get("role") in ("system", "developer") and SUMMARY_TAG in text_of(m.get("content"))
    )


def has_summary(req: dict) -> bool:
    return bool(summary_text(req))


RECALL_CUT = "\n\nPassages of earlier turns of this conversation, folded into its summary"  # the filter's recall block


def last_user_text(req: dict) -> Optional[str]:
    """What the user typed last: the last user message's text without a recall block the filter put after it."""
    for m in reversed(req.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return text_of(m.get("content")).split(RECALL_CUT, 1)[0]
    return None


def first_system_text(req: dict) -> str:
    msgs = req.get("messages") or []
    if msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
        return text_of(msgs[0].get("content"))
    return ""


def brief(req: dict, width: int = 70) -> str:
    rows = []
    for m in req.get("messages") or []:
        if not isinstance(m, dict):
            continue
        extra = ""
        if m.get("tool_calls"):
            extra = " calls=" + ",".join(str((c or {}).get("id")) for c in m["tool_calls"])
        if m.get("tool_call_id"):
            extra = f" answers={m['tool_call_id']}"
        rows.append(f"    {m.get('role')}{extra}: {text_of(m.get('content'))[:width]!r}")
    head = f"  [{req.get('kind')} {req.get('model')} status={req.get('status')} tokens={req.get('tokens')}]"
    if req.get("error"):
        head += f" error={req['error']!r}"
    return head + "\n" + "\n".join(rows)


# ---------------------------------------------------------------------------
# waiting for background work
# ---------------------------------------------------------------------------


def settle(provider, since: int, quiet: float = 0.8, deadline: float = 60.0, model: Optional[str] = None) -> list:
    """Wait until every request logged since ``since`` (of ``model`` only, when given: others' run meanwhile) is
    finished and none arrived for ``quiet`` s.

    Background summaries start right after outlet returns; polling the
    provider's log (not sleeping a fixed time) tells when they are done.
    """
    end = time.monotonic() + deadline
    seen = -1
    changed = time.monotonic()
    while True:
        reqs = [r for r in provider.requests[since:] if model is None or r["model"] == model]
        now = time.monotonic()
        if len(reqs) != seen:
            seen, changed = len(reqs), now
        pending = [r for r in reqs if r["status"] is None]
        if not pending and now - changed >= quiet:
            return reqs
        if now > end:
            raise AssertionError(
                f"background work did not settle within {deadline}s: {len(pending)} request(s) still running "
                f"({[r['kind'] for r in pending]})"
            )
        time.sleep(0.1)


def wait_for(predicate, deadline: float, interval: float = 0.1, what: str = "condition"):
    end = time.monotonic() + deadline
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# a chat driven turn by turn
# ---------------------------------------------------------------------------


@dataclass
class Turn:
    marker: str
    text: str
    user_id: str
    assistant_id: str
    elapsed: float
    response: Any
    requests: list = field(default_factory=list)  # chat requests this turn made (request hook: one per model call)
    expected: set = field(default_factory=set)  # markers of the branch up to this turn
    forbidden: set = field(default_factory=set)  # markers only on other branches
    ended: float = 0.0  # wall clock when the reply came back (epoch seconds, like the provider log)


class Conversation:
    """A saved chat: a local mirror of its history plus the provider requests of each turn."""

    def __init__(
        self, client: OpenWebUIClient, provider, *, system: Optional[str] = None, seed: int = 0, model: str = CHAT_MODEL
    ) -> None:
        self.client = client
        self.provider = provider
        self.model = model
        self.rng = random.Random(seed)
        self.system = system or f"You are the e2e assistant. Prompt id SYS-{secrets.token_hex(4)}."
        self.history = ChatHistory(model)
        self.marker_of: dict = {}  # message id -> markers it carries
        self.chat_id: Optional[str] = None
        self.turns: list = []

    # -- building the stored part -------------------------------------------
    def add_user(self, words: int = 170, parent_id: Any = "current") -> str:
        marker = new_marker()
        kwargs = {} if parent_id == "current" else {"parent_id": parent_id}
        mid = self.history.user(user_text(marker, self.rng, words), **kwargs)
        self.marker_of[mid] = {marker}
        return mid

    def add_assistant(self, words: int = 30) -> str:
        return self.history.assistant(f"Noted. {filler(self.rng, words)}")

    def add_tools(self, rounds: list, final: str = "Done with the tools.") -> str:
        """``rounds``: list of lists of tool names; each call's result carries a marker."""
        steps, markers = [], set()
        for names in rounds:
            calls = []
            for name in names:
                marker = new_marker()
                markers.add(marker)
                result = f"{marker} result of {name}: {filler(self.rng, 40)}"
                calls.append((name, {"query": f"{name} {filler(self.rng, 3)}"}, result))
            steps.append(calls)
        mid = self.history.assistant_tools(steps, final + " " + filler(self.rng, 10))
        self.marker_of[mid] = markers
        return mid

    def add_turns(self, count: int, words: int = 170) -> None:
        for _ in range(count):
            self.add_user(words)
            self.add_assistant()

    def store(self, title: str = "e2e") -> str:
        self.chat_id = self.client.create_chat(self.history, title=title)
        return self.chat_id

    # -- markers ---------------------------------------------------------------
    def branch_ids(self, leaf: Optional[str]) -> list:
        return [m["id"] for m in self.history.branch(leaf)] if leaf else []

    def branch_markers(self, leaf: Optional[str]) -> set:
        out: set = set()
        for mid in self.branch_ids(leaf):
            out |= self.marker_of.get(mid, set())
        return out

    def all_markers(self) -> set:
        out: set = set()
        for markers in self.marker_of.values():
            out |= markers
        return out

    # -- live turns ------------------------------------------------------------
    def turn(
        self,
        *,
        parent_id: Any = "current",
        words: int = 170,
        regenerate_of: Optional[str] = None,
        wait: bool = True,
        timeout: float = 120.0,
        stream: bool = False,
        extra: Optional[dict] = None,
        prefix: str = "",
    ) -> Turn:
        """One user turn through POST /api/chat/completions (blocking, no session_id).

        ``regenerate_of``: id of an existing user message whose reply is
        generated again (a sibling of the old reply).
        """
        assert self.chat_id, "store() the chat first"
        start = len(self.provider.requests)
        if regenerate_of:
            user_id = regenerate_of
            text = self.history.messages[user_id]["content"]
            marker = sorted(self.marker_of[user_id])[0]
            parent = self.history.messages[user_id]["parentId"]
        else:
            parent = self.history.current_id if parent_id == "current" else parent_id
            marker = new_marker()
            text = prefix + user_text(marker, self.rng, words)
            user_id = new_id()
        result = self.client.chat_completion(
            text,
            model=self.model,
            chat_id=self.chat_id,
            parent_id=parent,
            user_message_id=user_id,
            system=self.system,
            timeout=timeout,
            stream=stream,
            extra=extra,
        )
        reply = ""
        try:
            reply = result["response"]["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            pass
        # mirror what the server stored
        if not regenerate_of:
            self.history.user(text, parent_id=parent, message_id=user_id)
            self.marker_of[user_id] = {marker}
        stored = (result["response"] or {}).get("stored_message") if isinstance(result["response"], dict) else None
        output = stored.get("output") if isinstance(stored, dict) else None
        self.history.assistant(
            reply,
            parent_id=user_id,
            message_id=result["assistant_id"],
            output=output if any(i.get("type") == "function_call" for i in output or []) else None,
        )
        if output:
            # markers returned by tools called live in this turn belong to the branch from now on
            found = set()
            for item in output:
                if item.get("type") == "function_call_output":
                    for part in item.get("output") or []:
                        found |= markers_in(str(part.get("text", "")))
            if found:
                self.marker_of[result["assistant_id"]] = found
        expected = self.branch_markers(user_id)
        # the turn's own live tool results are neither expected (the first model call
        # precedes them) nor foreign
        forbidden = self.all_markers() - self.branch_markers(result["assistant_id"])
        reqs = [r for r in self.provider.requests[start:] if r["kind"] == "chat" and last_user_text(r) == text]
        turn = Turn(
            marker,
            text,
            user_id,
            result["assistant_id"],
            result["elapsed"],
            result["response"],
            reqs,
            expected,
            forbidden,
            time.time(),
        )
        self.turns.append(turn)
        if wait:
            settle(self.provider, start)
            # the request list is complete only now for tool loops; refresh it
            turn.requests = [
                r for r in self.provider.requests[start:] if r["kind"] == "chat" and last_user_text(r) == text
            ]
        return turn

    def turn_maybe_rejected(self, words: int, timeout: float = 180.0) -> Turn:
        """One user turn the provider may reject (a window test's over-window request), mirrored as Open WebUI keeps
        it: an empty reply under the user message. Nothing waits for summaries: the caller knows what to wait for."""
        parent, marker, user_id, reply_id = self.history.current_id, new_marker(), new_id(), new_id()
        text = user_text(marker, self.rng, words)
        start = len(self.provider.requests)
        reply = ""
        try:
            result = self.client.chat_completion(
                text,
                model=self.model,
                chat_id=self.chat_id,
                parent_id=parent,
                user_message_id=user_id,
                assistant_id=reply_id,
                system=self.system,
                timeout=timeout,
            )
            reply = result["response"]["choices"][0]["message"]["content"] or ""
        except OpenWebUIError:
            pass
        self.history.user(text, parent_id=parent, message_id=user_id)
        self.marker_of[user_id] = {marker}
        self.history.assistant(reply, parent_id=user_id, message_id=reply_id)
        reqs = [r for r in self.provider.requests[start:] if r["kind"] == "chat" and last_user_text(r) == text]
        return Turn(marker, text, user_id, reply_id, 0.0, None, reqs, self.branch_markers(user_id), set())


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def check_turn(conv: Conversation, turn: Turn, cap: int, *, markers: bool = True) -> list:
    """Problems with the provider requests of one turn (empty list = fine)."""
    problems = []
    if not turn.requests:
        problems.append(f"turn {turn.marker}: no chat request reached the provider")
    for req in turn.requests:
        where = f"turn {turn.marker}"
        if req["status"] != 200:
            problems.append(f"{where}: provider answered {req['status']}: {req.get('error')}")
        if req.get("tokens") is not None and req["tokens"] > cap:
            problems.append(f"{where}: {req['tokens']} tokens sent, over the cap {cap}")
        if conv.system not in first_system_text(req):
            problems.append(f"{where}: the system prompt did not reach the provider as the leading system message")
        if last_user_text(req) != turn.text:
            problems.append(f"{where}: the latest user message is not the last user message sent")
        if markers:
            seen = request_markers(req)
            missing = turn.expected - seen
            if missing:
                in_summary = markers_in(summary_text(req))
                problems.append(
                    f"{where}: {len(missing)} marker(s) of dropped messages reached the provider neither verbatim "
                    f"nor through the summary: {sorted(missing)[:8]}"
                    + (
                        " (the request had no summary)"
                        if not has_summary(req)
                        else f" (summary had {len(in_summary)} markers)"
                    )
                )
            leaked = turn.forbidden & seen
            if leaked:
                problems.append(f"{where}: markers of other branches reached the provider: {sorted(leaked)[:8]}")
    return problems


def provider_errors(reqs: list) -> list:
    return [r for r in reqs if r["status"] is not None and r["status"] >= 400]


def status_lines(client, chat_id: str) -> list:
    """Every status line the chat's replies show, as Open WebUI stored them
    (``statusHistory``): exactly what the page displays under each reply."""
    chat = client.get_chat(chat_id)["chat"]
    lines = []
    for message in (chat.get("history") or {}).get("messages", {}).values():
        for status in message.get("statusHistory") or []:
            if isinstance(status, dict) and status.get("description"):
                lines.append(status["description"])
    return lines


def turn_until_summary_pending(conv: Conversation, provider, turns: int = 12) -> int:
    """Live turns until one starts a background summary that is still
    running; returns that request's index in the provider's log."""
    for _ in range(turns):
        start = len(provider.requests)
        conv.turn(wait=False)

        def running(since=start):
            reqs = provider.requests
            return [i for i in range(since, len(reqs)) if reqs[i]["kind"] == "summary" and reqs[i]["status"] is None]

        try:
            return wait_for(running, deadline=4, what="a running summary")[0]
        except AssertionError:
            settle(provider, start)
    raise AssertionError(f"no summary started within {turns} turns")


def pids_connected_to(port: int, pids: list) -> list:
    """Of ``pids``, those with an established TCP connection to 127.0.0.1:``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.append(pid)
                break
    return found


# ---------------------------------------------------------------------------
# Open WebUI servers a module starts for itself, and a browser
# ---------------------------------------------------------------------------

# A filter installed beside ours: the first system message of every request names the worker that served it.
PID_PROBE = '''"""
title: Worker Probe
id: worker_probe
version: 0.0.1
description: stamps each request with the serving worker's pid
"""
import os
from pydantic import BaseModel


class Filter:
    class Valves(BaseModel):
        priority: int = 0

    def __init__(self):
        self.valves = self.Valves()

    async def inlet(self, body: dict) -> dict:
        body["messages"].insert(0, {"role": "system", "content": f"served-by-pid-{os.getpid()}"})
        return body
'''

# Debian's Chromium (never a browser download), headless, as root in a container, with no traffic of its own.
CHROMIUM = os.environ.get("ACC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def retrying(call, deadline: float = 120):
    """A worker may still be starting (or be restarted by uvicorn on a busy machine): connection errors and 5xx are
    tried again for ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        try:
            return call()
        except (OSError, OpenWebUIError) as exc:
            if isinstance(exc, OpenWebUIError) and exc.status < 500 or time.monotonic() > end:
                raise
            time.sleep(2)


@contextmanager
def multi_worker_server(
    owui_python: str,
    provider,
    filter_source: str,
    admin: str,
    *,
    valves: Optional[dict] = None,
    models: tuple = (CHAT_MODEL, SUMMARY_MODEL),
    pid_probe: bool = False,
    env_extra: Optional[dict] = None,
    workers: int = 2,
    timeout: float = 600,
    ollama_url: Optional[str] = None,
    ollama=None,
):
    """An Open WebUI of the caller's own: ``workers`` uvicorn workers sharing one database, ``admin``@example.com its
    first account, ``models`` served by ``provider`` (and by an Ollama connection to ``ollama_url``, or to ``ollama``,
    a second fake, when given), the filter installed globally with ``valves`` (E2E_VALVES when None) and, with
    ``pid_probe``, PID_PROBE beside it. Yields (server, client); on leaving the server is stopped and its data removed
    (kept with ACC_KEEP_E2E_DATA)."""
    server = OpenWebUIServer(
        python=owui_python,
        provider_url=provider.base_url,
        ollama_url=ollama_url or (ollama.root_url if ollama is not None else None),
        workers=workers,
        env_extra=env_extra,
        tiktoken_cache_dir=ensure_offline_tiktoken(owui_python),
    )
    try:
        server.start(timeout=timeout)
        client = OpenWebUIClient(server.base_url, timeout=180)
        retrying(lambda: client.ensure_admin(f"{admin}@example.com", "Workers-Passw0rd!", f"{admin} admin"))
        retrying(lambda: client.wait_for_models(list(models), timeout=90))
        installed = dict(E2E_VALVES if valves is None else valves)
        retrying(lambda: client.install_function(FILTER_ID, filter_source, valves=installed, enable_global=True))
        if pid_probe:
            retrying(lambda: client.install_function("worker_probe", PID_PROBE, enable_global=True))
        yield server, client
    except Exception:
        print(f"\n[e2e] {workers}-worker server log (last 60 lines):\n" + server.log_tail(60))
        raise
    finally:
        server.stop()
        if not os.environ.get("ACC_KEEP_E2E_DATA"):
            server.cleanup()


# ---------------------------------------------------------------------------
# faults (tests/e2e/test_faults.py, test_faults_pg.py): the status line that says one, and what is kept
# ---------------------------------------------------------------------------

# A fault that stops summaries is said in the chat's status line: as
# "... summaries unavailable: <reason> ..." on a request that met it, as
# "Summary failed: <reason> · next try in ..." by the background summary that
# failed. Words that may name each reason in the English text (any one is enough):
UNAVAILABLE = ("summaries unavailable", "summary failed")
REASON_WORDS = {
    "store_down": ("unreachable", "down", "connect"),
    "store_denied": ("permission", "denied"),
    "store_busy": ("locked", "busy"),
    "timeout": ("timeout", "timed out", "no answer"),
    "model_error": ("model error", "summarizer error", "error"),
    "empty": ("empty",),
}


def fault_lines(lines: list, reason: str) -> list:
    words = REASON_WORDS[reason]
    return [
        line
        for line in lines
        for said in UNAVAILABLE
        if said in line.lower() and any(w in line.lower().split(said, 1)[1] for w in words)
    ]


def assert_fault_status(client, chat_id: str, reason: str, filter_source: str, deadline: float = 20) -> list:
    """The chat's status line says summaries are unavailable, with ``reason``."""
    return wait_for(
        lambda: fault_lines(status_lines(client, chat_id), reason),
        deadline=deadline,
        what=f"a status line '{UNAVAILABLE[0]}: <{reason}>' (have: {status_lines(client, chat_id)[-6:]})",
    )


def assert_kept(conv: Conversation, turn, recent: int = 2) -> None:
    """The turn reached the model with the system prompt, the new user message
    last, under the cap, and the ``recent`` user messages before it verbatim."""
    problems = check_turn(conv, turn, E2E_VALVES["max_context_tokens"], markers=False)
    assert not problems, "\n".join(problems)
    before = [t for t in conv.turns if t is not turn][-recent:]
    for req in turn.requests:
        verbatim = request_markers(req) - markers_in(summary_text(req))
        missing = {t.marker for t in before} - verbatim
        assert not missing, f"recent turns not sent verbatim: {sorted(missing)}\n{brief(req)}"


def chat_400s(provider, start: int) -> list:
    return [r for r in provider.requests[start:] if r["status"] == 400]


def summaries_since(provider, start: int) -> list:
    return [r for r in provider.requests[start:] if r["kind"] == "summary"]
