"""The Filter end to end without Open WebUI: outlet schedules the background
summary, the store keeps it in a real SQLite file or PostgreSQL database, and
inlet applies it to the next request.

Chats are built the way Open WebUI 0.12 stores them (assistant tool calls in
``output``) for outlet, and the way inlet receives them (expanded into
``assistant(tool_calls)`` + ``tool`` messages, no ids) for inlet. Every
message carries ``MK-xxxx`` markers; the fake summarizer repeats every marker
it is shown, so a summary proves which messages it folded.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time

import pytest
from acc_builders import MARK, FakeSummarizer, lines_written, make_filter
from pg_support import lease_row
from race_worker import run_processes

import async_context_compression as acc
from devkit.probes import canonical_view, messages_tokens

FILLER = (
    "The committee reviewed the quarterly figures, compared them with last year's plan "
    "and asked the team for a careful estimate of the remaining work before the release. "
)
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ALICE = {"id": "alice", "name": "Alice", "role": "user"}
BOB = {"id": "bob", "name": "Bob", "role": "user"}
MODEL = "test-model"
VALVES = dict(
    compression_threshold_tokens=600,
    max_context_tokens=0,
    keep_first=1,
    keep_last=2,
    max_summary_tokens=256,
    summary_timeout_seconds=30,
)


# -- chats as Open WebUI stores them, and as inlet receives them ---------------


def stored_turn(i: int, tool: bool, tag: str = "", size: int = 2) -> list:
    """One user message and its reply, as stored. ``tag`` makes a different
    version of the same turn (an edit or a regeneration)."""
    text = FILLER * size
    user = {
        "id": f"u{i}{tag}",
        "role": "user",
        "timestamp": 1700000000 + i,
        "content": f"MK-{i:02d}01 {tag}Question {i}. {text}",
    }
    answer = f"MK-{i:02d}04 {tag}Answer {i}. {text}"
    assistant = {"id": f"a{i}{tag}", "role": "assistant", "timestamp": 1700000000 + i, "content": answer}
    if tool:
        call_id = f"call_{i}{tag}"
        assistant["output"] = [
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "search_docs",
                "arguments": json.dumps({"query": f"MK-{i:02d}02 topic {i}"}),
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": [{"type": "input_text", "text": f"MK-{i:02d}03 {tag}result {i}: {text}"}],
            },
            {"type": "message", "content": [{"type": "output_text", "text": answer}]},
        ]
    return [user, assistant]


def stored_chat(turns: range, size: int = 2) -> list:
    out = []
    for i in turns:
        out += stored_turn(i, tool=i % 2 == 0, size=size)
    return out


def tiny_turn(i: int) -> list:
    return [
        {"id": f"u{i}", "role": "user", "content": f"MK-{i:02d}01 ok"},
        {"id": f"a{i}", "role": "assistant", "content": f"MK-{i:02d}04 fine"},
    ]


def as_inlet_sees_it(stored: list) -> list:
    """What Open WebUI hands inlet for a stored branch: each assistant's
    ``output`` expanded (``convert_output_to_messages``), ids stripped."""
    out = []
    for message in stored:
        output = message.get("output")
        if message["role"] == "assistant" and output:
            pending: dict = {"role": "assistant", "content": "", "tool_calls": []}
            for item in output:
                if item["type"] == "function_call":
                    pending["tool_calls"].append(
                        {
                            "id": item["call_id"],
                            "type": "function",
                            "function": {"name": item["name"], "arguments": item["arguments"]},
                        }
                    )
                elif item["type"] == "function_call_output":
                    if pending["tool_calls"]:
                        out.append(pending)
                        pending = {"role": "assistant", "content": "", "tool_calls": []}
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": item["call_id"],
                            "content": "".join(p["text"] for p in item["output"]),
                        }
                    )
                elif item["type"] == "message":
                    pending["content"] = "".join(p["text"] for p in item["content"])
            if not pending["tool_calls"]:
                del pending["tool_calls"]
            out.append(pending)
        else:
            out.append({"role": message["role"], "content": message["content"]})
    return out


def canonical(stored: list) -> tuple[list, list]:
    return canonical_view(as_inlet_sees_it(stored))


def anchor_of(stored: list) -> str:
    return acc.conversation_anchor(canonical(stored)[1])


def markers(messages) -> list:
    text = "\n".join(json.dumps(m, ensure_ascii=False) if isinstance(m, dict) else str(m) for m in messages)
    return list(dict.fromkeys(MARK.findall(text)))


def last_turn_start(canon: list) -> int:
    return max(i for i, m in enumerate(canon) if m["role"] == "user")


# -- the harness (the fake summarizer is acc_builders.FakeSummarizer) ------------


class Worker:
    """One Filter (one Open WebUI worker) with its own engine on the database."""

    def __init__(self, db, summarizer=None, store=None, **valves):
        self.store = store or db.store()
        self.summarizer = summarizer or FakeSummarizer()
        # valves set without validation: tests may go below a valve's minimum
        self.filter = make_filter(counter="exact", store=self.store, complete=self.summarizer, **{**VALVES, **valves})
        self.events: list = []

    async def _emit(self, event):
        self.events.append(event)

    def statuses(self) -> list:
        return [e["data"]["description"] for e in self.events if e.get("type") == "status"]

    async def outlet(self, stored, chat_id="chat-1", user=ALICE, metadata=None, wait=True):
        body = {"model": MODEL, "chat_id": chat_id, "id": stored[-1].get("id"), "messages": copy.deepcopy(stored)}
        if not chat_id:
            del body["chat_id"]
        meta = {"chat_id": chat_id, "message_id": body["id"], **(metadata or {})}
        result = await self.filter.outlet(
            body,
            __user__=dict(user),
            __metadata__=meta,
            __event_emitter__=self._emit,
            __model__={"id": MODEL},
        )
        assert result is body  # outlet never changes what Open WebUI stores
        if wait:
            await self.filter.wait_for_background()
        return result

    async def inlet(
        self, stored, new_text="MK-9901 And now?", chat_id="chat-1", user=ALICE, metadata=None, system=SYSTEM
    ):
        sent = ([system] if system else []) + as_inlet_sees_it(stored) + [{"role": "user", "content": new_text}]
        body = {"model": MODEL, "messages": copy.deepcopy(sent), "stream": True}
        meta = {"chat_id": chat_id, "message_id": "next", **(metadata or {})}
        result = await self.filter.inlet(
            body,
            __user__=dict(user),
            __metadata__=meta,
            __event_emitter__=self._emit,
            __model__={"id": MODEL},
            __chat_id__=chat_id or None,
        )
        # Open WebUI 0.11.2+ calls request next: its status line is the one shown
        result = await self.filter.request(
            result,
            __user__=dict(user),
            __metadata__=meta,
            __event_emitter__=self._emit,
            __model__={"id": MODEL},
            __chat_id__=chat_id or None,
        )
        await lines_written(self.filter)
        await self.filter.wait_for_background()  # nothing of this turn may outlive the test's database
        return sent, result["messages"]

    async def records(self, stored, chat_id="chat-1", user=ALICE) -> list:
        found = await self.store.find(user["id"], chat_id, anchor_of(stored), limit=100)
        return sorted(found, key=lambda r: r.id)


def summary_in(view: list):
    found = [m for m in view if acc.is_summary_message(m)]
    assert len(found) <= 1
    return found[0]["content"] if found else None


def assert_applied(sent: list, view: list, record) -> None:
    """The view is: system, the summary, the head, then everything from the
    summary's coverage on, verbatim; and the summary holds the markers of
    every message it replaced."""
    system, canon = sent[0], sent[1:]
    assert view[0] == system
    assert acc.is_summary_message(view[1])
    assert record.summary in view[1]["content"]
    assert view[2:] == canon[: record.head_count] + canon[record.covered_count :]
    missing = set(markers(canon[record.head_count : record.covered_count])) - set(MARK.findall(view[1]["content"]))
    assert not missing


@pytest.fixture
def backoff(monkeypatch):
    monkeypatch.setattr(acc, "BACKOFF_BASE", 0.4)
    monkeypatch.setattr(acc, "BACKOFF_CEILING", 5.0)
    return 0.4


# -- the main path ----------------------------------------------------------------


async def test_outlet_summary_is_applied_by_inlet_at_the_same_coverage(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    canon, _ = canonical(chat)
    await w.outlet(chat)

    assert len(w.summarizer.calls) == 1
    call = w.summarizer.calls[0]
    assert call["user"]["id"] == "alice" and call["model"] == MODEL
    assert call["max_tokens"] == 256
    text = call["messages"][-1]["content"]
    # Messages are labelled with their stored id and their author; tool calls
    # and results are named.
    for label in (
        "[#u1] user:",
        "[#a1] assistant:",
        "[#a2] assistant:",
        "-> calls search_docs(",
        "[#a2] tool result of search_docs:",
    ):
        assert label in text, label
    assert "[#u0]" not in text  # the protected head is never summarized
    assert "[#u7]" not in text and "MK-0701" not in text  # nor the verbatim tail

    [record] = await w.records(chat)
    assert (record.user_id, record.chat_id, record.head_count) == ("alice", "chat-1", 1)
    assert record.covered_count == last_turn_start(canon)
    assert record.fingerprint == acc.prefix_fingerprint(canonical_view(canon)[1], record.covered_count)

    statuses = w.statuses()
    assert any(s.startswith("Summarizing") and "in the background" in s for s in statuses)
    assert any(s.startswith("Summary updated:") for s in statuses)

    w.events.clear()
    sent, view = await w.inlet(chat)
    assert_applied(sent, view, record)
    # The tail is the last stored turn, expanded, plus the new message.
    assert view[3:] == as_inlet_sees_it(chat[-2:]) + [{"role": "user", "content": "MK-9901 And now?"}]
    assert any("summary covers" in s for s in w.statuses())


async def test_inlet_and_outlet_agree_on_coverage_with_a_client_system_prompt(db):
    """Stored messages carry no system prompt; the inlet view may: the
    canonical coverage leaves system messages out."""
    w = Worker(db)
    chat = stored_chat(range(6))
    await w.outlet(chat)
    [record] = await w.records(chat)
    sent, view = await w.inlet(chat, system={"role": "system", "content": "Be brief. " * 20})
    assert_applied(sent, view, record)
    sent, view = await w.inlet(chat, system=None)
    assert acc.is_summary_message(view[0])
    assert view[1:] == sent[:1] + sent[record.covered_count :]


async def test_incremental_round_sends_only_new_messages_and_the_previous_summary(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    [first] = await w.records(chat)

    longer = chat + stored_chat(range(8, 14))
    canon, _ = canonical(longer)
    await w.outlet(longer)
    assert len(w.summarizer.calls) == 2
    assert w.summarizer.previous_section(1) == first.summary
    new = w.summarizer.new_section(1)
    records = await w.records(longer)
    second = records[-1]
    assert (second.head_count, len(records)) == (1, 2)
    assert second.covered_count == last_turn_start(canon)
    # Exactly the messages between the two coverages, nothing older.
    assert MARK.findall(new) == markers(canon[first.covered_count : second.covered_count])
    for i in range(1, 7):  # turn 7 was round 1's verbatim tail: new now
        assert f"[#u{i}]" not in new
    sent, view = await w.inlet(longer)
    assert_applied(sent, view, second)
    assert set(markers(canon[1 : second.covered_count])) <= set(MARK.findall(summary_in(view)))


async def test_hysteresis_no_resummary_right_after_a_summary(db):
    # A long summary keeps the next views over the trigger, so only the
    # hysteresis stops a new summary of a few new tokens.
    w = Worker(db, summarizer=FakeSummarizer(padding=" " + FILLER * 25))
    chat = stored_chat(range(6)) + tiny_turn(6)
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 1
    [record] = await w.records(chat)
    assert w.filter.counter.text_tokens(record.summary, "cl100k_base") > VALVES["compression_threshold_tokens"]

    await w.outlet(chat)  # the same outlet again
    chat2 = chat + tiny_turn(7)
    await w.outlet(chat2)  # a little more: under 10% of the threshold is new
    await w.outlet(chat2 + tiny_turn(8))
    assert len(w.summarizer.calls) == 1
    assert len(await w.records(chat)) == 1

    chat3 = chat2 + tiny_turn(8) + stored_chat(range(9, 11))
    await w.outlet(chat3)  # more, but less than twice the summary it would rewrite
    assert len(w.summarizer.calls) == 1

    chat4 = chat3 + stored_chat(range(11, 15), size=8)
    await w.outlet(chat4)  # now enough is new
    assert len(w.summarizer.calls) == 2


async def test_below_the_trigger_nothing_is_scheduled(db):
    w = Worker(db)
    chat = stored_chat(range(2))
    await w.outlet(chat)
    assert w.summarizer.calls == [] and await w.records(chat) == []
    sent, view = await w.inlet(chat)
    assert view == sent


async def test_window_fitting_folds_in_several_saved_rounds(db):
    w = Worker(db, summary_model_max_context=1000, max_summary_tokens=64)
    chat = stored_chat(range(8))
    canon, _ = canonical(chat)
    await w.outlet(chat)
    calls = w.summarizer.calls
    assert 2 <= len(calls) <= acc._MAX_ROUNDS
    records = await w.records(chat)
    assert len(records) == len(calls)  # every round is saved on its own
    covered = [r.covered_count for r in records]
    assert covered == sorted(set(covered)) and covered[-1] == last_turn_start(canon)
    seen: list = []
    for i, call in enumerate(calls):
        total = messages_tokens(w.filter.counter, call["messages"], "cl100k_base")
        assert total + 64 <= 1000, (i, total)
        new = MARK.findall(w.summarizer.new_section(i))
        assert new and not set(new) & set(seen)  # each round folds new messages only
        seen += new
        if i:
            assert w.summarizer.previous_section(i) == records[i - 1].summary
    assert seen == markers(canon[1 : covered[-1]])
    sent, view = await w.inlet(chat)
    assert_applied(sent, view, records[-1])


# -- one summary at a time ----------------------------------------------------------


async def test_fifty_concurrent_outlets_make_one_summary(db):
    gate = asyncio.Event()
    w = Worker(db, summarizer=FakeSummarizer(gate=gate))
    chat = stored_chat(range(8))
    # outlet never waits for the summary: none can end before the gate opens, after the outlets returned
    await asyncio.wait_for(asyncio.gather(*(w.outlet(chat, wait=False) for _ in range(50))), timeout=60)
    assert len(w.summarizer.calls) <= 1
    gate.set()
    await w.filter.wait_for_background()
    assert len(w.summarizer.calls) == 1
    assert len(await w.records(chat)) == 1
    assert await lease_row(w.store, "alice:chat-1") is None


async def test_two_workers_sharing_the_database_make_one_summary(db):
    a = Worker(db, summarizer=FakeSummarizer(delay=0.5))
    b = Worker(db, summarizer=FakeSummarizer(delay=0.5))
    chat = stored_chat(range(8))
    await asyncio.gather(*(w.outlet(chat, wait=False) for _ in range(5) for w in (a, b)))
    await asyncio.gather(a.filter.wait_for_background(), b.filter.wait_for_background())
    assert len(a.summarizer.calls) + len(b.summarizer.calls) == 1
    assert len(await a.records(chat)) == 1
    # The worker that lost sees the summary too.
    loser = b if a.summarizer.calls else a
    sent, view = await loser.inlet(chat)
    assert_applied(sent, view, (await loser.records(chat))[0])


async def test_two_processes_sharing_the_database_make_one_summary(db):
    """Two OS processes (two Open WebUI workers or replicas), each with its own
    engine and Filter, get five outlets each for the same chat at once."""
    results = await run_processes(db.worker_args(), "summarize", ["w1", "w2"])
    assert sum(r["calls"] for r in results) == 1, results
    store = db.store()
    chat = stored_chat(range(8))
    assert len(await store.find("alice", "chat-1", anchor_of(chat))) == 1
    assert await lease_row(store, "alice:chat-1") is None


class GatedStore:
    """A store whose try_claim waits for a gate: its worker planned, then
    another worker did the whole summary before this one claimed."""

    def __init__(self, inner, gate: asyncio.Event):
        self.inner, self.gate = inner, gate

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def try_claim(self, *args, **kwargs):
        await self.gate.wait()
        return await self.inner.try_claim(*args, **kwargs)

    def hold(self, *args, **kwargs):  # the lease is taken through this wrapper's try_claim
        return acc.SummaryStore.hold(self, *args, **kwargs)


async def test_worker_that_finds_the_work_done_releases_its_lease(db):
    gate = asyncio.Event()
    late = Worker(db, store=GatedStore(db.store(), gate))
    fast = Worker(db)
    chat = stored_chat(range(8))
    await late.outlet(chat, wait=False)
    await asyncio.sleep(0.2)  # late has planned and waits to claim
    await fast.outlet(chat)
    assert len(fast.summarizer.calls) == 1
    gate.set()
    await late.filter.wait_for_background()
    assert late.summarizer.calls == []
    assert await lease_row(fast.store, "alice:chat-1") is None
    # So the next summary of this chat is not held up until the lease expires.
    longer = chat + stored_chat(range(8, 14))
    await fast.outlet(longer)
    assert len(fast.summarizer.calls) == 2


class LeaseTakenOver:
    """A store whose lease heartbeat (every 50 ms) finds the lease taken over,
    as after an outage longer than its TTL."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def renew(self, *args, **kwargs):
        return False

    def hold(self, scope, holder):
        return acc.SummaryStore.hold(self, scope, holder, renew_every=0.05)


async def test_a_lease_taken_over_during_the_fold_saves_nothing(db, caplog):
    w = Worker(db, store=LeaseTakenOver(db.store()), summarizer=FakeSummarizer(delay=0.3))
    chat = stored_chat(range(8))
    with caplog.at_level(logging.INFO, logger="async_context_compression"):
        await w.outlet(chat)
    assert len(w.summarizer.calls) == 1  # the answer came after the lease was lost
    assert await w.records(chat) == []  # never saved over the other worker's work
    assert any("lease taken over" in r.getMessage() for r in caplog.records)
    assert any(s.startswith("Summarizing") for s in w.statuses())
    assert not any("Summary updated" in s for s in w.statuses())


# -- failures ---------------------------------------------------------------------

FAILURES = {
    "raises": (RuntimeError("connection refused"), acc.Fault.MODEL_ERROR),
    "timeout": (("sleep", 5.0), acc.Fault.TIMEOUT),
    "empty": ("", acc.Fault.EMPTY),
    "reasoning-only": ("<think>The user wants MK-0101 folded… let me think.</think>\n", acc.Fault.REASONING_ONLY),
    "direct-connection": (acc.SummaryError(acc.Fault.DIRECT, "browser-side model"), acc.Fault.DIRECT),
}


@pytest.mark.parametrize("kind", list(FAILURES))
async def test_failure_backs_off_then_retries(db, backoff, monkeypatch, kind):
    # a back-off of 2 s, not the fixture's 0.4: the outlet "within the back-off" must come before it ends even on a
    # loaded machine (the test run's two lanes share two cores); the retry after it is waited for, not guessed
    monkeypatch.setattr(acc, "BACKOFF_BASE", 2.0)
    failure, fault = FAILURES[kind]
    w = Worker(db)
    w.filter.valves.summary_timeout_seconds = 0.3
    w.summarizer.script = [failure]
    chat = stored_chat(range(8))
    assert await w.outlet(chat)  # the chat goes on: outlet returns the body
    assert len(w.summarizer.calls) == 1
    assert await w.records(chat) == []  # nothing is saved
    failed = [s for s in w.statuses() if s.startswith("Summary failed: ")]
    assert failed and acc.STATUS_TEXTS["en"][fault.key] in failed[0] and "next try in" in failed[0]
    lease = await lease_row(w.store, "alice:chat-1")
    assert (lease["holder"], lease["failures"], lease["note"]) == ("back-off", 1, fault.text)

    sent, view = await w.inlet(chat)  # inlet works, without a summary
    assert view == sent

    await w.outlet(chat)  # within the back-off: no new attempt
    assert len(w.summarizer.calls) == 1
    await asyncio.sleep(max(0.0, lease["expires_at"] - time.time()) + 0.05)
    await w.outlet(chat)  # after it: the retry succeeds
    assert len(w.summarizer.calls) == 2
    [record] = await w.records(chat)
    assert await lease_row(w.store, "alice:chat-1") is None
    sent, view = await w.inlet(chat)
    assert_applied(sent, view, record)


async def test_back_off_grows_with_repeated_failures(db, backoff):
    w = Worker(db)
    w.summarizer.script = [RuntimeError("down"), RuntimeError("still down")]
    chat = stored_chat(range(8))
    await w.outlet(chat)
    first = await lease_row(w.store, "alice:chat-1")
    await asyncio.sleep(max(0.0, first["expires_at"] - time.time()) + 0.05)
    retried_at = time.time()  # the second failure comes after this, its back-off counts from there
    await w.outlet(chat)
    second = await lease_row(w.store, "alice:chat-1")
    assert second["failures"] == 2
    assert second["expires_at"] - retried_at >= 2 * backoff - 0.01  # doubled, however slow the machine
    assert any("next try in 1s" in s or "next try in 0s" in s for s in w.statuses())
    assert len(w.summarizer.calls) == 2 and await w.records(chat) == []


# -- branches -------------------------------------------------------------------------


async def test_edited_early_message_drops_the_summary_and_trims(db):
    w = Worker(db, max_context_tokens=1500, summary_model_max_context=32000)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    [record] = await w.records(chat)

    # The user edits turn 2 (a new branch from there) and the chat goes on.
    edited = chat[:4] + stored_turn(2, tool=True, tag="edited ") + stored_chat(range(3, 9))
    sent, view = await w.inlet(edited)
    assert summary_in(view) is None
    assert "Running summary" not in json.dumps(view)
    assert view[0] == sent[0] and view[1] == sent[1]  # system and the protected head
    assert len(view) < len(sent) and view[-1] == sent[-1]  # trimmed, oldest turns first
    assert any("left out to fit" in s for s in w.statuses())

    # Its own summary starts from the head, not from the other branch's.
    await w.outlet(edited)
    assert len(w.summarizer.calls) == 2
    assert w.summarizer.previous_section(1) == "(none yet)"
    assert "MK-0201 edited" in w.summarizer.new_section(1)
    sent, view = await w.inlet(edited)
    assert "MK-0201" in summary_in(view)
    # Switching back to the original branch finds the original summary again.
    sent, view = await w.inlet(chat)
    assert_applied(sent, view, record)


async def test_regenerated_reply_falls_back_to_the_older_valid_summary(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    longer = chat + stored_chat(range(8, 14))
    await w.outlet(longer)
    first, second = await w.records(longer)
    canon, _ = canonical(longer)
    last_covered = canon[second.covered_count - 1]
    assert last_covered["role"] == "assistant" and "MK-1204" in last_covered["content"]

    # Regenerate turn 12's reply: the branch now ends with a new version of it.
    regenerated = longer[:24] + [stored_turn(12, tool=True, tag="regen_")[1]]
    sent, view = await w.inlet(regenerated)
    assert second.summary not in view[1]["content"]
    assert_applied(sent, view, first)


async def test_regenerated_reply_without_an_older_summary_gets_none(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    [record] = await w.records(chat)
    canon, _ = canonical(chat)
    assert "MK-0604" in canon[record.covered_count - 1]["content"]
    regenerated = chat[:12] + [stored_turn(6, tool=True, tag="regen_")[1]]
    sent, view = await w.inlet(regenerated)
    assert view == sent


# -- API calls, users, built-in compaction, languages ------------------------------------


async def test_api_call_without_chat_id_is_scoped_to_the_user_and_conversation(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    # An API call's outlet sees the messages as sent (no ids) plus the reply.
    api_body = (
        [SYSTEM] + as_inlet_sees_it(chat[:-1]) + [{"role": "assistant", "content": chat[-1]["content"], "id": None}]
    )
    await w.outlet(api_body, chat_id="")
    assert len(w.summarizer.calls) == 1
    assert "[#" not in w.summarizer.new_section(0)  # no ids to show
    [record] = await w.records(chat, chat_id="")
    assert (record.user_id, record.chat_id) == ("alice", "")

    # The next API call of the same conversation gets it ...
    sent, view = await w.inlet(chat, chat_id="")
    assert_applied(sent, view, record)
    # ... another user sending the very same conversation gets nothing ...
    sent, view = await w.inlet(chat, chat_id="", user=BOB)
    assert view == sent
    # ... and so does another API conversation of the same user.
    other = stored_chat(range(20, 28))
    sent, view = await w.inlet(other, chat_id="")
    assert view == sent
    # Bob's own summary of the same conversation stays his.
    await w.outlet(api_body, chat_id="", user=BOB)
    assert len(w.summarizer.calls) == 2
    assert w.summarizer.calls[1]["user"]["id"] == "bob"
    assert [r.user_id for r in await w.records(chat, chat_id="")] == ["alice"]
    assert [r.user_id for r in await w.records(chat, chat_id="", user=BOB)] == ["bob"]
    assert await lease_row(w.store, "alice:api:" + anchor_of(chat)) is None


async def test_another_users_chat_with_the_same_id_gets_nothing(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    assert len(await w.records(chat)) == 1
    sent, view = await w.inlet(chat, user=BOB)
    assert view == sent


async def test_cloned_chat_uses_the_summary_of_its_original(db):
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    [record] = await w.records(chat)
    sent, view = await w.inlet(chat, chat_id="clone-of-chat-1")
    assert_applied(sent, view, record)


def core_compacted(monkeypatch, stored: list, checkpoint_id: str, core_text: str) -> None:
    """Open WebUI's own compaction on, and its summary saved as ``contextSummary``
    on ``checkpoint_id`` (what /compact does to the latest reply)."""

    async def stored_branch(chat_id, ids):
        by_id = {m["id"]: dict(m, contextSummary=core_text) if m["id"] == checkpoint_id else m for m in stored}
        return [by_id[i] for i in dict.fromkeys(ids) if i in by_id]

    monkeypatch.setattr(acc, "_stored_branch", stored_branch)
    monkeypatch.setattr(acc, "_BUILTIN_ON", [True, float("inf")])  # switched on, never read again


async def test_core_summary_after_compact_is_the_base_of_the_next_summary(db, monkeypatch):
    w = Worker(db)
    chat = stored_chat(range(8))
    cut = len(chat) - 1  # /compact: the summary is saved on the latest reply, which stays
    core_text = "Core summary: " + " ".join(markers(as_inlet_sees_it(chat[:cut])))
    longer = chat + stored_chat(range(8, 14))
    core_compacted(monkeypatch, longer, chat[cut]["id"], core_text)
    core_system = {"role": "system", "content": SYSTEM["content"] + "\n[CONVERSATION SUMMARY]\n" + core_text}

    # Right after /compact: the core's summary is what stands for the old turns.
    sent, view = await w.inlet(chat[cut:], system=core_system)
    assert view == sent

    # Background summaries go on, from the core's summary, over what inlet sees.
    await w.outlet(longer)
    assert len(w.summarizer.calls) == 1
    assert core_text in w.summarizer.previous_section(0)
    folded = set(MARK.findall(w.summarizer.new_section(0)))
    assert folded and not folded & set(markers(as_inlet_sees_it(chat[:cut])))  # nothing summarized twice
    [record] = await w.records(longer[cut:])
    assert record.head_count == 0

    # The next request: the filter's summary (which holds the core's) once, the core's text gone.
    sent, view = await w.inlet(longer[cut:], system=core_system)
    assert view[0] == SYSTEM
    assert acc.BUILTIN_SUMMARY_MARK not in json.dumps(view, ensure_ascii=False)
    assert record.summary in view[1]["content"]
    assert view[2:] == sent[1 + record.covered_count :]
    every = set(markers(as_inlet_sees_it(longer))) | {"MK-9901"}
    assert every <= set(MARK.findall(json.dumps(view))), every - set(MARK.findall(json.dumps(view)))
    said = [s for s in w.statuses() if "automatic compaction is on too" in s]
    assert len(said) == 1, w.statuses()


async def test_core_compaction_between_tool_rounds_is_not_followed(db, monkeypatch):
    w = Worker(db)
    chat = stored_chat(range(8))
    core_compacted(monkeypatch, chat, "none", "")

    async def stored_branch(chat_id, ids):
        marked = dict(chat[-1], output=[{"type": "open_webui:context_compaction", "call_id": "c", "summary": "s"}])
        return chat[:-1] + [marked]

    monkeypatch.setattr(acc, "_stored_branch", stored_branch)
    await w.outlet(chat)
    assert w.summarizer.calls == []


async def test_summarize_command_makes_a_summary_now_and_shows_it(db):
    w = Worker(db, compression_threshold_tokens=100_000)
    chat = stored_chat(range(4))
    await w.outlet(chat)
    assert w.summarizer.calls == []  # far below the trigger: nothing

    sent, view = await w.inlet(chat, new_text="/summarize")
    assert view[-1] == {"role": "user", "content": acc.SUMMARIZE_COMMAND_PROMPT}
    assert view[:-1] == sent[:-1]
    asked = chat + [
        {"id": "uc", "role": "user", "content": "/summarize"},
        {"id": "ac", "role": "assistant", "content": "Summarizing now."},
    ]
    w.events.clear()
    await w.outlet(asked)
    assert len(w.summarizer.calls) == 1
    [record] = await w.records(asked)
    sources = [e["data"] for e in w.events if e["type"] == "source"]
    assert len(sources) == 1
    assert sources[0]["document"] == [record.summary]
    n = record.covered_count - record.head_count
    assert sources[0]["source"]["name"] == f"Conversation summary ({n} messages)"
    assert any(f"Summary updated: covers {n} messages" in s for s in w.statuses())

    # A rewritten summary shows again, as a new entry.
    w.events.clear()
    longer = (
        asked
        + stored_chat(range(4, 7))
        + [
            {"id": "uc2", "role": "user", "content": "/summarize"},
            {"id": "ac2", "role": "assistant", "content": "Summarizing now."},
        ]
    )
    await w.outlet(longer)
    again = [e["data"] for e in w.events if e["type"] == "source"]
    assert len(again) == 1 and again[0]["metadata"][0]["source"] != sources[0]["metadata"][0]["source"]


async def test_summarize_command_on_a_short_chat_says_so(db):
    w = Worker(db)
    await w.outlet(
        [{"id": "uc", "role": "user", "content": "/summarize"}, {"id": "ac", "role": "assistant", "content": "ok"}]
    )
    assert w.summarizer.calls == []
    assert w.statuses() == ["Nothing to summarize yet: the conversation is still short"]


async def test_summary_is_not_shown_when_status_is_off(db):
    w = Worker(db, show_status=False)
    chat = stored_chat(range(8))
    await w.outlet(chat)
    assert len(w.summarizer.calls) == 1
    assert w.events == []


async def test_status_texts_in_chinese(db, backoff):
    zh = {"variables": {"{{USER_LANGUAGE}}": "zh-CN"}}
    w = Worker(db)
    chat = stored_chat(range(8))
    await w.outlet(chat, metadata=zh)
    statuses = w.statuses()
    assert any("正在后台摘要" in s for s in statuses), statuses
    assert any("摘要已更新" in s for s in statuses), statuses
    w.events.clear()
    await w.inlet(chat, metadata=zh)
    assert any("摘要涵盖" in s for s in w.statuses()), w.statuses()

    w.events.clear()
    w.summarizer.script = [RuntimeError("down")]
    await w.outlet(chat + stored_chat(range(8, 14)), metadata=zh)
    failed = w.statuses()[-1]
    # after the figure of the last request sent, so the figure never disappears
    assert failed.startswith("已发送 ") and "摘要失败：摘要模型返回错误" in failed, failed


# -- the inlet view used above is the one Open WebUI builds ---------------------------------


@pytest.mark.skipif(importlib.util.find_spec("open_webui") is None, reason="Open WebUI is not installed here")
def test_inlet_view_matches_open_webuis_expansion(tmp_path):
    chat = stored_chat(range(4))
    script = (
        "import json, sys\n"
        "from open_webui.utils.misc import convert_output_to_messages\n"
        "chat = json.load(sys.stdin)\n"
        "out = []\n"
        "for m in chat:\n"
        "    if m['role'] == 'assistant' and m.get('output'):\n"
        "        out += convert_output_to_messages(m['output'], raw=True)\n"
        "    else:\n"
        "        out.append({'role': m['role'], 'content': m['content']})\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, WEBUI_SECRET_KEY="test", DATA_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(chat),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == as_inlet_sees_it(chat)
