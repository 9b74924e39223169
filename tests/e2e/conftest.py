"""Fixtures of the end-to-end suite: ONE strict fake provider and ONE real
Open WebUI (from the cached venv, started as a subprocess) for the whole
session, with the filter installed from the repo file through the REST API;
and ``two_workers``: the session's one Open WebUI on two uvicorn workers,
shared by every module that uses it (the modules that need another deployment
call ``e2e_support.multi_worker_server``).

``ACC_SKIP_E2E=1`` skips the suite. Without it, an Open WebUI that cannot be
found or started is an error, never a skip.

The server's python is ``$ACC_OPENWEBUI_PYTHON`` (scripts/test.sh: 0.12.4;
scripts/test_versions.sh: each older version in turn, running only the tests
marked ``versions``). ``owui_version`` is the version the running server
reports; with ``ACC_EXPECT_OPENWEBUI_VERSION`` set, any other is an error.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time

import pytest
from e2e_support import (
    CHAT_MODEL,
    E2E_VALVES,
    FILTER_ID,
    LEASE_TTL,
    MODEL_RULES,
    MODEL_SPECS,
    RATIO_RUNS,
    RATIOS_MINUTE,
    SUMMARY_MODEL,
    WINDOWS_REFRESH,
    brief,
    multi_worker_server,
    retrying,
)

from devkit.fake_provider import FakeProvider
from devkit.openwebui import (
    REPO_ROOT,
    OpenWebUIClient,
    OpenWebUIServer,
    ensure_offline_tiktoken,
    find_openwebui_python,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_E2E = os.environ.get("ACC_SKIP_E2E", "").strip() == "1"
ADMIN_EMAIL = "e2e-admin@example.com"
ADMIN_PASSWORD = "E2e-Passw0rd!"
FILTER_FILE = os.path.join(REPO_ROOT, "async_context_compression.py")

_LATENCY_KEY = pytest.StashKey[list]()
_SERVER_KEY = pytest.StashKey[object]()
_TWO_WORKERS_KEY = pytest.StashKey[object]()
_LOCAL_SERVERS_KEY = pytest.StashKey[object]()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.e2e)
            if SKIP_E2E:
                item.add_marker(pytest.mark.skip(reason="ACC_SKIP_E2E=1: end-to-end suite skipped on request"))


@pytest.fixture(scope="session")
def owui_python():
    # A missing Open WebUI is an error here, not a skip: this builds the
    # cached venv when it is absent (minutes) and raises when that fails.
    return find_openwebui_python(install=True)


@pytest.fixture(scope="session")
def provider():
    fake = FakeProvider(mode="strict", model_specs=MODEL_SPECS, model_rules=MODEL_RULES).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def owui_server(owui_python, provider, request):
    tiktoken_dir = ensure_offline_tiktoken(owui_python)
    server = OpenWebUIServer(python=owui_python, provider_url=provider.base_url, tiktoken_cache_dir=tiktoken_dir)
    started = time.monotonic()
    server.start(timeout=600)
    print(
        f"\n[e2e] Open WebUI ({owui_python}) up at {server.base_url} in {time.monotonic() - started:.1f}s; log {server.log_path}"
    )
    request.config.stash[_SERVER_KEY] = server
    yield server
    server.stop()
    failed = request.session.testsfailed
    if failed or os.environ.get("ACC_KEEP_E2E_DATA"):
        print(f"\n[e2e] server data and log kept in {server.data_dir}")
    else:
        shutil.rmtree(server.data_dir, ignore_errors=True)


def _version_tuple(text: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.fixture(scope="session")
def owui_version(owui_server) -> tuple:
    """The running server's version as a tuple, e.g. (0, 11, 4), from ``GET /api/version``."""
    reported = OpenWebUIClient(owui_server.base_url, timeout=30).get("/api/version", auth=False)["version"]
    expected = os.environ.get("ACC_EXPECT_OPENWEBUI_VERSION", "").strip()
    if expected and _version_tuple(reported) != _version_tuple(expected):
        pytest.fail(f"the server under test reports Open WebUI {reported}, expected {expected}")
    return _version_tuple(reported)


@pytest.fixture(scope="session")
def admin(owui_server, owui_version):
    client = OpenWebUIClient(owui_server.base_url, timeout=180)
    client.signup(ADMIN_EMAIL, ADMIN_PASSWORD, "E2E Admin")
    client.wait_for_models([CHAT_MODEL, SUMMARY_MODEL], timeout=60)
    return client


@pytest.fixture(scope="session")
def filter_source():
    if not os.path.isfile(FILTER_FILE):
        pytest.fail(f"{FILTER_FILE} is missing")
    with open(FILTER_FILE, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="session")
def installed_filter(admin, filter_source):
    """The repo's filter, installed through the REST API, active and global, with the e2e valves."""
    function = admin.install_function(FILTER_ID, filter_source, valves=dict(E2E_VALVES), enable_global=True)
    assert function["is_active"] and function["is_global"], function
    assert function.get("type") == "filter", function
    return function


@pytest.fixture(scope="session")
def shared_two_workers(owui_python, provider, filter_source, request):
    """(server, client): the session's Open WebUI on two uvicorn workers sharing one database, on the session's
    provider, the filter installed with the e2e valves and the worker probe (PID_PROBE) beside it. Started once (a
    start is 20-25 s of CPU); every test on it uses its own chats, so none sees another's state. The models of the
    modules that run on it are listed from the start: each worker resolves a chat's model from the list it read
    (a model added later is "not found" on the worker that has not read the list since)."""
    import test_forged_usage
    import test_model_window
    import test_recall

    for module in (test_model_window, test_recall):
        provider.respec(module.SPECS, summary_models=(module.SUMMARIZER,))
    provider.respec(test_forged_usage.SPECS)
    provider.respec(RATIO_RUNS)
    # test_forged_usage's plain users use the provider's models; its waits for every worker to read the shared windows
    # last WINDOWS_REFRESH, not the product's 10 s, and for the shared ratios to apply RATIOS_MINUTE, not 60 s
    plain_users = {
        "BYPASS_MODEL_ACCESS_CONTROL": "true",
        "ACC_TEST_WINDOWS_REFRESH": str(WINDOWS_REFRESH),
        "ACC_TEST_RATIOS_MINUTE": str(RATIOS_MINUTE),
        "ACC_TEST_LEASE_TTL": str(LEASE_TTL),  # test_faults waits for a killed worker's lease to expire
    }
    with multi_worker_server(
        owui_python, provider, filter_source, "workers", pid_probe=True, timeout=600, env_extra=plain_users
    ) as started:
        request.config.stash[_TWO_WORKERS_KEY] = started[0]  # its log is shown with a failing test's report
        yield started


def e2e_module(name: str):
    """tests/e2e/<name>.py, loaded by its path: tests/db has modules of the same names."""
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def local_servers(owui_python, filter_source, request):
    """(server, client, fakes): one Open WebUI on two workers behind connections to fake local model servers (issue
    37), shared by the modules that need such connections (test_local_backends, test_served_window,
    test_ollama_connection, test_trust_between_users: a start is 20-25 s of CPU a process). ``fakes``: "ollama", one Ollama (its native API)
    serving every Ollama model of theirs; "llama", "props" and "no_props", llama-servers behind OpenAI connections
    (the last without ``/props``). Every model is listed from the start; each module sets the valves it needs and uses
    its own model ids, so none sees another's chats or windows."""
    import test_local_backends as local
    import test_ollama_connection as plain
    import test_served_window as served

    trust = e2e_module("test_trust_between_users")
    served_by = {  # fake -> (its models, its summarizers)
        "ollama": ({**local.OLLAMA_SPECS, **served.OLLAMA, **plain.SPECS, **trust.OLLAMA_SPECS}, ()),
        "llama": (local.LLAMA_SPECS, (local.SUMMARIZER,)),
        "props": (served.PROPS_SPECS, (served.SUMMARIZER,)),
        "no_props": ({**served.NO_PROPS_SPECS, **trust.OPENAI_SPECS}, (SUMMARY_MODEL,)),
    }
    fakes = {
        name: FakeProvider(chat_models=(), summary_models=summarizers, model_specs=specs).start()
        for name, (specs, summarizers) in served_by.items()
    }
    fakes["no_props"].configure(probes_off="all")
    openai = [fakes[name].base_url for name in ("llama", "props", "no_props")]
    connections = {
        "BYPASS_MODEL_ACCESS_CONTROL": "true",  # test_trust_between_users' plain users use the connections' models
        "ACC_TEST_WINDOWS_REFRESH": str(WINDOWS_REFRESH),  # its waits for every worker to read the shared windows
        "ENABLE_OLLAMA_API": "true",
        "OLLAMA_BASE_URLS": fakes["ollama"].root_url,
        "OPENAI_API_BASE_URLS": ";".join(openai),
        "OPENAI_API_KEYS": ";".join("dummy" for _ in openai),
    }
    models = [m for fake in fakes.values() for m in (*fake.model_specs, *fake.summary_models)]
    try:
        with multi_worker_server(
            owui_python, fakes["llama"], filter_source, "local", models=tuple(models), env_extra=connections
        ) as (server, client):
            request.config.stash[_LOCAL_SERVERS_KEY] = server  # its log is shown with a failing test's report
            yield server, client, fakes
    finally:
        for fake in fakes.values():
            fake.stop()


@pytest.fixture(scope="module")
def two_workers(shared_two_workers, provider):
    """(server, client): the session's two-worker Open WebUI, as each module finds it when it starts: the filter
    with the e2e valves, the worker probe on, the provider in its default behaviour (a module before may have
    changed any of them, or killed a worker, which uvicorn restarts)."""
    server, client = shared_two_workers
    retrying(lambda: client.set_function_state(FILTER_ID, active=True, is_global=True))
    retrying(lambda: client.set_valves(FILTER_ID, dict(E2E_VALVES)))
    retrying(lambda: client.set_function_state("worker_probe", active=True, is_global=True))
    provider.configure(
        summary_delay=None, summary_fail=None, chat_delay=None, hold=None, context_window=None, reply_text=None
    )
    yield server, client
    provider.configure(
        summary_delay=None, summary_fail=None, chat_delay=None, hold=None, context_window=None, reply_text=None
    )


@pytest.fixture
def acc(admin, installed_filter, provider, owui_server):
    """Per test: the filter active with the e2e valves, the provider in its default behaviour."""
    admin.set_function_state(FILTER_ID, active=True, is_global=True)
    admin.set_valves(FILTER_ID, dict(E2E_VALVES))
    provider.configure(
        summary_delay=None, summary_fail=None, chat_delay=None, hold=None, context_window=None, reply_text=None
    )
    yield admin
    provider.configure(
        summary_delay=None, summary_fail=None, chat_delay=None, hold=None, context_window=None, reply_text=None
    )


@pytest.fixture(autouse=True)
def no_provider_400(request):
    """Every e2e test on the session's provider, in any order of files: the strict provider answered no 400 to what
    the test sent through the filter (a run without the filter, under ``rejections_expected``, is left out; a test
    marked ``provider_rejects`` counts the rejections it allows itself). Once the whole run's last test
    (tests/e2e/test_scenarios.py's ``test_zz_...``), which had to run last."""
    if "provider" not in request.fixturenames or request.node.get_closest_marker("provider_rejects"):
        yield
        return
    provider = request.getfixturevalue("provider")
    start = len(provider.requests)
    yield
    bad = [r for r in provider.requests[start:] if r["status"] == 400 and not r["control"]]
    assert not bad, f"{len(bad)} request(s) answered 400:\n" + "\n".join(brief(r) for r in bad[:3])


@pytest.fixture
def latency_log(request):
    rows = request.config.stash.setdefault(_LATENCY_KEY, [])
    return rows


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or not str(item.fspath).startswith(HERE):
        return
    servers = ((_SERVER_KEY, "one worker"), (_TWO_WORKERS_KEY, "two workers"), (_LOCAL_SERVERS_KEY, "local servers"))
    for key, which in servers:
        server = item.config.stash.get(key, None)
        if server is None:
            continue
        text = server.log_text().splitlines()
        lines = [line for line in text if "async_context_compression" in line or "ERROR" in line or "Error" in line]
        warned = [line for line in text if "| WARNING" in line or "| ERROR" in line or "Traceback" in line]
        for what, found in (("filter and error lines", lines), ("warnings and errors", warned)):
            if found:
                title = f"Open WebUI log, the session's {which}: {what}, last 40"
                report.sections.append((title, "\n".join(found[-40:])))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(_LATENCY_KEY, None)
    if not rows:
        return
    tr = terminalreporter
    tr.section("e2e: reply latency with a 5 s summarizer (same chat, same run) and provider totals")
    for row in rows:
        tr.write_line(row)
