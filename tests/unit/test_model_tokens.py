"""The cap in the model's own tokens (issue 19): reported usage read from
every provider's keys, a robust per-model ratio, one change of units, the
request's own bound, and a chat that grows past a 1.3x model's window
without one request over it."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import async_context_compression as acc
from devkit import probes
from devkit.fake_provider import ModelSpec, model_tokens

LONG = "The quarterly figures were compared with the plan in detail. " * 12


# -- reading usage ---------------------------------------------------------------


@pytest.mark.parametrize(
    "usage, expected",
    [
        ({"prompt_tokens": 120, "completion_tokens": 5, "input_tokens": 240}, (120, False)),  # OpenAI, tool loop
        ({"prompt_eval_count": 90, "eval_count": 3}, (90, False)),  # Ollama
        ({"prompt_n": 10, "cache_n": 70, "predicted_n": 4}, (80, False)),  # llama.cpp timings
        ({"input_tokens": 50, "cache_read_input_tokens": 400, "output_tokens": 9}, (450, True)),  # Anthropic-style
        ({"input_tokens": 64}, (64, True)),
        ({"completion_tokens": 5}, None),
        ({"prompt_tokens": 0, "prompt_eval_count": "x"}, None),
        ({"prompt_tokens": True}, None),
        ({"prompt_tokens": float("inf"), "input_tokens": 7}, (7, True)),  # Python's json reads Infinity
        (None, None),
        ("120", None),
    ],
)
def test_reported_prompt_tokens_from_every_provider(usage, expected):
    assert acc.reported_prompt_tokens(usage) == expected


def test_sample_ratio_is_clamped_and_small_requests_tell_nothing():
    assert acc.sample_ratio(1300, 1000) == pytest.approx(1.3)
    assert acc.sample_ratio(10_000, 1000) == acc.RATIO_CEILING
    assert acc.sample_ratio(10, 1000) == acc.RATIO_FLOOR
    assert acc.sample_ratio(30, acc.RATIO_MIN_TOKENS - 1) is None
    assert acc.sample_ratio(0, 1000) is None


@given(st.lists(st.floats(min_value=0.01, max_value=100, allow_nan=False), min_size=1, max_size=40))
def test_robust_ratio_stays_within_the_clamped_samples(ratios):
    value = acc.robust_ratio(ratios)
    recent = [min(max(r, acc.RATIO_FLOOR), acc.RATIO_CEILING) for r in ratios[-acc.RATIO_SAMPLES :]]
    assert min(recent) <= value <= max(recent)
    assert acc.RATIO_FLOOR <= value <= acc.RATIO_CEILING


@given(
    st.floats(min_value=0.6, max_value=2.0),
    st.integers(min_value=3, max_value=acc.RATIO_SAMPLES - 1),
    st.floats(min_value=0.0, max_value=1000.0),
)
def test_one_outlier_does_not_move_the_ratio(true_ratio, count, outlier):
    samples = [true_ratio] * count
    for at in range(count + 1):
        assert acc.robust_ratio(samples[:at] + [outlier] + samples[at:]) == pytest.approx(true_ratio)


def test_robust_ratio_without_samples_is_one():
    assert acc.robust_ratio([]) == 1.0


# -- the request's own bound -----------------------------------------------------------


def test_request_prompt_bound_from_num_ctx_less_the_replys_room():
    assert acc.RequestParams.of({"options": {"num_ctx": 8192, "num_predict": 1024}}).prompt_bound == 7168
    assert acc.RequestParams.of({"num_ctx": 4096, "max_tokens": 96}).prompt_bound == 4000
    assert acc.RequestParams.of({"options": {"num_ctx": 4096}, "max_completion_tokens": 1000}).prompt_bound == 3096
    model = {"id": "llama3", "info": {"params": {"num_ctx": 16384, "max_tokens": 2048}}}
    assert acc.RequestParams.of({"messages": []}, model).prompt_bound == 14336
    assert acc.RequestParams.of({"options": {"num_ctx": 2048, "num_predict": -1}}).prompt_bound == 2048
    assert acc.RequestParams.of({"max_tokens": 1000}).prompt_bound == 0  # no window known: the valves decide
    assert acc.RequestParams.of({"options": {"num_ctx": 100, "num_predict": 500}}).prompt_bound == 100
    assert acc.RequestParams.of(None, {"info": None}).prompt_bound == 0
    assert acc.RequestParams.of({"options": {"num_ctx": float("inf")}}).prompt_bound == 0


# -- one change of units ---------------------------------------------------------


def _settings(cap=15000, threshold=64000, **valves):
    values = acc.Filter.Valves(max_context_tokens=cap, compression_threshold_tokens=threshold, **valves)
    return acc.resolve_settings(values, "m")


def test_in_counted_units_divides_every_budget_once():
    s = _settings(15000, 9000)
    c = acc.in_counted_units(s, 1.3)
    room = 1.3 * (1 + acc.RATIO_SAFETY)  # a learned ratio keeps a little room
    assert (c.max_context, c.threshold, c.trigger_tokens) == (
        int(15000 / room),
        int(9000 / room),
        int(s.trigger_tokens / room),
    )
    assert c.model_cap == 15000 and c.scale == 1.3
    assert 0.98 * 15000 < acc.to_model_tokens(c, c.max_context) <= 15000
    same = acc.in_counted_units(s, None)  # nothing learned: today's counts
    assert (same.max_context, same.trigger_tokens, same.model_cap, same.scale) == (15000, s.trigger_tokens, 15000, 1.0)


def test_the_requests_bound_lowers_the_cap_and_the_trigger():
    s = _settings(15000, 64000)
    c = acc.in_counted_units(s, None, prompt_bound=6000)
    assert c.model_cap == 6000 and c.max_context == 6000
    assert c.trigger_tokens == int(s.trigger_tokens * 6000 / 15000)
    assert acc.in_counted_units(s, None, prompt_bound=90000).model_cap == 15000  # the valve is lower
    uncapped = acc.in_counted_units(_settings(0, 5000), None, prompt_bound=4000)
    assert uncapped.model_cap == 4000 and uncapped.trigger_tokens <= 3000


@given(st.integers(min_value=1, max_value=2_000_000), st.floats(min_value=0.1, max_value=5.0))
def test_the_cap_in_counted_units_never_exceeds_the_models_cap(cap, scale):
    s = acc.in_counted_units(_settings(cap, 0), scale)
    assert s.max_context * s.scale <= cap + 1e-6 or s.max_context == 1


def test_usage_shown_compares_the_figure_with_the_cap_it_is_shown_against():
    s = acc.in_counted_units(_settings(10000, 0, status_usage_threshold=0.8), 1.5)
    assert not acc.usage_shown(s, 7900)
    assert acc.usage_shown(s, 8000)


# -- ModelTokens -----------------------------------------------------------------------


def test_a_reply_relates_to_what_was_counted_for_it():
    t = acc.ModelTokens()
    assert t.scale("llama") is None
    t.note_sent("r1", "llama", "exact", 1000)
    assert t.learn("r1", {"prompt_tokens": 1300}) == ("llama", "exact", pytest.approx(1.3))
    assert t.scale("llama") == pytest.approx(1.3)
    assert t.scale("other") is None
    assert t.learn("r1", {"prompt_tokens": 5000}) is None  # related once
    assert t.learn("unknown", {"prompt_tokens": 5000}) is None
    assert t.unsaved and t.unsaved[-1][1:4] == ("llama", "exact", pytest.approx(1.3))


def test_a_tool_loop_relates_the_last_call_or_the_sum():
    t = acc.ModelTokens()
    for tokens in (1000, 1200, 1500):
        t.note_sent("r", "m", "exact", tokens)
    assert t.learn("r", {"prompt_tokens": 1950, "input_tokens": 4810})[2] == pytest.approx(1.3)
    for tokens in (1000, 1500):
        t.note_sent("q", "m", "exact", tokens)
    assert t.learn("q", {"input_tokens": 3000})[2] == pytest.approx(1.2)


def test_a_reply_at_the_requests_own_bound_may_have_been_cut():
    t = acc.ModelTokens()
    t.note_sent("r", "m", "exact", 5000, bound=4096)
    assert t.learn("r", {"prompt_eval_count": 4096}) is None
    t.note_sent("s", "m", "exact", 3000, bound=4096)
    assert t.learn("s", {"prompt_eval_count": 3600}) is not None


def test_the_estimator_has_its_own_ratio_and_falls_back_to_the_exact_one():
    t = acc.ModelTokens()
    t.note_sent("a", "m", "exact", 1000)
    t.learn("a", {"prompt_tokens": 1300})
    assert t.scale("m", "estimate") == pytest.approx(1.3)  # errs high: caps earlier, never later
    t.note_sent("b", "m", "estimate", 1000)
    t.learn("b", {"prompt_tokens": 900})
    assert t.scale("m", "estimate") == pytest.approx(0.9)
    t.note_sent("c", "m", "estimate", 1000)
    t.learn("c", {"prompt_tokens": 1000})
    t.note_sent("d", "m", "estimate", 1000)
    t.learn("d", {"prompt_tokens": 5000})  # an outlier
    assert t.scale("m", "estimate") == pytest.approx(1.0)  # the second highest: never the outlier
    assert t.scale("m", "exact") == pytest.approx(1.3)


def test_a_minutes_snapshot_holds_the_stores_samples_created_before_it():
    t = acc.ModelTokens()
    rows = [(f"w2:{i}", "m", "exact", 1.0 + i / 100, float(i)) for i in range(30)]
    late = [("w2:late", "m", "exact", 2.5, 60 - acc.RATIOS_SETTLE), ("w3:1", "m", "bogus-path", 2.0, 9.0)]
    t.snapshot(rows + late, minute=1)
    assert t.scale("m") == pytest.approx(acc.robust_ratio([1.0 + i / 100 for i in range(30)]))
    assert len(t.shared[("m", "exact", "")]) == acc.RATIO_SAMPLES and ("m", "bogus-path", "") not in t.shared
    t.snapshot([], minute=0)  # a read that outlived its minute changes nothing
    assert t.minute == 1 and t.scale("m") is not None


def test_tables_are_bounded():
    t = acc.ModelTokens(models=4, replies=8)
    for i in range(50):
        t.note_sent(f"r{i}", f"m{i}", "exact", 1000)
        t.add(f"m{i}", "exact", 1.1)
    assert len(t.counted) == 8 and len(t.own) == 4 * 8 and len(t.unsaved) <= 64


def _learned(t: acc.ModelTokens, store: "_Store", model: str, ratio: float, reply: str) -> None:
    t.note_sent(reply, model, "exact", 1000)
    assert t.learn(reply, {"prompt_tokens": round(1000 * ratio)}) is not None
    store.rows += t.unsaved  # what ModelTokens.flush writes
    t.unsaved = []


def test_workers_on_one_store_apply_the_same_ratio_all_minute_even_after_learning_here():
    store = _Store()
    store.rows = [(f"w0:{i}", "llama", "exact", 1.2, time.time() - 600 + i) for i in range(3)]
    one, two = acc.ModelTokens(), acc.ModelTokens()

    async def run():
        now = time.time()
        for t in (one, two):
            await t.refresh(store.read_ratios, now)
        for reply in ("r1", "r2", "r3", "r4"):  # learned on one, stored at once
            _learned(one, store, "llama", 2.0, reply)
        late = acc.ModelTokens()  # a worker whose first request comes later in the minute
        await late.refresh(store.read_ratios, now)
        assert one.scale("llama") == two.scale("llama") == late.scale("llama") == pytest.approx(1.2)
        later = max(row[4] for row in store.rows) + 60 + acc.RATIOS_SETTLE  # a minute that sees them
        for t in (one, two, late):
            await t.refresh(store.read_ratios, later)
        assert one.scale("llama") == two.scale("llama") == late.scale("llama") == pytest.approx(2.0)

    asyncio.run(run())


def test_a_new_model_calibrates_after_its_first_reply_on_the_worker_that_saw_it():
    store, one, two = _Store(), acc.ModelTokens(), acc.ModelTokens()

    async def run():
        now = time.time()
        for t in (one, two):
            await t.refresh(store.read_ratios, now)
        _learned(one, store, "qwen", 1.3, "r1")
        assert one.scale("qwen") == pytest.approx(1.3)  # its own sample: none in the snapshot yet
        assert two.scale("qwen") is None  # the window where workers differ, until the next minute
        await two.refresh(store.read_ratios, now + 60 + acc.RATIOS_SETTLE)
        assert two.scale("qwen") == pytest.approx(1.3)

    asyncio.run(run())


def test_a_store_that_cannot_be_read_keeps_the_last_snapshot():
    store, t = _Store(), acc.ModelTokens()
    store.rows = [("w0:1", "llama", "exact", 1.4, 0.0)]

    async def broken():
        raise acc.StoreUnavailable("down", acc.Fault.STORE_DOWN)

    async def run():
        await t.refresh(store.read_ratios, 120.0)
        await t.refresh(broken, 180.0)
        assert t.scale("llama") == pytest.approx(1.4) and t.minute == 3

    asyncio.run(run())


def test_usage_stored_on_a_chats_earlier_replies_teaches_no_ratio():
    """Issue 35: a chat imported or updated through the API carries whatever usage its user wrote on its replies; the
    ratios every user's caps follow are learned only from replies to requests the filter sent (1.4 replayed those of
    a chat's earlier replies for a model not known yet)."""
    f = acc.Filter()
    f.summaries.store = _Store()
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    forged = []
    for i in range(4):
        forged.append({"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"})
        forged.append({"id": f"a{i}", "role": "assistant", "content": "A.", "usage": {"prompt_tokens": 999_999}})

    async def run():
        meta = {"chat_id": "c1", "message_id": "a9"}  # a reply whose request this worker did not send
        reply = {"id": "a9", "role": "assistant", "content": "A."}
        body = {"id": "a9", "model": "llama", "chat_id": "c1", "messages": forged + [reply]}
        await f.outlet(body, {"id": "u1"}, meta)
        await f.wait_for_background(10)

    asyncio.run(run())
    assert f.tokens.scale("llama", "estimate") is None and not f.store.rows


def test_ratios_of_1_4s_replayed_path_in_the_store_are_not_applied():
    t = acc.ModelTokens()
    t.snapshot([("w:1", "llama", "replayed", 2.5, 0.0)], minute=1)
    assert t.scale("llama") is None and t.scale("llama", "estimate") is None


# -- the Filter: a chat growing past a 1.3x model's window --------------------------


class _Store(acc.NullStore):
    def __init__(self):
        self.rows = []

    async def find(self, *args, **kwargs):
        return []

    async def add_ratios(self, rows):
        self.rows += rows

    async def read_ratios(self):
        return list(self.rows)


def _run_chat(f, spec, turns, options=None, meta_extra=None):
    """inlet, request, then outlet with the usage the model reports for what
    it got; returns per reply (model's prompt tokens, status figure)."""
    lines: list = []

    async def emit(event):
        lines.append(event["data"]["description"])

    async def run():
        out = []
        stored = [{"role": "system", "content": "Be brief."}]
        for i in range(turns):
            stored.append({"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"})
            meta = {"chat_id": "c1", "message_id": f"a{i}", **(meta_extra or {})}
            body = {"model": "llama", "messages": [dict(m) for m in stored]}
            if options:
                body["options"] = options
            body = await f.inlet(body, {"id": "u1"}, meta, emit, None, None, "c1")
            body = await f.request(body, {"id": "u1"}, meta, emit, None, "c1")
            own = model_tokens(body["messages"], None, spec)
            reported = min(own, spec.window) if spec.window else own
            stored.append({"id": f"a{i}", "role": "assistant", "content": f"A{i} {LONG}"})
            outlet_messages = [dict(m) for m in stored[1:]]
            outlet_messages[-1]["usage"] = {"prompt_tokens": reported, "input_tokens": reported}
            await f.outlet({"id": f"a{i}", "chat_id": "c1", "messages": outlet_messages}, {"id": "u1"}, meta)
            await f.wait_for_background(10)
            figure = lines[-1].split(" / ")[0]
            out.append((own, figure))
        return out

    return asyncio.run(run())


def _figure(text: str) -> float:
    return float(text[:-1]) * 1000 if text.endswith("k") else float(text)


def test_a_chat_grows_past_the_window_of_a_13x_model_without_a_request_over_it():
    f = acc.Filter()
    f.summaries.store = _Store()
    f.valves.max_context_tokens = 4000
    f.valves.compression_threshold_tokens = 0
    f.valves.summary_model = "none-such"  # summaries would fail: only the cap protects
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    spec = ModelSpec(ratio=1.3, window=4400)
    replies = _run_chat(f, spec, 24)
    assert replies[-1][0] > 3000  # it really grew to the cap
    assert all(own <= 4000 for own, _ in replies[1:]), replies  # from the second reply on, the model's tokens
    assert replies[0][0] <= spec.window  # the first fits the window here; learned from its usage
    for own, figure in replies[1:]:
        assert abs(_figure(figure) - own) <= 0.05 * own, (own, figure)
    assert f.store.rows and {row[1] for row in f.store.rows} == {"llama"}  # shared through the store


def test_a_model_that_reports_no_usage_keeps_todays_counts():
    f = acc.Filter()
    f.summaries.store = _Store()
    f.valves.max_context_tokens = 4000
    f.valves.compression_threshold_tokens = 0
    assert probes.wait_ready(f.counter, "cl100k_base", 60)

    async def run():
        meta = {"chat_id": "c1", "message_id": "a0"}
        msgs = [{"role": "user", "content": LONG}]
        await f.request({"model": "llama", "messages": msgs}, {"id": "u1"}, meta, None, None, "c1")
        await f.outlet({"id": "a0", "messages": msgs + [{"id": "a0", "role": "assistant", "content": "x"}]}, None, meta)
        await f.wait_for_background(10)

    asyncio.run(run())
    assert f.tokens.scale("llama") is None and not f.store.rows


def test_the_requests_num_ctx_bounds_the_cap_whatever_the_valves_say():
    f = acc.Filter()
    f.summaries.store = _Store()
    f.valves.max_context_tokens = 128000
    f.valves.compression_threshold_tokens = 0
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    spec = ModelSpec(ratio=1.0, window=3000, on_overflow="cut")
    replies = _run_chat(f, spec, 16, options={"num_ctx": 3000, "num_predict": 200})
    assert max(own for own, _ in replies) > 2000
    assert all(own <= 2800 for own, _ in replies), replies


def test_ratios_stored_by_another_worker_are_used_without_a_reply_here():
    store = _Store()
    store.rows = [("w2:1", "llama", "exact", 1.3, 1.0), ("w2:2", "llama", "exact", 1.3, 2.0)]
    f = acc.Filter()
    f.summaries.store = store

    async def run():
        await f.inlet({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}, {"id": "u"}, {}, None)
        await f.wait_for_background(10)

    asyncio.run(run())
    assert f.tokens.scale("llama") == pytest.approx(1.3)


def test_a_workers_first_reply_of_a_model_plans_the_summary_at_the_ratio_it_just_taught():
    """CI, 1.5.0: on two workers, one's first reply of a 1.3x model came at a chat's sixth turn. Its outlet planned at
    the 1:1 its request had been fitted at, found no summary due, and the next turn, on the other worker (which knew
    the ratio), went out trimmed to the cap: a fact was missing until the summary came a turn late."""
    f = acc.Filter()
    f.summaries.store = _Store()
    f.valves.max_context_tokens = 9000
    assert probes.wait_ready(f.counter, "cl100k_base", 60)
    started, spec = [], ModelSpec(ratio=1.3)
    ratio = f.valves.summary_trigger_ratio

    async def fold(ctx, branch):
        started.append(ctx.settings.scale)

    f.summaries.run = fold

    async def reply(turns: int) -> dict:
        """Outlet of a reply at the chat's turn ``turns``, the model's first on this worker."""
        stored = []
        for i in range(turns):
            stored += [{"id": f"u{i}", "role": "user", "content": f"Q{i} {LONG}"}]
            stored += [{"id": f"a{i}", "role": "assistant", "content": f"A{i} {LONG}"}] if i < turns - 1 else []
        meta = {"chat_id": "c1", "message_id": f"a{turns - 1}"}
        body = await f.request({"model": "llama", "messages": [dict(m) for m in stored]}, {"id": "u1"}, meta, None)
        sent = model_tokens(body["messages"], None, spec)
        stored.append({"id": f"a{turns - 1}", "role": "assistant", "content": "A.", "usage": {"prompt_tokens": sent}})
        outlet_body = {"id": f"a{turns - 1}", "model": "llama", "chat_id": "c1", "messages": stored}  # as 0.12.4's
        await f.outlet(outlet_body, {"id": "u1"}, meta)
        return {"sent": sent, "counted": sent / spec.ratio}

    # a chat whose next request is over the trigger in the model's tokens, not at 1:1
    turns = next(n for n in range(2, 60) if (n + 1) * 2 * 130 * 1.3 > 9000 * ratio)
    figures = asyncio.run(reply(turns))
    assert figures["counted"] + 300 < 9000 * ratio < figures["sent"] + 300 * 1.3, (turns, figures)
    assert started and started[0] == pytest.approx(1.3, rel=0.01), (turns, figures, started)
