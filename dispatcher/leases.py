"""Partition leases: which dispatcher reads which partition, and for how long it may.

Each partition (docs/design.md, "Consuming streams") is read by one dispatcher at a time,
the holder of `parley:lease:<n>`: a token set with `SET NX PX`, renewed every third of its
period by a compare-and-PEXPIRE script (dispatcher/lua/renew_lease.lua) and given back by a
compare-and-DEL (release_lease.lua). The token doubles as the fencing token that every
commit script checks, so a holder that stalled past its lease cannot write.

Live dispatchers register in a sorted set; each holds at most ceil(N / live) leases, so
partitions spread over the fleet and a dead dispatcher's share is taken over within a
lease period. Nothing here reads or applies entries: the consume loop asks `check()`
before each wave and stops a partition's batch when its lease is gone.

A dispatcher of one shard (`shard` set; schemas/shards.py) leases only the partitions its
shard serves, as its shard's `placement` says: it reads that field at every rebalance (each
tick) and gives back at once a lease whose partition stopped being served (a move froze it,
or flipped it elsewhere), so a move waits at most one tick for it. Its share is the served
partitions over the live dispatchers of its shard (the live set is the shard's own key).
"""

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from parley.dispatcher.store import load_script
from parley.runtime.logs import kv
from parley.schemas.keys import Keys, partition_of
from parley.schemas.moves import INDEXED_FIELD
from parley.schemas.shards import PLACEMENT_FIELD, Placement, PlacementError

log = logging.getLogger("parley.dispatcher")


class LeaseLost(Exception):
    """The partition's lease lapsed or changed hands: stop its batch, leave the rest pending."""


@dataclass
class Partition:
    """A partition this dispatcher holds: its lease token and the streams it reads there."""

    n: int
    token: str
    renewed_at: float
    # (inputs, results, then each registered producer's input stream of this partition)
    streams: tuple[str, ...] = ("", "")
    # its pending entries were claimed and applied since the lease was taken (or Redis came back)
    recovered: bool = False

    def is_input_stream(self, stream: str) -> bool:
        """One of the partition's input streams (its own or a producer's), not its results."""
        return stream in self.streams and stream != self.streams[1]


def get_partitions(redis: Redis, keys: Keys, default: int = 1) -> int:
    """N is published in `parley:config`; the first dispatcher writes its own default. On a
    shard it finds with no N (a new one: no dispatcher ever served it), every session will be
    in its partition's list from its first commit, so the shard is marked indexed at once
    (schemas/moves.py INDEXED_FIELD); a shard of an older release is indexed by `parley
    partitions index`."""
    if redis.hsetnx(keys.config, "partitions", default):
        redis.hsetnx(keys.config, INDEXED_FIELD, "1")
    raw = redis.hget(keys.config, "partitions")
    return int(raw) if raw else default


class Leases:
    """The leases one dispatcher holds (`owned`), renewed and rebalanced by `maintain()`."""

    def __init__(self, redis: Redis, keys: Keys, name: str, lease_ms: int, shard: int | None = None):
        self.redis = redis
        self.keys = keys
        self.name = name
        self.lease_ms = lease_ms
        # this dispatcher's shard (None: a deployment of one Redis, every partition is ours)
        self.shard = shard
        self.placement: Placement | None = None
        self._placement_raw: Any = None
        self._placement_read = False
        self.owned: dict[int, Partition] = {}
        self.partitions = 0  # N, read from parley:config by the loop before its first tick
        self.maintained_at = 0.0
        self._renew = load_script(redis, "renew_lease")
        self._release = load_script(redis, "release_lease")

    def maintain(self, rebalance: bool = True) -> None:
        """Renew our leases; between batches, also take or give back partitions so that each
        live dispatcher holds about N / (live dispatchers) of them."""
        now = time.monotonic()
        self._renew_due(now)
        if not rebalance:
            return
        # read every tick, not every third of a lease: a move waits for our lease to come back
        changed = self.read_placement()
        for p in [p for p in self.owned.values() if not self.serves_partition(p.n)]:
            self.release(p)
        if not changed and self.owned and now - self.maintained_at < self.lease_ms / 3000:
            return
        self.maintained_at = now
        share = self.fair_share()
        while len(self.owned) > share:
            self.release(self.owned[max(self.owned)])
        for n in self.served():
            if len(self.owned) >= share:
                break
            if n not in self.owned:
                self._acquire(n)

    # ---- the placement (a dispatcher of one shard) -------------------------------------------
    def read_placement(self) -> bool:
        """Read our shard's `placement` (one HGET, parsed only when it changed); True if it did.
        A placement missing or unreadable serves nothing: guessing could let two shards' dispatchers
        apply one session's entries."""
        if self.shard is None:
            return False
        raw = self.redis.hget(self.keys.config, PLACEMENT_FIELD)
        if self._placement_read and raw == self._placement_raw:
            return False
        self._placement_raw, self._placement_read = raw, True
        try:
            self.placement = Placement.from_json(raw) if raw is not None else None
        except PlacementError as exc:
            log.error("the shard's placement does not read; serving no partition",
                      extra=kv(shard=self.shard, error=str(exc)))
            self.placement = None
            return True
        if self.placement is None:
            log.error("the shard holds no placement; serving no partition", extra=kv(shard=self.shard))
        else:
            log.info("placement read", extra=kv(shard=self.shard, version=self.placement.version,
                                                partitions=",".join(map(str, self.served()))))
        return True

    def serves_partition(self, n: int) -> bool:
        """This dispatcher's shard serves partition n now (always, unsharded)."""
        if self.shard is None:
            return True
        return self.placement is not None and n < self.placement.partitions \
            and self.placement.serves(self.shard, n)

    def serves_session(self, session: str) -> bool:
        """The session's partition is served here: what the sweeps act on."""
        if self.shard is None:
            return True
        if self.placement is None:
            return False
        return self.placement.serves(self.shard, partition_of(session, self.placement.partitions))

    def served(self) -> list[int]:
        """The partitions this dispatcher may lease, in order."""
        return [n for n in range(self.partitions) if self.serves_partition(n)]

    def _renew_due(self, now: float) -> None:
        for p in list(self.owned.values()):
            if now - p.renewed_at < self.lease_ms / 3000:
                continue
            if self._renew(keys=[self.keys.lease(p.n)], args=[p.token, self.lease_ms]):
                p.renewed_at = now
            else:
                log.warning("lease lost", extra=kv(partition=p.n))
                del self.owned[p.n]

    def _acquire(self, n: int) -> None:
        """Take partition n if its lease is free, and make sure its streams' group exists."""
        token = f"{self.name}:{secrets.token_hex(4)}"
        if not self.redis.set(self.keys.lease(n), token, nx=True, px=self.lease_ms):
            return
        streams = (self.keys.inputs(n, self.partitions), self.keys.results(n, self.partitions))
        for stream in streams:
            self.ensure_group(stream)
        self.owned[n] = Partition(n=n, token=token, renewed_at=time.monotonic(), streams=streams)
        log.info("lease acquired", extra=kv(partition=n, consumer=self.name))

    def ensure_group(self, stream: str) -> bool:
        """The consumers' group on `stream`, created (with the stream) unless it exists; True
        when it was created now.

        From id 0, the stream's first entry, also when a group is made again after `NOGROUP`
        (the stream deleted, `Dispatcher.regroup`): a stream deleted and written again holds only
        entries added after the DEL, none of them read before, and 0 delivers every one (`$`
        would skip those a producer added between the DEL and the re-creation). Nothing is
        applied twice either: a stream holds only entries not yet acknowledged (the settle's
        MULTI deletes what it acknowledges), and a replay of one applied before (a group alone
        destroyed, its stream kept) is a no-op by the session's marker."""
        try:
            self.redis.xgroup_create(stream, self.keys.GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    def fair_share(self) -> int:
        """ceil(served / live dispatchers): N, or the partitions our shard serves, over the live
        dispatchers (of this shard: the set lives on it); live while it keeps registering."""
        now_ms = int(time.time() * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.dispatchers, {self.name: now_ms})
        pipe.zremrangebyscore(self.keys.dispatchers, "-inf", now_ms - self.lease_ms)
        pipe.zcard(self.keys.dispatchers)
        live = max(1, int(pipe.execute()[2]))
        return -(-len(self.served()) // live)

    def release(self, p: Partition) -> None:
        self._release(keys=[self.keys.lease(p.n)], args=[p.token])
        self.owned.pop(p.n, None)
        log.info("lease given back", extra=kv(partition=p.n, consumer=self.name))

    def release_all(self) -> None:
        """On the way out: give every lease back and leave the live set, so others take over now."""
        for p in list(self.owned.values()):
            self.release(p)
        self.redis.zrem(self.keys.dispatchers, self.name)

    def fresh(self, p: Partition) -> bool:
        """Renewed less than 80 % of a period ago: stop before the lease can have lapsed (the
        commit's fencing check is the backstop)."""
        return time.monotonic() - p.renewed_at < self.lease_ms * 0.8 / 1000

    def check(self, p: Partition) -> None:
        """Raise LeaseLost unless p is still ours and fresh (renewing it first if it is due)."""
        if not self.fresh(p):
            self.maintain(rebalance=False)
            if p.n not in self.owned or not self.fresh(p):
                raise LeaseLost()

    def lost(self, p: Partition) -> None:
        """A commit was fenced off: the partition is someone else's now."""
        self.owned.pop(p.n, None)

    def of_stream(self, stream: str) -> Partition | None:
        for p in self.owned.values():
            if stream in p.streams:
                return p
        return None

    def suspect_all(self) -> None:
        """After a Redis error: re-claim our own pending entries before reading new ones."""
        for p in self.owned.values():
            p.recovered = False
