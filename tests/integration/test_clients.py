"""`Client` and `AsyncClient` against a real Redis: the same inputs, the same checks before
sending (a refused input leaves the stream empty), the same views, listing and outcomes."""

import asyncio
import time
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.client.producer import InvalidInput
from parley.dispatcher.core import IndexAdd
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer
from parley.schemas.events import InputIgnored, LlmStarted, MessageCreated, SessionCreated
from parley.schemas.inputs import Budget, MessageCreate, SessionCreate
from parley.schemas.resumes import CloseStatus, ResumeStatus
from tests.forkserver import run_parley
from tests.integration.conftest import INPUTS, KEYS, MakeDispatcher, tick

BAD_INPUTS: list[tuple[str, Any]] = [
    ("s-1", {"type": "message.create"}),  # no content
    ("s-1", {"type": "message.create", "content": "x", "extra": 1}),
    ("s-1", {"type": "session.create", "budget": {"llm_calls": -1}}),
    ("s-1", {"type": "teleport"}),
    ("not a session id", {"type": "message.create", "content": "x"}),
    ("s-1", {"type": "message.create", "content": "x", "message_id": 2**64}),
]


def run(redis_server: RedisServer, use: Any) -> Any:
    """`use(AsyncClient)` on a fresh asyncio connection, in its own event loop."""
    async def main() -> Any:
        conn = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return await use(AsyncClient(conn))
        finally:
            await conn.aclose()
    return asyncio.run(main())


def test_both_clients_refuse_an_invalid_input_before_sending_it(
        r: redis.Redis, client: Client, redis_server: RedisServer) -> None:
    for session, value in BAD_INPUTS:
        with pytest.raises(InvalidInput):
            client.send(session, value)
        with pytest.raises(InvalidInput):
            run(redis_server, lambda c, s=session, v=value: c.send(s, v))
    with pytest.raises(InvalidInput, match="interrupt_id"):
        client.resume("s-1", "not an id", {}, wait=True)
    with pytest.raises(InvalidInput, match="interrupt_id"):
        run(redis_server, lambda c: c.resume("s-1", "not an id", {}, wait=True))
    assert r.exists(INPUTS) == 0  # nothing was sent


def test_both_clients_write_the_same_entry_for_a_model_or_its_dict(
        r: redis.Redis, client: Client, redis_server: RedisServer) -> None:
    model = SessionCreate(type="session.create", budget=Budget(llm_calls=2))
    client.send("s-1", model, "k1")
    run(redis_server, lambda c: c.send("s-2", {"type": "session.create", "budget": {"llm_calls": 2}}, "k2"))
    written = [(f[b"session"], orjson.loads(f[b"input"])) for _id, f in r.xrange(INPUTS)]
    assert written == [(b"s-1", {"type": "session.create", "budget": {"llm_calls": 2}}),
                       (b"s-2", {"type": "session.create", "budget": {"llm_calls": 2}})]


def test_the_async_client_sends_watches_typed_events_and_shows_the_session(
        client: Client, redis_server: RedisServer, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()

    async def use(c: AsyncClient) -> Any:
        await c.send("s-1", SessionCreate(type="session.create", metadata={"team": "a"}))
        await c.send("s-1", MessageCreate(type="message.create", content="hello"))
        tick(d)
        seen = [e async for _id, e in c.watch("s-1", until=time.monotonic() + 0.5, block_ms=50)]
        return seen, await c.show("s-1"), await c.show("nobody")

    seen, view, nobody = run(redis_server, use)
    assert [type(e) for e in seen] == [SessionCreated, MessageCreated, LlmStarted]
    assert isinstance(seen[1], MessageCreated) and seen[1].message["content"] == "hello"
    assert view == client.show("s-1") and view is not None and nobody is None
    assert [type(e) for _id, e in client.watch("s-1", until=time.monotonic() + 0.2, block_ms=50)] == \
        [SessionCreated, MessageCreated, LlmStarted]


def test_the_async_client_awaits_a_resumes_outcome(
        client: Client, redis_server: RedisServer, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    client.send("s-1", {"type": "session.create"})
    tick(d)

    def dispatcher_later() -> None:
        time.sleep(0.2)  # the resume is sent, and awaited, before the dispatcher reads it
        tick(d)

    async def use(c: AsyncClient) -> Any:
        outcome, _ = await asyncio.gather(c.resume("s-1", "int-9", {"ok": True}, wait=True, timeout_s=10),
                                          asyncio.to_thread(dispatcher_later))
        timeout = await c.resume("s-1", "int-9", None, wait=True, timeout_s=0.2)  # nobody ticks now
        return outcome, timeout

    outcome, timeout = run(redis_server, use)
    assert (outcome.status, outcome.code) == (ResumeStatus.IGNORED, "unknown_interrupt")
    assert isinstance(InputIgnored.model_validate(outcome.event), InputIgnored)
    assert timeout.status is ResumeStatus.TIMEOUT and timeout.entry != outcome.entry


def test_both_clients_list_the_same_open_interrupts_page_by_page(
        r: redis.Redis, client: Client, redis_server: RedisServer) -> None:
    def add(iid: str, at: int, reason: str, by: list[str] | None) -> IndexAdd:
        return IndexAdd(seq=1, interrupt_id=iid, reason=reason, anchor=None, raised_at=at, deadline=None,
                        parent=None, payload={"q": iid}, default=None, resumable_by=by, metadata=None,
                        response_schema=None)
    Outbox(r, KEYS).flush_many([("a-1", [add("i1", 1_000, "confirm", ["alice"])]),
                                ("a-2", [add("i1", 2_000, "budget", None)]),
                                ("b-1", [add("i1", 3_000, "confirm", None)])])
    filters = [None, InterruptFilter(reason="confirm"), InterruptFilter(session_prefix="a-"),
               InterruptFilter(reason="confirm", principal="bob"), InterruptFilter(newest_first=True),
               InterruptFilter(session_prefix="a-", newest_first=True)]

    async def use(c: AsyncClient) -> Any:
        pages = []
        for flt in filters:
            page = await c.interrupt_page(flt, limit=1)
            pages.append((page, await c.interrupt_page(flt, limit=1, cursor=page.cursor)))
        return pages, [await c.interrupts(flt) for flt in filters]

    pages, every = run(redis_server, use)
    for flt, (first, second) in zip(filters, pages, strict=True):
        assert first == client.interrupt_page(flt, limit=1)
        assert second == client.interrupt_page(flt, limit=1, cursor=first.cursor)
    assert every == [client.interrupts(flt) for flt in filters]
    assert [row["session"] for row in every[3]] == ["b-1"]
    assert [[row["session"] for row in rows] for rows in every[4:]] == [["b-1", "a-2", "a-1"], ["a-2", "a-1"]]


def test_both_clients_close_a_session_and_wait_for_the_outcome(
        client: Client, redis_server: RedisServer, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    client.send("s-1", {"type": "session.create"})
    tick(d)

    def dispatcher_later() -> None:
        time.sleep(0.2)  # the close is sent, and awaited, before the dispatcher reads it
        tick(d)

    async def use(c: AsyncClient) -> Any:
        closed, _ = await asyncio.gather(c.close("s-1", "done here", wait=True, timeout_s=10),
                                         asyncio.to_thread(dispatcher_later))
        timeout = await c.close("s-1", wait=True, timeout_s=0.2)  # nobody ticks now
        return closed, timeout

    closed, timeout = run(redis_server, use)
    assert closed.status is CloseStatus.CLOSED and closed.exit_code == 0
    assert closed.event is not None and closed.event["reason"] == "done here"
    assert (timeout.status, timeout.exit_code) == (CloseStatus.TIMEOUT, 6)
    # the sync client: a second close (the one above is applied first) is ignored
    again = client.close("s-1", wait=True, timeout_s=0.3)
    assert again.status is CloseStatus.TIMEOUT  # nobody ticks
    tick(d)
    entry = client.close("s-1", idempotency_key="close-3")
    tick(d)
    ignored = [e for _id, e in client.events("s-1", block_ms=1, until=time.monotonic() + 0.1)
               if e.get("input", {}).get("entry") == entry]
    assert [(e["type"], e["code"]) for e in ignored] == [("input.ignored", "session_closed")]
    with pytest.raises(InvalidInput, match="reason"):
        client.close("s-1", "")
    with pytest.raises(InvalidInput, match="reason"):
        run(redis_server, lambda c: c.close("s-1", "x" * 257))


@pytest.mark.parametrize("args", [["input", "s-1", '{"type": "message.create"}'],
                                  ["resume", "s-1", "not an id", "{}"],
                                  ["close", "s-1", "--reason", ""],
                                  ["send", "not a session", "hi"]])
def test_the_command_line_says_in_one_line_why_an_input_is_not_sent(
        r: redis.Redis, redis_server: RedisServer, args: list[str]) -> None:
    out = run_parley(["--redis-url", redis_server.url, *args], text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1, out.stderr
    assert r.exists(INPUTS) == 0
