"""Recall on real conversations (issue 43): LoCoMo replayed through the Filter.

    python bench/recall_locomo.py ../shared/data/locomo-dev            # every conversation in the folder
    python bench/recall_locomo.py ../shared/data/locomo-dev/26.json    # one
    python bench/recall_locomo.py ../shared/data/locomo-dev/26.json --repeat 3   # inlet at 1,000+ folded messages

LoCoMo ("Evaluating Very Long-Term Conversational Memory of LLM Agents", Maharana et al., ACL 2024) is published in
the public repository snap-research/locomo (``data/locomo10.zip``): ten conversations between two people over 19-32
sessions, with questions annotated with the turns that hold their answer. Five are in ``shared/data/locomo-dev``
(its README describes the fields); the other five are held out.

A conversation is replayed as Open WebUI drives the Filter: speaker A's turns as user messages, speaker B's as the
assistant's (consecutive turns of one speaker merged), each session's first message prefixed with its date; for each
user message inlet then the request hook, then outlet after the reply, with default valves and a cap of 8,000. Each
fold's summary is the benchmark's own ``session_N_summary`` of every session the folded messages touch, joined (a
realistic lossy summary written by no one here). After the whole conversation, each question is one more user
message. Printed per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial), over the
questions whose evidence was folded (some evidence turn is not in the request without recall), the share that get
every evidence turn verbatim into the request:

* recall (the Filter as is), recall off (the same request without its block), plain truncation (the latest messages
  that fit the cap, no filter), and plain BM25 over the folded turns, the question as query, filling recall's room;
* recall's tokens on questions and on ordinary turns (the conversation's own user messages, once a summary exists);
* requests over the cap, and inlet's time (inlet and request hook, ms p50 / p95); at 1,000 folded messages and more
  (``--repeat 3``) also the process's CPU time in it, which a loaded machine inflates less than the wall clock.

``evaluate`` is what tests/unit/test_recall_locomo.py runs on one development conversation.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

import async_context_compression as acc  # noqa: E402
from devkit.probes import message_tokens, messages_tokens, wait_ready  # noqa: E402

ENCODING = "cl100k_base"
CAP = 8_000
MODEL = "bench-model"
USER = {"id": "bench-user", "name": "Bench", "role": "user"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
METHODS = ("recall", "off", "truncation", "bm25", "bm25 free")


# -- The conversation ---------------------------------------------------------------------------------------------


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sessions(conv: dict) -> list:
    numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
    return [n for n in numbers if conv[f"session_{n}"]]


def replay_messages(conv: dict) -> tuple[list, dict, list]:
    """(the chat's messages, dia_id -> the turn's text, each message's session number), as the README's replay."""
    messages, turns, session_of = [], {}, []
    for n in sessions(conv):
        date = conv.get(f"session_{n}_date_time", "").split(" on ")[-1]
        for i, turn in enumerate(conv[f"session_{n}"]):
            text = turn["text"] + (f" (photo: {turn['blip_caption']})" if turn.get("blip_caption") else "")
            turns[turn["dia_id"]] = turn["text"]
            if i == 0:
                text = f"[{date}] {text}"
            role = "user" if turn["speaker"] == conv["speaker_a"] else "assistant"
            if messages and messages[-1]["role"] == role and session_of[-1] == n:
                messages[-1]["content"] += "\n" + text
            else:
                messages.append({"role": role, "content": text})
                session_of.append(n)
    return messages, turns, session_of


# -- Baselines ----------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def truncated(counter, messages: list, cap: int = CAP) -> list:
    """The latest messages that fit ``cap`` (no filter)."""
    used, start = acc.TOKENS_PER_REQUEST, len(messages)
    while start > 0 and used + message_tokens(counter, messages[start - 1], ENCODING) <= cap:
        start -= 1
        used += message_tokens(counter, messages[start], ENCODING)
    return messages[start:]


def bm25_fill(turns: list, question: str, room: int, count) -> list:
    """Plain BM25 (lowercased words, no stemming or stop words, k1 1.2, b 0.75) over ``turns``, best first, each taken
    while the room holds it."""
    docs = [Counter(_WORD.findall(t.lower())) for t in turns]
    if not docs:
        return []
    df = Counter(w for d in docs for w in d)
    average = sum(sum(d.values()) for d in docs) / len(docs)
    query = set(_WORD.findall(question.lower()))
    scores = []
    for i, d in enumerate(docs):
        length, score = sum(d.values()), 0.0
        for w in query & d.keys():
            idf = math.log(1 + (len(docs) - df[w] + 0.5) / (df[w] + 0.5))
            score += idf * d[w] * 2.2 / (d[w] + 1.2 * (0.25 + 0.75 * length / average))
        if score > 0:
            scores.append((-score, i))
    chosen, used = [], 0
    for _, i in sorted(scores):
        cost = count(turns[i]) + 8
        if used + cost <= room:
            chosen.append(turns[i])
            used += cost
    return chosen


# -- The Filter ---------------------------------------------------------------------------------------------------


class Replay:
    """One conversation through a Filter (a temporary chat: its summaries live in memory)."""

    def __init__(self, conv: dict, share: float | None = None, chat: str = "locomo"):
        self.conv, self.chat = conv, f"temporary:{chat}"
        self.filter = f = acc.Filter()
        f.valves.max_context_tokens, f.valves.show_status = CAP, False
        if share is not None:
            f.valves.recall_share = share
        f.summaries.complete = self._summarize
        self.dates = {n: conv.get(f"session_{n}_date_time", "").split(" on ")[-1] for n in sessions(conv)}
        self.loop = asyncio.new_event_loop()
        self.turn = 0
        self.inlet_ms: list = []
        self.inlet_cpu_ms: list = []  # the process's CPU time in the same span: what the wall clock is on a quiet machine

    async def _summarize(self, request, user, model, messages, max_tokens, temperature, *args, **kwargs) -> str:
        text = messages[-1]["content"]
        previous, _, new = text.partition("New messages to fold in:\n")
        previous = previous.split("Previous summary:\n", 1)[-1].strip()
        touched = [n for n, date in self.dates.items() if f"[{date}]" in new and date]
        parts = [previous] if "Previous summary:" in text and previous else []
        said = [(n, self.conv[f"session_{n}_summary"]) for n in touched if f"session_{n}_summary" in self.conv]
        parts += [p for n, p in said if not (self._retold_only(n, new) and p in previous)]
        return "\n".join(p for p in parts if p) or "The two friends talked."

    def _retold_only(self, n: int, new: str) -> bool:
        """Whether the messages to fold tell session ``n`` only again (``--repeat``): a summary holding it already
        keeps its size, as a real one kept to its max_tokens would (grown past the cap, it was cut every request)."""
        return not re.search(rf"(?<!\) )\[{re.escape(self.dates[n])}\]", new)

    @property
    def meta(self) -> dict:
        return {"chat_id": self.chat, "message_id": f"r{self.turn}"}

    def request(self, history: list, text: str) -> list:
        self.turn += 1
        body = {"model": MODEL, "messages": [SYSTEM, *history, {"role": "user", "content": text}]}
        kwargs = {"__user__": dict(USER), "__model__": {"id": MODEL}}

        async def send() -> list:
            out = await self.filter.inlet(body, __metadata__=self.meta, **kwargs)
            out = await self.filter.request(out, __metadata__=self.meta, **kwargs)
            return out["messages"]

        started, cpu = time.perf_counter(), time.process_time()
        sent = self.loop.run_until_complete(send())
        self.inlet_ms.append((time.perf_counter() - started) * 1000)
        self.inlet_cpu_ms.append((time.process_time() - cpu) * 1000)
        return sent

    def replied(self, history: list) -> None:
        body = {"model": MODEL, "chat_id": self.chat, "id": f"a{self.turn}", "messages": history}

        async def after() -> None:
            await self.filter.outlet(body, __user__=dict(USER), __metadata__=self.meta, __model__={"id": MODEL})
            await self.filter.wait_for_background()

        self.loop.run_until_complete(after())

    def close(self) -> None:
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


def split_block(sent: list) -> tuple[list, str]:
    """(the request without its recall block, the block) — the same request with recall off."""
    last = acc._text_of(sent[-1].get("content"))
    at = last.rfind("\n\n" + acc.RECALL_PREAMBLE)
    if at < 0 or not last.endswith(acc.RECALL_CLOSE):
        return sent, ""
    content = sent[-1]["content"]
    if isinstance(content, list):
        return [*sent[:-1], {**sent[-1], "content": content[:-1]}], last[at + 2 :]
    return [*sent[:-1], {**sent[-1], "content": last[:at]}], last[at + 2 :]


def _text(messages: list) -> str:
    return "\n".join(acc._text_of(m.get("content")) for m in messages)


def evaluate(path: str, share: float | None = None, questions: int = 0, repeat: int = 1) -> dict:
    """Replays one conversation and asks its questions (the first ``questions``, 0: all). ``repeat``: the conversation
    told that many times over (each retelling's messages marked apart), for inlet's time at 1,000 folded messages and
    more; its shares then count evidence found in any retelling."""
    conv = load(path)
    messages, turn_text, _ = replay_messages(conv)
    messages = [
        {**m, "content": f"(retelling {r + 1}) {m['content']}" if r else m["content"]}
        for r in range(max(1, repeat))
        for m in messages
    ]
    replay = Replay(conv, share, os.path.basename(path))
    counter = replay.filter.counter
    wait_ready(counter, ENCODING)

    def count(text: str) -> int:
        return counter.text_tokens(text, ENCODING)

    out: dict = {
        "asked": defaultdict(int),
        "got": {m: defaultdict(int) for m in METHODS},
        "question_tokens": [],
        "ordinary_tokens": [],
        "over_cap": 0,
        "max_tokens": 0,
        "ordinary_many": [],  # (wall ms, CPU ms) of the ordinary turns with FOLDED_MANY folded messages or more
    }
    history: list = []
    try:
        for i, message in enumerate(messages):
            if message["role"] == "user":
                sent = replay.request(history, message["content"])
                if _folded(sent, len(history)) >= FOLDED_MANY:
                    out["ordinary_many"].append((replay.inlet_ms[-1], replay.inlet_cpu_ms[-1]))
                tokens = messages_tokens(counter, sent, ENCODING)
                out["over_cap"] += tokens > CAP
                out["max_tokens"] = max(out["max_tokens"], tokens)
                if any(acc.is_summary_message(m) for m in sent):
                    out["ordinary_tokens"].append(count(split_block(sent)[1]) if split_block(sent)[1] else 0)
            history.append(dict(message))
            if message["role"] == "assistant" or i == len(messages) - 1:
                replay.replied(history)
        ordinary_ms = list(replay.inlet_ms)
        qa = [q for q in conv["qa"] if q.get("evidence")]
        for q in qa[: questions or None]:
            evidence = [turn_text[e] for e in q["evidence"] if e in turn_text]
            if not evidence:
                continue
            question = str(q["question"])
            sent = replay.request(history, question)
            tokens = messages_tokens(counter, sent, ENCODING)
            out["over_cap"] += tokens > CAP
            out["max_tokens"] = max(out["max_tokens"], tokens)
            off, block = split_block(sent)
            off_text = _text(off)
            out["folded_messages"] = max(out.get("folded_messages", 0), _folded(sent, len(history)))
            if all(e in off_text for e in evidence):
                continue  # nothing of its evidence was folded
            cat = q.get("category", 0)
            out["asked"][cat] += 1
            out["question_tokens"].append(count(block) if block else 0)
            out["got"]["recall"][cat] += all(e in _text(sent) for e in evidence)
            out["got"]["off"][cat] += all(e in off_text for e in evidence)
            plain = _text(truncated(counter, [SYSTEM, *history, {"role": "user", "content": question}]))
            out["got"]["truncation"][cat] += all(e in plain for e in evidence)
            folded = [t for t in turn_text.values() if t not in off_text]
            share = replay.filter.valves.recall_share or acc.RECALL_SHARE
            room = min(int(share * CAP), CAP - messages_tokens(counter, off, ENCODING) - acc.RECALL_SLACK)
            chosen = "\n".join(bm25_fill(folded, question, room, count))
            out["got"]["bm25"][cat] += all(e in off_text or e in chosen for e in evidence)
            free = CAP - messages_tokens(counter, off, ENCODING) - acc.RECALL_SLACK
            chosen = "\n".join(bm25_fill(folded, question, max(room, free), count))
            out["got"]["bm25 free"][cat] += all(e in off_text or e in chosen for e in evidence)
        out["ordinary_ms"], out["question_ms"] = ordinary_ms, replay.inlet_ms[len(ordinary_ms) :]
        out["question_cpu_ms"] = replay.inlet_cpu_ms[len(ordinary_ms) :]
    finally:
        replay.close()
    return out


FOLDED_MANY = 1_000  # the size for inlet's time


def _folded(sent: list, history: int) -> int:
    """The history's messages a request left out (folded into its summary, or dropped): all but those it sends."""
    kept = sum(1 for m in sent if m.get("role") != "system" and not acc.is_summary_message(m)) - 1
    return history - kept


def share_of(got: dict, asked: dict, cats=None) -> float:
    cats = cats or asked.keys()
    total = sum(asked[c] for c in cats)
    return sum(got[c] for c in cats) / total if total else 0.0


def _ms(values: list) -> str:
    if len(values) < 2:
        return "-"
    q = statistics.quantiles(values, n=20)
    return f"{statistics.median(values):.1f} / {q[-1]:.1f}"


def report(name: str, results: list) -> None:
    asked: dict = defaultdict(int)
    got = {m: defaultdict(int) for m in METHODS}
    for r in results:
        for c, n in r["asked"].items():
            asked[c] += n
        for m in METHODS:
            for c, n in r["got"][m].items():
                got[m][c] += n
    print(f"\n{name}: {sum(asked.values())} questions whose evidence was folded")
    print(f"  {'category':<14}{'asked':>7}" + "".join(f"{m:>12}" for m in METHODS))
    for c in sorted(asked):
        row = "".join(f"{100 * share_of(got[m], asked, [c]):>11.1f}%" for m in METHODS)
        print(f"  {CATEGORIES.get(c, c):<14}{asked[c]:>7}{row}")
    print(
        f"  {'all':<14}{sum(asked.values()):>7}" + "".join(f"{100 * share_of(got[m], asked):>11.1f}%" for m in METHODS)
    )
    nonadv = [c for c in asked if c != 5]
    print(
        f"  {'all but adv.':<14}{sum(asked[c] for c in nonadv):>7}"
        + "".join(f"{100 * share_of(got[m], asked, nonadv):>11.1f}%" for m in METHODS)
    )
    q = [t for r in results for t in r["question_tokens"]]
    o = [t for r in results for t in r["ordinary_tokens"]]
    print(
        f"  recall tokens: questions mean {statistics.mean(q or [0]):.0f} (recalled in "
        f"{sum(1 for t in q if t) / max(1, len(q)):.0%}); ordinary turns with a summary mean "
        f"{statistics.mean(o or [0]):.0f} = {statistics.mean(o or [0]) / CAP:.2%} of the cap "
        f"(recalled in {sum(1 for t in o if t) / max(1, len(o)):.0%} of {len(o)})"
    )
    print(
        f"  over the cap: {sum(r['over_cap'] for r in results)} (largest request {max(r['max_tokens'] for r in results)})"
        f"; inlet + request hook ms p50 / p95: ordinary turns {_ms([t for r in results for t in r['ordinary_ms']])}, "
        f"questions {_ms([t for r in results for t in r['question_ms']])}; "
        f"folded messages at the questions: {', '.join(str(r.get('folded_messages', 0)) for r in results)}"
    )
    many = [t for r in results for t in r["ordinary_many"]]
    questions = [r for r in results if r.get("folded_messages", 0) >= FOLDED_MANY]
    if many or questions:
        wall = [t for r in questions for t in r["question_ms"]]
        cpu = [t for r in questions for t in r["question_cpu_ms"]]
        print(
            f"  at {FOLDED_MANY:,}+ folded messages, ms p50 / p95 wall (CPU): ordinary turns {_ms([w for w, _ in many])}"
            f" ({_ms([c for _, c in many])}) of {len(many)}; questions {_ms(wall)} ({_ms(cpu)}) of {len(wall)}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", help="a LoCoMo conversation (.json) or a folder of them")
    parser.add_argument("--share", type=float, default=None, help="recall_share valve (default: the valve's default)")
    parser.add_argument("--repeat", type=int, default=1, help="tell each conversation this many times (inlet time)")
    args = parser.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.data, "*.json"))) if os.path.isdir(args.data) else [args.data]
    results = []
    for path in paths:
        started = time.perf_counter()
        results.append(evaluate(path, args.share, repeat=args.repeat))
        report(os.path.basename(path) + f" ({time.perf_counter() - started:.1f} s)", results[-1:])
    if len(results) > 1:
        report("all", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
