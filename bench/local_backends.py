"""Local models as they really serve (issue 37): small windows, big turns.

    python bench/local_backends.py                 # Ollama 4096 and 8192, llama-server 8192
    python bench/local_backends.py --turn-tokens 1500 --growth 5

Drives the Filter in-process as Open WebUI 0.12.4 calls it (inlet, the request hook, then outlet after the reply;
no Open WebUI server: tests/e2e/test_local_backends.py is the same scenario through a real one) with default valves
except ``summary_model``, against the fake provider over HTTP serving the model as each local server serves it:

* Ollama over its native ``/api/chat``: ``num_ctx`` 4096 or 8192, set in the model's params (Open WebUI 0.12.4 puts
  it in the request's ``options`` before inlet and keeps no params in the model entry filters get; outlet gets
  neither); a prompt over it loses whole messages from the front, silently, and ``prompt_eval_count`` reports what
  was kept;
* llama-server ``-c 8192`` publishing ``meta.n_ctx_train`` 131072 in ``/v1/models``: a prompt over ``n_ctx`` is
  refused with ``exceed_context_size_error``; the window is learned from that refusal as the product learns it: Open
  WebUI's stored chat (a stand-in for its ``Chats``) keeps the provider's error on the failed reply, the user message
  stays, the next turn's list ends in two user messages, and the store holds the filter's record of what it sent.

Each chat opens with a short greeting, then turns of about ``--turn-tokens`` tokens (a user message carrying one
distinct fact, ``MK-<n>``, and a short reply) until what the user typed reaches ``--growth`` times the window. The
user reads each reply before typing the next turn: summaries started after it finish first. The summarizer is
local and repeats every fact it is shown, about 20 tokens each, as a real one writes a line per fact.

Prints per backend and window: requests cut (Ollama dropped messages) or rejected (llama-server), requests after
the first reply that were; facts seen (requests that carried every fact of their branch, verbatim or in the
summary), summaries written per turn (a summary folded in several summarizer calls counts once), the fewest turns
between two summaries, and the largest request in the model's tokens. Then (issue 44) a 1.3x model behind an
OpenAI-compatible API, 16,384 window, cap 15,000, no ratio known on the worker: its requests rejected (at most one:
the rejection names the window and the size sent, and the next turn fits in the model's tokens). Exits 1 when a
request after the first missed a fact, or that model was rejected more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import types
import urllib.error
import urllib.request
from dataclasses import dataclass, field

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

import async_context_compression as acc  # noqa: E402
from devkit.fake_provider import FakeProvider, ModelSpec, count_tokens, llamacpp_spec, ollama_spec  # noqa: E402
from devkit.probes import wait_ready  # noqa: E402

MODEL = "local-llama:8b"
SUMMARY_MODEL = "fake-summary"
USER = {"id": "bench-user", "name": "Bench", "role": "user"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
FACT = re.compile(r"\bMK-\d+\b")
CASES = (("ollama", 4096), ("ollama", 8192), ("llamacpp", 8192))
# Issue 44's cases: the window found as the product finds it (asked of the server, not set in the request)
FOUND_CASES = (("ollama", 8192, "served"), ("ollama", 4096, "served"), ("ollama", 8192, "unlisted"))
FOUND_CASES += (("llamacpp", 8192, "unlisted"),)
# Issue 44's 1.3x model behind an OpenAI-compatible API: no window published, the valve's cap, a saved chat over the
# window at 1:1, no ratio known on the worker (the first request is refused; the next must fit in the model's tokens)
REJECTING = dict(window=16384, cap=15000, ratio=1.3, saved=16, growth=1.0)
TRAINED = 131072
_WORDS = (
    "alpha budget cache deploy engine filter gateway handler index journal kernel ledger metric network option "
    "parser queue record schema token update vector window yield zone archive backlog cluster dataset export"
).split()


def words(count: int, seed: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i * 13) % len(_WORDS)] for i in range(count))


def user_text(n: int, tokens: int) -> str:
    """A user message of about ``tokens`` cl100k tokens carrying the fact MK-<n>."""
    head = f"MK-{n} is fact number {n}; please keep it in mind. "
    return head + words(max(1, tokens - count_tokens([{"role": "user", "content": head}]) - 4), n)


class MemoryStore(acc.EphemeralSummaries, acc.NullStore):
    """Summaries and leases in memory, with the lease protocol of the filter's own store, and its records of the
    requests sent (a failed reply's error teaches only where the filter recorded sending it)."""

    def __init__(self):
        super().__init__()
        self.sent: dict = {}

    def hold(self, scope, holder, ttl=acc.LEASE_TTL, renew_every=acc.LEASE_RENEW):
        return acc.LeaseHold(self, scope, holder, ttl, renew_every)

    async def record_sent(self, request) -> None:
        self.sent[request.reply_id] = request

    async def read_sent(self, reply_id: str):
        return self.sent.get(reply_id)

    async def forget_sent(self, reply_id: str) -> None:
        self.sent.pop(reply_id, None)


def open_webui_chats(chats: dict) -> None:
    """Open WebUI's ``Chats`` as ``acc.failed_reply`` reads it: each chat's messages by id, each the next one's
    parent, a failed reply holding the provider's error as Open WebUI saves it (``{"error": {"content": ...}}``)."""

    class Chats:
        @staticmethod
        async def get_messages_map_by_chat_id(chat_id):
            stored, parent, kept = chats.get(chat_id) or [], None, {}
            for message in stored:
                kept[message["id"]] = {**message, "parentId": parent}
                parent = message["id"]
            return kept

    for name in ("open_webui", "open_webui.models"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["open_webui.models.chats"] = types.SimpleNamespace(Chats=Chats)


class Summarizer:
    """Repeats every fact it is shown (the previous summary's and the new text's), a line of ~20 tokens each."""

    def __init__(self):
        self.calls = 0
        self.down = False

    async def __call__(self, request, user, model, messages, max_tokens, temperature, **extra):
        self.calls += 1
        if self.down:
            raise RuntimeError("the summarizer is down")
        facts = dict.fromkeys(FACT.findall(" ".join(str(m.get("content")) for m in messages[1:])))
        return "Running summary:\n" + "\n".join(f"- {f}: the user noted {words(12, len(f))}." for f in facts)


@dataclass
class Outcome:
    backend: str
    window: int
    turns: int = 0
    requests: int = 0
    cut: list = field(default_factory=list)  # turns (1-based) whose request lost messages or was refused
    lost: list = field(default_factory=list)  # turns whose request missed a fact of its branch
    summaries: int = 0  # summaries written (a fold may take several summarizer calls)
    calls: int = 0  # summarizer calls
    calls_per_turn: list = field(default_factory=list)  # summarizer calls after each turn's reply
    saved_after: list = field(default_factory=list)  # the turn after which each summary was saved
    largest: int = 0  # the largest prompt in the model's tokens
    lines: list = field(default_factory=list)  # status lines said


def _post(url: str, body: dict) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@dataclass(frozen=True)
class Scenario:
    """How the model counts and where its window is found: ``found`` "settings" (``num_ctx`` in the request, as Open
    WebUI sends a model's params), "served" (asked of the server: Ollama lists the model in ``/api/ps`` once loaded),
    "unlisted" (the server answers none of the asks: Ollama with ``keep_alive`` 0, llama-server without ``/props``);
    ``saved``: turns stored before the filter first sees the chat; ``cap``: the ``max_context_tokens`` valve (0: the
    default); ``summarizer_down``: every summarizer call fails."""

    ratio: float = 1.0
    per_message: int = 0
    found: str = "settings"
    saved: int = 0
    cap: int = 0  # max_context_tokens, 0 = the default
    summarizer_down: bool = False


async def run_case(
    backend: str, window: int, turn_tokens: int, growth: float, scenario: Scenario = Scenario()
) -> Outcome:
    counting = dict(trained=TRAINED, ratio=scenario.ratio, per_message=scenario.per_message)
    if backend == "openai":  # vLLM's refusal of a prompt over the window, naming both sizes
        spec = ModelSpec(window=window, on_overflow="reject", ratio=scenario.ratio, per_message=scenario.per_message)
    else:
        spec = ollama_spec(window, **counting) if backend == "ollama" else llamacpp_spec(window, **counting)
    provider = FakeProvider(mode="strict", chat_models=(), summary_models=(SUMMARY_MODEL,), model_specs={MODEL: spec})
    provider.start()
    if scenario.found == "unlisted":
        provider.configure(probes_off="all")
    connection = acc.owui_connection

    async def fake_connection(request, kind, index):  # the connection Open WebUI holds for the model
        return (provider.root_url if kind == "ollama" else provider.base_url), "", {}

    acc.owui_connection = fake_connection
    try:
        return await _chat(provider, backend, window, turn_tokens, growth, scenario)
    finally:
        acc.owui_connection = connection
        provider.stop()


async def _chat(
    provider: FakeProvider, backend: str, window: int, turn_tokens: int, growth: float, scenario: Scenario
) -> Outcome:
    f = acc.Filter()
    f.valves.summary_model = SUMMARY_MODEL
    f.summaries.store = MemoryStore()
    f.summaries.complete = summarizer = Summarizer()
    if scenario.cap:
        f.valves.max_context_tokens = scenario.cap
    if scenario.summarizer_down:
        summarizer.down = True
    if not wait_ready(f.counter, "cl100k_base", 60):
        raise SystemExit("cl100k_base could not be loaded offline")
    if backend == "ollama":  # no params: Open WebUI strips them
        model = {"id": MODEL, "owned_by": "ollama", "ollama": {"model": MODEL, "urls": [0]}}
    elif backend == "openai":  # publishes no window
        model = {"id": MODEL, "urlIdx": 0, "openai": {"id": MODEL, "object": "model"}}
    else:
        model = {"id": MODEL, "urlIdx": 0, "openai": {"id": MODEL, "meta": {"n_ctx_train": TRAINED}}}
    asks = scenario.found != "settings"  # the filter may ask the model's server through Open WebUI's connection
    chat_id = f"bench-{backend}-{window}"
    meta_base = {"chat_id": chat_id}
    out = Outcome(backend, window)
    events: list = []

    async def emit(event):
        if event.get("type") == "status":
            events.append(event["data"]["description"])

    stored = [
        {"id": "u0", "role": "user", "content": "Hello! MK-0 is the project's name."},
        {"id": "a0", "role": "assistant", "content": "Hello, noted."},
    ]
    for k in range(1, scenario.saved + 1):  # the chat as it was before the filter was installed
        stored += [
            {"id": f"su{k}", "role": "user", "content": user_text(1000 + k, turn_tokens)},
            {"id": f"sa{k}", "role": "assistant", "content": "Noted."},
        ]
    open_webui_chats({chat_id: stored})
    typed, n = 0, 0
    while typed < growth * window:
        n += 1
        text = user_text(n, turn_tokens)
        typed += count_tokens([{"role": "user", "content": text}])
        stored.append({"id": f"u{n}", "role": "user", "content": text})
        sent = [SYSTEM] + [{"role": m["role"], "content": m["content"]} for m in stored if not m.get("failed")]
        meta = {**meta_base, "message_id": f"a{n}", "user_message_id": f"u{n}"}
        body = {"model": MODEL, "messages": sent, "stream": False}
        if backend == "ollama" and not asks:
            body["options"] = {"num_ctx": window}
        hooks = dict(__user__=dict(USER), __metadata__=meta, __event_emitter__=emit, __model__=model)
        if asks:
            hooks["__request__"] = object()
        body = await f.inlet(body, **hooks, __chat_id__=chat_id)
        body = await f.request(body, **hooks, __chat_id__=chat_id)
        await f.wait_for_background(10)
        expected = {fact for m in stored if not m.get("failed") for fact in FACT.findall(m["content"])}
        carried = set(FACT.findall(json.dumps(body["messages"])))
        url = provider.root_url + ("/api/chat" if backend == "ollama" else "/v1/chat/completions")
        status, answer = await asyncio.to_thread(_post, url, body)
        logged = provider.requests[-1]
        out.requests += 1
        out.largest = max(out.largest, logged["model_tokens"] or 0)
        if logged["cut"] or logged["rejected"]:
            out.cut.append(n)
        if expected - carried:
            out.lost.append(n)
        if status != 200:
            error = {"content": answer.get("error", answer)}  # as Open WebUI saves the provider's rejection
            stored.append({"id": f"a{n}", "role": "assistant", "content": "", "failed": True, "error": error})
            continue
        if backend == "ollama":
            reply, reported = answer["message"]["content"], answer["prompt_eval_count"]
            usage = {
                "prompt_tokens": reported,
                "prompt_eval_count": reported,
                "completion_tokens": answer["eval_count"],
            }
        else:
            reply, usage = answer["choices"][0]["message"]["content"], answer["usage"]
        stored.append({"id": f"a{n}", "role": "assistant", "content": reply, "usage": usage})
        before = summarizer.calls
        outlet = {"id": f"a{n}", "chat_id": chat_id, "model": MODEL, "messages": [dict(m) for m in stored]}
        await f.outlet(outlet, **hooks)
        await f.wait_for_background(30)  # the user reads the reply: a summary it started is saved first
        out.calls_per_turn.append(summarizer.calls - before)
        if summarizer.calls > before:
            out.saved_after.append(n)
    out.turns, out.summaries, out.calls, out.lines = n, len(out.saved_after), summarizer.calls, events
    return out


def _shortest_gap(saved_after: list, turns: int) -> int:
    """The fewest turns between two summaries (the first one's gap is not counted: it folds the chat's start)."""
    return min((b - a for a, b in zip(saved_after, saved_after[1:])), default=turns)


def calls_per_turn_from(out: Outcome, turn: int = 8) -> float:
    """Summarizer calls per turn from the ``turn``-th on (issue 44: the cadence once the chat runs at its window)."""
    later = out.calls_per_turn[turn - 1 :]
    return sum(later) / len(later) if later else 0.0


def _print_table(cases, args, scenario_of) -> bool:
    head = f"{'backend':<10}{'window':>7}{'found':>10}{'turns':>6}{'cut/rej':>8}{'after 1st':>10}{'facts seen':>12}"
    print(head + f"{'summaries/turn':>15}{'calls/turn 8+':>14}{'min gap':>8}{'largest':>9}")
    lost = False
    for backend, window, *found in cases:
        scenario = scenario_of(found[0] if found else "settings")
        out = asyncio.run(run_case(backend, window, args.turn_tokens, args.growth, scenario))
        later = [t for t in out.cut if t > 1]
        seen = f"{out.requests - len(out.lost)}/{out.requests}"
        row = f"{out.backend:<10}{out.window:>7}{scenario.found:>10}{out.turns:>6}{len(out.cut):>8}{len(later):>10}"
        gap = _shortest_gap(out.saved_after, out.turns)
        row += f"{seen:>12}{out.summaries / out.turns:>15.2f}{calls_per_turn_from(out):>14.2f}"
        print(row + f"{gap:>8}{out.largest:>9}")
        if args.lines:
            print("    " + "\n    ".join(out.lines))
        lost |= bool([t for t in out.lost if t > 1])
    return lost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turn-tokens", type=int, default=1200, help="tokens per user turn (default 1200)")
    ap.add_argument("--growth", type=float, default=5.0, help="what the user types, in windows (default 5)")
    ap.add_argument("--ratio", type=float, default=1.1, help="the model's tokens per cl100k token (default 1.1)")
    ap.add_argument("--per-message", type=int, default=4, help="its template's tokens per message (default 4)")
    ap.add_argument("--saved", type=int, default=4, help="turns saved before the filter saw the chat (default 4)")
    ap.add_argument("--lines", action="store_true", help="print the status lines of each chat")
    args = ap.parse_args(argv)
    print(f"turns of ~{args.turn_tokens} tokens, chats growing to {args.growth:g}x the window; default valves")
    print("\n1. num_ctx set in the model's params (Open WebUI sends it), the fake's tokenizer, no saved turns")
    lost = _print_table(CASES, args, lambda found: Scenario())
    counting = f"{args.ratio:g}x cl100k + {args.per_message} per message, {args.saved} saved turns"
    print(f"\n2. the window found as the product finds it (issue 44): {counting}")
    lost |= _print_table(FOUND_CASES, args, lambda found: Scenario(args.ratio, args.per_message, found, args.saved))
    print("\n3. a 1.3x model behind an OpenAI-compatible API: 16,384 window (published nowhere), cap 15,000, a saved")
    print("   chat over the window, no ratio known on the worker, the summarizer down (issue 44)")
    rejected = rejecting_case(args.turn_tokens)
    print(
        f"   requests {rejected.requests}, rejected {len(rejected.cut)} (turns {rejected.cut}), largest "
        f"{rejected.largest} model tokens"
    )
    return 1 if lost or len(rejected.cut) > 1 else 0


def rejecting_case(turn_tokens: int = 1200) -> Outcome:
    """REJECTING, run as the product runs (the rejection stored on the failed reply, read by the next turn)."""
    case = dict(REJECTING)
    scenario = Scenario(case.pop("ratio"), 0, "unlisted", case.pop("saved"), case.pop("cap"), summarizer_down=True)
    return asyncio.run(run_case("openai", case["window"], turn_tokens, case["growth"], scenario))


if __name__ == "__main__":
    raise SystemExit(main())
