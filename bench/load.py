"""Load scenario (issue 14): many chats at once through a real Open WebUI
with several workers, without the filter and with it, in one run, on SQLite
and on PostgreSQL.

    PY=$(bash scripts/setup_openwebui.sh | tail -n 1)
    $PY bench/load.py                         # small default: a few minutes
    $PY bench/load.py --chats 12 --db sqlite  # the issue's SQLite figure
    $PY bench/load.py --chats 36 --db postgres

Per back end: one Open WebUI (``--workers`` uvicorn workers sharing its
database; PostgreSQL started by scripts/start_postgres.sh) and the fake
provider (a ``--chat-delay`` s model, a ``--summary-delay`` s summarizer).
Each phase (no filter, then filter) creates ``--chats`` chats at once, each
with ``--saved-turns`` stored turns, then sends ``--live-turns`` turns per
chat, all chats at once (one thread per chat, its turns one after another).

Prints per back end and phase: chats that could not be created, requests,
failed requests, HTTP 400s (from Open WebUI or the provider), median, p95, p99
and slowest reply; the tail ratio (filter / no filter: p95, p99, slowest); and
summaries per chat (rows the filter stored, after background work settled).
Exits 1 when the filter phase has a failed request or a 400 that the phase
without it did not have.

``--replicas 2`` runs the deployment Open WebUI scales out with instead: two
Open WebUI servers (``--workers`` each) on one PostgreSQL (with
``DATABASE_SCHEMA``) and one Redis (``WEBSOCKET_MANAGER=redis``), sharing one
``WEBUI_SECRET_KEY``; each chat's live turns alternate between the replicas.
The same figures are printed (``--db`` is ignored).

Flags:
    --chats N            chats at once (default 4)
    --saved-turns N      stored turns per chat before the live ones (default 30)
    --live-turns N       live turns per chat (default 4)
    --untimed-turns N    of those, the first N per chat are sent but not timed (default 0): each
                         worker's first use of the filter loads its source and tiktoken, once per
                         process; this separates that from the steady state
    --workers N          uvicorn workers (default 2)
    --db LIST            sqlite,postgres (default both)
    --chat-delay S       fake model's answer time (default 0.3)
    --summary-delay S    fake summarizer's answer time (default 2)
    --words N            words per user message (default 170, ~230 tokens)
    --replicas N         N replicas on PostgreSQL + Redis (default 1: one server per --db)
    --paired             both arms in one phase instead of one after the other: the filter is not
                         global but attached to a workspace model on the same fake model, and chat
                         i uses it when i is odd. Open WebUI's own pauses (a worker's full garbage
                         collection of its ~1.1M objects takes 0.6 s on a 2-core machine and comes
                         every ~30-40 s under this load) then fall on both arms alike; run one after
                         the other, a short phase's p99 mostly says whether one fell in it
    --gc-log FILE        every Open WebUI process logs its full garbage collections to FILE
                         (bench/gc_probe on PYTHONPATH); the report says how many fell in each
                         phase and the longest pause
    --rounds N           with --paired: N rounds of new chats on the same servers, figures pooled
                         (default 1); a p95 over 80 requests is the 4th slowest, and one pause
                         that catches four requests of one arm moves it by half
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from devkit.fake_provider import FakeProvider  # noqa: E402
from devkit.openwebui import (  # noqa: E402
    ChatHistory,
    OpenWebUIClient,
    OpenWebUIError,
    OpenWebUIServer,
    ensure_offline_tiktoken,
    find_openwebui_python,
    start_replicas,
)
from devkit.services import ThrowawayPostgres, ThrowawayRedis, replica_env  # noqa: E402

FILTER_ID = "async_context_compression"
CHAT_MODEL, SUMMARY_MODEL = "fake-chat", "fake-summary"
FILTERED_MODEL = "fake-chat-filtered"  # --paired: CHAT_MODEL with the filter attached
START_POSTGRES = os.path.join(_ROOT, "scripts", "start_postgres.sh")
VALVES = {
    "compression_threshold_tokens": 4000,
    "max_context_tokens": 8000,
    "keep_last": 4,
    "keep_first": 1,
    "summary_model": SUMMARY_MODEL,
    "summary_timeout_seconds": 60,
}
WORDS = (
    "alpha budget cache deploy engine filter gateway handler index journal kernel ledger metric network "
    "option parser queue record schema token update vector window yield zone archive backlog cluster"
).split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


class Postgres:
    def __init__(self):
        proc = subprocess.run(["bash", START_POSTGRES, "start"], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"could not start PostgreSQL:\n{proc.stderr[-2000:]}")
        lines = proc.stdout.strip().splitlines()
        self.pg_dir = next(line[len("PGDIR=") :] for line in lines if line.startswith("PGDIR="))
        self.dsn = lines[-1]

    def rows_per_chat(self, chat_ids: list) -> dict:
        import psycopg

        try:
            with psycopg.connect(self.dsn) as conn:
                rows = conn.execute("SELECT chat_id, count(*) FROM acc_chat_summary GROUP BY chat_id").fetchall()
        except psycopg.errors.UndefinedTable:  # no table: the filter never stored one (the phase without it)
            rows = []
        counts = dict(rows)
        return {c: counts.get(c, 0) for c in chat_ids}

    def stop(self):
        subprocess.run(["bash", START_POSTGRES, "stop", self.pg_dir], capture_output=True, timeout=120)


def sqlite_rows_per_chat(path: str, chat_ids: list) -> dict:
    try:
        with sqlite3.connect(path, timeout=30) as conn:
            counts = dict(conn.execute("SELECT chat_id, count(*) FROM acc_chat_summary GROUP BY chat_id").fetchall())
    except sqlite3.OperationalError:  # no table: the filter never stored one
        counts = {}
    return {c: counts.get(c, 0) for c in chat_ids}


class Phase:
    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.latencies: list = []
        self.failed: list = []
        self.status_400 = 0
        self.create_failed = 0
        self.chat_ids: list = []
        self.summaries: dict = {}
        self.windows: list = []  # (start, end) wall-clock times of its live turns

    def record(self, elapsed=None, error=None):
        with self.lock:
            if error is None:
                if elapsed is not None:  # None: sent, not timed (a warm-up turn)
                    self.latencies.append(elapsed)
            else:
                self.failed.append(error)
                if isinstance(error, OpenWebUIError) and error.status == 400:
                    self.status_400 += 1

    def quantile(self, q: float) -> float:
        values = sorted(self.latencies)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_phase(client, provider: FakeProvider, name: str, args, arms: Optional[list] = None) -> Phase:
    """``client``: one client, or a list of them (one per replica): a chat's
    live turns then go to each in turn. ``arms``: ``[(Phase, model), ...]``
    run at once, chat i in arm i % len(arms); returns the first arm."""
    clients = client if isinstance(client, list) else [client]
    client = clients[0]
    arms = arms or [(Phase(name), CHAT_MODEL)]
    start = len(provider.requests)

    def create(i: int):
        phase, model = arms[i % len(arms)]
        rng = random.Random(hash((name, i)))
        history = ChatHistory(model)
        for _ in range(args.saved_turns):
            history.user(f"[{name} chat {i}] " + text(rng, args.words))
            history.assistant("Noted. " + text(rng, 30))
        try:
            return client.create_chat(history, title=f"load {name} {i}"), history, rng, phase, model
        except Exception as exc:  # Open WebUI itself failing under load is counted, not raised
            with phase.lock:
                phase.create_failed += 1
                phase.failed.append(exc)
            return None

    with ThreadPoolExecutor(args.chats) as pool:
        chats = [c for c in pool.map(create, range(args.chats)) if c]

    def live(chat):
        chat_id, history, rng, phase, model = chat
        for turn in range(args.live_turns):
            try:
                result = clients[turn % len(clients)].chat_completion(
                    text(rng, args.words),
                    model=model,
                    chat_id=chat_id,
                    parent_id=history.current_id,
                    system="You are the load-test assistant.",
                    timeout=300,
                )
                reply = result["response"]["choices"][0]["message"]["content"]
                history.user("(live)", message_id=result["user_message_id"])
                history.assistant(reply, message_id=result["assistant_id"])
                phase.record(elapsed=None if turn < args.untimed_turns else result["elapsed"])
            except Exception as exc:
                phase.record(error=exc)

    began = time.time()
    with ThreadPoolExecutor(max(1, len(chats))) as pool:
        list(pool.map(live, chats))
    for phase, _ in arms:
        phase.chat_ids += [c[0] for c in chats if c[3] is phase]
        phase.windows.append((began, time.time()))
    # background summaries: wait until the provider is quiet
    quiet_since, seen = time.monotonic(), -1
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        reqs = provider.requests[start:]
        pending = [r for r in reqs if r["status"] is None]
        if len(reqs) != seen:
            seen, quiet_since = len(reqs), time.monotonic()
        if not pending and time.monotonic() - quiet_since > 3:
            break
        time.sleep(0.5)
    # the provider's 400s go to the last arm (the filter's when paired): the
    # worst case for the filter, as the provider does not see which arm sent one
    arms[-1][0].status_400 += sum(1 for r in provider.requests[start:] if r["status"] == 400)
    return arms[0][0]


def run_both_arms(clients: list, provider: FakeProvider, filter_source: str, args, label: str) -> list:
    """Installs the filter, then runs the chats without it and with it: one phase after the other, or both at once
    (``--paired``, ``--rounds`` of them pooled). Returns [without, with]."""
    clients[0].install_function(FILTER_ID, filter_source, valves=dict(VALVES), enable_global=not args.paired)
    if args.paired:
        add_filtered_model(clients)
        arms = [(Phase("no filter"), CHAT_MODEL), (Phase("filter"), FILTERED_MODEL)]
        for n in range(args.rounds):  # new chats each round, figures pooled
            run_phase(clients, provider, f"paired {n}", args, arms=arms)
        return [phase for phase, _ in arms]
    phases = []
    for name, active in (("no filter", False), ("filter", True)):
        clients[0].set_function_state(FILTER_ID, active=active, is_global=True)
        phases.append(run_phase(clients, provider, name, args))
        print(f"[{label}] {name}: done", flush=True)
    return phases


def run_backend(db: str, python: str, provider: FakeProvider, filter_source: str, args) -> list:
    pg = Postgres() if db == "postgres" else None
    env = {**({"DATABASE_URL": pg.dsn} if pg else {}), **gc_env(args)}
    server = OpenWebUIServer(
        python=python,
        provider_url=provider.base_url,
        workers=args.workers,
        env_extra=env,
        tiktoken_cache_dir=ensure_offline_tiktoken(python),
    )
    try:
        t0 = time.monotonic()
        server.start(timeout=900)
        print(f"[{db}] Open WebUI with {args.workers} workers up in {time.monotonic() - t0:.0f}s", flush=True)
        client = OpenWebUIClient(server.base_url, timeout=300)
        client.signup("load@example.com", "Load-Passw0rd!", "Load Admin")
        client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=120)
        phases = run_both_arms([client], provider, filter_source, args, db)
        for phase in phases:
            if pg:
                phase.summaries = pg.rows_per_chat(phase.chat_ids)
            else:
                phase.summaries = sqlite_rows_per_chat(os.path.join(server.data_dir, "webui.db"), phase.chat_ids)
        return phases
    finally:
        server.stop()
        server.cleanup()
        if pg:
            pg.stop()


def gc_env(args) -> dict:
    """--gc-log: every Open WebUI process logs its full garbage collections (bench/gc_probe)."""
    if not args.gc_log:
        return {}
    open(args.gc_log, "w").close()
    return {"PYTHONPATH": os.path.join(_HERE, "gc_probe"), "ACC_GC_LOG": os.path.abspath(args.gc_log)}


def full_collections(path: str, windows: list) -> list:
    """Pauses (s) of the full collections logged while a phase's live turns ran."""
    with open(path, encoding="utf-8") as log:
        rows = [line.split() for line in log if line.strip()]
    return [float(r[3]) for r in rows if r[2] == "2" and any(a <= float(r[0]) <= b for a, b in windows)]


def add_filtered_model(clients: list) -> None:
    """A workspace model on the plain chat model with the filter attached
    (not global): the paired run's filter arm."""
    form = {
        "id": FILTERED_MODEL,
        "base_model_id": CHAT_MODEL,
        "name": "fake chat with the filter",
        "meta": {"filterIds": [FILTER_ID]},
        "params": {},
    }
    clients[0].post("/api/v1/models/create", form)
    for client in clients:
        client.wait_for_models([FILTERED_MODEL], timeout=120)


def run_replicas(python: str, provider: FakeProvider, filter_source: str, args) -> list:
    """Both phases on ``--replicas`` Open WebUI servers sharing PostgreSQL and Redis."""
    pg, redis, servers = ThrowawayPostgres(), ThrowawayRedis(), []
    try:
        pg.start()
        redis.start()
        url = pg.create_database("owui", schema="owui")
        t0 = time.monotonic()
        servers = start_replicas(
            args.replicas,
            provider.base_url,
            python=python,
            env_extra={**replica_env(url, redis.url, "owui"), **gc_env(args)},
            workers=args.workers,
            tiktoken_cache_dir=ensure_offline_tiktoken(python),
            timeout=900,
        )
        print(
            f"[replicas] {args.replicas} Open WebUI x {args.workers} workers on PostgreSQL + Redis up in "
            f"{time.monotonic() - t0:.0f}s",
            flush=True,
        )
        clients = [OpenWebUIClient(s.base_url, timeout=300) for s in servers]
        clients[0].signup("load@example.com", "Load-Passw0rd!", "Load Admin")
        for client in clients[1:]:
            client.signin("load@example.com", "Load-Passw0rd!")
        for client in clients:
            client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=120)
        phases = run_both_arms(clients, provider, filter_source, args, "replicas")
        counts = {}
        try:
            (rows,) = pg.sql("SELECT chat_id, count(*) FROM owui.acc_chat_summary GROUP BY chat_id", database="owui")
            counts = dict(rows)
        except Exception as exc:  # no table: the filter never stored one
            if "acc_chat_summary" not in str(exc):
                raise
        for phase in phases:
            phase.summaries = {c: counts.get(c, 0) for c in phase.chat_ids}
        return phases
    finally:
        for server in servers:
            server.stop()
        if servers:
            servers[0].cleanup()
        redis.stop()
        pg.stop()


def report(results: dict, args) -> int:
    print()
    print(
        f"{args.chats} chats at once x {args.live_turns} live turns"
        + (f" (the first {args.untimed_turns} per chat not timed)" if args.untimed_turns else "")
        + f", {args.saved_turns} saved turns each, "
        f"{args.workers} workers"
        + (f" x {args.replicas} replicas (turns alternate)" if args.replicas > 1 else "")
        + f"; model {args.chat_delay}s, summarizer {args.summary_delay}s"
        + ("; paired: both arms at once, chat i with the filter when i is odd" if args.paired else "")
        + (f"; {args.rounds} rounds pooled" if args.paired and args.rounds > 1 else "")
    )
    header = (
        f"{'db':12} {'phase':10} {'chats':>5} {'not made':>8} {'requests':>8} {'failed':>6} {'400s':>4} "
        f"{'p50 s':>6} {'p95 s':>6} {'p99 s':>6} {'max s':>6} {'summaries/chat':>15}"
    )
    print(header)
    print("-" * len(header))
    bad = 0
    for db, phases in results.items():
        for p in phases:
            per_chat = list(p.summaries.values())
            spc = f"{statistics.mean(per_chat):.1f} ({min(per_chat)}-{max(per_chat)})" if per_chat else "-"
            print(
                f"{db:12} {p.name:10} {len(p.chat_ids):>5} {p.create_failed:>8} "
                f"{len(p.latencies) + len(p.failed) - p.create_failed:>8} {len(p.failed) - p.create_failed:>6} "
                f"{p.status_400:>4} {p.quantile(0.5):>6.2f} {p.quantile(0.95):>6.2f} {p.quantile(0.99):>6.2f} {p.quantile(1.0):>6.2f} {spc:>15}"
            )
        base, filt = phases
        print(
            f"{db:12} tail ratio filter/no filter: p95 {filt.quantile(0.95) / base.quantile(0.95):.2f}x, "
            f"p99 {filt.quantile(0.99) / base.quantile(0.99):.2f}x, "
            f"slowest {filt.quantile(1.0) / base.quantile(1.0):.2f}x"
        )
        if args.gc_log:
            for p in phases:
                pauses = full_collections(args.gc_log, p.windows)
                longest = f", longest {max(pauses):.2f} s" if pauses else ""
                print(f"{db:12} {p.name}: {len(pauses)} full garbage collections in Open WebUI's processes{longest}")
        for p in phases:
            for exc in p.failed[:3]:
                print(f"{db:12} {p.name}: {type(exc).__name__}: {str(exc)[:200]}")
        if len(filt.failed) > len(base.failed) or filt.status_400 > base.status_400:
            bad += 1
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--saved-turns", type=int, default=30)
    parser.add_argument("--live-turns", type=int, default=4)
    parser.add_argument("--untimed-turns", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--chat-delay", type=float, default=0.3)
    parser.add_argument("--summary-delay", type=float, default=2.0)
    parser.add_argument("--words", type=int, default=170)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--paired", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--gc-log", default="")
    args = parser.parse_args(argv)
    python = find_openwebui_python(install=True)
    with open(os.path.join(_ROOT, "async_context_compression.py"), encoding="utf-8") as f:
        filter_source = f.read()
    provider = FakeProvider(mode="strict").start()
    provider.configure(chat_delay=args.chat_delay, summary_delay=args.summary_delay)
    results = {}
    try:
        if args.replicas > 1:
            results[f"pg+redis x{args.replicas}"] = run_replicas(python, provider, filter_source, args)
        for db in [d.strip() for d in args.db.split(",") if d.strip()] if args.replicas <= 1 else []:
            results[db] = run_backend(db, python, provider, filter_source, args)
    finally:
        provider.stop()
    return report(results, args)


if __name__ == "__main__":
    sys.exit(main())
