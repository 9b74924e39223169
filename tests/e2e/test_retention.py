"""Nothing the filter stores outlives what the user asked Open WebUI to forget (issue 28), in a real Open WebUI with
two uvicorn workers, on SQLite and on PostgreSQL with ``DATABASE_SCHEMA``:

* a temporary chat long enough to be summarized leaves no row holding its id or its text (watched while it runs:
  a row written and swept a few seconds later would not pass either);
* a chat deleted through ``DELETE /api/v1/chats/{id}`` leaves no row within the sweep's period;
* a user deleted through ``DELETE /api/v1/users/{id}`` likewise.

The sweep runs every ACC_RETENTION_SWEEP_SECONDS (4 s here; 300 s by default).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    SUMMARY_MODEL,
    Conversation,
    multi_worker_server,
    settle,
    user_text,
    wait_for,
)

from devkit.openwebui import OpenWebUIClient, OpenWebUIServer
from devkit.services import ThrowawayPostgres

pytestmark = pytest.mark.e2e

SWEEP_EVERY = 4  # seconds (ACC_RETENTION_SWEEP_SECONDS)
GONE_WITHIN = 2 * SWEEP_EVERY + 20  # two periods (one may be resting) and slack for a busy machine
SCHEMA = "owui_retention"
PASSWORD = "Retention-Passw0rd!"


class Backend:
    """One Open WebUI (2 workers) and a way to read every row of the filter's tables (``acc_*``) as text."""

    def __init__(self, kind: str, server: OpenWebUIServer, client: OpenWebUIClient, pg=None):
        self.kind, self.server, self.client, self.pg = kind, server, client, pg

    def rows(self) -> list:
        if self.kind == "sqlite":
            with sqlite3.connect(os.path.join(self.server.data_dir, "webui.db"), timeout=10) as conn:
                names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
                return [repr(r) for n in names if n.startswith("acc_") for r in conn.execute(f'SELECT * FROM "{n}"')]
        (names,) = self.pg.sql(f"SELECT tablename FROM pg_tables WHERE schemaname = '{SCHEMA}'", database="owui")
        tables = [n for (n,) in names if n.startswith("acc_")]
        found = self.pg.sql(*(f'SELECT * FROM "{SCHEMA}"."{n}"' for n in tables), database="owui") if tables else []
        return [repr(r) for rows in found for r in rows]

    def rows_with(self, *needles: str) -> list:
        return [r for r in self.rows() if any(n in r for n in needles)]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, owui_python, provider, filter_source):
    pg, env = None, {"ACC_RETENTION_SWEEP_SECONDS": str(SWEEP_EVERY), "BYPASS_MODEL_ACCESS_CONTROL": "true"}
    if request.param == "postgres":
        pg = ThrowawayPostgres().start()
        env.update(DATABASE_URL=pg.create_database("owui", schema=SCHEMA), DATABASE_SCHEMA=SCHEMA)
    try:
        with multi_worker_server(owui_python, provider, filter_source, "retention", env_extra=env) as (server, client):
            yield Backend(request.param, server, client, pg)
    finally:
        if pg is not None:
            pg.stop()


def summarized_chat(client, provider, seed: int) -> Conversation:
    """A saved chat over the trigger, one live turn, its summary stored."""
    conv = Conversation(client, provider, seed=seed)
    conv.add_turns(8)
    conv.store("retention")
    conv.turn()
    return conv


def test_a_temporary_chat_leaves_no_row_holding_its_id_or_text(backend, provider):
    chat_id = f"temporary:{uuid.uuid4()}"
    conv = Conversation(backend.client, provider, seed=281)
    conv.add_turns(8)
    messages = [{"role": "system", "content": conv.system}] + [
        {"role": m["role"], "content": m["content"]} for m in conv.history.branch(conv.history.current_id)
    ]
    texts = [m["content"][:60] for m in messages[1:] if m["role"] == "user"]
    seen, stop = [], threading.Event()

    def watch():  # every row written, even one a sweep removes seconds later
        while not stop.is_set():
            seen.extend(backend.rows_with(chat_id, *texts))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = len(provider.requests)
    try:
        for turn in range(3):
            messages.append({"role": "user", "content": user_text(f"TMP{turn}", conv.rng)})
            texts.append(messages[-1]["content"][:60])
            body = {"model": CHAT_MODEL, "stream": False, "chat_id": chat_id, "id": str(uuid.uuid4())}
            reply = backend.client.post("/api/chat/completions", {**body, "messages": messages})
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            settle(provider, start)
    finally:
        stop.set()
        watcher.join()
    made = [r for r in provider.requests[start:] if r["kind"] == "summary"]
    assert made and all(r["status"] == 200 for r in made), "the temporary chat was never summarized"
    assert not seen and not backend.rows_with(chat_id, *texts), seen[:3]


def test_a_deleted_chat_leaves_no_row_within_the_sweep_period(backend, provider):
    conv = summarized_chat(backend.client, provider, seed=282)
    wait_for(lambda: backend.rows_with(conv.chat_id), 60, interval=0.5, what="the chat's summary stored")
    kept = summarized_chat(backend.client, provider, seed=283)  # another chat of the same user stays
    wait_for(lambda: backend.rows_with(kept.chat_id), 60, interval=0.5, what="the other chat's summary stored")

    assert backend.client.request("DELETE", f"/api/v1/chats/{conv.chat_id}") is True
    wait_for(
        lambda: not backend.rows_with(conv.chat_id), GONE_WITHIN, interval=0.5, what="the deleted chat's rows swept"
    )
    assert backend.rows_with(kept.chat_id)


def test_a_deleted_user_leaves_no_row_within_the_sweep_period(backend, provider):
    email = f"leaver-{uuid.uuid4().hex[:8]}@example.com"
    added = backend.client.post(
        "/api/v1/auths/add", {"name": "Leaver", "email": email, "password": PASSWORD, "role": "user"}
    )
    leaver = OpenWebUIClient(backend.server.base_url, timeout=180)
    leaver.signin(email, PASSWORD)
    conv = summarized_chat(leaver, provider, seed=284)
    wait_for(lambda: backend.rows_with(added["id"]), 60, interval=0.5, what="the user's summary stored")

    assert backend.client.request("DELETE", f"/api/v1/users/{added['id']}") is True
    wait_for(
        lambda: not backend.rows_with(added["id"], conv.chat_id),
        GONE_WITHIN,
        interval=0.5,
        what="the user's rows swept",
    )


def test_the_erase_valve_erases_every_row_and_switches_itself_off(backend, provider):
    conv = summarized_chat(backend.client, provider, seed=285)
    wait_for(lambda: backend.rows_with(conv.chat_id), 60, interval=0.5, what="a summary stored")
    backend.client.set_valves(FILTER_ID, {"erase_stored_data": True}, merge=True)
    try:
        backend.client.chat_completion("hello", model=CHAT_MODEL)  # any request: its inlet starts the erase
        # the chat still exists (the sweep keeps its rows); the ratio of this reply and the sweep's own lease may be
        # written again at once: they hold no user, chat or text
        mine = (conv.chat_id, backend.client.user["id"], SUMMARY_MODEL)
        wait_for(lambda: not backend.rows_with(*mine), 30, interval=0.5, what="every summary and lease erased")
        wait_for(
            lambda: backend.client.get_valves(FILTER_ID).get("erase_stored_data") is False,
            30,
            interval=0.5,
            what="the valve switched off",
        )
        assert backend.client.get_valves(FILTER_ID)["compression_threshold_tokens"] == 1500  # the others kept
    finally:
        backend.client.set_valves(FILTER_ID, dict(E2E_VALVES))
