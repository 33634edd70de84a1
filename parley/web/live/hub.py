"""The feed hub, one per page process: a reader task per shard tails its feed (XREAD BLOCK from
where it was at start; no consumer group: each page process reads it all, acknowledges
nothing), through outages (backoff, then on from the last entry read, or a RESET to every page
when the feed lost entries meanwhile); each change goes to every subscriber and into the replay
buffer a page subscribing `since` its render time is served from first."""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from parley.client.feed import FeedEntryError, parse_entry
from parley.client.follow import socket_timeout_of, within_socket_timeout
from parley.runtime.logs import kv
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys
from parley.web.live.changes import RESET, Change, ChangeKind, change_of
from parley.web.live.replies import STREAM_START, entries_of, stream_id, text_of, why_lost
from parley.web.live.rows import RowCache
from parley.web.live.subscription import Subscription

log = logging.getLogger("parley.web.live")

#: what redis-py waits for a reply when the client does not say (None before redis-py 8)
#: how long a stopping hub waits for its reads to give up before it closes their connections
STOP_GRACE_S = 0.2
#: how far before a page's `since` the replay starts: the page's clock and the feed's (Redis')
#: may differ, and a raise's row is indexed by the outbox flush a moment after its feed entry
CLOCK_MARGIN_MS = 2000


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
                delay = backoff(outages, base=self.backoff_base_s, cap=self.backoff_cap_s, jitter=True)
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
            self.positions[shard] = text_of(last[0][0]) if last else STREAM_START
            # every entry after the last one is read: every time after its ms
            self._shard_from_ms[shard] = stream_id(self.positions[shard])[0] + 1
            return
        try:
            info: Any = await client.xinfo_stream(self.keys.feed)
        except ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            info = None
        lost = why_lost(position, info)
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
                self.positions[shard] = text_of(generated)

    async def _read(self, shard: int, client: Redis) -> None:
        position = self.positions[shard]
        assert position is not None  # set by _resync
        reply: Any = await client.xread({self.keys.feed: position}, count=self.count,
                                        block=block_within(self.block_ms, client))
        for entry_id, fields in entries_of(reply):
            self.positions[shard] = text_of(entry_id)
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
    timeout (redis-py defaults to 5 s: 4 s then), which would otherwise cut an idle read off
    as an outage."""
    return within_socket_timeout(block_ms, socket_timeout_of(client))
