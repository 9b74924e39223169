"""Local models as they really serve (issue 37): a real Open WebUI with two workers, DEFAULT valves except
``summary_model``, and three fake local servers behind its own connections: an Ollama (its native API, Open WebUI's
Ollama connection) serving one model preloaded at num_ctx 4096 and two loaded by their first request at 4096 and
8192; a llama-server at ``-c 8192`` whose ``/v1/models`` publishes ``n_ctx_train`` 131072, with ``/props``; and the
same without ``/props`` (an older or locked-down build). Every chat grows to five times its model's window.

Ollama must cut no request at all (the preloaded model's ``/api/ps`` answers before the first request, the others'
after the first reply, which is far under any window); the llama-server with ``/props`` rejects none; without it,
at most one (the rejection names the window). The status line says where each window came from.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import FILTER_ID, Conversation, retrying, status_lines

from devkit.fake_provider import ModelSpec, count_tokens, llamacpp_spec, ollama_spec

pytestmark = pytest.mark.e2e

SUMMARIZER = "served-summary-32k"
OLLAMA = {  # model -> its spec, as an Ollama serves it (its tokenizer: 1.2x cl100k, 2 template tokens a message)
    "served-4k:preloaded": ollama_spec(4096, ratio=1.2, per_message=2, trained=131072, preloaded=True),
    "served-4k:lazy": ollama_spec(4096, ratio=1.2, per_message=2, trained=131072),
    "served-8k:lazy": ollama_spec(8192, ratio=1.2, per_message=2, trained=131072),
}
PROPS, NO_PROPS = "served-llama-props", "served-llama-no-props"
LLAMA = {name: llamacpp_spec(8192, ratio=1.2, per_message=2, trained=131072) for name in (PROPS, NO_PROPS)}
SPECS = {**OLLAMA, **LLAMA}
SUMMARY = {SUMMARIZER: ModelSpec(window=32768, publish="max_model_len", error_shape="nested")}
# what each llama-server serves (conftest's local_servers)
PROPS_SPECS, NO_PROPS_SPECS = {PROPS: LLAMA[PROPS], **SUMMARY}, {NO_PROPS: LLAMA[NO_PROPS]}
VALVES = {"summary_model": SUMMARIZER}  # everything else at its default
TURNS = 28  # each turn about 1/5.4 of the model's window: the chat grows past 5x it
READING = 2.0  # seconds a user reads a reply
WINDOW_NOTE = re.compile(r"window [\d.]+k, [^·|]*")


@pytest.fixture(scope="module")
def stack(local_servers):
    """(server, client, (the Ollama fake, the llama-server with /props, the one without)): conftest's Open WebUI with
    fake local servers, the filter at this module's valves."""
    server, client, fakes = local_servers
    retrying(lambda: client.set_valves(FILTER_ID, dict(VALVES)))
    yield server, client, (fakes["ollama"], fakes["props"], fakes["no_props"])


def words_per_turn(model: str) -> int:
    """User words for a turn of 5.2/TURNS of the model's window (a filler word is ~1.1 cl100k tokens)."""
    spec = SPECS[model]
    return int(spec.window / (TURNS / 5.2) / spec.ratio / 1.1)


def turn(conv: Conversation, words: int) -> str:
    """One user turn and the reading pause after it; returns what the user wrote."""
    text = conv.turn_maybe_rejected(words).text
    time.sleep(READING)
    return text


def grow(client, fake, model: str, seed: int) -> tuple:
    conv = Conversation(client, fake, seed=seed, model=model)
    conv.add_turns(1, words=30)
    conv.store(f"served {model}")
    texts = [turn(conv, words_per_turn(model)) for _ in range(TURNS)]
    return conv, count_tokens([{"role": "user", "content": t} for t in texts]) * SPECS[model].ratio


def test_local_servers_are_asked_what_they_serve_on_two_workers(stack):
    server, client, (ollama, props, no_props) = stack
    fake_of = {**dict.fromkeys(OLLAMA, ollama), PROPS: props, NO_PROPS: no_props}
    with ThreadPoolExecutor(len(SPECS)) as pool:
        chats = dict(zip(SPECS, pool.map(lambda m: grow(client, fake_of[m], m, seed=len(m)), SPECS)))
    report, found = [], {}
    for model, (conv, typed) in chats.items():
        chat = [r for r in fake_of[model].requests if r["model"] == model and r["kind"] == "chat"]
        found[model] = {
            "requests": len(chat),
            "cut": [n for n, r in enumerate(chat, 1) if r["cut"]],
            "rejected": [n for n, r in enumerate(chat, 1) if r["rejected"] or r["status"] != 200],
            "largest": max(r["model_tokens"] or 0 for r in chat),
        }
        windows = sorted({w for line in status_lines(client, conv.chat_id) for w in WINDOW_NOTE.findall(line)})
        report.append(f"{model}: typed {typed / SPECS[model].window:.1f}x its window; {found[model]}; {windows}")
    print("\n[e2e] " + "\n[e2e] ".join(report))
    for model, (conv, typed) in chats.items():
        assert typed > 5 * SPECS[model].window, report
        assert found[model]["requests"] >= TURNS, report
        assert found[model]["largest"] > SPECS[model].window / 2, report  # it ran near the window
        lines = " | ".join(status_lines(client, conv.chat_id))
        if model in OLLAMA:
            assert not found[model]["cut"] and not found[model]["rejected"], (model, found[model])
            assert "as the model's server serves it" in lines, (model, lines[-600:])
        elif model == PROPS:
            assert not found[model]["rejected"] and "window 8.2k, as the model's server serves it" in lines, report
        else:
            assert len(found[model]["rejected"]) <= 1, (model, found[model])
            assert "window 8.2k, learned from the provider's error" in lines, (model, lines[-600:])
    assert len(server.worker_pids()) >= 3, "expected a supervisor and 2 workers"
