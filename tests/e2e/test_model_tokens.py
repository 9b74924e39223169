"""The cap in the model's own tokens, end to end (issue 19): a model that
counts 1.3x cl100k in a 16k window, max_context_tokens 15000. A chat grows
in 25 long turns far past the window: with the summarizer down only the cap
protects, and no request may be rejected (vLLM's 400) or silently cut
(Ollama); from the second reply on, the status figure is within 5% of the
prompt tokens the provider reported for that very request. The same text as
50 shorter turns took twice the time for the same check (each turn's cost is
mostly Open WebUI's, whatever its length); the turn-by-turn arithmetic at the
cap runs in-process in tests/unit/test_model_tokens.py."""

from __future__ import annotations

import re
import time

import pytest
from e2e_support import E2E_VALVES, FILTER_ID, MODEL_SPECS, OLLAMA_MODEL, VLLM_MODEL, Conversation, has_summary

from devkit.fake_provider import count_tokens

CAP = 15000
FIGURE_RE = re.compile(r"^([\d.]+)(k?) / ")


def figure_of(line: str) -> float:
    match = FIGURE_RE.match(line)
    assert match, line
    return float(match.group(1)) * (1000 if match.group(2) else 1)


def first_figures(client, chat_id: str) -> dict:
    """assistant message id -> the figure of its first status line (the request hook's)."""
    messages = client.get_chat(chat_id)["chat"]["history"]["messages"]
    out = {}
    for mid, message in messages.items():
        for status in message.get("statusHistory") or []:
            text = status.get("description") if isinstance(status, dict) else None
            if text and FIGURE_RE.match(text):
                out[mid] = figure_of(text)
                break
    return out


def grow(conv: Conversation, turns: int, words: int) -> list:
    return [conv.turn(words=words, timeout=120) for _ in range(turns)]


def check_chat(conv: Conversation, turns: list, model: str) -> tuple:
    """(problems, worst figure error from the second reply on). Problems:
    requests rejected, over the window or cut; status figures more than 5%
    off the provider's report from the second reply on."""
    problems, worst = [], 0.0
    figures = first_figures(conv.client, conv.chat_id)
    for n, turn in enumerate(turns, 1):
        reqs = [r for r in turn.requests if r["model"] == model]
        if not reqs:
            problems.append(f"turn {n}: no request reached {model}")
            continue
        for req in reqs:
            if req["status"] != 200 or req["over_window"] or req["cut"]:
                problems.append(
                    f"turn {n}: status {req['status']}, {req['model_tokens']} model tokens in a {req['window']} window"
                    f" (cut: {req['cut']}): {req.get('error')}"
                )
        reported = reqs[-1]["reported_prompt"]
        shown = figures.get(turn.assistant_id)
        if shown is None:
            problems.append(f"turn {n}: no status figure")
        elif n >= 2 and reported:
            worst = max(worst, abs(shown - reported) / reported)
            if abs(shown - reported) > 0.05 * reported:
                problems.append(f"turn {n}: the status line said {shown:.0f}, the provider reported {reported}")
    return problems, worst


def set_up(acc, **valves):
    acc.set_valves(FILTER_ID, {**E2E_VALVES, "max_context_tokens": CAP, **valves})


@pytest.mark.parametrize("model", [VLLM_MODEL, OLLAMA_MODEL])
def test_a_chat_grown_past_the_window_with_the_summarizer_down(acc, provider, model):
    set_up(acc, compression_threshold_tokens=9000, debug=False)
    provider.configure(summary_fail="500")
    conv = Conversation(acc, provider, seed=19, model=model)
    conv.add_turns(1, words=40)
    conv.store("model tokens, summarizer down")
    started = time.monotonic()
    turns = grow(conv, 25, words=700)  # as much text as 50 turns of 330 words (each turn repeats a marker)
    problems, worst = check_chat(conv, turns, model)
    assert not problems, "\n".join(problems[:12])
    # the chat really grew far past the model's window; the cap, not luck, kept it under
    all_user_text = [{"role": "user", "content": t.text} for t in turns]
    assert count_tokens(all_user_text) * MODEL_SPECS[model].ratio > 1.5 * MODEL_SPECS[model].window
    last = turns[-1].requests[-1]
    assert last["model_tokens"] > 0.85 * CAP, last["model_tokens"]  # it ran at the cap...
    assert last["model_tokens"] <= CAP  # ...never over it
    assert not any(has_summary(r) for t in turns for r in t.requests)
    print(
        f"\n[e2e] {model}: 25 turns in {time.monotonic() - started:.0f}s, last request {last['model_tokens']},"
        f" worst status figure error {worst:.1%} (displayed figures, rounded)"
    )


def test_a_chat_grown_past_the_window_with_summaries_working(acc, provider):
    set_up(acc, compression_threshold_tokens=8000, debug=False)
    conv = Conversation(acc, provider, seed=23, model=VLLM_MODEL)
    conv.add_turns(1, words=40)
    conv.store("model tokens, summaries on")
    turns = grow(conv, 20, words=800)  # 16,000 words in all, as 40 turns of 400 did
    problems, worst = check_chat(conv, turns, VLLM_MODEL)
    assert not problems, "\n".join(problems[:12])
    assert any(has_summary(r) for t in turns for r in t.requests), "no summary was ever applied"
    all_user_text = [{"role": "user", "content": t.text} for t in turns]
    assert count_tokens(all_user_text) * 1.3 > MODEL_SPECS[VLLM_MODEL].window
    print(f"\n[e2e] summaries on: worst status figure error {worst:.1%} (displayed figures, rounded)")
