"""Faults of a real deployment (issue 14), one test per row of the fault
table in docs/en/faults.md, against a real Open WebUI (the PostgreSQL rows,
on a deployment of their own, are tests/e2e/test_faults_pg.py):

    summarizer down / empty answer / timeout    the session server (SQLite)
    SQLite locked                               the session server (SQLite)
    worker killed mid-summary                   2 workers sharing one database

Each test asserts that the chat keeps working (no 400, no failed turn except
those made while the database itself was down), what reaches the model
(system prompt, the latest turns verbatim, under the cap) and, through
``assert_fault_status``, what the status line says.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    LEASE_RENEW,
    LEASE_TTL,
    PID_PROBE,
    Conversation,
    assert_fault_status,
    assert_kept,
    brief,
    chat_400s,
    has_summary,
    pids_connected_to,
    provider_errors,
    settle,
    summaries_since,
    summary_text,
    turn_until_summary_pending,
    wait_for,
)

pytestmark = pytest.mark.e2e

CAP = E2E_VALVES["max_context_tokens"]


# ---------------------------------------------------------------------------
# summarizer faults (session server, SQLite)
# ---------------------------------------------------------------------------

SUMMARIZER_FAULTS = {
    # row: (provider setting, valves, reason key)
    "summarizer_down": (dict(summary_fail="500"), {}, "model_error"),
    "empty_answer": (dict(summary_fail="empty"), {}, "empty"),
    "timeout": (dict(summary_delay=9), {"summary_timeout_seconds": 5}, "timeout"),
}


@pytest.mark.parametrize("row", list(SUMMARIZER_FAULTS))
def test_summarizer_fault_keeps_the_chat_under_the_cap(acc, provider, owui_server, filter_source, row):
    provider_cfg, valves, reason = SUMMARIZER_FAULTS[row]
    provider.configure(**provider_cfg)
    if valves:
        acc.set_valves(FILTER_ID, {**E2E_VALVES, **valves})
    start = len(provider.requests)
    conv = Conversation(acc, provider, seed=hash(row) % 1000)
    conv.add_turns(3)
    conv.store(f"fault {row}")
    for _ in range(7):
        assert_kept(conv, conv.turn())
    attempts = summaries_since(provider, start)
    assert attempts, "the filter never tried to summarize"
    if row == "summarizer_down":
        assert all(s["status"] == 500 for s in attempts)
    assert sqlite_summaries(os.path.join(owui_server.data_dir, "webui.db"), conv.chat_id) == []
    assert not chat_400s(provider, start), [brief(r) for r in chat_400s(provider, start)][:2]
    assert not provider_errors([r for r in provider.requests[start:] if r["kind"] == "chat"])
    last = conv.turns[-1]
    assert not any(has_summary(r) for r in last.requests), "a failed summary must not be used"
    assert max(r["tokens"] for t in conv.turns for r in t.requests) <= CAP
    assert_fault_status(acc, conv.chat_id, reason, filter_source)


def test_sqlite_locked_during_the_save_is_retried(acc, provider, owui_server):
    """Another writer holds SQLite's write lock for 8 s while the summary is
    made: Open WebUI's own writes wait (busy_timeout 5 s), the filter's save
    is retried until the lock clears; the summary is kept and used."""
    provider.configure(summary_delay=2)
    start = len(provider.requests)
    conv = Conversation(acc, provider, seed=31)
    conv.add_turns(3)
    conv.store("fault sqlite locked")
    turn_until_summary_pending(conv, provider)
    db_path = os.path.join(owui_server.data_dir, "webui.db")
    locker = sqlite3.connect(db_path, timeout=10, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        time.sleep(8)
    finally:
        locker.rollback()
        locker.close()
    settle(provider, start, deadline=90)
    assert [s["status"] for s in summaries_since(provider, start)] == [200]
    rows = sqlite_summaries(db_path, conv.chat_id)
    assert len(rows) == 1 and rows[0][0].strip(), rows  # saved whole
    provider.configure(summary_delay=None)
    after = conv.turn()
    assert_kept(conv, after)
    assert has_summary(after.requests[0]), "the summary saved through the lock was not used"
    assert not chat_400s(provider, start)


def sqlite_summaries(db_path: str, chat_id: str) -> list:
    with sqlite3.connect(db_path, timeout=10) as conn:
        return conn.execute(
            "SELECT summary, covered_count FROM acc_chat_summary WHERE chat_id = ? ORDER BY id", (chat_id,)
        ).fetchall()


# ---------------------------------------------------------------------------
# a worker killed mid-summary (2 workers, one database)
# ---------------------------------------------------------------------------


def test_worker_killed_mid_summary_frees_the_chat_within_the_lease(two_workers, provider, filter_source):
    """The worker making a 20 s summary is killed with SIGKILL: the chat goes
    on (the other worker serves it, trimmed); once the lease expires (LEASE_TTL, the session server's test period),
    the next turn gets exactly one summary, made by another worker, and no
    half-written summary is ever read."""
    server, client = two_workers
    try:
        _kill_mid_summary(server, client, provider)
    except BaseException:
        print("\n[e2e] two-worker server log (last 80 lines):\n" + server.log_tail(80))
        raise


def wait_for_both_workers(server, client, provider, deadline: float = 300) -> set:
    """Under load uvicorn may restart a worker that is slow to answer its
    health check; the kill must not hit the only one serving. Short API
    calls, stamped by a probe filter, until two worker pids have answered."""
    import re

    client.install_function("worker_probe", PID_PROBE, enable_global=True)
    seen: set = set()
    end = time.monotonic() + deadline
    try:
        while len(seen) < 2:
            assert time.monotonic() < end, f"only worker(s) {seen} served within {deadline}s"
            start = len(provider.requests)
            client.chat_completion(messages=[{"role": "user", "content": "ping"}], model=CHAT_MODEL, timeout=120)
            for r in provider.requests[start:]:
                seen |= set(re.findall(r"served-by-pid-(\d+)", str(r["messages"])))
    finally:
        client.set_function_state("worker_probe", active=False)
    return seen


def _kill_mid_summary(server, client, provider):
    wait_for_both_workers(server, client, provider)
    provider.configure(summary_delay=20)
    start = len(provider.requests)
    conv = Conversation(client, provider, seed=51)
    conv.add_turns(3)
    conv.store("fault worker killed")
    turn_until_summary_pending(conv, provider)
    port = int(provider.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    supervisor = server.proc.pid
    workers = [p for p in server.worker_pids() if p != supervisor]
    holder = wait_for(lambda: pids_connected_to(port, workers), deadline=5, what="the worker calling the summarizer")
    assert len(holder) == 1, holder
    os.kill(holder[0], signal.SIGKILL)
    killed = time.monotonic()
    # the chat goes on meanwhile, served by the surviving (or a restarted)
    # worker; the lease, last renewed up to LEASE_RENEW before the kill, is
    # alive for at least LEASE_TTL - LEASE_RENEW more (2 s of it a margin)
    provider.configure(summary_delay=2)
    during = len(provider.requests)
    while time.monotonic() - killed < LEASE_TTL - LEASE_RENEW - 2:
        assert_kept(conv, conv.turn(timeout=60))
    assert not summaries_since(provider, during), "a summary started while the dead worker's lease was alive"
    assert server.healthy()
    # after the lease expired: exactly one summary, by a live worker
    time.sleep(max(0.0, LEASE_TTL + 2 - (time.monotonic() - killed)))
    t0 = len(provider.requests)
    freed = conv.turn(wait=False)
    settle(provider, t0, quiet=4, deadline=120)  # a summary may take several rounds, each saved
    assert_kept(conv, freed)
    made = summaries_since(provider, t0)
    # exactly one summary run, by one live worker: its rounds (the summarizer
    # window may need several), none of them made twice, each saved once
    assert made and all(s["status"] == 200 for s in made), [brief(s) for s in made]
    inputs = [repr(s["messages"]) for s in made]
    assert len(inputs) == len(set(inputs)), "the same span was summarized twice"
    rows = sqlite_summaries(os.path.join(server.data_dir, "webui.db"), conv.chat_id)
    assert len(rows) == len(made), (len(rows), len(made))
    assert all(text.strip() for text, _ in rows), "a stored summary is empty"
    assert [c for _, c in rows] == sorted({c for _, c in rows}), "rounds do not advance one after another"
    after = conv.turn()
    assert_kept(conv, after)
    assert has_summary(after.requests[0])
    assert rows[-1][0].strip() in summary_text(after.requests[0]), "the summary sent is not the one stored whole"
    assert not chat_400s(provider, start)
    errors = [r for r in provider.requests[start:] if r["kind"] == "chat" and r["status"] != 200]
    assert not errors, [brief(r) for r in errors][:2]
