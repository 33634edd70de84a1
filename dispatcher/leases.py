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
"""

import logging
import secrets
import time
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import ResponseError

from parley.dispatcher.store import load_script
from parley.logs import kv
from parley.schemas.keys import Keys

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


def get_partitions(redis: Redis, keys: Keys, default: int = 1) -> int:
    """N is published in `parley:config`; the first dispatcher writes its own default."""
    redis.hsetnx(keys.config, "partitions", default)
    raw = redis.hget(keys.config, "partitions")
    return int(raw) if raw else default


class Leases:
    """The leases one dispatcher holds (`owned`), renewed and rebalanced by `maintain()`."""

    def __init__(self, redis: Redis, keys: Keys, name: str, lease_ms: int):
        self.redis = redis
        self.keys = keys
        self.name = name
        self.lease_ms = lease_ms
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
        if not rebalance or (self.owned and now - self.maintained_at < self.lease_ms / 3000):
            return
        self.maintained_at = now
        share = self.fair_share()
        while len(self.owned) > share:
            self.release(self.owned[max(self.owned)])
        for n in range(self.partitions):
            if len(self.owned) >= share:
                break
            if n not in self.owned:
                self._acquire(n)

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

    def ensure_group(self, stream: str) -> None:
        """The consumers' group on `stream`, created (with the stream) unless it exists."""
        try:
            self.redis.xgroup_create(stream, self.keys.GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def fair_share(self) -> int:
        """ceil(N / live dispatchers); a dispatcher counts as live while it keeps registering."""
        now_ms = int(time.time() * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.dispatchers, {self.name: now_ms})
        pipe.zremrangebyscore(self.keys.dispatchers, "-inf", now_ms - self.lease_ms)
        pipe.zcard(self.keys.dispatchers)
        live = max(1, int(pipe.execute()[2]))
        return -(-self.partitions // live)

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
