"""The inbox-ready index of open interrupts (docs/protocol.md, "Open interrupts across sessions")
against a real Redis: every field, each filter, cursor paging in either order (newest first is
the oldest-first listing reversed, on one Redis and over two shards), a page's cost independent
of the number of open interrupts, nothing left behind, and the rebuild of an older dispatcher's
index."""

from dataclasses import replace
from typing import Any

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.client.shards import Shards
from parley.dispatcher.core import IndexAdd, IndexRemove
from parley.dispatcher.enqueue import Outbox
from tests.integration import shard_fixtures
from tests.integration.conftest import KEYS

# the two shards' fixtures (tests/integration/shard_fixtures.py)
servers = shard_fixtures.servers
shards = shard_fixtures.shards

SCHEMA = {"type": "object", "required": ["approved"]}


def add(interrupt_id: str, raised_at: int, reason: str = "confirm", seq: int = 1,
        resumable_by: list[str] | None = None, deadline: int | None = None) -> IndexAdd:
    return IndexAdd(seq=seq, interrupt_id=interrupt_id, reason=reason, anchor="msg-2",
                    raised_at=raised_at, deadline=deadline, parent=None, payload={"to": "bob"},
                    default={"approved": False} if deadline else None, resumable_by=resumable_by,
                    metadata={"team": "a"}, response_schema=SCHEMA)


@pytest.fixture
def outbox(r: redis.Redis) -> Outbox:
    return Outbox(r, KEYS)


@pytest.fixture
def client(r: redis.Redis) -> Client:
    return Client(r)


def walk(client: Client, flt: InterruptFilter | None = None, limit: int = 3) -> list[tuple[str, str]]:
    """Every row of a listing, page by page, as (session, interrupt_id)."""
    rows: list[tuple[str, str]] = []
    cursor = None
    while True:
        page = client.interrupt_page(flt, limit=limit, cursor=cursor)
        assert len(page.items) <= limit
        rows += [(i.session, i.interrupt_id) for i in page.items]
        if page.cursor is None:
            return rows
        cursor = page.cursor


def test_a_row_says_everything_an_inbox_shows(r: redis.Redis, outbox: Outbox, client: Client) -> None:
    outbox.flush_many([("s-1", [add("int-1", 1_000, resumable_by=["alice"], deadline=61_000)])])
    (row,) = client.interrupt_page().items
    assert row.model_dump() == {
        "session": "s-1", "interrupt_id": "int-1", "reason": "confirm", "request": {"to": "bob"},
        "anchor": "msg-2", "raised_at": 1_000, "expires_at": 61_000, "default": {"approved": False},
        "resumable_by": ["alice"], "response_schema": SCHEMA, "metadata": {"team": "a"},
        "parent": None}
    assert client.interrupts() == [row.model_dump()]


def test_a_row_leaves_out_its_null_fields_and_reads_them_as_null(
        r: redis.Redis, outbox: Outbox, client: Client) -> None:
    """The stored row has no null field but `request` (an open interrupt's row is kept while it
    is open: its nulls would be most of it); the listing reads the missing fields as null, a
    missing `resumable_by` as "anyone may answer", a missing anchor as a global interrupt."""
    bare = IndexAdd(seq=1, interrupt_id="int-1", reason="budget", anchor=None, raised_at=1_000,
                    deadline=None, parent=None, payload=None, default=None, resumable_by=None,
                    metadata=None, response_schema=None)
    outbox.flush_many([("s-1", [bare])])
    stored = orjson.loads(r.hget(KEYS.interrupt_info, KEYS.index_member("s-1", "int-1")))
    assert stored == {"session": "s-1", "interrupt_id": "int-1", "reason": "budget", "request": None,
                      "raised_at": 1_000}
    (row,) = client.interrupt_page().items
    assert row.model_dump() == {
        "session": "s-1", "interrupt_id": "int-1", "reason": "budget", "request": None, "anchor": None,
        "raised_at": 1_000, "expires_at": None, "default": None, "resumable_by": None,
        "response_schema": None, "metadata": None, "parent": None}
    assert walk(client, InterruptFilter(principal="anyone-at-all")) == [("s-1", "int-1")]
    # one global interrupt parks the session once (the anchors' count, keyed by session and '')
    assert r.hget(KEYS.stats, "parked") == b"1"
    outbox.flush_many([("s-1", [IndexRemove(seq=2, interrupt_id="int-1")])])
    assert client.interrupt_page().items == [] and r.hget(KEYS.stats, "parked") == b"0"


def test_each_filter_and_their_combinations(outbox: Outbox, client: Client) -> None:
    outbox.flush_many([
        ("team-a-1", [add("i1", 1_000, "confirm", 1, ["alice"]), add("i2", 2_000, "budget", 2)]),
        ("team-a-2", [add("i1", 3_000, "confirm", 1, ["bob"])]),
        ("team-b-1", [add("i1", 4_000, "confirm", 1), add("i2", 5_000, "budget", 2, ["alice", "bob"])]),
    ])
    everything = walk(client)
    assert everything == [("team-a-1", "i1"), ("team-a-1", "i2"), ("team-a-2", "i1"),
                          ("team-b-1", "i1"), ("team-b-1", "i2")]  # oldest first
    assert walk(client, InterruptFilter(reason="budget")) == [("team-a-1", "i2"), ("team-b-1", "i2")]
    assert walk(client, InterruptFilter(session_prefix="team-a-")) == everything[:3]
    assert walk(client, InterruptFilter(raised_before=3_000)) == everything[:2]
    # answerable by alice: hers, and those anyone may answer
    assert walk(client, InterruptFilter(principal="alice"), limit=2) == [
        ("team-a-1", "i1"), ("team-a-1", "i2"), ("team-b-1", "i1"), ("team-b-1", "i2")]
    assert walk(client, InterruptFilter(principal="carol")) == [("team-a-1", "i2"), ("team-b-1", "i1")]
    assert walk(client, InterruptFilter(reason="confirm", principal="bob"), limit=1) == [
        ("team-a-2", "i1"), ("team-b-1", "i1")]
    every = InterruptFilter(session_prefix="team-", reason="confirm", principal="alice", raised_before=4_001)
    assert walk(client, every, limit=1) == [("team-a-1", "i1"), ("team-b-1", "i1")]
    assert walk(client, InterruptFilter(session_prefix="team-c")) == []
    assert walk(client, InterruptFilter(reason="nothing")) == []


def test_paging_is_stable_under_concurrent_raises_and_resumes(outbox: Outbox, client: Client) -> None:
    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i)]) for i in range(7)])
    first = client.interrupt_page(limit=3)
    assert [i.session for i in first.items] == ["s-0", "s-1", "s-2"] and first.cursor
    # meanwhile: one on the first page and one not yet read are resumed, one more is raised
    outbox.flush_many([("s-1", [IndexRemove(seq=2, interrupt_id="int-1")]),
                       ("s-4", [IndexRemove(seq=2, interrupt_id="int-1")]),
                       ("s-9", [add("int-1", 9_000)])])
    rest = walk_from(client, first.cursor)
    assert rest == ["s-3", "s-5", "s-6", "s-9"]


def walk_from(client: Client, cursor: str | None) -> list[str]:
    out: list[str] = []
    while cursor is not None:
        page = client.interrupt_page(limit=3, cursor=cursor)
        out += [i.session for i in page.items]
        cursor = page.cursor
    return out


def test_a_bad_cursor_is_refused_clearly(outbox: Outbox, client: Client) -> None:
    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i)]) for i in range(3)])
    cursor = client.interrupt_page(limit=1).cursor
    with pytest.raises(ValueError, match="invalid cursor"):
        client.interrupt_page(cursor="not-a-cursor")
    with pytest.raises(ValueError, match="another filter"):
        client.interrupt_page(InterruptFilter(reason="confirm"), cursor=cursor)
    with pytest.raises(ValueError, match="limit"):
        client.interrupt_page(limit=0)


def commands_and_bytes(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("commandstats")
    calls = sum(int(v["calls"]) for name, v in stats.items() if name not in ("cmdstat_info",))
    return calls, int(r.info("stats")["total_net_output_bytes"])


def page_cost(r: redis.Redis, client: Client, flt: InterruptFilter | None) -> tuple[int, int]:
    """Commands Redis ran for a second page (reply bytes, too), with the cursor of the first."""
    cursor = client.interrupt_page(flt, limit=10).cursor
    before_calls, before_bytes = commands_and_bytes(r)
    page = client.interrupt_page(flt, limit=10, cursor=cursor)
    after_calls, after_bytes = commands_and_bytes(r)
    assert len(page.items) == 10
    return after_calls - before_calls - 2, after_bytes - before_bytes  # less the two INFO of the count


@pytest.mark.parametrize("flt", [None, InterruptFilter(reason="budget"), InterruptFilter(principal="alice"),
                                 InterruptFilter(session_prefix="s-"), InterruptFilter(raised_before=10**12),
                                 InterruptFilter(reason="budget", principal="bob")],
                         ids=["all", "reason", "principal", "prefix", "older", "combined"])
def test_a_page_costs_the_same_with_100_or_5000_open_interrupts(
        r: redis.Redis, outbox: Outbox, client: Client, flt: InterruptFilter | None) -> None:
    """The same commands, and the same reply bytes give or take the width of numbers: a page reads
    its own rows, not every open interrupt (the timing at 100,000 is the bench's scenario 7)."""
    def fill(start: int, stop: int) -> None:
        outbox.flush_many([(f"s-{i:06}", [add("int-1", 1_000 + i, "budget" if i % 2 else "confirm", 1,
                                              [None, ["alice"], ["bob"]][i % 3])])
                           for i in range(start, stop)])
    fill(0, 100)
    small = page_cost(r, client, flt)
    fill(100, 5_000)
    large = page_cost(r, client, flt)
    assert small[0] == large[0], (small, large)
    assert abs(small[1] - large[1]) < 200, (small, large)


def test_resuming_everything_leaves_no_index_key_and_replays_stay_exact(
        r: redis.Redis, outbox: Outbox, client: Client) -> None:
    adds = [(f"s-{i}", [add("int-1", 1_000 + i, "confirm" if i % 2 else f"reason-{i}", 1,
                            [f"p-{i}", "alice"] if i % 3 else None, 9_000 if i % 4 else None)])
            for i in range(12)]
    outbox.flush_many(adds)
    outbox.flush_many(adds)  # a replay after a crash
    assert len(walk(client)) == 12 and len(walk(client, InterruptFilter(principal="alice"))) == 12
    removes = [(s, [IndexRemove(seq=2, interrupt_id="int-1")]) for s, _ in adds]
    outbox.flush_many(removes)
    outbox.flush_many(removes)
    assert walk(client) == []
    left = sorted(k.decode() for k in r.scan_iter(match="parley:interrupts*"))
    assert left == [], left
    assert r.zcard(KEYS.deadlines) == 0 and int(r.hget(KEYS.stats, "parked") or 0) == 0


def test_an_index_written_by_an_older_dispatcher_is_rebuilt_once(r: redis.Redis) -> None:
    """An older dispatcher kept only the zset and the details hash; the details it wrote lack the
    request and who may answer, which the session's own record still has."""
    core: dict[str, Any] = {"metadata": {"team": "a"}, "interrupts": {"int-1": {
        "id": "int-1", "reason": "confirm", "payload": {"to": "bob"}, "deadline": 61_000,
        "default": {"approved": False}, "resumable_by": ["alice"]}}}
    r.hset(KEYS.meta("old-1"), "core", orjson.dumps(core))
    # a row whose interrupt its session no longer holds (the IndexRemove waits in an outbox):
    # the session stores no `interrupts` at all
    r.hset(KEYS.meta("old-3"), "core", orjson.dumps({"metadata": None}))
    # nobody may answer: an empty list, which Redis's cjson writes back as {}
    r.hset(KEYS.meta("old-4"), "core", orjson.dumps({"interrupts": {"int-1": {
        "id": "int-1", "reason": "locked", "payload": None, "resumable_by": []}}}))
    r.zadd(KEYS.interrupt_index, {"old-1\x1fint-1": 1_000, "old-2\x1fint-1": 2_000,
                                  "old-3\x1fint-1": 3_000, "old-4\x1fint-1": 4_000})
    r.hset(KEYS.interrupt_info, mapping={
        "old-1\x1fint-1": orjson.dumps({"session": "old-1", "interrupt_id": "int-1", "reason": "confirm",
                                         "anchor": "msg-2", "raised_at": 1_000, "parent": None}),
        "old-2\x1fint-1": orjson.dumps({"session": "old-2", "interrupt_id": "int-1", "reason": "budget",
                                         "anchor": None, "raised_at": 2_000, "parent": None}),
        "old-3\x1fint-1": orjson.dumps({"session": "old-3", "interrupt_id": "int-1", "reason": "gone",
                                         "anchor": None, "raised_at": 3_000, "parent": None}),
        "old-4\x1fint-1": orjson.dumps({"session": "old-4", "interrupt_id": "int-1", "reason": "locked",
                                         "anchor": None, "raised_at": 4_000, "parent": None})})
    Outbox(r, KEYS)
    client = Client(r)
    locked = client.interrupt_page(InterruptFilter(reason="locked")).items
    assert [(i.session, i.resumable_by) for i in locked] == [("old-4", [])]
    assert walk(client, InterruptFilter(reason="gone")) == [("old-3", "int-1")]
    assert walk(client, InterruptFilter(reason="budget")) == [("old-2", "int-1")]
    # no record: anyone; an empty list: nobody
    assert walk(client, InterruptFilter(principal="bob")) == [("old-2", "int-1"), ("old-3", "int-1")]
    first = client.interrupt_page(InterruptFilter(principal="alice")).items
    assert [(i.session, i.request, i.expires_at, i.default, i.metadata) for i in first] == [
        ("old-1", {"to": "bob"}, 61_000, {"approved": False}, {"team": "a"}),
        ("old-2", None, None, None, None), ("old-3", None, None, None, None)]
    assert r.hget(KEYS.stats, "listing") == b"1"
    Outbox(r, KEYS)  # the next start finds the version: nothing is rebuilt or listed twice
    assert len(walk(client)) == 4


def test_the_command_line_filters_pages_and_refuses_a_bad_cursor(
        redis_server: Any, outbox: Outbox) -> None:
    from click.testing import CliRunner

    from parley.cli import cli

    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i, "confirm", 1, ["alice"] if i % 2 else ["bob"])])
                       for i in range(5)])

    def run(*args: str) -> Any:
        result = CliRunner().invoke(cli, ["--redis-url", redis_server.url, "interrupts", *args])
        assert result.exit_code == 0, result.output
        return orjson.loads(result.output)

    rows = run("--json")
    assert [row["session"] for row in rows] == [f"s-{i}" for i in range(5)]
    assert rows[0]["request"] == {"to": "bob"} and rows[0]["metadata"] == {"team": "a"}
    first = run("--json", "--principal", "alice", "--limit", "1")
    assert [row["session"] for row in first["items"]] == ["s-1"]
    second = run("--json", "--principal", "alice", "--limit", "1", "--cursor", first["cursor"])
    assert [row["session"] for row in second["items"]] == ["s-3"]
    last = run("--json", "--principal", "alice", "--cursor", second["cursor"])
    assert last == {"items": [], "cursor": None}
    bad = CliRunner().invoke(cli, ["--redis-url", redis_server.url, "interrupts", "--cursor", "zz"])
    assert bad.exit_code == 1 and bad.output.strip().startswith("Error: invalid cursor"), bad.output
    # --search: words of the session id or the payload, in any case, with the other filters
    def sessions(rows: Any) -> list[str]:
        return [row["session"] for row in rows]

    assert sessions(run("--json", "--search", "s-3")) == ["s-3"]
    assert sessions(run("--json", "--search", "BOB", "--principal", "alice")) == ["s-1", "s-3"]
    assert run("--json", "--search", "to nobody") == []
    assert len(run("--json", "--search", "   ")) == 5  # no words: no condition
    paged = run("--json", "--search", "bob", "--limit", "2")
    assert sessions(paged["items"]) == ["s-0", "s-1"]
    rest = run("--json", "--search", "bob", "--cursor", paged["cursor"])
    assert sessions(rest["items"]) == ["s-2", "s-3", "s-4"]


# ---- newest first -----------------------------------------------------------------------------

def fill_mixed(outbox: Outbox, count: int = 40) -> None:
    """`count` interrupts over three teams, two a millisecond (ties sort by session, then id),
    two reasons and three kinds of who may answer."""
    outbox.flush_many([(f"team-{'abc'[i % 3]}-{i:03}", [
        add("int-1", 1_000 + i // 2, "budget" if i % 4 == 1 else "confirm", 1,
            [None, ["alice"], ["bob"]][i % 3]),
        *([add("int-2", 1_000 + i // 3, "confirm", 2, ["alice", "bob"])] if i % 5 == 0 else [])])
        for i in range(count)])


@pytest.mark.parametrize("flt", [
    InterruptFilter(), InterruptFilter(reason="budget"), InterruptFilter(principal="alice"),
    InterruptFilter(session_prefix="team-b-"), InterruptFilter(session_prefix=""),
    InterruptFilter(raised_before=1_011), InterruptFilter(reason="confirm", principal="bob"),
    InterruptFilter(session_prefix="team-", reason="confirm", principal="alice", raised_before=1_015)],
    ids=["all", "reason", "principal", "prefix", "empty-prefix", "older", "combined", "every"])
@pytest.mark.parametrize("limit", [1, 3, 7])
def test_newest_first_pages_the_oldest_first_listing_in_reverse(
        outbox: Outbox, client: Client, flt: InterruptFilter, limit: int) -> None:
    fill_mixed(outbox)
    oldest = walk(client, flt, limit)
    newest = walk(client, replace(flt, newest_first=True), limit)
    assert oldest and newest == oldest[::-1]
    assert len(set(newest)) == len(newest)  # no row twice
    assert client.interrupts(replace(flt, newest_first=True)) == client.interrupts(flt)[::-1]


ROWS = st.lists(st.tuples(st.sampled_from(["a-1", "a-2", "a-10", "b-1", "b-2"]),
                          st.sampled_from(["int-1", "int-2"]), st.integers(1_000, 1_012),
                          st.sampled_from(["confirm", "budget"]),
                          st.sampled_from([None, ("alice",), ("bob",), ("alice", "bob")])),
                max_size=25, unique_by=lambda row: (row[0], row[1]))


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # each example flushes the Redis
@given(rows=ROWS, reason=st.none() | st.sampled_from(["confirm", "budget"]),
       prefix=st.none() | st.sampled_from(["a", "a-1", "b-"]),
       principal=st.none() | st.sampled_from(["alice", "bob"]),
       raised_before=st.none() | st.integers(1_000, 1_013), limit=st.integers(1, 4))
def test_random_raise_times_and_filters_list_the_same_rows_either_way(
        r: redis.Redis, rows: list[tuple[str, str, int, str, tuple[str, ...] | None]], reason: str | None,
        prefix: str | None, principal: str | None, raised_before: int | None, limit: int) -> None:
    r.flushdb()
    outbox = Outbox(r, KEYS)
    by_session: dict[str, list[Any]] = {}
    for seq, (session, iid, at, why, by) in enumerate(rows, 1):
        by_session.setdefault(session, []).append(add(iid, at, why, seq, None if by is None else list(by)))
    outbox.flush_many(list(by_session.items()))
    client = Client(r)
    flt = InterruptFilter(reason=reason, session_prefix=prefix, principal=principal,
                          raised_before=raised_before)

    def order(row: tuple[str, str, int, str, Any]) -> tuple[Any, ...]:
        session, iid, at = row[:3]
        return (session, at, iid) if prefix is not None else (at, session, iid)
    kept = [(s, i) for s, i, at, why, by in sorted(rows, key=order)
            if (reason is None or why == reason) and (prefix is None or s.startswith(prefix))
            and (raised_before is None or at < raised_before)
            and (principal is None or by is None or principal in by)]
    assert walk(client, flt, limit) == kept
    assert walk(client, replace(flt, newest_first=True), limit) == kept[::-1]


def test_newest_first_paging_is_stable_under_concurrent_raises_and_resumes(
        outbox: Outbox, client: Client) -> None:
    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i)]) for i in range(7)])
    newest = InterruptFilter(newest_first=True)
    first = client.interrupt_page(newest, limit=3)
    assert [i.session for i in first.items] == ["s-6", "s-5", "s-4"] and first.cursor
    # meanwhile: one on the first page and one not yet read are resumed; a newer one is raised
    # (it sorts before the cursor: the next refresh's first page shows it), and a late-indexed
    # older one (it sorts after the cursor: this walk still reaches it)
    outbox.flush_many([("s-5", [IndexRemove(seq=2, interrupt_id="int-1")]),
                       ("s-2", [IndexRemove(seq=2, interrupt_id="int-1")]),
                       ("s-9", [add("int-1", 9_000)]), ("s-0a", [add("int-1", 1_000)])])
    rest: list[str] = []
    cursor = first.cursor
    while cursor is not None:
        page = client.interrupt_page(newest, limit=3, cursor=cursor)
        rest += [i.session for i in page.items]
        cursor = page.cursor
    assert rest == ["s-3", "s-1", "s-0a", "s-0"]
    assert [i.session for i in client.interrupt_page(newest, limit=1).items] == ["s-9"]


def test_a_cursor_of_one_order_is_refused_in_the_other(outbox: Outbox, client: Client) -> None:
    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i)]) for i in range(3)])
    oldest, newest = InterruptFilter(), InterruptFilter(newest_first=True)
    forward = client.interrupt_page(oldest, limit=1).cursor
    backward = client.interrupt_page(newest, limit=1).cursor
    assert forward and backward
    with pytest.raises(ValueError, match="another filter or order"):
        client.interrupt_page(newest, limit=1, cursor=forward)
    with pytest.raises(ValueError, match="another filter or order"):
        client.interrupt_page(oldest, limit=1, cursor=backward)


@pytest.mark.parametrize("flt", [InterruptFilter(newest_first=True),
                                 InterruptFilter(reason="budget", principal="bob", newest_first=True),
                                 InterruptFilter(session_prefix="s-", newest_first=True),
                                 InterruptFilter(raised_before=10**12, newest_first=True)],
                         ids=["all", "combined", "prefix", "older"])
def test_a_newest_first_page_costs_the_same_with_100_or_5000_open_interrupts(
        r: redis.Redis, outbox: Outbox, client: Client, flt: InterruptFilter) -> None:
    test_a_page_costs_the_same_with_100_or_5000_open_interrupts(r, outbox, client, flt)


def test_the_command_line_lists_newest_first(redis_server: Any, outbox: Outbox) -> None:
    from click.testing import CliRunner

    from parley.cli import cli

    outbox.flush_many([(f"s-{i}", [add("int-1", 1_000 + i)]) for i in range(4)])

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--redis-url", redis_server.url, "interrupts", *args])

    every = run("--json", "--newest-first")
    assert every.exit_code == 0, every.output
    assert [row["session"] for row in orjson.loads(every.output)] == ["s-3", "s-2", "s-1", "s-0"]
    first = orjson.loads(run("--json", "--newest-first", "--limit", "3").output)
    assert [row["session"] for row in first["items"]] == ["s-3", "s-2", "s-1"]
    second = orjson.loads(run("--json", "--newest-first", "--cursor", first["cursor"]).output)
    assert [row["session"] for row in second["items"]] == ["s-0"] and second["cursor"] is None
    text = run("--newest-first", "--limit", "1").output.splitlines()
    assert text[0].startswith("s-3\tint-1\tconfirm") and text[1].startswith("next page: --cursor ")
    mixed = run("--cursor", first["cursor"])
    assert mixed.exit_code == 1 and "another filter or order" in mixed.output, mixed.output


# ---- two shards -------------------------------------------------------------------------------

def test_two_shards_list_every_row_once_newest_first(shards: Shards) -> None:
    """Each session's interrupts on its placed shard; the merged pages, either order, with every
    filter: no row twice, none missed, newest first the oldest-first listing reversed."""
    assert shards.placement is not None
    placement = shards.placement
    rows: list[tuple[str, list[Any]]] = [
        (f"team-{'ab'[i % 2]}-{i:02}", [add("int-1", 1_000 + i // 3, "budget" if i % 3 == 0 else "confirm", 1,
                                              [None, ["alice"], ["bob"]][i % 3])])
        for i in range(30)]
    for shard, r in enumerate(shards.clients):
        Outbox(r, KEYS).flush_many([row for row in rows if placement.shard_of_session(row[0]) == shard])
    assert all(shards.clients[i].zcard(KEYS.interrupts_by_time) for i in (0, 1))  # both shards hold some
    client = Client(shards)
    for flt in (InterruptFilter(), InterruptFilter(reason="budget"), InterruptFilter(principal="alice"),
                InterruptFilter(session_prefix="team-a-"), InterruptFilter(raised_before=1_005),
                InterruptFilter(reason="confirm", principal="bob")):
        for limit in (1, 4):
            oldest = walk(client, flt, limit)
            newest = walk(client, replace(flt, newest_first=True), limit)
            assert oldest and len(set(oldest)) == len(oldest), flt
            assert newest == oldest[::-1], (flt, limit)
        assert client.interrupts(replace(flt, newest_first=True)) == client.interrupts(flt)[::-1]
    everything = walk(client, InterruptFilter(newest_first=True), 4)
    assert len(everything) == 30 and everything[0] == ("team-b-29", "int-1")
    forward = client.interrupt_page(limit=2).cursor
    with pytest.raises(ValueError, match="another filter or order"):
        client.interrupt_page(InterruptFilter(newest_first=True), cursor=forward)
