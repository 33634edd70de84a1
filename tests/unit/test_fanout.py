"""Listings over several shards (parley/client/fanout.py, the merge; parley/client/producer.py `MovedRetry`,
parley/client/follow.py, when a reader reads the placement again): pure, no Redis."""

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.client.fanout import ShardPart, merge_parts
from parley.client.follow import REREAD_EVERY_S, Reread, block_of
from parley.client.inbox import (
    Cursor,
    Driver,
    InterruptFilter,
    InterruptPage,
    OpenInterrupt,
    merged_after,
    merged_page,
    merged_rows,
    order_driver,
    row_key,
    time_member,
)
from parley.client.producer import MovedRetry, SubmitRefused, is_moved
from parley.client.sessions import SessionFilter, SessionPage, SessionRow
from parley.client.sessions import merged_page as merged_session_page
from parley.schemas.keys import partition_of
from parley.schemas.shards import Placement

#: the partition count of the tests of a move
N_TEST = 8


def key(row: str) -> str:
    return row


def page_all(shards: list[list[str]], limit: int, scan: int, reverse: bool = False) -> list[list[str]]:
    """Page a listing spread over `shards` (each sorted) as the clients do: every shard reads at
    most `limit` rows and at most `scan` members after the merged position; pages till done."""
    pages: list[list[str]] = []
    after: str | None = None
    for _ in range(100):
        parts = []
        for rows in shards:
            ordered = sorted(rows, reverse=reverse)
            past = [r for r in ordered if after is None or (r < after if reverse else r > after)]
            read = past[:min(limit, scan)]
            done = len(read) == len(past)
            parts.append(ShardPart([r for r in read if not r.endswith("-")], None if done else read[-1]))
        items, after = merge_parts(parts, key, limit, reverse)
        pages.append(items)
        if after is None:
            return pages
    raise AssertionError("the paging never ended")


@pytest.mark.parametrize("limit,scan", [(1, 1), (2, 2), (3, 1), (2, 5), (10, 10)])
@pytest.mark.parametrize("reverse", [False, True])
def test_paging_over_shards_returns_every_row_once_in_order(limit: int, scan: int, reverse: bool) -> None:
    # rows ending in "-" are read but filtered out (a shard's scan that stops short of a full page)
    shards = [["a1", "a4-", "a5", "b2", "c9"], ["a2-", "a3", "b1", "b3-", "b4"], []]
    pages = page_all(shards, limit, scan, reverse)
    flat = [r for p in pages for r in p]
    expected = sorted((r for s in shards for r in s if not r.endswith("-")), reverse=reverse)
    assert flat == expected
    assert all(len(p) <= limit for p in pages)


def test_a_shard_that_stopped_short_bounds_the_page() -> None:
    """Shard 1 read only up to "b": shard 0's "c" may not be taken before shard 1's rows past "b"."""
    items, after = merge_parts([ShardPart(["a", "c"], None), ShardPart([], "b")], key, 5)
    assert (items, after) == (["a"], "b")


def test_a_full_page_ends_at_its_last_row_and_a_drained_listing_has_no_cursor() -> None:
    full = merge_parts([ShardPart(["a", "c"], None), ShardPart(["b", "d"], None)], key, 3)
    assert full == (["a", "b", "c"], "c")
    assert merge_parts([ShardPart(["a"], None), ShardPart(["b"], None)], key, 3) == (["a", "b"], None)
    with pytest.raises(ValueError):
        merge_parts([], key, 0)


def row(session: str, raised_at: int, iid: str = "int-1") -> OpenInterrupt:
    return OpenInterrupt(session=session, interrupt_id=iid, reason="confirm", raised_at=raised_at)


def test_merged_interrupt_page_orders_by_raise_time_and_its_cursor_resumes_every_shard() -> None:
    flt = InterruptFilter()
    late, early, mid = row("z", 3), row("y", 1), row("x", 2)
    page = merged_page(flt, 2, [InterruptPage(items=[early, late]), InterruptPage(items=[mid])])
    assert [r.session for r in page.items] == ["y", "x"]
    assert page.cursor is not None
    at = Cursor.decode(page.cursor, flt)
    assert (at.driver, at.after) == (Driver.TIME, time_member(2, "x", "int-1"))


def test_merged_interrupt_page_by_session_with_a_prefix() -> None:
    flt = InterruptFilter(session_prefix="s")
    page = merged_page(flt, 5, [InterruptPage(items=[row("s2", 1)]), InterruptPage(items=[row("s1", 9)])])
    assert [r.session for r in page.items] == ["s1", "s2"] and page.cursor is None


def test_moved_retry_backs_off_within_its_bound_then_gives_up() -> None:
    retry = MovedRetry(started=100.0, timeout_s=2.0)
    delays = [retry.delay(100.0 + t) for t in (0.0, 0.5, 1.9)]
    assert all(d is not None and 0 <= d <= 1.0 for d in delays)
    assert retry.delay(101.95) is not None and (retry.delay(101.95) or 0) <= 0.05 + 1e-9
    assert retry.delay(102.0) is None
    assert "moved" in str(retry.gave_up("S"))


def test_only_the_moved_refusal_is_retried() -> None:
    assert is_moved(SubmitRefused("moved", "partition 3 is moving"))
    assert not is_moved(SubmitRefused("rate_limited", "slow down"))
    assert not is_moved(ValueError("moved"))


# ---- a session listed on two shards while its partition moves ------------------------------------

def placed_on(placement: Placement, shard: int, skip: int = 0) -> str:
    return [s for s in (f"s-{i}" for i in range(100)) if placement.shard_of_session(s) == shard][skip]


def test_merge_keeps_a_row_only_from_the_shard_its_session_is_placed_on() -> None:
    owner = {"a": 0, "b": 1, "c": 0}.__getitem__
    # "c" is on both shards (copied, not yet cleaned): only shard 0's copy is kept
    parts = [ShardPart(["a", "c"], None), ShardPart(["b", "c"], None)]
    assert merge_parts(parts, key, 5, owner=owner) == (["a", "b", "c"], None)
    assert merge_parts(parts, key, 2, owner=owner) == (["a", "b"], "b")
    assert merge_parts(parts, key, 5) == (["a", "b", "c", "c"], None)  # without a placement: all


def test_a_moving_interrupt_is_listed_once_before_and_after_the_flip() -> None:
    before = Placement.default(N_TEST, 2)
    moving = placed_on(before, 0)
    stays = placed_on(before, 1)
    p = partition_of(moving, N_TEST)
    after = before.freeze(p, 1).flip(p)
    shard0 = InterruptPage(items=[row(moving, 1)])
    shard1 = InterruptPage(items=[row(moving, 1), row(stays, 2)])  # the move's copy
    for placement in (before, before.freeze(p, 1), after):
        page = merged_page(InterruptFilter(), 10, [shard0, shard1], placement)
        assert [r.session for r in page.items] == [moving, stays]
        rows = merged_rows(InterruptFilter(), [[r.model_dump() for r in shard0.items],
                                               [r.model_dump() for r in shard1.items]], placement)
        assert [r["session"] for r in rows] == [moving, stays]


def test_a_moving_session_is_listed_once_in_the_list_of_sessions() -> None:
    before = Placement.default(N_TEST, 2)
    moving = placed_on(before, 0)
    p = partition_of(moving, N_TEST)
    after = before.freeze(p, 1).flip(p)
    listed = SessionRow(session=moving, status="active", created_at=5)
    for placement in (before, after):
        page = merged_session_page(SessionFilter.of(), 10, [SessionPage(items=[listed]),
                                                           SessionPage(items=[listed])], placement)
        assert page.items == [listed]


def test_a_reader_reads_the_placement_again_at_most_every_period() -> None:
    reread = Reread(every_s=1.0)
    assert reread.due(100.0)  # the first empty read
    assert not reread.due(100.5)
    assert reread.due(101.0)
    assert not reread.due(101.9)


def test_a_wait_blocks_at_most_the_reread_period_with_several_shards() -> None:
    assert block_of(10_000, sharded=False) == 10_000
    assert block_of(10_000, sharded=True) == int(REREAD_EVERY_S * 1000)
    assert block_of(300, sharded=True) == 300


# ---- newest first over shards: the oldest-first listing, reversed --------------------------------

def shard_page(rows: list[OpenInterrupt], flt: InterruptFilter, limit: int, scan: int,
               after: str | None) -> InterruptPage:
    """One shard's part of a merged page, as `shard_page_steps` reads it (its ranges and their
    bounds are tests/unit/test_inbox.py's and the integration tests'): the members past `after`
    in the listing's order, at most `limit` kept rows within a scan of at most `scan` members;
    a cursor at the last member read unless the shard was read to its end."""
    key = row_key(flt)
    ordered = sorted(rows, key=key, reverse=flt.newest_first)
    past = [r for r in ordered if after is None or (key(r) < after if flt.newest_first else key(r) > after)]
    kept: list[OpenInterrupt] = []
    read = 0
    for row in past[:scan]:
        read += 1
        if flt.matches(row):
            kept.append(row)
        if len(kept) == limit:
            break
    if read == len(past):
        return InterruptPage(items=kept)
    return InterruptPage(items=kept, cursor=Cursor(order_driver(flt), key(past[read - 1]),
                                                   flt.fingerprint()).encode())


def merged_listing(shards: list[list[OpenInterrupt]], flt: InterruptFilter, limit: int,
                   scan: int) -> list[tuple[str, str]]:
    """Every page of the merged listing, as the sharded clients read it, flattened."""
    out: list[tuple[str, str]] = []
    cursor: str | None = None
    for _ in range(1_000):
        after = merged_after(flt, cursor)
        page = merged_page(flt, limit, [shard_page(rows, flt, limit, scan, after) for rows in shards])
        assert len(page.items) <= limit
        out += [(r.session, r.interrupt_id) for r in page.items]
        if page.cursor is None:
            return out
        cursor = page.cursor
    raise AssertionError("the paging never ended")


OPEN_ROWS = st.lists(st.builds(
    OpenInterrupt, session=st.sampled_from(["a-1", "a-2", "a-10", "b-1", "b-2", "ab"]),
    interrupt_id=st.sampled_from(["int-1", "int-2", "int-3"]), reason=st.sampled_from(["confirm", "budget"]),
    raised_at=st.integers(1_000, 1_020),
    resumable_by=st.none() | st.lists(st.sampled_from(["alice", "bob"]), max_size=2, unique=True)),
    max_size=40, unique_by=lambda r: (r.session, r.interrupt_id))
FILTERS = st.builds(InterruptFilter, reason=st.none() | st.sampled_from(["confirm", "budget"]),
                    session_prefix=st.none() | st.sampled_from(["a", "a-", "b-1", "c"]),
                    raised_before=st.none() | st.integers(1_000, 1_021),
                    principal=st.none() | st.sampled_from(["alice", "bob"]))


@settings(max_examples=300, deadline=None, database=None)
@given(rows=OPEN_ROWS, flt=FILTERS, shard_count=st.integers(1, 3), limit=st.integers(1, 5),
       scan=st.integers(1, 8), spread=st.randoms(use_true_random=False))
def test_newest_first_over_shards_is_the_oldest_first_listing_reversed(
        rows: list[OpenInterrupt], flt: InterruptFilter, shard_count: int, limit: int, scan: int,
        spread: Any) -> None:
    """Paged over random shards with random filters and short scans: every row once, no row
    missed, oldest first and newest first the same rows in reverse."""
    shards: list[list[OpenInterrupt]] = [[] for _ in range(shard_count)]
    for row in rows:
        shards[spread.randrange(shard_count)].append(row)
    oldest = merged_listing(shards, flt, limit, scan)
    newest = merged_listing(shards, replace(flt, newest_first=True), limit, scan)
    key = row_key(flt)
    expected = [(r.session, r.interrupt_id) for r in sorted(rows, key=key) if flt.matches(r)]
    assert oldest == expected
    assert newest == expected[::-1]
    every = merged_rows(replace(flt, newest_first=True), [[r.model_dump() for r in s] for s in shards])
    assert [(r["session"], r["interrupt_id"]) for r in every] == \
        [(r.session, r.interrupt_id) for r in sorted(rows, key=key, reverse=True)]


def test_a_merged_newest_first_page_starts_at_the_latest_and_its_cursor_is_refused_oldest_first() -> None:
    flt = InterruptFilter(newest_first=True)
    late, early, mid = row("z", 3), row("y", 1), row("x", 2)
    page = merged_page(flt, 2, [InterruptPage(items=[late, early]), InterruptPage(items=[mid])])
    assert [r.session for r in page.items] == ["z", "x"]
    assert page.cursor is not None and merged_after(flt, page.cursor) == time_member(2, "x", "int-1")
    with pytest.raises(ValueError, match="another filter or order"):
        merged_after(InterruptFilter(), page.cursor)
    by_session = merged_page(InterruptFilter(session_prefix="s", newest_first=True), 5,
                             [InterruptPage(items=[row("s1", 9)]), InterruptPage(items=[row("s2", 1)])])
    assert [r.session for r in by_session.items] == ["s2", "s1"] and by_session.cursor is None
