"""Recall on the request path (issue 36, phase 2): what the Filter sends when a chat has a summary.

Each test drives ``Filter.inlet`` (and the request hook) with a stored summary and checks what reaches the model:
the recalled passage after the user's own words, inside the cap, said on the status line and shown as a source; and
nothing when the valve is 0, when nothing is relevant, on another branch, or twice in one tool loop.
"""

from __future__ import annotations

import asyncio
import copy
import random
import re

import pytest
from acc_builders import AS, CITIES, A, RecordStore, S, T, U, lines_written, make_filter, text_of, warehouse_chat

import async_context_compression as acc
from bench.corpus import make_text

QUESTION = "What was the access code of the Lisbon warehouse again?"
_RNG = random.Random(3)
TALK = [m for _ in range(100) for m in (U(make_text("english", 200, _RNG)), AS(make_text("english", 500, _RNG)))]
LISBON = len(TALK) + 5  # the reply with Lisbon's code (BX-4402), in turn 103
COVERED = len(TALK) + 16  # canonical messages the summary covers (head: the first message): up to turn 108


def chat() -> list:
    """A hundred turns of everyday talk, then ten turns about warehouses, each reply with an access code."""
    return copy.deepcopy(TALK) + warehouse_chat()


def summarized(canon: list, covered: int = COVERED, chat_id: str = "c1") -> acc.SummaryRecord:
    digests = [acc.canonical_digest(m) for m in canon]
    fingerprint = acc.prefix_fingerprint(digests, covered)
    return acc.SummaryRecord("u1", chat_id, "a", 1, covered, fingerprint, "The team noted its warehouses.")


def request(canon: list, question: str = QUESTION) -> dict:
    return {"model": "gpt-4o", "messages": [S(), *copy.deepcopy(canon), U(question)]}


def run(f: acc.Filter, body: dict, chat_id: str = "c1", message_id: str = "r1", hook: str = "inlet") -> tuple:
    events: list = []

    async def emitter(event):
        events.append(event)

    async def call():
        meta = {"chat_id": chat_id, "message_id": message_id}
        kwargs = {"__user__": {"id": "u1"}, "__metadata__": meta, "__event_emitter__": emitter}
        out = copy.deepcopy(body)
        if hook == "inlet":
            out = await f.inlet(out, **kwargs)
        if hook == "request" or acc.request_hook_follows():  # Open WebUI 0.11.2+ calls it before the model call
            out = await f.request(copy.deepcopy(out), **kwargs)
        await lines_written(f)
        return out

    return asyncio.run(call()), events


def statuses(events: list) -> str:
    return " | ".join(e["data"]["description"] for e in events if e["type"] == "status")


def sources(events: list) -> list:
    return [e["data"] for e in events if e["type"] == "source"]


def recall_filter(cap: int = 6000, records=(), **valves) -> acc.Filter:
    return make_filter(cap, counter="estimate", store=RecordStore(records), **valves)


def test_inlet_quotes_the_dropped_detail_after_the_users_words_and_says_where_it_came_from():
    canon = chat()
    f = recall_filter(records=[summarized(canon)])
    out, events = run(f, request(canon))
    sent, last = out["messages"], text_of(out["messages"][-1]["content"])
    assert acc.is_summary_message(sent[1]) and "BX-4402" not in text_of(sent[1]["content"])
    assert last.startswith(QUESTION + "\n\n" + acc.RECALL_PREAMBLE) and last.endswith(acc.RECALL_CLOSE)
    assert "The access code for the Lisbon warehouse is BX-4402." in last and "[turn 103, assistant]" in last
    assert re.search(r"recalled \d+ passages? from turns? [^|]*\b103\b", statuses(events))
    (source,) = sources(events)
    assert re.fullmatch(r"Recalled from earlier turns \(\d+ passages?\)", source["source"]["name"])
    assert any("BX-4402" in document for document in source["document"])
    assert "turn 103" in [item["name"] for item in source["metadata"]]
    # everything before the user's words is what the same request without recall sends: the cached prefix holds
    plain, _ = run(recall_filter(records=[summarized(canon)], recall_share=0), request(canon))
    assert sent[:-1] == plain["messages"][:-1] and last.startswith(text_of(plain["messages"][-1]["content"]))


def test_valve_zero_switches_recall_off():
    canon = chat()
    out, events = run(recall_filter(records=[summarized(canon)], recall_share=0), request(canon))
    assert text_of(out["messages"][-1]["content"]) == QUESTION
    assert "recalled" not in statuses(events) and not sources(events)


@pytest.mark.parametrize("question", ["Tell me a joke about cats.", "Thanks, that is all for today!", "好的，谢谢！"])
def test_nothing_relevant_recalls_nothing(question):
    canon = chat()
    out, events = run(recall_filter(records=[summarized(canon)]), request(canon, question))
    assert text_of(out["messages"][-1]["content"]) == question
    assert "recalled" not in statuses(events) and not sources(events)


def test_without_a_summary_nothing_is_recalled():
    canon = chat()
    out, _ = run(recall_filter(), request(canon))
    assert text_of(out["messages"][-1]["content"]) == QUESTION


def test_a_branch_never_recalls_the_messages_of_another_branch_of_the_chat():
    canon = chat()
    other = copy.deepcopy(canon)  # the same chat, edited at turn 3: Lisbon's code differs from there on
    other[LISBON] = AS("The access code for the Lisbon warehouse is QQ-1234. The loading dock opens at 8 am.")
    f = recall_filter(records=[summarized(canon), summarized(other)])
    first, _ = run(f, request(canon))
    assert "BX-4402" in text_of(first["messages"][-1]["content"])  # branch one's folded messages are indexed
    out, events = run(f, request(other))
    last = text_of(out["messages"][-1]["content"])
    assert "QQ-1234" in last and "BX-4402" not in last, "a branch quoted another branch's message"
    assert re.search(r"recalled \d+ passages? from turns? [^|]*\b103\b", statuses(events))


def test_a_temporary_chat_recalls_from_its_summary_in_memory():
    canon = chat()
    f = make_filter(6000, counter="estimate")  # the real store: a temporary chat's summaries live in memory
    asyncio.run(f.store.save(summarized(canon, chat_id="temporary:t1")))
    out, events = run(f, request(canon), chat_id="temporary:t1")
    assert "BX-4402" in text_of(out["messages"][-1]["content"])
    assert re.search(r"recalled \d+ passages? from turns? [^|]*\b103\b", statuses(events))


def test_a_tool_loop_reuses_inlets_block_and_searches_once(monkeypatch):
    canon = chat()
    f = recall_filter(records=[summarized(canon)])
    searches = []
    search = acc.RecallIndex.search
    monkeypatch.setattr(acc.RecallIndex, "search", lambda *a, **k: searches.append(a[1]) or search(*a, **k))
    out, events = run(f, request(canon))  # inlet, then the request hook before the loop's first model call
    loop = {**out, "messages": [*out["messages"], A("c1", name="lookup"), T("c1", "the gate log is empty")]}
    shown = sources(events)
    for _ in range(2):  # two more model calls of the loop, each after inlet's list
        sent, events = run(f, loop, hook="request")
        users = [m for m in sent["messages"] if m["role"] == "user"]
        assert text_of(users[-1]["content"]).count(acc.RECALL_OPEN) == 1
        assert re.search(r"recalled \d+ passages? from turns? [^|]*\b103\b", statuses(events))
        shown += sources(events)
    assert len(searches) == 1  # inlet searched; the loop's calls send its block
    assert len(shown) == 1  # the source is shown once for the reply, not per call


@pytest.mark.parametrize("question", [QUESTION, "And the Lisbon warehouse code...", "Lisbon?\nThe access code!"])
def test_the_request_hook_finds_the_message_inlet_grew_counted_exactly(monkeypatch, question):
    """Issue 43: the request hook fits what inlet sent, and tokenized the user's message again with its block in it
    (~2,400 tokens of a question: ~2 ms); inlet now records its count, from its count before and the block's parts."""
    canon = chat()
    f = make_filter(8000, counter="exact", store=RecordStore([summarized(canon)]))
    counted: list = []
    text_tokens = f.counter.text_tokens
    monkeypatch.setattr(
        f.counter, "text_tokens", lambda text, *a, **k: counted.append(text) or text_tokens(text, *a, **k)
    )
    out, events = run(f, {**request(canon, question), "model": "gpt-4"})  # cl100k_base
    asked = out["messages"][-1]
    assert acc.RECALL_OPEN in text_of(asked["content"])
    assert re.search(r"recalled \d+ passages? from turns? ", statuses(events)) and sources(events)  # and said so
    assert not any(question in text and acc.RECALL_OPEN in text for text in counted)  # neither hook counted it whole
    assert f.counter.known(asked, "cl100k_base") == f.counter.measure([asked], "cl100k_base", True)[0]


def sent_tokens(f: acc.Filter, messages: list) -> int:
    return acc.count_request(f.counter, messages, "o200k_base", acc.request_fixed_tokens(f.counter, None, "o200k_base"))


@pytest.mark.parametrize("room", range(0, 400, 16))
def test_recall_never_takes_a_request_over_the_cap_and_uses_the_room_left(room):
    canon = chat()
    plain = recall_filter(cap=100_000, records=[summarized(canon)], recall_share=0)
    cap = sent_tokens(plain, run(plain, request(canon))[0]["messages"]) + room
    f = recall_filter(cap=cap, records=[summarized(canon)], recall_share=0.5)
    sent = run(f, request(canon))[0]["messages"]
    assert sent_tokens(f, sent) <= cap
    recalled = acc.RECALL_OPEN in text_of(sent[-1]["content"])
    if room <= 64 or room >= 240:  # the block (over 100 tokens) goes in only where the room left takes it
        assert recalled == (room >= 240), room


def test_the_index_is_built_once_and_extended_only_by_new_folds(monkeypatch):
    canon = chat()
    added = []
    extend = acc.extend_yielding

    async def counted(index, passages):
        added.append(await extend(index, passages))
        return added[-1]

    monkeypatch.setattr(acc, "extend_yielding", counted)
    f = recall_filter(records=[summarized(canon)])
    for _ in range(3):
        run(f, request(canon))
    assert len(added) == 1 and added[0] > 0  # indexed on the first request, read by the next ones
    longer = [*canon, U(f"And what about {CITIES[0]}?"), AS("Berlin is fine.")]
    f.summaries.store = RecordStore([summarized(longer, covered=COVERED + 4)])
    run(f, request(longer))
    assert len(added) == 2 and 0 < added[1] < added[0]  # only the newly folded messages


def test_the_status_line_names_the_passages_and_their_turns_in_every_language():
    passages = (
        acc.Passage("a", 7, "user", "x"),
        acc.Passage("b", 3, "assistant", "y"),
        acc.Passage("c", 3, "tool", "z"),
    )
    line = acc.status_line("en", acc.SentOutcome(used=1000, cap=8000, covered=10, recalled=passages[:2]))
    assert line == "1.0k / 8.0k tokens sent · summary covers 10 messages · recalled 2 passages from turns 3 and 7"
    one = acc.status_line("en", acc.SentOutcome(used=1000, cap=8000, recalled=passages[1:]), show_usage=False)
    assert one == "recalled 2 passages from turn 3"
    more = (*passages, acc.Passage("d", 5, "user", "w"))
    assert "recalled 4 passages from turns 3, 5 and 7" in acc.status_line("en", acc.SentOutcome(1, 8, recalled=more))
    assert "从第 3、5和7 轮召回 4 段原文" in acc.status_line("zh", acc.SentOutcome(1, 8, recalled=more))
    assert "восстановлено: 4 фрагмента из ходов 3, 5 и 7" in acc.status_line("ru", acc.SentOutcome(1, 8, recalled=more))
    for language in acc.STATUS_TEXTS:
        line = acc.status_line(language, acc.SentOutcome(1, 8, recalled=passages[:2]), show_usage=False)
        assert "3" in line and "7" in line and "{" not in line, language
        assert language == "en" or "recalled" not in line, language  # translated, not the English text or the key
        event = acc.recall_source_event(language, passages[:2], "s")
        assert "2" in event["data"]["source"]["name"] and "recall_source" not in event["data"]["source"]["name"]
        assert event["data"]["document"] == ["y", "x"]  # in the conversation's order
        assert [m["name"] for m in event["data"]["metadata"]] != ["turn", "turn"]


def test_recall_share_is_a_bounded_valve():
    settings = acc.resolve_settings(acc.Filter.Valves(recall_share=0.9), "m")
    assert settings.recall_share == 0.5 and any(n.key == "n_valve_invalid" for n in settings.warnings)
    assert acc.resolve_settings(acc.Filter.Valves(), "m").recall_share == acc.RECALL_SHARE == 0.1
    assert acc.resolve_settings(acc.Filter.Valves(recall_share="off?"), "m").recall_share == 0.1


def test_an_erase_forgets_every_recalled_passage_the_worker_kept():
    """The stored data erased: the recall indexes, the passages' token counts and the quoted passages kept for the
    next question go, so no erased text stays in the worker's memory."""
    f = make_filter()
    passage = acc.Passage(digest="d", turn=3, role="user", text="the vault code is 4471")
    acc._quoted(passage)
    f.summaries.recall.tokens[("cl100k_base", True, "the vault code is 4471")] = 7
    assert acc._quoted.cache_info().currsize > 0
    f.path.forget_before(float("inf"))
    assert acc._quoted.cache_info().currsize == 0
    assert not f.summaries.recall.tokens and not f.summaries.recall.indexes
