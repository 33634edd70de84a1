"""The inbox's feed hub on real redis-servers (parley/web/live/): entries written in the feed's
format on one shard and on two reach every subscriber in each shard's order; other types and
malformed entries do not; a shard that restarts is read again from where the hub was, and a
feed that lost entries the hub had not read resets the pages."""

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from parley.aclient import AsyncClient
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from parley.web.live import (
    CLOCK_MARGIN_MS,
    RESET,
    ROW_DELAYS_S,
    Change,
    FeedHub,
    RowCache,
    Subscription,
    stream_id,
)

KEYS = Keys()


def xadd(r: redis.Redis, kind: str, session: str, interrupt_id: str, **event: Any) -> str:
    """One feed entry as the commit script writes it (docs/protocol.md, "Feed")."""
    body = {"type": kind, "at": 1, "interrupt_id": interrupt_id, **event}
    entry: Any = r.xadd(KEYS.feed, {"session": session, "type": kind, "event_id": "1-0",
                                    "event": orjson.dumps(body)})
    return str(entry.decode())


def raised(r: redis.Redis, session: str, interrupt_id: str) -> str:
    return xadd(r, "interrupt.raised", session, interrupt_id, reason="approval",
                payload={"tool": "send_email"}, anchor="msg-2")


def summary(change: Change) -> tuple[str, str, str]:
    return change.kind.value, change.session, change.interrupt_id


async def take(sub: Subscription, n: int, timeout: float = 10) -> list[Change]:
    """The next `n` changes of `sub` (AssertionError when they do not come in time)."""
    got: list[Change] = []
    try:
        async with asyncio.timeout(timeout):
            while len(got) < n:
                change = await sub.get()
                assert change is not None, "subscription closed"
                got.append(change)
    except TimeoutError:
        raise AssertionError(f"{len(got)} of {n} changes after {timeout}s: {got}") from None
    return got


async def until(check: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def run_hub(hub: FeedHub, body: Callable[[asyncio.Task[None]], Coroutine[Any, Any, None]]) -> None:
    """Run the hub while `body(task)` runs; then cancel it: it must stop cleanly."""
    async def main() -> None:
        task = asyncio.create_task(hub.run())
        try:
            await until(lambda: all(p is not None for p in hub.positions) or task.done())
            await body(task)
            assert not task.done(), "the hub stopped on its own"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for client in hub.clients:
                await client.aclose()
        assert task.cancelled()

    asyncio.run(main())


def no_retry(url: str) -> Redis:
    """A client that reports an outage at once (redis-py would retry a few times first), so
    the hub's own reconnect is what these tests see."""
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0))


def test_subscribers_get_interrupt_changes_in_order_and_nothing_else(r: redis.Redis,
                                                                     redis_server: RedisServer) -> None:
    raised(r, "s-old", "i-old")  # before the hub started: not a change of this page's time
    hub = FeedHub([Redis.from_url(redis_server.url)], KEYS)

    async def body(task: asyncio.Task[None]) -> None:
        one, two = hub.subscribe(), hub.subscribe()
        raised(r, "s-1", "i-1")
        xadd(r, "turn.completed", "s-1", "")
        r.xadd(KEYS.feed, {"session": "s-1", "type": "interrupt.raised"})  # no event_id, no event
        r.xadd(KEYS.feed, {"session": "s-1", "type": "interrupt.raised", "event_id": "1-0",
                           "event": b"{not json"})
        xadd(r, "interrupt.raised", "s-1", "")  # no interrupt id
        xadd(r, "interrupt.resumed", "s-1", "i-1", payload={}, delivered=False, timed_out=True)
        raised(r, "s-2", "i-2")
        xadd(r, "interrupt.cancelled", "s-2", "i-2", reason="approval", why="closed")
        raised(r, "s:with spaces\"]", "i-3")
        expected = [("raised", "s-1", "i-1"), ("gone", "s-1", "i-1"), ("raised", "s-2", "i-2"),
                    ("gone", "s-2", "i-2"), ("raised", "s:with spaces\"]", "i-3")]
        for sub in (one, two):
            got = await take(sub, 5)
            assert [summary(c) for c in got] == expected
            assert got[1].timed_out and got[1].type == "interrupt.resumed"
            assert got[3].type == "interrupt.cancelled" and not got[3].timed_out
            assert got[0].event is not None and got[0].event["payload"] == {"tool": "send_email"}
        await asyncio.sleep(0.3)
        assert await one.get(timeout=0.01) is None  # nothing else (the old entry, the others)
        assert hub.subscribers == 2
        one.close()
        assert hub.subscribers == 1
        last: Any = r.xrevrange(KEYS.feed, count=1)
        assert hub.positions[0] == last[0][0].decode()

    run_hub(hub, body)


def test_an_empty_feed_is_read_from_its_start(r: redis.Redis, redis_server: RedisServer) -> None:
    hub = FeedHub([Redis.from_url(redis_server.url, decode_responses=True)], KEYS)

    async def body(task: asyncio.Task[None]) -> None:
        assert hub.positions == ["0-0"]
        sub = hub.subscribe()
        raised(r, "s-1", "i-1")
        assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-1")]

    run_hub(hub, body)


def test_an_idle_feed_is_not_an_outage(r: redis.Redis, redis_server: RedisServer,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """A read blocks within the client's socket timeout: an idle feed is read again and again,
    never cut off as if the shard were gone."""
    hub = FeedHub([Redis.from_url(redis_server.url, socket_timeout=1.0)], KEYS, block_ms=5000)

    async def body(task: asyncio.Task[None]) -> None:
        sub = hub.subscribe()
        await asyncio.sleep(2.5)
        raised(r, "s-1", "i-1")
        assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-1")]

    with caplog.at_level(logging.WARNING, logger="parley.web.live"):
        run_hub(hub, body)
    assert [(rec.getMessage(), getattr(rec, "kv", None)) for rec in caplog.records] == []


def second_server(tmp_path: Path) -> RedisServer:
    return RedisServer(tmp_path / "redis-2", appendonly=True).start()


def test_two_shards_each_in_its_order(r: redis.Redis, redis_server: RedisServer, tmp_path: Path) -> None:
    other = second_server(tmp_path)
    r2 = redis.Redis.from_url(other.url)
    hub = FeedHub([Redis.from_url(redis_server.url), Redis.from_url(other.url)], KEYS, block_ms=200)
    try:
        async def body(task: asyncio.Task[None]) -> None:
            sub = hub.subscribe()
            for i in range(30):
                raised(r if i % 3 else r2, f"s-{i % 3}", f"i-{i}")
            got = [summary(c) for c in await take(sub, 30)]
            for shard in range(3):
                mine = [c for c in got if c[1] == f"s-{shard}"]
                assert mine == [("raised", f"s-{shard}", f"i-{i}") for i in range(shard, 30, 3)]

        run_hub(hub, body)
    finally:
        r2.close()
        other.stop(kill=True)


def test_a_shard_down_at_start_does_not_hold_up_the_others(r: redis.Redis, redis_server: RedisServer,
                                                           tmp_path: Path) -> None:
    other = second_server(tmp_path)
    other.stop(kill=True)
    hub = FeedHub([Redis.from_url(redis_server.url), no_retry(other.url)], KEYS,
                  backoff_base_s=0.05, backoff_cap_s=0.1)

    async def main() -> None:
        task = asyncio.create_task(hub.run())
        try:
            await until(lambda: hub.positions[0] is not None)
            sub = hub.subscribe()
            raised(r, "s-1", "i-1")
            assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-1")]
            assert hub.positions[1] is None and not hub.connected[1]
            other.start()  # the shard comes: read from its feed's end then
            r2 = redis.Redis.from_url(other.url)
            raised(r2, "s-before", "i-before")
            await until(lambda: hub.positions[1] is not None)
            raised(r2, "s-2", "i-2")
            assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-2", "i-2")]
            r2.close()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            for client in hub.clients:
                await client.aclose()
            other.stop(kill=True)

    asyncio.run(main())


def test_a_restarted_shard_is_read_on_from_the_last_entry_read(r: redis.Redis, redis_server: RedisServer,
                                                                tmp_path: Path) -> None:
    other = second_server(tmp_path)
    r2 = redis.Redis.from_url(other.url)
    # a second between two tries: the shard is back, and written to, before the hub looks again
    hub = FeedHub([Redis.from_url(redis_server.url), no_retry(other.url)], KEYS,
                  backoff_base_s=1.0, backoff_cap_s=1.0)
    try:
        async def body(task: asyncio.Task[None]) -> None:
            sub = hub.subscribe()
            raised(r2, "s-2", "i-1")
            assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-2", "i-1")]
            other.stop(kill=True)
            await until(lambda: not hub.connected[1])
            raised(r, "s-1", "i-2")  # the other shard goes on meanwhile
            assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-2")]
            other.start()
            raised(r2, "s-2", "i-3")  # written before the hub is back: not lost
            xadd(r2, "interrupt.resumed", "s-2", "i-1", payload={}, delivered=True, timed_out=False)
            got = await take(sub, 2)
            assert [summary(c) for c in got] == [("raised", "s-2", "i-3"), ("gone", "s-2", "i-1")]
            assert hub.connected == [True, True]

        run_hub(hub, body)
    finally:
        r2.close()
        other.stop(kill=True)


def test_a_feed_that_lost_unread_entries_resets_every_page(r: redis.Redis, redis_server: RedisServer) -> None:
    hub = FeedHub([no_retry(redis_server.url)], KEYS, backoff_base_s=1.0, backoff_cap_s=1.0)

    async def body(task: asyncio.Task[None]) -> None:
        sub = hub.subscribe()
        raised(r, "s-1", "i-1")
        assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-1")]
        redis_server.stop(kill=True)
        await until(lambda: not hub.connected[0])
        redis_server.start()
        w = redis.Redis.from_url(redis_server.url)
        for i in (2, 3, 4):
            raised(w, "s-1", f"i-{i}")
        w.xtrim(KEYS.feed, maxlen=1, approximate=False)  # i-2 and i-3 are gone unread
        assert await take(sub, 1) == [RESET]
        await until(lambda: hub.connected[0])
        raised(w, "s-1", "i-5")  # once the page has its reset, changes flow again
        got = [c.interrupt_id for c in await take(sub, 1)]
        if got == ["i-4"]:  # read after the page took its reset: harmless (the reload shows it)
            got = [c.interrupt_id for c in await take(sub, 1)]
        assert got == ["i-5"]
        w.close()

    run_hub(hub, body)


@pytest.mark.parametrize("written_since", [False, True])
def test_a_shard_back_without_its_data_resets_every_page(r: redis.Redis, redis_server: RedisServer,
                                                         written_since: bool) -> None:
    """The shard lost its data (or a replica that had not all of the feed took over): the
    pages reset, and the hub goes on from the end of the feed as it is now."""
    hub = FeedHub([no_retry(redis_server.url)], KEYS, backoff_base_s=1.0, backoff_cap_s=1.0)

    async def body(task: asyncio.Task[None]) -> None:
        sub = hub.subscribe()
        raised(r, "s-1", "i-1")
        assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-1", "i-1")]
        redis_server.stop(kill=True)
        await until(lambda: not hub.connected[0])
        shutil.rmtree(redis_server.directory)  # its data is lost
        redis_server.start()
        w = redis.Redis.from_url(redis_server.url)
        if written_since:  # a feed older than the last entry the hub read
            w.xadd(KEYS.feed, {"session": "s-0", "type": "interrupt.raised", "event_id": "1-0",
                               "event": orjson.dumps({"type": "interrupt.raised", "interrupt_id": "i-0"})},
                   id="1-0")
        assert await take(sub, 1) == [RESET]
        assert hub.positions == ["1-0" if written_since else "0-0"]
        raised(w, "s-9", "i-9")
        assert [summary(c) for c in await take(sub, 1)] == [("raised", "s-9", "i-9")]
        w.close()

    run_hub(hub, body)


def test_a_slow_page_gets_one_reset(r: redis.Redis, redis_server: RedisServer) -> None:
    hub = FeedHub([Redis.from_url(redis_server.url)], KEYS, queue_size=5)

    async def body(task: asyncio.Task[None]) -> None:
        slow, quick = hub.subscribe(), hub.subscribe()
        got = []
        for i in range(8):
            raised(r, "s-1", f"i-{i}")
            got += await take(quick, 1)  # a page that keeps up gets them all
        assert [c.interrupt_id for c in got] == [f"i-{i}" for i in range(8)]
        assert await take(slow, 1) == [RESET]  # one that does not: a single reset
        assert await slow.get(timeout=0.2) is None
        assert slow.resets == 1 and quick.resets == 0

    run_hub(hub, body)


# ---- nothing lost between a page's render and its stream, nor across a reconnect or restart


def now_ms() -> int:
    return int(time.time() * 1000)


def read_up_to(hub: FeedHub, entry_id: str) -> Callable[[], bool]:
    return lambda: hub.positions[0] is not None and stream_id(hub.positions[0]) >= stream_id(entry_id)


def test_a_change_between_render_and_stream_is_delivered(r: redis.Redis, redis_server: RedisServer) -> None:
    hub = FeedHub([Redis.from_url(redis_server.url)], KEYS)

    async def body(task: asyncio.Task[None]) -> None:
        await asyncio.sleep(CLOCK_MARGIN_MS / 1000)  # pages rendered after the hub started
        rendered = now_ms()  # the page is rendered: body[data-now]
        last = raised(r, "s-1", "i-1")  # raised before its stream opens
        xadd(r, "interrupt.resumed", "s-0", "i-0", delivered=True, timed_out=False)  # answered
        await until(read_up_to(hub, last))
        await until(lambda: hub.positions[0] != last)
        page = hub.subscribe(rendered)
        assert [summary(c) for c in await take(page, 2)] == [("raised", "s-1", "i-1"), ("gone", "s-0", "i-0")]
        raised(r, "s-2", "i-2")  # then live, as before
        assert [summary(c) for c in await take(page, 1)] == [("raised", "s-2", "i-2")]
        # a reconnect (same URL, same since) gets them all again; the page skips what it has
        again = hub.subscribe(rendered)
        assert [c.interrupt_id for c in await take(again, 3)] == ["i-1", "i-0", "i-2"]
        assert await hub.subscribe().get(timeout=0.2) is None  # without since: from now on

    run_hub(hub, body)


def test_a_since_older_than_the_buffer_gets_reset(r: redis.Redis, redis_server: RedisServer) -> None:
    hub = FeedHub([Redis.from_url(redis_server.url)], KEYS, replay_size=2)

    async def body(task: asyncio.Task[None]) -> None:
        await asyncio.sleep(CLOCK_MARGIN_MS / 1000)
        rendered = now_ms()
        await asyncio.sleep(0.01)
        for i in range(3):
            last = raised(r, "s-1", f"i-{i}")
        await until(read_up_to(hub, last))
        assert await take(hub.subscribe(rendered), 1) == [RESET]  # i-0 dropped out of the buffer
        assert await hub.subscribe(now_ms() + CLOCK_MARGIN_MS).get(timeout=0.2) is None

    run_hub(hub, body)


def test_a_page_rendered_before_a_restart_of_the_inbox_replays_or_resets(r: redis.Redis,
                                                                         redis_server: RedisServer) -> None:
    """The inbox process restarts (a deploy): a page reconnects to the new hub with its since.
    Nothing written meanwhile: it goes on with nothing lost; a change written while no hub read
    the feed: it reloads."""
    raised(r, "s-0", "i-0")
    time.sleep(CLOCK_MARGIN_MS / 1000 + 0.01)
    rendered = now_ms()
    for written_while_down in (False, True):
        if written_while_down:
            raised(r, "s-1", "i-down")
        hub = FeedHub([Redis.from_url(redis_server.url)], KEYS)

        async def body(task: asyncio.Task[None], hub: FeedHub = hub, down: bool = written_while_down) -> None:
            page = hub.subscribe(rendered)
            if down:
                assert await take(page, 1) == [RESET]
                return
            raised(r, "s-2", "i-2")
            assert [summary(c) for c in await take(page, 1)] == [("raised", "s-2", "i-2")]

        run_hub(hub, body)


@pytest.mark.parametrize("read_before", [True, False])
def test_a_feed_that_lost_entries_resets_a_page_rendered_before(r: redis.Redis, redis_server: RedisServer,
                                                                read_before: bool) -> None:
    """Entries lost while the hub was away (read from an entry on, or from the start of a feed
    that was empty)."""
    hub = FeedHub([no_retry(redis_server.url)], KEYS, backoff_base_s=1.0, backoff_cap_s=1.0)

    async def body(task: asyncio.Task[None]) -> None:
        await asyncio.sleep(CLOCK_MARGIN_MS / 1000)
        rendered = now_ms()
        sub = hub.subscribe()
        if read_before:
            raised(r, "s-0", "i-0")
            assert [c.interrupt_id for c in await take(sub, 1)] == ["i-0"]
        redis_server.stop(kill=True)
        await until(lambda: not hub.connected[0])
        redis_server.start()
        w = redis.Redis.from_url(redis_server.url)
        for i in (1, 2):
            raised(w, "s-1", f"i-{i}")
        w.xtrim(KEYS.feed, maxlen=0, approximate=False)  # gone unread
        assert await take(sub, 1) == [RESET]
        # the page rendered before the loss, whose stream opens (or reconnects) now: reset too
        assert await take(hub.subscribe(rendered), 1) == [RESET]
        w.close()

    run_hub(hub, body)


# ---- a raised row is looked up once per process, and briefly


def test_a_row_never_there_is_looked_up_once_for_all_pages_and_briefly(redis_server: RedisServer) -> None:
    async def main() -> tuple[list[Any], int, float]:
        client = AsyncClient([Redis.from_url(redis_server.url)], KEYS.prefix)
        reads = 0

        async def open_interrupt(session: str, interrupt_id: str) -> Any:
            nonlocal reads
            reads += 1
            return await client.open_interrupt(session, interrupt_id)

        rows = RowCache()
        began = time.monotonic()
        got = await asyncio.gather(*(rows.get("s-gone", "i-gone", open_interrupt) for _ in range(20)))
        took = time.monotonic() - began
        await client.redis.aclose()
        return got, reads, took

    got, reads, took = asyncio.run(main())
    assert got == [None] * 20
    assert reads == len(ROW_DELAYS_S)  # not 20 pages x 6
    assert took < 1.0  # 0.35 s of waits (it was 1.55 s per page, one page after another)
