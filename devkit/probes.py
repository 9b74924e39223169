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
