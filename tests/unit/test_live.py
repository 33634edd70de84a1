"""The inbox's live updates without Redis: a subscription's bounded queue, the feed entries the
hub follows, and the server-sent events of one page (parley/web/live/)."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from parley.client.feed import FeedEntry, FeedEntryError
from parley.client.inbox import InterruptFilter
from parley.schemas.keys import Keys
from parley.web.live import (
    RESET,
    ROW_DELAYS_S,
    Change,
    ChangeKind,
    FeedHub,
    RowCache,
    Subscription,
    change_of,
    event_stream,
    shown_by,
    since_of,
    why_lost,
)

RAISED = Change(ChangeKind.RAISED, "s-1", "i-1", {"type": "interrupt.raised", "interrupt_id": "i-1"})
ANSWERED = Change(ChangeKind.GONE, "s-1", "i-1", {"type": "interrupt.resumed", "interrupt_id": "i-1",
                                                  "timed_out": False, "delivered": True})
TIMED_OUT = Change(ChangeKind.GONE, "s-2", "i-2", {"type": "interrupt.resumed", "interrupt_id": "i-2",
                                                   "timed_out": True, "delivered": False})


def entry(kind: str, session: str = "s-1", **event: Any) -> FeedEntry:
    return FeedEntry("1-0", session, kind, "5-0", {"type": kind, **event})


def frames(text: str) -> list[dict[str, Any]]:
    """The events of a text/event-stream body: [{"event": ..., "data": ..., ...}]."""
    found = []
    for block in text.split("\n\n"):
        if not block:
            continue
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            fields[name or "comment"] = value.strip()
        if "data" in fields:
            fields["data"] = orjson.loads(fields["data"])
        found.append(fields)
    return found


async def collect(subscription: Subscription, render: Callable[[Change], Awaitable[str | None]],
                  disconnect_after: int, ping_s: float = 15.0) -> list[str]:
    """The frames of `event_stream` until the page has been asked `disconnect_after` times."""
    asked = 0

    async def is_disconnected() -> bool:
        nonlocal asked
        asked += 1
        return asked > disconnect_after

    return [f async for f in event_stream(subscription, render, is_disconnected, ping_s=ping_s)]


async def row(change: Change) -> str | None:
    return f'<tr class="interrupt" data-session="{change.session}">\n<td>x</td></tr>'


# ---- which feed entries make which changes


def test_raised_resumed_and_cancelled_are_changes_other_types_are_not() -> None:
    raised = change_of(entry("interrupt.raised", interrupt_id="i-1", reason="approve"))
    assert raised is not None and (raised.kind, raised.session, raised.interrupt_id) == (
        ChangeKind.RAISED, "s-1", "i-1")
    resumed = change_of(entry("interrupt.resumed", interrupt_id="i-1", timed_out=True))
    assert resumed is not None and resumed.kind is ChangeKind.GONE and resumed.timed_out
    assert resumed.type == "interrupt.resumed"
    cancelled = change_of(entry("interrupt.cancelled", interrupt_id="i-1", why="closed"))
    assert cancelled is not None and cancelled.kind is ChangeKind.GONE and not cancelled.timed_out
    assert change_of(entry("turn.completed")) is None


@pytest.mark.parametrize("event", [{}, {"interrupt_id": 7}, {"interrupt_id": ""}])
def test_an_interrupt_event_without_its_id_is_refused(event: dict[str, Any]) -> None:
    with pytest.raises(FeedEntryError, match="interrupt_id"):
        change_of(entry("interrupt.raised", **event))


def test_an_interrupt_event_without_a_session_is_refused() -> None:
    with pytest.raises(FeedEntryError, match="session"):
        change_of(entry("interrupt.resumed", session="", interrupt_id="i-1"))


# ---- a subscription's queue


def test_a_subscription_hands_out_changes_in_order() -> None:
    async def main() -> list[Change | None]:
        sub = Subscription(queue_size=3)
        for change in (RAISED, ANSWERED, TIMED_OUT):
            sub.offer(change)
        return [await sub.get(timeout=0.01) for _ in range(4)]

    assert asyncio.run(main()) == [RAISED, ANSWERED, TIMED_OUT, None]


def test_overflow_clears_the_queue_and_leaves_one_reset() -> None:
    async def main() -> tuple[list[Change | None], int]:
        sub = Subscription(queue_size=2)
        sub.offer(RAISED)
        sub.offer(ANSWERED)
        sub.offer(TIMED_OUT)  # one too many: what was queued is stale
        sub.offer(RAISED)  # before the reset is taken: the reload will show it anyway
        got = [await sub.get(timeout=0.01) for _ in range(2)]
        sub.offer(ANSWERED)  # after it: delivered again
        got.append(await sub.get(timeout=0.01))
        return got, sub.resets

    got, resets = asyncio.run(main())
    assert got == [RESET, None, ANSWERED]
    assert resets == 1


def test_a_waiting_get_wakes_on_a_change_and_on_close() -> None:
    async def main() -> tuple[Change | None, Change | None]:
        sub = Subscription()
        waiting = asyncio.create_task(sub.get())
        await asyncio.sleep(0.01)
        sub.offer(RAISED)
        first = await waiting
        waiting = asyncio.create_task(sub.get())
        await asyncio.sleep(0.01)
        sub.close()
        return first, await asyncio.wait_for(waiting, 1)

    assert asyncio.run(main()) == (RAISED, None)


def test_iteration_ends_when_closed_and_async_with_closes() -> None:
    async def main() -> tuple[list[Change], bool]:
        async with Subscription() as sub:
            sub.offer(RAISED)
            got = []
            async for change in sub:
                got.append(change)
                sub.close()
        return got, sub.closed

    assert asyncio.run(main()) == ([RAISED], True)


def test_a_queue_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="queue size"):
        Subscription(queue_size=0)


# ---- the hub's subscribers (no Redis is touched: a client connects on its first command)


def test_the_hub_counts_subscribers_and_publishes_to_each() -> None:
    async def main() -> None:
        hub = FeedHub([Redis()], Keys(), queue_size=1)
        one, two = hub.subscribe(), hub.subscribe()
        assert hub.subscribers == 2
        hub.publish(RAISED)
        hub.publish(ANSWERED)  # one too many for a queue of one
        assert await one.get(0.01) == RESET and await two.get(0.01) == RESET
        async with two:
            pass
        assert hub.subscribers == 1
        one.close()
        one.close()  # twice is harmless
        assert hub.subscribers == 0
        hub.publish(RAISED)
        assert await one.get(0.01) is None

    asyncio.run(main())


@pytest.mark.parametrize("kwargs, message", [
    ({"clients": []}, "at least one shard"),
    ({"queue_size": 0}, "queue size"),
    ({"block_ms": 0}, "block_ms"),
    ({"backoff_base_s": 0}, "backoff"),
    ({"backoff_base_s": 2, "backoff_cap_s": 1}, "backoff"),
])
def test_bad_hub_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"clients": [Redis()], "keys": Keys(), **kwargs}
    with pytest.raises(ValueError, match=message):
        FeedHub(**args)


def test_what_lost_feed_entries_look_like() -> None:
    lost = why_lost
    fine = {"last-generated-id": b"9-0", "max-deleted-entry-id": b"3-0", "recorded-first-entry-id": b"4-0"}
    assert lost("5-0", fine) is None
    assert lost("5-0", {**fine, "recorded-first-entry-id": b"5-0"}) is None
    assert "deleted" in (lost("5-0", {**fine, "max-deleted-entry-id": b"6-0"}) or "")
    assert "trimmed" in (lost("5-0", {**fine, "recorded-first-entry-id": b"7-0"}) or "")
    assert "lost its data" in (lost("5-0", {**fine, "last-generated-id": b"0-0"}) or "")
    assert lost("5-0", None) == "the feed is gone"
    assert lost("0-0", None) is None  # never written yet
    # read from the start of an empty feed: what was added since is all there, or some is not
    assert lost("0-0", {"last-generated-id": b"9-0", "entries-added": 2, "length": 2}) is None
    assert "empty" in (lost("5-0", {"last-generated-id": b"9-0", "length": 0}) or "")
    assert lost("9-0", {"last-generated-id": b"9-0", "length": 0}) is None
    assert "trimmed" in (lost("0-0", {"last-generated-id": b"9-0", "entries-added": 2, "length": 0}) or "")
    # Redis before 7 (no recorded-first-entry-id): the oldest entry left is past ours
    assert lost("5-0", {"last-generated-id": "9-0", "first-entry": ["7-0", {}]}) is not None
    assert lost("5-0", {"last-generated-id": "9-0", "first-entry": ["5-0", {}]}) is None
    assert lost("5-0", {"last-generated-id": "9-0", "first-entry": None}) is None


# ---- one page's event stream


def test_the_stream_opens_with_retry_and_hello_then_frames_each_change() -> None:
    async def main() -> list[str]:
        sub = Subscription()

        async def connected() -> bool:
            return False

        stream = event_stream(sub, row, connected)
        body = [await anext(stream)]
        sub.offer(RAISED)
        sub.offer(TIMED_OUT)
        body += [await anext(stream), await anext(stream)]
        sub.offer(RESET)  # a reset clears what is queued: offered once the rest is taken
        body.append(await anext(stream))
        await stream.aclose()
        return body

    body = asyncio.run(main())
    assert body[0].startswith("retry: 3000\n")
    events = frames("".join(body))
    assert [e.get("event") for e in events] == ["hello", "raised", "gone", "reset"]
    assert events[0]["retry"] == "3000"
    assert events[1]["data"] == {"session": "s-1", "interrupt_id": "i-1",
                                 "html": '<tr class="interrupt" data-session="s-1">\n<td>x</td></tr>'}
    assert events[2]["data"] == {"session": "s-2", "interrupt_id": "i-2", "timed_out": True,
                                 "type": "interrupt.resumed"}
    assert events[3]["data"] == {}
    # the row's newline stays inside the JSON: one data line per event
    assert all(len([line for line in f.split("\n") if line.startswith("data:")]) <= 1 for f in body)


def test_a_row_the_page_does_not_show_is_not_sent() -> None:
    async def hidden(change: Change) -> str | None:
        return None

    async def main() -> list[str]:
        sub = Subscription()
        sub.offer(RAISED)
        sub.offer(ANSWERED)
        return await collect(sub, hidden, disconnect_after=2)

    assert [e.get("event") for e in frames("".join(asyncio.run(main())))] == ["hello", "gone"]


def test_a_row_that_fails_to_render_resets_the_page() -> None:
    async def broken(change: Change) -> str | None:
        raise RuntimeError("template error")

    async def main() -> list[str]:
        sub = Subscription()
        sub.offer(RAISED)
        return await collect(sub, broken, disconnect_after=1)

    assert [e.get("event") for e in frames("".join(asyncio.run(main())))] == ["hello", "reset"]


def test_an_idle_stream_pings_and_stops_when_the_page_leaves() -> None:
    async def main() -> tuple[list[str], Subscription]:
        sub = Subscription()
        body = await collect(sub, row, disconnect_after=3, ping_s=0.02)
        return body, sub

    body, sub = asyncio.run(main())
    assert body[1:] == [": ping\n\n"] * (len(body) - 1) and len(body) >= 2
    assert sub.closed  # the hub forgets a page that left


def test_the_stream_ends_when_its_subscription_is_closed() -> None:
    async def main() -> list[str]:
        sub = Subscription()

        async def never() -> bool:
            return False

        async def close_soon() -> None:
            await asyncio.sleep(0.05)
            sub.close()

        closing = asyncio.create_task(close_soon())
        body = [f async for f in event_stream(sub, row, never, ping_s=10)]
        await closing
        return body

    assert [e.get("event") for e in frames("".join(asyncio.run(asyncio.wait_for(main(), 5))))] == ["hello"]


def test_leaving_the_stream_early_closes_the_subscription() -> None:
    async def main() -> Subscription:
        sub = Subscription()

        async def never() -> bool:
            return False

        stream = event_stream(sub, row, never)
        assert (await anext(stream)).startswith("retry:")
        await stream.aclose()  # the server stops sending: the client went away
        return sub

    assert asyncio.run(main()).closed


def test_ping_interval_must_be_positive() -> None:
    async def main() -> None:
        async def never() -> bool:
            return False

        async for _ in event_stream(Subscription(), row, never, ping_s=0):
            pass

    with pytest.raises(ValueError, match="ping_s"):
        asyncio.run(main())


# ---- replay: nothing lost between a page's render and its stream, nor across a reconnect


def at(change: Change, ms: int) -> Change:
    return Change(change.kind, change.session, change.interrupt_id, change.event, ms)


def started_hub(**kwargs: Any) -> FeedHub:
    """A hub as if it had read every shard's feed from feed time 1000 on."""
    hub = FeedHub([Redis()], Keys(), **kwargs)
    hub._shard_from_ms = [1000]
    return hub


async def drain(sub: Subscription) -> list[Change]:
    got = []
    while (change := await sub.get(timeout=0.01)) is not None:
        got.append(change)
    return got


def test_a_change_between_render_and_stream_is_replayed_to_the_page() -> None:
    async def main() -> None:
        hub = started_hub()
        hub.publish(at(RAISED, 4000))  # before the page (and its margin): not replayed
        hub.publish(at(ANSWERED, 9000))  # after the page rendered at 10000, minus the margin
        hub.publish(at(TIMED_OUT, 10500))  # after the render, before the stream opened
        assert await drain(hub.subscribe(10_000)) == [at(ANSWERED, 9000), at(TIMED_OUT, 10500)]
        # a reconnect reuses the URL: the same changes again (the page skips what it has)
        assert await drain(hub.subscribe(10_000)) == [at(ANSWERED, 9000), at(TIMED_OUT, 10500)]
        assert await drain(hub.subscribe()) == []  # without since: from now on

    asyncio.run(main())


def test_a_since_older_than_the_buffer_gets_reset_first() -> None:
    async def main() -> None:
        hub = started_hub(replay_size=2)
        assert await drain(hub.subscribe(2000)) == [RESET]  # before the hub started reading
        for ms in (5000, 6000, 7000):  # the first drops out: covered from 5001 on
            hub.publish(at(RAISED, ms))
        assert hub.covered_from_ms == 5001
        assert await drain(hub.subscribe(7000)) == [RESET]
        assert await drain(hub.subscribe(7001)) == [at(RAISED, 6000), at(RAISED, 7000)]

    asyncio.run(main())


def test_a_hub_not_reading_yet_or_that_lost_entries_covers_nothing_before() -> None:
    async def main() -> None:
        hub = FeedHub([Redis()], Keys())
        assert hub.covered_from_ms is None
        assert await drain(hub.subscribe(10**13)) == [RESET]
        hub._shard_from_ms = [1000]
        hub.publish(at(RAISED, 5000))
        hub.publish(RESET)  # the feed lost entries: nothing before now is sure
        covered = hub.covered_from_ms
        assert covered is not None and covered > 5000
        assert await drain(hub.subscribe(10_000)) == [RESET]

    asyncio.run(main())


def test_since_of_a_stream_url() -> None:
    assert since_of(None) is None and since_of("") is None
    assert since_of("1733000000000") == 1733000000000
    for bad in ("-1", "1.5", "abc", "١٢", "9" * 16):
        with pytest.raises(ValueError, match="since"):
            since_of(bad)


# ---- raised rows: looked up once per process, a slow one holds up the others by its own time


def test_the_feed_event_drops_rows_before_any_lookup() -> None:
    raised = Change(ChangeKind.RAISED, "team-a/1", "i-1", {"reason": "approval"})
    assert shown_by(InterruptFilter(), raised)
    assert shown_by(InterruptFilter(reason="approval", session_prefix="team-a/"), raised)
    assert not shown_by(InterruptFilter(reason="budget"), raised)
    assert not shown_by(InterruptFilter(session_prefix="team-b/"), raised)
    assert shown_by(InterruptFilter(reason="budget"), Change(ChangeKind.RAISED, "s", "i", {}))


def test_a_row_is_looked_up_once_for_every_page_and_gives_up_soon() -> None:
    reads: list[tuple[str, str]] = []

    async def never_there(session: str, interrupt_id: str) -> None:
        reads.append((session, interrupt_id))

    async def main() -> tuple[list[Any], float]:
        rows = RowCache()
        began = time.monotonic()
        got = await asyncio.gather(*(rows.get("s-1", "i-1", never_there) for _ in range(50)))
        return got, time.monotonic() - began

    got, took = asyncio.run(main())
    assert got == [None] * 50
    assert reads == [("s-1", "i-1")] * len(ROW_DELAYS_S)  # 4 reads, not 50 pages x 6
    assert took < 1.0


def test_a_page_cancelled_while_waiting_does_not_cancel_the_others_lookup() -> None:
    async def slow(session: str, interrupt_id: str) -> str:
        await asyncio.sleep(0.05)
        return "row"

    async def main() -> Any:
        rows = RowCache()
        first = asyncio.create_task(rows.get("s", "i", slow))
        await asyncio.sleep(0.01)
        first.cancel()
        return await rows.get("s", "i", slow)

    assert asyncio.run(main()) == "row"


def test_row_cache_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="delay"):
        RowCache(delays_s=())
    with pytest.raises(ValueError, match="keep_s"):
        RowCache(keep_s=0)


def test_slow_rows_are_rendered_side_by_side_and_sent_in_order() -> None:
    async def slow_row(change: Change) -> str | None:
        await asyncio.sleep(0.3)
        return change.interrupt_id

    async def main() -> tuple[list[str], float]:
        sub = Subscription()
        for n in range(10):
            sub.offer(Change(ChangeKind.RAISED, "s", f"i-{n}", {}))
            sub.offer(Change(ChangeKind.GONE, "s", f"i-{n}", {}))
        began = time.monotonic()
        body = await collect(sub, slow_row, disconnect_after=20)
        return body, time.monotonic() - began

    body, took = asyncio.run(main())
    events = frames("".join(body))
    expected = [e for n in range(10) for e in (("raised", f"i-{n}"), ("gone", f"i-{n}"))]
    assert [(e["event"], e["data"]["interrupt_id"]) for e in events[1:]] == expected
    assert took < 1.5  # one after the other would be 3 s


# ---- a stream ends once its person may no longer see it


def test_the_stream_ends_when_the_person_is_no_longer_allowed() -> None:
    async def main() -> tuple[list[str], int]:
        sub = Subscription()
        asked = 0

        async def connected() -> bool:
            return False

        async def allowed() -> bool:
            nonlocal asked
            asked += 1
            return asked < 3

        body = [f async for f in event_stream(sub, row, connected, ping_s=0.05, still_allowed=allowed)]
        assert sub.closed
        return body, asked

    body, asked = asyncio.run(asyncio.wait_for(main(), 5))
    assert asked == 3 and body[0].startswith("retry:")


def test_a_busy_stream_still_asks_whether_the_person_is_allowed() -> None:
    async def main() -> int:
        sub = Subscription()

        async def connected() -> bool:
            return False

        async def refused() -> bool:
            return False

        async def feed() -> None:
            while not sub.closed:  # a change every 10 ms: never idle long enough for a ping
                sub.offer(ANSWERED)
                await asyncio.sleep(0.01)

        feeding = asyncio.create_task(feed())
        body = [f async for f in event_stream(sub, row, connected, ping_s=0.1, still_allowed=refused)]
        await feeding
        return len(body)

    assert asyncio.run(asyncio.wait_for(main(), 5)) < 30
