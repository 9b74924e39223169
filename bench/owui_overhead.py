"""Open WebUI's own time per request of a 1,000-message chat, against the
filter's inlet + request hook on the same message lists (issue 21: does the
repair memo earn its ~260 lines?).

    PY=$(bash scripts/setup_openwebui.sh | tail -n 1)
    $PY bench/owui_overhead.py                 # ~3-5 minutes
    $PY bench/owui_overhead.py --turns 10      # shorter

1. Starts a real Open WebUI 0.12.4 (``--workers``, default 1: requests go
   one after the other, so one worker measures the same time) with the fake
   provider answering at once (no delay; its own handling time, rule checks
   and token count of the whole list, is measured by the provider and
   subtracted). Stores two identical chats of 1,000 messages built by
   ``bench.chats.make_chat`` (tool chains with parallel calls, large tool
   outputs), tool replies stored as Open WebUI stores them (``output``
   items), so Open WebUI expands them again on every request.
2. WITHOUT the filter: ``--turns`` new turns on chat A, one after the other,
   non-streaming (the call returns when Open WebUI loaded the chat, built
   the list, called the provider, stored the reply and ran outlet). Per
   request: wall time seen by the client minus the provider's own handling
   time ("Open WebUI's own time"), and the CPU time the server's processes
   used.
3. A capturing filter (writes what inlet and the request hook receive) is
   installed; the same turns on chat B (same content) record the exact lists
   Open WebUI hands the filter. The server is stopped.
4. In this process, on those lists, the filter's inlet + request hook CPU
   time per request (``time.process_time``: worker threads included), in
   the order the turns came, for:

   * memo, one worker: every request's previous turn went through this Filter;
   * memo, two workers: two Filters take turns (each sees every other turn);
   * memo cleared before every request (a fresh ``RepairMemo``, token
     counts still cached): what a worker that lost the chat's entry pays;
   * no memo (``Filter.repairs = None``: the code path left once the memo is
     removed), one worker and two workers;
   * cold: a new Filter per request (empty token-count cache too): a worker
     that never saw the chat.

   Each with default valves, without a stored summary (the filter trims the
   list to the cap) and with one (the older turns replaced by a summary).
   Also how often the memo held a part the request started with (a "hit").

Prints the medians and p90s, and each as a share of Open WebUI's own median
time. Exits 0 (a measurement; the decision is the reader's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import bench as harness  # noqa: E402  (FakeStore, new_filter, summary_record; loads cl100k)
from bench.chats import SYSTEM_PROMPT, _user, make_chat, make_repair_chat  # noqa: E402
from devkit.chat_history import ChatHistory  # noqa: E402
from devkit.fake_provider import FakeProvider  # noqa: E402
from devkit.owui_client import OpenWebUIClient  # noqa: E402
from devkit.owui_server import OpenWebUIServer, ensure_offline_tiktoken, find_openwebui_python  # noqa: E402

acc = harness.acc
CHAT_MODEL = "fake-chat"
CAPTURE_ID = "bench_capture"
# no title / tag / follow-up calls: one provider call per turn, nothing in the background
QUIET_ENV = {
    "ENABLE_TITLE_GENERATION": "false",
    "ENABLE_TAGS_GENERATION": "false",
    "ENABLE_FOLLOW_UP_GENERATION": "false",
    "ENABLE_AUTOCOMPLETE_GENERATION": "false",
    "ENABLE_RETRIEVAL_QUERY_GENERATION": "false",
    "ENABLE_SEARCH_QUERY_GENERATION": "false",
}
CAPTURE_SOURCE = '''"""
title: Bench capture
description: Writes what inlet and the request hook receive (bench/owui_overhead.py).
version: 0.0.1
"""
import json


class Filter:
    def _write(self, hook, body):
        with open(PATH, "a", encoding="utf-8") as f:
            f.write(json.dumps({"hook": hook, "body": body}) + "\\n")

    async def inlet(self, body, __user__=None, __metadata__=None):
        self._write("inlet", body)
        return body

    async def request(self, body, __user__=None, __metadata__=None):
        self._write("request", body)
        return body
'''


# ---------------------------------------------------------------------------
# The chat, stored as Open WebUI stores it
# ---------------------------------------------------------------------------


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def stored_history(messages: list) -> ChatHistory:
    """``make_chat``'s expanded list (system prompt dropped: the client sends
    it) as a stored chat: each tool-using reply one assistant message whose
    ``output`` holds its calls, results and answer."""
    history = ChatHistory(CHAT_MODEL)
    i = 1
    while i < len(messages):
        m = messages[i]
        if m["role"] == "user":
            history.user(_text(m["content"]))
            i += 1
        elif m.get("tool_calls"):
            output = []
            while i < len(messages) and (messages[i].get("tool_calls") or messages[i]["role"] == "tool"):
                cur = messages[i]
                if cur["role"] == "tool":
                    output.append(
                        {
                            "type": "function_call_output",
                            "id": "fco_" + cur["tool_call_id"][-12:],
                            "call_id": cur["tool_call_id"],
                            "output": [{"type": "input_text", "text": cur["content"]}],
                            "status": "completed",
                        }
                    )
                else:
                    if _text(cur.get("content")):
                        output.append(_said(_text(cur["content"]), len(output)))
                    for call in cur["tool_calls"]:
                        output.append(
                            {
                                "type": "function_call",
                                "id": call["id"],
                                "call_id": call["id"],
                                "name": call["function"]["name"],
                                "arguments": call["function"]["arguments"],
                                "status": "completed",
                            }
                        )
                i += 1
            answer = ""
            if i < len(messages) and messages[i]["role"] == "assistant":
                answer = _text(messages[i]["content"])
                i += 1
            output.append(_said(answer, len(output)))
            history.assistant(answer, output=output)
        else:
            history.assistant(_text(m["content"]))
            i += 1
    return history


def _said(text: str, n: int) -> dict:
    return {
        "type": "message",
        "id": f"msg_{n}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text}],
    }


# ---------------------------------------------------------------------------
# The server side
# ---------------------------------------------------------------------------


def _group_cpu(server: OpenWebUIServer) -> float:
    """CPU seconds (user + system) of every process in the server's group."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in server.worker_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def run_turns(client, provider, server, chat_id, history, turns, rng_seed) -> list:
    """``turns`` new turns, one after the other: per turn (wall s, provider s,
    server CPU s, provider calls)."""
    rng = random.Random(rng_seed)
    rows = []
    for _ in range(turns):
        content = _text(_user(rng)["content"])
        before = len(provider.requests)
        cpu0 = _group_cpu(server)
        result = client.chat_completion(
            content, model=CHAT_MODEL, chat_id=chat_id, parent_id=history.current_id, system=SYSTEM_PROMPT, timeout=300
        )
        cpu1 = _group_cpu(server)
        calls = provider.requests[before:]
        if any(c["status"] != 200 for c in calls):
            raise SystemExit(f"the provider answered {[c['status'] for c in calls]}: {calls[-1]['error']}")
        reply = result["response"]["choices"][0]["message"]["content"]
        history.user(content, message_id=result["user_message_id"])
        history.assistant(reply, message_id=result["assistant_id"])
        rows.append((result["elapsed"], sum(c["duration"] or 0 for c in calls), cpu1 - cpu0, len(calls)))
    return rows


def serve_and_capture(args, chats: dict) -> dict:
    """Per chat kind: (rows of the turns without the filter, captured hook
    calls, id of the captured chat)."""
    python = find_openwebui_python(install=True)
    provider = FakeProvider(mode="strict").start()
    provider.configure(chat_delay=0, summary_delay=0)
    capture = os.path.join(tempfile.mkdtemp(prefix="acc-owui-overhead-"), "captured.jsonl")
    server = OpenWebUIServer(
        python=python,
        provider_url=provider.base_url,
        workers=args.workers,
        env_extra=QUIET_ENV,
        tiktoken_cache_dir=ensure_offline_tiktoken(python),
    )
    out = {}
    try:
        t0 = time.monotonic()
        server.start(timeout=900)
        print(f"Open WebUI ({args.workers} worker(s)) up in {time.monotonic() - t0:.0f}s", flush=True)
        client = OpenWebUIClient(server.base_url, timeout=300)
        client.signup("overhead@example.com", "Overhead-Passw0rd!", "Bench Admin")
        client.wait_for_models([CHAT_MODEL], timeout=120)
        stored = {}
        for kind, messages in chats.items():
            a, b = stored_history(messages), stored_history(messages)
            stored[kind] = (a, client.create_chat(a, title=f"{kind} A"), b, client.create_chat(b, title=f"{kind} B"))
        for kind, (a, id_a, _, _) in stored.items():
            run_turns(client, provider, server, id_a, a, args.warmup, "warm")  # not counted
            t0 = time.monotonic()
            rows = run_turns(client, provider, server, id_a, a, args.turns, "live")
            print(f"{kind}: {args.turns} turns without the filter in {time.monotonic() - t0:.0f}s", flush=True)
            out[kind] = rows
        source = CAPTURE_SOURCE.replace("PATH", repr(capture), 1)
        client.install_function(CAPTURE_ID, source, enable_global=True)
        for kind, (_, _, b, id_b) in stored.items():
            run_turns(client, provider, server, id_b, b, args.warmup, "warm")
            open(capture, "w").close()  # only the counted turns' lists
            run_turns(client, provider, server, id_b, b, args.turns, "live")
            with open(capture, encoding="utf-8") as f:
                out[kind] = (out[kind], [json.loads(line) for line in f], id_b)
    finally:
        server.stop()
        server.cleanup()
        provider.stop()
        if os.path.exists(capture):
            os.remove(capture)
        os.rmdir(os.path.dirname(capture))
    return out


# ---------------------------------------------------------------------------
# The filter, in this process, on the captured lists
# ---------------------------------------------------------------------------


def turns_of(captured: list) -> list:
    """[(inlet body, what Open WebUI added between inlet and the request hook)]."""
    turns, pending = [], None
    for entry in captured:
        if entry["hook"] == "inlet":
            pending = entry["body"]
        elif pending is not None:
            same = entry["body"].get("messages") == pending.get("messages")
            turns.append((pending, same))
            pending = None
    return turns


class _HitCounter:
    """Counts, around ``repair_in_parts``, requests whose list starts with the
    memo's part (the memo's own condition). Only in an untimed pass."""

    def __init__(self):
        self.hits = self.calls = 0
        self._real = acc.repair_in_parts

    def __enter__(self):
        def counted(messages, known):
            self.calls += 1
            cut = acc.repair_cut(messages)
            if known is not None and len(known.source) <= cut and known.starts(messages):
                self.hits += 1
            return self._real(messages, known)

        acc.repair_in_parts = counted
        return self

    def __exit__(self, *exc):
        acc.repair_in_parts = self._real


async def replay(turns: list, chat_id: str, mode: str, workers: int, record, valves: dict, hook: bool) -> tuple:
    """Inlet + request hook of every turn, in order: (CPU s per counted
    request, wall s per counted request, memo hits, memo lookups)."""
    filters = []

    def make():
        f = harness.new_filter(harness.FakeStore([record] if record is not None else []))
        if mode == "none":
            f.repairs = None  # harmless once the memo is gone: then this is the only path
        for name, value in valves.items():
            setattr(f.valves, name, value)
        return f

    filters = [make() for _ in range(workers)]
    cpus, walls = [], []
    meta = {"chat_id": chat_id}
    raws = [json.dumps(body) for body, _ in turns]
    for k, raw in enumerate(raws):
        f = filters[k % workers]
        if mode == "cold":
            f = filters[k % workers] = make()
            harness.clear_shared_caches()
        elif mode == "cleared" and HAS_MEMO:
            f.repairs = acc.RepairMemo()
        body = json.loads(raw)  # Open WebUI parses every request anew
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        out = await f.inlet(body, harness.USER, meta, __chat_id__=chat_id)
        if hook:
            await f.request(out, harness.USER, meta, __chat_id__=chat_id)
        c1, w1 = time.process_time(), time.perf_counter()
        if k >= workers or mode == "cold":  # each worker's first request is its cold start
            cpus.append(c1 - c0)
            walls.append(w1 - w0)
    return cpus, walls


async def hit_rate(turns: list, chat_id: str, workers: int, record, valves: dict, hook: bool) -> tuple:
    with _HitCounter() as counter:
        await replay(turns, chat_id, "memo", workers, record, valves, hook)
    return counter.hits, counter.calls


def q(values: list, p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


HAS_MEMO = hasattr(acc, "RepairMemo")  # removed after this measurement (issue 21)


def scenarios() -> tuple:
    """The modes measured: with the memo and without, or only without once it is gone."""
    return SCENARIOS if HAS_MEMO else tuple(s for s in SCENARIOS if s[1] in ("none", "cold"))


SCENARIOS = (
    ("memo, one worker", "memo", 1),
    ("memo, two workers", "memo", 2),
    ("memo cleared per request", "cleared", 1),
    ("no memo, one worker", "none", 1),
    ("no memo, two workers", "none", 2),
    ("cold (new Filter each)", "cold", 1),
)


CHATS = {"bench": make_chat, "repair": make_repair_chat}  # bench chats; chats repair changes on every request
SECTIONS = (
    ("default valves, no stored summary (the list trimmed to the cap)", {}, False),
    ("default valves, a stored summary (older turns replaced)", {}, True),
    ("no cap, no summary (the whole list sent)", {"max_context_tokens": 0, "compression_threshold_tokens": 0}, False),
)


def report_kind(kind: str, rows: list, captured: list, chat_id: str, args) -> dict:
    own = [wall - provider for wall, provider, _, _ in rows]
    server_cpu = [cpu for _, _, cpu, _ in rows]
    turns = turns_of(captured)
    sizes = [len(body["messages"]) for body, _ in turns]
    mb = statistics.median(len(json.dumps(body)) for body, _ in turns) / 1e6
    print(f"\n=== {kind} chat: {args.messages} stored messages, {args.turns} new turns, one after the other")
    print(f"lists handed to inlet: {min(sizes)}-{max(sizes)} messages, {mb:.2f} MB (median body)")
    print(f"request hook's list = inlet's (nothing added between them): {all(same for _, same in turns)}")
    print(f"provider calls per turn: {sorted({r[3] for r in rows})}")
    print(f"repair of the last list inlet got: {acc.repair_transcript(turns[-1][0]['messages'])[1].describe()}")
    print("Open WebUI without the filter, per request (s):")
    print(f"  {'':34} {'median':>8} {'p90':>8}")
    own_label = "Open WebUI's own time (wall)"
    for label, values in (
        ("wall, client side", [r[0] for r in rows]),
        ("provider handling (subtracted)", [r[1] for r in rows]),
        (own_label, own),
        ("server CPU time", server_cpu),
    ):
        print(f"  {label:34} {q(values, 0.5):8.3f} {q(values, 0.9):8.3f}")
    base, base_cpu = q(own, 0.5), q(server_cpu, 0.5)
    figures = {"owui_wall": base, "owui_cpu": base_cpu, "sections": {}}
    for label, valves, with_record in SECTIONS:
        record = None
        if with_record:
            defaults = acc.Filter().valves
            record = harness.summary_record(turns[0][0]["messages"], chat_id, defaults)
            probe = harness.new_filter(harness.FakeStore([record] if record else []))
            sent = asyncio.run(probe.inlet(json.loads(json.dumps(turns[-1][0])), harness.USER, {"chat_id": chat_id}))
            if not any(acc.is_summary_message(m) for m in sent["messages"]):
                print(f"\n({label}: the stored summary is not used; skipped)")
                continue
        for hook in (True, False):
            hooks = "inlet + request hook (Open WebUI 0.11.2+)" if hook else "inlet only (Open WebUI before 0.11.2)"
            print(f"\nFilter CPU per request, {hooks}; {label}:")
            print(
                f"  {'':28} {'CPU med ms':>10} {'CPU p90 ms':>10} {'wall med ms':>11} | "
                f"{'% OWUI wall':>11} {'% OWUI CPU':>10}"
            )
            for name, mode, workers in scenarios():
                cpus, walls = asyncio.run(replay(turns, chat_id, mode, workers, record, valves, hook))
                med = q(cpus, 0.5)
                figures["sections"][(label, hook, name)] = med
                print(
                    f"  {name:28} {med * 1000:10.1f} {q(cpus, 0.9) * 1000:10.1f} {q(walls, 0.5) * 1000:11.1f} | "
                    f"{med / base:10.1%} {med / base_cpu:10.1%}"
                )
            for workers in (1, 2) if HAS_MEMO else ():
                hits, calls = asyncio.run(hit_rate(turns, chat_id, workers, record, valves, hook))
                print(f"  memo hits, {workers} worker(s): {hits} of {calls} repairs")
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chats", default="bench,repair", help="bench, repair or both (comma-separated)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.chats.split(",") if k.strip()]
    # the stored chats: no new user message yet
    chats = {kind: CHATS[kind](args.messages, seed=args.messages)[:-1] for kind in kinds}
    served = serve_and_capture(args, chats)
    for kind in kinds:
        rows, captured, chat_id = served[kind]
        report_kind(kind, rows, captured, chat_id, args)
    print()
    print("Shares: the filter's median CPU time over Open WebUI's own median time per request")
    print("('% OWUI wall': wall time minus the provider's; '% OWUI CPU': the server processes' CPU time).")
    print("A memo hit: the request's list started with the part the memo held for the chat.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
