"""Open WebUI's /compact with the filter installed (issue 20).

``POST /api/v1/chats/{id}/compact`` (what typing /compact does) exists only
while the admin's own compaction is on. After it the core sends its summary
in the system message and only the messages from its compaction point on.
The filter takes that summary as the base of its next one and goes on
summarizing in the background: every fact stays, nothing is summarized twice,
no request is refused or over the cap, and the user is told once that both
compactions are on.
"""

from __future__ import annotations

import re
import time

import pytest
from e2e_support import (
    E2E_VALVES,
    SUMMARY_MODEL,
    Conversation,
    brief,
    check_turn,
    markers_in,
    provider_errors,
    status_lines,
    text_of,
)

import async_context_compression as product

CAP = E2E_VALVES["max_context_tokens"]
CORE_PROMPT_MARK = "Messages Being Compacted"  # Open WebUI's own compaction prompt
FILTER_NEW_PART = "New messages to fold in:"  # this filter's summarizer prompt
BOTH_ON = "automatic compaction is on too"

pytestmark = pytest.mark.e2e


def summary_prompt(req: dict) -> str:
    return "\n".join(text_of(m.get("content")) for m in req.get("messages") or [] if isinstance(m, dict))


def filter_summaries(reqs: list) -> list:
    return [
        r for r in reqs if r["kind"] == "summary" and r["status"] == 200 and CORE_PROMPT_MARK not in summary_prompt(r)
    ]


def folded_ids(req: dict) -> set:
    """Stored ids (their first 12 characters, as the summarizer is shown them) of
    the messages one filter summary call folds in; not its previous summary."""
    return set(re.findall(r"^\[#([^\]]+)\] ", summary_prompt(req).split(FILTER_NEW_PART, 1)[1], re.MULTILINE))


def test_compact_then_twenty_turns(acc, provider):
    start = len(provider.requests)
    # The core's compaction on (its automatic threshold out of reach: /compact alone cuts)
    acc.enable_builtin_compaction(token_threshold=10_000_000, model=SUMMARY_MODEL)
    try:
        conv = Conversation(acc, provider, seed=20)
        conv.add_turns(2)
        conv.store("compact then twenty turns")
        problems = []
        for _ in range(4):
            problems += check_turn(conv, conv.turn(), CAP)
        checkpoint = conv.turns[-1].assistant_id  # /compact keeps it, and summarizes all before it
        before_compact = {mid[:12] for mid in conv.branch_ids(conv.turns[-1].user_id)}
        compacted = acc.post(f"/api/v1/chats/{conv.chat_id}/compact", {"model": conv.model})
        assert compacted.get("compacted") is True, compacted
        stored = acc.get_chat(conv.chat_id)["chat"]["history"]["messages"][checkpoint]
        assert stored.get("contextSummary"), "the core saved no summary on the latest reply"
        after = len(provider.requests)
        for _ in range(20):
            problems += check_turn(conv, conv.turn(), CAP)
        lines = status_lines(acc, conv.chat_id)
    finally:
        acc.disable_builtin_compaction()
        time.sleep(product.BUILTIN_CHECK_EVERY + 0.5)  # no stale "both on" note for the next test
    reqs = provider.requests[start:]
    assert not provider_errors(reqs), [brief(r) for r in provider_errors(reqs)][:3]
    assert not problems, "\n".join(problems[:10])  # every fact kept, nothing over the cap

    chats = [r for r in provider.requests[after:] if r["kind"] == "chat"]
    core_only = [r for r in chats if product.BUILTIN_SUMMARY_MARK in summary_prompt(r)]
    ours = [r for r in chats if "<conversation_summary" in summary_prompt(r)]
    assert core_only, "no request carried the core's summary after /compact"
    assert ours, "the filter never summarized again after /compact: background summaries stopped"
    assert not [r for r in chats if r in core_only and r in ours], "a request carried both summaries"
    assert chats.index(ours[0]) > chats.index(core_only[0])
    assert all(r in ours for r in chats[chats.index(ours[0]) :]), "the filter's summary was dropped again"

    made = filter_summaries(provider.requests[after:])
    assert made, "no background summary after /compact"
    core_text = stored["contextSummary"]
    assert markers_in(core_text) <= markers_in(summary_prompt(made[0])), "the core's summary was not the base"
    seen: set = set()
    for req in made:
        folded = folded_ids(req)
        assert folded, "a summary call with nothing new in it"  # one summary per real change
        assert not folded & before_compact, "a message the core had summarized was summarized again"
        assert not folded & seen, f"summarized twice: {sorted(folded & seen)[:5]}"
        seen |= folded
    assert checkpoint[:12] in seen, "the message /compact kept was never folded"
    assert len(made) <= 20
    said = [line for line in lines if BOTH_ON in line]
    assert said and len(said) <= 3, said  # on the turns 1, 11, 21, ... inlet received, never under every reply
    print(f"\n[compact] filter summaries after /compact: {len(made)}; chat requests: {len(chats)}")
