"""Several replicas as Open WebUI scales out (issue 23): two Open WebUI
servers, two uvicorn workers each, on one PostgreSQL (``DATABASE_SCHEMA``)
and one Redis (``WEBSOCKET_MANAGER=redis``), sharing one ``WEBUI_SECRET_KEY``;
PostgreSQL and Redis from Debian's packages, started here
(scripts/start_postgres.sh, scripts/start_redis.sh).

A probe filter stamps every chat request with the replica that served it
(``acc-replica: A|B``, the same length on both, so counts do not differ);
the stamp is left out wherever two requests are compared. The module has its
own fake provider, so its log holds this deployment's requests only.

* one chat whose turns alternate between the replicas: no 400, nothing over
  the cap, one summary per real change, each summary used by both replicas;
* a burst of 8 replies at once, spread over both: the same;
* the same turn regenerated on each replica: the same list reaches the model
  (counts, repairs and the summary), and the same status line is shown;
* the background status lines reach a browser connected to the other replica
  (through Redis);
* a replica killed mid-summary: the other makes the summary within the lease.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
import time

import pytest
from e2e_support import (
    CHAT_MODEL,
    CHROMIUM,
    CHROMIUM_ARGS,
    E2E_VALVES,
    FILTER_ID,
    LEASE_RENEW,
    LEASE_TTL,
    SUMMARY_MODEL,
    Conversation,
    brief,
    check_turn,
    has_summary,
    pids_connected_to,
    retrying,
    settle,
    summary_text,
    text_of,
    turn_until_summary_pending,
    user_text,
    wait_for,
)

from devkit.fake_provider import FakeProvider
from devkit.openwebui import OpenWebUIClient, ensure_offline_tiktoken, start_replicas
from devkit.services import ThrowawayPostgres, ThrowawayRedis, replica_env

pytestmark = pytest.mark.e2e

CAP = E2E_VALVES["max_context_tokens"]
SUMMARIES_KEPT = 8  # async_context_compression.SUMMARIES_KEPT_PER_CHAT: older rows are pruned
SCHEMA = "owui"
STAMP_RE = re.compile(r"acc-replica: ([AB])")
EMAIL, PASSWORD = "replicas@example.com", "Replicas-Passw0rd!"

REPLICA_PROBE = '''"""
title: Replica Probe
id: replica_probe
version: 0.0.1
description: stamps each request with the replica that served it ($ACC_REPLICA)
"""
import os
from pydantic import BaseModel


class Filter:
    class Valves(BaseModel):
        priority: int = 0

    def __init__(self):
        self.valves = self.Valves()

    async def inlet(self, body: dict) -> dict:
        stamp = {"role": "system", "content": "acc-replica: " + os.environ.get("ACC_REPLICA", "?")}
        body["messages"] = [stamp] + list(body.get("messages") or [])
        return body
'''


# ---------------------------------------------------------------------------
# the deployment
# ---------------------------------------------------------------------------


class Deployment:
    def __init__(self, pg, redis, provider, servers, clients):
        self.pg, self.redis, self.provider = pg, redis, provider
        self.servers = dict(zip("AB", servers))
        self.clients = dict(zip("AB", clients))

    def summaries(self, chat_id: str) -> list:
        """The filter's rows for the chat: (summary, covered_count, fingerprint), oldest first."""
        (rows,) = self.pg.sql(
            f"SELECT summary, covered_count, fingerprint FROM {SCHEMA}.acc_chat_summary "
            f"WHERE chat_id = '{chat_id}' ORDER BY id",
            database="owui",
        )
        return rows

    def tables(self, schema: str) -> set:
        (rows,) = self.pg.sql(f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'", database="owui")
        return {r[0] for r in rows}


@pytest.fixture(scope="module")
def deployment(owui_python, filter_source):
    provider = FakeProvider(mode="strict").start()
    pg = ThrowawayPostgres()
    redis = ThrowawayRedis()
    servers: list = []
    try:
        pg.start()
        redis.start()
        url = pg.create_database("owui", schema=SCHEMA)
        started = time.monotonic()
        servers = start_replicas(
            2,
            provider.base_url,
            python=owui_python,
            env_extra={**replica_env(url, redis.url, SCHEMA), "ACC_TEST_LEASE_TTL": str(LEASE_TTL)},
            replica_env=[{"ACC_REPLICA": "A"}, {"ACC_REPLICA": "B"}],
            workers=2,
            tiktoken_cache_dir=ensure_offline_tiktoken(owui_python),
            timeout=900,
        )
        print(
            f"\n[e2e] 2 replicas x 2 workers up in {time.monotonic() - started:.0f}s: {[s.base_url for s in servers]}"
        )
        a = OpenWebUIClient(servers[0].base_url, timeout=180)
        retrying(lambda: a.signup(EMAIL, PASSWORD, "Replicas Admin"))
        b = OpenWebUIClient(servers[1].base_url, timeout=180)
        retrying(lambda: b.signin(EMAIL, PASSWORD))
        for client in (a, b):
            retrying(lambda c=client: c.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=120))
        a.install_function(FILTER_ID, filter_source, valves=dict(E2E_VALVES), enable_global=True)
        a.install_function("replica_probe", REPLICA_PROBE, enable_global=True)
        yield Deployment(pg, redis, provider, servers, [a, b])
    finally:
        for server in servers:
            if os.environ.get("ACC_KEEP_E2E_DATA"):
                print(f"\n[e2e] replica log {server.log_path}")
            server.stop()
        if servers and not os.environ.get("ACC_KEEP_E2E_DATA"):
            servers[0].cleanup()
        redis.stop()
        pg.stop()
        provider.stop()


@pytest.fixture
def dep(deployment):
    deployment.provider.configure(summary_delay=None, summary_fail=None, chat_delay=None, reply_text=None)
    yield deployment
    deployment.provider.configure(summary_delay=None, summary_fail=None, chat_delay=None, reply_text=None)


# ---------------------------------------------------------------------------
# reading the provider's log
# ---------------------------------------------------------------------------


def replica_of(req: dict) -> str:
    """The replica whose probe stamped the request (the filter may merge the
    stamp into the leading system message: it is searched, not matched)."""
    for m in req.get("messages") or []:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            found = STAMP_RE.search(text_of(m.get("content")))
            if found:
                return found.group(1)
    return "?"


def unstamped(req: dict) -> list:
    """The request's messages with the probe's stamp made the same on every
    replica (``acc-replica: X``; the same length, so no count moves)."""

    def clean(value):
        if isinstance(value, str):
            return STAMP_RE.sub("acc-replica: X", value)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return [
        clean(m) if isinstance(m, dict) and m.get("role") in ("system", "developer") else m
        for m in req.get("messages") or []
    ]


def chats_since(provider, start: int) -> list:
    return [r for r in provider.requests[start:] if r["kind"] == "chat"]


def summaries_since(provider, start: int) -> list:
    return [r for r in provider.requests[start:] if r["kind"] == "summary"]


def check_one_summary_per_change(dep: Deployment, chat_id: str, start: int) -> list:
    """Every summarizer call answered, none made twice for the same input,
    and each stored once: one row per call, no two rows for the same span."""
    made = summaries_since(dep.provider, start)
    assert all(s["status"] == 200 for s in made), [brief(s) for s in made if s["status"] != 200][:2]
    inputs = [json.dumps(s["messages"], sort_keys=True) for s in made]
    assert len(inputs) == len(set(inputs)), "the same span was summarized twice"
    rows = dep.summaries(chat_id)
    kept = min(len(made), SUMMARIES_KEPT)
    assert len(rows) == kept, f"{len(made)} summarizer calls but {len(rows)} rows stored (at most {SUMMARIES_KEPT})"
    spans = [(covered, fingerprint) for _, covered, fingerprint in rows]
    assert len(spans) == len(set(spans)), f"two rows for the same span: {spans}"
    assert all(text.strip() for text, _, _ in rows), "a stored summary is empty"
    return rows


def users_of(rows: list, reqs: list) -> dict:
    """For each stored summary: the replicas whose chat requests carried it."""
    used = {}
    for index, (text, _, _) in enumerate(rows):
        used[index] = {replica_of(r) for r in reqs if text.strip() and text.strip() in summary_text(r)}
    return used


def alternate(conv: Conversation, dep: Deployment, name: str) -> None:
    conv.client = dep.clients[name]


# ---------------------------------------------------------------------------
# one chat, turns alternating between the replicas
# ---------------------------------------------------------------------------


def test_turns_alternating_between_replicas(dep):
    provider = dep.provider
    start = len(provider.requests)
    conv = Conversation(dep.clients["A"], provider, seed=231)
    conv.add_turns(3)
    conv.store("replicas alternating")
    problems = []
    for i in range(12):
        alternate(conv, dep, "AB"[i % 2])
        problems += check_turn(conv, conv.turn(), CAP)
    # the newest summary too must be used by both: the last user message's
    # reply regenerated on A and then on B adds next to nothing, so no newer
    # summary is due (up to 3 pairs, should one still be made)
    last = conv.turns[-1].user_id
    for _ in range(3):
        before = len(provider.requests)
        for name in "AB":
            alternate(conv, dep, name)
            problems += check_turn(conv, conv.turn(regenerate_of=last), CAP)
        if not summaries_since(provider, before):
            break
    assert not problems, "\n".join(problems[:10])
    chats = chats_since(provider, start)
    assert {replica_of(r) for r in chats} == {"A", "B"}, "the probe did not see both replicas:\n" + brief(chats[0])
    assert not [r for r in provider.requests[start:] if r["status"] == 400]
    assert max(r["tokens"] for r in chats) <= CAP
    rows = check_one_summary_per_change(dep, conv.chat_id, start)
    assert len(rows) >= 2, f"only {len(rows)} summaries: the test shows too little"
    used = users_of(rows, chats)
    unused = {i: who for i, who in used.items() if who != {"A", "B"}}
    assert not unused, f"summaries not used by both replicas (row index: replicas that used it): {unused}"
    assert {"acc_chat_summary", "acc_summary_lease"} <= dep.tables(SCHEMA)
    assert not {"acc_chat_summary", "acc_summary_lease"} & dep.tables("public")
    print(f"\n[e2e] {len(rows)} summaries, used by {used}")


# ---------------------------------------------------------------------------
# a burst of 8 replies at once, spread over both replicas
# ---------------------------------------------------------------------------


def test_burst_of_eight_replies_over_both_replicas(dep):
    provider = dep.provider
    start = len(provider.requests)
    conv = Conversation(dep.clients["A"], provider, seed=232)
    conv.add_turns(7)  # past the threshold: the burst's outlets all want the same summary
    conv.store("replicas burst")
    parent = conv.history.current_id
    texts = [user_text(f"MK-burst{i}{secrets.token_hex(2)}", conv.rng) for i in range(8)]
    results: list = [None] * 8
    errors: list = []
    go = threading.Barrier(8)

    def reply(i: int) -> None:
        client = dep.clients["AB"[i % 2]]
        go.wait()
        try:
            results[i] = client.chat_completion(
                texts[i], model=CHAT_MODEL, chat_id=conv.chat_id, parent_id=parent, system=conv.system, timeout=300
            )
        except Exception as exc:  # counted, not raised in the thread
            errors.append(exc)

    threads = [threading.Thread(target=reply, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    settle(provider, start, quiet=2, deadline=180)
    chats = chats_since(provider, start)
    burst = [r for r in chats if any(t == text_of((unstamped(r) or [{}])[-1].get("content")) for t in texts)]
    assert len(burst) == 8, f"{len(burst)} of the 8 replies reached the provider"
    assert {replica_of(r) for r in burst} == {"A", "B"}
    assert all(r["status"] == 200 for r in chats), [brief(r) for r in chats if r["status"] != 200][:2]
    assert max(r["tokens"] for r in chats) <= CAP
    rows = check_one_summary_per_change(dep, conv.chat_id, start)
    assert rows, "the burst made no summary: the test shows nothing"
    # one more reply on each replica, under one of the burst's replies: both use the summary made
    leaf = results[0]["assistant_id"]
    after = len(provider.requests)
    for name in "AB":
        dep.clients[name].chat_completion(
            user_text(f"MK-after{name}{secrets.token_hex(2)}", conv.rng),
            model=CHAT_MODEL,
            chat_id=conv.chat_id,
            parent_id=leaf,
            system=conv.system,
            timeout=300,
        )
        settle(provider, after, deadline=120)
    later = chats_since(provider, after)
    newest = dep.summaries(conv.chat_id)
    for name in "AB":
        mine = [r for r in later if replica_of(r) == name]
        assert mine and all(has_summary(r) for r in mine), f"replica {name} did not use the summary"
        assert any(newest[-1][0].strip() in summary_text(r) for r in mine), f"replica {name}: not the newest summary"
    assert not [r for r in provider.requests[start:] if r["status"] == 400]
    print(f"\n[e2e] burst of 8: {len(summaries_since(provider, start))} summarizer call(s), {len(newest)} row(s)")


# ---------------------------------------------------------------------------
# the same turn on each replica: the same request
# ---------------------------------------------------------------------------


def reply_status(client, chat_id: str, message_id: str) -> list:
    chat = client.get_chat(chat_id)["chat"]
    message = (chat.get("history") or {}).get("messages", {}).get(message_id) or {}
    return [s.get("description") for s in message.get("statusHistory") or [] if isinstance(s, dict)]


NOTE_RE = re.compile(r" · Settings: .*$")


def test_same_turn_sends_the_same_on_both_replicas(dep):
    """A chat with tool rounds (repaired, so the per-worker repair memo is
    involved) and a summary: the same user message regenerated on A and then
    on B (cold caches there) must reach the model as the same list with the
    same counts, and say the same status line."""
    provider = dep.provider
    start = len(provider.requests)
    conv = Conversation(dep.clients["A"], provider, seed=233)
    conv.add_turns(2)
    conv.add_user()
    conv.add_tools([["search", "fetch"], ["search"]])
    conv.add_turns(3)
    conv.store("replicas same turn")
    for i in range(6):
        alternate(conv, dep, "AB"[i % 2])
        conv.turn()
    assert dep.summaries(conv.chat_id), "no summary before the comparison"
    target = conv.turns[-1].user_id
    compared = None
    for _ in range(3):
        pair = {}
        t0 = len(provider.requests)
        for name in "AB":
            alternate(conv, dep, name)
            turn = conv.turn(regenerate_of=target)
            assert len(turn.requests) == 1, [brief(r) for r in turn.requests]
            pair[name] = (turn.requests[0], reply_status(dep.clients[name], conv.chat_id, turn.assistant_id))
        if not summaries_since(provider, t0):  # no summary changed the chat between the two
            compared = pair
            break
    assert compared, "a summary was made between the two requests three times in a row"
    (req_a, status_a), (req_b, status_b) = compared["A"], compared["B"]
    assert replica_of(req_a) == "A" and replica_of(req_b) == "B"
    assert has_summary(req_a)
    assert unstamped(req_a) == unstamped(req_b), "the replicas sent different lists for the same turn"
    assert req_a["tokens"] == req_b["tokens"]
    assert status_a and status_a == status_b, (status_a, status_b)
    assert not [r for r in provider.requests[start:] if r["status"] == 400]
    print(f"\n[e2e] same turn on A and B: {req_a['tokens']} tokens each; status {status_a[-1]!r}")


def test_same_turn_says_the_same_status_line_on_both_replicas(dep):
    """The status line is a function of the request: a chat's settings note
    on its turn 11 (turns 1, 11, 21, ...) on every worker of both replicas,
    however often the turn is regenerated, and on neither at turns 12 and 13."""
    conv = Conversation(dep.clients["A"], dep.provider, seed=236)
    conv.add_turns(10, words=20)  # short: no summary due while the lines are compared
    conv.store("replicas same note")
    target = conv.turn().user_id
    said = {}
    for i, name in enumerate("AABB"):  # workers that said it already, then B's (cold for this chat)
        alternate(conv, dep, name)
        turn = conv.turn(regenerate_of=target)
        said[f"{name}{i}"] = reply_status(dep.clients[name], conv.chat_id, turn.assistant_id)
    first = said["A0"]
    assert any(NOTE_RE.search(line or "") for line in first), f"the e2e valves give no settings note: {first}"
    assert all(lines == first for lines in said.values()), said
    for name in "BA":
        alternate(conv, dep, name)
        turn = conv.turn()
        lines = reply_status(dep.clients[name], conv.chat_id, turn.assistant_id)
        assert lines and not any(NOTE_RE.search(line or "") for line in lines), (name, lines)


# ---------------------------------------------------------------------------
# the background status lines reach a browser on the other replica
# ---------------------------------------------------------------------------

UPDATED = re.compile(r"Summary updated: covers (\d+) messages?")


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium is not installed at {CHROMIUM}")
def test_background_status_reaches_a_browser_on_the_other_replica(dep):
    from playwright.sync_api import sync_playwright

    provider = dep.provider
    b_url = dep.servers["B"].base_url
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1100, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(b_url + "/auth", wait_until="domcontentloaded")
            page.fill("input[type=email]", EMAIL)
            page.fill("input[type=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(lambda url: "/auth" not in url, timeout=90_000)
            provider.configure(summary_delay=25)
            conv = Conversation(dep.clients["A"], provider, seed=234)
            conv.add_turns(3)
            conv.store("replicas browser")
            # the turn is served by A, whose outlet (inline in that request) starts the summary on A
            index = turn_until_summary_pending(conv, provider)
            reply_id = conv.turns[-1].assistant_id
            page.goto(f"{b_url}/c/{conv.chat_id}", wait_until="domcontentloaded")
            page.locator(".chat-assistant").last.wait_for(state="visible", timeout=90_000)
            wait_for(lambda: "[fake-chat]" in page.locator(".chat-assistant").last.inner_text(), 60, what="reply")
            pending = provider.requests[index]["status"] is None
            assert pending, "the summary ended before the page on B was ready: nothing left to prove (slow machine?)"
            assert not UPDATED.search(page.locator("body").inner_text()), "already shown before the summary ended"
            # no reload from here on: the line can only arrive over the page's socket, from A through Redis
            wait_for(
                lambda: UPDATED.search(page.locator("body").inner_text()),
                deadline=60,
                interval=0.5,
                what="'Summary updated' on the page connected to replica B",
            )
            assert provider.requests[index]["status"] == 200
            stored = reply_status(dep.clients["B"], conv.chat_id, reply_id)
            assert any(UPDATED.search(s or "") for s in stored), stored
            context.close()
        finally:
            browser.close()
            provider.configure(summary_delay=None)
    settle(provider, index, deadline=60)


# ---------------------------------------------------------------------------
# a replica killed mid-summary (last: replica A stays down)
# ---------------------------------------------------------------------------


def test_replica_killed_mid_summary_the_other_makes_it(dep):
    provider = dep.provider
    server_a = dep.servers["A"]
    provider.configure(summary_delay=60)
    start = len(provider.requests)
    conv = Conversation(dep.clients["A"], provider, seed=235)
    conv.add_turns(3)
    conv.store("replicas kill")
    turn_until_summary_pending(conv, provider)
    workers_a = [p for p in server_a.worker_pids() if p != server_a.proc.pid]
    holder = wait_for(lambda: pids_connected_to(provider.port, workers_a), deadline=5, what="A's worker summarizing")
    assert holder, "the running summary is not replica A's"
    os.killpg(os.getpgid(server_a.proc.pid), signal.SIGKILL)
    killed = time.monotonic()
    provider.configure(summary_delay=1)
    alternate(conv, dep, "B")
    made_at = None
    early = []
    while time.monotonic() - killed < LEASE_TTL + 30:
        t0 = len(provider.requests)
        assert not check_turn(conv, conv.turn(timeout=60), CAP, markers=False)
        done = [s for s in summaries_since(provider, t0) if s["status"] == 200]
        if done:
            made_at = time.monotonic() - killed
            if made_at < LEASE_TTL - LEASE_RENEW:
                early.append(made_at)
            break
        time.sleep(2)
    assert not early, f"a summary was made {early[0]:.0f}s after the kill, while the dead replica's lease was alive"
    assert made_at is not None, f"replica B made no summary within {LEASE_TTL + 30}s of the kill"
    print(f"\n[e2e] replica A killed mid-summary; B made the summary {made_at:.1f}s later (lease TTL {LEASE_TTL}s)")
    # the turn cadence (a turn, then 2 s) and the 1 s summarizer are the slack over the TTL
    assert made_at <= LEASE_TTL + 8, f"B made the summary {made_at:.0f}s after the kill"
    rows = dep.summaries(conv.chat_id)
    assert rows and all(text.strip() for text, _, _ in rows)
    after = conv.turn()
    # markers=False: turns made during the outage may be left out until a later summary folds them
    assert not check_turn(conv, after, CAP, markers=False)
    assert has_summary(after.requests[0]) and rows[-1][0].strip() in summary_text(after.requests[0])
    chats = chats_since(provider, start)
    assert all(r["status"] == 200 for r in chats), [brief(r) for r in chats if r["status"] != 200][:2]
    assert not [r for r in provider.requests[start:] if r["status"] == 400]
