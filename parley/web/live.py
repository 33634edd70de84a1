"""Live updates of the inbox: the feed of every shard, tailed once per process and fanned out
to each open page as server-sent events.

`FeedHub.run` reads `parley:feed` (docs/protocol.md, "Feed") on every shard from where it was
at start (XREAD BLOCK, no consumer group: each page process reads it all, acknowledges
nothing), and turns `interrupt.raised` into a `Change` of kind `raised` and
`interrupt.resumed` (answered here or elsewhere, or its deadline passed) and
`interrupt.cancelled` into `gone`. Every subscriber (an open page's event stream) gets every
change in a bounded queue; a subscriber too slow to keep up gets `reset` (the page reloads).

A shard that goes away is waited out with backoff, and read again from the last entry read, so
a page misses nothing of a short outage. When the feed itself lost entries the hub had not read
yet (trimmed past it while it was away, or the shard came back without its data), every
subscriber gets `reset` instead: the pages reload and show what is open now.
"""

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio import client as redis_client
from redis.exceptions import RedisError, ResponseError

from parley.logs import kv
from parley.notify import FeedEntry, FeedEntryError, parse_entry
from parley.retry import backoff
from parley.schemas.keys import Keys

log = logging.getLogger("parley.web.live")

RAISED_TYPE = "interrupt.raised"
GONE_TYPES = frozenset({"interrupt.resumed", "interrupt.cancelled"})
#: a stream id before every real one: where a feed that does not exist yet is read from
STREAM_START = "0-0"
#: how long a browser waits before it reconnects a dropped event stream (the `retry:` field)
RECONNECT_MS = 3000
#: what redis-py waits for a reply when the client does not say (None before redis-py 8)
DEFAULT_SOCKET_TIMEOUT: float | None = getattr(redis_client, "DEFAULT_SOCKET_TIMEOUT", None)
#: how long a stopping hub waits for its reads to give up before it closes their connections
STOP_GRACE_S = 0.2


class ChangeKind(StrEnum):
    RAISED = "raised"
    GONE = "gone"
    #: the subscriber missed changes: reload the page
    RESET = "reset"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    session: str = ""
    interrupt_id: str = ""
    #: the feed's event, whole (empty for RESET)
    event: dict[str, Any] | None = None

    @property
    def timed_out(self) -> bool:
        """A GONE change because the interrupt's deadline passed (not answered by anyone)."""
        return bool(self.event and self.event.get("timed_out") is True)

    @property
    def type(self) -> str:
        """The feed event's type (`interrupt.resumed`, ...); empty for RESET."""
        return str(self.event.get("type", "")) if self.event else ""


RESET = Change(ChangeKind.RESET)


def change_of(entry: FeedEntry) -> Change | None:
    """The change a feed entry makes to the inbox: None for the types it does not follow
    (`turn.completed`); FeedEntryError for an interrupt event without an interrupt id."""
    if entry.type == RAISED_TYPE:
        kind = ChangeKind.RAISED
    elif entry.type in GONE_TYPES:
        kind = ChangeKind.GONE
    else:
        return None
    interrupt_id = entry.event.get("interrupt_id")
    if not isinstance(interrupt_id, str) or not interrupt_id:
        raise FeedEntryError(f"feed entry {entry.entry_id} ({entry.type}): no interrupt_id")
    if not entry.session:
        raise FeedEntryError(f"feed entry {entry.entry_id} ({entry.type}): no session")
    return Change(kind, entry.session, interrupt_id, entry.event)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def stream_id(value: Any) -> tuple[int, int]:
    """A stream entry id (`<ms>-<seq>`) as a pair that compares in the stream's order."""
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)


class Subscription:
    """An async iterator of changes; `close()` (or leaving `async with`) unsubscribes.

    Its queue holds at most `queue_size` changes. One more clears it and leaves a single RESET
    (what was queued is stale: the page reloads); changes that come before the subscriber has
    taken that RESET are dropped too, as the reload shows them anyway."""

    def __init__(self, queue_size: int = 1000, on_close: Callable[["Subscription"], None] | None = None):
        if queue_size < 1:
            raise ValueError(f"a subscription's queue size must be at least 1, not {queue_size}")
        self.queue_size = queue_size
        self._queue: deque[Change] = deque()
        self._ready = asyncio.Event()
        self._reset_pending = False
        self._closed = False
        self._on_close = on_close
        #: how many times this subscriber fell behind
        self.resets = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, change: Change) -> None:
        """Queue `change` for this subscriber (never blocks the hub)."""
        if self._closed or self._reset_pending:
            return
        if change.kind is ChangeKind.RESET or len(self._queue) >= self.queue_size:
            self._queue.clear()
            self._queue.append(RESET)
            self._reset_pending = True
            self.resets += 1
        else:
            self._queue.append(change)
        self._ready.set()

    async def get(self, timeout: float | None = None) -> Change | None:
        """The next change; None when `timeout` seconds passed without one or once closed."""
        while not self._queue:
            if self._closed:
                return None
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        if self._closed:
            return None
        change = self._queue.popleft()
        if change.kind is ChangeKind.RESET:
            self._reset_pending = False
        return change

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._ready.set()  # wakes a `get` waiting for a change: it returns None
        if self._on_close is not None:
            self._on_close(self)

    def __aiter__(self) -> AsyncIterator[Change]:
        return self

    async def __anext__(self) -> Change:
        change = await self.get()
        if change is None:
            raise StopAsyncIteration
        return change

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()


class FeedHub:
    """One per page process: tails the feed of every shard (`run`), hands each change to every
    subscriber. A read blocks `block_ms` at most, and less on a client whose socket timeout
    is shorter (see `block_within`)."""

    def __init__(self, clients: Sequence[Redis], keys: Keys, queue_size: int = 1000,
                 block_ms: int = 5000, count: int = 500, backoff_base_s: float = 0.25,
                 backoff_cap_s: float = 5.0):
        if not clients:
            raise ValueError("a feed hub needs the client of at least one shard")
        if queue_size < 1:
            raise ValueError(f"the queue size must be at least 1, not {queue_size}")
        if block_ms < 1 or count < 1:
            raise ValueError(f"block_ms and count must be at least 1, not {block_ms} and {count}")
        if backoff_base_s <= 0 or backoff_cap_s < backoff_base_s:
            raise ValueError("the backoff needs 0 < base <= cap, "
                             f"not base {backoff_base_s} and cap {backoff_cap_s}")
        self.clients = list(clients)
        self.keys = keys
        self.queue_size = queue_size
        self.block_ms = block_ms
        self.count = count
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        #: per shard, the id of the last feed entry read (None: the start is not known yet)
        self.positions: list[str | None] = [None] * len(self.clients)
        #: per shard, whether it answered the last read (False while it is away)
        self.connected: list[bool] = [False] * len(self.clients)
        self._subscribers: set[Subscription] = set()

    @property
    def subscribers(self) -> int:
        """How many event streams are open (the gauge `parley_inbox_live_pages`)."""
        return len(self._subscribers)

    def subscribe(self) -> Subscription:
        subscription = Subscription(self.queue_size, on_close=self._subscribers.discard)
        self._subscribers.add(subscription)
        return subscription

    def publish(self, change: Change) -> None:
        for subscription in list(self._subscribers):
            subscription.offer(change)

    async def run(self) -> None:
        """Tail every shard's feed until cancelled, through Redis outages (backoff)."""
        # one connection of each shard's pool is the hub's own for the whole run: a stop can cut
        # it (below) without touching what the pages' requests use
        readers = [client.client() for client in self.clients]
        tasks = [asyncio.create_task(self._tail(shard, reader), name=f"parley-inbox-feed-{shard}")
                 for shard, reader in enumerate(readers)]
        try:
            # a tail only returns by raising (a bug): it is not hidden behind the other shards
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            _, stuck = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
            if stuck:
                # redis-py does not always give up a blocked read when its task is cancelled
                # (it waits for the reply): closing the connection under it ends the read now
                for reader in readers:
                    if reader.connection is not None:
                        await reader.connection.disconnect(nowait=True)
                await asyncio.wait(stuck)
            for reader in readers:
                await reader.aclose()

    async def _tail(self, shard: int, client: Redis) -> None:
        outages = 0
        while True:
            try:
                await self._resync(shard, client)
                self.connected[shard] = True
                if outages:
                    log.info("feed readable again", extra=kv(shard=shard, position=self.positions[shard]))
                outages = 0
                while True:
                    await self._read(shard, client)
            except RedisError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # a read cut off because the hub is being stopped, not an outage
                    raise asyncio.CancelledError from exc
                self.connected[shard] = False
                delay = backoff(outages, base=self.backoff_base_s, cap=self.backoff_cap_s)
                outages += 1
                log.warning("feed unreadable", extra=kv(shard=shard, error=repr(exc), backoff_s=delay))
                await asyncio.sleep(delay)

    async def _resync(self, shard: int, client: Redis) -> None:
        """Where to read from: at the first start the feed's last entry (`$` resolved once, so
        a reconnect goes on from there); after an outage, the last entry read, unless the feed
        lost entries meanwhile (then every page is reset)."""
        position = self.positions[shard]
        if position is None:
            last: Any = await client.xrevrange(self.keys.feed, count=1)
            self.positions[shard] = _text(last[0][0]) if last else STREAM_START
            return
        try:
            info: Any = await client.xinfo_stream(self.keys.feed)
        except ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            info = None
        lost = self._lost(position, info)
        if lost:
            log.warning("feed entries lost while away: pages reset",
                        extra=kv(shard=shard, position=position, why=lost))
            self.publish(RESET)
            generated = STREAM_START if info is None else info.get("last-generated-id", STREAM_START)
            if stream_id(generated) < stream_id(position):
                # a feed that went back (a new one, or a replica promoted before it had all of
                # it): go on from its end; what it held before is in the reloaded pages
                self.positions[shard] = _text(generated)

    @staticmethod
    def _lost(position: str, info: dict[Any, Any] | None) -> str | None:
        """Why entries after `position` may be gone from the feed (None: nothing lost)."""
        at = stream_id(position)
        if info is None:
            return "the feed is gone" if at > (0, 0) else None
        info = {_text(k): v for k, v in info.items()}
        if stream_id(info.get("last-generated-id", STREAM_START)) < at:
            return "the feed is younger than the last entry read (the shard lost its data)"
        if stream_id(info.get("max-deleted-entry-id", STREAM_START)) > at:
            return "entries not yet read were deleted"
        # Trimming moves the feed's first entry on (Redis 7 records it; before, the oldest entry
        # left tells). Past ours, entries after ours may be gone too: unless the hub was exactly
        # at the trimmed end, it fell a whole feed (about 100,000 entries) behind, so a reset is
        # what the pages need either way.
        first = info.get("recorded-first-entry-id")
        if first is None and info.get("first-entry"):
            first = info["first-entry"][0]
        if first is not None and at > (0, 0) and stream_id(first) > at:
            return "entries not yet read may have been trimmed"
        return None

    async def _read(self, shard: int, client: Redis) -> None:
        position = self.positions[shard]
        assert position is not None  # set by _resync
        reply: Any = await client.xread({self.keys.feed: position}, count=self.count,
                                        block=block_within(self.block_ms, client))
        for entry_id, fields in _entries(reply):
            self.positions[shard] = _text(entry_id)
            if not fields:
                continue
            try:
                change = change_of(parse_entry(entry_id, fields))
            except FeedEntryError as exc:
                log.warning("feed entry skipped", extra=kv(shard=shard, error=str(exc)))
                continue
            if change is not None:
                self.publish(change)


def block_within(block_ms: int, client: Redis) -> int:
    """How long a read may block on `client`: `block_ms`, but well within the client's socket
    timeout (redis-py 8 defaults to 5 s: 4 s then), which would otherwise cut an idle read off
    as an outage."""
    connection = getattr(client, "connection", None)  # a single-connection client's, once used
    if connection is not None:
        timeout_s = connection.socket_timeout
    else:
        timeout_s = client.connection_pool.connection_kwargs.get("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    if not timeout_s:
        return block_ms
    # Redis answers a timed-out block on its next cron tick (up to 100 ms late at hz 10), and a
    # busy machine adds to that: half the timeout is left over, up to a second.
    timeout_ms = int(timeout_s * 1000)
    return max(1, min(block_ms, timeout_ms - min(1000, timeout_ms // 2)))


def _entries(reply: Any) -> list[tuple[Any, Any]]:
    """The entries of an XREAD reply (RESP2: `[[stream, entries]]`; RESP3, depending on
    redis-py's version: `{stream: entries}` or `{stream: [entries]}`)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    found: list[tuple[Any, Any]] = []
    for _stream, entries in pairs:
        if entries and entries[0] and not isinstance(entries[0][0], bytes | str):
            entries = entries[0]  # wrapped once more
        found.extend(entries)
    return found


def frame(event: str, data: dict[str, Any]) -> str:
    """One server-sent event (JSON keeps the data on one line: a newline would end it)."""
    return f"event: {event}\ndata: {orjson.dumps(data).decode()}\n\n"


HELLO = f"retry: {RECONNECT_MS}\nevent: hello\ndata: {{}}\n\n"
PING = ": ping\n\n"


async def event_stream(subscription: Subscription, render: Callable[[Change], Awaitable[str | None]],
                       is_disconnected: Callable[[], Awaitable[bool]],
                       ping_s: float = 15.0) -> AsyncGenerator[str, None]:
    """The text/event-stream body for one page: `event: raised` with the row's HTML (`render`
    returns None for a row the page's filters do not show: nothing is sent), `event: gone` with
    `{session, interrupt_id, timed_out, type}`, `event: reset`; a comment every `ping_s` without
    anything else sent. Ends when `is_disconnected()` (asked at least every `ping_s`) or the
    subscription is closed, and closes the subscription."""
    if ping_s <= 0:
        raise ValueError(f"ping_s must be positive, not {ping_s}")
    try:
        yield HELLO
        sent_at = time.monotonic()
        while not subscription.closed and not await is_disconnected():
            change = await subscription.get(timeout=max(0.0, sent_at + ping_s - time.monotonic()))
            if change is None:
                if time.monotonic() - sent_at >= ping_s and not subscription.closed:
                    yield PING
                    sent_at = time.monotonic()
                continue
            text = await _frame_of(change, render)
            if text is not None:
                yield text
                sent_at = time.monotonic()
    finally:
        subscription.close()


async def _frame_of(change: Change, render: Callable[[Change], Awaitable[str | None]]) -> str | None:
    if change.kind is ChangeKind.RAISED:
        try:
            html = await render(change)
        except Exception:
            # the page would miss this row: it reloads instead, and the error is in the log
            log.exception("row not rendered: page reset", extra=kv(session=change.session,
                                                                    interrupt=change.interrupt_id))
            return frame("reset", {})
        if html is None:
            return None
        return frame("raised", {"session": change.session, "interrupt_id": change.interrupt_id,
                                "html": html})
    if change.kind is ChangeKind.GONE:
        return frame("gone", {"session": change.session, "interrupt_id": change.interrupt_id,
                              "timed_out": change.timed_out, "type": change.type})
    return frame("reset", {})
