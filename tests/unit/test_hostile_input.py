"""No input is superlinear (issue 42): one hostile message must not freeze a worker for everyone.

Every compiled pattern of the module (found by introspection, so a new one is covered), then ``Filter.inlet`` and
``outlet``, run on hostile texts of 200 KB: each tag or prefix the module looks for repeated and never closed, long
runs of spaces after an opening, nesting, all of them mixed; in user messages and in model replies (content and
reasoning), with a chat and without one (API calls). A linear pass over 200 KB takes a few ms; the bounds (100 ms a
call, 50 ms the event loop's longest stall) leave a wide margin for a loaded CI machine, and the quadratic patterns
of 1.5.0 take seconds to minutes on these texts. A call that runs past ``GUARD`` seconds is stopped (the regex
engine checks signals), so the battery fails quickly on such code instead of hanging.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import re
import signal
import time
from contextlib import asynccontextmanager, contextmanager
from functools import partial

import pytest
from acc_builders import AS, RecordStore, S, U, make_filter

import async_context_compression as acc

SIZE = 200_000
CALL_BOUND = 0.1  # seconds a call may take
STALL_BOUND = 0.05  # seconds the event loop may go without running a ready task
GUARD = 2.0  # seconds after which a call is stopped (it has failed long before)
UNITS = (
    "<think>",
    "<thinking>",
    "<reasoning>",
    "<THINK>",
    '<details type="reasoning"',
    "</think>",
    "</details>",
    "<conversation_summary",
    "<recalled_context",
    "<user_instructions",
    "<",
    "</",
    "< /",
    "/summarize",
    "/总结",
    ":",
    "a:",
    "1:",
    "a-",
    "1,",
    "1.",
    "v1",
    "\n",
    "\n ",
    "data:",
    "a",
    "1",
    "中",
    "ก",
    "maximum context length is 1",
    "gpt-4o",
)


def _sized(text: str) -> str:
    return (text * (SIZE // len(text) + 1))[:SIZE]


def hostile_texts() -> dict:
    texts = {f"{unit!r} repeated": _sized(unit) for unit in UNITS}
    for unit in ("<", "</", "<think>", "<user_instructions", "<conversation_summary", "/summarize", "a", "\n"):
        texts[f"{unit!r} then spaces"] = unit + " " * (SIZE - len(unit) - 1) + "x"
    texts["spaces then x"] = " " * (SIZE - 1) + "x"
    texts["nested <think>"] = "<think>" * (SIZE // 16) + "</think>" * (SIZE // 16)
    texts["mixed"] = _sized("".join(UNITS))
    return texts


HOSTILE = hostile_texts()


class TooSlow(BaseException):
    """Raised from a signal inside a call that ran past GUARD (not an Exception: the filter catches those)."""


@contextmanager
def guard(seconds: float = GUARD):
    def stop(signum, frame):
        raise TooSlow(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timed(call) -> float:
    """CPU seconds ``call()`` took (what it costs, whatever else the machine runs), the best of two runs (the second
    is skipped when the first is within the bound)."""
    best = float("inf")
    for _ in range(2):
        start = time.thread_time()
        try:
            with guard():
                call()
        except TooSlow:
            return GUARD
        best = min(best, time.thread_time() - start)
        if best <= CALL_BOUND:
            break
    return best


def module_patterns() -> dict:
    """Every compiled pattern of the module: its globals and its classes' attributes, alone or in a tuple, list or
    dict."""
    found = {}

    def add(name, value):
        if isinstance(value, re.Pattern):
            found[name] = value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                add(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                add(f"{name}[{key!r}]", item)

    for name, value in vars(acc).items():
        add(name, value)
        if isinstance(value, type) and value.__module__ == acc.__name__:
            for attribute, item in vars(value).items():
                add(f"{name}.{attribute}", item)
    return found


def test_every_pattern_of_the_module_is_one_introspection_finds():
    """A pattern compiled inside a function, or a text pattern passed to ``re.search`` and the like, would escape
    the battery below: the module compiles its patterns once, at module or class level."""
    tree = ast.parse(inspect.getsource(acc))
    inline, in_functions = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_functions += [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call) and _re_call(n) == "compile"]
        if isinstance(node, ast.Call) and _re_call(node) not in (None, "compile", "escape"):
            inline.append(node.lineno)
    assert not inline and not in_functions, f"patterns outside module constants at lines {inline + in_functions}"
    assert len(module_patterns()) >= 20


def _re_call(node: ast.Call):
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "re":
        return func.attr
    return None


@pytest.mark.parametrize("name", sorted(module_patterns()))
def test_every_pattern_runs_in_linear_time_on_hostile_text(name):
    pattern = module_patterns()[name]
    slow = {}
    for label, text in HOSTILE.items():
        for op in (pattern.search, pattern.fullmatch):  # every start position, and the one that must reach the end
            took = timed(partial(op, text))
            if took > CALL_BOUND:
                slow[f"{op.__name__} on {label}"] = round(took, 3)
    assert not slow, f"{name} ({pattern.pattern[:80]!r}) is slow: {slow}"


def test_reasoning_blocks_are_removed_as_before():
    """The scan that replaced 1.5.0's lazy pattern removes what it removed: from an opening to the first closing of
    its kind (case ignored), an unclosed opening kept."""
    cases = {
        "a<think>x</think>b": "ab",
        "<THINK>x</think>b": "b",
        "<think><think>a</think>b</think>": "b</think>",
        "<think>open and never closed": "<think>open and never closed",
        "<think>x<thinking>y</thinking>z</think>w": "w",
        "<thinking>x</think></thinking>y": "y",
        '<details type="reasoning" done="true">\n<summary>Thought</summary>x</details>answer': "answer",
        "<think>a</think>b<reasoning>c</reasoning>d<think>e": "bd<think>e",
        "no tags < at all >": "no tags < at all >",
    }
    assert {text: acc.strip_reasoning_blocks(text) for text in cases} == cases


# -- inlet and outlet ----------------------------------------------------------------------------------------------

CHAT_SHAPES = ("user", "assistant", "reasoning")
BATTERY = [(label, shape, chat_id) for chat_id in ("c1", None) for label in HOSTILE for shape in CHAT_SHAPES]


def conversation(text: str, shape: str) -> list:
    """A short chat carrying ``text``: as the user's latest message, as a model's earlier reply, or as the reasoning
    of that reply (in its text, and in the ``reasoning_content`` field)."""
    if shape == "user":
        return [S(), U("hello"), AS("hi, how can I help?"), U(text)]
    if shape == "assistant":
        return [S(), U("hello"), AS(text), U("go on")]
    return [S(), U("hello"), {**AS(f"<think>{text}\nanswer"), "reasoning_content": text}, U("go on")]


class NoLeases(RecordStore):
    """No summary of its own is found, and no lease is ever granted: the battery times the request path, not the
    background summaries a 200 KB message makes due (their work is not a request's)."""

    @asynccontextmanager
    async def hold(self, scope, holder, *args, **kwargs):
        yield False


async def inlet_and_outlet(f, text: str, shape: str, chat_id) -> list:
    """CPU seconds of the process (its worker threads too) each call took: inlet, then outlet with the model's reply
    appended (what the machine's other load costs is not counted; the stall test below reads the wall clock)."""
    meta = {"chat_id": chat_id, "message_id": "r1"} if chat_id else {}
    messages = conversation(text, shape)
    body = {"model": "gpt-4o", "messages": copy.deepcopy(messages)}
    if chat_id:
        body["chat_id"] = chat_id
    took = []
    start = time.process_time()
    await f.inlet(body, __user__={"id": "u1"}, __metadata__=meta)
    took.append(time.process_time() - start)
    reply = {"id": "r1", "role": "assistant", "content": text if shape != "user" else "ok"}
    outlet = {"model": "gpt-4o", "id": "r1", "chat_id": chat_id, "messages": [*messages[1:], reply]}
    start = time.process_time()
    await f.outlet(outlet, __user__={"id": "u1"}, __metadata__=meta)
    took.append(time.process_time() - start)
    await f.wait_for_background(timeout=5)
    return took


@pytest.fixture(scope="module")
def battery() -> tuple:
    """Each hostile text through inlet and outlet, as each shape, with a chat and without: (CPU seconds of each call,
    the event loop's longest gap during each pair, the better of two runs where the first is over a bound), a ticker
    task on the loop noting its gaps."""
    f = make_filter(4000, counter="estimate", store=NoLeases())

    async def run():
        gaps, calls, stalls = [], {}, {}
        stop = asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        await inlet_and_outlet(f, "warm up", "user", "c1")  # first-call costs are not the input's
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        for key in BATTERY:
            for _ in range(2):  # a pair over a bound runs again: the machine's other load pauses a run now and then
                before = len(gaps)
                with guard(GUARD * 5):
                    took = await inlet_and_outlet(f, HOSTILE[key[0]], *key[1:])
                await asyncio.sleep(0.002)  # the ticker notes the gap this pair left
                gap = max(gaps[before:], default=0.0)
                calls[key] = min(calls.get(key, took), took, key=max)
                stalls[key] = min(stalls.get(key, gap), gap)
                if max(calls[key]) <= CALL_BOUND and stalls[key] <= STALL_BOUND:
                    break
        stop.set()
        await task
        return calls, stalls

    return asyncio.run(run())


def test_inlet_and_outlet_stay_fast_on_hostile_messages(battery):
    calls, _ = battery
    slow = {key: tuple(round(t, 3) for t in took) for key, took in calls.items() if max(took) > CALL_BOUND}
    assert len(calls) == len(BATTERY) and not slow, f"calls over {CALL_BOUND} s (inlet, outlet): {slow}"


def test_the_event_loop_never_stalls_on_hostile_messages(battery):
    """While the battery runs, a ticker on the same loop sees no gap over STALL_BOUND."""
    _, stalls = battery
    worst = {key: round(gap, 3) for key, gap in stalls.items() if gap > STALL_BOUND}
    assert len(stalls) == len(BATTERY) and not worst, f"event loop stalls over {STALL_BOUND} s: {worst}"
