"""Faults of an Open WebUI on PostgreSQL (issue 14; the rows of docs/en/faults.md that
need a database server): PostgreSQL 15 with DATABASE_SCHEMA=owui and a role that
may create tables only there, as managed databases have it. No permission, the
store unreachable during a summary, the database restarted mid-chat, Open WebUI
restarted with cold caches. A deployment of its own (it runs in scripts/test.sh's
third lane); the other rows, and what every test asserts, are in
tests/e2e/test_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    SUMMARY_MODEL,
    Conversation,
    assert_fault_status,
    assert_kept,
    chat_400s,
    check_turn,
    has_summary,
    markers_in,
    settle,
    summaries_since,
    summary_text,
    turn_until_summary_pending,
)

from devkit.openwebui import OpenWebUIClient, OpenWebUIError, OpenWebUIServer, ensure_offline_tiktoken

pytestmark = pytest.mark.e2e

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
START_POSTGRES = os.path.join(ROOT, "scripts", "start_postgres.sh")
CAP = E2E_VALVES["max_context_tokens"]
FIX_TEXT = "set DATABASE_SCHEMA to a schema Open WebUI's role may create tables in, or GRANT CREATE"
LEASE_TTL = 30  # the filter's summary lease (async_context_compression.LEASE_TTL): this deployment keeps the product's


# ---------------------------------------------------------------------------
# an Open WebUI on PostgreSQL with DATABASE_SCHEMA (module server)
# ---------------------------------------------------------------------------


class PgDeployment:
    """PostgreSQL 15 as managed databases have it: Open WebUI's role may
    create tables only in schema ``owui`` (CREATE on public revoked), and
    Open WebUI runs with DATABASE_SCHEMA=owui."""

    schema = "owui"

    def __init__(self, owui_python, provider):
        proc = subprocess.run(["bash", START_POSTGRES, "start"], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = proc.stdout.strip().splitlines()
        self.pg_dir = next(line[len("PGDIR=") :] for line in lines if line.startswith("PGDIR="))
        self.admin_dsn = lines[-1]  # postgres@.../acc_test
        base = self.admin_dsn.rsplit("/", 1)[0]
        self.role = "owui_app"
        self.admin_sql(f'CREATE ROLE "{self.role}" LOGIN', f'CREATE DATABASE owui OWNER "{self.role}"')
        self.owui_admin_dsn = base + "/owui"
        self.admin_sql(
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
            f'CREATE SCHEMA {self.schema} AUTHORIZATION "{self.role}"',
            db=self.owui_admin_dsn,
        )
        host = base.split("@", 1)[1]
        self.url = f"postgresql://{self.role}@{host}/owui"
        self.server = OpenWebUIServer(
            python=owui_python,
            provider_url=provider.base_url,
            env_extra={"DATABASE_URL": self.url, "DATABASE_SCHEMA": self.schema},
            tiktoken_cache_dir=ensure_offline_tiktoken(owui_python),
        )

    def admin_sql(self, *statements: str, db: str = "") -> list:
        import psycopg

        rows = []
        with psycopg.connect(db or self.admin_dsn, autocommit=True) as conn:
            for statement in statements:
                cur = conn.execute(statement)
                rows.append(cur.fetchall() if cur.description else None)
        return rows

    def owui_sql(self, *statements: str) -> list:
        return self.admin_sql(*statements, db=self.owui_admin_dsn)

    def tables_in(self, schema: str) -> set:
        (rows,) = self.owui_sql(f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")
        return {r[0] for r in rows}

    def summaries(self, chat_id: str) -> list:
        (rows,) = self.owui_sql(
            f"SELECT summary, covered_count FROM {self.schema}.acc_chat_summary WHERE chat_id = '{chat_id}' ORDER BY id"
        )
        return rows

    def pg_ctl(self, what: str) -> None:
        proc = subprocess.run(["bash", START_POSTGRES, what, self.pg_dir], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

    def stop(self) -> None:
        self.server.stop()
        subprocess.run(["bash", START_POSTGRES, "stop", self.pg_dir], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def pg_deployment(owui_python, provider, filter_source):
    dep = PgDeployment(owui_python, provider)
    try:
        dep.server.start(timeout=600)
        client = OpenWebUIClient(dep.server.base_url, timeout=180)
        client.signup("pg-admin@example.com", "Pg-Passw0rd!", "PG Admin")
        client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=90)
        client.install_function(FILTER_ID, filter_source, valves=dict(E2E_VALVES), enable_global=True)
        dep.client = client
        yield dep
    finally:
        if os.environ.get("ACC_KEEP_E2E_DATA"):
            print(f"\n[e2e] PostgreSQL deployment log {dep.server.log_path}")
        dep.stop()


@pytest.fixture
def pg(pg_deployment, provider):
    provider.configure(summary_delay=None, summary_fail=None, chat_delay=None, context_window=None, reply_text=None)
    pg_deployment.client.set_valves(FILTER_ID, dict(E2E_VALVES))
    yield pg_deployment
    provider.configure(summary_delay=None, summary_fail=None, chat_delay=None, context_window=None, reply_text=None)


def test_pg_no_permission_is_said_and_heals_after_a_grant(pg, provider, filter_source):
    """The filter's tables cannot be created (CREATE on the schema revoked):
    the chat goes on, trimmed; the log says the fix once; after GRANT CREATE
    the store heals by itself (within its 30 s retry) and summaries are made."""
    pg.owui_sql(
        f"DROP TABLE IF EXISTS {pg.schema}.acc_chat_summary, {pg.schema}.acc_summary_lease",
        f'REVOKE CREATE ON SCHEMA {pg.schema} FROM "{pg.role}"',
    )
    try:
        log_from = pg.server.log_size()
        start = len(provider.requests)
        conv = Conversation(pg.client, provider, seed=41)
        conv.add_turns(3)
        conv.store("fault no permission")
        for _ in range(6):
            assert_kept(conv, conv.turn())
        assert not chat_400s(provider, start)
        assert not summaries_since(provider, start), "a summary was made although it could not be stored"
        log = pg.server.log_since(log_from)
        assert FIX_TEXT in log, log[-3000:]
        assert log.count(FIX_TEXT) == 1, "the fix should be logged once, not per request"
        assert not {"acc_chat_summary", "acc_summary_lease"} & pg.tables_in(pg.schema)
        denied_chat = conv.chat_id
    finally:
        pg.owui_sql(f'GRANT CREATE ON SCHEMA {pg.schema} TO "{pg.role}"')
    healed_at = time.monotonic()
    while time.monotonic() - healed_at < 75:
        t0 = len(provider.requests)
        assert_kept(conv, conv.turn())
        if [s for s in summaries_since(provider, t0) if s["status"] == 200]:
            break
        time.sleep(3)
    else:
        raise AssertionError("no summary within 75 s of GRANT CREATE")
    assert {"acc_chat_summary", "acc_summary_lease"} <= pg.tables_in(pg.schema)
    assert not {"acc_chat_summary", "acc_summary_lease"} & pg.tables_in("public")
    assert len(pg.summaries(conv.chat_id)) >= 1
    assert_fault_status(pg.client, denied_chat, "store_denied", filter_source)


def test_pg_database_schema_summaries_made_and_used(pg, provider):
    start = len(provider.requests)
    conv = Conversation(pg.client, provider, seed=42)
    conv.add_turns(3)
    conv.store("pg schema")
    problems = []
    for _ in range(10):
        problems += check_turn(conv, conv.turn(), CAP)
    assert not problems, "\n".join(problems[:8])
    assert [s["status"] for s in summaries_since(provider, start)].count(200) >= 1
    assert any(has_summary(r) for r in conv.turns[-1].requests)
    assert {"acc_chat_summary", "acc_summary_lease"} <= pg.tables_in(pg.schema)
    assert not {"acc_chat_summary", "acc_summary_lease"} & pg.tables_in("public")
    assert pg.summaries(conv.chat_id)
    assert not chat_400s(provider, start)


def test_pg_store_unreachable_during_a_summary(pg, provider):
    """PostgreSQL stops while a summary is being made and is back 6 s later:
    that summary is lost (it could not be saved), the chat goes on, and a
    later turn gets a summary once the lease of the lost one has expired."""
    provider.configure(summary_delay=3)
    start, log_from = len(provider.requests), pg.server.log_size()
    conv = Conversation(pg.client, provider, seed=43)
    conv.add_turns(3)
    conv.store("fault store unreachable")
    turn_until_summary_pending(conv, provider)
    pg.pg_ctl("pause")
    try:
        time.sleep(6)  # the summary answers at 3 s: its save finds no database
    finally:
        pg.pg_ctl("resume")
    settle(provider, start, deadline=60)
    assert not pg.summaries(conv.chat_id), "nothing may be stored by a save made while the database was down"
    provider.configure(summary_delay=None)
    recovered = None
    deadline = time.monotonic() + LEASE_TTL + 45
    while time.monotonic() < deadline:
        t0 = len(provider.requests)
        assert_kept(conv, conv.turn())
        if [s for s in summaries_since(provider, t0) if s["status"] == 200]:
            recovered = True
            break
        time.sleep(3)
    assert recovered, "no summary after the database came back (and the lost summary's lease expired)"
    assert pg.summaries(conv.chat_id)
    after = conv.turn()
    assert_kept(conv, after)
    assert has_summary(after.requests[0])
    assert not chat_400s(provider, start)
    # The background line said it when the save failed: live over the socket,
    # not in the chat's stored history (that write needs the database too);
    # no later line repeats a fault its own request did not meet. The log has it.
    assert "the database is unreachable" in pg.server.log_since(log_from)


def eight_turns_on(pg, provider, seed: int, title: str) -> Conversation:
    """A saved chat of three turns, then eight live ones on the PostgreSQL deployment (summaries made by then)."""
    conv = Conversation(pg.client, provider, seed=seed)
    conv.add_turns(3)
    conv.store(title)
    for _ in range(8):
        conv.turn()
    return conv


def test_pg_restart_mid_chat_costs_only_the_turns_made_while_down(pg, provider):
    """PostgreSQL stopped and started between turns: a turn made while it is
    down fails in Open WebUI itself; the first turn after it is back works,
    with the summary made before (the pool's dead connections do not poison it)."""
    start = len(provider.requests)
    conv = eight_turns_on(pg, provider, seed=44, title="fault pg restart")
    assert any(has_summary(r) for r in conv.turns[-1].requests), "no summary before the restart"
    pg.pg_ctl("pause")
    try:
        with pytest.raises(OpenWebUIError) as info:
            pg.client.chat_completion(
                "a turn while the database is down", model=CHAT_MODEL, chat_id=conv.chat_id, timeout=60
            )
        assert info.value.status != 400 or "database" in str(info.value.detail).lower(), info.value
    finally:
        pg.pg_ctl("resume")
    after = conv.turn()
    assert_kept(conv, after)
    assert has_summary(after.requests[0]), "the first turn after the database restart lost the summary"
    assert not [r for r in chat_400s(provider, start)]


def test_pg_restart_of_open_webui_with_cold_caches(pg, provider):
    """Open WebUI restarted (new process: the filter, its caches and the
    store's schema check start cold): the next turn uses the summary made
    before the restart, and new ones are still made."""
    start = len(provider.requests)
    conv = eight_turns_on(pg, provider, seed=45, title="fault owui restart")
    before = pg.summaries(conv.chat_id)
    assert before, "no summary before the restart"
    pg.server.stop()
    pg.server.start(timeout=600)
    pg.client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=90)
    first = conv.turn()
    assert_kept(conv, first)
    assert has_summary(first.requests[0]), "the summary stored before the restart was not used"
    assert before[-1][0] in summary_text(first.requests[0]) or markers_in(before[-1][0]) <= markers_in(
        summary_text(first.requests[0])
    )
    problems = []
    for _ in range(6):
        problems += check_turn(conv, conv.turn(), CAP)
    assert not problems, "\n".join(problems[:8])
    assert len(pg.summaries(conv.chat_id)) > len(before), "no new summary after the restart"
    assert not chat_400s(provider, start)
