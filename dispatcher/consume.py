"""The consume loop: read a partition's entries, apply them in waves, settle the batch.

A dispatcher holds some partitions (dispatcher/leases.py); for each, a new holder first
claims every entry still pending in the group (the previous holder's unacknowledged work),
then reads new ones. A tick applies what it read (dispatcher/apply.py) into a fresh `Batch`
and ends with one settle: the batch's outbox effects flushed, its entries acknowledged (and
deleted, so the streams stay trimmed) and the next entries read, in one MULTI. An entry is
acknowledged only after its transition is committed and its outbox flushed, so a crash
anywhere leaves it pending, and its replay is a no-op that flushes what is left
(docs/design.md, "Consuming streams").
"""

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from redis import Redis
from redis.exceptions import BusyLoadingError, RedisError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley import metrics
from parley.dispatcher.apply import Applier, Batch, Replies, Stats
from parley.dispatcher.core import AdmissionLimits, AppInfo, Lifecycle, Limits
from parley.dispatcher.enqueue import DEFAULT_ARCHIVE_MAXLEN, Outbox
from parley.dispatcher.entries import EntryDecoder, Prepared
from parley.dispatcher.functions import Functions
from parley.dispatcher.leases import LeaseLost, Leases, Partition, get_partitions
from parley.dispatcher.limits_config import publish_limits
from parley.dispatcher.store import (
    DEFAULT_EVENTS_MAXLEN,
    DEFAULT_FEED_MAXLEN,
    DEFAULT_UNKNOWN_SESSION_TTL_S,
    Store,
)
from parley.dispatcher.sweeps import Sweeps
from parley.logs import kv
from parley.retry import backoff
from parley.schemas.codec import session_of
from parley.schemas.keys import Keys, partition_of
from parley.schemas.signing import Keyring

log = logging.getLogger("parley.dispatcher")


class Dispatcher:
    """One dispatcher process: its leases, its sweeps, and the loop that applies entries."""

    # how often the owner looks for entries left pending by another consumer
    STALE_CHECK_S = 5.0

    def __init__(self, redis: Redis, keys: Keys, app: AppInfo, *, limits: Limits | None = None,
                 partitions: int = 1, lease_ms: int = 10_000, block_ms: int = 500, batch: int = 100,
                 name: str | None = None, keyring: Keyring | None = None,
                 agents: dict[str, AppInfo] | None = None, feed_maxlen: int = DEFAULT_FEED_MAXLEN,
                 events_maxlen: int = DEFAULT_EVENTS_MAXLEN, archive_maxlen: int = DEFAULT_ARCHIVE_MAXLEN,
                 lifecycle: Lifecycle | None = None, admission: AdmissionLimits | None = None,
                 unknown_session_ttl_ms: int = DEFAULT_UNKNOWN_SESSION_TTL_S * 1000):
        self.redis = redis
        self.keys = keys
        self.default_partitions = partitions
        self.block_ms = block_ms
        self.batch = batch
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.store = Store(redis, keys, events_maxlen=events_maxlen, feed_maxlen=feed_maxlen,
                           unknown_session_ttl_ms=unknown_session_ttl_ms)
        self.outbox = Outbox(redis, keys, archive_maxlen=archive_maxlen)
        self.stats = Stats()
        self.health: metrics.Health | None = None
        metrics.start_dispatcher_series()
        self.leases = Leases(redis, keys, self.name, lease_ms)
        self.sweeps = Sweeps(redis, keys, self.leases, self.outbox)
        # Every dispatcher verifies the inputs dispatchers write themselves (sub-agents),
        # whether or not producers sign theirs.
        keyring = (keyring or Keyring({})).with_engine_key(self.outbox.engine_key.current())
        decoder = EntryDecoder(app, limits or Limits(), agents or {}, keyring,
                               reload_engine_key=self.outbox.engine_key.reload_if_due,
                               lifecycle=lifecycle or Lifecycle(), admission=admission or AdmissionLimits())
        self.limits_published = False
        self.decoder = decoder
        self.applier = Applier(redis, keys, self.store, self.leases, decoder, self.stats)
        self.stale_checked = time.monotonic()
        # the producers' submit function (dispatcher/functions.py): loaded now, checked each tick
        self.functions = Functions(redis)
        self.functions.ensure()

    def run(self, stop: threading.Event) -> None:
        """Tick until `stop`; Redis outages and refused commands are waited out with backoff."""
        ahead: Replies | None = None
        failures = 0
        while not stop.is_set():
            try:
                if not self.leases.partitions:
                    self.leases.partitions = get_partitions(self.redis, self.keys, self.default_partitions)
                if not self.limits_published:
                    publish_limits(self.redis, self.keys, self.decoder.admission)
                    self.limits_published = True
                ahead = self.tick(ahead)
                if failures:
                    log.info("redis reachable again", extra=kv(consumer=self.name))
                failures = 0
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
                ahead = None
                log.warning("redis unavailable, retrying",
                            extra=kv(error=repr(exc), backoff_s=backoff(failures, base=0.1, cap=5.0)))
                self._pause(stop, failures)
                failures += 1
            except RedisError as exc:
                # A command Redis refused: a bug or a misconfiguration, not an outage. Nothing
                # was acknowledged, so the entry is retried; say loudly why.
                ahead = None
                log.exception("redis refused a command, retrying", extra=kv(error=repr(exc)))
                self._pause(stop, failures)
                failures += 1
        with contextlib.suppress(RedisError):
            self.leases.release_all()

    def _pause(self, stop: threading.Event, failures: int) -> None:
        # whatever the last tick read stays pending: re-claim our own entries once back
        self.leases.suspect_all()
        self.functions.recheck()  # a Redis back from a restart may hold no functions
        stop.wait(backoff(failures, base=0.1, cap=5.0))

    def tick(self, ahead: Replies | None = None) -> Replies | None:
        """One round: leases and sweeps, then the entries `ahead` (read by the last settle) or
        those a blocking read brings, applied and settled as one Batch. Returns what this
        tick's settle read ahead: the next tick's entries, which `run` passes back in."""
        self.decoder.reload_keys_if_due()  # the signing keys file, on SIGHUP or a change
        if self.health is not None:
            self.health.beat()
        self.leases.maintain()
        self.sweeps.run()
        self.functions.maintain()
        if not self.leases.owned:
            time.sleep(self.block_ms / 1000)
            return ahead
        for p in list(self.leases.owned.values()):
            if not p.recovered:
                self.recover(p)
        self.reclaim_stale()
        replies: Any = ahead or self.redis.xreadgroup(
            self.keys.GROUP, self.name, self.read_streams(), count=self.batch, block=self.block_ms)
        batch = Batch()
        processed = False
        try:
            for stream, entries in replies or []:
                name = _text(stream)
                owner = self.leases.of_stream(name)
                if owner is not None:
                    self.apply_entries(owner, name, entries, batch)
            processed = True
        finally:
            # Entries of partitions given up since the read-ahead stay pending: the next owner
            # claims them (recover).
            self.settle(batch, read_next=processed)
        return batch.ahead

    def read_streams(self) -> dict[Any, Any]:
        return {s: ">" for p in self.leases.owned.values() for s in p.streams}

    def recover(self, p: Partition) -> None:
        """Claim and apply every entry still pending in the group, oldest first."""
        for stream in p.streams:
            cursor = "0-0"
            while True:
                reply = self.redis.xautoclaim(stream, self.keys.GROUP, self.name, min_idle_time=0,
                                              start_id=cursor, count=self.batch)
                cursor = _text(reply[0])
                entries = [e for e in reply[1] if e and e[1] is not None]
                if entries:
                    log.info("replaying pending entries", extra=kv(stream=stream, count=len(entries)))
                    self.process(p, stream, entries)
                if cursor == "0-0":
                    break
        p.recovered = True

    def reclaim_stale(self) -> None:
        """Entries of our partitions pending for longer than a lease under any consumer: read
        by a dispatcher that then lost the partition (or by us, before an error). Nobody else
        will apply them; claim and apply them (a replay of an applied one is a no-op)."""
        now = time.monotonic()
        if now - self.stale_checked < self.STALE_CHECK_S:
            return
        self.stale_checked = now
        for p in list(self.leases.owned.values()):
            if not p.recovered:
                continue
            for stream in p.streams:
                reply: Any = self.redis.xautoclaim(stream, self.keys.GROUP, self.name,
                                                   min_idle_time=self.leases.lease_ms, start_id="0-0",
                                                   count=self.batch)
                entries = [e for e in reply[1] if e and e[1] is not None]
                if entries:
                    log.warning("claimed entries left pending by another consumer",
                                extra=kv(stream=stream, count=len(entries)))
                    self.process(p, stream, entries)

    def process(self, p: Partition, stream: str, entries: list[Any]) -> None:
        """Apply entries claimed outside the tick's read, and settle them at once."""
        batch = Batch()
        try:
            self.apply_entries(p, stream, entries, batch)
        finally:
            self.settle(batch)

    def apply_entries(self, p: Partition, stream: str, entries: list[Any], batch: Batch) -> None:
        """Apply one stream's entries into `batch`. Each is decoded and checked first; a bad one
        is rejected at once, after the entries of its session that precede it. The rest go in
        waves (Applier). A lost lease stops here and leaves the rest pending for the next owner."""
        inputs = stream == p.streams[0]
        queued: list[Prepared] = []
        sessions: set[str] = set()
        try:
            for raw_id, fields in entries:
                entry_id = _text(raw_id)
                prep = self.decoder.prepare(stream, inputs, entry_id, fields)
                if isinstance(prep, Prepared):
                    queued.append(prep)
                    sessions.add(prep.session)
                    continue
                # A rejection writes to its session (an event, the idempotency key): what
                # precedes it there is applied first.
                if (session := session_of(fields)) is not None and session in sessions:
                    self.applier.apply(p, stream, queued, batch)
                    queued, sessions = [], set()
                self.leases.check(p)
                self.applier.reject(stream, entry_id, fields, prep, batch)
            self.applier.apply(p, stream, queued, batch)
        except LeaseLost:
            log.warning("lease lost mid-batch; leaving the rest to the next owner",
                        extra=kv(partition=p.n))
            self.leases.lost(p)

    def settle(self, batch: Batch, read_next: bool = False) -> None:
        """One MULTI for what a batch did: the effects its commits left in their outboxes, the
        acknowledgement (and deletion) of its entries and, when asked, a non-blocking read of
        the next entries into `batch.ahead`. One round trip (one fsync under `appendfsync
        always`) instead of three. Flush and acknowledgement are atomic: a crash leaves the
        entries pending and their outboxes full, and their replay flushes again.

        Fenced by WATCH on our leases: if one lapsed or changed hands meanwhile (a dispatcher
        stalled past its lease), nothing is flushed, acknowledged or read; the new owner
        replays those entries and flushes their effects once."""
        if not batch.acks:
            return
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=True)
            try:
                live = list(self.leases.owned.values())
                if live:
                    pipe.watch(*[self.keys.lease(p.n) for p in live])
                # Fresh after the WATCH: each lease was ours when watched, so any change since
                # aborts the EXEC.
                fresh = [p for p in live if self.leases.fresh(p)]
                if len(fresh) < len(live) and attempt == 1:
                    pipe.reset()
                    self.leases.maintain(rebalance=False)
                    continue
                self._flush_and_ack(pipe, batch, fresh, read_next)
                return
            except WatchError:
                log.warning("a lease changed while settling; leaving the entries to its owner")
                self.leases.maintain(rebalance=False)
                return
            finally:
                pipe.reset()

    def _flush_and_ack(self, pipe: Any, batch: Batch, fresh: list[Partition], read_next: bool) -> None:
        """The settle's MULTI, limited to the partitions whose lease is fresh."""
        ours = {p.n for p in fresh}
        keep = {stream: ids for stream, ids in batch.acks.items()
                if (owner := self.leases.of_stream(stream)) is not None and owner.n in ours}
        if not keep:
            return
        n = max(1, self.leases.partitions)
        effects = [(session, fx) for session, fx in batch.effects if partition_of(session, n) in ours]
        streams = {s: ">" for p in fresh for s in p.streams} if read_next else None

        def then(pipe: Any) -> None:
            for stream, ids in keep.items():
                pipe.xack(stream, self.keys.GROUP, *ids)
                pipe.xdel(stream, *ids)
            if streams:
                pipe.xreadgroup(self.keys.GROUP, self.name, streams, count=self.batch)

        replies = self.outbox.flush_many(effects, then=then, pipe=pipe)
        if streams and replies:
            batch.ahead = replies[-1]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
