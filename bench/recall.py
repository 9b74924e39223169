"""Recall benchmark (issue 36): do details a summary dropped reach the model again?

    python bench/recall.py            # 12 chats of 140 turns, through Filter.inlet / request / outlet
    python bench/recall.py --quick    # 4 chats of 100 turns
    python bench/recall.py --pure     # the layer-2b functions alone (phase 1's driver)

Generated chats mix the corpus's languages (``bench.corpus``: English, Chinese, Japanese, Korean, code, JSON) with
facts: an attribute of an entity with a distinctive value ("The access code for the Lisbon warehouse is QK-4471.",
"里斯本仓库的门禁密码是 QK-4471。"). Entities share attributes and attributes share entities, so only both together
single a fact out. Some user turns ask about a fact stated 20 to 60 turns earlier, in other words than the fact's.

A summary is written the way the filter plans one: when the history is over the trigger (3/4 of the cap), older
turns are folded until the rest is down to the low-water mark (keep_first 1, keep_last 6). The summarizer
(``LossySummarizer``) keeps only half of the facts it reads, as real ones keep part of what they are shown: which
half is fixed by each value's hash, so every run and every driver drops the same ones. Questions are scored only
about dropped facts.

Each request is what the model would receive: the system prompt, the summary, the kept turns and the new user
message, with recall when the driver recalls. By default the chats go through the Filter the way Open WebUI drives
it (``FilterDriver``: inlet, then the request hook, then outlet after each reply, ``LossySummarizer`` answering the
summary calls; a temporary chat, so its summaries live in memory; default valves but the cap), with the
``recall_share`` valve at its default and at 0. Printed, with recall and without:

* the share of questions whose fact value reaches the model (the whole fact sentence, verbatim, in brackets);
* recall tokens per request (over all requests with a summary, and over those that recalled), and the share of
  requests that recalled anything although they asked about nothing folded;
* requests over the cap;
* the prefix share as in the cache benchmark (bench/fidelity.py): prompt tokens in whole messages equal to the
  previous request's, from the start, over the request's tokens, from the first summary on;
* inlet's time (inlet and the request hook, ms p50 / p95), and the part of it recall takes (the index checked,
  searched, the block placed); the time of each fold's index extension (in a worker thread, off the event loop), and
  of indexing a whole chat at once (a worker that restarted);
* the index's memory (tracemalloc) per chat and per passage, and what RECALL_TOTAL_PASSAGES would hold.

``--pure`` drives the pure functions instead (``PureDriver``, phase 1's), with the same chats, summarizer and
scoring: both drivers offer ``request``, ``replied`` and ``covered``.

Exits 1 when with recall fewer than 9 in 10 questions bring their fact, any question does without recall, or a
request goes over the cap.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import time
import tracemalloc

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import asyncio  # noqa: E402

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

import async_context_compression as acc  # noqa: E402
from bench.corpus import make_text  # noqa: E402
from devkit.probes import message_tokens, messages_tokens, wait_ready  # noqa: E402

ENCODING = "cl100k_base"
SYSTEM = {"role": "system", "content": "You are a helpful assistant for a small operations team."}
CAP = 16_000
TRIGGER = int(CAP * 0.75)
LOW_WATER = int(TRIGGER * 0.5)
KEEP_FIRST, KEEP_LAST = 1, 6
MODEL = "bench-model"  # cl100k_base, as ENCODING
USER = {"id": "bench-user", "name": "Bench", "role": "user"}
ASK_AFTER = (20, 60)  # a question comes this many turns after its fact
GOAL = 0.9

ENTITIES = (
    ("Lisbon", "里斯本"),
    ("Berlin", "柏林"),
    ("Oslo", "奥斯陆"),
    ("Madrid", "马德里"),
    ("Vienna", "维也纳"),
    ("Prague", "布拉格"),
    ("Dublin", "都柏林"),
    ("Warsaw", "华沙"),
    ("Athens", "雅典"),
    ("Helsinki", "赫尔辛基"),
    ("Seoul", "首尔"),
    ("Osaka", "大阪"),
    ("Nairobi", "内罗毕"),
    ("Lima", "利马"),
    ("Toronto", "多伦多"),
    ("Denver", "丹佛"),
)


def _code(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHKMQRTXZ')}{rng.choice('ABEKLNPSUW')}-{rng.randint(1000, 9999)}"


def _budget(rng: random.Random) -> str:
    return f"{rng.randint(11, 98)},{rng.randint(100, 999)} EUR"


def _contract(rng: random.Random) -> str:
    return f"CT-{rng.randint(2019, 2027)}-{rng.randint(100, 999)}"


def _release(rng: random.Random) -> str:
    return f"v{rng.randint(1, 9)}.{rng.randint(10, 40)}.{rng.randint(0, 9)}"


def _room(rng: random.Random) -> str:
    return f"{rng.randint(101, 1299)}-{rng.choice('ABCDE')}"


def _extension(rng: random.Random) -> str:
    return f"x{rng.randint(2000, 8999)}"


# attribute: (value maker, English fact, English question, Chinese fact, Chinese question); {e}: the entity, {v}: value
ATTRIBUTES = {
    "access code": (
        _code,
        "The access code for the {e} warehouse is {v}.",
        "Quick one: what was the access code of the {e} warehouse again?",
        "{e}仓库的门禁密码是 {v}。",
        "{e}仓库的门禁密码是多少来着？",
    ),
    "flight budget": (
        _budget,
        "We set the flight budget for the {e} trip at {v}.",
        "Remind me, which flight budget did we agree on for the {e} trip?",
        "{e}之行的机票预算定为 {v}。",
        "我们给{e}之行定的机票预算是多少？",
    ),
    "contract": (
        _contract,
        "The contract number with our {e} supplier is {v}.",
        "I need the contract number we have with the supplier in {e}.",
        "{e}供应商的合同编号是 {v}。",
        "和{e}供应商的合同编号是什么？",
    ),
    "release": (
        _release,
        "The {e} service stays pinned to release {v} until the audit ends.",
        "Which release is the {e} service pinned to right now?",
        "{e}服务在审计结束前固定在版本 {v}。",
        "{e}服务现在固定在哪个版本？",
    ),
    "room": (
        _room,
        "Our hotel room in {e} is number {v}, on the quiet side.",
        "What was our hotel room number in {e}?",
        "我们在{e}的酒店房间号是 {v}，在安静的一侧。",
        "我们在{e}的酒店房间号是多少？",
    ),
    "extension": (
        _extension,
        "The on-call engineer for {e} answers at phone extension {v}.",
        "Which phone extension reaches the on-call engineer for {e}?",
        "{e}值班工程师的分机号是 {v}。",
        "{e}值班工程师的分机号是多少？",
    ),
}
USER_MIX = (("english", 50), ("chinese", 15), ("japanese", 5), ("korean", 5), ("code", 15), ("json", 5), ("mixed", 5))
ASSISTANT_MIX = (("english", 55), ("chinese", 15), ("code", 20), ("mixed", 10))


class Fact:
    def __init__(self, turn: int, attribute: str, entity: tuple, value: str, chinese: bool):
        _, fact_en, question_en, fact_zh, question_zh = ATTRIBUTES[attribute]
        name = entity[1] if chinese else entity[0]
        self.turn, self.value = turn, value
        self.sentence = (fact_zh if chinese else fact_en).format(e=name, v=value)
        self.question = (question_zh if chinese else question_en).format(e=name)


class LossySummarizer:
    """Keeps half of the facts it reads (which half: by each value's hash), as a real summary keeps part of what it is
    shown; the previous summary's facts stay. The rest of its answer is a line of topics."""

    def __init__(self, facts: list):
        self.facts = facts

    @staticmethod
    def keeps(fact: Fact) -> bool:
        return hashlib.blake2b(fact.value.encode(), digest_size=2).digest()[0] % 2 == 0

    def summarize(self, previous: str, folded_text: str) -> str:
        kept = [f.sentence for f in self.facts if f.sentence in folded_text and self.keeps(f)]
        lines = [line for line in previous.split("\n") if line.startswith("- ")]
        lines += [f"- {s}" for s in kept if f"- {s}" not in lines]
        return "\n".join(["The team discussed operations, travel, suppliers and services.", *lines])


def _pick(rng: random.Random, mix) -> str:
    return rng.choices([c for c, _ in mix], weights=[w for _, w in mix])[0]


def _with(text: str, sentences: list, rng: random.Random) -> str:
    """``text`` with each sentence put in at a paragraph or sentence break."""
    for sentence in sentences:
        breaks = [i + 1 for i, c in enumerate(text) if c in ".。\n"] or [len(text)]
        at = rng.choice(breaks)
        text = f"{text[:at]} {sentence} {text[at:]}"
    return text.strip()


def make_chat(turns: int, seed: int) -> tuple[list, list]:
    """(turns as (user text, reply text, fact asked about or None), facts). Facts in the first ``turns - 20``
    turns; each fact asked about once, 20 to 60 turns later, when that turn is free."""
    rng = random.Random(f"recall:{seed}")
    pairs = [(a, e) for a in ATTRIBUTES for e in ENTITIES]
    rng.shuffle(pairs)
    facts: list = []
    plan: list = []
    telling = set()  # turns whose user message states a fact: never replaced by a question
    for t in range(1, turns + 1):
        user = make_text(_pick(rng, USER_MIX), int(rng.uniform(80, 600)), rng)
        reply = make_text(_pick(rng, ASSISTANT_MIX), int(rng.uniform(300, 2400)), rng)
        stated = []
        if pairs and t <= turns - ASK_AFTER[0] and rng.random() < 0.6:
            for _ in range(min(len(pairs), rng.choice((1, 1, 2)))):
                attribute, entity = pairs.pop()
                fact = Fact(t, attribute, entity, ATTRIBUTES[attribute][0](rng), rng.random() < 0.25)
                facts.append(fact)
                stated.append(fact)
        in_user = [f for f in stated if rng.random() < 0.3]
        if in_user:
            telling.add(t)
        plan.append(
            [
                _with(user, [f.sentence for f in in_user], rng),
                _with(reply, [f.sentence for f in stated if f not in in_user], rng),
                None,
            ]
        )
    asked = set(telling)
    for fact in facts:
        free = [t for t in range(fact.turn + ASK_AFTER[0], min(turns, fact.turn + ASK_AFTER[1]) + 1) if t not in asked]
        if free:
            t = rng.choice(free)
            asked.add(t)
            plan[t - 1][0], plan[t - 1][2] = fact.question, fact
    return plan, facts


# -- Drivers ------------------------------------------------------------------------------------------------------


class PureDriver:
    """The layer-2b functions driven as inlet will drive them: a summary planned and written as the filter does,
    the chat's index extended with each fold's messages, recall into each request within ``budget``."""

    def __init__(self, counter: acc.TokenCounter, summarizer: LossySummarizer, budget: int):
        self.counter, self.summarizer, self.budget = counter, summarizer, budget
        self.index = acc.RecallIndex()
        self.summary, self.covered = "", 0
        self.recall_ms: list = []
        self.extend_ms: list = []

    def count(self, text: str) -> int:
        return self.counter.text_tokens(text, ENCODING)

    def request(self, history: list, user_text: str) -> tuple[list, list]:
        """What the model receives for the next user message, and the passages recalled."""
        messages = [SYSTEM, *history, {"role": "user", "content": user_text}]
        if self.covered:
            messages = acc.apply_summary(messages, self.summary, KEEP_FIRST, self.covered)
        if not (self.budget and self.covered):
            return messages, []
        started = time.perf_counter()
        allowed = acc.folded_turns(acc.canonical_messages(history), KEEP_FIRST, self.covered)
        sent, chosen = acc.with_recall(messages, self.index, allowed, self.budget, self.count)
        self.recall_ms.append((time.perf_counter() - started) * 1000)
        return sent, chosen

    def replied(self, history: list) -> None:
        """After a reply: fold when the history is over the trigger, down to the low-water mark."""
        canon = acc.canonical_messages(history)
        sizes = [message_tokens(self.counter, m, ENCODING) for m in canon]
        if sum(sizes[self.covered :]) + message_tokens(self.counter, SYSTEM, ENCODING) <= TRIGGER:
            return
        target = acc.summary_target(canon, KEEP_FIRST, KEEP_LAST)
        for cut in range(max(self.covered, KEEP_FIRST) + 1, target + 1):
            if acc._role(canon[cut]) == "user" and sum(sizes[cut:]) <= LOW_WATER:
                target = cut
                break
        if target <= self.covered:
            return
        start = max(self.covered, KEEP_FIRST)
        folded = "\n".join(acc._text_of(m.get("content")) for m in canon[start:target])
        self.summary = self.summarizer.summarize(self.summary, folded)
        started = time.perf_counter()
        self.index.extend(acc.recall_passages(canon, start, target))
        self.extend_ms.append((time.perf_counter() - started) * 1000)
        self.covered = target


class FilterDriver:
    """A temporary chat through a Filter: inlet, then the request hook (Open WebUI 0.11.2+), for each request; outlet
    after each reply, then the summary it started. ``LossySummarizer`` answers the summary calls."""

    def __init__(self, summarizer: LossySummarizer, share: float, chat: str):
        self.summarizer, self.chat = summarizer, f"temporary:{chat}"
        self.filter = f = acc.Filter()
        f.valves.max_context_tokens, f.valves.keep_first, f.valves.keep_last = CAP, KEEP_FIRST, KEEP_LAST
        f.valves.recall_share, f.valves.show_status = share, False
        f.summaries.complete = self._summarize
        self.loop = asyncio.new_event_loop()
        self.counter, self.covered, self.turn = f.counter, 0, 0
        self.inlet_ms: list = []
        self.recall_ms: list = []  # RequestPath._recalled, where a summary applied
        self.extend_ms: list = []  # RecallIndex.extend, in worker threads
        self.search_ms: list = []  # RecallIndex.search, on the event loop
        recalled = f.path._recalled

        async def timed(ctx, draft, view, fit):
            started = time.perf_counter()
            try:
                return await recalled(ctx, draft, view, fit)
            finally:
                if draft.record is not None and ctx.settings.recall_share > 0:
                    self.recall_ms.append((time.perf_counter() - started) * 1000)

        f.path._recalled = timed
        extend = acc.RecallIndex.extend

        def timed_extend(index, passages):
            started = time.perf_counter()
            try:
                return extend(index, passages)
            finally:
                self.extend_ms.append((time.perf_counter() - started) * 1000)

        self.index_extend = timed_extend
        search = acc.RecallIndex.search

        def timed_search(index, *args, **kwargs):
            started = time.perf_counter()
            try:
                return search(index, *args, **kwargs)
            finally:
                self.search_ms.append((time.perf_counter() - started) * 1000)

        self.index_search = timed_search

    async def _summarize(self, request, user, model, messages, max_tokens, temperature, *args, **kwargs) -> str:
        text = messages[-1]["content"]
        previous, _, new = text.partition("New messages to fold in:\n")
        previous = previous.split("Previous summary:\n", 1)[-1]
        return self.summarizer.summarize(previous, new)

    @property
    def meta(self) -> dict:
        return {"chat_id": self.chat, "message_id": f"r{self.turn}"}

    def request(self, history: list, user_text: str) -> tuple[list, list]:
        """What the model receives for the next user message, and the passages recalled (parsed from the block)."""
        self.turn += 1
        body = {"model": MODEL, "messages": [SYSTEM, *_plain(history), {"role": "user", "content": user_text}]}

        async def send() -> list:
            out = await self.filter.inlet(body, __user__=dict(USER), __metadata__=self.meta, __model__={"id": MODEL})
            out = await self.filter.request(out, __user__=dict(USER), __metadata__=self.meta, __model__={"id": MODEL})
            return out["messages"]

        started = time.perf_counter()
        sent = self.run(send())
        self.inlet_ms.append((time.perf_counter() - started) * 1000)
        last = acc._text_of(sent[-1].get("content"))
        return sent, ([last[len(user_text) :]] if last.endswith(acc.RECALL_CLOSE) else [])

    def replied(self, history: list) -> None:
        body = {"model": MODEL, "chat_id": self.chat, "id": history[-1]["id"], "messages": history}

        async def after() -> int:
            await self.filter.outlet(body, __user__=dict(USER), __metadata__=self.meta, __model__={"id": MODEL})
            await self.filter.wait_for_background()
            records = await self.filter.store.find(USER["id"], self.chat, "")
            return max((r.covered_count for r in records), default=0)

        self.covered = self.run(after())

    def close(self) -> None:
        """Stops what the Filter keeps running in the background (the retention sweeps), then the loop."""
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def run(self, work):
        extend, search = acc.RecallIndex.extend, acc.RecallIndex.search
        acc.RecallIndex.extend, acc.RecallIndex.search = self.index_extend, self.index_search
        try:
            return self.loop.run_until_complete(work)
        finally:
            acc.RecallIndex.extend, acc.RecallIndex.search = extend, search


def _plain(history: list) -> list:
    """The messages as inlet receives them (no ids)."""
    return [{"role": m["role"], "content": m["content"]} for m in history]


# -- The run ------------------------------------------------------------------------------------------------------


def common_prefix_tokens(counter, request: list, before: list) -> int:
    same = 0
    while same < min(len(request), len(before)) and request[same] == before[same]:
        same += 1
    return sum(message_tokens(counter, m, ENCODING) for m in request[:same])


def run_chat(counter, turns: int, seed: int, share: float, pure: bool = False) -> dict:
    plan, facts = make_chat(turns, seed)
    summarizer = LossySummarizer(facts)
    if pure:
        driver = PureDriver(counter, summarizer, int(CAP * share))
    else:
        driver = FilterDriver(summarizer, share, f"{seed}-{share}")
    history: list = []
    out = {
        "asked": 0,
        "reached": 0,
        "verbatim": 0,
        "kept_by_summary": 0,
        "requests": 0,
        "recall_tokens": [],
        "idle_recalls": 0,
        "idle_requests": 0,
        "over_cap": 0,
        "max_tokens": 0,
        "sent": 0,
        "cached": 0,
    }
    previous: list = []
    for user_text, reply_text, fact in plan:
        sent, chosen = driver.request(history, user_text)
        tokens = messages_tokens(counter, sent, ENCODING)
        out["max_tokens"] = max(out["max_tokens"], tokens)
        out["over_cap"] += tokens > CAP
        if driver.covered:
            out["requests"] += 1
            block = acc.recall_block(chosen) if pure else "".join(chosen)
            out["recall_tokens"].append(counter.text_tokens(block, ENCODING) if block else 0)
            out["sent"] += tokens
            out["cached"] += common_prefix_tokens(counter, sent, previous)
            if fact is None:
                out["idle_requests"] += 1
                out["idle_recalls"] += bool(chosen)
        previous = sent
        if fact is not None:
            folded = fact.turn <= sum(1 for m in history[: driver.covered] if m["role"] == "user")
            if folded and not summarizer.keeps(fact):  # a question about a detail the summary dropped
                text = json.dumps(sent, ensure_ascii=False)
                out["asked"] += 1
                out["reached"] += fact.value in text
                out["verbatim"] += json.dumps(fact.sentence, ensure_ascii=False)[1:-1] in text
            out["kept_by_summary"] += folded and summarizer.keeps(fact)
        t = len(history) // 2 + 1
        history = [
            *history,
            {"id": f"u{t}", "role": "user", "content": user_text},
            {"id": f"a{t}", "role": "assistant", "content": reply_text},
        ]
        driver.replied(history)
    out["recall_ms"], out["extend_ms"] = driver.recall_ms, driver.extend_ms
    out["inlet_ms"] = getattr(driver, "inlet_ms", [])
    out["search_ms"] = getattr(driver, "search_ms", [])
    out["history"] = history
    if not pure:
        driver.close()
    return out


def _ms(values: list) -> str:
    if not values:
        return "-"
    p95 = statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]
    return f"{statistics.median(values):.2f} / {p95:.2f}"


def index_memory(history: list) -> tuple[int, int]:
    """(bytes, passages) of one chat's whole history indexed at once, measured with tracemalloc."""
    canon = acc.canonical_messages(history)
    passages = acc.recall_passages(canon, 0, len(canon))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = acc.RecallIndex()
    index.extend(passages)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held, len(index)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--chats", type=int, default=0)
    parser.add_argument("--turns", type=int, default=0)
    parser.add_argument("--pure", action="store_true", help="drive the layer-2b functions, not the Filter")
    args = parser.parse_args(argv)
    chats = args.chats or (4 if args.quick else 12)
    turns = args.turns or (100 if args.quick else 140)
    counter = acc.TokenCounter()
    assert wait_ready(counter, ENCODING, 60), "tiktoken's cl100k file is missing"
    print(
        f"{chats} chats of {turns} turns, {'the layer-2b functions' if args.pure else 'through the Filter'}; "
        f"cap {CAP}, trigger {TRIGGER}, low water {LOW_WATER}, keep_first {KEEP_FIRST}, keep_last {KEEP_LAST}; "
        f"recall_share {acc.RECALL_SHARE} ({int(CAP * acc.RECALL_SHARE)} tokens), k {acc.RECALL_K}"
    )
    runs = {}
    for label, share in (("without recall", 0.0), ("with recall", acc.RECALL_SHARE)):
        runs[label] = [run_chat(counter, turns, seed, share, args.pure) for seed in range(chats)]
    failed = []
    for label, results in runs.items():
        asked = sum(r["asked"] for r in results)
        reached = sum(r["reached"] for r in results)
        verbatim = sum(r["verbatim"] for r in results)
        recall_tokens = [t for r in results for t in r["recall_tokens"]]
        used = [t for t in recall_tokens if t]
        idle = sum(r["idle_recalls"] for r in results), sum(r["idle_requests"] for r in results)
        share = sum(r["cached"] for r in results) / max(1, sum(r["sent"] for r in results))
        print(f"\n{label}:")
        print(
            f"  questions about dropped facts: {asked}; fact reached the model: {reached} "
            f"({reached / max(1, asked):.0%}; whole sentence verbatim: {verbatim})"
        )
        print(f"  facts the summary kept, asked about too (not scored): {sum(r['kept_by_summary'] for r in results)}")
        print(
            f"  recall tokens per request: {statistics.mean(recall_tokens) if recall_tokens else 0:.0f} "
            f"(per request that recalled: {statistics.mean(used) if used else 0:.0f}, max {max(used, default=0)}); "
            f"recalled on {idle[0]} of {idle[1]} requests that asked about nothing folded"
        )
        print(
            f"  requests over the cap: {sum(r['over_cap'] for r in results)}; largest "
            f"{max(r['max_tokens'] for r in results)} tokens; prefix share {share:.3f}"
        )
        if inlet_ms := [m for r in results for m in r["inlet_ms"]]:
            print(f"  inlet + request hook: ms p50 / p95 {_ms(inlet_ms)}, max {max(inlet_ms):.2f}")
        if recall_ms := [m for r in results for m in r["recall_ms"]]:
            print(
                f"  recall in inlet (index checked, search, budget, placement): ms p50 / p95 {_ms(recall_ms)}, "
                f"max {max(recall_ms):.2f}"
            )
            if search_ms := [m for r in results for m in r["search_ms"]]:
                print(
                    f"  of which the search (on the event loop): ms p50 / p95 {_ms(search_ms)}, max {max(search_ms):.2f}"
                )
            extend_ms = [m for r in results for m in r["extend_ms"]]
            print(f"  index extension per fold ({len(extend_ms)}, in a worker thread): ms p50 / p95 {_ms(extend_ms)}")
        if label == "with recall" and reached < GOAL * asked:
            failed.append(f"with recall only {reached} of {asked} questions brought their fact (goal {GOAL:.0%})")
        if label == "without recall" and reached:
            failed.append(f"without recall {reached} questions brought their fact: the summarizer keeps too much")
        if sum(r["over_cap"] for r in results):
            failed.append(f"{label}: requests over the cap")
    shares = [sum(r["cached"] for r in rs) / max(1, sum(r["sent"] for r in rs)) for rs in runs.values()]
    print(f"\nprefix share drop with recall: {shares[0] - shares[1]:.3f}")
    history = runs["with recall"][0]["history"]
    held, passages = index_memory(history)
    canon = acc.canonical_messages(history)
    started = time.perf_counter()
    acc.RecallIndex().extend(acc.recall_passages(canon, 0, len(canon)))
    cold = (time.perf_counter() - started) * 1000
    chars = sum(len(acc._text_of(m["content"])) for m in history)
    print(
        f"index of one whole chat ({len(history)} messages, {chars:,} characters, {passages} passages): "
        f"{held / 1024:.0f} KiB ({held / max(1, passages):.0f} bytes per passage), built at once in {cold:.0f} ms; "
        f"RECALL_TOTAL_PASSAGES ({acc.RECALL_TOTAL_PASSAGES:,}) would hold about "
        f"{acc.RECALL_TOTAL_PASSAGES * held / max(1, passages) / 2**20:.0f} MiB"
    )
    for line in failed:
        print("FAILED:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
