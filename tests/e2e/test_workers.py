"""Several uvicorn workers sharing one database (UVICORN_WORKERS=2, no Redis).

The session's two-worker Open WebUI (the ``two_workers``
fixture of conftest.py), with the filter installed and a probe filter that
stamps each request with the pid of the worker that served it. The chat must
behave as with one worker: no 400, summaries made and used, and no span
summarized twice by two workers.
"""

from __future__ import annotations

import re

import pytest
from e2e_support import (
    E2E_VALVES,
    Conversation,
    brief,
    check_turn,
    has_summary,
    provider_errors,
)

pytestmark = pytest.mark.e2e


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
