"""The summarizer call (layer 6): what the summarizer is shown (every
message whole, in rounds and pieces that fit its window), how it is asked
(styles, a custom prompt, admin model parameters) and how its answer is read
(chat completions, Responses payloads, streamed bodies; reasoning-only and
empty answers are failures)."""

from __future__ import annotations

import json
import re
import sys
import types
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_context_compression as acc
from devkit.probes import wait_ready

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rough_count(text: str) -> int:
    """A cheap stand-in tokenizer: words, punctuation marks and runs of
    whitespace count one token each."""
    return len(re.findall(r"\w+|[^\w\s]|\s+", text))


@pytest.fixture(scope="module")
def exact():
    counter = acc.TokenCounter()
    counter.start_loading("cl100k_base")
    assert wait_ready(counter, "cl100k_base", 60)
    return lambda text: counter.text_tokens(text, "cl100k_base")


def long_text(fact: str, paragraphs: int = 40) -> str:
    filler = "The committee reviewed the quarterly figures and asked for a careful estimate. " * 6
    middle = paragraphs // 2
    return "\n\n".join(fact if i == middle else f"{i}. {filler}".strip() for i in range(paragraphs))


# -- rendering: nothing clipped ----------------------------------------------------


def test_render_keeps_long_messages_tool_arguments_and_results_whole():
    user_text = long_text("FACT-USER-MIDDLE")
    arguments = json.dumps({"query": "x" * 3000 + " FACT-ARGS-MIDDLE " + "y" * 3000})
    result = "z" * 5000 + " FACT-RESULT-MIDDLE " + "w" * 5000
    messages = [
        {"role": "user", "content": user_text},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    blocks = acc.render_for_summary(messages, ["u1", "a1", "a1"])
    assert blocks[0] == "[#u1] user:\n" + user_text
    assert blocks[1] == f"[#a1] assistant:\n-> calls search({arguments})"
    assert blocks[2] == "[#a1] tool result of search:\n" + result
    assert len(user_text) > 6000 and len(result) > 1500 and len(arguments) > 600  # the old clip limits


def test_render_marks_images_audio_and_files_and_drops_their_data():
    data = "data:image/png;base64," + "A" * 20000
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on FACT-IMG?"},
                {"type": "image_url", "image_url": {"url": data}},
                {"type": "input_audio", "input_audio": {"data": "B" * 5000, "format": "wav"}},
                {"type": "file", "file": {"filename": "report.pdf", "file_data": "C" * 5000}},
                {"type": "file", "file": {"file_id": "f-1"}},
            ],
        }
    ]
    [block] = acc.render_for_summary(messages, ["u1"])
    assert block == "[#u1] user:\nWhat is on FACT-IMG?\n[image]\n[audio]\n[file: report.pdf]\n[file]"


def test_render_leaves_reasoning_out_and_names_authors_without_ids():
    messages = [{"role": "assistant", "name": "bot", "content": "<think>secret plan</think>The answer is 42."}]
    assert acc.render_for_summary(messages, [None]) == ["assistant (bot):\nThe answer is 42."]


# -- rounds: every character in exactly one round -----------------------------------

word = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=30)
separator = st.sampled_from([" ", "  ", "\n", "\n\n", "\t", ""])
body = st.lists(st.tuples(word, separator), max_size=60).map(lambda parts: "".join(a + b for a, b in parts))
block = st.tuples(st.integers(0, 999), st.sampled_from(["user", "assistant", "tool"]), body).map(
    lambda t: f"[#{t[0]}] {t[1]}:\n{t[2]}"
)


def check_rounds(blocks, rounds, budget, count, stops=None):
    n = len(blocks)
    pieces = [piece for r in rounds for piece in r.pieces]
    # every block, in order, split into consecutive pieces joining back to it
    assert [p.block for p in pieces] == sorted(p.block for p in pieces)
    for i, text in enumerate(blocks):
        mine = [p for p in pieces if p.block == i]
        assert mine, f"block {i} missing"
        assert "".join(p.text for p in mine) == text
        assert [p.part for p in mine] == list(range(1, len(mine) + 1))
        assert all(p.parts == len(mine) for p in mine)
    # each round fits the budget
    for r in rounds:
        cost = sum(count(t) + 2 for t in r.texts())
        assert cost <= budget, (cost, budget, r.texts())
    # coverage: monotone, only at message ends and allowed stops, complete at the end
    allowed = set(range(1, n + 1)) if stops is None else set(stops) | {n}
    done = [r.done for r in rounds]
    assert done == sorted(done)
    for r in rounds:
        last = r.pieces[-1]
        assert r.at_message_end == (last.part == last.parts)
        assert r.done == (last.block + 1 if r.at_message_end else last.block)
        assert r.covered in (None, r.done)
        assert (r.covered is not None) == (r.at_message_end and r.done in allowed)
    if n:
        assert rounds[-1].done == n and rounds[-1].covered == n
    else:
        assert rounds == []


@PROPS
@given(st.lists(block, max_size=8), st.integers(40, 300))
def test_plan_rounds_puts_every_character_in_exactly_one_round(blocks, budget):
    rounds = acc.plan_rounds(blocks, budget, rough_count)
    check_rounds(blocks, rounds, budget, rough_count)


@PROPS
@given(st.lists(block, min_size=1, max_size=8), st.integers(40, 300), st.data())
def test_plan_rounds_ends_coverage_at_allowed_stops_only(blocks, budget, data):
    stops = data.draw(st.sets(st.integers(1, len(blocks))))
    rounds = acc.plan_rounds(blocks, budget, rough_count, stops=stops)
    check_rounds(blocks, rounds, budget, rough_count, stops)


def test_plan_rounds_with_the_real_tokenizer_fits_the_budget_and_keeps_the_middle(exact):
    blocks = [
        "[#u1] user:\nshort question",
        "[#u2] user:\n" + long_text("FACT-MIDDLE-OF-A-HUGE-MESSAGE", paragraphs=400),
        "[#a2] assistant:\nshort answer",
    ]
    rounds = acc.plan_rounds(blocks, 1000, exact)
    check_rounds(blocks, rounds, 1000, exact)
    assert len(rounds) >= 10
    parts = rounds[1].pieces[0].parts
    assert rounds[0].texts() == [blocks[0]]  # a whole block is sent as it is
    assert rounds[0].covered == 1  # and the coverage may advance after it
    assert rounds[1].texts()[0].startswith(f"(part 1 of {parts}) [#u2] user:\n")
    assert rounds[2].texts()[0].startswith(f"(part 2 of {parts}) [#u2] user continued:\n")
    assert all(r.covered is None and not r.at_message_end for r in rounds[1:-1])
    assert sum("FACT-MIDDLE-OF-A-HUGE-MESSAGE" in t for r in rounds for t in r.texts()) == 1
    # pieces end at paragraph breaks where there are any
    assert all(p.text.endswith("\n\n") for r in rounds for p in r.pieces if p.block == 1 and p.part < p.parts)
    # the small last block rides with the huge one's last piece
    assert rounds[-1].pieces[-1].block == 2 and rounds[-1].pieces[-2].part == parts


def test_split_text_cuts_at_line_then_word_then_anywhere():
    lines = "\n".join(f"line {i} with some words" for i in range(50))
    pieces = acc.split_text(lines, 30, rough_count)
    assert "".join(pieces) == lines and len(pieces) > 1
    assert all(p.endswith("\n") for p in pieces[:-1])
    words = " ".join(f"word{i}" for i in range(200))
    pieces = acc.split_text(words, 25, rough_count)
    assert "".join(pieces) == words and all(p.endswith(" ") for p in pieces[:-1])
    solid = "x" * 5000
    pieces = acc.split_text(solid, 100, lambda t: len(t) // 4 + 1)
    assert "".join(pieces) == solid and len(pieces) > 1
    assert all(len(p) // 4 + 1 <= 100 for p in pieces)
    assert acc.split_text("", 10, rough_count) == [""]


def test_split_text_of_a_huge_text_counts_each_character_a_bounded_number_of_times(exact):
    text = long_text("FACT-MIDDLE", paragraphs=1000)  # about 500 kB
    counted = []

    def count(t):
        counted.append(len(t))
        return exact(t)

    pieces = acc.split_text(text, 4000, count)
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(exact(p) <= 4000 for p in pieces)
    assert sum(counted) < 20 * len(text)  # not quadratic: each piece's search stays near the piece
    assert sum("FACT-MIDDLE" in p for p in pieces) == 1


def test_rounds_prefer_to_end_at_a_stop_when_the_unit_fits():
    blocks = [f"[#m{i}] user:\n" + "word " * 20 for i in range(6)]
    cost = rough_count(blocks[0]) + 2
    # units of two messages (a call and its result); room for three messages a round
    rounds = acc.plan_rounds(blocks, cost * 3, rough_count, stops=[2, 4, 6])
    assert [r.covered for r in rounds] == [2, 4, 6]


def test_round_budget_leaves_room_for_the_answer_and_the_instructions():
    window, answer = 8000, 500
    budget = acc.summary_round_budget(window, answer, len)
    frame = acc.build_summarizer_messages("", [], answer)
    assert budget == window - answer - sum(len(m["content"]) for m in frame) - 200
    faithful = acc.summary_round_budget(window, answer, len, style="faithful")
    assert faithful == budget + len(frame[0]["content"]) - len(acc.summary_instructions(answer, "faithful"))
    assert acc.summary_round_budget(100, 500, len) == 1


# -- the request: styles, a custom prompt ---------------------------------------------


def test_each_style_has_its_own_prompt_and_a_custom_prompt_replaces_only_the_instructions():
    concise = acc.build_summarizer_messages("", ["b"], 300, style="concise")[0]["content"]
    balanced = acc.build_summarizer_messages("", ["b"], 300)[0]["content"]
    faithful = acc.build_summarizer_messages("", ["b"], 300, style="faithful")[0]["content"]
    assert len({concise, balanced, faithful}) == 3
    assert "verbatim" in faithful and all(w in faithful for w in ("figure", "name", "identifier", "path", "decision"))
    assert all("at most 300 tokens" in p for p in (concise, balanced, faithful))
    assert balanced == acc._SUMMARY_FRAME.replace("{instructions}", acc._SUMMARY_STYLES["balanced"]).replace(
        "{max_tokens}", "300"
    )
    assert acc.build_summarizer_messages("", ["b"], 300, style="unknown")[0]["content"] == balanced
    custom = acc.build_summarizer_messages("", ["b"], 300, style="faithful", prompt="Summarize {max_tokens} {x}")
    assert custom[0]["content"] == "Summarize 300 {x}"  # replaces the instructions; other braces kept
    assert acc.build_summarizer_messages("", ["b"], 300, prompt="   ")[0]["content"] == balanced


def test_request_carries_the_previous_summary_and_the_blocks():
    messages = acc.build_summarizer_messages("old summary", ["[#u1] user:\nhi", "(part 1 of 2) x"], 100)
    assert messages[1] == {
        "role": "user",
        "content": "Previous summary:\nold summary\n\nNew messages to fold in:\n[#u1] user:\nhi\n\n(part 1 of 2) x",
    }
    assert "(none yet)" in acc.build_summarizer_messages("  ", [], 100)[1]["content"]


def test_summary_form_merges_admin_parameters_without_taking_over_the_call():
    params = {
        "chat_template_kwargs": {"enable_thinking": False},
        "top_p": 0.5,
        "seed": None,
        "model": "other",
        "messages": [],
        "stream": True,
        "max_tokens": 99999,
        "temperature": 1.5,
        "metadata": {"task": "x"},
    }
    messages = [{"role": "user", "content": "x"}]
    form = acc.summary_form("m", messages, 256, 0.1, params)
    assert form == {
        "model": "m",
        "messages": messages,
        "stream": False,
        "max_tokens": 256,
        "temperature": 0.1,
        "top_p": 0.5,
        "chat_template_kwargs": {"enable_thinking": False},
        "metadata": {"task": "async_context_compression"},
    }
    form["chat_template_kwargs"]["enable_thinking"] = True
    assert params["chat_template_kwargs"] == {"enable_thinking": False}  # a copy: the valve is never changed
    assert acc.summary_form("m", messages, 256, 0.1, "garbage") == acc.summary_form("m", messages, 256, 0.1)


# -- the answer ---------------------------------------------------------------------------


def chat(content, **message):
    return {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"message": {"role": "assistant", "content": content, **message}}],
    }


def sse(*events) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def delta(**d):
    return {"choices": [{"index": 0, "delta": d}]}


def kind_of(response) -> "acc.Fault":
    with pytest.raises(acc.SummaryError) as info:
        acc.completion_text(response)
    return info.value.fault


SHAPES = {
    "chat string": chat("S1"),
    "chat parts": chat([{"type": "text", "text": "S"}, {"type": "output_text", "text": "1"}]),
    "chat with reasoning": chat("S1", reasoning_content="thinking..."),
    "think block kept for cleaning": chat("<think>x</think>S1"),
    "Responses output": {
        "object": "response",
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "S1"}]},
        ],
    },
    "Responses output_text": {"object": "response", "output_text": "S1", "output": []},
    "Ollama native": {"model": "m", "message": {"role": "assistant", "content": "S1"}},
    "SSE chat": sse(delta(role="assistant"), delta(content="S"), delta(content="1"), delta()),
    "SSE chat bytes": sse(delta(content="S1")).encode(),
    "SSE chat after reasoning": sse(delta(reasoning_content="hmm"), delta(content="S1")),
    "SSE with Open WebUI's arena line": sse({"selected_model_id": "x"}, delta(content="S1")),
    "SSE Responses deltas": "".join(
        f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
        for e in (
            {"type": "response.created", "response": {}},
            {"type": "response.reasoning_summary_text.delta", "delta": "thinking"},
            {"type": "response.output_text.delta", "delta": "S"},
            {"type": "response.output_text.delta", "delta": "1"},
            {"type": "response.output_text.done", "text": "S1"},
            {
                "type": "response.completed",
                "response": {"output": [{"type": "message", "content": [{"type": "output_text", "text": "S1"}]}]},
            },
        )
    ),
    "SSE Responses completed only": sse(
        {
            "type": "response.completed",
            "response": {"output": [{"type": "message", "content": [{"type": "output_text", "text": "S1"}]}]},
        }
    ),
    "JSON text": json.dumps(chat("S1")),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_completion_text_reads_every_answer_shape(shape):
    assert acc.clean_summary_answer(acc.completion_text(SHAPES[shape])) == "S1"


REASONING_ONLY = {
    "reasoning_content": chat("", reasoning_content="long thoughts"),
    "reasoning, content null": chat(None, reasoning="long thoughts"),
    "think block only": chat("<think>long thoughts</think>\n"),
    "unclosed think": chat("<think>long thoughts that never end"),
    "Responses reasoning item only": {
        "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]}]
    },
    "SSE reasoning deltas": sse(delta(reasoning_content="a"), delta(reasoning_content="b"), delta(content="")),
    "SSE think in content": sse(delta(content="<think>"), delta(content="x"), delta(content="</think>")),
    "SSE Responses reasoning": sse({"type": "response.reasoning_text.delta", "delta": "x"}),
}


@pytest.mark.parametrize("shape", list(REASONING_ONLY))
def test_reasoning_only_answers_fail(shape):
    assert kind_of(REASONING_ONLY[shape]) is acc.Fault.REASONING_ONLY


EMPTY = {
    "content empty": chat(""),
    "content null": chat(None),
    "blank": chat("   \n"),
    "Responses empty": {"output": []},
    "SSE empty": sse(delta(role="assistant"), delta()),
    "SSE nothing": "",
}


@pytest.mark.parametrize("shape", list(EMPTY))
def test_empty_answers_fail(shape):
    assert kind_of(EMPTY[shape]) is acc.Fault.EMPTY


def test_clean_summary_answer_names_its_fault():
    for text, fault in (("", acc.Fault.EMPTY), (None, acc.Fault.EMPTY), ("<think>x</think>", acc.Fault.REASONING_ONLY)):
        with pytest.raises(acc.SummaryError) as info:
            acc.clean_summary_answer(text)
        assert info.value.fault is fault
    assert acc.clean_summary_answer("<conversation_summary>S1</conversation_summary>") == "S1"


ERRORS = {
    "OpenAI error": {"error": {"message": "model overloaded", "type": "server_error"}},
    "pipe error": {"error": {"detail": "model overloaded"}},
    "detail only": {"detail": "model overloaded"},
    "Responses failed": {"status": "failed", "output": [], "error": {"message": "model overloaded"}},
    "SSE error event": sse(delta(content="S"), {"error": {"message": "model overloaded"}}),
    "SSE Responses failed": sse({"type": "response.failed", "response": {"error": {"message": "model overloaded"}}}),
}


@pytest.mark.parametrize("shape", list(ERRORS))
def test_error_payloads_fail_with_their_message(shape):
    with pytest.raises(acc.SummaryError) as info:
        acc.completion_text(ERRORS[shape])
    assert info.value.fault is acc.Fault.MODEL_ERROR and "model overloaded" in str(info.value)


def test_unreadable_payloads_fail():
    assert kind_of({"choices": []}) is acc.Fault.UNREADABLE
    assert kind_of({"something": "else"}) is acc.Fault.UNREADABLE
    assert kind_of(42) is acc.Fault.UNREADABLE


async def test_response_text_reads_open_webuis_response_objects_and_names_http_errors():
    from starlette.responses import JSONResponse, PlainTextResponse

    assert await acc.response_text(JSONResponse(chat("S1"))) == "S1"
    with pytest.raises(acc.SummaryError, match="HTTP 400.*context length"):
        await acc.response_text(JSONResponse({"error": {"message": "context length exceeded"}}, status_code=400))
    with pytest.raises(acc.SummaryError, match="HTTP 502: bad gateway"):
        await acc.response_text(PlainTextResponse("bad gateway", status_code=502))


async def test_response_text_reads_a_streaming_response():
    from starlette.responses import StreamingResponse

    async def body():
        yield b"data: " + json.dumps(delta(content="S")).encode() + b"\n\n"
        yield "data: " + json.dumps(delta(content="1")) + "\n\ndata: [DONE]\n\n"

    assert await acc.response_text(StreamingResponse(body(), media_type="text/event-stream")) == "S1"

    async def reasoning():
        yield "data: " + json.dumps(delta(reasoning_content="only thoughts")) + "\n\n"

    with pytest.raises(acc.SummaryError) as info:
        await acc.response_text(StreamingResponse(reasoning(), media_type="text/event-stream"))
    assert info.value.fault is acc.Fault.REASONING_ONLY


async def test_response_text_keeps_a_character_split_between_stream_chunks():
    from starlette.responses import StreamingResponse

    stream = ("data: " + json.dumps(delta(content="摘要"), ensure_ascii=False) + "\n\ndata: [DONE]\n\n").encode()
    cut = stream.index("要".encode()) + 1  # inside the character's three bytes

    async def body():
        yield stream[:cut]
        yield stream[cut:]

    assert await acc.response_text(StreamingResponse(body(), media_type="text/event-stream")) == "摘要"


# -- owui_complete against a stand-in Open WebUI ------------------------------------------


@pytest.fixture
def fake_owui(monkeypatch):
    """``open_webui.utils.chat`` and ``open_webui.models.users`` replaced by
    stand-ins recording the form and answering with ``answer``."""
    seen: dict = {"answer": chat("S1")}

    async def generate_chat_completion(request, form, user, bypass_filter=False):
        seen.update(form=form, user=user, bypass_filter=bypass_filter)
        answer = seen["answer"]
        return answer() if callable(answer) else answer

    class Users:
        @staticmethod
        async def get_user_by_id(user_id):
            return types.SimpleNamespace(id=user_id) if user_id == "alice" else None

    modules = {
        "open_webui": types.ModuleType("open_webui"),
        "open_webui.utils": types.ModuleType("open_webui.utils"),
        "open_webui.utils.chat": types.ModuleType("open_webui.utils.chat"),
        "open_webui.models": types.ModuleType("open_webui.models"),
        "open_webui.models.users": types.ModuleType("open_webui.models.users"),
    }
    modules["open_webui.utils.chat"].generate_chat_completion = generate_chat_completion
    modules["open_webui.models.users"].Users = Users
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return seen


REQUEST = types.SimpleNamespace(state=types.SimpleNamespace())
MESSAGES = [{"role": "system", "content": "sum"}, {"role": "user", "content": "x"}]


async def test_owui_complete_sends_the_admin_parameters(fake_owui):
    params = {"chat_template_kwargs": {"enable_thinking": False}, "stream": True, "model": "evil"}
    text = await acc.owui_complete(REQUEST, {"id": "alice"}, "sum-model", MESSAGES, 256, 0.1, params)
    assert text == "S1"
    form = fake_owui["form"]
    assert (form["model"], form["messages"], form["stream"]) == ("sum-model", MESSAGES, False)
    assert form["chat_template_kwargs"] == {"enable_thinking": False}
    assert fake_owui["bypass_filter"] is True and fake_owui["user"].id == "alice"
    # the six-argument call of today's Filter still works
    assert await acc.owui_complete(REQUEST, {"id": "alice"}, "sum-model", MESSAGES, 256, 0.1) == "S1"
    assert "chat_template_kwargs" not in fake_owui["form"]


async def test_owui_complete_reads_a_stream_and_fails_on_reasoning(fake_owui):
    from starlette.responses import StreamingResponse

    async def body():
        yield sse(delta(content="S"), delta(content="1"))

    fake_owui["answer"] = lambda: StreamingResponse(body(), media_type="text/event-stream")
    assert await acc.owui_complete(REQUEST, {"id": "alice"}, "m", MESSAGES, 256, 0.1) == "S1"
    fake_owui["answer"] = chat("", reasoning_content="thoughts")
    with pytest.raises(acc.SummaryError) as info:
        await acc.owui_complete(REQUEST, {"id": "alice"}, "m", MESSAGES, 256, 0.1)
    assert info.value.fault is acc.Fault.REASONING_ONLY
    with pytest.raises(acc.SummaryError, match="user not found"):
        await acc.owui_complete(REQUEST, {"id": "mallory"}, "m", MESSAGES, 256, 0.1)


def _turns(n: int, words: int = 700) -> list:
    text = " ".join(f"w{i % 97}" for i in range(words))
    return [
        m
        for k in range(n)
        for m in ({"role": "user", "content": f"T{k} {text}"}, {"role": "assistant", "content": "ok"})
    ]


@pytest.mark.parametrize("previous, calls", [(300, 1), (2048, 2)])
def test_a_fold_is_one_call_where_the_window_holds_it_beside_the_summary_it_has(previous, calls):
    """Issue 44: room for the previous summary is what it takes, not max_summary_tokens, when one call holds the
    fold (two calls of one turn each made every fold at 8k); rounds only where it cannot."""
    f = acc.Filter()
    assert wait_ready(f.counter, "cl100k_base", 60)
    s = acc.resolve_settings(f.valves, "m", window=acc.Window(8192, "served"), summary_window=0)
    canon = _turns(3)  # three turns of ~1.2k tokens: the fold of a chat at 8k, in a summarizer as small
    branch = acc.Branch.of(canon, [f"m{i}" for i in range(len(canon))])
    record = acc.SummaryRecord("u", "c", branch.anchor, 0, 0, "", "x", summary_tokens=previous)
    rounds = f.summaries._rounds(branch, 0, len(canon), s, "", record)
    assert len(rounds) == calls
    count = partial(f.counter.text_tokens, encoding="cl100k_base")
    budget = acc.summary_round_budget(s.summary_window, s.max_summary_tokens, count)
    assert budget - 300 > sum(count(t) for r in rounds for t in r.texts()) > budget - s.max_summary_tokens
    uncounted = acc.SummaryRecord("u", "c", branch.anchor, 0, 0, "", "word " * previous)  # /compact's, as a base
    assert len(f.summaries._rounds(branch, 0, len(canon), s, "", uncounted)) == calls  # counted, not taken as 0
