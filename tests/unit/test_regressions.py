"""Regressions found by stress runs of the property tests and by an
adversarial fuzz of ``Filter.inlet`` / ``Filter.request``: each is the
minimized input of one failure, kept as a plain example."""

from __future__ import annotations

import asyncio

from acc_builders import EstimateOnly, RecordStore, lines_written, make_filter

import async_context_compression as acc
from devkit.probes import canonical_view, message_tokens, messages_tokens, needs_repair
from devkit.provider_rules import check_openai


def _run(f: acc.Filter, body: dict, hook: str = "inlet") -> tuple[dict, list]:
    events: list = []

    async def emitter(event):
        events.append(event)

    method = f.inlet if hook == "inlet" else f.request

    async def call():
        out = await method(body, __user__={"id": "u1"}, __metadata__={"chat_id": "c1"}, __event_emitter__=emitter)
        await lines_written(f)
        return out

    return asyncio.run(call()), events


def test_the_count_cache_keys_a_part_as_it_is_counted():
    # A part typed as an image that also carried "text" was keyed by its
    # text: a text part of the same text then read the image's count.
    image = {"type": "image_url", "text": "x", "image_url": {"url": "https://example.com/a.png"}}
    text = {"type": "text", "text": "x", "image_url": {"url": "https://example.com/a.png"}}
    counter = EstimateOnly()
    for part in (image, text):
        alone = message_tokens(EstimateOnly(), {"role": "user", "content": [part]}, "cl100k_base")
        assert message_tokens(counter, {"role": "user", "content": [part]}, "cl100k_base") == alone


def test_image_part_with_a_malformed_detail_is_counted_and_capped():
    # Found by the inlet fuzz: an image part whose "detail" is an object (or
    # a list) made the count cache's key unhashable; the TypeError sent the
    # request through uncapped with a "skipped" status.
    for detail in ({}, [1], {"level": "low"}):
        image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": detail}}
        counter = EstimateOnly()
        assert (
            message_tokens(counter, {"role": "user", "content": [image]}, "cl100k_base")
            == acc.TOKENS_PER_MESSAGE + 1 + acc.IMAGE_TOKENS_UNKNOWN
        )
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "a " * 2000},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": [image]},
        ]
        f = make_filter(1000, counter="estimate", keep_first=0)
        out, events = _run(f, {"model": "gpt-4o", "messages": messages})
        sent = out["messages"]
        assert sent[0] == messages[0] and sent[-1] == messages[-1]
        assert messages_tokens(f.counter, sent, "o200k_base") <= 1000
        assert not any("skipped" in str(e) for e in events), events
        assert check_openai(sent) == []


def test_tool_result_with_an_unhashable_id_inside_a_chain_is_dropped_not_raised():
    # Found by the inlet fuzz: a tool message whose tool_call_id is a list or
    # an object, after a tool-call turn, made repair_transcript raise
    # TypeError (set membership); inlet then sent the body unrepaired and
    # uncapped. Such a message can answer no call: it goes as malformed.
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for bad in ([], {}, ["a"], None, 7):
        for errored in (False, True):
            assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
            if errored:
                assistant["stopReason"] = "error"
            chat = [
                {"role": "user", "content": "q"},
                assistant,
                {"role": "tool", "tool_call_id": bad, "content": "x"},
                {"role": "tool", "tool_call_id": "a", "content": "r"},
                {"role": "user", "content": "next"},
            ]
            out, report = acc.repair_transcript(chat)
            assert check_openai(out) == []
            assert out[0] == chat[0] and out[-1] == chat[-1]
            assert report.dropped_malformed == 1
            if not errored:
                assert out[1:3] == [assistant, chat[3]]
            f = make_filter(60, counter="estimate", keep_first=0)
            sent, events = _run(
                f,
                {
                    "model": "gpt-4o",
                    "messages": chat
                    + [{"role": "assistant", "content": "z " * 400}, {"role": "user", "content": "last"}],
                },
            )
            assert not any("skipped" in str(e) for e in events), events
            assert check_openai(sent["messages"]) == []


def test_messages_with_a_role_openai_rejects_are_dropped():
    # Found by the inlet fuzz: a message with an unknown role ("function",
    # "bogus", "") survived repair, so a list the filter had changed (here:
    # an errored tool turn dropped) was still rejected by OpenAI (O0).
    call = {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    for role in ("function", "bogus", ""):
        chat = [
            {"role": role, "name": "f", "content": "x"},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": None, "tool_calls": [call], "stopReason": "error"},
            {"role": "developer", "content": "kept"},
            {"role": "user", "content": "again"},
        ]
        out, report = acc.repair_transcript(chat)
        assert out == [chat[1], chat[3], chat[4]]
        assert report.dropped_malformed == 1 and report.dropped_errored_turns == 1
        assert check_openai(out) == []
        sent, _ = _run(make_filter(0, counter="estimate", keep_first=1), {"model": "gpt-4o", "messages": chat})
        assert check_openai(sent["messages"]) == []
    # alone, such a message is enough for repair to act (the fast path agrees)
    assert needs_repair([{"role": "function", "content": "x"}, {"role": "user", "content": "q"}])


def test_tool_calls_missing_type_or_string_arguments_are_completed():
    # Found by the inlet fuzz: a call {"id": "a"} (or one whose arguments are
    # an object) was answered, so it survived repair; sanitize_names gave it
    # a function name but it still lacked "type" and string "arguments",
    # which OpenAI rejects (O6).
    chat = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a"},
                {"id": "b", "type": "function", "function": {"name": "search", "arguments": {"q": "x"}}},
                {"id": "c", "function": {"name": "search", "arguments": '{"q": "y"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "ra"},
        {"role": "tool", "tool_call_id": "b", "content": "rb"},
        {"role": "tool", "tool_call_id": "c", "content": "rc"},
        {"role": "user", "content": "next"},
    ]
    out, report = acc.repair_transcript(chat)
    assert check_openai(out) == []
    calls = out[1]["tool_calls"]
    assert [c["type"] for c in calls] == ["function"] * 3
    assert [c["function"]["arguments"] for c in calls] == ["{}", '{"q": "x"}', '{"q": "y"}']
    assert report.fixed_call_shapes == 3
    assert out[2:] == chat[2:]
    once, again = acc.repair_transcript(out)
    assert once == out and not again.changed()


def test_content_of_a_shape_openai_rejects_is_normalized():
    # Found by the inlet fuzz: content that is neither a string, null nor a
    # non-empty list of well-formed parts (a number, [], a text part without
    # text, a bare string part, an image in an assistant or tool message)
    # survived repair, so a list the filter had changed was still rejected
    # (O7).
    call = {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": 5},
        {"role": "assistant", "content": [image, {"type": "text", "text": "see"}]},
        {"role": "user", "content": []},
        {"role": "assistant", "content": [], "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": ["plain", {"type": "text"}, 3, image]},
        {"role": "assistant", "content": {"type": "text", "text": "one part"}},
        {"role": "user", "content": [{"type": "text"}, image]},
    ]
    out, report = acc.repair_transcript(chat)
    assert check_openai(out) == []
    assert out == [
        chat[0],
        {"role": "user", "content": "5"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": acc._MISPLACED_IMAGE_MARKER}, {"type": "text", "text": "see"}],
        },
        # the empty user message says nothing: dropped like a null one
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "a",
            "content": [{"type": "text", "text": "plain"}, {"type": "text", "text": acc._MISPLACED_IMAGE_MARKER}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "one part"}]},
        {"role": "user", "content": [image]},
    ]
    assert report.fixed_content_shapes == 7
    once, again = acc.repair_transcript(out)
    assert once == out and not again.changed()
    # the whole hook, with a cap that forces trimming
    sent, events = _run(
        make_filter(40, counter="estimate", keep_first=0),
        {
            "model": "gpt-4o",
            "messages": chat
            + [
                {"role": "assistant", "content": "z " * 300},
                {"role": "user", "content": [{"type": "text", "text": "last"}]},
            ],
        },
    )
    assert check_openai(sent["messages"]) == []
    assert not any("skipped" in str(e) for e in events), events


def test_a_large_audio_part_in_the_protected_head_is_marked_to_fit():
    # Found by the inlet fuzz (minimized): the protected head held a user
    # message whose only part was input_audio (counted as its JSON, ~1800
    # tokens). Fitting could shorten text and replace images but not that,
    # so the request went out at 1831 tokens against a cap of 81 although
    # the head at its floor and the last user message fit.
    audio = {"type": "input_audio", "input_audio": {"data": "QUFB" * 400, "format": "wav"}}
    chat = [{"role": "user", "content": [audio]}, {"role": "user", "content": "Hello, how are you?"}]
    f = make_filter(81, counter="estimate", keep_first=1)
    out, _ = _run(f, {"model": "gpt-4o", "messages": chat})
    sent = out["messages"]
    assert messages_tokens(f.counter, sent, "o200k_base") <= 81
    assert sent == [{"role": "user", "content": [{"type": "text", "text": acc._ATTACHMENT_MARKER}]}, chat[1]]
    assert check_openai(sent) == []
    # a refusal part is the reply's own text, not an attachment
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    assert acc._without_images(refusal) is refusal


def test_a_summary_whose_tail_would_open_with_an_assistant_is_not_used():
    # Found by a fuzz of inlet with stored summaries (minimized): with
    # keep_first=0, one request (a large pasted text) and an agent's tool
    # chain, summary_target finds no user message to start the tail at and
    # covers only the request. Applied, the view opened with the assistant's
    # tool call right after the summary: Anthropic rejects a first turn that
    # is not the user's (A5), Gemini a call turn that follows no user turn
    # (G1); the chat as sent was fine for both.
    from devkit.provider_rules import violations_added

    call = {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    at_outlet = [
        {"role": "user", "content": "Please summarize the report. " * 200},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "result"},
        {"role": "assistant", "content": "Here it is."},
    ]
    canon, digests = canonical_view(at_outlet)
    head = acc.protected_head_end(canon, 0)
    covered = acc.summary_target(canon, head, 2)
    assert (head, covered) == (0, 1)  # what the planner saves
    record = acc.SummaryRecord(
        user_id="u1",
        chat_id="c1",
        anchor="a",
        head_count=head,
        covered_count=covered,
        fingerprint=acc.prefix_fingerprint(digests, covered),
        summary="The user sent a report.",
    )
    chat = [{"role": "system", "content": "s"}, *at_outlet, {"role": "user", "content": "Thanks. And now?"}]
    assert not acc.summary_tail_joins(canonical_view(chat)[0], head, covered)
    f = make_filter(0, counter="estimate", keep_first=0)
    f.summaries.store = RecordStore([record])
    out, _ = _run(f, {"model": "gpt-4o", "messages": chat})
    sent = out["messages"]
    assert check_openai(sent) == []
    assert violations_added(chat, sent) == []
    assert sent == chat  # nothing to fit: the history as it came
    # a summary that leaves the tail opening with the user's message is used
    ok = acc.SummaryRecord(
        user_id="u1",
        chat_id="c1",
        anchor="a",
        head_count=0,
        covered_count=4,
        fingerprint=acc.prefix_fingerprint(canonical_view(chat)[1], 4),
        summary="Earlier: a report.",
    )
    f.summaries.store = RecordStore([record, ok])
    sent = _run(f, {"model": "gpt-4o", "messages": chat})[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "system", "user"] and acc.is_summary_message(sent[1])
    assert violations_added(chat, sent) == []
