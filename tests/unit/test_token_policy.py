"""The one token policy of a request (issues 10 and 12.2): ``count_request``
is how many tokens a request is, ``fit_request`` fits it under the cap and
reports the same number for what it sends, and a long chat counted for the
first time is tokenized in a worker thread, never on the event loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
from acc_builders import EstimateOnly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_context_compression as acc
from devkit.probes import wait_ready

ENC = "cl100k_base"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("tiktoken")
    c = acc.TokenCounter()
    if not wait_ready(c, ENC, timeout=30):
        pytest.skip("cl100k_base not available offline")
    return c


def exact_counter() -> acc.TokenCounter:
    c = acc.TokenCounter()
    assert wait_ready(c, ENC, timeout=30)
    return c


def chat(turns: int, words: int = 30, seed: str = "") -> list:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{seed} question {i} " + "lorem ipsum " * words})
        messages.append({"role": "assistant", "content": f"{seed} answer {i} " + "dolor sit amet " * words})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def fit(counter, messages, cap, prefix=0, fixed=acc.TOKENS_PER_REQUEST):
    return asyncio.run(acc.fit_request(counter, messages, cap, prefix, fixed, ENC))


@SETTINGS
@given(
    turns=st.integers(0, 12),
    words=st.integers(1, 80),
    cap=st.integers(0, 4000),
    keep_first=st.integers(0, 3),
    exact=st.booleans(),
    slice_size=st.sampled_from([acc.ON_LOOP_MESSAGES, 4]),
)
def test_tokens_after_is_what_count_request_says_of_the_list_sent(
    loaded, turns, words, cap, keep_first, exact, slice_size
):
    # slice_size 4: the look-ups in slices, and the fitting in a worker thread
    counter = exact_counter() if exact else EstimateOnly()
    messages = chat(turns, words, seed=f"{turns}-{words}")
    prefix = acc.protected_head_end(messages, keep_first)
    fixed = acc.TOKENS_PER_REQUEST + 17
    default, acc.ON_LOOP_MESSAGES = acc.ON_LOOP_MESSAGES, slice_size
    try:
        out, report = fit(counter, messages, cap, prefix, fixed)
    finally:
        acc.ON_LOOP_MESSAGES = default
    assert report.tokens_after == acc.count_request(counter, out, ENC, fixed)
    assert report.tokens_before == acc.count_request(counter, messages, ENC, fixed)
    assert report.over_budget == (cap > 0 and report.tokens_after > cap)


def test_once_loaded_every_message_is_counted_exactly(loaded):
    counter = exact_counter()
    messages = chat(5)
    out, report = fit(counter, messages, cap=0)
    exact = acc.TOKENS_PER_REQUEST + sum(counter._count_message(m, ENC, True) for m in messages)
    assert report.tokens_after == exact == acc.count_request(counter, messages, ENC, acc.TOKENS_PER_REQUEST)


def test_before_the_encoding_loads_estimates_carry_their_margin():
    counter = EstimateOnly()
    messages = chat(3)
    estimates = [counter._count_message(m, ENC, False) for m in messages]
    expected = acc.TOKENS_PER_REQUEST + sum(acc._with_margin(e) for e in estimates)
    assert acc.count_request(counter, messages, ENC, acc.TOKENS_PER_REQUEST) == expected
    assert all(acc._with_margin(e) >= e * (1 + acc.ESTIMATE_MARGIN) for e in estimates)
    _, report = fit(counter, messages, cap=0)
    assert report.tokens_after == expected


def test_count_request_never_tokenizes(loaded, monkeypatch):
    counter = exact_counter()
    exact_calls = []
    real = counter._count_message

    def spy(message, encoding, exact):
        exact_calls.append(exact)
        return real(message, encoding, exact)

    monkeypatch.setattr(counter, "_count_message", spy)
    acc.count_request(counter, chat(20), ENC, 0)
    assert exact_calls and not any(exact_calls)


def record_threads(monkeypatch, counter) -> list:
    threads = []
    real = counter.measure

    def spy(messages, encoding, exact):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(messages, encoding, exact)

    monkeypatch.setattr(counter, "measure", spy)
    return threads


def test_a_long_chat_seen_for_the_first_time_is_counted_in_a_worker_thread(loaded, monkeypatch):
    counter = exact_counter()
    threads = record_threads(monkeypatch, counter)
    fit(counter, chat(200), cap=2000)
    assert threads == [False]
    # the next request of that chat counts its two new messages on the loop
    grown = chat(200) + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more?"}]
    fit(counter, grown, cap=2000)
    assert threads == [False, True]


def test_a_cold_long_chat_never_holds_the_event_loop_for_long(loaded):
    counter = exact_counter()
    messages = chat(1200, words=60)  # ~1.2M characters: 0.2-0.6 s of tokenizing, far above a busy machine's pauses

    async def scenario():
        gaps = []
        done = asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = time.perf_counter()
        await acc.fit_request(counter, messages, 5000, 0, acc.TOKENS_PER_REQUEST, ENC)
        elapsed = time.perf_counter() - started
        done.set()
        await task
        return max(gaps), elapsed

    gc.disable()  # a full collection of the suite's garbage pauses the loop too, but it is not the filter's hold
    try:
        stall, elapsed = asyncio.run(scenario())
    finally:
        gc.enable()
    # the counting took far longer than any single hold of the loop
    assert stall < elapsed / 3, (stall, elapsed)


def test_a_long_list_is_fitted_in_a_worker_thread_as_it_would_be_on_the_loop(loaded, monkeypatch):
    messages = chat(40, words=40)
    in_main_thread = []
    real = acc.fit_to_budget

    def spy(*args):
        in_main_thread.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(acc, "fit_to_budget", spy)
    on_loop, report_loop = fit(exact_counter(), messages, cap=1500, prefix=3)
    monkeypatch.setattr(acc, "ON_LOOP_MESSAGES", 10)
    threaded, report_thread = fit(exact_counter(), messages, cap=1500, prefix=3)
    assert in_main_thread == [False, False]  # exact counts tokenize the cut copies: always off the loop
    assert threaded == on_loop and report_thread == report_loop
    assert report_loop.dropped_messages > 0
