"""The request path's shortcuts (issue 5's performance work) change no result.

* each repair step runs its fix only when its own check finds the list
  breaking its invariant: a check must never pass a list the fix would have
  changed, and should not object to lists the fix leaves alone (else the
  shortcut is lost); the fast path, ``_needs_repair``, is their union.
* inlet's summary lookup fingerprints only as much history as a stored
  summary can cover: it must choose exactly what a full fingerprint would.
* ``_drop_turns`` remembers what is kept before a run of dropped turns: the
  same drops as scanning back every time.
"""

from __future__ import annotations

import asyncio
import json

from acc_builders import RecordStore, request_context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_context_compression as acc
from devkit.probes import canonical_view, needs_repair

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def all_passes(messages):
    """Every step's fix, run whether or not its check objects."""
    report = acc.RepairReport()
    out = list(messages)
    for step in acc._REPAIR_STEPS:
        out = step.fix(out, report)
    return out, report


def unchanged(messages, out, report) -> bool:
    return not report.changed() and len(out) == len(messages) and all(a is b for a, b in zip(out, messages))


ids = st.sampled_from(["c0", "c1", "c2", "x" * 41, "", None, 7, "functions.f:0", "c.1"])
names = st.sampled_from(["search", "bad name", "", None, "x" * 65, " search "])
calls = st.one_of(
    st.fixed_dictionaries(
        {
            "id": ids,
            "type": st.sampled_from(["function", "function", "function", None]),
            "function": st.one_of(
                st.fixed_dictionaries({"name": names, "arguments": st.sampled_from(["{}", "{}", {"q": 1}])}), st.none()
            ),
        }
    ),
    st.none(),
    st.just("junk"),
)
any_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", 3, "function"])},
        optional={
            "content": st.sampled_from(
                [
                    "hi",
                    "",
                    None,
                    [{"type": "text", "text": "x"}],
                    5,
                    [],
                    [{"type": "text"}],
                    ["bare"],
                    [{"type": "image_url", "image_url": {"url": "https://e.com/a.png"}}],
                    "  ",
                    [{"type": "text", "text": " "}],
                ]
            ),
            "tool_calls": st.one_of(st.lists(calls, max_size=3), st.none(), st.just([])),
            "tool_call_id": ids,
            "name": st.sampled_from(["ok", "bad name", None, 5]),
            "stopReason": st.sampled_from(["error", "stop"]),
            "error": st.sampled_from([None, "boom"]),
        },
    ),
    st.none(),
    st.just("text"),
)


@st.composite
def near_valid_chats(draw):
    """Valid chats (tool chains, late system messages, maybe ids reused every
    turn), then 0-2 mutations."""
    out = [{"role": "system", "content": "s"}] if draw(st.booleans()) else []
    count = 0
    reuse = draw(st.booleans())  # ids restart every turn, as some providers do
    for _ in range(draw(st.integers(0, 5))):
        out.append({"role": "user", "content": "u"})
        if draw(st.booleans()):
            k = draw(st.integers(1, 3))
            call_ids = [f"c{(0 if reuse else count) + i}" for i in range(k)]
            count += k
            out.append(
                {
                    "role": "assistant",
                    "content": draw(st.sampled_from([None, "", "t"])),
                    "tool_calls": [
                        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in call_ids
                    ],
                }
            )
            out += [{"role": "tool", "tool_call_id": c, "content": "r"} for c in call_ids]
            if draw(st.booleans()):
                out.append({"role": "system", "content": "late"})
        out.append({"role": "assistant", "content": "a"})
    for _ in range(draw(st.integers(0, 2))):
        if not out:
            break
        i = draw(st.integers(0, len(out) - 1))
        kind = draw(st.integers(0, 6))
        if kind == 0:
            j = draw(st.integers(0, len(out) - 1))
            out[i], out[j] = out[j], out[i]
        elif kind == 1:
            del out[i]
        elif kind == 2:
            out.insert(i, dict(out[i]))
        else:
            changed = dict(out[i])
            key, value = {
                3: ("tool_call_id", draw(st.sampled_from(["c0", "c1", "zz", None, "c:0"]))),
                4: ("content", draw(st.sampled_from([None, "", " "]))),
                5: ("stopReason", "error"),
                6: ("name", draw(st.sampled_from(["bad name", "ok"]))),
            }[kind]
            changed[key] = value
            out[i] = changed
    return out


@SETTINGS
@given(st.one_of(st.lists(any_message, max_size=8), near_valid_chats()))
def test_the_repair_shortcut_is_taken_exactly_when_no_pass_changes_anything(messages):
    out, report = all_passes(messages)
    assert needs_repair(messages) == (not unchanged(messages, out, report))


@SETTINGS
@given(st.one_of(st.lists(any_message, max_size=8), near_valid_chats()))
def test_each_step_check_objects_exactly_when_its_fix_would_change_the_list(messages):
    out = list(messages)
    for step in acc._REPAIR_STEPS:
        report = acc.RepairReport()
        fixed = step.fix(out, report)
        broken = step.broken(acc.TranscriptView(out))
        assert broken == (not unchanged(out, fixed, report)), step.fix.__name__
        assert step(out, acc.RepairReport()) is out or broken
        out = fixed


@SETTINGS
@given(st.one_of(st.lists(any_message, max_size=8), near_valid_chats()))
def test_a_step_whose_check_passes_returns_its_input_list_itself(messages):
    out = list(messages)
    for step in acc._REPAIR_STEPS:
        if not step.broken(acc.TranscriptView(out)):
            assert step(out, acc.RepairReport()) is out, step.fix.__name__
        out = step(out, acc.RepairReport())


@SETTINGS
@given(near_valid_chats())
def test_repair_transcript_returns_what_the_passes_return(messages):
    fast, fast_report = acc.repair_transcript(messages)
    slow, slow_report = all_passes(messages)
    assert fast == slow and fast_report == slow_report


_FILTERS: list = []


def _shared_filter() -> "acc.Filter":
    if not _FILTERS:
        _FILTERS.append(acc.Filter())
    return _FILTERS[0]


@SETTINGS
@given(st.integers(3, 12), st.lists(st.tuples(st.integers(-1, 14), st.integers(-1, 14), st.booleans()), max_size=4))
def test_summary_lookup_fingerprints_only_what_it_needs_and_chooses_the_same(length, specs):
    messages = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(length)
    ]
    canon, digests = canonical_view(messages)
    records = []
    for head, covered, matches in specs:
        fingerprint = acc.prefix_fingerprint(digests, max(0, covered)) if matches else "0" * 64
        records.append(
            acc.SummaryRecord(
                user_id="u",
                chat_id="c",
                anchor=acc.conversation_anchor(digests),
                head_count=head,
                covered_count=covered,
                fingerprint=fingerprint,
                summary="s",
            )
        )
    f = _shared_filter()
    f.summaries.store = RecordStore(records)
    ctx = request_context(f.valves)
    chosen, fault = asyncio.run(f.path.lookup_summary(ctx, acc.canonical_messages(messages)))
    assert fault is None
    usable = [r for r in records if acc.summary_tail_joins(canon, r.head_count, r.covered_count)]
    assert chosen is acc.choose_summary(usable, digests)


def _drop_turns_by_scanning(messages, sizes, keep, turns, total, cap, report):
    """``_drop_turns`` as it was before the shortcut: scan back every time."""
    for start, end in turns:
        if total <= cap:
            break
        if not any(keep[start:end]):
            continue
        if not (
            acc._joinable(
                acc._first_kept(messages, keep, range(start - 1, -1, -1)),
                acc._first_kept(messages, keep, range(end, len(messages))),
            )
            and acc._opens_with_user(messages, keep, start, end)
        ):
            continue
        for i in range(start, end):
            if keep[i]:
                keep[i] = False
                total -= sizes[i]
                report.dropped_messages += 1
        report.dropped_turns += 1
    return total


@SETTINGS
@given(near_valid_chats(), st.integers(0, 40), st.integers(0, 3))
def test_dropping_turns_remembers_what_scanning_would_find(messages, cap, keep_first):
    messages, _ = acc.repair_transcript(messages)
    sizes = [3 + len(str(m.get("content") or "")) for m in messages]
    lo = acc.protected_head_end(messages, keep_first)
    hi = max(0, acc._last_user_index(messages))
    tail = acc._droppable_turns(messages, lo, hi)
    # as fit_to_budget calls it: the tail's turns, then (the head yielding)
    # the head's turns followed by the tail's again
    keep_a, keep_b = [True] * len(messages), [True] * len(messages)
    report_a, report_b = acc.FitReport(), acc.FitReport()
    total_a = acc._drop_turns(messages, sizes, keep_a, tail, sum(sizes), cap, report_a)
    total_b = _drop_turns_by_scanning(messages, sizes, keep_b, tail, sum(sizes), cap, report_b)
    assert (total_a, keep_a, report_a) == (total_b, keep_b, report_b)
    turns = acc._droppable_turns(messages, 0, min(lo, hi)) + tail
    total_a = acc._drop_turns(messages, sizes, keep_a, turns, total_a, cap, report_a)
    total_b = _drop_turns_by_scanning(messages, sizes, keep_b, turns, total_b, cap, report_b)
    assert (total_a, keep_a, report_a) == (total_b, keep_b, report_b)


def _copied(messages: list) -> list:
    """The same messages as new objects, as Open WebUI parses each request anew."""
    return json.loads(json.dumps(messages))


@SETTINGS
@given(st.one_of(st.lists(any_message, max_size=8), near_valid_chats()), st.integers(0, 7), st.sampled_from(["", "x"]))
def test_a_chats_digests_remembered_between_requests_are_those_digesting_finds(messages, at, edit):
    """A chat's state answers ``canonical_digests`` again from memory while its prefix is unchanged: for the same
    messages in new objects, and never once one message's text, role or calls changed."""
    messages = [m for m in messages if isinstance(m, dict)]
    state = acc.ChatState()
    assert state.digests_of(messages) == acc.canonical_digests(messages)
    again = _copied(messages)
    assert state.digests_of(again) == acc.canonical_digests(messages)
    if messages:
        changed = _copied(messages)
        target = changed[at % len(changed)]
        target["content"] = f"{target.get('content')}{edit}" if edit else None
        assert state.digests_of(changed) == acc.canonical_digests(changed)


def test_messages_identity_tells_plain_text_lists_apart_and_declines_parts_and_calls():
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert acc.messages_identity(chat) == acc.messages_identity(_copied(chat)) is not None
    assert acc.messages_identity(chat) != acc.messages_identity([chat[0], {**chat[1], "content": "c"}])
    assert acc.messages_identity(chat) != acc.messages_identity([chat[0], {**chat[1], "role": "user"}])
    assert acc.messages_identity(chat) != acc.messages_identity(chat[:1])
    assert acc.messages_identity([{"role": "user", "content": [{"type": "text", "text": "a"}]}]) is None
    called = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    assert acc.messages_identity([called]) is None
    assert acc.messages_identity(["not a message"]) is None


def test_a_chat_digests_its_inlet_list_and_its_hook_list_once_each_between_folds(monkeypatch):
    """Inlet looks up the long list, the request hook the short one inlet sent, turn after turn: each is digested
    once, then answered from memory while it is unchanged (one memory slot thrashed between the two)."""
    digested = []
    monkeypatch.setattr(acc, "canonical_digests", lambda ms: digested.append(len(ms)) or [str(len(ms))] * len(ms))
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(40)]
    short = long[-3:]
    state = acc.ChatState()
    for _ in range(3):
        assert state.digests_of(_copied(long)) == ["40"] * 40
        assert state.digests_of(_copied(short)) == ["3"] * 3
    assert digested == [40, 3]
    state.digests_of(long[:-1] + [{"role": "user", "content": "edited"}])
    assert digested == [40, 3, 40]
