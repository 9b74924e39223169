"""The e2e checks must be able to fail: fed made-up provider requests, check_turn flags each violation."""

from __future__ import annotations

import pytest
from e2e_support import Conversation, Turn, check_turn

pytestmark = pytest.mark.e2e


class _NoClient:
    pass


class _NoProvider:
    requests: list = []


def _setup():
    conv = Conversation(_NoClient(), _NoProvider(), system="SYS-x prompt", seed=1)
    u1 = conv.add_user(words=5)
    conv.add_assistant(words=3)
    u2 = conv.add_user(words=5)
    m1, m2 = sorted(conv.marker_of[u1])[0], sorted(conv.marker_of[u2])[0]
    text = conv.history.messages[u2]["content"]
    turn = Turn(m2, text, u2, "a", 0.1, {}, [], expected={m1, m2}, forbidden={"MK-other"})
    return conv, turn, m1, text


def _req(messages, status=200, tokens=100):
    return {
        "kind": "chat",
        "model": "fake-chat",
        "status": status,
        "tokens": tokens,
        "messages": messages,
        "error": None,
    }


def test_a_good_request_passes():
    conv, turn, m1, text = _setup()
    turn.requests = [
        _req(
            [
                {"role": "system", "content": f"SYS-x prompt\n<conversation_summary>{m1}</conversation_summary>"},
                {"role": "user", "content": text},
            ]
        )
    ]
    assert check_turn(conv, turn, cap=1000) == []


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r, m1, t: r.update(status=400, error="bad"), "provider answered 400"),
        (lambda r, m1, t: r.update(tokens=5000), "over the cap"),
        (
            lambda r, m1, t: r["messages"].__setitem__(0, {"role": "system", "content": f"<conversation_summary>{m1}"}),
            "system prompt",
        ),
        (lambda r, m1, t: r["messages"].append({"role": "user", "content": "later"}), "latest user message"),
        (
            lambda r, m1, t: r["messages"].__setitem__(0, {"role": "system", "content": "SYS-x prompt"}),
            "neither verbatim nor through the summary",
        ),
        (lambda r, m1, t: r["messages"].insert(1, {"role": "user", "content": "MK-other"}), "other branches"),
    ],
)
def test_each_violation_is_reported(mutate, expected):
    conv, turn, m1, text = _setup()
    req = _req(
        [
            {"role": "system", "content": f"SYS-x prompt\n<conversation_summary>{m1}</conversation_summary>"},
            {"role": "user", "content": text},
        ]
    )
    mutate(req, m1, text)
    turn.requests = [req]
    problems = check_turn(conv, turn, cap=1000)
    assert any(expected in p for p in problems), problems


def test_a_turn_without_requests_is_reported():
    conv, turn, _, _ = _setup()
    assert any("no chat request" in p for p in check_turn(conv, turn, cap=1000))
