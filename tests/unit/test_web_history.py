"""The inbox's history, without Redis (parley/web/history.py): its query string, events into
rows, one session's page, and a principal's answers merged over the shards' feeds page by page
(the feeds here are lists read with XREVRANGE's own rules)."""

import random
import re
from pathlib import Path
from typing import Any

import jinja2
import orjson
import pytest

from parley.web.history import (
    Ending,
    FeedPosition,
    FeedScan,
    HistoryPage,
    HistoryQuery,
    HistoryRow,
    clock,
    ending_of,
    iso,
    principal_history,
    session_history,
    stream_entries,
)
from parley.web.present import duration
from parley.web.query import QueryError

# --- the query -----------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "says"), [
    ({}, "name a session"),
    ({"session": "", "principal": ""}, "name a session"),
    ({"before": "1-0"}, "name a session"),
    ({"session": "s" * 257}, "at most 256"),
    ({"principal": "p" * 257}, "at most 256"),
    ({"principal": "alice", "before": "1" * 257}, "at most 256"),
    ({"session": "a b"}, "not a session id"),
    ({"session": "parley:{x}"}, "not a session id"),
    ({"session": "acme/"}, "not a session id"),
    ({"principal": " alice"}, "spaces at either end"),
    ({"principal": "ali\nce"}, "control characters"),
    ({"session": "s-1", "before": "1-0-0"}, "event id"),
    ({"session": "s-1", "before": "<script>"}, "event id"),
    ({"principal": "alice", "before": "1-0"}, "Older link"),
    ({"principal": "alice", "before": "1-0-99999"}, "Older link"),
])
def test_a_query_that_names_nothing_or_too_much_says_why(params: dict[str, str], says: str) -> None:
    with pytest.raises(QueryError, match=says):
        HistoryQuery.parse(params)


def test_a_query_names_a_session_a_person_or_both() -> None:
    assert HistoryQuery.parse({"session": "acme/s-1:sub-2"}) == HistoryQuery("acme/s-1:sub-2")
    assert HistoryQuery.parse({"principal": "alice@example.com"}) == HistoryQuery(None, "alice@example.com")
    both = HistoryQuery.parse({"session": "s-1", "principal": "bob", "before": "17-3", "other": "x"})
    assert both == HistoryQuery("s-1", "bob", "17-3") and both.by_session
    assert both.older("16-0") == "/history?session=s-1&principal=bob&before=16-0"
    by_person = HistoryQuery.parse({"principal": "a&b", "before": "5-1-0"})
    assert not by_person.by_session and by_person.older("4-0-1") == "/history?principal=a%26b&before=4-0-1"


def test_a_feed_position_sorts_as_the_feeds_do_and_reads_back() -> None:
    positions = [FeedPosition.of(i, s) for i, s in (("9-0", 0), ("10-0", 0), ("10-2", 0), ("10-10", 0),
                                                    ("10-10", 1), ("100-0", 0))]
    assert sorted(positions, key=lambda p: p.key) == positions
    assert FeedPosition.parse(positions[4].text) == positions[4] and positions[4].stream_id == "10-10"


def test_times_are_shown_in_utc() -> None:
    assert clock(1_785_247_385_000) == "2026-07-28 14:03:05 UTC"
    assert iso(1_785_247_385_000) == "2026-07-28T14:03:05Z"


# --- events into rows ----------------------------------------------------------------------

QUESTION = {"message": "Pay <b>acme</b>?", "amount": 12}


def raised(interrupt_id: str, at: int, **kw: Any) -> dict[str, Any]:
    return {"type": "interrupt.raised", "at": at, "interrupt_id": interrupt_id, "reason": "confirm",
            "payload": QUESTION, **kw}


def resumed(interrupt_id: str, at: int, principal: str | None = "alice", answer: Any = None,
            timed_out: bool = False, **kw: Any) -> dict[str, Any]:
    event = {"type": "interrupt.resumed", "at": at, "interrupt_id": interrupt_id, "reason": "confirm",
             "request": QUESTION, "payload": {"approved": True} if answer is None else answer,
             "delivered": True, "timed_out": timed_out, **kw}
    if principal is not None:
        event["principal"] = principal
    return event


def cancelled(interrupt_id: str, at: int, why: str = "closed") -> dict[str, Any]:
    return {"type": "interrupt.cancelled", "at": at, "interrupt_id": interrupt_id, "reason": "confirm",
            "request": QUESTION, "why": why}


def test_each_way_a_question_ends_is_its_own_row() -> None:
    answered = ending_of("s", resumed("int-1", 5, "alice", {"approved": False}))
    assert answered == HistoryRow("s", "int-1", "confirm", QUESTION, Ending.ANSWERED, 5, principal="alice",
                                  answer={"approved": False}, delivered=True)
    assert answered.message == "Pay <b>acme</b>?" and '"approved": false' in answered.answer_json
    deadline = ending_of("s", resumed("int-2", 6, None, {"approved": False}, timed_out=True))
    assert deadline is not None and deadline.ending is Ending.DEADLINE and deadline.principal is None
    unsigned = ending_of("s", resumed("int-3", 7, None))
    assert unsigned is not None and unsigned.ending is Ending.ANSWERED and unsigned.principal is None
    gone = ending_of("s", cancelled("int-4", 8, "call_settled"))
    assert gone is not None
    assert (gone.ending, gone.why, gone.answer) == (Ending.CANCELLED, "call_settled", None)
    not_delivered = ending_of("s", resumed("int-5", 9, delivered=False))
    assert not_delivered is not None and not_delivered.delivered is False


def test_an_event_of_a_newer_release_with_a_field_of_its_own_still_makes_its_row() -> None:
    newer = {**resumed("int-1", 5, "alice", {"approved": True}), "added_later": {"x": 1}}
    row = ending_of("s", newer)
    assert row is not None and (row.principal, row.answer) == ("alice", {"approved": True})
    later = ending_of("s", {**cancelled("int-2", 6), "also_new": 1})
    assert later is not None and later.ending is Ending.CANCELLED


def test_a_question_without_a_message_has_none_and_its_payload_as_json() -> None:
    row = ending_of("s", {**resumed("int-1", 5), "request": ["a", 1]})
    assert row is not None and row.message is None and row.request_json == '[\n  "a",\n  1\n]'
    row = ending_of("s", {**resumed("int-1", 5), "request": {"message": 3}})
    assert row is not None and row.message is None


@pytest.mark.parametrize("event", [
    raised("int-1", 1),
    {"type": "turn.completed", "at": 1, "head": "msg-2"},
    {k: v for k, v in resumed("int-1", 1).items() if k != "interrupt_id"},
    {**resumed("int-1", 1), "timed_out": "yes"},
    {**cancelled("int-1", 1), "at": "noon"},
    {"type": "interrupt.resumed"},
])
def test_other_events_and_broken_endings_make_no_row(event: dict[str, Any]) -> None:
    assert ending_of("s", event) is None


def test_stream_entries_read_a_redis_reply_and_keep_what_is_not_json_as_none() -> None:
    reply = [(b"3-0", {b"event": orjson.dumps(resumed("int-1", 3))}), (b"2-0", {b"event": b"{not json"}),
             (b"1-0", {b"event": b"[1]"}), ("0-1", {})]
    entries = stream_entries(reply)
    assert [i for i, _ in entries] == ["3-0", "2-0", "1-0", "0-1"]
    assert entries[0][1] is not None and entries[0][1]["interrupt_id"] == "int-1"
    assert [e for _, e in entries[1:]] == [None, None, None]
    assert stream_entries(None) == []


# --- one session ---------------------------------------------------------------------------


def newest_first(events: list[dict[str, Any] | None]) -> list[tuple[str, dict[str, Any] | None]]:
    """A session's events (oldest first) as XREVRANGE gives them: ids `<i>-0`, newest first."""
    return [(f"{i + 1}-0", e) for i, e in reversed(list(enumerate(events)))]


CREATED = {"type": "session.created", "at": 1}


def test_a_sessions_history_is_its_ended_questions_newest_first_with_when_each_was_asked() -> None:
    events = [CREATED, raised("int-1", 10), resumed("int-1", 20, "alice"), raised("int-2", 30),
              {"type": "turn.completed", "at": 31, "head": "msg-3"},
              resumed("int-2", 40, None, {"approved": False}, timed_out=True), raised("int-3", 50),
              cancelled("int-3", 60), raised("int-4", 70)]  # int-4 is still open
    page = session_history("s", newest_first(events))
    assert [(r.interrupt_id, r.ending, r.principal, r.raised_at, r.ended_at) for r in page.rows] == [
        ("int-3", Ending.CANCELLED, None, 50, 60), ("int-2", Ending.DEADLINE, None, 30, 40),
        ("int-1", Ending.ANSWERED, "alice", 10, 20)]
    assert (page.older, page.trimmed, page.unreadable, page.read) == (None, False, 0, len(events))
    only_alice = session_history("s", newest_first(events), principal="alice")
    assert [r.interrupt_id for r in only_alice.rows] == ["int-1"]


def test_an_id_asked_again_is_paired_with_its_own_raise() -> None:
    events = [CREATED, raised("ask", 10), resumed("ask", 20), raised("ask", 30), resumed("ask", 45, "bob")]
    page = session_history("s", newest_first(events))
    assert [(r.principal, r.raised_at) for r in page.rows] == [("bob", 30), ("alice", 10)]


def test_a_page_reads_its_bound_and_points_at_the_older_events() -> None:
    events = [CREATED] + [e for i in range(5) for e in (raised(f"int-{i}", 10 * i + 1),
                                                         resumed(f"int-{i}", 10 * i + 5))]
    entries = newest_first(events)  # 11 events; a page of 4 is asked for 5
    first = session_history("s", entries[:5], limit=4)
    # the 4 newest: int-4's two and int-3's two: both answered, and both asked, in this page
    assert [(r.interrupt_id, r.raised_at) for r in first.rows] == [("int-4", 41), ("int-3", 31)]
    assert first.older == entries[3][0] == "8-0" and first.read == 4 and not first.trimmed
    # a raise on the next page: the row is there, without when it was asked
    cut = session_history("s", entries[:4], limit=3)
    assert [(r.interrupt_id, r.raised_at) for r in cut.rows] == [("int-4", 41), ("int-3", None)]
    last = session_history("s", entries[8:], limit=4)
    assert [r.interrupt_id for r in last.rows] == ["int-0"] and last.older is None and not last.trimmed


def test_a_stream_trimmed_past_its_first_event_says_so() -> None:
    events = [resumed("int-1", 20), raised("int-2", 30), resumed("int-2", 40)]
    page = session_history("s", newest_first(events))
    assert page.trimmed and [r.interrupt_id for r in page.rows] == ["int-2", "int-1"]
    assert session_history("s", newest_first([None, resumed("int-1", 2)])).trimmed  # unreadable first


def test_no_events_is_an_empty_page_and_unreadable_endings_are_counted_not_shown() -> None:
    empty = session_history("nobody", [])
    assert (empty.rows, empty.read, empty.trimmed, empty.older) == ((), 0, False, None)
    page = session_history("s", newest_first([CREATED, {"type": "interrupt.resumed", "at": 5}, None,
                                              resumed("int-2", 9)]))
    assert [r.interrupt_id for r in page.rows] == ["int-2"] and page.unreadable == 1


# --- a principal, over the shards' feeds ---------------------------------------------------


class Feed:
    """One shard's feed: entries (id, fields) oldest first, read as XREVRANGE reads a stream."""

    def __init__(self, entries: list[tuple[str, dict[bytes, bytes]]]):
        self.entries = entries
        self.reads = 0

    def xrevrange(self, newest: str, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        self.reads += 1

        def ok(entry_id: str) -> bool:
            at = FeedPosition.of(entry_id, 0).key
            if newest == "+":
                return True
            if newest.startswith("("):
                return at < FeedPosition.of(newest[1:], 0).key
            return at <= FeedPosition.of(newest, 0).key

        found = [(i.encode(), f) for i, f in reversed(self.entries) if ok(i)]
        return found[:count]


def feed_entry(session: str, event: dict[str, Any]) -> dict[bytes, bytes]:
    return {b"session": session.encode(), b"type": event["type"].encode(), b"event_id": b"1-0",
            b"event": orjson.dumps(event)}


def read_page(feeds: list[Feed], principal: str, before: str | None, limit: int, budget: int,
              chunk: int) -> tuple[list[HistoryRow], str | None, int | None]:
    position = None if before is None else FeedPosition.parse(before)
    scans = [FeedScan(principal, i, position, limit=limit, budget=budget, chunk=chunk)
             for i in range(len(feeds))]
    for feed, scan in zip(feeds, scans, strict=True):
        while (asked := scan.request()) is not None:
            scan.take(feed.xrevrange(*asked))
    page = principal_history(scans, [f.entries[0][0] if f.entries else None for f in feeds], limit=limit)
    assert all(scan.scanned <= budget for scan in scans)
    return list(page.rows), page.older, page.feed_since


def every_page(feeds: list[Feed], principal: str, limit: int, budget: int, chunk: int
               ) -> tuple[list[HistoryRow], int | None]:
    rows: list[HistoryRow] = []
    before: str | None = None
    for _ in range(10_000):
        page, before, since = read_page(feeds, principal, before, limit, budget, chunk)
        assert len(page) <= limit
        rows += page
        if before is None:
            return rows, since
    raise AssertionError("the pages never end")


def test_a_principals_answers_are_theirs_only_newest_first_over_every_shard() -> None:
    feeds = [
        Feed([("100-0", feed_entry("a", raised("int-1", 100))),
              ("110-0", feed_entry("a", resumed("int-1", 110))),
              ("300-0", feed_entry("c", resumed("int-1", 300, "bob"))),
              ("400-0", feed_entry("d", resumed("int-1", 400, None, timed_out=True)))]),
        Feed([("200-0", feed_entry("b", resumed("int-3", 200))),
              ("250-0", feed_entry("b", cancelled("int-4", 250))),
              ("500-0", feed_entry("e", resumed("int-9", 500, answer={"approved": False})))]),
    ]
    rows, older, since = read_page(feeds, "alice", None, limit=50, budget=100, chunk=2)
    assert [(r.session, r.interrupt_id, r.answer) for r in rows] == [
        ("e", "int-9", {"approved": False}), ("b", "int-3", {"approved": True}),
        ("a", "int-1", {"approved": True})]
    assert all(r.ending is Ending.ANSWERED and r.principal == "alice" for r in rows)
    assert older is None and since == 200  # the younger of the two feeds' oldest entries
    assert read_page(feeds, "carol", None, 50, 100, 2)[0] == []


def test_a_broken_feed_entry_is_counted_and_the_rest_read() -> None:
    broken = {b"session": b"a", b"type": b"interrupt.resumed", b"event": b"{oops"}
    no_session = {b"type": b"interrupt.resumed", b"event": orjson.dumps(resumed("int-2", 2))}
    feeds = [Feed([("1-0", broken), ("2-0", no_session), ("3-0", feed_entry("b", resumed("int-1", 3)))])]
    scan = FeedScan("alice", 0)
    while (asked := scan.request()) is not None:
        scan.take(feeds[0].xrevrange(*asked))
    page = principal_history([scan])
    assert [r.session for r in page.rows] == ["b"] and page.unreadable == 2 and page.read == 3


def test_a_scan_stops_at_its_budget_and_the_next_page_goes_on_from_there() -> None:
    # alice answered once, long ago, on shard 0; shard 1 is busy with bob's answers
    feeds = [Feed([("5-0", feed_entry("old", resumed("int-1", 5)))]),
             Feed([(f"{10 + i}-0", feed_entry(f"s{i}", resumed("int-1", 10 + i, "bob"))) for i in range(30)])]
    first, older, _since = read_page(feeds, "alice", None, limit=5, budget=10, chunk=4)
    # shard 1 was read only down to 30-0: alice's answer at 5-0 may not be shown before it
    assert first == [] and older == "30-0-1"
    rows, since = every_page(feeds, "alice", limit=5, budget=10, chunk=4)
    assert [r.session for r in rows] == ["old"] and since == 10


def test_two_shards_with_the_same_entry_ids_lose_nothing_between_pages() -> None:
    feeds = [Feed([(f"{t}-0", feed_entry(f"s{shard}-{t}", resumed("int-1", t))) for t in range(1, 8)])
             for shard in range(3)]
    rows, _since = every_page(feeds, "alice", limit=2, budget=3, chunk=2)
    assert [r.session for r in rows] == [f"s{shard}-{t}" for t in range(7, 0, -1) for shard in (2, 1, 0)]


@pytest.mark.parametrize("seed", range(25))
def test_paging_shows_every_answer_once_in_order_whatever_the_bounds(seed: int) -> None:
    """Random feeds (answers by alice and others, other events, ids shared between shards),
    read page by page with random bounds: every answer by alice, once, newest first."""
    rnd = random.Random(seed)
    feeds, expected = [], []
    for shard in range(rnd.randint(1, 4)):
        entries, ms = [], 0
        for n in range(rnd.randint(0, 60)):
            ms += rnd.choice([0, 1, 1, 2, 5])
            last_ms, _, last_seq = entries[-1][0].partition("-") if entries else ("", "", "")
            entry_id = f"{ms}-{int(last_seq) + 1 if last_ms == str(ms) else 0}"
            kind = rnd.random()
            session = f"s{shard}-{n}"
            if kind < 0.3:
                event = resumed("int-1", ms, "alice")
                expected.append((FeedPosition.of(entry_id, shard).key, session))
            elif kind < 0.5:
                event = resumed("int-1", ms, "bob")
            elif kind < 0.6:
                event = resumed("int-1", ms, None, timed_out=True)
            elif kind < 0.8:
                event = raised("int-1", ms)
            else:
                event = {"type": "turn.completed", "at": ms, "head": "msg-1"}
            entries.append((entry_id, feed_entry(session, event)))
        feeds.append(Feed(entries))
    limit, budget = rnd.randint(1, 6), rnd.randint(1, 12)
    rows, _since = every_page(feeds, "alice", limit=limit, budget=budget, chunk=rnd.randint(1, 8))
    assert [r.session for r in rows] == [session for _key, session in sorted(expected, reverse=True)]


def test_a_scan_is_done_at_its_limit_and_refuses_more_replies() -> None:
    feed = Feed([(f"{t}-0", feed_entry(f"s{t}", resumed("int-1", t))) for t in range(1, 6)])
    scan = FeedScan("alice", 0, limit=2, chunk=10)
    scan.take(feed.xrevrange(*(scan.request() or ("+", 10))))
    assert scan.done and scan.request() is None and [r.session for r in scan.rows] == ["s5", "s4"]
    assert scan.part().after == FeedPosition(4, 0, 0).key
    with pytest.raises(AssertionError):
        scan.take([])


# --- the page, rendered --------------------------------------------------------------------

TEMPLATES = Path(__file__).resolve().parents[2] / "parley" / "web" / "templates"
NOW = 1_785_247_385_000
XSS = '<script>alert("x")</script>'


def render(query: HistoryQuery | None, view: HistoryPage | None, error: str | None = None) -> str:
    # as Starlette's Jinja2Templates makes its environment: autoescape on
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    env.globals["duration"] = duration
    return env.get_template("history.html").render(principal="alice", csrf="t", now_ms=NOW, query=query,
                                                   view=view, error=error)


def test_the_page_is_a_table_with_a_caption_and_column_headers_and_escapes_everything() -> None:
    rows = (HistoryRow("s-1", "int-3", XSS, {"message": XSS}, Ending.ANSWERED, NOW - 5_000, principal=XSS,
                       answer={"note": XSS}, delivered=False, raised_at=NOW - 65_000),
            HistoryRow("s-1", "int-2", "confirm", None, Ending.DEADLINE, NOW - 60_000,
                       answer={"approved": False}),
            HistoryRow("s-1", "int-1", "approval", {}, Ending.CANCELLED, NOW - 90_000, why=XSS))
    html = render(HistoryQuery("s-1"), HistoryPage(rows, older="17-0", read=2000, unreadable=1))
    assert XSS not in html and "&lt;script&gt;" in html
    assert html.count("<caption>") == 1 and 'scope="col"' in html and "<th>" not in html
    assert re.findall(r'data-ending="(\w+)"', html) == ["answered", "deadline", "cancelled"]
    assert '<link rel="stylesheet" href="/static/history.css">' in html
    assert "2026-07-28 14:03:00 UTC" in html and "asked 1m 00s before" in html
    assert "not delivered yet" in html and "Deadline passed" in html and "the session was closed" in html
    assert 'href="/history?session=s-1&amp;before=17-0"' in html and 'id="history-bound"' in html
    assert "1 event could not be read and is not shown" in html
    assert 'href="/history?principal=%3Cscript%3Ealert%28%22x%22%29%3C/script%3E"' in html


def test_an_approvers_page_names_the_session_of_each_answer_and_how_far_the_feeds_reach() -> None:
    rows = (HistoryRow("acme/s-9", "int-1", "confirm", {"message": "Pay?"}, Ending.ANSWERED, NOW - 1_000,
                       principal="bob", answer={"approved": True}),)
    html = render(HistoryQuery(None, "bob"), HistoryPage(rows, feed_since=NOW - 3_600_000, read=40))
    assert "Answers given by bob" in html and '<th scope="col">Session</th>' in html
    assert 'href="/history?session=acme/s-9"' in html and 'id="history-older"' not in html
    assert "The feeds reach back to" in html and "1h 00m ago" in html
    empty = render(HistoryQuery(None, "carol"), HistoryPage((), older="5-0-1", read=5000))
    assert "No answers by carol among the entries read for this page" in empty
    assert 'href="/history?principal=carol&amp;before=5-0-1"' in empty


def test_a_bad_query_shows_the_error_and_the_form_to_ask_again() -> None:
    html = render(None, None, "name a session (/history?session=S) or a person (/history?principal=P)")
    assert 'id="history-error"' in html and 'id="history-search"' in html and "<table" not in html
    unknown = render(HistoryQuery("gone"), HistoryPage(()))
    assert "there is no such session" in unknown
