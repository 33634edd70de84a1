"""The inbox's history pages on two real Redis shards, with the bounds made small: a session's
history and an approver's answers page through Older links without losing or repeating a row
(two shards' feeds share entry ids), a trimmed stream and an unreadable entry say so, and a
shard that cannot be reached is a 503. The entries are written as the commit script writes
them (docs/protocol.md, "Events" and "Feed"); the e2e (tests/e2e/test_inbox_history.py) has
them written by a real dispatcher."""

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from starlette.testclient import TestClient

from parley.client.shards import Shards
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from parley.web.app import create_app
from parley.web.config import InboxConfig
from parley.web.history import Bounds
from parley.web.routes import history as history_route
from parley.web.users import hash_password

KEYS = Keys()


@dataclass
class TwoShards:
    servers: list[RedisServer]
    clients: list[redis.Redis]
    shards: Shards
    home: Path

    def shard_of(self, session: str) -> int:
        return self.shards.index_of_session(session)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[TwoShards]:
    servers = [RedisServer(tmp_path / f"redis-{i}").start() for i in range(2)]
    clients = [redis.Redis.from_url(s.url) for s in servers]
    shards = Shards(clients, KEYS)
    shards.check(partitions=8, create=True)
    (tmp_path / "keys.json").write_text(json.dumps({"alice": "alice-signing-key-0123456789"}))
    (tmp_path / "users.json").write_text(json.dumps({"alice": {"password": hash_password("alice-password")}}))
    try:
        yield TwoShards(servers, clients, shards, tmp_path)
    finally:
        for c in clients:
            c.close()
        for s in servers:
            s.stop(kill=True)


@pytest.fixture(autouse=True)
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    small = Bounds(session_events=4, page_rows=2, feed_scan=3, feed_chunk=2)
    monkeypatch.setattr(history_route, "BOUNDS", small)


def web_of(two: TwoShards) -> TestClient:
    config = InboxConfig(redis_urls=tuple(s.url for s in two.servers),
                         users_file=str(two.home / "users.json"), keys_file=str(two.home / "keys.json"),
                         session_secret="a-secret-of-this-test",
                         secure_cookies=False)  # TestClient speaks plain HTTP
    return TestClient(create_app(config), follow_redirects=False)


def sign_in(web: TestClient) -> None:
    token = re.findall(r'name="csrf" value="([^"]+)"', web.get("/signin").text)[0]
    assert web.post("/signin", data={"principal": "alice", "secret": "alice-password", "csrf": token,
                                     "next": "/"}).status_code == 303


def resumed(interrupt_id: str, at: int, principal: str | None, answer: Any) -> dict[str, Any]:
    event = {"type": "interrupt.resumed", "at": at, "interrupt_id": interrupt_id, "reason": "confirm",
             "request": {"message": f"Question {interrupt_id}?"}, "payload": answer, "delivered": True,
             "timed_out": principal is None}
    if principal is not None:
        event["principal"] = principal
    return event


def add_feed(r: redis.Redis, entry_id: str, session: str, event: dict[str, Any] | bytes) -> None:
    raw = event if isinstance(event, bytes) else orjson.dumps(event)
    kind = b"interrupt.resumed" if isinstance(event, bytes) else event["type"].encode()
    r.xadd(KEYS.feed, {"session": session, "type": kind, "event_id": "1-0", "event": raw}, id=entry_id)


def rows_of(page: str) -> list[dict[str, str]]:
    return [{k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', attrs)}
            for attrs in re.findall(r'<tr class="ended" ([^>]*)>', page)]


def every_page(web: TestClient, url: str) -> tuple[list[dict[str, str]], list[str]]:
    """Rows of `url` and of each Older page after it, and the pages' texts."""
    rows: list[dict[str, str]] = []
    pages: list[str] = []
    next_url: str | None = url
    while next_url is not None:
        reply = web.get(next_url)
        assert reply.status_code == 200, reply.text[-1500:]
        pages.append(reply.text)
        rows += rows_of(reply.text)
        older = re.search(r'id="history-older" href="([^"]+)"', reply.text)
        next_url = html.unescape(older.group(1)) if older else None
        assert len(pages) < 50, "the Older links never end"
    return rows, pages


def test_an_approvers_answers_page_over_both_shards_feeds_without_a_gap_or_a_repeat(two: TwoShards) -> None:
    expected = []
    add_feed(two.clients[0], "1785000000500-0", "s0-broken", b"{not json")  # the oldest entry
    for shard, r in enumerate(two.clients):
        for t in range(1, 9):
            entry_id = f"{1_785_000_000_000 + t * 1000}-0"  # the same ids on both shards
            session = f"s{shard}-{t}"
            if t % 3 == 0:  # someone else's answer, and a turn's end, between alice's
                add_feed(r, entry_id, session, resumed("int-1", t, "bob", {"approved": False}))
                turn = {"type": "turn.completed", "at": t, "head": "msg-1"}
                add_feed(r, entry_id[:-1] + "1", session, turn)
            else:
                add_feed(r, entry_id, session, resumed("int-1", t, "alice", {"approved": True, "t": t}))
                expected.append((t, shard, session))
    with web_of(two) as web:
        sign_in(web)
        rows, pages = every_page(web, "/history?principal=alice")
        assert len(pages) > 3  # the bounds made it page
        assert [r["data-session"] for r in rows] == [s for _t, _shard, s in sorted(expected, reverse=True)]
        assert all(r["data-principal"] == "alice" and r["data-ending"] == "answered" for r in rows)
        assert "1 event could not be read" in pages[-1]
        assert "The feeds reach back to <time datetime=\"2026-07-25T17:20:01Z\">" in pages[0]
        # bob's: the same feeds, his rows only
        bobs, _ = every_page(web, "/history?principal=bob")
        assert [r["data-session"] for r in bobs] == [f"s{shard}-{t}" for t in (6, 3) for shard in (1, 0)]


def test_a_sessions_history_pages_through_its_events_and_says_when_its_stream_was_trimmed(
        two: TwoShards) -> None:
    session = "hist-paged"
    r = two.clients[two.shard_of(session)]
    events = KEYS.events(session)
    r.xadd(events, {"event": orjson.dumps({"type": "session.created", "at": 1})})
    for i in range(1, 6):
        asked = {"type": "interrupt.raised", "at": 10 * i, "interrupt_id": f"int-{i}", "reason": "confirm",
                 "payload": {"message": f"Question {i}?"}}
        r.xadd(events, {"event": orjson.dumps(asked)})
        r.xadd(events, {"event": orjson.dumps(resumed(f"int-{i}", 10 * i + 5, "alice" if i % 2 else None,
                                                      {"approved": True}))})
    with web_of(two) as web:
        sign_in(web)
        rows, pages = every_page(web, f"/history?session={session}")
        assert len(pages) == 3 and all('id="history-bound"' in p for p in pages[:-1])
        assert [(r["data-interrupt"], r["data-ending"]) for r in rows] == [
            (f"int-{i}", "answered" if i % 2 else "deadline") for i in range(5, 0, -1)]
        assert 'id="history-trimmed"' not in "".join(pages)  # it goes back to session.created
        mine, _ = every_page(web, f"/history?session={session}&principal=alice")
        assert [r["data-interrupt"] for r in mine] == ["int-5", "int-3", "int-1"]
        # trimmed as a stream's MAXLEN trims it: the earliest events are gone
        r.xtrim(events, maxlen=3, approximate=False)
        reply = web.get(f"/history?session={session}")
        assert 'id="history-trimmed"' in reply.text and 'id="history-older"' not in reply.text
        assert [row["data-interrupt"] for row in rows_of(reply.text)] == ["int-5", "int-4"]


def test_a_shard_that_cannot_be_reached_is_a_503(two: TwoShards) -> None:
    with web_of(two) as web:
        sign_in(web)
        assert web.get("/history?principal=alice").status_code == 200
        two.servers[1].stop(kill=True)
        reply = web.get("/history?principal=alice")
        assert reply.status_code == 503 and "unavailable" in reply.text
