"""The status line as Open WebUI stores it: every status event the filter
emits is saved in the assistant message's ``statusHistory``, which is what the
chat shows under a reply."""

from __future__ import annotations

import re

import pytest
from e2e_support import E2E_VALVES, Conversation, settle, status_lines, wait_for

pytestmark = pytest.mark.e2e


def test_status_line_shows_usage_and_background_summaries(acc, provider):
    start = len(provider.requests)
    conv = Conversation(acc, provider, seed=11)
    conv.add_turns(3)
    conv.store("status line")
    for _ in range(10):
        conv.turn()
    settle(provider, start)
    cap = E2E_VALVES["max_context_tokens"]
    cap_text = f"{cap / 1000:.1f}k" if cap < 10_000 else f"{cap // 1000}k"

    def seen():
        lines = status_lines(acc, conv.chat_id)
        return lines if any("Summary updated" in line for line in lines) else None

    lines = wait_for(seen, deadline=60, what="a 'Summary updated' status line")
    assert any(f"/ {cap_text} tokens sent" in line for line in lines), lines
    assert any("Summarizing " in line and "in the background" in line for line in lines), lines
    assert any("summary covers " in line for line in lines), lines
    assert not any("skipped" in line for line in lines), lines
    # every figure shown is one the provider received (its own count, within
    # the rounding of "2.3k" and the difference of two tokenizers)
    received = [r["tokens"] for r in provider.requests[start:] if r["kind"] == "chat" and r.get("tokens")]
    for line in lines:
        match = re.match(r"([\d.]+)(k?) / ", line)
        if match:
            shown = float(match.group(1)) * (1000 if match.group(2) else 1)
            assert any(abs(shown - t) <= max(60, 0.06 * t) for t in received), (line, received)
