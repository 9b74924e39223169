"""Atomic units, tail-boundary alignment and the protected head.

A unit is what must be kept or dropped together: ``assistant(tool_calls)``
with all its results, further call/result steps of the same chain and the
assistant answer that consumes the last results. Everything else is a unit
of its own, a stray tool message included.
"""

import pytest
from acc_builders import AS, A, S, T, U, frozen

import async_context_compression as acc
from devkit.provider_rules import check_openai

# -- get_atomic_groups / atomic_spans ------------------------------------------


def test_chain_with_follow_up_is_one_unit():
    messages = [S(), U(), A("a"), T("a"), AS(), U("again")]
    assert acc.get_atomic_groups(messages) == [[0], [1], [2, 3, 4], [5]]
    assert list(acc.atomic_spans(messages)) == [(0, 1), (1, 2), (2, 5), (5, 6)]


def test_parallel_calls_form_one_unit():
    messages = [U(), A("a", "b", "c"), T("b"), T("a"), T("c"), AS(), U()]
    assert acc.get_atomic_groups(messages) == [[0], [1, 2, 3, 4, 5], [6]]


def test_multi_step_chain_is_one_unit():
    messages = [U(), A("a", "b"), T("a"), T("b"), A("c"), T("c"), A("d"), T("d"), AS("done"), U()]
    assert acc.get_atomic_groups(messages) == [[0], [1, 2, 3, 4, 5, 6, 7, 8], [9]]


def test_chain_without_follow_up_ends_at_next_non_tool_message():
    assert acc.get_atomic_groups([U(), A("a"), T("a"), U()]) == [[0], [1, 2], [3]]
    # still open at the end of the list (a tool loop in progress)
    assert acc.get_atomic_groups([U(), A("a"), T("a")]) == [[0], [1, 2]]
    assert acc.get_atomic_groups([U(), A("a"), T("a"), A("b")]) == [[0], [1, 2, 3]]


def test_call_turn_directly_followed_by_another_call_turn_is_a_unit_of_its_own():
    assert acc.get_atomic_groups([U(), A("a"), A("b"), T("b"), AS()]) == [[0], [1], [2, 3, 4]]


def test_stray_tool_message_is_its_own_unit():
    messages = [T("x"), T("y"), U(), AS(), T("z"), U()]
    assert acc.get_atomic_groups(messages) == [[0], [1], [2], [3], [4], [5]]


def test_system_message_breaks_a_chain():
    messages = [U(), A("a"), T("a"), S("late"), T("a"), AS()]
    assert acc.get_atomic_groups(messages) == [[0], [1, 2], [3], [4], [5]]


def test_user_message_breaks_a_chain_and_later_results_are_strays():
    messages = [U(), A("a", "b"), T("a"), U("meanwhile"), T("b"), AS()]
    assert acc.get_atomic_groups(messages) == [[0], [1, 2], [3], [4], [5]]


def test_empty_list_has_no_units_and_malformed_entries_are_units_of_their_own():
    assert acc.get_atomic_groups([]) == []
    assert list(acc.atomic_spans([])) == []
    # non-dict entries and missing roles are units of their own, never a crash
    assert acc.get_atomic_groups(["x", {"content": "no role"}, None]) == [[0], [1], [2]]
    # tool_calls: [] is not a call turn
    assert acc.get_atomic_groups([U(), {"role": "assistant", "content": "x", "tool_calls": []}, T("a")]) == [
        [0],
        [1],
        [2],
    ]


def test_groups_cover_every_index_once_in_order():
    messages = [
        S(),
        T("o"),
        U(),
        A("a"),
        T("a"),
        S("mid"),
        U(),
        A("b", "c"),
        T("c"),
        T("b"),
        A("d"),
        T("d"),
        AS(),
        AS(),
        U(),
    ]
    groups = acc.get_atomic_groups(messages)
    assert [i for g in groups for i in g] == list(range(len(messages)))
    assert groups == [[0], [1], [2], [3, 4], [5], [6], [7, 8, 9, 10, 11, 12], [13], [14]]


def test_every_tail_cut_of_a_tool_chat_lands_on_a_unit_and_passes_the_provider_rules():
    """In a 33-message chat of user -> call -> result -> answer rounds (one
    result an error), each call, its result and its answer are one unit, and
    a tail cut anywhere starts on a unit boundary, never on a tool result, and
    gives a list OpenAI's rules accept."""
    messages = [S()]
    for k in range(8):
        messages += [U(f"q{k}"), A(f"c{k}"), T(f"c{k}", "error: timeout" if k == 3 else "ok"), AS(f"a{k}")]
    assert len(messages) == 33
    groups = acc.get_atomic_groups(messages)
    assert groups[0] == [0]
    for k in range(8):
        base = 1 + 4 * k
        assert groups[1 + 2 * k] == [base]
        assert groups[2 + 2 * k] == [base + 1, base + 2, base + 3]
    for keep_last in range(0, 33):
        raw = max(0, len(messages) - keep_last)
        start = acc.align_tail_start_to_atomic_boundary(messages, raw, 1)
        assert start in {0, 1} | {g[0] for g in groups} | {len(messages)}
        tail = messages[start:]
        if tail:
            assert tail[0]["role"] != "tool"
            assert check_openai([S()] + tail) == []


def test_groups_do_not_mutate_input():
    messages = [U(), A("a"), T("a"), AS()]
    before = frozen(messages)
    acc.get_atomic_groups(messages)
    list(acc.atomic_spans(messages))
    assert messages == before


# -- align_tail_start_to_atomic_boundary -----------------------------------------

CHAT = [S(), U(), A("a", "b"), T("a"), T("b"), AS(), U("two"), AS("two")]
#        0    1    2          3       4       5     6         7


@pytest.mark.parametrize("raw", [3, 4, 5])
def test_cut_inside_a_unit_moves_back_to_its_start(raw):
    assert acc.align_tail_start_to_atomic_boundary(CHAT, raw, 1) == 2


@pytest.mark.parametrize("raw", [1, 2, 6, 7])
def test_cut_on_a_boundary_stays(raw):
    assert acc.align_tail_start_to_atomic_boundary(CHAT, raw, 1) == raw


def test_cut_never_moves_below_the_protected_prefix():
    assert acc.align_tail_start_to_atomic_boundary(CHAT, 0, 2) == 2
    assert acc.align_tail_start_to_atomic_boundary(CHAT, 1, 2) == 2
    assert acc.align_tail_start_to_atomic_boundary(CHAT, 5, 2) == 2


def test_unit_straddling_the_prefix_moves_the_cut_forward_to_its_end():
    # the unit [2, 6) begins inside the protected prefix (3): its end is the
    # only boundary left
    for prefix in (3, 4, 5):
        for raw in range(0, 6):
            assert acc.align_tail_start_to_atomic_boundary(CHAT, raw, prefix) == 6
    assert acc.align_tail_start_to_atomic_boundary(CHAT, 7, 3) == 7


@pytest.mark.parametrize(
    "raw, prefix, expected",
    [
        (-5, 0, 0),
        (-1, -3, 0),
        (0, -1, 0),
        (99, 0, 8),
        (8, 1, 8),
        (3, 99, 8),
        (99, 99, 8),
    ],
)
def test_out_of_range_inputs_are_clamped(raw, prefix, expected):
    assert acc.align_tail_start_to_atomic_boundary(CHAT, raw, prefix) == expected


def test_cut_in_an_empty_list_is_zero():
    assert acc.align_tail_start_to_atomic_boundary([], 3, 1) == 0
    assert acc.align_tail_start_to_atomic_boundary([], 0, 0) == 0


def test_align_result_is_always_a_valid_boundary():
    messages = [S(), U(), A("a"), T("a"), A("b"), T("b"), AS(), S("late"), T("x"), U(), A("c"), T("c")]
    starts = {s for s, _ in acc.atomic_spans(messages)} | {len(messages)}
    for prefix in range(0, len(messages) + 1):
        for raw in range(-1, len(messages) + 2):
            got = acc.align_tail_start_to_atomic_boundary(messages, raw, prefix)
            assert got >= min(prefix, len(messages))
            assert got in starts or got == prefix


def test_cut_on_a_tool_result_moves_back_to_its_call_so_the_tail_never_opens_with_a_result():
    """A kept tail that would open with a tool result (an orphan without its
    call) starts at the call turn instead, keeping call, result and answer."""
    messages = [S(), U("start"), AS("hi"), U("look it up"), A("s1"), T("s1", "found"), AS("here it is"), U("thanks")]
    keep_last = 3  # raw cut at index 5, the tool result
    raw = len(messages) - keep_last
    assert messages[raw]["role"] == "tool"
    start = acc.align_tail_start_to_atomic_boundary(messages, raw, 1)
    assert start == 4
    assert messages[start:] == [A("s1"), T("s1", "found"), AS("here it is"), U("thanks")]


# -- protected_head_end --------------------------------------------------------


def test_protected_head_counts_non_system_messages():
    assert [acc.protected_head_end(CHAT, k) for k in range(-1, 7)] == [0, 0, 2, 6, 6, 6, 6, 7]


def test_protected_head_extends_to_the_end_of_its_unit():
    messages = [S(), A("a"), T("a"), AS(), U()]
    assert acc.protected_head_end(messages, 1) == 4
    assert acc.protected_head_end(messages, 3) == 4
    assert acc.protected_head_end(messages, 4) == 5


def test_protected_head_past_the_list_ends_at_the_list_end():
    assert acc.protected_head_end(CHAT, 50) == len(CHAT)
    assert acc.protected_head_end([], 1) == 0
    assert acc.protected_head_end([S(), S("b")], 1) == 2


def test_protected_head_skips_leading_and_late_systems():
    messages = [S(), S("b"), U(), S("late"), AS(), U()]
    assert acc.protected_head_end(messages, 1) == 3
    assert acc.protected_head_end(messages, 2) == 5


def test_the_filter_answers_to_the_names_the_tool_pairing_fixes_use():
    # Admins and fixes elsewhere call these on the Filter; they must be the
    # layer-1 rules, not a copy that could drift.
    f = acc.Filter()
    chat = [U("q"), A("c1"), T("c1"), AS("done"), U("next")]
    assert f._get_atomic_groups(chat) == acc.get_atomic_groups(chat) == [[0], [1, 2, 3], [4]]
    assert f._align_tail_start_to_atomic_boundary(chat, 2, 0) == 1  # never between a call and its result
