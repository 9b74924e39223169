"""Recall end to end (issue 36): facts a summary dropped reach the model again when the user asks about them.

The session's Open WebUI on two workers, the filter with its default valves but ``summary_model``, a chat model whose
window the provider publishes (the cap is found from it) and a summary model that keeps only half of the facts it is
shown (the fake's ``lossy`` summaries, chosen by a hash of each fact's value). A saved chat states 24 facts, talks on
until a summary covers all of them, then asks about 10 of the facts the summary dropped, in other words than the
facts', each question followed by three ordinary turns (which must quote nothing): at least 9 must bring their fact to the model verbatim, with the passage's turn on the status line. With
``recall_share`` 0 the same questions bring none. No request goes over the cap, and the prompt-cache prefix (whole
messages equal to the previous request's, from the start, as bench/fidelity.py measures it, from the first summary
on) keeps at least 98% of its tokens against the same requests without their blocks (issue 43 lets a question fill
the room left, so the share of a larger request falls with no cached token lost).
"""

from __future__ import annotations

import random
import re

import pytest
from e2e_support import E2E_VALVES, FILTER_ID, Conversation, filler, last_user_text, retrying, settle

from devkit.fake_provider import ModelSpec, count_tokens, lossy_keeps
from devkit.openwebui import new_id

pytestmark = pytest.mark.e2e

CHAT = "fake-recall-8k"
SUMMARIZER = "fake-recall-summary"
WINDOW = 8192
CAP = WINDOW - WINDOW // 8  # the window less the reply's room (1/8 of it without max_tokens): the filter's cap
SPECS = {
    CHAT: ModelSpec(window=WINDOW, publish="max_model_len", error_shape="nested"),
    SUMMARIZER: ModelSpec(window=32768, publish="max_model_len", error_shape="nested"),
}
VALVES = {"summary_model": SUMMARIZER}  # everything else at its default
CITIES = ("Lisbon", "Berlin", "Oslo", "Madrid", "Vienna", "Prague", "Dublin", "Warsaw", "Athens", "Helsinki", "Osaka")
# (fact, question): the question names the entity and what is asked, never the value
TEMPLATES = (
    ("The access code for the {e} warehouse is {v}.", "Quick one: which access code opens the {e} warehouse?"),
    ("Our contract with the supplier in {e} has the number {v}.", "What number does our {e} supplier contract have?"),
    ("The on-call engineer for {e} wears badge {v} this month.", "Which badge does the {e} on-call engineer wear?"),
)
QUESTIONS = 10
ORDINARY_TURNS = 3  # after each question: questions about dropped details are a part of a chat, not all of it
RECALL_OPEN = "<recalled_context>"


@pytest.fixture(scope="module")
def stack(two_workers, provider):
    """The session's two-worker Open WebUI and provider (this module's models listed from its start: conftest's
    shared_two_workers), lossy summaries, the filter at its default valves but the summary model."""
    server, client = two_workers
    retrying(lambda: client.wait_for_models(list(SPECS), timeout=90))
    client.set_valves(FILTER_ID, dict(VALVES))
    provider.configure(summary_format="lossy")
    yield server, client, provider
    provider.configure(summary_format=None)
    client.set_valves(FILTER_ID, dict(E2E_VALVES))


def make_facts(rng: random.Random) -> list:
    """24 facts (fact, question, value), half of them ones the lossy summary drops, in a shuffled order."""
    dropped, kept, pairs = [], [], [(t, e) for t in TEMPLATES for e in CITIES]
    rng.shuffle(pairs)
    for template, entity in pairs:
        value = f"{rng.choice('BCDFGHKMQRTXZ')}{rng.choice('ABEKLNPSUW')}-{rng.randint(1000, 9999)}"
        fact = (template[0].format(e=entity, v=value), template[1].format(e=entity), value)
        (kept if lossy_keeps(value) else dropped).append(fact)
    facts = dropped[:12] + kept[:12]
    rng.shuffle(facts)
    return facts


def say(conv: Conversation, text: str, wait: bool = False) -> tuple[list, str]:
    """One user turn with exactly ``text``: the chat requests it made (the request hook: one per model call) and
    the reply's id. ``wait``: until the summary this reply started, if any, is written (the user reads first)."""
    parent, user_id = conv.history.current_id, new_id()
    start = len(conv.provider.requests)
    result = conv.client.chat_completion(
        text, model=conv.model, chat_id=conv.chat_id, parent_id=parent, user_message_id=user_id, system=conv.system
    )
    conv.history.user(text, parent_id=parent, message_id=user_id)
    reply = result["response"]["choices"][0]["message"]["content"] or ""
    conv.history.assistant(reply, parent_id=user_id, message_id=result["assistant_id"])
    if wait:
        settle(conv.provider, start)
    requests = [r for r in conv.provider.requests[start:] if r["kind"] == "chat" and last_user_text(r) == text]
    assert requests, f"no chat request for {text[:60]!r}"
    return requests, result["assistant_id"]


def reply_lines(conv: Conversation, reply_id: str) -> str:
    """The status lines stored on one reply."""
    message = conv.client.get_chat(conv.chat_id)["chat"]["history"]["messages"].get(reply_id) or {}
    return " | ".join(str(s.get("description") or "") for s in message.get("statusHistory") or [])


def folded(request: dict, texts: list) -> bool:
    """Whether none of ``texts`` is among the request's messages verbatim (a summary stands for all of them)."""
    sent = "\n".join(str(m.get("content")) for m in request["messages"] if m.get("role") != "system")
    return not any(text in sent for text in texts)


def without_block(request: dict) -> list:
    """The request's messages as they would be without recall: its last user message without the block."""
    messages = [dict(m) for m in request["messages"]]
    last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    content = str(messages[last].get("content"))
    messages[last]["content"] = content.split("\n\nPassages of earlier turns", 1)[0]
    return messages


def cached_prefix(requests: list) -> tuple[int, int]:
    """(tokens in whole messages equal to the previous request's, from the start: what a provider's cache serves;
    the requests' tokens)."""
    same_tokens = total = 0
    for before, now in zip(requests, requests[1:]):
        same = 0
        while same < min(len(before), len(now)) and before[same] == now[same]:
            same += 1
        same_tokens += count_tokens(now[:same])
        total += count_tokens(now)
    return same_tokens, total


def prefix_share(requests: list) -> float:
    """The cached prefix over the requests' tokens."""
    same_tokens, total = cached_prefix(requests)
    return same_tokens / max(1, total)


def test_questions_about_dropped_facts_bring_them_back_on_two_workers(stack):
    server, client, provider = stack
    start = len(provider.requests)  # the session's provider: this test's requests are the ones from here on
    rng = random.Random(36)
    facts = make_facts(rng)
    conv = Conversation(client, provider, seed=36, model=CHAT)
    conv.add_turns(1, words=40)
    conv.store("recall")
    sent: list = []  # the first chat request of each turn
    said = []
    for n in range(0, len(facts), 3):  # three facts a turn, in ordinary talk
        text = " ".join(f"{filler(rng, 40)} {fact}" for fact, _, _ in facts[n : n + 3])
        sent += say(conv, text)[0][:1]
        said.append(text)
    stated = len(sent)
    for _ in range(40):  # talk on until a summary stands for every turn that stated a fact
        sent += say(conv, filler(rng, 300), wait=True)[0][:1]
        if folded(sent[-1], said):
            break
    assert folded(sent[-1], said), "no summary covered the facts' turns"
    summary = "\n".join(str(m["content"]) for m in sent[-1]["messages"] if m["role"] == "system")
    dropped = [f for f in facts if not lossy_keeps(f[2])][:QUESTIONS]
    assert not any(value in summary for _, _, value in dropped) and any(f[2] in summary for f in facts)
    since = len(sent) - 1

    brought, lines, asked = [], [], []
    for fact, question, _ in dropped:  # a question now and then, among ordinary turns
        requests, reply_id = say(conv, question)
        asked.append(len(sent))
        sent.append(requests[0])
        content = str(requests[0]["messages"][-1].get("content"))
        brought.append(content.startswith(question) and fact in content.split("<recalled_context>", 1)[-1])
        lines.append(reply_lines(conv, reply_id))
        for _ in range(ORDINARY_TURNS):
            sent += say(conv, filler(rng, 300))[0][:1]
    missed = [q for (_, q, _), ok in zip(dropped, brought) if not ok]
    print(f"\n[e2e] recall: {sum(brought)} of {len(brought)} questions brought their fact verbatim; missed: {missed}")
    assert sum(brought) >= 9, missed
    assert all(re.search(r"recalled \d+ passages? from turns? \d+", line) for line, ok in zip(lines, brought) if ok)
    quiet = [i for i, r in enumerate(sent[stated:], stated) if i not in asked and RECALL_OPEN in str(r["messages"][-1])]
    assert not quiet, f"{len(quiet)} ordinary turns recalled something"

    # the provider's cached prefix: the same requests without their blocks, from the first summary on
    with_blocks = [r["messages"] for r in sent[since:]]
    plain = [without_block(r) for r in sent[since:]]
    drop = prefix_share(plain) - prefix_share(with_blocks)
    print(
        f"[e2e] prefix share {prefix_share(with_blocks):.3f} with recall, {prefix_share(plain):.3f} without "
        f"({len(with_blocks)} requests, {len(asked)} questions)"
    )
    # issue 43: a question may fill the room left under the cap, so its request is larger and the share falls with
    # no cached token lost; what must hold is the cache itself: the tokens served from the previous request's prefix
    assert cached_prefix(with_blocks)[0] >= 0.98 * cached_prefix(plain)[0], (
        drop,
        cached_prefix(with_blocks),
        cached_prefix(plain),
    )

    client.set_valves(FILTER_ID, {**VALVES, "recall_share": 0})
    without = [value in str(say(conv, question)[0][0]["messages"]) for _, question, value in dropped]
    assert not any(without), "without recall a dropped fact reached the model: the summary kept it"

    everything = [r for r in provider.requests[start:] if r["kind"] == "chat"]
    assert all(r["status"] == 200 for r in everything), [r.get("error") for r in everything if r["status"] != 200]
    over = [r["model_tokens"] for r in everything if (r["model_tokens"] or 0) > CAP]
    assert not over, f"requests over the cap {CAP}: {over}"
    assert len(server.worker_pids()) >= 3, "expected a supervisor and 2 workers"
    print(f"[e2e] largest request {max(r['model_tokens'] or 0 for r in everything)} tokens (cap {CAP})")
