"""The devkit's Open WebUI server stops only its own processes: a test may kill a server's supervisor, which is then
reaped, and on a busy machine its pid names another process (and group) within minutes; stopping the dead server must
not kill that one (a clean-clone run lost a concurrent lane's Open WebUI 0.9.0 so, right after a replica test)."""

from __future__ import annotations

import os
import subprocess
import sys

from devkit import owui_server
from devkit.owui_server import OpenWebUIServer, process_start


def _dead_server() -> OpenWebUIServer:
    server = OpenWebUIServer(python=sys.executable)
    server.proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    server._started = process_start(server.proc.pid)
    server.proc.wait()  # killed and reaped: its pid is free for the next process
    return server


def test_a_dead_servers_pid_taken_by_another_process_is_not_killed(monkeypatch):
    server = _dead_server()
    killed = []
    monkeypatch.setattr(owui_server, "process_start", lambda pid: "another start")  # the pid reused ...
    monkeypatch.setattr(os, "getpgid", lambda pid: pid)  # ... as its new process's group
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: killed.append(pgid))
    server.stop(grace=0.1)
    assert killed == []


def test_a_dead_servers_group_whose_pid_is_free_is_still_swept(monkeypatch):
    server = _dead_server()
    pid, killed = server.proc.pid, []
    monkeypatch.setattr(owui_server, "process_start", lambda pid: None)  # workers may outlive the supervisor
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: killed.append(pgid))
    server.stop(grace=0.1)
    assert killed and set(killed) == {pid}


def test_process_start_tells_a_live_process_from_none():
    assert process_start(os.getpid()) == process_start(os.getpid()) is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_start(child.pid) is None or process_start(child.pid) != process_start(os.getpid())
