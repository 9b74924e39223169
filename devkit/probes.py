"""Looks into the filter for tests and benchmarks: nothing here runs in
the product, so none of it ships in async_context_compression.py."""

from __future__ import annotations

import time

import async_context_compression as acc


def wait_ready(counter: acc.TokenCounter, encoding: str, timeout: float = 30.0) -> bool:
    """Block until ``counter`` has loaded ``encoding`` (False after
    ``timeout`` or a failed load)."""
    counter.start_loading(encoding)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if counter.is_exact(encoding):
            return True
        with counter._lock:
            if encoding not in counter._loading:
                return counter.is_exact(encoding)
        time.sleep(0.01)
    return counter.is_exact(encoding)


def cache_len(counter: acc.TokenCounter) -> int:
    return len(counter._cache)


def needs_repair(messages: list) -> bool:
    """Whether any repair step would change the list: the union of the
    steps' checks, in order (each check may assume the ones before passed)."""
    view = acc.TranscriptView(messages)
    return any(step.broken(view) for step in acc._REPAIR_STEPS)


def canonical_view(messages: list) -> tuple[list, list[str]]:
    """The canonical messages and their digests."""
    canon = acc.canonical_messages(messages)
    return canon, [acc.canonical_digest(m) for m in canon]


def message_tokens(counter: acc.TokenCounter, message: dict, encoding: str, exact: bool = True) -> int:
    """A message's count, through the counter's cache: exact once the
    encoding is loaded (and ``exact``), its estimate (no margin) before."""
    if not isinstance(message, dict):
        return 0
    slot = 1 if exact and counter.is_exact(encoding) else 0
    if exact and not slot:
        counter.start_loading(encoding)
    entry = counter._entry(message, encoding)
    if entry[slot] is None:
        entry[slot] = counter._count_message(message, encoding, slot == 1)
    return entry[slot]


def messages_tokens(counter: acc.TokenCounter, messages: list, encoding: str, exact: bool = True) -> int:
    return acc.TOKENS_PER_REQUEST + sum(message_tokens(counter, m, encoding, exact) for m in messages)
