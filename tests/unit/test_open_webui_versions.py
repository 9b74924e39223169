"""What the filter says about the Open WebUI version it runs in
(``open_webui_limits``; the table in docs/en/versions.md)."""

import logging
import types

import pytest

import async_context_compression as acc


def kinds(version):
    found = set()
    for line in acc.open_webui_limits(version):
        assert line.startswith(f"Open WebUI {version}: ")
        found |= {k for k, needle in NEEDLES.items() if needle in line}
    return found


NEEDLES = {"unsupported": "older than 0.9.0", "api_outlet": "API calls", "request_hook": "`request` hook"}


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.8.6", {"unsupported", "api_outlet", "request_hook"}),
        ("0.9.0", {"api_outlet", "request_hook"}),
        ("0.9.6", {"api_outlet", "request_hook"}),
        ("0.10.0", {"request_hook"}),
        ("0.10.2", {"request_hook"}),
        ("0.11.0", {"request_hook"}),
        ("0.11.1", {"request_hook"}),
        ("0.11.2", set()),
        ("0.11.4", set()),
        ("0.12.4", set()),
        ("1.0", set()),
        ("v0.10", {"request_hook"}),  # two parts, a prefix: read as 0.10.0
        ("0.11.2-dev", set()),
    ],
)
def test_limits_follow_the_version(version, expected):
    assert kinds(version) == expected


@pytest.mark.parametrize("version", [None, "", "dev", "7", 0, object()])
def test_an_unknown_version_claims_nothing(version, monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "open_webui.env", raising=False)
    assert acc.open_webui_limits(version) == []


def test_read_from_open_webui_env_only_when_open_webui_loaded_it(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "open_webui.env", raising=False)
    assert acc.open_webui_limits() == []
    monkeypatch.setitem(sys.modules, "open_webui.env", types.SimpleNamespace(VERSION="0.10.2"))
    assert [line.split(":")[0] for line in acc.open_webui_limits()] == ["Open WebUI 0.10.2"]
    monkeypatch.setitem(sys.modules, "open_webui.env", types.SimpleNamespace())  # no VERSION
    assert acc.open_webui_limits() == []


def test_filter_logs_the_limits_once_per_process(monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "open_webui.env", types.SimpleNamespace(VERSION="0.9.0"))
    for line in acc.open_webui_limits():
        acc._LOGGED_NOTES.pop(line, None)
    with caplog.at_level(logging.WARNING, logger="async_context_compression"):
        acc.Filter()
        acc.Filter()
    logged = [r.getMessage() for r in caplog.records if "Open WebUI 0.9.0" in r.getMessage()]
    assert len(logged) == 2, logged  # the two limits of 0.9.0, each once
    assert any("`request` hook" in line for line in logged) and any("API calls" in line for line in logged)


def test_outside_open_webui_the_filter_never_imports_it():
    """A Filter used in a plain process (a script, another project's tests) with Open WebUI installed: importing Open
    WebUI there took 3-5 s of the first inlet, on the event loop, and could open a database of its defaults. The
    filter uses Open WebUI's modules only in the process Open WebUI runs in."""
    import os
    import subprocess
    import sys

    script = f"""
import asyncio, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(acc.__file__))!r})
import async_context_compression as acc

async def turn():
    f = acc.Filter()
    body = {{"model": "m", "chat_id": "c1", "messages": [{{"role": "user", "content": "hello " * 40}}]}}
    meta = {{"chat_id": "c1", "message_id": "a1"}}
    out = await f.inlet(dict(body), __user__={{"id": "u1"}}, __metadata__=meta)
    body["messages"] = out["messages"] + [{{"role": "assistant", "content": "hi"}}]
    await f.outlet(body, __user__={{"id": "u1"}}, __metadata__=meta)
    await f.wait_for_background()

asyncio.run(turn())
print(sorted(name for name in sys.modules if name.split(".")[0] == "open_webui"))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]
