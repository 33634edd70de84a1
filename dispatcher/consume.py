"""Streams and consumer groups: read, apply, flush, acknowledge; leases over partitions.

Each partition (SPEC 2) is read by one dispatcher at a time, the holder of its lease;
a new holder first claims every entry still pending in the group (the previous
holder's unacknowledged work), then reads new ones. An entry is acknowledged (and
deleted, so the streams stay trimmed) only after its transition is committed and its
outbox flushed; replaying an applied entry is a no-op that flushes what is left.
"""

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from pydantic import ValidationError
from redis import Redis
from redis.exceptions import BusyLoadingError, RedisError, ResponseError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Job

from parley import metrics
from parley.dispatcher.core import AppInfo, Context, Effect, Limits, Transition, apply_input, apply_outcome
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.store import COMMITTED, CONFLICT, IDEMPOTENCY_TTL_S, LEASE_LOST, Store, load_script
from parley.logs import kv
from parley.schemas.codec import InputError, decode_input_entry, entry_ids, session_of
from parley.schemas.keys import Keys, partition_of
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import Keyring, Unauthorized
from parley.schemas.state import SessionState

log = logging.getLogger("parley.dispatcher")

REJECTED_MAXLEN = 10_000


class LeaseLost(Exception):
    pass


class PoisonEntry(Exception):
    """Applying an entry raised before anything was committed (its cause is the bug)."""


class CrashPoint:
    """Test hook: `PARLEY_CRASH_AT=<point>:<n>` makes this process SIGKILL itself at the n-th
    transition reaching <point> (before_commit, after_commit, after_flush), so tests can
    place a kill -9 exactly between read and commit, commit and enqueue, flush and ack."""

    def __init__(self, spec: str | None):
        point, _, n = (spec or "").partition(":")
        self.point = point or None
        self.remaining = int(n or 1)

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            log.warning("crash point reached: killing this process", extra=kv(point=point))
            os.kill(os.getpid(), signal.SIGKILL)


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def already_applied(marker: str | None, entry_id: str) -> bool:
    return marker is not None and entry_key(entry_id) <= entry_key(marker)


@dataclass(slots=True)
class Prepared:
    """An entry decoded and verified, waiting for its wave: its session, its idempotency key,
    and its transition as a function of the loaded state and the wave's context."""

    entry_id: str
    fields: dict[Any, Any]
    session: str
    idem: str | None
    compute: Callable[[SessionState, Context], Transition]


@dataclass(slots=True)
class Refused:
    """An entry for the rejected stream (bad, unauthorized, or its decoder raised)."""

    error: InputError
    code: str = "invalid_input"


@dataclass
class Partition:
    n: int
    token: str
    renewed_at: float
    recovered: bool = False
    streams: tuple[str, str] = ("", "")


@dataclass
class Stats:
    applied: int = 0
    replays: int = 0
    rejected: int = 0
    dropped: int = 0
    conflicts: int = 0
    # load-compute-commit rounds of `process` (one per wave of distinct sessions)
    waves: int = 0
    counts: dict[tuple[str, str], int] = field(default_factory=dict)


def get_partitions(redis: Redis, keys: Keys, default: int = 1) -> int:
    """N is published in `parley:config`; the first dispatcher writes its own default."""
    redis.hsetnx(keys.config, "partitions", default)
    raw = redis.hget(keys.config, "partitions")
    return int(raw) if raw else default


class Dispatcher:
    def __init__(self, redis: Redis, keys: Keys, app: AppInfo, *, limits: Limits | None = None,
                 partitions: int = 1, lease_ms: int = 10_000, block_ms: int = 500, batch: int = 100,
                 name: str | None = None, on_transition: Callable[[Transition], None] | None = None,
                 keyring: Keyring | None = None, agents: dict[str, AppInfo] | None = None):
        self.redis = redis
        self.keys = keys
        self.app = app
        self.limits = limits or Limits()
        self.default_partitions = partitions
        self.lease_ms = lease_ms
        self.block_ms = block_ms
        self.batch = batch
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.store = Store(redis, keys)
        self.outbox = Outbox(redis, keys)
        self.owned: dict[int, Partition] = {}
        self.stats = Stats()
        self.on_transition = on_transition
        self.keyring = keyring or Keyring({})
        self.agents = agents or {}
        self.health: metrics.Health | None = None
        self._renew = load_script(redis, "renew_lease")
        self._release = load_script(redis, "release_lease")
        self._fire_deadline = load_script(redis, "fire_deadline")
        self._settle_lost = load_script(redis, "settle_lost")
        self._settle_unclaimed = load_script(redis, "settle_unclaimed")
        self.unclaimed_checked = 0.0
        self.stale_checked = time.monotonic()
        self.deadlines_checked = 0.0
        self.maintained_at = 0.0
        self.lost_checked = 0.0
        self.crash = CrashPoint(os.environ.get("PARLEY_CRASH_AT"))
        # effects committed in the current batch, flushed together before its acknowledgement
        self.unflushed: list[tuple[str, list[Effect]]] = []
        # entries applied in the current tick, acknowledged with the flush (settle)
        self.acks: dict[str, list[str]] = {}
        # the next entries, read in the same round trip as the last tick's acknowledgement
        self.prefetched: Any = None
        self.partitions = 0

    # ---- leases ---------------------------------------------------------------------------

    def maintain_leases(self, rebalance: bool = True) -> None:
        """Renew our leases; between batches, also take or give back partitions so that each
        live dispatcher holds about N / (live dispatchers) of them."""
        now = time.monotonic()
        for p in list(self.owned.values()):
            if now - p.renewed_at < self.lease_ms / 3000:
                continue
            if self._renew(keys=[self.keys.lease(p.n)], args=[p.token, self.lease_ms]):
                p.renewed_at = now
            else:
                log.warning("lease lost", extra=kv(partition=p.n))
                del self.owned[p.n]
        if not rebalance or (self.owned and now - self.maintained_at < self.lease_ms / 3000):
            return
        self.maintained_at = now
        share = self.fair_share()
        while len(self.owned) > share:
            self.release(self.owned[max(self.owned)])
        for n in range(self.partitions):
            if len(self.owned) >= share:
                break
            if n in self.owned:
                continue
            token = f"{self.name}:{secrets.token_hex(4)}"
            if self.redis.set(self.keys.lease(n), token, nx=True, px=self.lease_ms):
                streams = (self.keys.inputs(n, self.partitions), self.keys.results(n, self.partitions))
                for stream in streams:
                    try:
                        self.redis.xgroup_create(stream, self.keys.GROUP, id="0", mkstream=True)
                    except ResponseError as exc:
                        if "BUSYGROUP" not in str(exc):
                            raise
                self.owned[n] = Partition(n=n, token=token, renewed_at=time.monotonic(), streams=streams)
                log.info("lease acquired", extra=kv(partition=n, consumer=self.name))

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

    def lease_fresh(self, p: Partition) -> bool:
        # Stop before the lease can have lapsed; the commit's fencing check is the backstop.
        return time.monotonic() - p.renewed_at < self.lease_ms * 0.8 / 1000

    def release_leases(self) -> None:
        for p in list(self.owned.values()):
            self.release(p)
        self.redis.zrem(self.keys.dispatchers, self.name)

    # ---- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                if not self.partitions:
                    self.partitions = get_partitions(self.redis, self.keys, self.default_partitions)
                self.tick()
                if backoff > 0.1:
                    log.info("redis reachable again", extra=kv(consumer=self.name))
                backoff = 0.1
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
                log.warning("redis unavailable, retrying", extra=kv(error=repr(exc), backoff_s=backoff))
                for p in self.owned.values():
                    p.recovered = False
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except RedisError as exc:
                # A command Redis refused: a bug or a misconfiguration, not an outage. Nothing
                # was acknowledged, so the entry is retried; say loudly why.
                log.exception("redis refused a command, retrying", extra=kv(error=repr(exc)))
                for p in self.owned.values():
                    p.recovered = False  # re-read our own pending entries once back
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        with contextlib.suppress(RedisError):
            self.release_leases()

    def fire_deadlines(self) -> None:
        """Interrupts past their timeout_s: a resume with `default` goes to the results stream.

        Deadlines live in Redis only (no timer anywhere); whichever dispatcher looks first
        fires them, after a restart too. The machine drops one whose interrupt was resumed.
        """
        now = time.monotonic()
        if now - self.deadlines_checked < 0.2:
            return
        self.deadlines_checked = now
        now_ms = int(time.time() * 1000)
        due: Any = self.redis.zrangebyscore(self.keys.deadlines, "-inf", now_ms, start=0, num=100)
        for raw in due or []:
            member = raw.decode() if isinstance(raw, bytes) else raw
            session, _, interrupt_id = member.partition("\x1f")
            outcome = WorkOutcome(session=session, work=interrupt_id, attempt=0, kind="deadline", ok=True)
            stream = self.keys.results_of(session, self.partitions)
            if self._fire_deadline(keys=[self.keys.deadlines, stream],
                                   args=[member, now_ms, outcome.model_dump_json()]):
                log.info("deadline passed", extra=kv(session=session, interrupt=interrupt_id))

    def find_lost_work(self) -> None:
        """Jobs recorded as running on a worker whose heartbeat is gone: hand them back.

        The machine retries decide and LLM jobs and idempotent tools, and settles other
        tools as `worker_lost` (SPEC 6); a result that still arrives later is dropped.
        """
        now = time.monotonic()
        if now - self.lost_checked < 1.0:
            return
        self.lost_checked = now
        running: Any = self.redis.hgetall(self.keys.running)
        if not running:
            return
        records = {job: (raw, orjson.loads(raw)) for job, raw in running.items()}
        workers = sorted({rec["worker"] for _raw, rec in records.values()})
        alive: Any = self.redis.mget([self.keys.worker_alive(w) for w in workers])
        dead = {w for w, beat in zip(workers, alive, strict=True) if beat is None}
        for job, (raw, rec) in records.items():
            if rec["worker"] not in dead:
                continue
            expected = self.keys.results_of(rec["session"], self.partitions)
            if rec.get("reply_to") != expected:
                # Workers may write this hash; a record naming any other stream is not ours
                # to act on (it could aim our XADD at a session's events).
                log.error("ignored a running-job record with a foreign reply_to",
                          extra=kv(job=job, session=rec.get("session")))
                continue
            outcome = WorkOutcome(session=rec["session"], work=rec["work"], attempt=rec["attempt"],
                                  kind=rec["kind"], ok=False, error="worker_lost", lost=True)
            if self._settle_lost(keys=[self.keys.running, rec["reply_to"], self.keys.inflight],
                                 args=[job, raw, outcome.model_dump_json()]):
                metrics.WORK_LOST.labels(rec["kind"]).inc()
                log.warning("worker lost holding a job", extra=kv(
                    worker=rec["worker"], session=rec["session"], work=rec["work"], kind=rec["kind"]))

    UNCLAIMED_AFTER_MS = 15_000

    def find_unclaimed_work(self) -> None:
        """Jobs that left their queue but were never recorded as running: their worker died
        between RQ's dequeue and the job's first line. After 15 s they are lost, like work
        held by a dead worker (a worker alive records its job within milliseconds)."""
        now = time.monotonic()
        if now - self.unclaimed_checked < 5.0:
            return
        self.unclaimed_checked = now
        inflight: Any = self.redis.hgetall(self.keys.inflight)
        now_ms = int(time.time() * 1000)
        old = [(job, raw, orjson.loads(raw)) for job, raw in (inflight or {}).items()]
        old = [(job, raw, rec) for job, raw, rec in old if now_ms - rec["at"] > self.UNCLAIMED_AFTER_MS]
        if not old:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job, _raw, rec in old:
            pipe.hexists(self.keys.running, job)
            pipe.lpos(rec["queue"], job)
        answers: Any = pipe.execute()
        for i, (job, raw, rec) in enumerate(old):
            claimed, position = answers[2 * i], answers[2 * i + 1]
            if claimed or position is not None:
                continue  # running on a live worker (the heartbeat path watches it), or waiting
            if rec.get("reply_to") != self.keys.results_of(rec["session"], self.partitions):
                continue
            outcome = WorkOutcome(session=rec["session"], work=rec["work"], attempt=rec["attempt"],
                                  kind=rec["kind"], ok=False, error="worker_lost", lost=True)
            job_key = Job.key_for(job.decode() if isinstance(job, bytes) else job)
            if self._settle_unclaimed(keys=[self.keys.inflight, self.keys.running, rec["reply_to"], job_key],
                                      args=[job, raw, outcome.model_dump_json()]):
                metrics.WORK_LOST.labels(rec["kind"]).inc()
                log.warning("job dequeued but never started (its worker died)", extra=kv(
                    session=rec["session"], work=rec["work"], kind=rec["kind"]))

    def tick(self) -> None:
        if self.health is not None:
            self.health.beat()
        self.maintain_leases()
        self.fire_deadlines()
        self.find_lost_work()
        self.find_unclaimed_work()
        if not self.owned:
            time.sleep(self.block_ms / 1000)
            return
        # a batch that failed before its flush is replayed: start clean
        self.unflushed = []
        self.acks = {}
        for p in list(self.owned.values()):
            if not p.recovered:
                self.recover(p)
        self.reclaim_stale()
        replies: Any = self.prefetched
        self.prefetched = None
        if not replies:
            replies = self.redis.xreadgroup(self.keys.GROUP, self.name, self.read_streams(),
                                            count=self.batch, block=self.block_ms)
        processed = False
        try:
            for stream, entries in replies or []:
                stream_name = stream.decode() if isinstance(stream, bytes) else stream
                owner = self.partition_of_stream(stream_name)
                if owner is not None:
                    self.process(owner, stream_name, entries, settle=False)
            processed = True
        finally:
            # Entries of partitions given up since the prefetch stay pending: the next owner
            # claims them (recover).
            self.prefetched = self.settle(read_next=processed)

    def read_streams(self) -> dict[Any, Any]:
        return {s: ">" for p in self.owned.values() for s in p.streams}

    def settle(self, read_next: bool = False) -> Any:
        """One MULTI for what this tick did: the effects its commits left in their outboxes,
        the acknowledgement (and deletion) of its entries and, when asked, a non-blocking read
        of the next entries. One round trip (one fsync under `appendfsync always`) instead of
        three. Flush and acknowledgement are atomic: a crash leaves the entries pending and
        their outboxes full, and their replay finds them applied and flushes again.

        Fenced by WATCH on our leases: if one lapsed or changed hands meanwhile (a dispatcher
        stalled past its lease), nothing is flushed, acknowledged or read; the new owner
        replays those entries and flushes their effects once."""
        acks, self.acks = self.acks, {}
        unflushed, self.unflushed = self.unflushed, []
        if not acks:
            return None
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=True)
            try:
                live = list(self.owned.values())
                if live:
                    pipe.watch(*[self.keys.lease(p.n) for p in live])
                # Fresh after the WATCH: each lease was ours when watched, so any change since
                # aborts the EXEC.
                fresh = {p.n for p in live if self.lease_fresh(p)}
                if len(fresh) < len(live) and attempt == 1:
                    pipe.reset()
                    self.maintain_leases(rebalance=False)
                    continue
                keep = {stream: ids for stream, ids in acks.items()
                        if (owner := self.partition_of_stream(stream)) is not None and owner.n in fresh}
                if not keep:
                    return None
                effects = [(session, fx) for session, fx in unflushed
                           if partition_of(session, max(1, self.partitions)) in fresh]
                streams = {s: ">" for p in live if p.n in fresh for s in p.streams} if read_next else None

                def then(pipe: Any, keep: dict[str, list[str]] = keep,
                         streams: dict[Any, Any] | None = streams) -> None:
                    for stream, ids in keep.items():
                        pipe.xack(stream, self.keys.GROUP, *ids)
                        pipe.xdel(stream, *ids)
                    if streams:
                        pipe.xreadgroup(self.keys.GROUP, self.name, streams, count=self.batch)

                replies = self.outbox.flush_many(effects, then=then, pipe=pipe)
            except WatchError:
                log.warning("a lease changed while settling; leaving the entries to its owner")
                self.maintain_leases(rebalance=False)
                return None
            finally:
                pipe.reset()
            self.crash.reached("after_flush")
            return replies[-1] if streams and replies else None
        return None

    STALE_CHECK_S = 5.0

    def reclaim_stale(self) -> None:
        """Entries of our partitions pending for longer than a lease under any consumer: read
        by a dispatcher that then lost the partition (or by us, before an error). Nobody else
        will apply them; claim and apply them (a replay of an applied one is a no-op)."""
        now = time.monotonic()
        if now - self.stale_checked < self.STALE_CHECK_S:
            return
        self.stale_checked = now
        for p in list(self.owned.values()):
            if not p.recovered:
                continue
            for stream in p.streams:
                reply: Any = self.redis.xautoclaim(stream, self.keys.GROUP, self.name,
                                                   min_idle_time=self.lease_ms, start_id="0-0",
                                                   count=self.batch)
                entries = [e for e in reply[1] if e and e[1] is not None]
                if entries:
                    log.warning("claimed entries left pending by another consumer",
                                extra=kv(stream=stream, count=len(entries)))
                    self.process(p, stream, entries)

    def partition_of_stream(self, stream: str) -> Partition | None:
        for p in self.owned.values():
            if stream in p.streams:
                return p
        return None

    def recover(self, p: Partition) -> None:
        """Claim and apply every entry still pending in the group, oldest first."""
        for stream in p.streams:
            cursor = "0-0"
            while True:
                reply = self.redis.xautoclaim(stream, self.keys.GROUP, self.name, min_idle_time=0,
                                              start_id=cursor, count=self.batch)
                cursor = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                entries = [e for e in reply[1] if e and e[1] is not None]
                if entries:
                    log.info("replaying pending entries", extra=kv(stream=stream, count=len(entries)))
                    self.process(p, stream, entries)
                if cursor == "0-0":
                    break
        p.recovered = True

    def process(self, p: Partition, stream: str, entries: list[Any], settle: bool = True) -> None:
        """Apply a batch of one stream's entries, in waves, then flush and acknowledge it.

        Each entry is decoded and checked first (a bad one is rejected at once, after the
        entries of its session that precede it). The rest run in waves: wave k holds the
        k-th entry of every session, so a session's entries keep their stream order and a
        wave costs two round trips whatever its size (`apply_wave`)."""
        done: list[str] = []
        inputs = stream == p.streams[0]
        try:
            queued: list[Prepared] = []
            sessions: set[str] = set()
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                try:
                    prep = self.prepare_input(entry_id, fields) if inputs else \
                        self.prepare_outcome(entry_id, fields)
                except PoisonEntry as poison:
                    prep = self.poisoned(stream, entry_id, poison.__cause__)
                if isinstance(prep, Prepared):
                    queued.append(prep)
                    sessions.add(prep.session)
                    continue
                # A rejection writes to its session (an event, the idempotency key): what
                # precedes it there is applied first.
                session = session_of(fields)
                if session is not None and session in sessions:
                    self.apply_waves(p, stream, queued, done)
                    queued, sessions = [], set()
                self.check_lease(p)
                self.reject(stream, entry_id, fields, prep.error, code=prep.code)
                done.append(entry_id)
            self.apply_waves(p, stream, queued, done)
        except LeaseLost:
            log.warning("lease lost mid-batch; leaving the rest to the next owner",
                        extra=kv(partition=p.n))
            self.owned.pop(p.n, None)
        finally:
            if done:
                self.acks.setdefault(stream, []).extend(done)
            if settle:
                self.settle()

    def check_lease(self, p: Partition) -> None:
        if not self.lease_fresh(p):
            self.maintain_leases(rebalance=False)
            if p.n not in self.owned or not self.lease_fresh(p):
                raise LeaseLost()

    def apply_waves(self, p: Partition, stream: str, queued: list[Prepared], done: list[str]) -> None:
        """Split entries (in stream order) into waves where each session appears at most once:
        a session's n-th entry goes to wave n. Sessions are independent of each other (a
        transition reads and writes its own session only), so only their own order matters."""
        waves: list[list[Prepared]] = []
        depth: dict[str, int] = {}
        for prep in queued:
            n = depth.get(prep.session, 0)
            depth[prep.session] = n + 1
            if n == len(waves):
                waves.append([])
            waves[n].append(prep)
        for wave in waves:
            self.check_lease(p)
            self.apply_wave(p, stream, wave, done)

    def apply_wave(self, p: Partition, stream: str, wave: list[Prepared], done: list[str]) -> None:
        """Distinct sessions: one round trip loads them all, the transitions are computed,
        one round trip commits them all (a pipeline of EVALSHAs, each atomic and fenced by
        itself). Each commit's answer is then handled as `apply` would."""
        started = time.perf_counter()
        self.stats.waves += 1
        loaded = self.store.load_many([(prep.session, prep.idem) for prep in wave])
        ctx = self.context(p)
        ready: list[tuple[Prepared, str, Transition]] = []
        for prep, (state, version) in zip(wave, loaded, strict=True):
            if already_applied(state.applied.get(stream), prep.entry_id):
                self.replayed(prep.session)
                done.append(prep.entry_id)
                continue
            try:
                tr = prep.compute(state, ctx)
            except Exception as exc:  # nothing of it is committed; the rest of the wave goes on
                self.reject_poisoned(stream, prep.entry_id, prep.fields, exc)
                done.append(prep.entry_id)
                continue
            tr.state.applied[stream] = prep.entry_id
            self.crash.reached("before_commit")
            ready.append((prep, version, tr))
        if not ready:
            return
        rcs = self.store.commit_many([(prep.session, version, tr) for prep, version, tr in ready],
                                     self.keys.lease(p.n), p.token)
        lost = False
        conflicted: list[Prepared] = []
        for (prep, _version, tr), rc in zip(ready, rcs, strict=True):
            if rc == COMMITTED:
                self.committed(prep.session, stream, prep.entry_id, tr, started)
                done.append(prep.entry_id)
            elif rc == LEASE_LOST:
                lost = True  # those committed before it are recorded (flushed, acknowledged)
            else:
                assert rc == CONFLICT
                self.stats.conflicts += 1
                conflicted.append(prep)
        if lost:
            raise LeaseLost()
        for prep in conflicted:
            # Another writer moved the session on between our load and commit: this entry
            # alone, the one-at-a-time way (reload, recompute, commit until it holds).
            try:
                self.handle(p, stream, prep.entry_id, prep.fields, prep)
            except PoisonEntry as poison:
                self.reject_poisoned(stream, prep.entry_id, prep.fields, poison.__cause__)
            done.append(prep.entry_id)

    def poisoned(self, stream: str, entry_id: str, exc: BaseException | None) -> Refused:
        # A bug must not turn one entry into a poison pill that stops its partition for good:
        # nothing of it was committed, so it is kept, with the error, in the rejected stream.
        # (A failure after the commit propagates instead: the entry stays pending and its
        # replay flushes what the commit left.)
        log.error("entry could not be applied; moved to the rejected stream",
                  extra=kv(stream=stream, entry=entry_id), exc_info=exc)
        return Refused(InputError(f"internal error: {type(exc).__name__}: {exc}"))

    def reject_poisoned(self, stream: str, entry_id: str, fields: dict[Any, Any],
                        exc: BaseException | None) -> None:
        refused = self.poisoned(stream, entry_id, exc)
        self.reject(stream, entry_id, fields, refused.error, code=refused.code)

    # ---- one entry ------------------------------------------------------------------------

    def context(self, p: Partition) -> Context:
        return Context(now_ms=int(time.time() * 1000), app=self.app, results_stream=p.streams[1],
                       limits=self.limits, agents=self.agents)

    def prepare_input(self, entry_id: str, fields: dict[Any, Any]) -> Prepared | Refused:
        """Decode and verify an input entry (no I/O); raises PoisonEntry if the decoder fails."""
        try:
            entry = decode_input_entry(fields)
        except InputError as exc:
            return Refused(exc)
        except Exception as exc:  # the decoder's own bug: same as a machine bug
            raise PoisonEntry() from exc
        try:
            principal = self.keyring.verify(fields, int(time.time() * 1000))
        except Unauthorized as exc:
            # Refused before it touches the session: a forged entry must not even use up the
            # idempotency key its `id` names.
            value = entry.input.model_dump(mode="json", exclude_unset=True)
            return Refused(InputError(f"unauthorized: {exc}", entry.input.type, entry_ids(value)),
                           code="unauthorized")
        entry = replace(entry, principal=principal)
        # The state handed to the transition is a fresh load used once: no defensive copy.
        return Prepared(entry_id, fields, entry.session, entry.idempotency_key,
                        lambda state, ctx: apply_input(state, entry, entry_id, ctx, owned=True))

    def prepare_outcome(self, entry_id: str, fields: dict[Any, Any]) -> Prepared | Refused:
        raw = fields.get(b"outcome", fields.get("outcome"))
        try:
            outcome = WorkOutcome.model_validate_json(raw or b"")
        except ValidationError as exc:
            return Refused(InputError(f"invalid work outcome: {exc}"))
        return Prepared(entry_id, fields, outcome.session, None,
                        lambda state, ctx: apply_outcome(state, outcome, ctx, owned=True))

    def handle_input(self, p: Partition, stream: str, entry_id: str, fields: dict[Any, Any]) -> None:
        """One input entry on its own: reject it, or apply it (`apply`)."""
        self.handle(p, stream, entry_id, fields, self.prepare_input(entry_id, fields))

    def handle_outcome(self, p: Partition, stream: str, entry_id: str, fields: dict[Any, Any]) -> None:
        self.handle(p, stream, entry_id, fields, self.prepare_outcome(entry_id, fields))

    def handle(self, p: Partition, stream: str, entry_id: str, fields: dict[Any, Any],
               prep: Prepared | Refused) -> None:
        if isinstance(prep, Refused):
            self.reject(stream, entry_id, fields, prep.error, code=prep.code)
            return
        self.apply(p, stream, entry_id, prep.session, prep.idem,
                   lambda state: prep.compute(state, self.context(p)))

    def apply(self, p: Partition, stream: str, entry_id: str, session: str, idem: str | None,
              transition: Callable[[SessionState], Transition]) -> None:
        """One entry, one round trip at a time: load, compute, commit; again on a conflict."""
        started = time.perf_counter()
        while True:
            state, version = self.store.load(session, idem)
            if already_applied(state.applied.get(stream), entry_id):
                self.replayed(session)
                return
            try:
                tr = transition(state)
            except Exception as exc:
                raise PoisonEntry() from exc
            tr.state.applied[stream] = entry_id
            self.crash.reached("before_commit")
            rc = self.store.commit(session, version, tr, self.keys.lease(p.n), p.token)
            if rc == COMMITTED:
                break
            if rc == LEASE_LOST:
                raise LeaseLost()
            assert rc == CONFLICT
            self.stats.conflicts += 1
        self.committed(session, stream, entry_id, tr, started)

    def replayed(self, session: str) -> None:
        """An entry found applied (a replay after a crash): committed before, maybe not flushed."""
        self.stats.replays += 1
        metrics.REPLAYS.inc()
        self.unflushed.append((session, self.store.pending_effects(session)))

    def committed(self, session: str, stream: str, entry_id: str, tr: Transition, started: float) -> None:
        self.stats.applied += 1
        if tr.dropped:
            self.stats.dropped += 1
            log.info("outcome dropped", extra=kv(session=session, entry=entry_id, why=tr.dropped))
        for key, n in tr.counts.items():
            self.stats.counts[key] = self.stats.counts.get(key, 0) + n
        self.crash.reached("after_commit")
        self.unflushed.append((session, tr.effects))
        metrics.record_transition(tr, time.perf_counter() - started)
        if self.on_transition is not None:
            self.on_transition(tr)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("applied", extra=kv(session=session, stream=stream, entry=entry_id,
                                          events=len(tr.events), effects=len(tr.effects)))

    def reject(self, stream: str, entry_id: str, fields: dict[Any, Any], exc: InputError,
               code: str = "invalid_input") -> None:
        """Bad entries are never lost: copied with the error to the rejected stream, then acked."""
        self.stats.rejected += 1
        metrics.INPUTS.labels(exc.input_type or "unknown", "rejected", code).inc()
        copy: dict[Any, Any] = {k: v for k, v in fields.items()
                                if _field_name(k) not in ("error", "source", "entry")}
        copy.update({"error": str(exc), "source": stream, "entry": entry_id})
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.keys.rejected, copy, maxlen=REJECTED_MAXLEN, approximate=True)
        session = session_of(fields)
        if session is not None:
            event = {"type": "input.refused", "at": int(time.time() * 1000),
                     "input": {"entry": entry_id, "type": exc.input_type, **exc.ids},
                     "code": code, "message": str(exc)}
            pipe.xadd(self.keys.events(session), {"event": orjson.dumps(event)},
                      maxlen=self.store.events_maxlen, approximate=True)
            idem = fields.get(b"id", fields.get("id"))
            # SPEC 3.2: a key counts as used whatever became of its entry (not a forged one's)
            if idem and code == "invalid_input":
                key = idem.decode("utf-8", "replace") if isinstance(idem, bytes) else str(idem)
                pipe.set(self.keys.idempotency(session, key), 1, ex=IDEMPOTENCY_TTL_S)
        pipe.xack(stream, self.keys.GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        pipe.execute()
        log.info("entry rejected", extra=kv(stream=stream, entry=entry_id, session=session,
                                            error=str(exc)[:200]))


def _field_name(key: bytes | str) -> str:
    # Field names are producer bytes: never trust them to be UTF-8.
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else key
