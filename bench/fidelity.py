"""Fidelity benchmark of the background summary (issue 9).

    python bench/fidelity.py            # mixed chats of 12, 24, 48 turns; short-turn chats of 80, 160
    python bench/fidelity.py --quick    # mixed 12 and 24 turns; short 80
    python bench/fidelity.py --cache-only   # only the prompt-cache runs (~40 s)

Drives the Filter only through its public API, the way Open WebUI does:
``inlet`` before every model call, ``outlet`` after every reply, then
``wait_for_background`` (so it keeps measuring whatever shape the summary
orchestration takes). The store is a real SQLite file (aiosqlite); the
summarizer is a fake that, like the project's fake provider, repeats every
fact marker it is shown, the previous summary's included: a fact missing
from the final request was never shown to it, or was dropped by the filter.

Every turn carries facts (``FX-<turn>-<where><position>``) at the start,
the middle and the end of its texts: short and long user messages, short and
long assistant replies, tool-call arguments, short and long tool outputs, and
every eighth turn a tool output larger than the summary model's window.
A second profile has short turns only (two ~300-character messages), so
that how often a summary is rewritten is decided by the hysteresis, not by
the size of each turn.

Prints, per chat length:

* facts kept: facts of the whole chat found in the request inlet sends
  after the last turn (the summary plus the verbatim messages); must be all;
* facts shown: facts of the folded messages that reached the summarizer;
* summarizer input: tokens of every summary call's messages, summed over the
  chat's life, as a ratio to the chat's tokens (target at most 1.5x);
* summary calls per 10 turns, counted from the first turn whose request was
  over the threshold (a fold of a long stretch takes several calls, one
  per round); the summary updates ("Summary updated" statuses); and the
  tokens of new messages per call.

Then the prompt-cache runs (issue 22; ``--cache-only`` runs only these):
threshold 20k, cap 40k, keep_last 6, turns of ~220 ("short"), ~1.3k and
~3.4k tokens, and ~1.3k-token turns with 60 tool schemas (~13k tokens) sent
with every request. Each request is what the provider receives: inlet, then
the request hook on inlet's list (Open WebUI 0.11.2+). Prints facts kept,
summary calls and rewrites, summary calls per 10 turns, summarizer input /
chat, and the prefix share: prompt tokens (tool schemas included) in whole
messages equal to the previous request's, in order from the start, over the
request's tokens, summed from the first turn over the threshold; "+reply"
also counts the previous reply as cached. Tool turns reuse one call id that
repair renames, so renamed ids must stay stable for the prefix to hold.

Exits 1 when facts are lost or the input ratio is over 1.5x, and when the
1.3k-token turns miss the issue's goals (prefix share >= 0.9, at most one
summary call per 10 turns).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import sys
import tempfile
from typing import Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

import async_context_compression as acc  # noqa: E402
from devkit.probes import messages_tokens, wait_ready  # noqa: E402

ENCODING = "cl100k_base"
MODEL = "bench-model"
USER = {"id": "bench-user", "name": "Bench", "role": "user"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FACT = re.compile(r"FX-\d{3}-[A-Z]{2}[SME]")
RATIO_TARGET = 1.5
VALVES = dict(
    compression_threshold_tokens=6000,
    max_context_tokens=0,  # no cap: only summaries shorten the chat, nothing is trimmed
    keep_first=1,
    keep_last=4,
    summary_model_max_context=12000,
    max_summary_tokens=3000,
    summary_timeout_seconds=60,
)
SENTENCES = (
    "The team compared the quarterly figures with last year's plan and noted where they differ.",
    "Several reviewers asked for a careful estimate of the remaining work before the release.",
    "Latency measurements were taken on the staging cluster under the usual synthetic load.",
    "The migration keeps the public interface stable while the storage layer is replaced.",
    "Customers in the pilot group reported fewer timeouts after the connection pool change.",
)


def filler(chars: int, seed: int) -> str:
    """Prose of about ``chars`` characters in paragraphs of five sentences."""
    out, i = [], seed
    while sum(len(s) + 1 for s in out) < chars:
        out.append(SENTENCES[i % len(SENTENCES)] + ("\n\n" if i % 5 == 4 else " "))
        i += 1
    return "".join(out).strip()


def with_facts(turn: int, where: str, chars: int) -> str:
    """A text of about ``chars`` characters with a fact at its start, its
    middle and its end."""
    body = filler(chars, turn)
    half = len(body) // 2
    cut = body.find(" ", half)
    cut = half if cut < 0 else cut
    fact = f"FX-{turn:03d}-{where}"
    return f"{fact}S {body[:cut]} {fact}M {body[cut:]} {fact}E"


def marked(turn: int, where: str, chars: int, marks: str) -> str:
    """``with_facts`` keeping only the facts at ``marks`` (of S, M, E)."""
    text = with_facts(turn, where, chars)
    for mark in "SME":
        if mark not in marks:
            text = text.replace(f"FX-{turn:03d}-{where}{mark}", "")
    return text.strip()


# Turn sizes of the prompt-cache runs (issue 22): (user chars, reply chars,
# tool output chars every other turn, 0 = none). Facts: one in the user's
# message, three in the reply (start, middle, end), one at the end of a tool
# output, so that the fake summary of a long chat stays near
# max_summary_tokens, as a real one would.
CACHE_PROFILES = {
    "short": (600, 600, 0),
    "1.3k": (1200, 4700, 2600),
    "3.4k": (2200, 12500, 9800),
}


def cache_turn(t: int, profile: str) -> list:
    user_chars, reply_chars, output_chars = CACHE_PROFILES[profile]
    user = {"id": f"u{t}", "role": "user", "content": marked(t, "US", user_chars, "S")}
    answer = marked(t, "AL", reply_chars, "SME") if profile != "short" else filler(reply_chars, t)
    assistant: dict = {"id": f"a{t}", "role": "assistant", "content": answer}
    if output_chars and t % 2 == 0:
        # the id every round reuses (Kimi through vLLM): repair renames it, the same way on every turn
        call_id = "functions.search_docs:0"
        arguments = json.dumps({"query": filler(120, t)})
        assistant["output"] = [
            {"type": "function_call", "call_id": call_id, "name": "search_docs", "arguments": arguments},
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": [{"type": "input_text", "text": marked(t, "TO", output_chars, "E")}],
            },
            {"type": "message", "content": [{"type": "output_text", "text": answer}]},
        ]
    return [user, assistant]


def stored_turn(t: int, profile: str = "mixed") -> list:
    """One user message and its reply, as Open WebUI stores them (tool calls
    in ``output``). Sizes: short ~300 characters, long ~12,000 (twice the old
    6,000-character clip; the middle was cut), huge ~60,000 (over the summary model's window).
    The "short" profile has short messages only (no tools): turns far
    smaller than the threshold, where the hysteresis decides how often a
    summary is rewritten."""
    if profile.startswith("cache-"):
        return cache_turn(t, profile[len("cache-") :])
    if profile == "short":
        return [
            {"id": f"u{t}", "role": "user", "content": with_facts(t, "US", 300)},
            {"id": f"a{t}", "role": "assistant", "content": with_facts(t, "AS", 300)},
        ]
    user_long = t % 3 == 0
    user = {
        "id": f"u{t}",
        "role": "user",
        "content": with_facts(t, "UL" if user_long else "US", 12000 if user_long else 300),
    }
    reply_long = t % 3 == 1
    answer = with_facts(t, "AL" if reply_long else "AS", 12000 if reply_long else 300)
    assistant: dict = {"id": f"a{t}", "role": "assistant", "content": answer}
    if t % 2 == 0:
        call_id = f"call_{t}"
        args_long = t % 4 == 0
        arguments = json.dumps({"query": with_facts(t, "TA" if args_long else "TB", 3000 if args_long else 120)})
        if t % 8 == 0:
            output = with_facts(t, "TH", 60000)
        elif t % 4 == 2:
            output = with_facts(t, "TO", 12000)
        else:
            output = with_facts(t, "TS", 300)
        assistant["output"] = [
            {"type": "function_call", "call_id": call_id, "name": "search_docs", "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": [{"type": "input_text", "text": output}]},
            {"type": "message", "content": [{"type": "output_text", "text": answer}]},
        ]
    return [user, assistant]


def as_inlet_sees_it(stored: list) -> list:
    """What Open WebUI hands inlet for a stored branch: outputs expanded, ids gone."""
    expanded, _ = acc.expand_stored_messages(copy.deepcopy(stored))
    return expanded


class FakeSummarizer:
    """Answers with every fact marker of its input, in order, once."""

    def __init__(self, counter: acc.TokenCounter):
        self.counter = counter
        self.calls: list = []

    async def __call__(self, request, user, model, messages, max_tokens, temperature, *args, **kwargs):
        text = messages[-1]["content"]
        new = text.split("New messages to fold in:\n", 1)[-1]
        self.calls.append(
            {
                "tokens": messages_tokens(self.counter, messages, ENCODING),
                "new_tokens": self.counter.text_tokens(new, ENCODING),
                "facts": set(FACT.findall(new)),
            }
        )
        return "Running summary: " + " ".join(dict.fromkeys(FACT.findall(text)))


async def run_chat(
    turns: int, db_path: str, profile: str = "mixed", valves: Optional[dict] = None, tools: Optional[list] = None
) -> dict:
    from sqlalchemy.ext.asyncio import create_async_engine

    valves = VALVES if valves is None else valves
    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}", connect_args={"timeout": 10})
    f = acc.Filter()
    for key, value in valves.items():
        setattr(f.valves, key, value)
    f.summaries.store = acc.ChatStore(lambda: engine)
    assert wait_ready(f.counter, ENCODING, 60), "tiktoken's cl100k file is missing"
    summarizer = FakeSummarizer(f.counter)
    f.summaries.complete = summarizer
    meta = {"chat_id": f"bench-{profile}-{turns}", "message_id": "m"}
    chat_id = meta["chat_id"]

    async def inlet(stored: list, new_text: str) -> list:
        """What the provider receives: inlet, then the request hook on inlet's
        list (Open WebUI 0.11.2 and later call it before the model call)."""
        sent = [SYSTEM] + as_inlet_sees_it(stored) + [{"role": "user", "content": new_text}]
        body = {"model": MODEL, "messages": copy.deepcopy(sent), "stream": True}
        if tools:
            body["tools"] = copy.deepcopy(tools)
        result = await f.inlet(body, __user__=dict(USER), __metadata__=dict(meta), __model__={"id": MODEL})
        result = await f.request(
            copy.deepcopy(result), __user__=dict(USER), __metadata__=dict(meta), __model__={"id": MODEL}
        )
        return result["messages"]

    def tokens_of(message: dict) -> int:
        return messages_tokens(f.counter, [message], ENCODING)

    def common(request: list, before: list) -> int:
        """How many leading messages ``request`` shares with ``before``."""
        same = 0
        while same < min(len(request), len(before)) and request[same] == before[same]:
            same += 1
        return same

    # per turn: (tokens of the request, of its prefix equal to the previous request's, of its prefix equal to
    # the previous request followed by that request's reply); tool schemas count in all three (they come first
    # in the provider's prompt and never change here)
    requests: list = []
    previous_sent: list = []
    previous_reply: list = []

    updates: list = []

    async def emitter(event: dict) -> None:
        description = str((event.get("data") or {}).get("description", ""))
        if event.get("type") == "status" and "Summary updated" in description:
            updates.append(description)

    stored: list = []
    over_since = None
    fixed = f.counter.tools_tokens(tools, ENCODING) if tools else 0  # tool schemas: in every request
    try:
        for t in range(1, turns + 1):
            turn = stored_turn(t, profile)
            sent = [SYSTEM] + as_inlet_sees_it(stored + turn[:1])
            if (
                over_since is None
                and messages_tokens(f.counter, sent, ENCODING) + fixed > valves["compression_threshold_tokens"]
            ):
                over_since = t
            request = await inlet(stored, turn[0]["content"])
            sizes = [tokens_of(m) for m in request]
            same = common(request, previous_sent)
            with_reply = common(request, previous_sent + previous_reply) if same == len(previous_sent) else same
            requests.append((fixed + sum(sizes), fixed + sum(sizes[:same]), fixed + sum(sizes[:with_reply])))
            previous_sent, previous_reply = request, as_inlet_sees_it(turn[1:])
            stored = stored + turn
            body = {"model": MODEL, "chat_id": chat_id, "id": turn[-1]["id"], "messages": copy.deepcopy(stored)}
            await f.outlet(
                body, __user__=dict(USER), __metadata__=dict(meta), __model__={"id": MODEL}, __event_emitter__=emitter
            )
            await f.wait_for_background()
            for call in summarizer.calls:
                call.setdefault("turn", t)
        final = await inlet(stored, "FX-999-USS And now?")
    finally:
        await engine.dispose()

    chat_messages = [SYSTEM] + as_inlet_sees_it(stored)
    chat_tokens = messages_tokens(f.counter, chat_messages, ENCODING)
    facts = set(FACT.findall(json.dumps(chat_messages, ensure_ascii=False)))
    kept = facts & set(FACT.findall(json.dumps(final, ensure_ascii=False)))
    summary = next((m for m in final if acc.is_summary_message(m)), None)
    verbatim = [m for m in final if m is not summary]
    folded = facts - set(FACT.findall(json.dumps(verbatim, ensure_ascii=False)))
    shown = set().union(*(c["facts"] for c in summarizer.calls)) if summarizer.calls else set()
    input_tokens = sum(c["tokens"] for c in summarizer.calls)
    calls_after = [c for c in summarizer.calls if over_since is not None and c["turn"] >= over_since]
    span = turns - over_since + 1 if over_since is not None else 0
    window = requests[over_since - 1 :] if over_since is not None else []
    sent_tokens = sum(total for total, _, _ in window)
    return {
        "profile": profile,
        "turns": turns,
        "chat_tokens": chat_tokens,
        "facts": len(facts),
        "kept": len(kept),
        "lost": sorted(facts - kept),
        "folded": len(folded),
        "shown": len(folded & shown),
        "calls": len(summarizer.calls),
        "updates": len(updates),
        "input_tokens": input_tokens,
        "ratio": input_tokens / chat_tokens if chat_tokens else 0.0,
        "over_since": over_since,
        "per10": 10 * len(calls_after) / span if span else 0.0,
        "new_per_call": (sum(c["new_tokens"] for c in summarizer.calls) / len(summarizer.calls))
        if summarizer.calls
        else 0.0,
        "final_tokens": messages_tokens(f.counter, final, ENCODING),
        # prompt tokens that repeat the previous request's prefix (whole messages), from the first turn over the threshold
        "prefix_share": sum(same for _, same, _ in window) / sent_tokens if sent_tokens else 0.0,
        # the same with the previous reply counted as cached too (providers that keep the KV of what they wrote)
        "reply_share": sum(more for _, _, more in window) / sent_tokens if sent_tokens else 0.0,
        "requests": requests,
        "turn_tokens": (chat_tokens - messages_tokens(f.counter, [SYSTEM], ENCODING)) / turns,
    }


def lost_by_place(lost: list) -> str:
    """Lost facts counted by where they were (e.g. THM: huge tool output, middle)."""
    places: dict = {}
    for fact in lost:
        places[fact[-3:]] = places.get(fact[-3:], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(places.items()))


CACHE_VALVES = dict(
    compression_threshold_tokens=20000,
    max_context_tokens=40000,
    keep_first=1,
    keep_last=6,
    summary_timeout_seconds=60,
)
# (label, profile, turns, tool schemas sent with every request: how many of ~200 tokens each)
CACHE_RUNS = (
    ("short", "cache-short", 250, 0),
    ("1.3k", "cache-1.3k", 80, 0),
    ("3.4k", "cache-3.4k", 40, 0),
    ("1.3k+tools", "cache-1.3k", 80, 60),
)


def tool_schemas(count: int) -> list:
    """``count`` function schemas of about 200 tokens each (many tools: large, fixed
    request overhead that no summary can shrink)."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": filler(1000, i),
                "parameters": {"type": "object", "properties": {}},
            },
        }
        for i in range(count)
    ]


PREFIX_GOAL = 0.9  # share of prompt tokens in the previous request's prefix, 1.3k-token turns
CALLS_GOAL = 1.0  # summary calls per 10 turns, 1.3k-token turns


async def cache_runs(runs: list, failed: list) -> None:
    """The prompt-cache figures (issue 22): how much of each request repeats
    the previous request's prefix, and how often the summary is rewritten."""
    v = CACHE_VALVES
    counter = acc.Filter().counter
    assert wait_ready(counter, ENCODING, 60)
    tools_tokens = counter.tools_tokens(tool_schemas(CACHE_RUNS[-1][3]), ENCODING)
    print(
        f"\nPrompt cache: threshold {v['compression_threshold_tokens']}, cap {v['max_context_tokens']}, "
        f"keep_last {v['keep_last']}, other valves default; what the provider receives (inlet, then the request hook)"
    )
    header = (
        f"{'turns':>10} {'count':>5} {'tok/turn':>8} {'facts kept':>11} {'calls':>5} {'updates':>7} "
        f"{'calls/10 turns':>14} {'prefix share':>12} {'+reply':>6} {'input/chat':>10} {'final req':>9}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for name, profile, n, tools in runs:
            schemas = tool_schemas(tools)
            r = await run_chat(n, os.path.join(tmp, f"{name}{n}.db"), profile, CACHE_VALVES, schemas)
            print(
                f"{name:>10} {n:>5} {r['turn_tokens']:>8.0f} {r['kept']:>5}/{r['facts']:<5} {r['calls']:>5} "
                f"{r['updates']:>7} {r['per10']:>14.2f} {r['prefix_share']:>12.3f} {r['reply_share']:>6.3f} {r['ratio']:>9.2f}x "
                f"{r['final_tokens']:>9}"
            )
            if r["lost"]:
                print(f"      lost: {lost_by_place(r['lost'])}  e.g. {', '.join(r['lost'][:6])}")
                failed.append(f"cache {name}: {len(r['lost'])} of {r['facts']} facts lost")
            if r["ratio"] > RATIO_TARGET:
                failed.append(f"cache {name}: summarizer input {r['ratio']:.2f}x the chat (target {RATIO_TARGET}x)")
            if name == "1.3k" and r["prefix_share"] < PREFIX_GOAL:
                failed.append(f"cache 1.3k: prefix share {r['prefix_share']:.3f} (goal >= {PREFIX_GOAL})")
            if name == "1.3k" and r["per10"] > CALLS_GOAL:
                failed.append(f"cache 1.3k: {r['per10']:.2f} summary calls per 10 turns (goal <= {CALLS_GOAL})")
    print(
        "prefix share: prompt tokens in whole messages equal to the previous request's, in order from the start, "
        "over the request's tokens;"
    )
    print(
        "        tool schemas included (first in the provider's prompt, unchanged), summed from the first turn over the"
    )
    print(
        "        threshold, like calls/10 turns; +reply: the previous request followed by its reply counted as cached"
    )
    print(f"1.3k+tools: {CACHE_RUNS[-1][3]} tool schemas, {tools_tokens} tokens sent with every request")


async def main_async(runs: list, cache: list = ()) -> int:
    print(
        f"threshold {VALVES['compression_threshold_tokens']} tokens, summary window "
        f"{VALVES['summary_model_max_context']}, max summary {VALVES['max_summary_tokens']}, "
        f"keep_last {VALVES['keep_last']}, no cap (max_context_tokens=0)"
    )
    header = (
        f"{'profile':>7} {'turns':>5} {'chat tok':>9} {'facts kept':>11} {'shown':>9} {'calls':>5} {'updates':>7} "
        f"{'input tok':>10} {'input/chat':>10} {'calls/10 turns':>14} {'new tok/call':>12} {'final req':>9}"
    )
    print(header)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for profile, n in runs:
            r = await run_chat(n, os.path.join(tmp, f"{profile}{n}.db"), profile)
            print(
                f"{profile:>7} {r['turns']:>5} {r['chat_tokens']:>9} {r['kept']:>5}/{r['facts']:<5} "
                f"{r['shown']:>4}/{r['folded']:<4} {r['calls']:>5} {r['updates']:>7} {r['input_tokens']:>10} "
                f"{r['ratio']:>9.2f}x {r['per10']:>14.1f} {r['new_per_call']:>12.0f} {r['final_tokens']:>9}"
            )
            if r["lost"]:
                print(f"      lost: {lost_by_place(r['lost'])}  e.g. {', '.join(r['lost'][:6])}")
                failed.append(f"{profile} {n} turns: {len(r['lost'])} of {r['facts']} facts lost")
            if r["ratio"] > RATIO_TARGET:
                failed.append(
                    f"{profile} {n} turns: summarizer input {r['ratio']:.2f}x the chat (target {RATIO_TARGET}x)"
                )
    print("places: U/A/T = user/assistant/tool; S/L short/long, B/A short/long args, S/O/H short/long/huge output;")
    print("        last letter S/M/E = start/middle/end of the text")
    if cache:
        await cache_runs(list(cache), failed)
    for problem in failed:
        print("MISSED:", problem)
    if not failed:
        print("all facts kept; summarizer input within the target")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter chats")
    parser.add_argument("--turns", type=int, nargs="*", help="lengths of mixed chats to run (and no short-turn chats)")
    parser.add_argument("--cache-only", action="store_true", help="only the prompt-cache runs")
    parser.add_argument("--no-cache", action="store_true", help="without the prompt-cache runs")
    args = parser.parse_args(argv)
    lengths = tuple(args.turns) if args.turns else (12, 24) if args.quick else (12, 24, 48)
    short = (80,) if args.quick else (80, 160)
    runs = [("mixed", n) for n in lengths] + [("short", n) for n in (() if args.turns else short)]
    cache = () if args.no_cache or args.turns else CACHE_RUNS
    if args.cache_only:
        runs, cache = [], CACHE_RUNS
    return asyncio.run(main_async(runs, cache))


if __name__ == "__main__":
    sys.exit(main())
