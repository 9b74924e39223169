"""Local models as they really serve (issue 37): small windows, big turns, in a real Open WebUI with two workers and
DEFAULT valves except ``summary_model``.

Every chat opens with a short greeting, then grows by turns of ~1.2k tokens (a user message carrying one marker, the
fact; the fake's short reply) until the user typed five times the model's window:

* Ollama over its native API (an Ollama connection, ``/api/chat``) at ``num_ctx`` 4096 and 8192: over it Ollama drops
  whole messages from the front without a word and reports what it kept;
* llama-server ``-c 8192`` publishing ``meta.n_ctx_train`` 131072 (an OpenAI connection): over it, a 400
  ``exceed_context_size_error``.

Checked: no Ollama request is cut and every request carries every fact of its branch (verbatim or in the summary);
llama-server rejects at most one request (the window's only witness before the served-window probe) and only the
request right after it may miss facts (trimmed to the window just learned before a summary exists); at 8k a summary is
written at most every third turn; the 4k chat gets one about every turn (what a 4k window allows with 1.2k turns: the
summary, the last turn and the new message).

The Ollama chats of ``SET_4K``/``SET_8K`` know their window from ``num_ctx`` in the models' params (set as an admin
sets them in Open WebUI, which puts it in the request's ``options`` before inlet; outlet gets neither, and plans in
the window the reply's request was sent in); ``SERVED_4K``/``SERVED_8K`` have none set and are found by asking the
server (``/api/ps``), and count as Llama 3 counts English (1.1x cl100k plus 4 per message; the others count 1:1);
llama-server's window is found by asking ``/props``, so it rejects nothing (tests/e2e/test_served_window.py covers a
llama-server without ``/props``: one rejection at most).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import (
    FILTER_ID,
    Conversation,
    Turn,
    request_markers,
    retrying,
    wait_for,
)

from devkit.fake_provider import FakeProvider, count_tokens, llamacpp_spec, ollama_spec

pytestmark = pytest.mark.e2e

SUMMARIZER = "fake-summary"
TRAINED = 131072
SET_4K, SET_8K = "small-4k:8b", "small-8k:8b"  # num_ctx in the model's params in Open WebUI
SERVED_4K, SERVED_8K = "served-4k:8b", "served-8k:8b"  # the window only from the server (/api/ps)
LLAMA = "llama-server-8k"
WINDOWS = {SET_4K: 4096, SET_8K: 8192, SERVED_4K: 4096, SERVED_8K: 8192, LLAMA: 8192}
LLAMA3 = {"ratio": 1.1, "per_message": 4}  # the served models count as Llama 3 counts English (issue 44)
VALVES = {"summary_model": SUMMARIZER}  # everything else at its default
WORDS = 1060  # per user turn: about 1,200 tokens (the reply adds a few dozen)
GROWTH = 5  # what the user types, in windows
READING = 1.5  # seconds a user reads a reply; then summaries begun meanwhile finish (summary_settled)


OLLAMA_SPECS = {m: ollama_spec(WINDOWS[m], trained=TRAINED) for m in (SET_4K, SET_8K)} | {
    m: ollama_spec(WINDOWS[m], trained=TRAINED, **LLAMA3) for m in (SERVED_4K, SERVED_8K)
}
LLAMA_SPECS = {LLAMA: llamacpp_spec(WINDOWS[LLAMA], trained=TRAINED)}


@pytest.fixture(scope="module")
def stack(local_servers):
    """(client, the Ollama fake, the llama-server fake that also serves the summarizer): conftest's Open WebUI with
    fake local servers, the filter at this module's valves."""
    _, client, fakes = local_servers
    retrying(lambda: client.set_valves(FILTER_ID, dict(VALVES)))
    for model in (SET_4K, SET_8K):  # as an admin sets a model's context length in Open WebUI
        params = {"num_ctx": WINDOWS[model]}
        made = client.post("/api/v1/models/create", {"id": model, "name": model, "meta": {}, "params": params})
        assert made and made["params"]["num_ctx"] == WINDOWS[model], made
    yield client, fakes["ollama"], fakes["llama"]


def live_turn(conv: Conversation, summaries: FakeProvider) -> Turn:
    """One user turn, then the reading pause and the summary it started, saved."""
    turn = conv.turn_maybe_rejected(WORDS)
    time.sleep(READING)
    wait_for(lambda: not _summarizing(summaries), deadline=90, what="summaries in flight to finish")
    wait_for(lambda: _settled(conv, turn.assistant_id), deadline=90, what="the summary this reply started to be saved")
    return turn


def _summarizing(summaries: FakeProvider) -> bool:
    return any(r["status"] is None for r in summaries.requests if r["kind"] == "summary")


def _lines(conv: Conversation, message_id: str) -> list:
    message = conv.client.get_chat(conv.chat_id)["chat"]["history"]["messages"].get(message_id) or {}
    return [str(s.get("description") or "") for s in message.get("statusHistory") or [] if isinstance(s, dict)]


def _settled(conv: Conversation, reply_id: str) -> bool:
    """Whether a summary this reply's outlet started ("Summarizing …") has ended, saved or failed."""
    lines = _lines(conv, reply_id)
    started = [i for i, line in enumerate(lines) if "Summarizing " in line]
    ends = ("Summary updated", "Summary failed", "Nothing to summarize")
    return not started or any(end in line for line in lines[started[-1] :] for end in ends)


def grow(client, provider: FakeProvider, summaries: FakeProvider, model: str) -> tuple:
    conv = Conversation(client, provider, seed=WINDOWS[model] + len(model), model=model)
    conv.add_turns(1, words=12)
    conv.store(f"small window {model}")
    turns, typed = [], 0
    while typed < GROWTH * WINDOWS[model]:
        turns.append(live_turn(conv, summaries))
        typed += count_tokens([{"role": "user", "content": turns[-1].text}])
    summarized = [
        n for n, t in enumerate(turns, 1) if any("Summary updated" in x for x in _lines(conv, t.assistant_id))
    ]
    return conv, turns, summarized


def faults(turns: list) -> dict:
    """Per kind, the turns (1-based) whose request was rejected, cut (messages dropped), or missed a fact."""
    found: dict = {"rejected": [], "cut": [], "lost": []}
    for n, turn in enumerate(turns, 1):
        for req in turn.requests:
            found["rejected"] += [n] if req["status"] != 200 else []
            found["cut"] += [n] if req["cut"] else []
            found["lost"] += [n] if turn.expected - request_markers(req) else []
    return found


@pytest.fixture(scope="module")
def chats(stack):
    """Every chat grown at once, on both workers: model -> (conversation, turns, turns followed by a summary)."""
    client, ollama, openai = stack
    provider = {m: ollama for m in (SET_4K, SET_8K, SERVED_4K, SERVED_8K)} | {LLAMA: openai}
    with ThreadPoolExecutor(len(WINDOWS)) as pool:
        grown = dict(zip(WINDOWS, pool.map(lambda m: grow(client, provider[m], openai, m), WINDOWS)))
    for model, (_, turns, summarized) in grown.items():
        sizes = [r["model_tokens"] for t in turns for r in t.requests]
        print(f"\n[e2e] {model}: {faults(turns)}; summaries after turns {summarized}; model tokens sent {sizes}")
    return grown


def test_ollama_with_its_window_known_cuts_nothing_and_every_request_carries_every_fact(chats):
    for model in (SET_4K, SET_8K):
        conv, turns, summarized = chats[model]
        found = faults(turns)
        assert count_tokens([{"role": "user", "content": t.text} for t in turns]) >= GROWTH * WINDOWS[model]
        assert found == {"rejected": [], "cut": [], "lost": []}, (model, found)
        assert all(r["api"] == "ollama" for t in turns for r in t.requests)  # its native API


def test_at_8k_with_long_turns_a_summary_is_written_at_most_every_third_turn(chats):
    for model in (SET_8K, LLAMA):
        _, turns, summarized = chats[model]
        assert len(summarized) >= 3, (model, summarized)
        assert all(b - a >= 3 for a, b in zip(summarized, summarized[1:])), (model, summarized)
        assert len(summarized) <= math.ceil(len(turns) / 3), (model, summarized)


def test_at_4k_with_long_turns_every_turn_gets_its_summary_in_time(chats):
    _, turns, summarized = chats[SET_4K]
    assert len(summarized) >= len(turns) - 3, summarized  # from the first fold on, about one per turn


def summarizer_calls_per_turn(summaries: FakeProvider, turns: list, first: int = 8) -> float:
    """The summarizer calls a chat's folds made from its ``first``-th turn on, per turn: a call is the chat's when it
    carries one of its markers (every marker is drawn anew); from the ``first``-th turn's request on, sent once the
    folds of the turns before it were saved (live_turn)."""
    ours = set().union(*(t.expected for t in turns))
    begun = min(r["time"] for r in turns[first - 1].requests)
    calls = [r for r in summaries.requests if r["kind"] == "summary" and r["time"] >= begun]
    return sum(1 for r in calls if request_markers(r) & ours) / (len(turns) - first + 1)


def test_from_the_8th_turn_a_fold_takes_one_summarizer_call_a_turn_at_4k_and_one_per_two_turns_at_8k(chats, stack):
    """Issue 44: the fold depth is reckoned in the model's own tokens (1.1x plus 4 a message for the served models),
    so a fold is one call where the summarizer's window holds it: at 4k each turn is folded alone (one turn fills the
    room), at 8k two or three at once."""
    _, _, summaries = stack
    rates = {m: summarizer_calls_per_turn(summaries, chats[m][1]) for m in (SET_4K, SERVED_4K, SET_8K, SERVED_8K)}
    print(f"\n[e2e] summarizer calls per turn from the 8th: {rates}")
    assert rates[SET_4K] <= 1.0 and rates[SERVED_4K] <= 1.0, rates
    assert rates[SET_8K] <= 0.5 and rates[SERVED_8K] <= 0.5, rates


def test_llama_server_publishing_its_trained_size_rejects_nothing_when_props_answers(chats, stack):
    _, _, openai = stack
    _, turns, _ = chats[LLAMA]
    found = faults(turns)
    probed = any(p["path"] in ("/props", "/slots") and p["status"] == 200 for p in openai.probes)
    assert probed, openai.probes  # the filter asked the server what it serves
    assert not found["rejected"] and not found["lost"] and not found["cut"], found


def test_ollama_found_from_the_server_cuts_nothing_after_the_first_reply(chats):
    for model in (SERVED_4K, SERVED_8K):
        _, turns, _ = chats[model]
        found = faults(turns)
        assert not [n for n in found["cut"] if n > 1] and not found["lost"], (model, found)
