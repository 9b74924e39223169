"""Long chats against a model's own window, in-process (issue 45: the arithmetic tests/e2e/test_model_window.py ran
end to end, 26 turns per model at 3x the window, runs here; the e2e keeps one short chat per backend). Default
valves, summaries failing (only the cap protects), a model that publishes no window and rejects a request over it
with OpenAI's text: the first rejection teaches the window, and no request after it is rejected, to 3x the window."""

from __future__ import annotations

import asyncio

from acc_builders import SharedStore

import async_context_compression as acc
from devkit import probes
from devkit.fake_provider import ModelSpec, count_tokens, model_tokens

LONG = "The quarterly figures were compared with the plan in detail. " * 36  # ~500 of the model's tokens
WINDOW = 4096
SPEC = ModelSpec(ratio=1.3, window=WINDOW, on_overflow="reject")


def _grow(f, monkeypatch, turns: int) -> list:
    """inlet, request, then the provider's answer of each turn of a growing chat: (model tokens sent, rejected)."""
    failed = {}  # user message id -> (reply id, error) of the failed reply it follows

    async def failed_reply(chat_id, user_message_id):
        reply_id, error = failed.get(user_message_id, ("", None))
        return ("c1", reply_id, error) if error else ("", "", None)

    monkeypatch.setattr(acc, "failed_reply", failed_reply)

    async def run():
        out, stored = [], [{"role": "system", "content": "Be brief."}]
        for i in range(turns):
            stored.append({"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"})
            meta = {"chat_id": "c1", "message_id": f"a{i}", "user_message_id": f"u{i}"}
            body = {"model": "llama", "messages": [dict(m) for m in stored]}
            body = await f.inlet(body, {"id": "u1"}, meta, None, None, None, "c1")
            body = await f.request(body, {"id": "u1"}, meta, None, None, "c1")
            own = model_tokens(body["messages"], None, SPEC)
            out.append((own, own > WINDOW))
            if own > WINDOW:  # rejected: Open WebUI keeps the error on the reply and leaves it out of the next turn
                said = f"This model's maximum context length is {WINDOW} tokens. However, you requested {own} tokens."
                failed[f"u{i + 1}"] = (f"a{i}", said)
                await f.wait_for_background(10)
                continue
            stored.append({"id": f"a{i}", "role": "assistant", "content": f"A{i} short."})
            outlet_messages = [dict(m) for m in stored[1:]]
            outlet_messages[-1]["usage"] = {"prompt_tokens": own}
            await f.outlet({"id": f"a{i}", "chat_id": "c1", "messages": outlet_messages}, {"id": "u1"}, meta, None)
            await f.wait_for_background(10)
        return out, stored

    return asyncio.run(run())


def test_default_valves_learn_an_unpublished_window_from_its_first_rejection_and_are_never_rejected_again(
    monkeypatch,
):
    f = acc.Filter()
    f.summaries.store = SharedStore()
    f.valves.summary_model = "none-such"  # summaries fail: only the cap protects
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    sent, stored = _grow(f, monkeypatch, 30)
    typed = count_tokens([m for m in stored if m["role"] == "user"]) * SPEC.ratio
    assert typed > 3 * WINDOW  # the chat grew to three times the window
    rejected = [n for n, (_, no) in enumerate(sent) if no]
    assert len(rejected) == 1, rejected  # the window's only witness: one rejection, the first ...
    assert all(own <= WINDOW for own, _ in sent[rejected[0] + 1 :]), sent  # ... and every later request fits
    assert f.windows.find("llama", None, acc.RequestParams()).tokens == WINDOW
