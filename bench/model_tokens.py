"""The status figure against the provider's own count (issue 19).

    python bench/model_tokens.py            # ratios 0.7..1.5, exact and estimator paths
    python bench/model_tokens.py --quick    # ratios 0.7, 1.0, 1.3, 1.5

Drives the Filter in-process the way Open WebUI does (inlet, request, then
outlet with the reply's ``usage``) against a model whose tokenizer needs
``ratio`` times as many tokens as cl100k for the same text (the fake
provider's ``ModelSpec``: ratio x cl100k of messages and tool schemas, plus
2 tokens of chat template per message). Chats of mixed English and Chinese
turns, with three tool schemas, grow past a 16k window with
``max_context_tokens`` 15000.

Prints, per ratio and count path (exact: tiktoken loaded; estimator: its
file missing), the error of the status figure (what the filter says it sent,
in the model's tokens) against the prompt tokens the provider reported for
that very request: before any reply (what 1.2.0 always showed), and after
1, 3 and 10 replies; and the largest request sent, in the model's tokens,
against the cap. Exits 1 when a request went over the cap after the first
reply or an error after 3 replies is over 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
for _path in (_ROOT, _HERE):
    if _path not in sys.path:
        sys.path.insert(0 if _path == _ROOT else len(sys.path), _path)

from devkit.tiktoken_cache import ensure_offline_cl100k  # noqa: E402

ensure_offline_cl100k()

from corpus import make_text  # noqa: E402

import async_context_compression as acc  # noqa: E402
from devkit import probes  # noqa: E402
from devkit.fake_provider import ModelSpec, model_tokens  # noqa: E402

CAP = 15000
WINDOW = 16384
AFTER = (0, 1, 3, 10)
TOOLS = [
    {"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool {i}. " * 40, "parameters": {}}}
    for i in range(3)
]


class _NoFile(acc.TokenCounter):
    """tiktoken's file cannot be loaded (offline, no cached file)."""

    def start_loading(self, encoding: str) -> None:
        pass


class _NoStore(acc.NullStore):
    """No summaries here: only the cap and the status figure are measured."""

    async def find(self, *args, **kwargs):
        return []

    def hold(self, *args, **kwargs):
        return _NotHeld()


class _NotHeld:
    async def __aenter__(self):
        return False

    async def __aexit__(self, *exc):
        return False


def _filter(exact: bool) -> acc.Filter:
    f = acc.Filter()
    f.summaries.store = _NoStore()
    f.valves.max_context_tokens = CAP
    f.valves.compression_threshold_tokens = 0
    f.valves.show_status = True
    if exact:
        assert probes.wait_ready(f.counter, "cl100k_base", 60)
    else:
        f.summaries.counter = _NoFile()  # the estimator's path
    return f


async def _chat(ratio: float, exact: bool, turns: int, seed: int) -> tuple:
    """(errors by replies learned, largest request after the first reply / cap)."""
    f = _filter(exact)
    spec = ModelSpec(ratio=ratio, window=WINDOW, per_message=2)
    rng = random.Random(seed)
    stored: list = [{"role": "system", "content": "You are a helpful assistant."}]
    errors: dict = {}
    worst = 0.0
    for i in range(turns):
        category = "english" if i % 2 else "chinese"
        stored.append({"id": f"u{i}", "role": "user", "content": make_text(category, rng.randint(1500, 4000), rng)})
        chat = f"c{seed}"
        meta = {"chat_id": chat, "message_id": f"a{i}"}
        user = {"id": "bench"}
        body = await f.inlet({"model": "m", "messages": [dict(m) for m in stored]}, user, meta, None, None, None, chat)
        body = await f.request({**body, "tools": TOOLS}, user, meta, None, None, chat)
        own = model_tokens(body["messages"], TOOLS, spec)
        shown = f.services.chats[f"bench:{chat}"].last_sent.used
        if i in AFTER:
            errors[i] = (shown - own) / own
        if i >= 1:
            worst = max(worst, own / CAP)
        reply = make_text("english", 200, rng)
        stored.append({"id": f"a{i}", "role": "assistant", "content": reply})
        outlet = [dict(m) for m in stored[1:]]
        outlet[-1]["usage"] = {"prompt_tokens": own, "completion_tokens": 50}
        await f.outlet({"id": f"a{i}", "chat_id": chat, "messages": outlet}, user, meta)
        await f.wait_for_background(10)
    return errors, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    ratios = (0.7, 1.0, 1.3, 1.5) if args.quick else tuple(round(0.7 + 0.1 * i, 1) for i in range(9))
    turns = max(AFTER) + 2
    print(f"status figure vs the provider's prompt tokens; cap {CAP}, window {WINDOW}; mixed English/Chinese chat")
    print(f"{'path':<10}{'ratio':>6}" + "".join(f"{f'after {n}':>10}" for n in AFTER) + f"{'max/cap':>10}")
    failed = False
    for exact in (True, False):
        for ratio in ratios:
            errors, worst = asyncio.run(_chat(ratio, exact, turns, seed=int(ratio * 10)))
            cells = "".join(f"{errors[n]:>+10.1%}" for n in AFTER)
            print(f"{'exact' if exact else 'estimator':<10}{ratio:>6.1f}{cells}{worst:>10.3f}")
            failed |= worst > 1.0 or any(abs(errors[n]) > 0.05 for n in AFTER if n >= 3)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
