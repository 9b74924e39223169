"""The filter as a person sees it: a real browser (Debian's Chromium, driven by
Playwright for Python) on the session's Open WebUI with the demo's valves.

It logs in through the page, chats with the default (native) function
calling, so Open WebUI attaches its built-in tool schemas after inlet, and
reads what the page shows under each reply:

* the status line's token figure equals what the fake provider received
  (messages and tool schemas), within the rounding of the figure;
* past the threshold a background summary is announced and later replies say
  how many messages the summary covers;
* the user's own switch (UserValves ``show_status`` off) hides every line,
  the background ones included;
* with the UI in Chinese the line is in Chinese;
* ``/summarize keep the budget and the dates`` yields a summary, under its
  reply, that shows every message its title counts and keeps what was named
  (the demo's extractive fake summarizer), unseen by the chat model.

Chromium comes from Debian's ``chromium`` package (scripts/test.sh installs it
where it can); Playwright's own browser download is never used. Where Chromium
cannot be installed, these tests are skipped and say so.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

import pytest
from e2e_support import CHROMIUM, CHROMIUM_ARGS, E2E_VALVES, FILTER_ID, new_marker, text_of, user_text

from devkit.demo import DEMO_VALVES
from devkit.fake_provider import count_tokens
from devkit.openwebui import OpenWebUIClient

pytestmark = [
    pytest.mark.e2e,
    # decided before any server starts: where Chromium cannot be installed, say so and start nothing
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason="Chromium is not installed at /usr/bin/chromium (or $ACC_CHROMIUM) and could not be installed "
        "here: scripts/test.sh runs `apt-get install chromium` where it has root or sudo. The real-browser "
        "test needs Debian's chromium package; it never downloads a browser.",
    ),
]

CHAT_MODEL = "fake-chat"
VALVES = {**DEMO_VALVES, "summary_timeout_seconds": 30}
TURN_WORDS = 300  # ~400 tokens a user message: a summary after about five turns


# ---------------------------------------------------------------------------
# The wording of the status line: the one place this test knows it.
# ---------------------------------------------------------------------------
class StatusText:
    """Patterns of the filter's status texts as the page shows them."""

    SENT = {
        "en": re.compile(r"(?P<used>\d+(?:\.\d)?k?) / (?P<cap>\d+(?:\.\d)?k?) tokens sent"),
        "zh": re.compile(r"已发送 (?P<used>\d+(?:\.\d)?k?) / (?P<cap>\d+(?:\.\d)?k?) tokens"),
    }
    COVERS = {"en": re.compile(r"summary covers (\d+) messages?"), "zh": re.compile(r"摘要涵盖 (\d+) 条消息")}
    UPDATED = {
        "en": re.compile(r"Summary updated: covers (\d+) messages?"),
        "zh": re.compile(r"摘要已更新：涵盖 (\d+) 条消息"),
    }
    SUMMARIZING = {"en": re.compile(r"Summarizing \d+ messages? in the background"), "zh": re.compile(r"正在后台摘要")}

    @classmethod
    def any_line(cls, text: str) -> bool:
        return any(p[lang].search(text) for p in (cls.SENT, cls.COVERS, cls.UPDATED, cls.SUMMARIZING) for lang in p)


def shown_tokens(figure: str) -> tuple[float, float]:
    """A figure as the line shows it ("812", "6.9k", "12k") -> (tokens, half its rounding step)."""
    if figure.endswith("k"):
        number = figure[:-1]
        step = 100 if "." in number else 1000
        return float(number) * 1000, step / 2
    return float(figure), 0.5


# ---------------------------------------------------------------------------
# The browser
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chromium():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"Chromium is not installed at {CHROMIUM} and could not be installed here "
            "(scripts/test.sh runs `apt-get install chromium` where it has root or sudo); "
            "the real-browser test needs Debian's chromium package"
        )
    from playwright.sync_api import sync_playwright  # in requirements-dev.txt: missing is an error

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class WebUser:
    email: str
    password: str
    client: OpenWebUIClient


@pytest.fixture(scope="module")
def web_user(admin, owui_server):
    """An account of its own (an admin, so it sees the models), so its language
    and user valves touch no other test."""
    email = f"browser-{secrets.token_hex(3)}@example.com"
    password = "Browser-" + secrets.token_urlsafe(9)
    admin.post("/api/v1/auths/add", {"name": "Browser User", "email": email, "password": password, "role": "admin"})
    client = OpenWebUIClient(owui_server.base_url, timeout=180)
    client.signin(email, password)
    client.post("/api/v1/users/user/settings/update", {"ui": {"showChangelog": False}})
    return WebUser(email, password, client)


@pytest.fixture
def demo(acc, provider, web_user):
    """The demo's valves on the session filter; the user's own switches at their defaults."""
    acc.set_valves(FILTER_ID, dict(VALVES))
    web_user.client.post(f"/api/v1/functions/id/{FILTER_ID}/valves/user/update", {"show_status": True})
    yield acc
    web_user.client.post(f"/api/v1/functions/id/{FILTER_ID}/valves/user/update", {"show_status": True})
    acc.set_valves(FILTER_ID, dict(E2E_VALVES))  # the suite's valves again for tests that do not reset them


class ChatPage:
    """One browser tab, logged in through the page, chatting in one new chat."""

    def __init__(self, browser, base_url: str, user: WebUser, provider, locale: str = "en-US") -> None:
        self.provider = provider
        self.lang = "zh" if locale.startswith("zh") else "en"
        self.context = browser.new_context(viewport={"width": 1100, "height": 1000})
        # the UI language; the page also sends it to the server as {{USER_LANGUAGE}}
        self.context.add_init_script(f"localStorage.setItem('locale', {json.dumps(locale)})")
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        page = self.page
        page.goto(base_url + "/auth", wait_until="domcontentloaded")
        page.fill("input[type=email]", user.email)
        page.fill("input[type=password]", user.password)
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/auth" not in url, timeout=90_000)
        page.goto(f"{base_url}/?models={CHAT_MODEL}", wait_until="domcontentloaded")
        page.locator("#chat-input").wait_for(state="visible", timeout=90_000)
        self.rng = random.Random(7)

    def close(self) -> None:
        self.context.close()

    def send(self, words: int = TURN_WORDS, text: str = "") -> dict:
        """Type one message (``text`` after a marker, else ``words`` of filler), wait for the reply; returns the chat
        request the provider received for it."""
        marker = new_marker()
        self.type_and_enter(f"{marker} {text}" if text else user_text(marker, self.rng, words))
        req = wait_until(lambda: self._request_for(marker), 120, f"the chat request for {marker}")
        expected = f"[fake-chat] {len(req['messages'])} messages"
        wait_until(lambda: expected in self.last_reply_text(), 60, f"the reply '{expected}' on the page")
        return req

    def type_and_enter(self, text: str) -> None:
        """Enter the text the way a person does: again if the page moved the focus away before the key landed
        (a dialog that just closed hands the focus back to its opener a moment later)."""
        box = self.page.locator("#chat-input")
        box.fill(text)
        key = text.split()[0]
        pressed = [-1e9]

        def taken() -> bool:
            if key not in box.inner_text():
                return True
            if time.monotonic() - pressed[0] > 5:  # a slow page must not get the same text twice
                self.close_dialogs()  # an Enter that landed on the opener opened its dialog again
                box.press("Enter")
                pressed[0] = time.monotonic()
            return False

        wait_until(taken, 30, f"the chat input to take '{key}'")

    def close_dialogs(self) -> None:
        while self.page.locator(".modal").count():
            self.page.keyboard.press("Escape")
            self.page.locator(".modal").last.wait_for(state="detached", timeout=10_000)

    def _request_for(self, marker: str) -> Optional[dict]:
        for req in reversed(self.provider.requests):
            msgs = req.get("messages") or []
            last = msgs[-1] if msgs and isinstance(msgs[-1], dict) else {}
            if (
                req["kind"] == "chat"
                and req["status"] is not None
                and last.get("role") == "user"
                and text_of(last.get("content")).startswith(marker)
            ):
                assert req["status"] == 200, req.get("error")
                return req
        return None

    def last_reply(self):
        return self.page.locator(".chat-assistant").last

    def last_reply_text(self) -> str:
        try:
            return self.last_reply().inner_text(timeout=2_000)
        except Exception:
            return ""

    def reply_status_lines(self) -> list:
        """Every status line of the latest reply, its history opened when it has one."""
        reply = self.last_reply()
        toggle = reply.locator("button[aria-label='Toggle status history']")
        if toggle.count() and toggle.first.get_attribute("aria-expanded") == "false":
            toggle.first.click()
            self.page.wait_for_timeout(300)
        return [line for line in reply.inner_text().splitlines() if StatusText.any_line(line)]

    def all_text(self) -> str:
        return self.page.locator("body").inner_text()


def wait_until(probe, deadline: float, what: str):
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}")
        time.sleep(0.25)


def received_tokens(req: dict) -> int:
    """What the provider received, counted on its side: the messages the OpenAI
    way plus the tool schemas as JSON text."""
    from devkit.fake_provider import _get_encoder

    tools = req.get("tools")
    tools_text = json.dumps(tools, ensure_ascii=False) if tools else ""
    encoder = _get_encoder()
    tool_tokens = len(encoder.encode(tools_text)) if encoder is not None else len(tools_text) // 4
    return count_tokens(req["messages"]) + tool_tokens


def check_figure(line: str, req: dict, lang: str) -> int:
    """The real assertion: the status line's figure is what was sent, tools included."""
    m = StatusText.SENT[lang].search(line)
    assert m, f"no '… tokens sent' figure in {line!r}"
    used, rounding = shown_tokens(m.group("used"))
    cap, _ = shown_tokens(m.group("cap"))
    assert cap == VALVES["max_context_tokens"], line
    received = received_tokens(req)
    tolerance = rounding + max(40, 0.02 * received)
    assert abs(used - received) <= tolerance, (
        f"the status line says {m.group('used')} tokens were sent; the provider received {received} "
        f"({count_tokens(req['messages'])} in messages, {len(req.get('tools') or [])} tool schemas)"
    )
    assert received <= VALVES["max_context_tokens"], f"{received} tokens sent over the cap"
    return received


def summaries_done(provider, since: int) -> list:
    return [r for r in provider.requests[since:] if r["kind"] == "summary" and r["status"] == 200]


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------
def test_browser_status_line_tells_what_was_sent_and_summarized(chromium, demo, provider, owui_server, web_user):
    start = len(provider.requests)
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider)
    try:
        seen_tools = False
        covered_line = None
        for turn in range(1, 10):
            req = chat.send()
            seen_tools = seen_tools or bool(req.get("tools"))
            lines = wait_until(
                lambda: [x for x in chat.reply_status_lines() if StatusText.SENT["en"].search(x)],
                30,
                f"the status line of turn {turn}",
            )
            received = check_figure(lines[-1], req, "en")
            print(f"turn {turn}: page {lines[-1]!r}; provider received {received}")
            if StatusText.COVERS["en"].search(lines[-1]):
                covered_line = lines[-1]
                assert "<conversation_summary" in json.dumps(req["messages"]), "the line says summary, none was sent"
                break
            if summaries_done(provider, start):
                # the background lines are shown on the reply whose outlet started them
                updated = wait_until(
                    lambda: [x for x in chat.reply_status_lines() if StatusText.UPDATED["en"].search(x)],
                    60,
                    "'Summary updated: covers N messages' on the page",
                )
                print(f"turn {turn}: page {updated[-1]!r}")
        assert seen_tools, "no request carried Open WebUI's built-in tool schemas: native function calling was not used"
        assert covered_line, "no reply said 'summary covers N messages' within 9 turns"
        covers = int(StatusText.COVERS["en"].search(covered_line).group(1))
        assert covers >= 1
    finally:
        chat.close()


def test_browser_user_switch_hides_every_line(chromium, demo, provider, owui_server, web_user):
    web_user.client.post(f"/api/v1/functions/id/{FILTER_ID}/valves/user/update", {"show_status": False})
    start = len(provider.requests)
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider)
    try:
        for _ in range(1, 10):
            chat.send()
            if summaries_done(provider, start):
                break
        assert summaries_done(provider, start), "no background summary was made: the test proves nothing"
        chat.send()  # a request that uses the summary
        time.sleep(2)  # room for any late background line
        text = chat.all_text()
        assert chat.page.locator(".status-description").count() == 0, text[-2000:]
        assert not StatusText.any_line(text), text[-2000:]
        assert chat.page.get_by_role("button", name=SOURCES_TOGGLE).count() == 0, "the summary was shown"
    finally:
        chat.close()


def test_browser_chinese_ui_shows_the_chinese_line(chromium, demo, provider, owui_server, web_user):
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider, locale="zh-CN")
    try:
        req = chat.send()
        lines = wait_until(
            lambda: [x for x in chat.reply_status_lines() if StatusText.SENT["zh"].search(x)],
            30,
            "the Chinese status line",
        )
        check_figure(lines[-1], req, "zh")
        assert "tokens sent" not in chat.last_reply_text()
    finally:
        chat.close()


# ---------------------------------------------------------------------------
# The summary itself, under the reply after which it was written (issue 20)
# ---------------------------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES_TOGGLE = re.compile(r"^(Toggle \d+ sources?|展开.收起 \d+ 个来源)$")  # aria-label, en / zh-CN
SUMMARY_ENTRY = {
    "en": re.compile(r"Conversation summary \((\d+) messages?\)"),
    "zh": re.compile(r"对话摘要（(\d+) 条消息）"),
}


def summary_reply(chat: ChatPage, deadline: float = 60):
    """The latest reply with a sources chip and the summary's status line. The summary's reply may be one before the
    last, and a later reply may carry a chip of its own: recall's (issue 36), quoting what the summary left out."""

    def probe():
        replies = chat.page.locator(".chat-assistant")
        for i in range(replies.count() - 1, -1, -1):
            reply = replies.nth(i)
            if reply.get_by_role("button", name=SOURCES_TOGGLE).count() and any(
                p.search(reply.inner_text()) for p in StatusText.UPDATED.values()
            ):
                return reply
        return None

    return wait_until(probe, deadline, "a sources chip under the summary's reply")


def open_summary(chat: ChatPage, reply) -> str:
    """Open the summary the way a person does: the sources chip under the reply,
    then the summary's entry; returns the text the page shows in the dialog."""
    toggle = reply.get_by_role("button", name=SOURCES_TOGGLE).first
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
    entry = reply.locator("button[id^='source-']").filter(has_text=SUMMARY_ENTRY[chat.lang])
    wait_until(lambda: entry.count() > 0, 10, "the summary's entry in the sources list")
    entry.last.click()
    dialog = chat.page.locator(".modal").last
    dialog.wait_for(state="visible", timeout=10_000)
    chat.page.wait_for_timeout(500)  # the Markdown renders
    return dialog.inner_text()


def summaries_of(provider, since: int, marker: str) -> list:
    """This chat's summaries (their prompt holds the marker of one of its messages)."""
    return [r for r in summaries_done(provider, since) if marker in json.dumps(r["messages"], ensure_ascii=False)]


def first_marker(req: dict) -> str:
    return text_of(req["messages"][-1]["content"]).split()[0]


def has_chinese_font() -> bool:
    found = shutil.which("fc-list") and subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True)
    return bool(found and found.stdout.strip())


def shot(chat: ChatPage, name: str) -> None:
    """The page as the docs show it; a Chinese page only where a Chinese font is installed (without one, Chromium
    draws every character as a box, and the committed image stays)."""
    if chat.lang == "zh" and not has_chinese_font():
        print(f"screenshot {name} ({chat.lang}) not taken: no Chinese font here (Debian: fonts-wqy-microhei)")
        return
    path = os.path.join(REPO, "docs", chat.lang, "img", name)
    chat.page.screenshot(path=path)
    print(f"screenshot {path}")


def folded_markers(summary_req: dict) -> set:
    text = "\n".join(text_of(m.get("content")) for m in summary_req.get("messages") or [] if isinstance(m, dict))
    return set(re.findall(r"\bMK-[A-Za-z0-9]+\b", text.split("New messages to fold in:", 1)[-1]))


def test_browser_summary_is_shown_under_its_reply(chromium, demo, provider, owui_server, web_user):
    provider.configure(summary_format="extractive")  # the demo's summarizer: the guide shows this page
    start = len(provider.requests)
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider)
    try:
        chat.send()  # the first message stays verbatim (keep_first): the second one's marker names this chat
        marker = first_marker(chat.send())
        for _ in range(9):
            if summaries_of(provider, start, marker):
                break
            chat.send()
        made = wait_until(lambda: summaries_of(provider, start, marker), 60, "a background summary of this chat")
        reply = summary_reply(chat)
        updated = [x for x in reply.inner_text().splitlines() if StatusText.UPDATED["en"].search(x)]
        text = open_summary(chat, reply)
        shot(chat, "summary-open.png")
        name = SUMMARY_ENTRY["en"].search(text)
        assert name, text[:300]
        assert name.group(1) == StatusText.UPDATED["en"].search(updated[-1]).group(1)
        assert f"Summary of {name.group(1)} messages." in text, text[:300]  # what the title counts, the text holds
        missing = folded_markers(made[-1]) - set(re.findall(r"\bMK-[A-Za-z0-9]+\b", text))
        assert not missing, f"facts the summary folded are not readable on the page: {sorted(missing)[:5]}"
        # ... and what the page shows never reaches the model
        chat.close_dialogs()
        req = chat.send()
        assert not SUMMARY_ENTRY["en"].search(json.dumps(req["messages"], ensure_ascii=False))
    finally:
        provider.configure(summary_format=None)
        chat.close()


def test_browser_summarize_command_in_chinese(chromium, demo, provider, owui_server, web_user):
    """/summarize asks for a summary now, below every threshold; the zh UI shows it in Chinese."""
    provider.configure(summary_format="extractive")  # the demo's summarizer: the guide shows this page
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider, locale="zh-CN")
    try:
        chat.send(words=60)
        marker = first_marker(chat.send(words=60))  # the first message stays verbatim (keep_first)
        chat.send(words=60)
        start = len(provider.requests)
        time.sleep(2)  # room for a background summary, which these short turns must not need
        assert not summaries_of(provider, 0, marker), "a summary came before /summarize: the test proves nothing"
        chat.page.locator("#chat-input").fill("/summarize")
        chat.page.keyboard.press("Enter")
        asked = wait_until(
            lambda: [
                r
                for r in provider.requests[start:]
                if r["kind"] == "chat" and "The user typed /summarize" in json.dumps(r.get("messages"))
            ],
            60,
            "the model's request for the /summarize turn",
        )
        last = asked[-1]["messages"][-1]
        assert last["role"] == "user" and text_of(last["content"]).startswith("[The user typed /summarize")
        made = wait_until(lambda: summaries_of(provider, start, marker), 90, "the summary asked for")
        text = open_summary(chat, summary_reply(chat, 90))
        shot(chat, "summary-open.png")
        assert SUMMARY_ENTRY["zh"].search(text), text[:300]
        missing = folded_markers(made[-1]) - set(re.findall(r"\bMK-[A-Za-z0-9]+\b", text))
        assert not missing, sorted(missing)[:5]
    finally:
        provider.configure(summary_format=None)
        chat.close()


# ---------------------------------------------------------------------------
# The user steers the summary: /summarize <instructions> (issue 31)
# ---------------------------------------------------------------------------
OFFSITE = (
    "We are planning the Lisbon offsite for 14 people.",
    "The budget is 18,000 euros in total, travel included.",
    "The dates are 12 to 14 May; we arrive on Tuesday.",
    "Marta from finance approves every booking over 500 euros.",
)
ASKED = "keep the budget and the dates"


def test_browser_summarize_with_instructions_shows_a_summary_that_keeps_them(
    chromium, demo, provider, owui_server, web_user
):
    """The demo's fake summarizer writes a line per message it folds: the summary under the reply shows every message
    its title counts, and the sentences the instructions name; the chat model never sees the instructions."""
    provider.configure(summary_format="extractive")  # the demo's summarizer (the suite's provider is strict)
    chat = ChatPage(chromium, owui_server.base_url, web_user, provider)
    try:
        for text in OFFSITE:
            chat.send(text=text)
        start = len(provider.requests)
        chat.type_and_enter(f"/summarize {ASKED}")
        made = wait_until(lambda: summaries_done(provider, start), 90, "the summary asked for")
        assert f"<user_instructions>\n{ASKED}\n</user_instructions>" in text_of(made[-1]["messages"][-1]["content"])
        reply = summary_reply(chat, 90)
        text = open_summary(chat, reply)
        dialog = chat.page.locator(".modal").last
        shot(chat, "summary-instructions.png")
        covers = int(SUMMARY_ENTRY["en"].search(text).group(1))
        # what the title counts is what the text shows: a numbered line per message (a list once rendered)
        assert f"Summary of {covers} messages." in text, text[:400]
        shown = max(dialog.locator("ol > li").count(), len(re.findall(r"(?m)^\d+\. ", text)))
        assert shown == covers, f"the summary of {covers} messages shows {shown}: {text[:600]}"
        assert "Kept as asked" in text and OFFSITE[1] in text and OFFSITE[2] in text, text[:800]
        # Open WebUI's own title and tag tasks (no filter runs on them) quote the chat as typed: not a chat turn
        chats = [r for r in provider.requests[start:] if r["kind"] == "chat" and "<chat_history>" not in str(r)]
        assert chats and not any(ASKED in json.dumps(r["messages"]) for r in chats), "the chat model saw them"
        assert text_of(chats[0]["messages"][-1]["content"]).startswith("[The user typed /summarize")
    finally:
        provider.configure(summary_format=None)
        chat.close()
