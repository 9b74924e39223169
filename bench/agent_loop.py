"""Long agent runs: the cap and the facts inside one reply's native tool loop (issue 30).

    python bench/agent_loop.py            # loops of 5, 10, 12, 20, 30 and 40 rounds
    python bench/agent_loop.py --quick    # 5, 12 and 20 rounds

Drives ``Filter.request`` in-process as Open WebUI 0.12.4 calls it (no server): inlet once, then before every model
call of the loop the request hook on the growing list (Open WebUI keeps its own list and appends each round's call and
result to it; what the hook returns is sent, never carried to the next round). A chat of four earlier turns (each with
2 facts, ``MK-C..``) is followed by a request that runs a tool N times; each result is a ~6,000-token page with 2
distinct facts in its middle third (``MK-P..``), where a start-and-end cut loses them. Cap 30,000, threshold 16,000; the
summarizer answers after ``--summary-delay`` seconds (default 0.3) while each model call takes ``--model-delay``
(default 0.5), so summaries run beside the loop as in a real one.

Prints, per loop length, with a working summarizer and with the summarizer down (only shortening protects):
the largest request against the cap (counted with cl100k, like the fake provider), page facts and earlier-conversation
facts present in the final request (verbatim or in a summary), and the time the request hook added to the loop (sum
and worst call). Exits 1 when a request went over the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

import async_context_compression as acc  # noqa: E402
from devkit import probes  # noqa: E402
from devkit.fake_provider import MARKER_RE, count_tokens, tools_tokens  # noqa: E402

CAP, THRESHOLD = 30_000, 16_000
PAGE_TOKENS = 6_000
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fetch_page",
            "description": "Fetch one page of the report.",
            "parameters": {"type": "object", "properties": {"page": {"type": "integer"}}},
        },
    }
]
USER = {"id": "bench-user", "name": "Bench", "role": "user"}
_WORDS = "alpha beta gamma delta river stone market signal vector cloud ledger orbit matrix harbor meadow".split()


def filler(tokens: int, seed: int) -> str:
    """About ``tokens`` cl100k tokens of varied words, in lines."""
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) + str(rng.randint(0, 99)) for _ in range(int(tokens / 2.2))]
    return "\n".join(" ".join(words[i : i + 12]) for i in range(0, len(words), 12))


def page(k: int) -> str:
    """A ~6k-token page whose two facts sit in its middle third."""
    body = filler(PAGE_TOKENS, k).split("\n")
    third = len(body) // 3
    body.insert(third + 2, f"Finding of page {k}: the value is MK-P{k:02d}A.")
    body.insert(2 * third - 2, f"Second finding of page {k}: the code is MK-P{k:02d}B.")
    return f"Page {k} of the report\n" + "\n".join(body)


def earlier_conversation() -> list:
    messages = []
    for j in range(4):
        messages.append({"role": "user", "content": f"Note {j}: remember MK-C{j}U. " + filler(600, 100 + j)})
        messages.append({"role": "assistant", "content": f"Noted {j}; also MK-C{j}A. " + filler(400, 200 + j)})
    return messages


async def summarizer(request, user, model, messages, max_tokens, temperature, **extra):
    """Repeats every marker of its input (the previous summary's too), as devkit's fake summarizer does."""
    await asyncio.sleep(summarizer.delay)
    if summarizer.down:
        raise RuntimeError("summarizer down")
    return "Running summary: " + " ".join(dict.fromkeys(MARKER_RE.findall(messages[-1]["content"])))


def new_filter(down: bool, delay: float) -> acc.Filter:
    f = acc.Filter()
    summarizer.down, summarizer.delay = down, delay
    f.summaries.complete = summarizer
    f.summaries.store = _NoStore()
    f.valves.max_context_tokens, f.valves.compression_threshold_tokens = CAP, THRESHOLD
    f.valves.show_status = False
    if not probes.wait_ready(f.counter, "cl100k_base", 60):
        raise SystemExit("cl100k_base could not be loaded offline")
    return f


class _NoStore(acc.NullStore):
    """No stored summary: the earlier conversation is under the threshold alone."""

    async def find(self, *args, **kwargs):
        return []


async def run_loop(rounds: int, down: bool, model_delay: float, summary_delay: float) -> dict:
    f = new_filter(down, summary_delay)
    metadata = {"chat_id": "bench-chat", "message_id": f"reply-{rounds}-{down}"}
    system = {"role": "system", "content": "You are a careful research agent."}
    messages = [system, *earlier_conversation(), {"role": "user", "content": "Read the report, page by page."}]
    body = {"model": "bench-model", "messages": messages, "tools": TOOLS}
    body = await f.inlet(body, __user__=USER, __metadata__=metadata)
    loop = list(messages)  # Open WebUI's own list: what inlet got (inlet's cuts are not carried either)
    largest, added, worst, sent = 0, 0.0, 0.0, None
    for k in range(1, rounds + 2):  # rounds tool calls, then the final answer's call
        started = time.perf_counter()
        sent = await f.request({**body, "messages": list(loop)}, __user__=USER, __metadata__=metadata)
        took = time.perf_counter() - started
        added, worst = added + took, max(worst, took)
        largest = max(largest, count_tokens(sent["messages"]) + tools_tokens(TOOLS))
        if k > rounds:
            break
        await asyncio.sleep(model_delay)  # the model answers with a call
        call = {
            "id": f"call{k:05d}",
            "type": "function",
            "function": {"name": "fetch_page", "arguments": f'{{"page": {k}}}'},
        }
        loop += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": page(k)},
        ]
    await f.wait_for_background(5)
    final = " ".join(MARKER_RE.findall(str(sent["messages"])))
    pages = sum(f"MK-P{k:02d}{x}" in final for k in range(1, rounds + 1) for x in "AB")
    conversation = sum(f"MK-C{j}{x}" in final for j in range(4) for x in "UA")
    return {"largest": largest, "pages": pages, "conversation": conversation, "added": added, "worst": worst}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model-delay", type=float, default=0.5)
    parser.add_argument("--summary-delay", type=float, default=0.3)
    args = parser.parse_args()
    lengths = (5, 12, 20) if args.quick else (5, 10, 12, 20, 30, 40)
    print(f"cap {CAP:,}, threshold {THRESHOLD:,}, pages of ~{PAGE_TOKENS:,} tokens with 2 facts each")
    print(
        f"{'summarizer':<11} {'rounds':>6} {'largest/cap':>16} {'page facts':>11} {'earlier facts':>13} {'added':>14}"
    )
    over = False
    for down in (False, True):
        for rounds in lengths:
            r = asyncio.run(run_loop(rounds, down, args.model_delay, args.summary_delay))
            over |= r["largest"] > CAP
            print(
                f"{'down' if down else 'working':<11} {rounds:>6} {r['largest']:>8,}/{CAP:,} "
                f"{r['pages']:>5}/{2 * rounds:<5} {r['conversation']:>9}/8   "
                f"{r['added'] * 1000:>6.0f} ms (max {r['worst'] * 1000:.0f})"
            )
    if over:
        print("FAIL: a request went over the cap")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
