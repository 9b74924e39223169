"""Long agent runs (issue 30): inside one reply's native tool loop the cap holds in every call, older tool results give
way first and always the same way, and the reply's older rounds are folded into a summary in the background that a
later round uses. Token costs in the layer-1 tests come from ``acc_builders.tok`` (a quarter token per character)."""

import asyncio
import re

import pytest
from acc_builders import AS, A, FakeSummarizer, RecordStore, S, T, U, frozen, make_filter, tok, total

import async_context_compression as acc
from devkit.provider_rules import check_openai

MARK = re.compile(r"\[… (\d+) characters trimmed")


def page(k: int, chars: int = 8000) -> str:
    """A page whose facts sit in its middle: a start-and-end cut loses them."""
    half = chars // 2
    return f"page {k} start " + "x" * (half - 20) + f" MK-{k:04d} " + "y" * (half - 20) + f" page {k} end"


def loop(rounds: int, chars: int = 8000) -> list:
    messages = [S(), U("earlier"), AS("earlier answer"), U("read every page")]
    for k in range(1, rounds + 1):
        messages += [A(f"c{k}"), T(f"c{k}", page(k, chars))]
    return messages


# -- layer 1: the order of what gives way ---------------------------------------------


def test_give_way_order_puts_older_results_first_the_latest_round_last_and_never_the_request():
    messages = loop(4)
    passes = dict(acc.give_way_order(messages))
    assert passes["old results"] == [5, 7, 9]  # oldest first
    assert passes["latest results"] == [11]
    listed = {i for indices in passes.values() for i in indices}
    assert 3 not in listed  # the user's request
    assert 10 not in listed  # the current turn's last assistant (the latest call)
    assert 0 not in listed  # the system prompt


def test_result_sizes_depend_on_the_cap_alone_and_the_latest_round_is_found_in_the_current_turn_only():
    assert acc.tool_result_levels(30_000) == (937, acc.OLD_RESULT_FLOOR_TOKENS)
    assert acc.tool_result_levels(1_000) == acc.tool_result_levels(0) == (96, 96)  # never below the floor
    messages = loop(3)
    assert acc.latest_round_start(messages) == 8 and acc.current_turn_rounds(messages) == (4, 8)
    answered = [*messages, AS("done"), U("thanks")]  # a new turn: the loop is history now
    assert acc.latest_round_start(answered) == len(answered)
    assert acc.current_turn_rounds(answered) == (len(answered), len(answered))
    assert acc.current_turn_rounds(loop(1)) == (4, 4)  # one round: nothing older to fold


def test_older_results_give_way_oldest_first_and_the_newest_stays_whole():
    messages = loop(6)
    cap = total(messages) - 3000
    out, report = acc.fit_to_budget(messages, tok, cap)
    assert not report.over_budget and report.tokens_after <= cap
    cut = [i for i, m in enumerate(out) if m["role"] == "tool" and MARK.search(m["content"])]
    assert cut and cut == sorted(cut) and cut[0] == 5  # a prefix of the oldest results, nothing newer skipped
    assert out[-1] == messages[-1] and out[-3] == messages[-3]  # the latest and second-latest pages whole
    assert out[1:4] == messages[1:4]  # the earlier conversation is not dropped while results can give way


def test_a_long_loop_cuts_its_older_results_to_the_floor_before_the_earlier_conversation_goes():
    messages = loop(24)
    cap = 5200  # 23 older results at their first size (162 tokens) alone would leave no room for the earlier turns
    out, report = acc.fit_to_budget(messages, tok, cap)
    assert not report.over_budget and report.dropped_messages == 0
    assert out[1:4] == messages[1:4] and out[-2:] == messages[-2:]  # earlier turns, the latest round: whole


def test_a_cut_keeps_start_and_end_and_its_marker_counts_every_character_removed():
    messages = loop(5)
    out, _ = acc.fit_to_budget(messages, tok, total(messages) - 2500)
    original, shortened = messages[5]["content"], out[5]["content"]
    head, marker, tail = shortened.split("\n")
    assert original.startswith(head) and original.endswith(tail)
    assert int(MARK.search(marker).group(1)) == len(original) - len(head) - len(tail)
    assert len(head) >= len(tail)  # two thirds of the room at the start, one third at the end


def test_the_same_result_is_cut_the_same_in_every_later_round():
    """The prompt cache: what an earlier round sent of an older result is sent byte for byte in the next rounds."""
    cap = 9000
    sent = []
    for rounds in range(3, 9):
        out, report = acc.fit_to_budget(loop(rounds), tok, cap)
        assert report.tokens_after <= cap
        sent.append(out)
    for earlier, later in zip(sent, sent[1:]):
        cut_before = {
            m["tool_call_id"]: m["content"] for m in earlier if m["role"] == "tool" and MARK.search(m["content"])
        }
        cut_after = {m["tool_call_id"]: m["content"] for m in later if m["role"] == "tool"}
        assert all(cut_after[cid] == text for cid, text in cut_before.items() if MARK.search(cut_after[cid]))


def test_a_result_cut_twice_is_cut_from_its_original_so_the_marker_stays_true():
    messages = loop(8)
    out, report = acc.fit_to_budget(messages, tok, 2600)  # first sizes are not enough: the floor is reached
    assert not report.over_budget
    originals = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    cut = [m for m in out if m["role"] == "tool" and MARK.search(m["content"])]
    assert len(cut) == report.shortened_messages  # each counted once, though most were cut at both sizes
    for kept in cut:
        head, marker, tail = kept["content"].split("\n")
        original = originals[kept["tool_call_id"]]
        assert int(MARK.search(marker).group(1)) == len(original) - len(head) - len(tail)
        assert original.startswith(head) and original.endswith(tail)


def test_with_exact_counts_a_twelve_round_loop_ends_under_the_cap_and_every_marker_is_true():
    """The accounting (issue 30: 8 of 13 requests 350-890 tokens over, markers of 158 characters): cut copies were
    estimated with a margin beside exact counts, so cuts looked larger than what they replaced, were refused, and the
    text pass cut results again from their cut form. Counted alike, the list fits, recounted exactly."""
    from devkit.probes import wait_ready

    counter = acc.TokenCounter()
    if not wait_ready(counter, "cl100k_base", timeout=30):
        pytest.skip("cl100k_base not available offline")
    words = " ".join(f"word{i % 97} item{i % 13}" for i in range(2600))  # ~6k tokens a page
    messages = [S(), U("earlier"), AS("earlier answer"), U("read every page")]
    for k in range(1, 13):
        messages += [A(f"c{k}"), T(f"c{k}", f"page {k} " + words + f" end {k}")]
    originals = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    out, report = asyncio.run(acc.fit_request(counter, messages, 30_000, 0, acc.TOKENS_PER_REQUEST, "cl100k_base"))
    exact = acc.TOKENS_PER_REQUEST + sum(counter.measure(out, "cl100k_base", True))
    assert exact == report.tokens_after <= 30_000 and not report.over_budget
    for kept in (m for m in out if m["role"] == "tool" and MARK.search(m["content"])):
        head, marker, tail = kept["content"].split("\n")
        removed = len(originals[kept["tool_call_id"]]) - len(head) - len(tail)
        assert int(MARK.search(marker).group(1)) == removed > 1000


def test_a_message_that_lost_its_image_and_then_its_text_does_not_get_the_image_back():
    from acc_builders import IMG, TXT

    messages = [S(), U([TXT("u" * 4000), IMG()]), AS("a"), U("q")]
    out, report = acc.fit_to_budget(messages, tok, 150, acc.protected_head_end(messages, 2))
    parts = out[1]["content"]
    assert "image_url" not in str(parts), parts
    assert report.dropped_images == 1 and report.shortened_messages == 1 and not report.over_budget


def test_shorten_to_tokens_is_deterministic_and_leaves_a_small_message_whole():
    message = T("c1", page(1))
    assert acc.shorten_to_tokens(message, 10_000, tok) is message
    first, again = acc.shorten_to_tokens(message, 300, tok), acc.shorten_to_tokens(frozen(message), 300, tok)
    assert first == again and tok(first) <= 300


# -- layer 1: a loop summary in place of the older rounds ------------------------------


def test_apply_loop_summary_replaces_whole_rounds_and_keeps_an_order_providers_accept():
    messages = loop(4)
    out = acc.apply_loop_summary(messages, 4, "MK-0001 MK-0002")
    assert [m["role"] for m in out] == [
        "system",
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert acc.is_summary_message(out[1]) and "MK-0002" in out[1]["content"]
    assert out[-4:] == messages[-4:]
    assert check_openai(out) == []
    assert acc.apply_loop_summary(messages, 3, "x") == messages  # not whole rounds: unchanged
    assert acc.apply_loop_summary(messages, 8, "x") == messages  # the latest round is never folded


# -- layer 8 and the request hook: folded in the background, used by a later round ----------


def _hook(f, messages):
    meta = {"chat_id": "c-loop", "message_id": "reply-1"}
    return f.request({"model": "m", "messages": messages}, __user__={"id": "u"}, __metadata__=meta)


def test_a_later_round_uses_the_fold_of_older_rounds_and_no_round_waits_for_it():
    async def scenario():
        gate = asyncio.Event()
        summarizer = FakeSummarizer(gate=gate)
        f = make_filter(
            cap=9000,
            counter="estimate",
            store=RecordStore(),
            complete=summarizer,
            compression_threshold_tokens=4000,
            show_status=False,
        )
        sent = []
        for rounds in range(1, 8):
            started = asyncio.get_running_loop().time()
            body = await _hook(f, loop(rounds))
            assert asyncio.get_running_loop().time() - started < 1.0  # the gated summarizer holds no round
            sent.append(body["messages"])
            if rounds == 4:
                gate.set()
            await asyncio.sleep(0.05)  # the model works on this round meanwhile
        await f.wait_for_background(5)
        return f, summarizer, sent

    f, summarizer, sent = asyncio.run(scenario())
    assert summarizer.calls, "no fold was started"
    final = str(sent[-1])
    assert all(f"MK-{k:04d}" in final for k in range(1, 8))  # every page's fact: folded or verbatim
    assert acc.is_summary_message(sent[-1][1]) and acc.LOOP_SUMMARY_INTRO in sent[-1][1]["content"]
    assert check_openai(sent[-1]) == []


def test_with_the_summarizer_down_shortening_alone_keeps_every_round_under_the_cap():
    async def scenario():
        summarizer = FakeSummarizer()
        summarizer.script = [RuntimeError("down")] * 20
        f = make_filter(
            cap=9000, counter="estimate", store=RecordStore(), complete=summarizer, compression_threshold_tokens=4000
        )
        counts = []
        for rounds in range(1, 10):
            body = await _hook(f, loop(rounds))
            counts.append(acc.count_request(f.counter, body["messages"], "cl100k_base", acc.TOKENS_PER_REQUEST))
        await f.wait_for_background(5)
        return counts, summarizer

    counts, summarizer = asyncio.run(scenario())
    assert len(summarizer.calls) == 1  # failed once: not retried in this reply
    assert max(counts) <= 9000


# -- after the reply: the stored tool results are folded like any other message --------------


class SavingStore(acc.NullStore):
    """In memory, with the summary store's API (summaries and leases)."""

    def __init__(self):
        self.records, self.leases = [], {}

    async def find(self, user_id, chat_id, anchor, limit=16):
        return [r for r in self.records if r.chat_id == chat_id][-limit:]

    async def save(self, record):
        self.records.append(record)

    async def try_claim(self, scope, holder, ttl=None):
        if self.leases.get(scope, holder) != holder:
            return False
        self.leases[scope] = holder
        return True

    async def renew(self, scope, holder, ttl=None):
        return self.leases.get(scope) == holder

    async def release(self, scope, holder):
        self.leases.pop(scope, None)

    async def back_off(self, scope, holder, reason, base, ceiling):
        return base

    def hold(self, scope, holder, ttl=acc.LEASE_TTL, renew_every=acc.LEASE_RENEW):
        return acc.LeaseHold(self, scope, holder, ttl, renew_every)


def stored_agent_reply(rounds: int) -> list:
    """A chat as outlet receives it: an earlier exchange, the request, and the reply whose tool loop is in ``output``."""
    output = []
    for k in range(1, rounds + 1):
        output += [
            {"type": "function_call", "call_id": f"c{k}", "name": "fetch", "arguments": "{}", "status": "completed"},
            {"type": "function_call_output", "call_id": f"c{k}", "output": [{"type": "input_text", "text": page(k)}]},
        ]
    output.append({"type": "message", "content": [{"type": "output_text", "text": "All pages read."}]})
    return [
        {"id": "m1", "role": "user", "content": "earlier MK-0900"},
        {"id": "m2", "role": "assistant", "content": "earlier answer"},
        {"id": "m3", "role": "user", "content": "read every page"},
        {"id": "m4", "role": "assistant", "content": "All pages read.", "output": output},
    ]


def test_after_the_reply_its_stored_tool_results_are_folded_and_the_next_turn_sends_them_as_the_summary():
    async def scenario():
        summarizer, store = FakeSummarizer(), SavingStore()
        f = make_filter(
            cap=9000, counter="estimate", store=store, complete=summarizer, compression_threshold_tokens=4000
        )
        body = {"model": "m", "chat_id": "c-after", "id": "m4", "messages": stored_agent_reply(6)}
        await f.outlet(body, __user__={"id": "u"}, __metadata__={"chat_id": "c-after", "message_id": "m4"})
        await f.wait_for_background(60)  # the first outlet of a process pays the slow failed Open WebUI imports
        expanded, _ = acc.expand_stored_messages(stored_agent_reply(6))
        nxt = [{k: v for k, v in m.items() if k != "id"} for m in expanded] + [U("and now?")]
        sent = await f.inlet({"model": "m", "messages": nxt}, __user__={"id": "u"}, __metadata__={"chat_id": "c-after"})
        return summarizer, store, sent["messages"]

    summarizer, store, sent = asyncio.run(scenario())
    assert store.records, "no summary was made after the reply"
    seen = " ".join(call["messages"][-1]["content"] for call in summarizer.calls)
    assert all(f"MK-{k:04d}" in seen for k in range(1, 7))  # the summarizer read every stored result
    assert all(f"MK-{k:04d}" in str(sent) for k in range(1, 7))  # and the next turn carries them, as the summary
    assert sent[-1] == U("and now?") and check_openai(sent) == []


class CountingStore(RecordStore):
    """A RecordStore that counts its reads."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    async def find(self, user_id, chat_id, anchor, limit=16):
        self.reads += 1
        return await super().find(user_id, chat_id, anchor, limit)


def test_a_tool_loop_reads_the_stored_summaries_once_per_reply_and_inlet_always_reads():
    async def scenario():
        store = CountingStore()
        f = make_filter(cap=9000, counter="estimate", store=store, show_status=False)
        meta = {"chat_id": "c-loop", "message_id": "reply-1"}
        await f.inlet({"model": "m", "messages": loop(1)}, __user__={"id": "u"}, __metadata__=meta)
        after_inlet = store.reads
        for rounds in range(2, 8):
            await _hook(f, loop(rounds))
        in_loop = store.reads - after_inlet
        await f.inlet({"model": "m", "messages": loop(1)}, __user__={"id": "u"}, __metadata__=meta)
        again = store.reads - after_inlet - in_loop
        await f.request(
            {"model": "m", "messages": loop(8)}, __user__={"id": "u"}, __metadata__={**meta, "message_id": "reply-2"}
        )
        return after_inlet, in_loop, again, store.reads

    after_inlet, in_loop, again, total_reads = asyncio.run(scenario())
    assert (after_inlet, in_loop, again) == (1, 0, 1)
    assert total_reads == 3  # another reply reads for itself
