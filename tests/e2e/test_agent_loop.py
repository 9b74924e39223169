"""Long agent runs (issue 30) in a real Open WebUI: one reply runs a real workspace Tool 12 times through native
function calling (the fake provider's agent model, ``CALL_TOOL_ROUNDS``), each result a ~6,000-token page with 2 facts
in its middle third; cap 30,000 and threshold 16,000 through ``model_thresholds``, the model's window 32,768.

Open WebUI calls the filter's ``request`` hook before each of the loop's 13 model calls. With the summarizer working:
no request rejected or over the cap, the final answer produced, at least 22 of the 24 page facts and every fact of
the earlier conversation in the final request (verbatim or in a summary). With the summarizer down: still no request
over the cap (only shortening protects)."""

from __future__ import annotations

import json
import re
import secrets

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    Conversation,
    brief,
    markers_in,
    provider_errors,
    request_markers,
    status_lines,
)

from devkit.fake_provider import tools_tokens

ROUNDS, CAP, THRESHOLD, WINDOW = 12, 30_000, 16_000, 32_768
TRIMMED = re.compile(r"\[… (\d+) characters trimmed")

PAGES_SOURCE = '''"""
title: E2E Report Pages
id: e2e_pages
version: 0.0.1
description: returns one ~6,000-token page of a report, with two facts in its middle third
"""
import random


class Tools:
    def __init__(self):
        pass

    def fetch_page(self, round: int = 1) -> str:
        """
        Fetch one page of the report.
        :param round: the page number
        """
        rng = random.Random(round)
        words = "alpha beta gamma delta river stone market signal vector cloud ledger orbit".split()
        lines = [" ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(12)) for _ in range(225)]
        lines.insert(80, "Finding of page %d: the value is MK-SALTp%02da." % (round, round))
        lines.insert(150, "Second finding of page %d: the code is MK-SALTp%02db." % (round, round))
        return "Page %d of the report\\n" % round + "\\n".join(lines)
'''


def page_facts(salt: str) -> set:
    return {f"MK-{salt}p{k:02d}{x}" for k in range(1, ROUNDS + 1) for x in "ab"}


def run_agent(acc, provider, seed: int) -> tuple:
    """A chat of 3 earlier turns, then one reply running the tool ROUNDS times; (conversation, turn, salt)."""
    salt = secrets.token_hex(3)
    acc.install_tool("e2e_pages", PAGES_SOURCE.replace("SALT", salt))
    thresholds = {CHAT_MODEL: {"max_context_tokens": CAP, "compression_threshold_tokens": THRESHOLD}}
    acc.set_valves(
        FILTER_ID, {**E2E_VALVES, "model_thresholds": json.dumps(thresholds), "summary_model_max_context": WINDOW}
    )
    provider.configure(context_window=WINDOW)
    try:
        conv = Conversation(acc, provider, seed=seed)
        conv.add_turns(3)
        conv.store("agent run")
        extra = {"tool_ids": ["e2e_pages"], "params": {"function_calling": "native"}}
        turn = conv.turn(stream=True, extra=extra, prefix=f"CALL_TOOL_ROUNDS:fetch_page:{ROUNDS} ", timeout=300)
    finally:
        acc.delete_tool("e2e_pages")
    return conv, turn, salt


def sent_tokens(req: dict) -> int:
    return (req["tokens"] or 0) + tools_tokens(req.get("tools"))


def check_loop(turn) -> None:
    assert not provider_errors(turn.requests), [brief(r) for r in provider_errors(turn.requests)][:3]
    assert len(turn.requests) == ROUNDS + 1, f"expected {ROUNDS + 1} model calls, saw {len(turn.requests)}"
    over = [sent_tokens(r) for r in turn.requests if sent_tokens(r) > CAP]
    assert not over, f"{len(over)} request(s) over the cap {CAP}: {over}"
    final = turn.requests[-1]
    assert final["messages"][-1]["role"] == "tool", brief(final)
    assert turn.response["choices"][0]["message"]["content"], "no final answer"


def test_a_twelve_round_agent_run_stays_under_the_cap_and_keeps_its_facts(acc, provider):
    conv, turn, salt = run_agent(acc, provider, seed=30)
    check_loop(turn)
    final = request_markers(turn.requests[-1])
    facts = page_facts(salt)
    kept = facts & final
    assert len(kept) >= 22, f"{len(kept)} of 24 page facts in the final request; missing {sorted(facts - kept)}"
    earlier = turn.expected - {turn.marker}
    assert earlier <= final, f"earlier facts missing: {sorted(earlier - final)}"
    lines = status_lines(acc, conv.chat_id)
    assert any("Tool loop: earlier rounds summarized" in line for line in lines), lines[-8:]


@pytest.fixture
def summarizer_down(provider):
    provider.configure(summary_fail="500")
    yield
    provider.configure(summary_fail=None)


def test_with_the_summarizer_down_shortening_alone_keeps_every_call_under_the_cap(acc, provider, summarizer_down):
    conv, turn, salt = run_agent(acc, provider, seed=31)
    check_loop(turn)
    final = turn.requests[-1]["messages"]
    assert markers_in(str(final[-1]["content"])) & page_facts(salt)  # the latest page whole
    earlier = turn.expected - {turn.marker}
    assert earlier <= request_markers(turn.requests[-1]), "the earlier conversation was dropped to make room"
    # each older page is cut once, from its original: its marker counts the ~20,000 characters that went
    removed = [int(n) for m in final if m.get("role") == "tool" for n in TRIMMED.findall(str(m.get("content")))]
    assert removed and min(removed) > 10_000, removed
