"""Several uvicorn workers sharing one database (UVICORN_WORKERS=2, no Redis).

A second Open WebUI, started for this module only, with the filter installed
and a probe filter that stamps each request with the pid of the worker that
served it. The chat must behave as with one worker: no 400, summaries made
and used, and no span summarized twice by two workers.
"""

from __future__ import annotations

import os
import re

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    SUMMARY_MODEL,
    Conversation,
    brief,
    check_turn,
    has_summary,
    provider_errors,
)

from devkit.openwebui import OpenWebUIClient, OpenWebUIServer, ensure_offline_tiktoken

pytestmark = pytest.mark.e2e

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


@pytest.fixture(scope="module")
def two_workers(owui_python, provider, filter_source):
    server = OpenWebUIServer(
        python=owui_python,
        provider_url=provider.base_url,
        workers=2,
        tiktoken_cache_dir=ensure_offline_tiktoken(owui_python),
    )
    server.start(timeout=300)
    try:
        client = OpenWebUIClient(server.base_url, timeout=180)
        client.signup("workers@example.com", "Workers-Passw0rd!", "Workers Admin")
        client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=90)
        client.install_function(FILTER_ID, filter_source, valves=dict(E2E_VALVES), enable_global=True)
        client.install_function("worker_probe", PID_PROBE, enable_global=True)
        yield server, client
    finally:
        server.stop()
        if not os.environ.get("ACC_KEEP_E2E_DATA"):
            server.cleanup()


def test_two_workers_share_one_database(two_workers, provider):
    server, client = two_workers
    try:
        _check_two_workers(server, client, provider)
    except AssertionError:
        print("\n[e2e] two-worker server log (last 60 lines):\n" + server.log_tail(60))
        raise


def _check_two_workers(server, client, provider):
    assert len(server.worker_pids()) >= 3, f"expected a supervisor and 2 workers, got {server.worker_pids()}"
    start = len(provider.requests)
    conv = Conversation(client, provider, seed=21)
    conv.add_turns(3)
    conv.store("two workers")
    problems = []
    for _ in range(12):
        problems += check_turn(conv, conv.turn(), E2E_VALVES["max_context_tokens"])
    reqs = provider.requests[start:]
    assert not provider_errors(reqs), [brief(r) for r in provider_errors(reqs)][:3]
    pids = {m for r in reqs if r["kind"] == "chat" for m in re.findall(r"served-by-pid-(\d+)", str(r["messages"]))}
    summaries = [r for r in reqs if r["kind"] == "summary"]
    assert summaries and all(s["status"] == 200 for s in summaries)
    assert any(has_summary(r) for t in conv.turns[-3:] for r in t.requests)
    inputs = [repr(s["messages"]) for s in summaries]
    assert len(inputs) == len(set(inputs)), "two workers summarized the same span twice"
    assert not problems, "\n".join(problems[:10])
    # uvicorn spreads connections over workers; with 12 turns both serve some (recorded, not required)
    print(f"\n[e2e] chat requests were served by worker pids {sorted(pids)}")
