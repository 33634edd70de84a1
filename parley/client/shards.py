"""The shards of a deployment: connections to each, and the placement they hold.

The I/O shell over schemas/shards.py. A deployment names its Redis primaries in order; each
URL is a plain Redis (`redis://`, `rediss://`, `unix://`) or a Sentinel-managed primary:

    redis+sentinel://[user:password@]host:port[,host:port...]/<service name>[/<db>]

(the user and password are the primary's; the sentinels are asked without, so sentinels that
require a password are not supported; a query string is ignored). A Sentinel URL
gives a client that asks the sentinels where the primary is, and asks again after a failover,
so processes follow a promoted replica by themselves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.sentinel import Sentinel

from parley.runtime.logins import may_ask_info
from parley.runtime.redis_errors import is_cluster_node
from parley.schemas.keys import Keys
from parley.schemas.moves import INDEXED_FIELD
from parley.schemas.shards import (
    PLACEMENT_FIELD,
    SHARD_FIELD,
    Placement,
    PlacementError,
    ShardView,
    agreed_placement,
    initial_placement,
    majority,
    newest_placement_of,
)

SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A `redis+sentinel://` URL, read."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelAddress:
    """Read a `redis+sentinel://` URL; ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, _, pw = creds.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    sentinels: list[tuple[str, int]] = []
    for hostport in netloc.split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{url!r}: each sentinel is host:port, got {hostport!r}")
        sentinels.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"{url!r}: the path is /<service name>[/<db>], e.g. /mymaster/0")
    return SentinelAddress(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0,
                           username, password)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client of one shard: `redis.Redis.from_url` for a plain URL; for a Sentinel URL, the
    primary of its service (`Sentinel.master_for`), found again after a failover."""
    if not url.startswith(SENTINEL_SCHEME + "://"):
        return redis.Redis.from_url(url, **kwargs)
    address = parse_sentinel_url(url)
    timeouts = {k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = Sentinel(list(address.sentinels), sentinel_kwargs=timeouts or {"socket_timeout": 1.0})
    return sentinel.master_for(address.service, db=address.db, username=address.username,
                               password=address.password, **kwargs)


class ClusterNotSupported(Exception):
    """The URL names a Redis Cluster node (docs/operations.md, "Redis Cluster")."""

    def __init__(self, url: str):
        super().__init__(url)
        self.url = url


#: the URLs `connect_checked` has asked `INFO cluster` already, in this process
_checked: set[str] = set()


def connect_checked(url: str, **kwargs: Any) -> redis.Redis:
    """`connect`, and the first time this process connects to `url`, one `INFO cluster`:
    ClusterNotSupported for a Redis Cluster node, before anything is read or written there (a
    node holding every slot would serve single keys and fail only later, CROSSSLOT). What
    `parley` commands connect with. A login that may not run INFO (a producer's, a reader's:
    parley/runtime/logins.py), or a Redis not up yet, is not asked: the command then meets the node's
    MOVED, CLUSTERDOWN or CROSSSLOT replies, which the CLI turns into the same line
    (parley/runtime/redis_errors.py)."""
    client = connect(url, **kwargs)
    if url in _checked or not may_ask_info(client.connection_pool.connection_kwargs.get("username")):
        return client
    try:
        info: Any = client.info("cluster")
    except redis.RedisError:  # NOPERM, a renamed INFO, or not reachable yet: not known
        return client
    _checked.add(url)
    if is_cluster_node(info):
        client.close()
        raise ClusterNotSupported(url)
    return client


def connect_async(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """`connect` for `redis.asyncio` (the inbox page's clients): the same URLs, the same
    Sentinel behaviour."""
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    if not url.startswith(SENTINEL_SCHEME + "://"):
        client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(url, **kwargs)
        return client
    address = parse_sentinel_url(url)
    timeouts = {k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = AsyncSentinel(list(address.sentinels), sentinel_kwargs=timeouts or {"socket_timeout": 1.0})
    primary: redis.asyncio.Redis = sentinel.master_for(
        address.service, db=address.db, username=address.username, password=address.password, **kwargs)
    return primary

#: the `<prefix>:config` fields a `ShardView` is read from, in `view_of`'s order
VIEW_FIELDS = [PLACEMENT_FIELD, SHARD_FIELD, "partitions"]


def answered_views(replies: Sequence[Any]) -> list[ShardView]:
    """The views of the shards whose HMGET of `VIEW_FIELDS` answered (`replies[i]`: shard i's, or
    the ConnectionError / TimeoutError it met). With fewer than a majority answering, that is an
    outage: the first error is raised, as a caller of one shard would meet it, and retried so."""
    views = [view_of(i, raw) for i, raw in enumerate(replies) if not isinstance(raw, Exception)]
    errors = [raw for raw in replies if isinstance(raw, Exception)]
    if errors and len(views) < majority(len(replies)):
        raise errors[0]
    return views


def read_view(r: redis.Redis, keys: Keys, index: int) -> ShardView:
    return view_of(index, r.hmget(keys.config, VIEW_FIELDS))


def view_of(index: int, raw: Sequence[Any]) -> ShardView:
    """The view of shard `index` from its HMGET of `VIEW_FIELDS` (the sync and async clients')."""
    placement_raw, shard_raw, partitions_raw = raw
    partitions = int(partitions_raw) if partitions_raw else None
    return ShardView(index=index,
                     placement=Placement.from_json(placement_raw) if placement_raw else None,
                     shard=int(shard_raw) if shard_raw else None,
                     partitions=partitions, has_data=partitions is not None)


def write_placement(r: redis.Redis, keys: Keys, shard: int, placement: Placement) -> None:
    """The placement's fields in one shard's config (one HSET: readers see all or none)."""
    fields: dict[Any, Any] = placement.config_fields(shard)
    r.hset(keys.config, mapping=fields)


class Shards:
    """One client per shard, in the deployment's order, and the placement they agree on.

    With one URL there is no placement: everything is on that Redis (the deployment of one
    Redis, as before shards). `placement` is read at `check()` and again by `refresh()`."""

    def __init__(self, clients: Sequence[redis.Redis], keys: Keys):
        if not clients:
            raise ValueError("a deployment needs at least one Redis URL")
        self.clients = list(clients)
        self.keys = keys
        self.placement: Placement | None = None
        #: the shards that did not answer the last read of the views (`views(answering=True)`)
        self.down: list[int] = []

    @classmethod
    def from_urls(cls, urls: Sequence[str], keys: Keys, **kwargs: Any) -> Shards:
        return cls([connect(u, **kwargs) for u in urls], keys)

    def __len__(self) -> int:
        return len(self.clients)

    @property
    def sharded(self) -> bool:
        return len(self.clients) > 1

    def views(self, answering: bool = False) -> list[ShardView]:
        """Every shard's view; with `answering`, of the shards that answer only (a shard down,
        or timing out, is left out and listed in `down`)."""
        if not answering:
            self.down = []
            return [read_view(r, self.keys, i) for i, r in enumerate(self.clients)]
        replies: list[Any] = []
        for r in self.clients:
            try:
                replies.append(r.hmget(self.keys.config, VIEW_FIELDS))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                replies.append(exc)
        self.down = [i for i, raw in enumerate(replies) if isinstance(raw, Exception)]
        return answered_views(replies)

    def check(self, partitions: int | None = None, create: bool = False,
              settle_s: float = 5.0) -> Placement | None:
        """The placement every shard holds, checked against these URLs (PlacementError if they
        disagree: the caller refuses to start). With `create` (a dispatcher), a fresh
        deployment's first placement is written, `partitions` partitions over the shards. Two
        tables that differ may be a move between its writes: asked again for `settle_s`."""
        if not self.sharded:
            return None
        deadline = time.monotonic() + settle_s
        total = len(self.clients)
        while True:
            views = self.views(answering=True)  # a majority of the shards is enough
            try:
                placement = agreed_placement(views, total)
                break
            except PlacementError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
        if placement is None and create:
            if partitions is None:
                raise PlacementError("a new deployment of several shards needs its partition count")
            placement = initial_placement(views, partitions)
            # shard 0 last: a process that finds shard 0's table finds every shard's
            for i in reversed(range(len(self.clients))):
                view = read_view(self.clients[i], self.keys, i)
                if view.placement is None:
                    if not view.has_data:
                        # no dispatcher ever served it: every session it will hold is in its
                        # partition's list from its first commit (schemas/moves.py)
                        self.clients[i].hsetnx(self.keys.config, INDEXED_FIELD, "1")
                    write_placement(self.clients[i], self.keys, i, placement)
            placement = agreed_placement(self.views(), total)  # another dispatcher may have won
        self.placement = placement
        return placement

    def refresh(self) -> Placement | None:
        """The newest placement any shard holds (a move writes them one after another);
        PlacementError when the URLs are not the deployment's shards in order."""
        if not self.sharded:
            return None
        # the URLs are checked at every read (PlacementError in the wrong order): a few bytes more
        self.placement = newest_placement_of(self.views(answering=True), len(self.clients))
        return self.placement

    def index_of_session(self, session: str) -> int:
        """The shard of a session (0 with one Redis). Reads the placement once if not yet read."""
        if not self.sharded:
            return 0
        if self.placement is None:
            self.refresh()
        if self.placement is None:
            raise PlacementError("the shards hold no placement yet: start a dispatcher first")
        return self.placement.shard_of_session(session)

    def for_session(self, session: str) -> redis.Redis:
        return self.clients[self.index_of_session(session)]
