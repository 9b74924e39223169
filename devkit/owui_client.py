"""A small synchronous REST client for a running Open WebUI (stdlib urllib).

:class:`OpenWebUIClient` signs up / in, installs filter functions (create or
update, activation and global toggles checked, not flipped blindly), reads and
writes valves, stores chats, runs blocking chat completions (inlet and outlet
both run), reads chats back and switches the built-in context compaction on and
off through the admin API.  HTTP error answers raise :class:`OpenWebUIError`.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any, Optional

from devkit.chat_history import ChatHistory, new_id

__all__ = [
    "OpenWebUIClient",
    "OpenWebUIError",
    "parse_frontmatter",
]

# ---------------------------------------------------------------------------
# frontmatter
# ---------------------------------------------------------------------------


def parse_frontmatter(source: str) -> dict:
    """The ``key: value`` lines of a function's leading docstring (as Open WebUI reads them)."""
    m = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', source, re.S)
    if not m:
        return {}
    meta = {}
    for line in m.group(1).splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            key = key.strip()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                meta[key] = value.strip()
    return meta


# ---------------------------------------------------------------------------
# the REST client
# ---------------------------------------------------------------------------


class OpenWebUIError(RuntimeError):
    """An HTTP error answer: ``status`` and Open WebUI's ``detail`` text."""

    def __init__(self, method: str, path: str, status: int, detail: Any, body: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail
        self.body = body
        super().__init__(f"{method} {path} -> HTTP {status}: {detail}")


class OpenWebUIClient:
    """A small synchronous REST client for Open WebUI (stdlib urllib)."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.user: Optional[dict] = None

    # -- plumbing ----------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: Optional[float] = None,
        raw: bool = False,
        auth: bool = True,
    ) -> Any:
        url = self.base_url + path
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                payload = resp.read()
                if raw:
                    return payload.decode("utf-8", "replace")
                if not payload:
                    return None
                try:
                    return json.loads(payload)
                except ValueError:
                    return payload.decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            detail: Any = text
            try:
                parsed = json.loads(text)
                if isinstance(parsed, dict):
                    detail = parsed.get("detail", parsed.get("error", parsed))
            except ValueError:
                pass
            raise OpenWebUIError(method, path, exc.code, detail, text) from None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, {} if body is None else body, **kw)

    # -- auth ----------------------------------------------------------------
    def signup(self, email: str, password: str, name: str = "Admin") -> dict:
        """Create an account (the first one is the admin) and use its token."""
        result = self.request(
            "POST", "/api/v1/auths/signup", {"name": name, "email": email, "password": password}, auth=False
        )
        self.token = result["token"]
        self.user = result
        return result

    def signin(self, email: str, password: str) -> dict:
        result = self.request("POST", "/api/v1/auths/signin", {"email": email, "password": password}, auth=False)
        self.token = result["token"]
        self.user = result
        return result

    def ensure_admin(self, email: str, password: str, name: str = "Admin") -> dict:
        """Sign in, or sign up when no such account exists yet."""
        try:
            return self.signin(email, password)
        except OpenWebUIError as exc:
            if exc.status not in (400, 401, 403, 404):
                raise
        return self.signup(email, password, name)

    def create_api_key(self) -> str:
        """A new ``sk-...`` API key for the signed-in user (needs ENABLE_API_KEYS)."""
        return self.post("/api/v1/auths/api_key")["api_key"]

    # -- models ----------------------------------------------------------------
    def models(self) -> list:
        result = self.get("/api/models")
        return result.get("data", []) if isinstance(result, dict) else list(result or [])

    def wait_for_models(self, model_ids: Iterable[str], timeout: float = 60.0) -> list:
        """Wait until every id in ``model_ids`` is listed (the provider answered)."""
        wanted = set(model_ids)
        deadline = time.monotonic() + timeout
        while True:
            ids = [m.get("id") for m in self.models()]
            if wanted <= set(ids):
                return ids
            if time.monotonic() > deadline:
                raise RuntimeError(f"models {sorted(wanted - set(ids))} not listed after {timeout}s (have {ids})")
            time.sleep(0.5)

    # -- functions ---------------------------------------------------------------
    def get_function(self, function_id: str) -> Optional[dict]:
        try:
            return self.get(f"/api/v1/functions/id/{function_id}")
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return None
            raise

    def list_functions(self) -> list:
        return self.get("/api/v1/functions/") or []

    def install_function(
        self,
        function_id: str,
        source: str,
        valves: Optional[dict] = None,
        enable_global: Optional[bool] = True,
        *,
        name: Optional[str] = None,
        merge_valves: bool = False,
    ) -> dict:
        """Create or update function ``function_id`` from ``source``, then make it active.

        ``enable_global``: True/False sets the global flag, None leaves it.
        ``valves``: set after install (replacing them, or merged over the
        stored ones with ``merge_valves``).
        """
        meta = parse_frontmatter(source)
        form = {
            "id": function_id,
            "name": name or meta.get("title") or function_id,
            "content": source,
            "meta": {"description": meta.get("description", "")},
        }
        existing = self.get_function(function_id)
        if existing is None:
            function = self.post("/api/v1/functions/create", form)
        else:
            function = self.post(f"/api/v1/functions/id/{function_id}/update", form)
        self.set_function_state(function_id, active=True, is_global=enable_global)
        if valves is not None:
            self.set_valves(function_id, valves, merge=merge_valves)
        return self.get_function(function_id) or function

    def set_function_state(
        self, function_id: str, active: Optional[bool] = None, is_global: Optional[bool] = None
    ) -> dict:
        """Set is_active / is_global to the given values (the endpoints flip, so check first). A connection lost on the
        way (a loaded server may reset one after answering) is tried again: each try reads the state first."""
        for attempt in range(3):
            try:
                return self._set_function_state(function_id, active, is_global)
            except (ConnectionError, http.client.HTTPException, urllib.error.URLError):
                if attempt == 2:
                    raise
                time.sleep(1)
        raise AssertionError("unreachable")

    def _set_function_state(self, function_id: str, active: Optional[bool], is_global: Optional[bool]) -> dict:
        function = self.get_function(function_id)
        if function is None:
            raise OpenWebUIError("GET", f"/api/v1/functions/id/{function_id}", 404, "function not found")
        if active is not None and bool(function.get("is_active")) != bool(active):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle")
        if is_global is not None and bool(function.get("is_global")) != bool(is_global):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle/global")
        return function

    def delete_function(self, function_id: str) -> bool:
        try:
            return bool(self.request("DELETE", f"/api/v1/functions/id/{function_id}/delete"))
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return False
            raise

    def get_valves(self, function_id: str) -> dict:
        return self.get(f"/api/v1/functions/id/{function_id}/valves") or {}

    def set_valves(self, function_id: str, valves: dict, merge: bool = False) -> dict:
        """Store valves (Open WebUI replaces the stored set; ``merge`` keeps other keys)."""
        if merge:
            valves = {**self.get_valves(function_id), **valves}
        return self.post(f"/api/v1/functions/id/{function_id}/valves/update", valves) or {}

    # -- tools (workspace tools the model may call natively) ----------------------------
    def install_tool(self, tool_id: str, source: str, name: Optional[str] = None) -> dict:
        """Create or update a workspace tool (a ``class Tools`` source)."""
        meta = parse_frontmatter(source)
        form = {
            "id": tool_id,
            "name": name or meta.get("title") or tool_id,
            "content": source,
            "meta": {"description": meta.get("description", "")},
        }
        try:
            self.get(f"/api/v1/tools/id/{tool_id}")
            exists = True
        except OpenWebUIError as exc:
            if exc.status not in (401, 404):
                raise
            exists = False
        if exists:
            return self.post(f"/api/v1/tools/id/{tool_id}/update", form)
        return self.post("/api/v1/tools/create", form)

    def delete_tool(self, tool_id: str) -> bool:
        try:
            return bool(self.request("DELETE", f"/api/v1/tools/id/{tool_id}/delete"))
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return False
            raise

    # -- chats ---------------------------------------------------------------------
    def create_chat(self, history: "ChatHistory | dict", title: Optional[str] = None) -> str:
        """Store a chat (a :class:`ChatHistory` or a ready ``chat`` dict); returns its id."""
        chat = history.to_chat(title) if isinstance(history, ChatHistory) else dict(history)
        if title:
            chat["title"] = title
        result = self.post("/api/v1/chats/new", {"chat": chat})
        return result["id"]

    def get_chat(self, chat_id: str) -> dict:
        return self.get(f"/api/v1/chats/{chat_id}")

    def update_chat(self, chat_id: str, chat: dict) -> dict:
        return self.post(f"/api/v1/chats/{chat_id}", {"chat": chat})

    def set_current_message(self, chat_id: str, message_id: str) -> dict:
        """Switch the chat's visible branch to the one ending at ``message_id`` (as the UI does)."""
        chat = self.get_chat(chat_id)["chat"]
        history = chat.get("history") or {}
        messages = history.get("messages") or {}
        if message_id not in messages:
            raise KeyError(message_id)
        history["currentId"] = message_id
        chat["history"] = history
        chain = []
        cursor: Optional[str] = message_id
        while cursor:
            chain.append(messages[cursor])
            cursor = messages[cursor].get("parentId")
        chat["messages"] = list(reversed(chain))
        return self.update_chat(chat_id, chat)

    def chat_completion(
        self,
        content: Optional[str] = None,
        *,
        model: str,
        chat_id: Optional[str] = None,
        parent_id: Optional[str] = None,
        user_message_id: Optional[str] = None,
        assistant_id: Optional[str] = None,
        system: Optional[str] = None,
        messages: Optional[list] = None,
        stream: bool = False,
        extra: Optional[dict] = None,
        timeout: Optional[float] = None,
    ) -> dict:
        """POST /api/chat/completions without session_id: blocks until inlet, the model and outlet ran.

        Saved chat (``chat_id``): a new user turn ``content`` under
        ``parent_id`` (or, with ``user_message_id`` of an existing user
        message, a regenerated reply to it), answered into ``assistant_id``;
        the server loads the branch from the database and keeps only the
        client's system message.  Without ``chat_id``: ``messages`` (or
        ``system`` + ``content``) are sent as they are.

        Returns ``{"response", "elapsed", "assistant_id", "user_message_id", "status"}``.
        """
        body: dict = {"model": model, "stream": stream}
        sent: list = []
        if system is not None:
            sent.append({"role": "system", "content": system})
        if chat_id:
            assistant_id = assistant_id or new_id()
            user_message_id = user_message_id or new_id()
            user_message = {"id": user_message_id, "parentId": parent_id, "role": "user", "content": content or ""}
            sent.append({"role": "user", "content": content or ""})
            body.update(
                {
                    "chat_id": chat_id,
                    "id": assistant_id,
                    "messages": messages if messages is not None else sent,
                    "user_message": user_message,
                }
            )
        else:
            if messages is None:
                sent.append({"role": "user", "content": content or ""})
                messages = sent
            body["messages"] = messages
        if extra:
            body.update(extra)
        started = time.monotonic()
        response: Any
        if stream:
            text = self.request("POST", "/api/chat/completions", body, timeout=timeout, raw=True)
            if chat_id and text.strip() in ("", "null"):
                # A saved chat's stream is consumed server-side (stored, outlet run) and the
                # answer is `null`: the reply is read back from the chat, as the UI does.
                stored = (self.get_chat(chat_id)["chat"].get("history") or {}).get("messages", {})
                reply = stored.get(assistant_id) or {}
                response = {
                    "choices": [{"message": {"role": "assistant", "content": reply.get("content", "")}}],
                    "stored_message": reply,
                }
            else:
                response = _collect_sse(text)
        else:
            response = self.request("POST", "/api/chat/completions", body, timeout=timeout)
        elapsed = time.monotonic() - started
        return {
            "response": response,
            "elapsed": elapsed,
            "assistant_id": assistant_id,
            "user_message_id": user_message_id,
        }

    # -- built-in compaction (admin) ---------------------------------------------
    def get_chat_config(self) -> dict:
        return self.get("/api/v1/chats/config")

    def set_chat_config(self, **changes: Any) -> dict:
        """Merge ``changes`` (ChatConfigForm field names) into the chat config."""
        config = self.get_chat_config()
        config.update(changes)
        config.setdefault("CONTEXT_COMPACTION_PROMPT_TEMPLATE", "")
        if config.get("CONTEXT_COMPACTION_PROMPT_TEMPLATE") is None:
            config["CONTEXT_COMPACTION_PROMPT_TEMPLATE"] = ""
        if config.get("ENABLE_CONTEXT_COMPACTION") is None:
            config["ENABLE_CONTEXT_COMPACTION"] = False
        return self.post("/api/v1/chats/config", config)

    def enable_builtin_compaction(
        self,
        token_threshold: int,
        model: Optional[str] = None,
        retention_percentage: Optional[int] = None,
        token_cap: Optional[int] = None,
    ) -> dict:
        changes: dict = {
            "ENABLE_CONTEXT_COMPACTION": True,
            "CONTEXT_COMPACTION_TOKEN_THRESHOLD": int(token_threshold),
            "CONTEXT_COMPACTION_TOKEN_CAP": int(token_cap or token_threshold),
        }
        if model is not None:
            changes["CONTEXT_COMPACTION_MODEL"] = model
        if retention_percentage is not None:
            changes["CONTEXT_COMPACTION_RETENTION_PERCENTAGE"] = int(retention_percentage)
        return self.set_chat_config(**changes)

    def disable_builtin_compaction(self) -> dict:
        return self.set_chat_config(ENABLE_CONTEXT_COMPACTION=False)


def _collect_sse(text: str) -> dict:
    """Fold an SSE chat-completion stream into one non-streaming-like answer."""
    content = []
    last: dict = {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        last = chunk
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
    return {"choices": [{"message": {"role": "assistant", "content": "".join(content)}}], "last_chunk": last}
