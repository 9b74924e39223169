"""Run a REAL Open WebUI offline and drive it over its REST API.

This module only re-exports the devkit's Open WebUI tools, split by concern:

* :mod:`devkit.owui_server`: the server process (:class:`OpenWebUIServer`,
  venv lookup, environment, start/stop, health polling, shared database
  preparation, :func:`start_replicas`).
* :mod:`devkit.owui_client`: the REST client (:class:`OpenWebUIClient`: auth,
  functions, valves, tools, chats, completions, built-in compaction).
* :mod:`devkit.chat_history`: :class:`ChatHistory`, histories built the way
  Open WebUI stores them.
"""

from __future__ import annotations

from devkit.chat_history import ChatHistory, new_id, new_marker
from devkit.owui_client import OpenWebUIClient, OpenWebUIError, parse_frontmatter
from devkit.owui_server import (
    REPO_ROOT,
    OpenWebUIServer,
    ensure_offline_tiktoken,
    find_openwebui_python,
    free_port,
    start_replicas,
)

__all__ = [
    "REPO_ROOT",
    "OpenWebUIServer",
    "OpenWebUIClient",
    "OpenWebUIError",
    "ChatHistory",
    "find_openwebui_python",
    "ensure_offline_tiktoken",
    "parse_frontmatter",
    "free_port",
    "start_replicas",
    "new_id",
    "new_marker",
]
