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

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, RedisError, ResponseError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from parley.dispatcher.apply import (
    PENDING_DONE,
    Applier,
    Batch,
    Held,
    Replies,
    Stats,
    pending_skipped,
    take_fair,
)
from parley.dispatcher.core import AdmissionLimits, AppInfo, Lifecycle, Limits
from parley.dispatcher.enqueue import DEFAULT_ARCHIVE_MAXLEN, JobMaker, Outbox
from parley.dispatcher.entries import EntryDecoder, Prepared, Refused, entry_key
from parley.dispatcher.functions import Functions
from parley.dispatcher.keyprints import KeyprintsPublisher
from parley.dispatcher.leases import LeaseLost, Leases, Partition, get_partitions
from parley.dispatcher.limits_config import publish_limits
from parley.dispatcher.producers import ProducerRegistry
from parley.dispatcher.replicas import ReplicaPolicy, Replicas
from parley.dispatcher.store import (
    DEFAULT_EVENTS_MAXLEN,
    DEFAULT_FEED_MAXLEN,
    DEFAULT_UNKNOWN_SESSION_TTL_S,
    Store,
    load_script,
)
from parley.dispatcher.sweeps import Sweeps
from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.runtime.redis_errors import group_gone
from parley.runtime.retry import backoff
from parley.schemas.codec import InputError, entry_bytes, input_refs, session_of
from parley.schemas.codes import RefusalCode
from parley.schemas.keys import Keys, partition_of, stream_of_partition
from parley.schemas.producers import Producer
from parley.schemas.signing import Keyring

log = logging.getLogger("parley.dispatcher")


class Dispatcher:
    """One dispatcher process: its leases, its sweeps, and the loop that applies entries."""

    # how often the owner looks for entries left pending by another consumer
    STALE_CHECK_S = 5.0
    # entries of one stream read and waiting for a later tick (a flooded session's, beyond its
    # share of a tick): past this many, or this many bytes of them (all their fields: an entry
    # is at most the input limit and 4 KiB, schemas/codec.py), the stream is not read further
    # until some are applied (docs/design.md, "Consuming streams")
    BACKLOG_MAX = 10_000
    BACKLOG_BYTES = 64 * 1024 * 1024

    def __init__(self, redis: Redis, keys: Keys, app: AppInfo, *, limits: Limits | None = None,
                 partitions: int = 1, lease_ms: int = 10_000, block_ms: int = 500, batch: int = 100,
                 name: str | None = None, keyring: Keyring | None = None,
                 agents: dict[str, AppInfo] | None = None, feed_maxlen: int = DEFAULT_FEED_MAXLEN,
                 events_maxlen: int = DEFAULT_EVENTS_MAXLEN, archive_maxlen: int = DEFAULT_ARCHIVE_MAXLEN,
                 lifecycle: Lifecycle | None = None, admission: AdmissionLimits | None = None,
                 unknown_session_ttl_ms: int = DEFAULT_UNKNOWN_SESSION_TTL_S * 1000,
                 shard: int | None = None, replicas: ReplicaPolicy | None = None):
        self.redis = redis
        self.keys = keys
        self.default_partitions = partitions
        self.block_ms = block_ms
        self.batch = batch
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        # one JobMaker (RQ's queues, read once) for the commits' jobs and the outbox's old ones
        jobs = JobMaker(redis, keys)
        self.store = Store(redis, keys, events_maxlen=events_maxlen, feed_maxlen=feed_maxlen,
                           unknown_session_ttl_ms=unknown_session_ttl_ms, jobs=jobs)
        self.outbox = Outbox(redis, keys, archive_maxlen=archive_maxlen, jobs=jobs)
        # --replica-acks: the WAIT between a batch's commits and its settle (dispatcher/replicas.py)
        self.replicas = Replicas(redis, keys, replicas or ReplicaPolicy())
        self.stats = Stats()
        self.health: metrics.Health | None = None
        metrics.start_dispatcher_series()
        # shard: this dispatcher's shard of a deployment of several (None: of one Redis); it
        # leases and sweeps only what its shard's placement says it serves (dispatcher/leases.py)
        self.leases = Leases(redis, keys, self.name, lease_ms, shard=shard)
        self.sweeps = Sweeps(redis, keys, self.leases, self.outbox)
        # Every dispatcher verifies the inputs dispatchers write themselves (sub-agents),
        # whether or not producers sign theirs.
        keyring = (keyring or Keyring({})).with_engine_key(self.outbox.engine_key.current())
        decoder = EntryDecoder(app, limits or Limits(), agents or {}, keyring,
                               reload_engine_key=self.outbox.engine_key.fresher,
                               lifecycle=lifecycle or Lifecycle(), admission=admission or AdmissionLimits())
        self.limits_published = False
        self.decoder = decoder
        self.applier = Applier(redis, keys, self.store, self.leases, decoder, self.stats)
        self.registry = ProducerRegistry(redis, keys)
        self.applier.producer_of = self.registry.producer_of
        # stream -> its entries read (pending, ours) but left for a later tick, in id order
        self.backlog: dict[str, list[Held]] = {}
        self.stale_checked = time.monotonic()
        # the producers' submit function (dispatcher/functions.py): loaded now, checked each tick
        self.functions = Functions(redis)
        self.functions.ensure()
        # the fingerprints of the keys we verify with, for the inbox's check (dispatcher/keyprints.py)
        self.keyprints = KeyprintsPublisher(redis, keys, self.name)
        self._forward = load_script(redis, "forward_entry")

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
                # after `tick` reloaded the keys file: the next round publishes what it read
                self.keyprints.maintain(self.decoder.keyring.keys)
                ahead = self.tick(ahead)
                if failures:
                    log.info("redis reachable again", extra=kv(consumer=self.name))
                failures = 0
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
                ahead = None
                delay = backoff(failures, base=0.1, cap=5.0, jitter=True)
                log.warning("redis unavailable, retrying",
                            extra=kv(error=repr(exc), backoff_s=round(delay, 3)))
                self._pause(stop, delay)
                failures += 1
            except RedisError as exc:
                ahead = None
                if group_gone(exc) and (made := self._regroup_or_none()):
                    # A stream of ours lost its group (deleted: the runbook for a jammed producer
                    # stream, docs/operations.md): made again, every stream is read on at once.
                    log.warning("a stream's consumer group was gone (the stream deleted?): made "
                                "again from id 0, reading on", extra=kv(streams=",".join(made)))
                    self.leases.suspect_all()  # what was read ahead is claimed again, as after an outage
                    continue
                # A command Redis refused: a bug or a misconfiguration, not an outage. Nothing
                # was acknowledged, so the entry is retried; say loudly why.
                log.exception("redis refused a command, retrying", extra=kv(error=repr(exc)))
                self._pause(stop, backoff(failures, base=0.1, cap=5.0, jitter=True))
                failures += 1
        self._leave()

    def _leave(self) -> None:
        """On the way out: leases given back and fingerprints withdrawn, each tried once. They
        are a courtesy (leases lapse by themselves within a lease period, fingerprints are
        marked stale), so a stop during an outage must not wait out redis-py's retries: about
        4 s a command, which would turn a SIGTERM into a kill when an orchestrator's grace ends."""
        retry = self.redis.get_retry()
        self.redis.set_retry(Retry(NoBackoff(), 0))
        try:
            for leave in (self.leases.release_all, self.keyprints.withdraw):
                leave()
        except RedisError as exc:
            log.warning("redis did not answer on the way out: leases left to lapse",
                        extra=kv(error=repr(exc)))
        finally:  # the client may be the caller's (an embedding, a test): its retries as they were
            if retry is not None:
                self.redis.set_retry(retry)

    def _regroup_or_none(self) -> list[str]:
        """`regroup`, called from the loop's error handler: a Redis error while it makes the
        groups (an outage right after the NOGROUP, a key made another type meanwhile) must not
        escape the loop, so it is logged and the loop backs off as for any refused command."""
        try:
            return self.regroup()
        except RedisError as exc:
            log.warning("could not make a missing consumer group again; backing off",
                        extra=kv(error=repr(exc)))
            return []

    def regroup(self) -> list[str]:
        """After `NOGROUP`: the group of every stream we read made again where it is missing
        (from id 0, `Leases.ensure_group` says why); the streams it was made on. One XREADGROUP
        reads all of a partition's streams, so one stream without its group (a producer's
        stream deleted, or a results stream) would otherwise fail every read of every stream,
        for good. The backlog of such a stream is dropped: its entries went with it."""
        made = []
        for p in list(self.leases.owned.values()):
            for stream in p.streams:
                if self.leases.ensure_group(stream):
                    made.append(stream)
                    self.backlog.pop(stream, None)
        return made

    def _pause(self, stop: threading.Event, delay: float) -> None:
        # whatever the last tick read stays pending: re-claim our own entries once back
        self.leases.suspect_all()
        self.functions.recheck()  # a Redis back from a restart may hold no functions
        # a producer's stream key may have become another type (dispatcher/producers.py): the
        # registry's check of their types runs again at once, not a refresh period later
        self.registry.expire()
        stop.wait(delay)

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
            self.backlog.clear()
            time.sleep(self.block_ms / 1000)
            return ahead
        self.sync_streams()
        for p in list(self.leases.owned.values()):
            if not p.recovered:
                self.recover(p)
        self.reclaim_stale()
        replies: Any = ahead
        if not replies and (streams := self.read_streams()):
            # entries waiting in the backlog are work already: do not block for more
            replies = self.redis.xreadgroup(self.keys.GROUP, self.name, streams, count=self.batch,
                                            block=None if self.backlog else self.block_ms)
        todo: dict[str, list[Any]] = {_text(stream): entries for stream, entries in replies or []}
        for stream in self.backlog:
            todo.setdefault(stream, [])
        batch = Batch()
        processed = False
        try:
            for name, entries in todo.items():
                owner = self.leases.of_stream(name)
                if owner is not None:
                    self.apply_entries(owner, name, entries, batch)
            processed = True
        finally:
            # Entries of partitions given up since the read-ahead stay pending: the next owner
            # claims them (recover).
            self.settle(batch, read_next=processed)
        return batch.ahead

    def read_streams(self, partitions: list[Partition] | None = None) -> dict[Any, Any]:
        """The streams to read new entries from: all of our partitions', but those whose backlog
        is full, in entries or in bytes (they are read again once it is applied)."""
        owned = self.leases.owned.values() if partitions is None else partitions
        return {s: ">" for p in owned for s in p.streams if not self.backlog_full(s)}

    def backlog_full(self, stream: str) -> bool:
        held = self.backlog.get(stream)
        if not held:
            return False
        return len(held) >= self.BACKLOG_MAX or sum(h.size for h in held) > self.BACKLOG_BYTES

    def sync_streams(self) -> None:
        """Every couple of seconds, the producer registry read again: each partition we hold
        reads the input stream of every registered producer (its group created with the stream,
        its pending entries claimed at once), and no longer those of a producer removed and
        drained. Dropped: the backlog of streams no longer ours."""
        n = max(1, self.leases.partitions)
        changed = self.registry.refresh(n)
        for p in list(self.leases.owned.values()):
            wanted = (*p.streams[:2], *self.registry.streams(p.n, n))
            if not changed and wanted == p.streams:
                continue
            added = []
            for stream in (s for s in wanted if s not in p.streams):
                try:
                    self.leases.ensure_group(stream)
                    added.append(stream)
                except ResponseError as exc:  # its key became another type since the check
                    log.error("a producer's input stream cannot be read",
                              extra=kv(stream=stream, error=str(exc)))
                    self.registry.expire()  # checked again next tick
            wanted = tuple(s for s in wanted if s in p.streams or s in added)
            p.streams = wanted
            if added:
                log.info("reading producer streams", extra=kv(partition=p.n, streams=",".join(added)))
            if p.recovered:
                for stream in added:
                    self.recover_stream(p, stream)
        for stream in list(self.backlog):
            if self.leases.of_stream(stream) is None:
                del self.backlog[stream]

    def recover(self, p: Partition) -> None:
        """Claim and apply every entry still pending in the group, oldest first."""
        for stream in p.streams:
            self.recover_stream(p, stream)
        p.recovered = True

    def recover_stream(self, p: Partition, stream: str) -> None:
        """Claim and apply every entry of one stream still pending in the group (ours held back
        for a later tick included: the backlog is read again from the group, in order)."""
        self.backlog.pop(stream, None)
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
                entries = self._stale(stream)
                if entries:
                    log.warning("claimed entries left pending by another consumer",
                                extra=kv(stream=stream, count=len(entries)))
                    self.process(p, stream, entries)

    def _stale(self, stream: str) -> list[Any]:
        """Up to a batch of a stream's entries pending for longer than a lease, but those of our
        own backlog (idle too when a flood holds them back long, and applied by the ticks): the
        ids are claimed (JUSTID, enough of them to reach past our backlog), then the fields of
        the others read."""
        waiting = {h.entry_id for h in self.backlog.get(stream, ())}
        ids: Any = self.redis.xautoclaim(stream, self.keys.GROUP, self.name,
                                         min_idle_time=self.leases.lease_ms, start_id="0-0",
                                         count=len(waiting) + self.batch, justid=True)
        found = [i for raw in ids if (i := _text(raw)) not in waiting]
        if not found:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in found[:self.batch]:
            pipe.xrange(stream, entry_id, entry_id)
        # an id whose entry was deleted meanwhile reads as nothing
        return [rows[0] for rows in pipe.execute() if rows]

    def process(self, p: Partition, stream: str, entries: list[Any]) -> None:
        """Apply entries claimed outside the tick's read, and settle them at once."""
        batch = Batch()
        try:
            self.apply_entries(p, stream, entries, batch)
        finally:
            self.settle(batch)

    def hold(self, p: Partition, stream: str, entries: list[Any],
             refused: dict[str, str] | None = None) -> list[Held]:
        """One stream's entries read now, behind those it holds back from earlier ticks, each
        decoded and checked once: the tenant of a producer scoped to one is checked here, and
        an entry of `refused` (id -> why) is refused for that reason."""
        inputs = stream != p.streams[1]  # every stream but the results stream holds inputs
        producer = self.registry.producer_of(stream)
        held = self.backlog.pop(stream, [])
        last, first_new = (entry_key(held[-1].entry_id) if held else None), len(held)
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            prep = self.decoder.prepare(stream, inputs, entry_id, fields)
            if producer is not None and isinstance(prep, Prepared) and not producer.allows(prep.session):
                prep = wrong_tenant(producer, prep, fields)
            if refused and entry_id in refused:  # not its partition's stream, nor this shard's
                input_type, ids = input_refs(fields)
                prep = Refused(InputError(refused[entry_id], input_type, ids), code=RefusalCode.MOVED)
            session = prep.session if isinstance(prep, Prepared) else session_of(fields)
            held.append(Held(entry_id, fields, prep, session, entry_bytes(fields)))
        # entries come in id order (a read, or a claim), so the first one says whether they go
        # after the backlog (a read always does) or must be merged into it (a stale claim's)
        if last is not None and len(held) > first_new and entry_key(held[first_new].entry_id) < last:
            held.sort(key=lambda h: entry_key(h.entry_id))
        return held

    def apply_entries(self, p: Partition, stream: str, entries: list[Any], batch: Batch) -> None:
        """Apply one stream's entries into `batch`: those the stream holds back from earlier
        ticks first, then these. A tick takes at most SESSION_DEPTH entries of a session
        (take_fair); the rest wait, pending, in the backlog. A bad entry is rejected at once,
        after the entries of its session that precede it. The rest go in waves (Applier). A
        lost lease stops here and leaves the rest pending for the next owner."""
        entries, refused = self.forward_strays(p, stream, entries)
        now, later = take_fair(self.hold(p, stream, entries, refused))
        if later:
            self.backlog[stream] = later
        queued: list[Prepared] = []
        sessions: set[str] = set()
        try:
            for h in now:
                entry_id, fields, prep = h.entry_id, h.fields, h.prep
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
                self.applier.reject(p, stream, entry_id, fields, prep, batch)
            self.applier.apply(p, stream, queued, batch)
        except LeaseLost:
            log.warning("lease lost mid-batch; leaving the rest to the next owner",
                        extra=kv(partition=p.n))
            self.leases.lost(p)
            for s in p.streams:
                self.backlog.pop(s, None)

    def forward_strays(self, p: Partition, stream: str,
                       entries: list[Any]) -> tuple[list[Any], dict[str, str]]:
        """Inputs on `p`'s stream whose session is in another partition: a hand-made XADD, or
        one written with the partition count from before a `parley partitions resize` (the
        submit function refuses those `moved`, and the client reads the count again). Applied
        here, they would give their session two writers. Each is moved, its fields as they are
        (a signature stays valid), to that partition's stream of the same name, acknowledged
        here in the same step (lua/forward_entry.lua), when this shard serves that partition
        (after a resize to k x N it does: each session's partition is on the shard of its old
        one); else it is refused as any bad input is (recorded, its pending count released),
        by id in the second value. The rest are returned first."""
        n = max(1, self.leases.partitions)
        if n == 1 or not p.is_input_stream(stream):
            return entries, {}
        keep, refused = [], {}
        for entry in entries:
            entry_id, fields = entry
            session = session_of(fields)
            right = None if session is None else partition_of(session, n)
            if right is None or right == p.n:
                keep.append(entry)
                continue
            if not self.leases.serves_partition(right):
                refused[_text(entry_id)] = (f"session {session} is in partition {right} of {n}, which this "
                                            f"shard does not serve now: send it through the submit function")
                keep.append(entry)
                continue
            target = stream_of_partition(stream, right)
            pairs = [x for kv_ in fields.items() for x in kv_]
            if self._forward(keys=[stream, target], args=[self.keys.GROUP, entry_id, *pairs]):
                log.warning("an input on another partition's stream moved to its own (a producer with the "
                            "partition count from before a resize?)",
                            extra=kv(session=session, stream=stream, to=target))
        return keep, refused

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
        # Replicas first (--replica-acks): entries are acknowledged and effects flushed only
        # once the commits survive a failover; ReplicasBehind leaves them all pending.
        self.replicas.confirm()
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
        streams = self.read_streams(fresh) if read_next else None
        done = [d for stream in keep for d in batch.done.get(stream, ())]
        at: list[int] = []  # where PENDING_DONE's reply is among the MULTI's

        def then(pipe: Any) -> None:
            if done:
                # the producers' pending counts, in the MULTI that acknowledges: exactly once
                at.append(len(pipe.command_stack))
                pipe.eval(PENDING_DONE, len(done), *[k for k, _ in done], *[s for _, s in done])
            for stream, ids in keep.items():
                pipe.xack(stream, self.keys.GROUP, *ids)
                pipe.xdel(stream, *ids)
            if streams:
                pipe.xreadgroup(self.keys.GROUP, self.name, streams, count=self.batch)

        replies = self.outbox.flush_many(effects, then=then, pipe=pipe)
        if at and replies:
            pending_skipped(replies[at[0]], [k for k, _ in done])
        if streams and replies:
            batch.ahead = replies[-1]


def wrong_tenant(producer: Producer, prep: Prepared, fields: dict[Any, Any]) -> Refused:
    """An entry of a producer scoped to a tenant naming a session outside it: refused, and
    reported nowhere but the rejected stream (Applier.reject). It uses up no idempotency key:
    the session is not the producer's to write."""
    input_type, ids = input_refs(fields)
    return Refused(InputError(f"wrong_tenant: producer {producer.name} may write only sessions of "
                              f"tenant {producer.tenant}, not {prep.session}", input_type, ids),
                   code=RefusalCode.WRONG_TENANT)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
