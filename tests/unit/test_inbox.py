"""The listing's pure parts (parley/inbox.py): which set drives a query, how two sets merge, the
cursor's round trip and its refusals, and the members' order."""

import pytest

from parley.inbox import Cursor, Driver, InterruptFilter, choose_driver, index_member_of, merge, time_member


def test_the_session_prefix_drives_else_the_smaller_of_reason_and_principal():
    assert choose_driver(InterruptFilter(), 0, 0) is Driver.TIME
    every = InterruptFilter(session_prefix="a", reason="r", principal="p")
    assert choose_driver(every, 1, 1) is Driver.SESSION
    assert choose_driver(InterruptFilter(reason="r", principal="p"), 10, 500) is Driver.REASON
    assert choose_driver(InterruptFilter(reason="r", principal="p"), 500, 10) is Driver.PRINCIPAL
    assert choose_driver(InterruptFilter(principal="p"), 0, 0) is Driver.PRINCIPAL


def test_merge_takes_the_first_n_and_knows_when_both_sets_are_done():
    assert merge([["a", "c"], ["b"]], 3) == (["a", "b", "c"], True)
    assert merge([["a", "c", "e"], ["b"]], 3) == (["a", "b", "c"], False)  # the first set may go on
    assert merge([["a", "c"], ["b", "d"]], 3) == (["a", "b", "c"], False)  # d is past the page
    assert merge([[]], 3) == ([], True)


def test_time_members_sort_by_raise_time_and_map_back_to_the_index():
    members = [time_member(t, "s", "int-1") for t in (999, 1_000, 1_764_558_000_000)]
    assert sorted(members) == members
    assert index_member_of(members[0], Driver.TIME) == "s\x1fint-1"
    assert index_member_of("team-a\x1f000000000001000\x1fint-2", Driver.SESSION) == "team-a\x1fint-2"


def test_a_cursor_round_trips_and_is_refused_when_forged_or_used_with_another_filter():
    where = InterruptFilter(reason="confirm")
    text = Cursor(Driver.REASON, time_member(5, "s", "i"), where.fingerprint()).encode()
    later = InterruptFilter(reason="confirm", raised_before=9)  # a bound may change between pages
    assert Cursor.decode(text, later).after == time_member(5, "s", "i")
    for bad in ("", "!!!", "e30", "eyJkIjoibm9wZSIsImEiOiIiLCJmIjpbXX0"):  # "", junk, {}, an unknown driver
        with pytest.raises(ValueError, match="invalid cursor"):
            Cursor.decode(bad, where)
    with pytest.raises(ValueError, match="another filter"):
        Cursor.decode(text, InterruptFilter(reason="budget"))
