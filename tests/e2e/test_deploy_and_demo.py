"""scripts/deploy_filter.py against the session's real Open WebUI (scripts/demo.sh --check: test_demo_check.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from e2e_support import FILTER_ID

from devkit.openwebui import REPO_ROOT

pytestmark = pytest.mark.e2e

DEPLOY = os.path.join(REPO_ROOT, "scripts", "deploy_filter.py")
PROBE_ID = "acc_deploy_probe"


def deploy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, DEPLOY, *args], capture_output=True, text=True, timeout=timeout)


def probe_copy(tmp_path, source: str, version: str = "1.0.0") -> str:
    """The real filter under another id, so deploying it leaves the session's filter alone."""
    text = re.sub(r"(?m)^id:\s*\S+\s*$", f"id: {PROBE_ID}", source, count=1)
    text = re.sub(r"(?m)^title:.*$", "title: ACC Deploy Probe", text, count=1)
    text = re.sub(r"(?m)^version:.*$", f"version: {version}", text, count=1)
    path = tmp_path / f"probe-{version}.py"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_deploy_creates_then_updates_keeping_valves(admin, installed_filter, owui_server, filter_source, tmp_path):
    key = admin.create_api_key()
    assert key.startswith("sk-")
    url = owui_server.base_url
    admin.delete_function(PROBE_ID)
    try:
        first = deploy(
            "--url",
            url,
            "--api-key",
            key,
            "--file",
            probe_copy(tmp_path, filter_source),
            "--valves",
            json.dumps({"max_context_tokens": 32000}),
        )
        assert first.returncode == 0, first.stderr + first.stdout
        assert f"created function {PROBE_ID}" in first.stdout, first.stdout
        fn = admin.get_function(PROBE_ID)
        assert fn and fn["type"] == "filter" and fn["is_active"] and not fn["is_global"], fn
        assert admin.get_valves(PROBE_ID) == {"max_context_tokens": 32000}

        second = deploy(
            "--url",
            url,
            "--api-key",
            key,
            "--file",
            probe_copy(tmp_path, filter_source, "1.0.1"),
            "--global",
            "--valves",
            json.dumps({"keep_last": 3}),
        )
        assert second.returncode == 0, second.stderr + second.stdout
        assert f"updated function {PROBE_ID}" in second.stdout and "1.0.0 -> 1.0.1" in second.stdout, second.stdout
        assert "kept: max_context_tokens" in second.stdout
        assert admin.get_valves(PROBE_ID) == {"max_context_tokens": 32000, "keep_last": 3}
        fn = admin.get_function(PROBE_ID)
        assert fn["is_active"] and fn["is_global"]
        assert "version: 1.0.1" in fn["content"]

        # an update without --valves keeps every stored valve; --global again does not flip it off
        third = deploy(
            "--url", url, "--api-key", key, "--file", probe_copy(tmp_path, filter_source, "1.0.2"), "--global"
        )
        assert third.returncode == 0, third.stderr + third.stdout
        assert "valves kept: keep_last, max_context_tokens" in third.stdout, third.stdout
        assert admin.get_valves(PROBE_ID) == {"max_context_tokens": 32000, "keep_last": 3}
        fn = admin.get_function(PROBE_ID)
        assert fn["is_active"] and fn["is_global"] and "version: 1.0.2" in fn["content"]

        # refusals are explained, with the HTTP status, and exit non-zero
        bad_key = deploy("--url", url, "--api-key", "sk-not-a-key", "--file", probe_copy(tmp_path, filter_source))
        assert bad_key.returncode == 1 and "HTTP 401" in bad_key.stderr, bad_key.stderr
        # a name the filter does not declare is said once, as ignored, never as set
        unknown = deploy(
            "--url",
            url,
            "--api-key",
            key,
            "--file",
            probe_copy(tmp_path, filter_source, "1.0.3"),
            "--valves",
            json.dumps({"no_such_valve": 1, "keep_last": 5}),
        )
        assert unknown.returncode == 0, unknown.stderr + unknown.stdout
        assert "ignored: no_such_valve" in unknown.stdout, unknown.stdout
        set_line = next(line for line in unknown.stdout.splitlines() if line.startswith("valves set:"))
        assert "no_such_valve" not in set_line and '"keep_last": 5' in set_line, unknown.stdout
        assert admin.get_valves(PROBE_ID) == {"max_context_tokens": 32000, "keep_last": 5}
        # a value out of range is not refused: stored as typed, corrected per request and explained
        odd_valve = deploy(
            "--url",
            url,
            "--api-key",
            key,
            "--file",
            probe_copy(tmp_path, filter_source),
            "--valves",
            '{"keep_last": -1}',
        )
        assert odd_valve.returncode == 0, odd_valve.stderr + odd_valve.stdout
        assert admin.get_valves(PROBE_ID) == {"max_context_tokens": 32000, "keep_last": -1}
        not_json = deploy(
            "--url", url, "--api-key", key, "--file", probe_copy(tmp_path, filter_source), "--valves", "{"
        )
        assert not_json.returncode == 2 and "not valid JSON" in not_json.stderr
        unreachable = deploy("--url", "http://127.0.0.1:9", "--api-key", key)
        assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
    finally:
        admin.delete_function(PROBE_ID)

    # the real file by default: updates the session's filter in place, merging valves
    before = admin.get_valves(FILTER_ID)
    real = deploy("--url", url, "--api-key", key, "--global", "--valves", json.dumps({"show_status": False}))
    assert real.returncode == 0, real.stderr + real.stdout
    assert f"updated function {FILTER_ID}" in real.stdout
    assert admin.get_valves(FILTER_ID) == {**before, "show_status": False}
    fn = admin.get_function(FILTER_ID)
    assert fn["is_active"] and fn["is_global"] and fn["content"] == filter_source


STRICT_ID = "acc_deploy_strict"
STRICT_SOURCE = '''"""
title: ACC Strict Valves Probe
id: acc_deploy_strict
version: {version}
"""
from pydantic import BaseModel, Field


class Filter:
    class Valves(BaseModel):
        keep_last: int = Field(default=6, ge=0)

    def __init__(self):
        self.valves = self.Valves()

    async def inlet(self, body: dict) -> dict:
        return body  # {version}
'''


def test_deploy_refused_valves_leave_no_half_done_deploy(admin, owui_server, tmp_path):
    """Valves the server refuses undo the code change: an update restores the previous code, a creation is removed."""
    key = admin.create_api_key()
    url = owui_server.base_url

    def strict(version: str) -> str:
        path = tmp_path / f"strict-{version}.py"
        path.write_text(STRICT_SOURCE.format(version=version), encoding="utf-8")
        return str(path)

    admin.delete_function(STRICT_ID)
    try:
        created = deploy("--url", url, "--api-key", key, "--file", strict("1.0.0"), "--valves", '{"keep_last": -1}')
        assert created.returncode == 1 and "HTTP 400" in created.stderr, created.stderr + created.stdout
        assert "keep_last must be >= 0" in created.stderr and "removed again" in created.stderr, created.stderr
        assert admin.get_function(STRICT_ID) is None

        first = deploy("--url", url, "--api-key", key, "--file", strict("1.0.0"), "--valves", '{"keep_last": 3}')
        assert first.returncode == 0, first.stderr + first.stdout
        refused = deploy(
            "--url", url, "--api-key", key, "--file", strict("2.0.0"), "--valves", '{"keep_last": -1, "nope": 1}'
        )
        assert refused.returncode == 1 and "HTTP 400" in refused.stderr, refused.stderr + refused.stdout
        assert "previous code was restored" in refused.stderr, refused.stderr
        assert "ignored: nope" in refused.stdout and "valves set" not in refused.stdout, refused.stdout
        assert "updated function" not in refused.stdout, refused.stdout
        fn = admin.get_function(STRICT_ID)
        assert fn and "version: 1.0.0" in fn["content"] and "2.0.0" not in fn["content"], fn
        assert admin.get_valves(STRICT_ID) == {"keep_last": 3}
    finally:
        admin.delete_function(STRICT_ID)
