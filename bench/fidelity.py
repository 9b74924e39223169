"""Fidelity benchmark of the background summary (issue 9).

    python bench/fidelity.py            # mixed chats of 12, 24, 48 turns; short-turn chats of 80, 160
    python bench/fidelity.py --quick    # mixed 12 and 24 turns; short 80

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

Exits 1 when facts are lost or the input ratio is over 1.5x.
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


def stored_turn(t: int, profile: str = "mixed") -> list:
    """One user message and its reply, as Open WebUI stores them (tool calls
    in ``output``). Sizes: short ~300 characters, long ~12,000 (twice the old
    6,000-character clip; the middle was cut), huge ~60,000 (over the summary model's window).
    The "short" profile has short messages only (no tools): turns far
    smaller than the threshold, where the hysteresis decides how often a
    summary is rewritten."""
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


async def run_chat(turns: int, db_path: str, profile: str = "mixed") -> dict:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}", connect_args={"timeout": 10})
    f = acc.Filter()
    for key, value in VALVES.items():
        setattr(f.valves, key, value)
    f.store = acc.SummaryStore(lambda: engine)
    assert wait_ready(f.counter, ENCODING, 60), "tiktoken's cl100k file is missing"
    summarizer = FakeSummarizer(f.counter)
    f.complete = summarizer
    meta = {"chat_id": f"bench-{profile}-{turns}", "message_id": "m"}
    chat_id = meta["chat_id"]

    async def inlet(stored: list, new_text: str) -> list:
        sent = [SYSTEM] + as_inlet_sees_it(stored) + [{"role": "user", "content": new_text}]
        body = {"model": MODEL, "messages": copy.deepcopy(sent), "stream": True}
        result = await f.inlet(body, __user__=dict(USER), __metadata__=dict(meta), __model__={"id": MODEL})
        return result["messages"]

    updates: list = []

    async def emitter(event: dict) -> None:
        description = str((event.get("data") or {}).get("description", ""))
        if event.get("type") == "status" and description.startswith("Summary updated"):
            updates.append(description)

    stored: list = []
    over_since = None
    try:
        for t in range(1, turns + 1):
            turn = stored_turn(t, profile)
            sent = [SYSTEM] + as_inlet_sees_it(stored + turn[:1])
            if (
                over_since is None
                and messages_tokens(f.counter, sent, ENCODING) > VALVES["compression_threshold_tokens"]
            ):
                over_since = t
            await inlet(stored, turn[0]["content"])
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
    }


def lost_by_place(lost: list) -> str:
    """Lost facts counted by where they were (e.g. THM: huge tool output, middle)."""
    places: dict = {}
    for fact in lost:
        places[fact[-3:]] = places.get(fact[-3:], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(places.items()))


async def main_async(runs: list) -> int:
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
    for problem in failed:
        print("MISSED:", problem)
    if not failed:
        print("all facts kept; summarizer input within the target")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter chats")
    parser.add_argument("--turns", type=int, nargs="*", help="lengths of mixed chats to run (and no short-turn chats)")
    args = parser.parse_args(argv)
    lengths = tuple(args.turns) if args.turns else (12, 24) if args.quick else (12, 24, 48)
    short = (80,) if args.quick else (80, 160)
    runs = [("mixed", n) for n in lengths] + [("short", n) for n in (() if args.turns else short)]
    return asyncio.run(main_async(runs))


if __name__ == "__main__":
    sys.exit(main())
