"""The inbox's live updates without Redis: a subscription's bounded queue, the feed entries the
hub follows, and the server-sent events of one page (parley/web/live.py)."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from parley.notify import FeedEntry, FeedEntryError
from parley.schemas.keys import Keys
from parley.web.live import (
    RESET,
    Change,
    ChangeKind,
    FeedHub,
    Subscription,
    change_of,
    event_stream,
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
    lost = FeedHub._lost
    fine = {"last-generated-id": b"9-0", "max-deleted-entry-id": b"3-0", "recorded-first-entry-id": b"4-0"}
    assert lost("5-0", fine) is None
    assert lost("5-0", {**fine, "recorded-first-entry-id": b"5-0"}) is None
    assert "deleted" in (lost("5-0", {**fine, "max-deleted-entry-id": b"6-0"}) or "")
    assert "trimmed" in (lost("5-0", {**fine, "recorded-first-entry-id": b"7-0"}) or "")
    assert "lost its data" in (lost("5-0", {**fine, "last-generated-id": b"0-0"}) or "")
    assert lost("5-0", None) == "the feed is gone"
    assert lost("0-0", None) is None  # never written yet
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
