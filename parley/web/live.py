"""Live updates of the inbox: the feed of every shard, tailed once per process and fanned out
to each open page as server-sent events.

`FeedHub.run` reads `parley:feed` (docs/protocol.md, "Feed") on every shard from where it was
at start (XREAD BLOCK, no consumer group: each page process reads it all, acknowledges
nothing), and turns `interrupt.raised` into a `Change` of kind `raised` and
`interrupt.resumed` (answered here or elsewhere, or its deadline passed) and
`interrupt.cancelled` into `gone`. Every subscriber (an open page's event stream) gets every
change in a bounded queue; a subscriber too slow to keep up gets `reset` (the page reloads).

Nothing is lost between a page's render and its stream, nor across a reconnect: the hub keeps
the last `replay_size` changes with their feed entry's time, and knows from when it holds every
change (`covered_from_ms`: just after the feed's last entry when it started, later when the feed
lost entries or the buffer dropped its oldest). A page subscribes with `since` (the server's ms
when it rendered; a browser that reconnects reuses its URL, so the same `since`): it gets the
buffered changes from `since - CLOCK_MARGIN_MS` on, then the live ones; when the buffer does not
reach back that far, a RESET first (the page reloads and renders anew). Replayed duplicates are
harmless: a row already shown is skipped, a gone row not shown is a no-op.

A raised row is looked up once per process (`RowCache`, in-flight lookups shared by every page)
for at most `ROW_DELAYS_S` (the index follows the feed entry by the outbox flush), and a page's
stream starts the lookups of all its queued changes at once, so one row not found holds later
changes up by that bound at most, and each interrupt's changes still go out in order.

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
from redis.exceptions import RedisError, ResponseError

from parley.client.feed import FeedEntry, FeedEntryError, parse_entry
from parley.client.follow import socket_timeout_of, within_socket_timeout
from parley.client.inbox import InterruptFilter
from parley.runtime.logs import kv
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys

log = logging.getLogger("parley.web.live")

RAISED_TYPE = "interrupt.raised"
GONE_TYPES = frozenset({"interrupt.resumed", "interrupt.cancelled"})
#: a stream id before every real one: where a feed that does not exist yet is read from
STREAM_START = "0-0"
#: how long a browser waits before it reconnects a dropped event stream (the `retry:` field)
RECONNECT_MS = 3000
#: what redis-py waits for a reply when the client does not say (None before redis-py 8)
#: how long a stopping hub waits for its reads to give up before it closes their connections
STOP_GRACE_S = 0.2
#: how far before a page's `since` the replay starts: the page's clock and the feed's (Redis')
#: may differ, and a raise's row is indexed by the outbox flush a moment after its feed entry
CLOCK_MARGIN_MS = 2000
#: the waits before each look-up of a raised interrupt's row (0.35 s in all: the outbox flush
#: writes it right after the feed entry)
ROW_DELAYS_S = (0.0, 0.05, 0.1, 0.2)
#: how long a looked-up row is kept for the pages that take the same change a little later
ROW_KEEP_S = 10.0
#: at most this many changes of one page are being rendered ahead of the one it sends
RENDER_AHEAD = 64


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
    #: the feed entry's time (the ms of its id; 0 for RESET)
    at_ms: int = 0

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
    try:
        at_ms = stream_id(entry.entry_id)[0]
    except ValueError:
        raise FeedEntryError(f"feed entry {entry.entry_id!r} ({entry.type}): not a stream id") from None
    return Change(kind, entry.session, interrupt_id, entry.event, at_ms)


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
                 backoff_cap_s: float = 5.0, replay_size: int = 10_000):
        if not clients:
            raise ValueError("a feed hub needs the client of at least one shard")
        if queue_size < 1:
            raise ValueError(f"the queue size must be at least 1, not {queue_size}")
        if block_ms < 1 or count < 1:
            raise ValueError(f"block_ms and count must be at least 1, not {block_ms} and {count}")
        if replay_size < 1:
            raise ValueError(f"the replay size must be at least 1, not {replay_size}")
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
        #: the last changes, oldest first, for pages that subscribe `since` a moment ago
        self._history: deque[Change] = deque(maxlen=replay_size)
        #: per shard, the first feed time from which it has read every entry (None: not yet)
        self._shard_from_ms: list[int | None] = [None] * len(self.clients)
        #: the first feed time from which the buffer holds every change (dropped, lost)
        self._buffer_from_ms = 0
        #: each raised row looked up once for every page of this process
        self.rows = RowCache()

    @property
    def covered_from_ms(self) -> int | None:
        """The first feed time (ms) from which the hub holds every change; None while a shard
        has not been read yet."""
        if any(at is None for at in self._shard_from_ms):
            return None
        return max([self._buffer_from_ms, *(at for at in self._shard_from_ms if at is not None)])

    def covers(self, since_ms: int) -> bool:
        """Whether every change a page rendered at `since_ms` (its server's clock) may have
        missed is still in the buffer."""
        covered = self.covered_from_ms
        return covered is not None and since_ms - CLOCK_MARGIN_MS >= covered

    def _not_covered_before(self, at_ms: int) -> None:
        """Changes before `at_ms` may be missing from the buffer (dropped, or lost by the feed)."""
        self._buffer_from_ms = max(self._buffer_from_ms, at_ms)

    @property
    def subscribers(self) -> int:
        """How many event streams are open (the gauge `parley_inbox_live_pages`)."""
        return len(self._subscribers)

    def subscribe(self, since_ms: int | None = None) -> Subscription:
        """A subscription to the changes from now on; with `since_ms` (a page's render time,
        Unix ms) the buffered changes from `since_ms - CLOCK_MARGIN_MS` on first, or RESET
        first when the buffer does not reach back that far."""
        subscription = Subscription(self.queue_size, on_close=self._subscribers.discard)
        if since_ms is not None:
            if not self.covers(since_ms):
                subscription.offer(RESET)
            else:
                start = since_ms - CLOCK_MARGIN_MS
                for change in self._history:
                    if change.at_ms >= start:
                        subscription.offer(change)
        self._subscribers.add(subscription)
        return subscription

    def publish(self, change: Change) -> None:
        if change.kind is ChangeKind.RESET:
            # whatever came before now may be missing: a page from before then reloads
            self._not_covered_before(int(time.time() * 1000) + 1)
        else:
            if len(self._history) == self._history.maxlen:
                # entries of the same ms as the dropped one may be dropped next: not covered
                self._not_covered_before(self._history[0].at_ms + 1)
            self._history.append(change)
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
            # every entry after the last one is read: every time after its ms
            self._shard_from_ms[shard] = stream_id(self.positions[shard])[0] + 1
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
            generated = STREAM_START if info is None else info.get("last-generated-id", STREAM_START)
            # what was lost is at most the feed's last entry: the buffer does not cover it (the
            # RESET marks it up to now as well, by this process' clock)
            self._not_covered_before(stream_id(generated)[0] + 1)
            self.publish(RESET)
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
        if int(info.get("length", 1)) == 0 and stream_id(info.get("last-generated-id", STREAM_START)) > at:
            return "entries not yet read were trimmed (the feed is empty)"
        added = info.get("entries-added")  # Redis 7
        if at == (0, 0) and added is not None and int(added) > int(info.get("length", 0)):
            # read from the start (the feed was empty), and some of what was added is not there
            return "entries not yet read were trimmed"
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


class RowCache:
    """Each raised interrupt's row looked up once per process: the lookups in flight (and done
    within `keep_s`) by (session, interrupt_id), shared by every page that asks. A lookup asks
    after each of `delays_s` until the row is there (None: never there, or gone already)."""

    def __init__(self, delays_s: Sequence[float] = ROW_DELAYS_S, keep_s: float = ROW_KEEP_S):
        if not delays_s or any(d < 0 for d in delays_s):
            raise ValueError(f"a row lookup needs at least one delay, none negative, not {list(delays_s)}")
        if keep_s <= 0:
            raise ValueError(f"keep_s must be positive, not {keep_s}")
        self.delays_s = tuple(delays_s)
        self.keep_s = keep_s
        self._lookups: dict[tuple[str, str], tuple[float, asyncio.Task[Any]]] = {}
        #: how many lookups were started (each asks Redis up to len(delays_s) times)
        self.started = 0

    async def get(self, session: str, interrupt_id: str,
                  read: Callable[[str, str], Awaitable[Any]]) -> Any:
        """The row of (session, interrupt_id) by `read(session, interrupt_id)` (None when not
        there), sharing a lookup already made or in flight. A caller cancelled while waiting
        does not cancel the lookup of the others."""
        now = time.monotonic()
        self._forget(now)
        key = (session, interrupt_id)
        found = self._lookups.get(key)
        if found is None:
            task = asyncio.create_task(self._look_up(session, interrupt_id, read),
                                       name=f"parley-inbox-row-{interrupt_id}")
            found = (now, task)
            self._lookups[key] = found
            self.started += 1
        return await asyncio.shield(found[1])

    async def _look_up(self, session: str, interrupt_id: str,
                       read: Callable[[str, str], Awaitable[Any]]) -> Any:
        for delay in self.delays_s:
            await asyncio.sleep(delay)
            row = await read(session, interrupt_id)
            if row is not None:
                return row
        return None

    def _forget(self, now: float) -> None:
        old = [key for key, (started, task) in self._lookups.items()
               if task.done() and now - started > self.keep_s]
        for key in old:
            _, task = self._lookups.pop(key)
            if not task.cancelled():
                task.exception()  # taken: a failed lookup is not reported as never retrieved


def shown_by(where: InterruptFilter, change: Change) -> bool:
    """Whether a page's filters may show a raised row, by what the feed's event tells (reason,
    session): False spares the lookup of a row the page drops anyway."""
    if where.session_prefix is not None and not change.session.startswith(where.session_prefix):
        return False
    reason = change.event.get("reason") if change.event else None
    return where.reason is None or not isinstance(reason, str) or reason == where.reason


def since_of(value: str | None) -> int | None:
    """The `since` of an event stream's URL (the page's render time, Unix ms): None when not
    given; ValueError when not a whole number of ms."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 15:
        raise ValueError(f"since must be a time in Unix ms, not {value[:40]!r}")
    return int(value)


def block_within(block_ms: int, client: Redis) -> int:
    """How long a read may block on `client`: `block_ms`, but well within the client's socket
    timeout (redis-py defaults to 5 s: 4 s then), which would otherwise cut an idle read off
    as an outage."""
    return within_socket_timeout(block_ms, socket_timeout_of(client))


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
                       ping_s: float = 15.0,
                       still_allowed: Callable[[], Awaitable[bool]] | None = None,
                       ) -> AsyncGenerator[str, None]:
    """The text/event-stream body for one page: `event: raised` with the row's HTML (`render`
    returns None for a row the page's filters do not show: nothing is sent), `event: gone` with
    `{session, interrupt_id, timed_out, type}`, `event: reset`; a comment every `ping_s` without
    anything else sent. Ends when `is_disconnected()` (asked at least every `ping_s`), when
    `still_allowed()` says False (asked at least every `ping_s`: the person signed out or was
    removed), or when the subscription is closed; closes the subscription.

    The changes queued are rendered at once, side by side (up to RENDER_AHEAD), and sent in
    their order: a slow row holds the ones after it up by its own time only."""
    if ping_s <= 0:
        raise ValueError(f"ping_s must be positive, not {ping_s}")
    pending: deque[asyncio.Task[str | None]] = deque()
    try:
        yield HELLO
        sent_at = checked_at = time.monotonic()
        while not subscription.closed and not await is_disconnected():
            if still_allowed is not None and time.monotonic() - checked_at >= ping_s:
                if not await still_allowed():
                    return
                checked_at = time.monotonic()
            if not pending:
                due = min(sent_at, checked_at if still_allowed is not None else sent_at) + ping_s
                change = await subscription.get(timeout=max(0.0, due - time.monotonic()))
                if change is None:
                    if time.monotonic() - sent_at >= ping_s and not subscription.closed:
                        yield PING
                        sent_at = time.monotonic()
                    continue
                pending.append(asyncio.create_task(_frame_of(change, render)))
            # everything queued now starts rendering, so its lookups run side by side
            while len(pending) < RENDER_AHEAD:
                change = await subscription.get(timeout=0)
                if change is None:
                    break
                pending.append(asyncio.create_task(_frame_of(change, render)))
            text = await pending.popleft()
            if text is not None:
                yield text
                sent_at = time.monotonic()
    finally:
        for task in pending:
            task.cancel()
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
