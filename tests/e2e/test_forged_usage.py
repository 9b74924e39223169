"""Forged usage (issue 42, item 2), end to end: the session's Open WebUI on two workers sharing one database, plain
users. Outlet reads a reply's usage from the body of ``POST /api/chat/completed``, which any client may post for a
chat of its own (on 0.9-0.11 it is outlet's only path; 0.12 keeps it beside its own inline outlet).

Mallory (and, for the agreeing cut, Trudy) forges on her own chats, for the ids of her own replies: the outlet body is
posted while the provider still holds her request's reply, so it reaches the worker that sent the request before any
outlet of Open WebUI's own, and again after the reply. Bob's next requests, on either worker, must reach the provider
exactly as they did before she began: the same messages, the same tokens. Each attack has its own users, chats and
model, so the four run at once (issue 45: their waits for the workers' reading periods overlap); each test reports
its own."""

from __future__ import annotations

import importlib.util
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import E2E_VALVES, FILTER_ID, RATIOS_MINUTE, WINDOWS_REFRESH, brief, filler, retrying, settle

from devkit.fake_provider import ModelSpec, count_tokens
from devkit.openwebui import OpenWebUIError, new_id


def _trust_module():
    """tests/e2e/test_trust_between_users.py, whose helpers this module shares (tests/db has a module of that name)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_trust_between_users.py")
    spec = importlib.util.spec_from_file_location("e2e_trust_between_users", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_trust = _trust_module()
as_received, on_both_workers, send, stored_chat, user = (
    _trust.as_received,
    _trust.on_both_workers,
    _trust.send,
    _trust.stored_chat,
    _trust.user,
)

pytestmark = [pytest.mark.e2e, pytest.mark.versions]

CUT = "forge-cut"  # publishes no window (the cut)
ERASED = (
    "forge-erase"  # a 5,000 window, rejected over it: Bob's rejection teaches it, Mallory's usage must not erase it
)
AGREED = "forge-agree"  # publishes 32,768: two accounts forging the same cut must not override it
RATIO = "forge-ratio"  # twelve forged replies must not set everyone's ratio
SPECS = {
    CUT: ModelSpec(error_shape="nested"),
    ERASED: ModelSpec(window=5000, error_shape="nested"),
    AGREED: ModelSpec(window=32768, publish="max_model_len", error_shape="nested"),
    RATIO: ModelSpec(error_shape="nested"),
}
NO_SUMMARIZER = "forge-no-summarizer"  # not a model: no summary is ever made, the cap alone decides what is sent
CAP = {"max_context_tokens": 6000}  # a request at the cap reporting 2,100 reads as a cut before any ratio is known
HELD = 3.0  # seconds the provider holds a forger's reply while her outlet body is posted
WINDOWS_READ = WINDOWS_REFRESH + 2.0  # the session server's refresh (conftest) and a margin: all have read since


FORGED = "Forged."  # the forger's turns begin so: the provider holds their replies HELD seconds, no one else's


@pytest.fixture(scope="module")
def forging(two_workers, provider):
    """No summary is made in this module (one that became ready between Bob's requests would change them); the
    provider holds each forged turn's reply while her outlet bodies land."""
    _, admin = two_workers
    retrying(lambda: admin.set_valves(FILTER_ID, {**E2E_VALVES, "summary_model": NO_SUMMARIZER, **CAP}))
    provider.configure(hold=(FORGED, HELD))
    yield
    provider.configure(hold=None)
    retrying(lambda: admin.set_valves(FILTER_ID, dict(E2E_VALVES)))


def forged_turn(client, provider, chat_id: str, model: str, parent: str, usage: dict, words: int = 30) -> str:
    """One turn of the forger's under ``parent`` whose outlet body carries ``usage`` for its reply; the reply's id.
    Posted several times while the reply is held (uvicorn spreads them: one reaches the worker that sent the
    request) and once after it."""
    user_id, reply_id = new_id(), new_id()
    text = f"{FORGED} {filler(random.Random(reply_id), words)}"
    body = {
        "model": model,
        "chat_id": chat_id,
        "id": reply_id,
        "session_id": "",
        "messages": [
            {"id": user_id, "role": "user", "content": text},
            {"id": reply_id, "role": "assistant", "content": "ok", "usage": usage},
        ],
    }

    def post() -> None:
        try:
            client.post("/api/chat/completed", dict(body))
        except OpenWebUIError:
            pass  # a post that came before the reply existed

    turn = dict(chat_id=chat_id, parent_id=parent, user_message_id=user_id, assistant_id=reply_id)

    def ask() -> None:
        try:
            client.chat_completion(text, model=model, timeout=180, **turn)
        except OpenWebUIError:
            pass  # answered or not, the request went out

    with ThreadPoolExecutor(1) as pool:
        answered = pool.submit(ask)
        for _ in range(8):
            time.sleep(HELD / 10)
            post()
        answered.result()
    post()
    return reply_id


def bobs_request(bob, provider, model: str, seed: int) -> tuple:
    """Bob's long chat on ``model`` and a turn of his answered on both workers: (what repeats it, {pid: request})."""
    chat_id, parent = stored_chat(bob, provider, model, 21, words=170, seed=seed)  # 42 messages, over the cap
    text = f"Bob asks again. {filler(random.Random(seed), 60)}"
    user_id, _, first = send(bob, provider, chat_id, model, parent, text, alongside=True)
    assert first and first[-1]["status"] == 200, first[-1:]
    again = (bob, provider, chat_id, model, user_id, parent, text)
    return again, on_both_workers(*again, alongside=True)


def assert_unchanged(again: tuple, before: dict, exact: bool = True) -> None:
    """Bob's request after the forgery is the one before it, on both workers: the same messages and tokens (without
    ``exact``: the same number of messages and tokens)."""
    after = on_both_workers(*again, alongside=True)
    expected = as_received(next(iter(before.values())))
    tokens = {without_probe(r) for r in [*before.values(), *after.values()]}
    sizes = {pid: (len(as_received(r)), without_probe(r)) for pid, r in after.items()}
    if exact:
        assert all(as_received(r) == expected for r in [*before.values(), *after.values()]), (again[3], sizes)
    assert {len(as_received(r)) for r in [*before.values(), *after.values()]} == {len(expected)}, (again[3], sizes)
    assert len(tokens) == 1, (again[3], tokens)
    print(f"\n[e2e] {again[3]}: Bob's request unchanged on workers {sorted(after)}: {len(expected)} messages")


def without_probe(req: dict) -> int:
    """The model's tokens of a request less the worker probe's line: its pid is not the same length on every worker
    (a worker an earlier module killed comes back with a new one), 5291 tokens on one worker and 5292 on the other."""
    probe = [m for m in req["messages"] if "served-by-pid-" in str(m)]
    return req["model_tokens"] - (count_tokens(probe) - count_tokens([]) if probe else 0)


def settle_ratios() -> None:
    """Ratios are shared by the "minute" (RATIOS_MINUTE on the session server): a worker applies those saved 5 s
    before its minute began, read at its first request. Waits until every ratio saved so far applies on every
    worker."""
    wait = RATIOS_MINUTE - time.time() % RATIOS_MINUTE
    time.sleep(wait + (RATIOS_MINUTE + 1 if wait < 6 else 1))


def long_chat(client, provider, model: str, seed: int) -> tuple:
    """A chat of the forger's long enough that her request fills the cap (a cut of 2,100 is then plausible)."""
    return stored_chat(client, provider, model, 21, words=170, seed=seed)


def forged_cut(server, admin, provider) -> None:
    bob, mallory = user(server, admin, "forge-cut-bob"), user(server, admin, "forge-cut-mallory")
    again, before = bobs_request(bob, provider, CUT, seed=11)
    chat_id, parent = long_chat(mallory, provider, CUT, seed=12)
    forged_turn(mallory, provider, chat_id, CUT, parent, {"prompt_eval_count": 2100})
    time.sleep(WINDOWS_READ)
    assert_unchanged(again, before)


def agreeing_cuts(server, admin, provider) -> None:
    bob = user(server, admin, "forge-agree-bob")
    forgers = [user(server, admin, "forge-agree-mallory"), user(server, admin, "forge-agree-trudy")]
    again, before = bobs_request(bob, provider, AGREED, seed=21)
    for seed, forger in enumerate(forgers, 22):
        chat_id, parent = long_chat(forger, provider, AGREED, seed=seed)
        forged_turn(forger, provider, chat_id, AGREED, parent, {"prompt_eval_count": 2100})
    time.sleep(WINDOWS_READ)
    assert_unchanged(again, before)


def huge_prompt(server, admin, provider) -> None:
    bob, mallory = user(server, admin, "forge-erase-bob"), user(server, admin, "forge-erase-mallory")
    chat_id, parent = stored_chat(bob, provider, ERASED, 21, words=170, seed=31)
    first = f"First. {filler(random.Random(31), 60)}"
    _, failed, reqs = send(bob, provider, chat_id, ERASED, parent, first, alongside=True)
    assert reqs and reqs[-1]["status"] == 400, reqs[-1:]  # the 6,000 cap is over the 5,000 window
    text = f"Bob asks again. {filler(random.Random(32), 60)}"
    user_id, _, reqs = send(bob, provider, chat_id, ERASED, failed, text, alongside=True)  # learns the window named
    assert reqs and reqs[-1]["status"] == 200, reqs[-1:]
    settle_ratios()  # Bob's own ratio, taught by that reply, applies on both workers before his requests are compared
    again = (bob, provider, chat_id, ERASED, user_id, failed, text)
    before = on_both_workers(*again, alongside=True)
    assert all(r["status"] == 200 and r["model_tokens"] <= 5000 for r in before.values()), before

    start = len(provider.requests)
    mallory_chat, mallory_parent = stored_chat(mallory, provider, ERASED, 2, words=60, seed=33)
    forged_turn(mallory, provider, mallory_chat, ERASED, mallory_parent, {"prompt_tokens": 90000})
    time.sleep(WINDOWS_READ)
    # an erase would send Bob's next request over the window (rejected) or at another size; exact content is not
    # compared here: in loaded runs of 1.7.0 Bob's own requests differed between workers before any forgery (35 and 33
    # messages on 0.11.4), likely his ratio applied by one worker only; settle_ratios is the fix tried for it
    assert_unchanged(again, before, exact=False)
    assert not [r for r in settle(provider, start, model=ERASED) if r["status"] == 400], "over the learned window"


def twelve_ratios(server, admin, provider) -> None:
    bob, mallory = user(server, admin, "forge-ratio-bob"), user(server, admin, "forge-ratio-mallory")
    again, before = bobs_request(bob, provider, RATIO, seed=41)
    chats = [stored_chat(mallory, provider, RATIO, 1, words=40, seed=seed) for seed in range(42, 54)]
    with ThreadPoolExecutor(4) as pool:  # each some 200 tokens: 1,000 reported is the 2.5 ceiling
        list(
            pool.map(
                lambda chat: forged_turn(mallory, provider, chat[0], RATIO, chat[1], {"prompt_tokens": 1000}), chats
            )
        )
    settle_ratios()
    assert_unchanged(again, before)


ATTACKS = {forged_cut: CUT, agreeing_cuts: AGREED, huge_prompt: ERASED, twelve_ratios: RATIO}
REJECTIONS_ALLOWED = {ERASED: 1}  # Bob's first request, over the window nothing knew yet


@pytest.fixture(scope="module")
def attacks(two_workers, provider, forging):
    """Every attack started at once, each on its own users, chats and model: attack -> its future (the rejections of
    its model it met, the provider's 400s being the module's own check here: the session's per-test check would see
    one attack's rejections in another's test)."""
    server, admin = two_workers
    start = len(provider.requests)

    def run(attack, model) -> list:
        attack(server, admin, provider)
        return [r for r in provider.requests[start:] if r["model"] == model and r["status"] == 400]

    with ThreadPoolExecutor(len(ATTACKS)) as pool:
        yield {attack.__name__: pool.submit(run, attack, model) for attack, model in ATTACKS.items()}


def outcome(attacks, name: str) -> None:
    rejected = attacks[name].result(timeout=900)
    model = next(m for a, m in ATTACKS.items() if a.__name__ == name)
    assert len(rejected) <= REJECTIONS_ALLOWED.get(model, 0), "\n".join(brief(r) for r in rejected[:3])


@pytest.mark.provider_rejects  # counted per attack (``attacks``)
def test_a_forged_cut_leaves_another_users_requests_unchanged(attacks):
    outcome(attacks, "forged_cut")


@pytest.mark.provider_rejects  # counted per attack (``attacks``)
def test_two_accounts_forging_the_same_cut_leave_a_published_window_in_place(attacks):
    outcome(attacks, "agreeing_cuts")


@pytest.mark.provider_rejects  # Bob's first request, over the window nothing knew yet; counted per attack
def test_a_forged_huge_prompt_does_not_erase_a_window_learned_from_a_rejection(attacks):
    outcome(attacks, "huge_prompt")


@pytest.mark.provider_rejects  # counted per attack (``attacks``)
def test_twelve_forged_replies_do_not_set_another_users_ratio(attacks):
    outcome(attacks, "twelve_ratios")
