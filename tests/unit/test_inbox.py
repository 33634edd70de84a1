"""The listing's pure parts (parley/client/inbox.py): which set drives a query, how two sets merge, the
cursor's round trip and its refusals, the members' order, and the range bounds of either order
(newest first: the same listing reversed)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.client.inbox import (
    Cursor,
    Driver,
    InterruptFilter,
    OpenInterrupt,
    choose_driver,
    encode_token,
    index_member_of,
    merge,
    plan,
    time_member,
)
from parley.schemas.keys import Keys


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


# ---- newest first ---------------------------------------------------------------------------------

def test_a_cursor_of_one_order_is_refused_in_the_other():
    oldest, newest = InterruptFilter(reason="confirm"), InterruptFilter(reason="confirm", newest_first=True)
    text = Cursor(Driver.REASON, time_member(5, "s", "i"), oldest.fingerprint()).encode()
    with pytest.raises(ValueError, match="another filter or order"):
        Cursor.decode(text, newest)
    back = Cursor(Driver.REASON, time_member(5, "s", "i"), newest.fingerprint()).encode()
    assert Cursor.decode(back, newest).after == time_member(5, "s", "i")
    with pytest.raises(ValueError, match="another filter or order"):
        Cursor.decode(back, oldest)
    # a cursor made before the order was part of the fingerprint goes on oldest first only
    earlier = encode_token({"d": "reason", "a": time_member(5, "s", "i"), "f": ["confirm", None, None]})
    assert Cursor.decode(earlier, oldest).fingerprint == oldest.fingerprint()
    with pytest.raises(ValueError, match="another filter or order"):
        Cursor.decode(earlier, newest)


def test_merge_in_reverse_takes_the_greatest_first():
    assert merge([["e", "c"], ["d"]], 2, reverse=True) == (["e", "d"], False)
    assert merge([["c", "a"], ["b"]], 3, reverse=True) == (["c", "b", "a"], True)
    assert merge([["c", "a", "0"], ["b"]], 3, reverse=True) == (["c", "b", "a"], False)


def test_newest_first_reads_with_rev_from_the_max_down():
    keys = Keys()
    (call,) = plan(keys, InterruptFilter(newest_first=True), Driver.TIME, None).range_calls(7)
    assert call.args == (keys.interrupts_by_time, "+", "-")
    assert call.kwargs == {"bylex": True, "desc": True, "offset": 0, "num": 7}
    after = time_member(5, "s", "i")
    (call,) = plan(keys, InterruptFilter(), Driver.TIME, after).range_calls(7)
    assert call.args == (keys.interrupts_by_time, "(" + after, "+") and "desc" not in call.kwargs
    by_session = plan(keys, InterruptFilter(session_prefix="t-", newest_first=True), Driver.SESSION, None)
    assert by_session.range_calls(1)[0].args[1:] == ("[t-\xff", "[t-")


def bounded(member: str, low: str, high: str) -> bool:
    """Whether ZRANGE BYLEX's bounds `low`..`high` take `member` (ASCII members: str order is
    byte order)."""
    above = low == "-" or (member > low[1:] if low[0] == "(" else member >= low[1:])
    below = high == "+" or (member < high[1:] if high[0] == "(" else member <= high[1:])
    return low != "+" and high != "-" and above and below


SESSIONS = st.sampled_from(["a-1", "a-2", "a-10", "b-1", "b", "ab"])
MEMBERS = st.lists(st.tuples(st.integers(0, 50), SESSIONS, st.sampled_from(["int-1", "int-2"])),
                   min_size=1, max_size=30, unique=True)


@settings(max_examples=300, deadline=None, database=None)
@given(members=MEMBERS, prefix=st.none() | st.sampled_from(["a", "a-", "a-1", "b", "c"]),
       raised_before=st.none() | st.integers(0, 52), at=st.integers(0, 29), newest_first=st.booleans())
def test_the_bounds_take_the_members_past_the_cursor_in_either_order(
        members: list[tuple[int, str, str]], prefix: str | None, raised_before: int | None, at: int,
        newest_first: bool) -> None:
    """Before a cursor, newest first takes exactly what oldest first took after it: the same
    listing, reversed; `raised_before` and the session prefix bound both."""
    keys = Keys()
    flt = InterruptFilter(session_prefix=prefix, raised_before=raised_before, newest_first=newest_first)
    driver = Driver.SESSION if prefix is not None else Driver.TIME
    listed = sorted(f"{s}\x1f{t:015d}\x1f{i}" if prefix is not None else time_member(t, s, i)
                    for t, s, i in members)
    first = plan(keys, flt, driver, None)
    within = [m for m in listed if bounded(m, first.low, first.high)]
    # what a listing may hold: the prefix's sessions, or those raised before the bound
    if prefix is not None:
        assert within == [m for m in listed if m.startswith(prefix)]
    else:
        assert within == [m for m in listed if raised_before is None or int(m[:15]) < raised_before]
    cursor = listed[at % len(listed)]
    later = plan(keys, flt, driver, cursor)
    past = [m for m in listed if bounded(m, later.low, later.high)]
    assert past == [m for m in within if (m < cursor if newest_first else m > cursor)]
    assert later.reverse is newest_first


# ---- search -----------------------------------------------------------------------------------------

def _row(reason: str = "approval", session: str = "acme/s-1", request: object = None) -> OpenInterrupt:
    return OpenInterrupt(session=session, interrupt_id="int-1", reason=reason, request=request, raised_at=1)


def test_a_search_finds_every_word_in_the_reason_the_session_or_the_payload_in_any_case():
    row = _row(request={"message": "Pay Müller GmbH 1,200 EUR", "iban": "DE02"})
    for found in ("müller", "MÜLLER pay", "approval", "acme/", "iban", "de02 1,200"):
        assert InterruptFilter(text=found).matches(row), found
    for missed in ("refund", "müller refund", "s-2"):
        assert not InterruptFilter(text=missed).matches(row), missed
    assert InterruptFilter(text="approval").matches(_row(request=None))  # no payload: the reason
    assert InterruptFilter(text="   ").matches(row)  # no words: no condition


def test_a_search_combines_with_the_other_filters_and_belongs_to_its_cursor():
    row = _row(reason="refund", request={"amount": 40})
    assert InterruptFilter(text="amount", reason="refund").matches(row)
    assert not InterruptFilter(text="amount", reason="approval").matches(row)
    assert not InterruptFilter(text="amount", session_prefix="beta/").matches(row)
    where = InterruptFilter(text="amount")
    text = Cursor(Driver.TIME, time_member(5, "s", "i"), where.fingerprint()).encode()
    with pytest.raises(ValueError, match="search"):
        Cursor.decode(text, InterruptFilter(text="other"))
    older = Cursor(Driver.TIME, time_member(5, "s", "i"), [None, None, None, False]).encode()
    assert Cursor.decode(older, InterruptFilter()).after == time_member(5, "s", "i")  # before search


def test_a_search_reads_the_payloads_keys_and_values_as_written_not_its_json():
    row = _row(request={"note": 'say "hi"\\now', "nested": [{"deep": 7, "ok": True}, None]})
    assert InterruptFilter(text='"hi"').matches(row)  # a quote as written (JSON would escape it)
    assert InterruptFilter(text="\\now").matches(row)
    for found in ("deep", "7", "true", "nested"):
        assert InterruptFilter(text=found).matches(row), found
    for punctuation in ("{", ":", "[", "null"):  # JSON's own text is not the payload's
        assert not InterruptFilter(text=punctuation).matches(row), punctuation


def test_a_search_of_a_payload_nested_deeper_than_the_stack_does_not_fail():
    deep: object = "bottom"
    for _ in range(5_000):
        deep = [deep]
    assert InterruptFilter(text="bottom").matches(_row(request=deep))
