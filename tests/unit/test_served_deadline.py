"""Issue 42, item 3: an ask of a model's server has one total deadline, body included, and a size bound, and runs on
the probe's own threads. A loopback server that trickles a byte a second (headers or body) kept a 1.5.0 ask open as
long as it liked (its timeout was per read) on the default thread pool, which asks for eight models filled."""

from __future__ import annotations

import asyncio
import http.server
import socketserver
import threading
import time

import pytest

import async_context_compression as acc

BODY = b'{"models": [{"name": "llama3:latest", "context_length": 8192}]}'


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Sends its answer one byte a second: in the headers (``/slow-head``), in the body (any other path), or answers
    a body longer than any model list at once (``/huge``)."""

    def log_message(self, *args):
        pass

    def _trickle(self, data: bytes) -> None:
        for byte in data:
            if self.server.stopping.is_set():
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            self.server.stopping.wait(1.0)

    def do_GET(self):
        try:
            if self.path.startswith("/huge"):
                body = b'{"models": [' + b'{"name": "x"},' * 200_000 + b'{"name": "y"}]}'
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                self.wfile.write(head + body)
                return
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
            if self.path.startswith("/slow-head"):
                self._trickle(head.encode() + BODY)
            else:
                self.wfile.write(head.encode())
                self._trickle(BODY)
        except OSError:  # the ask gave up and closed its end
            pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture
def trickling():
    server = _Server(("127.0.0.1", 0), _Trickle)
    server.stopping = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.stopping.set()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/slow-head", "/slow-body"])
def test_an_ask_of_a_server_sending_a_byte_a_second_ends_by_its_deadline(trickling, path):
    began = time.monotonic()
    assert acc.http_get_json(trickling + path, "", timeout=1.5) == (0, None)
    assert time.monotonic() - began < 4.0  # the deadline, with a loaded CI machine's margin (1.5.0: 60 s and more)


def test_an_answer_longer_than_any_model_list_is_none(trickling):
    assert acc.http_get_json(trickling + "/huge", "") == (0, None)


def _default_pool_threads() -> list:
    return [t.name for t in threading.enumerate() if t.name.startswith("asyncio_")]


def test_a_hanging_server_costs_a_request_at_most_the_wait_and_holds_no_thread_of_the_default_pool(
    trickling, monkeypatch
):
    """Eight models on one server that trickles: each request waits at most SERVED_WAIT, the asks run on the probe's
    own few threads (none of the default pool, which Open WebUI's handlers share), and each ends by its deadline."""
    monkeypatch.setattr(acc, "SERVED_TIMEOUT", 1.5)
    root = trickling
    windows = acc.ModelWindow()
    before = set(_default_pool_threads())

    async def connect():
        return acc.ServedServer("ollama", root, "", "llama3:latest")  # its /api/ps trickles

    async def one(model: str) -> float:
        began = time.monotonic()
        await windows.for_request(acc.NullStore(), model, None, acc.RequestParams(), "u", connect)
        return time.monotonic() - began

    async def run():
        waits = await asyncio.gather(*(one(f"m{n}") for n in range(8)))
        held = set(_default_pool_threads()) - before
        asks = [task for task in windows.server.running.values() if not task.done()]
        began = time.monotonic()
        await asyncio.wait(asks, timeout=30)
        return waits, held, time.monotonic() - began, asks

    waits, held, ended_in, asks = asyncio.run(run())
    assert max(waits) < acc.SERVED_WAIT + 1.0  # each request waited the ask's wait at most
    assert not held  # no thread of the default pool was taken
    assert all(task.done() for task in asks)
    # eight asks on two threads, each given up by its deadline (queued ones too): 1.5.0's never ended
    assert ended_in < acc.SERVED_TIMEOUT + 0.5 + 4.0
