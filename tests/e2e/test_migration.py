"""Pasting this file over the older community filter of the same id, in a
real Open WebUI: the older filter's valves stay stored (its own names, its
``model:threshold:max`` list, ``summary_model: null``), the code update is
not refused, every chat keeps working with summaries made, and the log and
the status line say once what was carried over and what was ignored."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    Conversation,
    brief,
    check_turn,
    has_summary,
    provider_errors,
    status_lines,
)

import async_context_compression as acc_module

pytestmark = pytest.mark.e2e

# A stand-in for the older filter: its valve names and types, no behaviour.
OLDER_FILTER_SOURCE = '''"""
title: Async Context Compression (older filter)
id: async_context_compression
version: 1.3.0
"""
from typing import Optional
from pydantic import BaseModel, Field


class Filter:
    class Valves(BaseModel):
        priority: int = Field(default=10)
        compression_threshold_tokens: int = Field(default=64000, ge=0)
        max_context_tokens: int = Field(default=128000, ge=0)
        model_thresholds: str = Field(default="")
        keep_first: int = Field(default=0, ge=0)
        keep_last: int = Field(default=6, ge=0)
        summary_model: Optional[str] = Field(default=None)
        summary_model_max_context: int = Field(default=0, ge=0)
        max_summary_tokens: int = Field(default=16384, ge=1)
        summary_temperature: float = Field(default=0.1, ge=0.0, le=2.0)
        summary_llm_timeout_seconds: int = Field(default=120)
        summary_fail_mode: str = Field(default="silent")
        compression_style: str = Field(default="balanced")
        enable_tool_output_trimming: bool = Field(default=True)
        tool_trim_threshold_chars: int = Field(default=600)
        show_token_usage_status: bool = Field(default=True)
        token_usage_status_threshold: int = Field(default=80)
        debug_mode: bool = Field(default=False)
        show_debug_log: bool = Field(default=False)

    def __init__(self):
        self.valves = self.Valves()

    async def inlet(self, body: dict) -> dict:
        return body

    async def outlet(self, body: dict) -> dict:
        return body
'''

CAP = E2E_VALVES["max_context_tokens"]

# What the older filter leaves in the database. The global limits are its
# defaults: summaries within this test's few turns happen only if its
# per-model list is read for the chat model.
OLDER_STORED_VALVES = {
    "priority": 10,
    "compression_threshold_tokens": 64000,
    "max_context_tokens": 128000,
    "model_thresholds": f"{CHAT_MODEL}:{E2E_VALVES['compression_threshold_tokens']}:{CAP},gpt-4o:90000:120000",
    "keep_first": 1,
    "keep_last": 4,
    "summary_model": None,
    "summary_model_max_context": 0,
    "max_summary_tokens": 16384,
    "summary_temperature": 0.1,
    "summary_llm_timeout_seconds": 45,
    "summary_fail_mode": "silent",
    "compression_style": "balanced",
    "enable_tool_output_trimming": True,
    "tool_trim_threshold_chars": 600,
    "show_token_usage_status": True,
    "token_usage_status_threshold": 0,
    "debug_mode": True,
    "show_debug_log": False,
}

CARRIED = "carried over from the older filter: compression_style → summary_style, debug_mode → debug, "
IGNORED = "not used by this filter, ignored: enable_tool_output_trimming, show_debug_log, summary_fail_mode"


def store_valves_in_database(server, function_id: str, valves: dict) -> None:
    """As the older filter's install left them (a JSON null included, which
    Open WebUI's valves endpoint would drop before saving)."""
    path = os.path.join(server.data_dir, "webui.db")
    assert os.path.isfile(path), f"the e2e server's SQLite database is not at {path}"
    with sqlite3.connect(path, timeout=30) as db:
        changed = db.execute("UPDATE function SET valves = ? WHERE id = ?", (json.dumps(valves), function_id)).rowcount
    assert changed == 1, f"function {function_id} not found in {path}"


def test_pasting_over_the_older_filter_keeps_every_chat_working(
    admin, installed_filter, filter_source, provider, owui_server
):
    try:
        _upgrade_and_chat(admin, filter_source, provider, owui_server)
    finally:  # the other tests get this filter with the e2e valves back
        admin.install_function(FILTER_ID, filter_source, valves=dict(E2E_VALVES), enable_global=True)


def _upgrade_and_chat(admin, filter_source, provider, server):
    admin.install_function(FILTER_ID, OLDER_FILTER_SOURCE, enable_global=True)
    store_valves_in_database(server, FILTER_ID, OLDER_STORED_VALVES)
    assert admin.get_valves(FILTER_ID) == OLDER_STORED_VALVES

    # The admin pastes our file over it: Open WebUI checks the stored valves
    # against the new code first (a refusal is an HTTP 400 here).
    log_start = server.log_size()
    function = admin.install_function(FILTER_ID, filter_source, enable_global=True)
    assert function["is_active"] and function["is_global"], function
    assert admin.get_valves(FILTER_ID) == OLDER_STORED_VALVES  # left as stored until the admin saves

    start = len(provider.requests)
    conv = Conversation(admin, provider, seed=21)
    conv.add_turns(3)
    conv.store("after the upgrade")
    problems = []
    for _ in range(10):
        problems += check_turn(conv, conv.turn(), CAP)
    reqs = provider.requests[start:]
    assert not provider_errors(reqs), [brief(r) for r in provider_errors(reqs)][:3]
    assert not problems, problems[:5]
    summaries = [r for r in reqs if r["kind"] == "summary"]
    assert summaries and all(s["status"] == 200 for s in summaries), "no summary made with the older valves"
    assert all(s["model"] == CHAT_MODEL for s in summaries)  # summary_model null: the chat's own model
    assert any(has_summary(r) for t in conv.turns for r in t.requests), "no turn carried the summary"

    log = server.log_since(log_start)
    assert log.count(CARRIED) == 1, log[-3000:]
    assert log.count(IGNORED) == 1, log[-3000:]
    assert "incompatible" not in log and "Traceback" not in log, log[-3000:]
    lines = status_lines(admin, conv.chat_id)
    assert any(CARRIED in line for line in lines), lines[-5:]

    # Saving the valves form once (Open WebUI stores what Valves(**form)
    # keeps) leaves only this filter's names, with the carried-over values.
    saved = admin.set_valves(FILTER_ID, admin.get_valves(FILTER_ID))
    assert set(saved) <= set(acc_module.Filter.Valves.model_fields), saved
    assert saved["debug"] is True and saved["summary_timeout_seconds"] == 45, saved
    assert saved["status_usage_threshold"] == 0 and saved["summary_style"] == "balanced", saved
    assert saved["model_thresholds"] == OLDER_STORED_VALVES["model_thresholds"], saved
    assert admin.get_valves(FILTER_ID) == saved
    before = len(provider.requests)
    turn = conv.turn()
    assert not check_turn(conv, turn, CAP)
    assert not provider_errors(provider.requests[before:])


def test_values_typed_in_the_admin_form_are_saved_and_explained(acc, provider, owui_server):
    """The form's save (Valves(**form).model_dump(exclude_unset=True)) keeps
    what was typed; the chat runs with corrected values and says why."""
    odd = {"keep_last": -3, "max_summary_tokens": 1, "summary_model_params": "{enable_thinking: false}"}
    log_start = owui_server.log_size()
    saved = acc.set_valves(FILTER_ID, {**E2E_VALVES, **odd})  # a refusal is an HTTP 400 here
    assert {k: saved[k] for k in odd} == odd, saved
    start = len(provider.requests)
    conv = Conversation(acc, provider, seed=22)
    conv.add_turns(10, words=20)  # the live turn is turn 11: settings notes are said on turns 1, 11, 21, ...
    conv.store("odd values")
    turn = conv.turn()
    assert not check_turn(conv, turn, CAP) and not provider_errors(provider.requests[start:])
    log = owui_server.log_since(log_start)
    for words in (
        "keep_last = -3 is not valid (expected 0–10000); using 0",
        "max_summary_tokens = 1 is not valid (expected 64–1000000000); using 64",
        "summary_model_params cannot be read",
    ):
        assert log.count(words) == 1, (words, log[-3000:])
    lines = status_lines(acc, conv.chat_id)
    assert any("Settings: keep_last = -3 is not valid (expected 0–10000); using 0" in line for line in lines), lines
