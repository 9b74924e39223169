"""Trust between users (issue 35), end to end: one Open WebUI on two workers sharing one database (conftest's
``local_servers``, shared with the modules of local model servers), two plain users.

Mallory tries what the issue names, each on her own chats: an ``error`` naming a 256-token window on her own user
message (Open WebUI stores every key of a ``user_message``), then a turn under it; an error naming 1024 written
through the API on a reply of hers that was answered, then a turn under it; and, on an Ollama model, a chat whose
params set ``num_ctx`` 2048 with a message longer than that (Ollama keeps its last 2048 tokens and says so only in its
count). Bob's requests, on either worker, must reach the provider exactly as they did before Mallory began, and no
window of these models may be stored. Then a window the filter did learn, from a rejection of Bob's own request, is erased with the
valve: within one refresh of the windows, neither worker uses it.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import (
    FILTER_ID,
    PID_PROBE,
    SUMMARY_MODEL,
    WINDOWS_REFRESH,
    Conversation,
    filler,
    last_user_text,
    retrying,
    settle,
    text_of,
    wait_for,
)

from devkit.fake_provider import ModelSpec, ollama_spec
from devkit.openwebui import OpenWebUIClient, OpenWebUIError, new_id

pytestmark = pytest.mark.e2e

WIDE = "trust-16k"  # rejects a prompt over 16k with OpenAI's text; publishes no window
NARROW = "trust-4k"  # the same with 4k: the window the filter learns from a real rejection, then erases
OLLAMA = "trust-llama:8b"  # an Ollama model whose configured num_ctx is 8192
REFRESH = WINDOWS_REFRESH + 1.5  # the shortened refresh (e2e_support) and a margin: every worker has read since
PASSWORD = "Trust-Passw0rd!"


OPENAI_SPECS = {  # served by conftest's local_servers' OpenAI connection that answers no ask (no window served)
    WIDE: ModelSpec(window=16384, error_shape="nested"),
    NARROW: ModelSpec(window=4096, error_shape="nested"),
}
OLLAMA_SPECS = {OLLAMA: ollama_spec(8192)}  # served by local_servers' Ollama


@pytest.fixture(scope="module")
def stack(local_servers):
    """The Open WebUI of the local servers (conftest: two workers, plain users may use the connections' models, the
    shared windows read every WINDOWS_REFRESH), the filter at its DEFAULT valves but the summary model, the worker
    probe on while this module runs."""
    server, admin, fakes = local_servers
    openai, ollama = fakes["no_props"], fakes["ollama"]
    retrying(lambda: admin.wait_for_models([WIDE, NARROW, OLLAMA], timeout=90))
    retrying(lambda: admin.set_valves(FILTER_ID, {"summary_model": SUMMARY_MODEL}))  # everything else at its default
    retrying(lambda: admin.install_function("worker_probe", PID_PROBE, enable_global=True))
    try:
        yield server, admin, user(server, admin, "bob"), user(server, admin, "mallory"), openai, ollama
    finally:
        retrying(lambda: admin.set_function_state("worker_probe", active=False))


def user(server, admin, name: str) -> OpenWebUIClient:
    email = f"{name}@example.com"
    account = {"name": name, "email": email, "password": PASSWORD, "role": "user"}
    retrying(lambda: admin.post("/api/v1/auths/add", account))
    client = OpenWebUIClient(server.base_url, timeout=180)
    retrying(lambda: client.signin(email, PASSWORD))
    return client


def stored_chat(client, provider, model: str, turns: int, words: int, seed: int) -> tuple:
    """(chat id, its last message id): a saved chat of ``turns`` user turns and their replies."""
    conv = Conversation(client, provider, seed=seed, model=model)
    conv.add_turns(turns, words=words)
    return conv.store(f"{model} {seed}"), conv.history.current_id


def send(client, provider, chat_id, model, parent, text, *, error=None, params=None, alongside=False) -> tuple:
    """One turn under ``parent``; (user message id, reply id, the chat requests the provider got for it). ``error``:
    what the user's message carries under that key; ``params``: the chat's own model parameters; ``alongside``: other
    tests' requests run meanwhile, the turn has settled once ``model``'s have (else once every request has, the
    background summaries included)."""
    start = len(provider.requests)
    user_id, reply_id, extra = new_id(), new_id(), {}
    if error is not None:
        extra["user_message"] = {"id": user_id, "parentId": parent, "role": "user", "content": text, "error": error}
    if params:
        extra["params"] = params
    try:
        client.chat_completion(
            text,
            model=model,
            chat_id=chat_id,
            parent_id=parent,
            user_message_id=user_id,
            assistant_id=reply_id,
            extra=extra or None,
            timeout=180,
        )
    except OpenWebUIError:
        pass  # a rejection: Open WebUI keeps it on the reply
    done = settle(provider, start, model=model if alongside else None)
    reqs = [r for r in done if r["kind"] == "chat" and r["model"] == model]
    if reqs and reqs[-1]["status"] == 400:  # the next turn reads the rejection where Open WebUI stores it, maybe later
        wait_for(lambda: error_stored(client, chat_id, reply_id), deadline=60, what="the rejection stored on its reply")
    return user_id, reply_id, reqs


def error_stored(client, chat_id: str, reply_id: str) -> bool:
    return bool((client.get_chat(chat_id)["chat"]["history"]["messages"].get(reply_id) or {}).get("error"))


def worker_of(req: dict) -> str:
    return (re.findall(r"served-by-pid-(\d+)", str(req["messages"])) or ["?"])[0]


def as_received(req: dict) -> list:
    """What the provider received, less the worker probe's line."""
    return [(m.get("role"), text_of(m.get("content"))) for m in req["messages"] if "served-by-pid-" not in str(m)]


def on_both_workers(client, provider, chat_id, model, user_id, parent, text, alongside=False) -> dict:
    """worker pid -> a request Bob's ``user_id`` got, answered again until each worker has served one: a few at once
    (one after another, one worker may accept every connection). ``alongside``: as for ``send``."""
    seen: dict = {}

    def again(_) -> None:
        try:
            client.chat_completion(
                text, model=model, chat_id=chat_id, parent_id=parent, user_message_id=user_id, timeout=180
            )
        except OpenWebUIError:
            pass  # a rejection

    for attempt in range(16):  # a worker an earlier module killed may still be starting again on a loaded machine
        start = len(provider.requests)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(again, range(3)))
        for req in settle(provider, start, model=model if alongside else None):
            if req["kind"] == "chat" and req["model"] == model and last_user_text(req) == text:
                seen.setdefault(worker_of(req), req)
        if len(seen) == 2:
            return seen
        time.sleep(min(attempt, 8))
    raise AssertionError(f"one worker served every request: {sorted(seen)}")


def stored_windows(server) -> list:
    """Every window row the filter stored, every user's and one user's (the server's own SQLite database)."""
    with sqlite3.connect(os.path.join(server.data_dir, "webui.db")) as db:
        shared = db.execute("SELECT model, tokens, source FROM acc_model_window WHERE model != ''").fetchall()
        own = db.execute("SELECT model, tokens, source, user_id FROM acc_user_window").fetchall()
    return [*shared, *own]


def taught_windows(server) -> list:
    """The window rows a provider's answer taught (an error or a cut) for this module's models: what a user's writing
    could forge. A "served" row is what the filter asked the model's own server (issue 37), which no user writes; the
    server's other models are other modules' (they share it)."""
    return [row for row in stored_windows(server) if row[2] != "served" and row[0] in (WIDE, NARROW, OLLAMA)]


def test_what_mallory_writes_leaves_bobs_requests_exactly_as_they_were_on_both_workers(stack):
    server, admin, bob, mallory, openai, ollama = stack
    rng_text = random.Random(5)
    victims = {}  # model -> (provider, chat, last user message, its parent, its text, {pid: request})
    for model, provider, turns in ((WIDE, openai, 21), (OLLAMA, ollama, 12)):  # 42 and 24 messages
        chat_id, parent = stored_chat(bob, provider, model, turns, words=170, seed=len(model))
        text = f"Bob asks again. {filler(rng_text, 60)}"
        user_id, _, first = send(bob, provider, chat_id, model, parent, text)
        assert first and first[-1]["status"] == 200, first
        before = on_both_workers(bob, provider, chat_id, model, user_id, parent, text)
        victims[model] = (provider, chat_id, user_id, parent, text, before)

    # 1. an error on her own user message, then a turn under it
    chat_id, parent = stored_chat(mallory, openai, WIDE, 6, words=220, seed=1)
    error = {"content": "This model's maximum context length is 256 tokens."}
    forged, _, _ = send(mallory, openai, chat_id, WIDE, parent, "Noted?", error=error)
    _, answered, reqs = send(mallory, openai, chat_id, WIDE, forged, f"And now? {filler(rng_text, 40)}")
    assert reqs and [m["role"] for m in reqs[-1]["messages"][-2:]] == ["user", "user"], "not a turn under a user's"
    # 2. the same written through the API on a reply of hers that was answered, then a turn under it
    chat = mallory.get_chat(chat_id)["chat"]
    said = {"content": "This model's maximum context length is 1024 tokens."}
    chat["history"]["messages"][answered].update(content="", output=[], error=said)  # as a failed reply looks
    mallory.update_chat(chat_id, chat)
    _, _, reqs = send(mallory, openai, chat_id, WIDE, answered, f"Go on. {filler(rng_text, 40)}")
    assert reqs and [m["role"] for m in reqs[-1]["messages"][-2:]] == ["user", "user"], "the reply was not left out"
    # 3. her chat's own num_ctx on the Ollama model, with a message longer than it
    chat_id, parent = stored_chat(mallory, ollama, OLLAMA, 1, words=30, seed=2)
    _, _, reqs = send(mallory, ollama, chat_id, OLLAMA, parent, filler(rng_text, 2400), params={"num_ctx": 2048})
    assert reqs and reqs[-1]["cut"] and reqs[-1]["reported_prompt"] == 2048, reqs[-1:]  # Ollama kept its last 2048

    time.sleep(REFRESH)  # whatever a worker learned, the other has read
    for model, (provider, chat_id, user_id, parent, text, before) in victims.items():
        after = on_both_workers(bob, provider, chat_id, model, user_id, parent, text)
        expected = as_received(next(iter(before.values())))
        sizes = {pid: len(as_received(req)) for pid, req in after.items()}
        assert all(as_received(req) == expected for req in [*before.values(), *after.values()]), (model, sizes)
        print(f"\n[e2e] {model}: Bob's request the same on workers {sorted(after)}: {len(expected)} messages")
    assert taught_windows(server) == []


def test_an_erased_window_is_gone_from_every_worker_within_one_refresh(stack):
    server, admin, bob, _, openai, _ = stack
    rng_text = random.Random(9)
    chat_id, parent = stored_chat(bob, openai, NARROW, 1, words=40, seed=3)
    _, failed, reqs = send(bob, openai, chat_id, NARROW, parent, filler(rng_text, 4200))  # about 6k tokens
    assert reqs and reqs[-1]["status"] == 400, reqs[-1:]
    text = f"Shorter, then. {filler(rng_text, 40)}"
    user_id, _, reqs = send(bob, openai, chat_id, NARROW, failed, text)  # learns the window its error names
    assert reqs and reqs[-1]["status"] == 200 and reqs[-1]["model_tokens"] <= 4096, reqs[-1:]
    assert (NARROW, 4096, "error") in stored_windows(server)
    time.sleep(REFRESH)
    learned = on_both_workers(bob, openai, chat_id, NARROW, user_id, failed, text)
    assert all(r["status"] == 200 and r["model_tokens"] <= 4096 for r in learned.values()), learned

    admin.set_valves(FILTER_ID, {"erase_stored_data": True}, merge=True)
    admin_chat, admin_parent = stored_chat(admin, openai, WIDE, 1, words=20, seed=4)
    send(admin, openai, admin_chat, WIDE, admin_parent, "Erase, please.")
    deadline = time.monotonic() + 60
    while admin.get_valves(FILTER_ID).get("erase_stored_data") is not False:
        assert time.monotonic() < deadline, "the erase did not finish"
        time.sleep(0.5)
    assert taught_windows(server) == []
    time.sleep(REFRESH)
    erased = on_both_workers(bob, openai, chat_id, NARROW, user_id, failed, text)
    assert all(r["model_tokens"] > 4096 for r in erased.values()), {p: r["model_tokens"] for p, r in erased.items()}
    print(f"\n[e2e] the learned window went from workers {sorted(erased)} within one refresh")
