"""Sweeps: work that no stream entry announces, found by looking at Redis on a timer.

(Besides the three below, two sweeps end sessions' lives: `expire_sessions` deletes closed
sessions whose retention has ended, `close_idle_sessions` closes open ones idle too long;
docs/operations.md, "Retention and archive".)

Three things happen without anyone posting them: an interrupt's deadline passes; a worker
dies holding a job; a worker dies between popping a job and recording it as running. Each sweep
turns what it finds into a work outcome on the session's results stream, with a script that
posts it exactly once (every dispatcher sweeps, standbys too, whoever looks first wins); the
machine then applies it like any other outcome. Nothing here holds a lease or touches session
state (docs/design.md, "Pauses the engine makes": deadlines; "Lost work").

A dispatcher of one shard of several acts only on sessions whose partition its shard serves
(`Leases.serves_session`): a partition being moved is nobody's until its move flips, and its
members stay in these sets for its next owner. The sweeps that read the first due members of
a sorted set read past the ones they skip (`due`), so skipped members never starve the rest.
That choice is made on the dispatcher's copy of the placement, read once a lease tick; each
script checks the stored table again (the session's partition is passed to it), so a
dispatcher that stalled across a move's freeze writes nothing for the frozen partition: its
scripts answer SKIPPED.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from redis import Redis
from redis.exceptions import ResponseError
from rq import Queue
from rq.job import Job

from parley.dispatcher.engine_key import EngineKey
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.leases import Leases
from parley.dispatcher.store import evalsha_many, load_script
from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.schemas.codes import CloseReason, SessionStatus
from parley.schemas.jobs import JOBS
from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import listing_entries
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import ENGINE_SIG_FIELD, signed_outcome
from parley.schemas.state import Core

log = logging.getLogger("parley.dispatcher")

#: what a sweep script answers when the stored placement says its shard does not serve the
#: session's partition now (a move froze or took it since this dispatcher read the table)
SKIPPED = -2


def lost_outcome(rec: dict[str, Any]) -> WorkOutcome:
    """What a job of a dead worker comes back as: `worker_lost` (retried or settled by the machine)."""
    return WorkOutcome(session=rec["session"], work=rec["work"], attempt=rec["attempt"],
                       kind=rec["kind"], ok=False, error="worker_lost", lost=True)


class Sweeps:
    """The sweeps, each at its own pace; `run()` does whichever is due."""

    DEADLINES_EVERY_S = 0.2
    LOST_EVERY_S = 1.0
    UNCLAIMED_EVERY_S = 5.0
    UNCLAIMED_STEP_EVERY_S = 0.2
    UNCLAIMED_BATCH = 50
    # a worker alive records its job within milliseconds of taking it
    UNCLAIMED_AFTER_MS = 15_000
    #: the expiry and idle sweeps look this often, and take at most BATCH sessions a step; a
    #: full step is followed by the next one at the next tick (a backlog drains, bounded per tick)
    EXPIRE_EVERY_S = 1.0
    IDLE_EVERY_S = 1.0
    LIFECYCLE_BATCH = 50
    DEADLINES_BATCH = 100
    #: pages of a due set a step reads past members of partitions not served here (a move's):
    #: bounded, so a step stays bounded; a move ends, and its members go with it
    SKIP_PAGES = 10

    def __init__(self, redis: Redis, keys: Keys, leases: Leases, outbox: Outbox | None = None):
        self.redis = redis
        self.keys = keys
        self.leases = leases  # for N, which names each session's results stream
        # the engine's key and the input streams, for the idle sweep's closes (None: no idle sweep)
        self.outbox = outbox
        self.engine_key = outbox.engine_key if outbox is not None else EngineKey(redis, keys)
        self.deadlines_checked = 0.0
        self.lost_checked = 0.0
        self.unclaimed_checked = 0.0
        self.expire_checked = 0.0
        self.idle_checked = 0.0
        self._expire_more = False
        self._idle_more = False
        self._expire_session = load_script(redis, "expire_session")
        self._post_idle_close = load_script(redis, "post_idle_close")
        self._refused_logged: dict[str, float] = {}
        self._fire_deadline = load_script(redis, "fire_deadline")
        self._settle_lost = load_script(redis, "settle_lost")
        self._settle_unclaimed = load_script(redis, "settle_unclaimed")
        self._find_unclaimed = load_script(redis, "find_unclaimed")
        self.queues = sorted({keys.queue(spec.queue) for spec in JOBS.values()})
        # per queue: where its unclaimed-work walk goes on ('' = done, or not started)
        self._cursors: dict[str, str] = {}

    #: a sweep Redis refuses is logged at most this often
    REFUSED_LOG_EVERY_S = 30.0

    def run(self) -> None:
        for name in metrics.SWEEP_NAMES:  # one list: the sweeps, and their series started at 0
            try:
                getattr(self, name)()
            except ResponseError as exc:
                self._refused(name, exc)

    def _refused(self, name: str, exc: ResponseError) -> None:
        """A sweep Redis refuses (an ACL without a command the sweep needs, after an upgrade
        whose users.acl was not loaded; a script error) must not stop the dispatcher from
        applying inputs and outcomes: it is logged, counted, and tried again at its pace. An
        outage (ConnectionError) is not caught here: the loop waits that out as a whole."""
        metrics.SWEEP_ERRORS.labels(name).inc()
        now = time.monotonic()
        if now - self._refused_logged.get(name, float("-inf")) >= self.REFUSED_LOG_EVERY_S:
            self._refused_logged[name] = now
            log.error("a sweep was refused by Redis; inputs are still applied",
                      extra=kv(sweep=name, error=str(exc)))

    def due(self, key: str, now_ms: int, limit: int,
            session_of: Callable[[str], str] = str) -> list[tuple[str, float]]:
        """Up to `limit` (member, score) of sorted set `key` due by `now_ms`, lowest first, whose
        session (`session_of(member)`) this dispatcher serves. Members it skips stay in the set;
        the read goes on past them, page by page, so they cannot hide the members behind them."""
        out: list[tuple[str, float]] = []
        start = 0
        for _ in range(self.SKIP_PAGES):
            raw: Any = self.redis.zrangebyscore(key, "-inf", now_ms, start=start, num=limit, withscores=True)
            page = [(_text(m), float(score)) for m, score in raw or []]
            out += [(m, score) for m, score in page if self.leases.serves_session(session_of(m))]
            start += len(page)
            if len(page) < limit or len(out) >= limit:
                break
        return out[:limit]

    def results_of(self, session: str) -> str:
        return self.keys.results_of(session, self.leases.partitions)

    def partition(self, session: str) -> int:
        """The session's partition, which each sweep script checks against the stored table."""
        return partition_of(session, self.leases.partitions)

    def fire_deadlines(self) -> None:
        """Interrupts past their timeout_s: a resume with `default` goes to the results stream.

        Deadlines live in Redis only (no timer anywhere); whichever dispatcher looks first
        fires them, after a restart too. The machine drops one whose interrupt was resumed.
        """
        now = time.monotonic()
        if now - self.deadlines_checked < self.DEADLINES_EVERY_S:
            return
        self.deadlines_checked = now
        now_ms = int(time.time() * 1000)
        due = self.due(self.keys.deadlines, now_ms, self.DEADLINES_BATCH, lambda m: m.partition("\x1f")[0])
        # signed with the engine's key, read once for the batch: workers write results streams
        # too, and a deadline outcome of theirs is refused (dispatcher/entries.py)
        secret = self.engine_key.load() if due else ""
        for member, _score in due:
            session, _, interrupt_id = member.partition("\x1f")
            outcome = WorkOutcome(session=session, work=interrupt_id, attempt=0, kind="deadline", ok=True)
            fields = signed_outcome(secret, outcome.model_dump_json().encode())
            if self._fire_deadline(keys=[self.keys.deadlines, self.results_of(session), self.keys.config],
                                   args=[member, now_ms, fields["outcome"], self.partition(session),
                                         fields[ENGINE_SIG_FIELD]]) == 1:
                log.info("deadline passed", extra=kv(session=session, interrupt=interrupt_id))

    def find_lost_work(self) -> None:
        """Jobs recorded as running on a worker whose heartbeat is gone: hand them back.

        The machine retries decide and LLM jobs and idempotent tools, and settles other
        tools as `worker_lost` (docs/design.md, "Lost work"); a result that still arrives
        later is dropped.
        """
        now = time.monotonic()
        if now - self.lost_checked < self.LOST_EVERY_S:
            return
        self.lost_checked = now
        running: Any = self.redis.hgetall(self.keys.running)
        if not running:
            return
        records = {job: (raw, rec) for job, raw in running.items()
                   if self.leases.serves_session((rec := orjson.loads(raw))["session"])}
        if not records:
            return
        workers = sorted({rec["worker"] for _raw, rec in records.values()})
        alive: Any = self.redis.mget([self.keys.worker_alive(w) for w in workers])
        dead = {w for w, beat in zip(workers, alive, strict=True) if beat is None}
        for job, (raw, rec) in records.items():
            if rec["worker"] in dead:
                self._post_lost(job, raw, rec)

    def _post_lost(self, job: Any, raw: Any, rec: dict[str, Any]) -> None:
        if rec.get("reply_to") != self.results_of(rec["session"]):
            # Workers may write this hash; a record naming any other stream is not ours
            # to act on (it could aim our XADD at a session's events).
            log.error("ignored a running-job record with a foreign reply_to",
                      extra=kv(job=job, session=rec.get("session")))
            return
        if self._settle_lost(keys=[self.keys.running, rec["reply_to"], self.keys.inflight, self.keys.config],
                             args=[job, raw, lost_outcome(rec).model_dump_json(),
                                   self.partition(rec["session"])]) == 1:
            metrics.WORK_LOST.labels(rec["kind"]).inc()
            log.warning("worker lost holding a job", extra=kv(
                worker=rec["worker"], session=rec["session"], work=rec["work"], kind=rec["kind"]))

    def find_unclaimed_work(self) -> None:
        """Jobs that left their queue but were never recorded as running: their worker died
        between the blocking pop and the record (or a job raised and released its record).
        After 15 s they are lost, like work held by a dead worker.

        Queued jobs are never looked at, however long the queues: each queue's in-flight jobs
        are numbered in push order, so the ones numbered below the queue's head are the ones
        that left it (dispatcher/lua/find_unclaimed.lua). Those are walked with a cursor, at
        most UNCLAIMED_BATCH per queue and step: a walk starts every 5 s and, while it has
        more to see, takes its next step 0.2 s later, so a tick's work stays bounded."""
        now = time.monotonic()
        walking = any(self._cursors.values())
        every = self.UNCLAIMED_STEP_EVERY_S if walking else self.UNCLAIMED_EVERY_S
        if now - self.unclaimed_checked < every:
            return
        self.unclaimed_checked = now
        for name in self.queues:
            if walking and not self._cursors.get(name):
                continue  # this queue's walk is done; wait for the next one
            self._step(name)

    def _step(self, name: str) -> None:
        order = self.keys.inflight_order(name)
        reply: Any = self._find_unclaimed(
            keys=[Queue.redis_queue_namespace_prefix + name, order, self.keys.inflight, self.keys.running],
            args=[self._cursors.get(name, ""), self.UNCLAIMED_BATCH])
        cursor, found = reply[0], reply[1:]
        self._cursors[name] = cursor.decode() if isinstance(cursor, bytes) else cursor
        now_ms = int(time.time() * 1000)
        lost = [(job, raw, rec) for job, raw in zip(found[::2], found[1::2], strict=True)
                # a job popped a moment ago is being recorded by a live worker
                if now_ms - (rec := orjson.loads(raw))["at"] > self.UNCLAIMED_AFTER_MS
                # a partition not served here (being moved) is left to its next owner
                and self.leases.serves_session(rec["session"])]
        if lost:
            self._post_unclaimed(lost, order)

    def _post_unclaimed(self, lost: list[tuple[Any, Any, dict[str, Any]]], order: str) -> None:
        """Post each loss with settle_unclaimed.lua, all in one round trip (one fsync)."""
        # a record naming any other stream is not ours to act on (see _post_lost)
        lost = [(job, raw, rec) for job, raw, rec in lost
                if rec.get("reply_to") == self.results_of(rec["session"])]
        # the script also deletes the RQ job hash, so RQ's own cleanup cannot run it later
        ids = [job.decode() if isinstance(job, bytes) else job for job, _raw, _rec in lost]
        calls = [([self.keys.inflight, self.keys.running, rec["reply_to"],
                   Job.key_for(jid), order, self.keys.config, self.keys.job_token(jid)],
                  [job, raw, lost_outcome(rec).model_dump_json(), self.partition(rec["session"])])
                 for jid, (job, raw, rec) in zip(ids, lost, strict=True)]
        for (_job, _raw, rec), posted in zip(lost, evalsha_many(self.redis, self._settle_unclaimed, calls),
                                             strict=True):
            if posted == 1:
                metrics.WORK_LOST.labels(rec["kind"]).inc()
                log.warning("job dequeued but never started (its worker died)", extra=kv(
                    session=rec["session"], work=rec["work"], kind=rec["kind"]))

    # ---- session lifecycle (docs/operations.md, "Retention and archive") -----------------

    def expire_sessions(self) -> None:
        """Closed sessions whose retention has ended: every key of theirs deleted, and every
        entry naming them (the listing's sets, the expiring and idle sets). Whichever
        dispatcher looks first deletes; the others find nothing to do."""
        now = time.monotonic()
        if not self._expire_more and now - self.expire_checked < self.EXPIRE_EVERY_S:
            return
        self.expire_checked = now
        due = self.due_expiring(int(time.time() * 1000))
        self._expire_more = len(due) == self.LIFECYCLE_BATCH
        if due:
            self.expire(self.read_sessions(due))

    def due_expiring(self, now_ms: int) -> list[str]:
        return [m for m, _ in self.due(self.keys.expiring, now_ms, self.LIFECYCLE_BATCH)]

    def read_sessions(self, sessions: list[str]) -> list[tuple[str, str, Core | None]]:
        """(session, version, core) of each, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for session in sessions:
            pipe.hmget(self.keys.meta(session), "ver", "core")
        out: list[tuple[str, str, Core | None]] = []
        for session, (ver, core) in zip(sessions, pipe.execute(), strict=True):
            out.append((session, ver.decode() if ver else "0",
                        Core.model_validate_json(core) if core else None))
        return out

    def expire(self, read: list[tuple[str, str, Core | None]]) -> int:
        """Delete what `read_sessions` read, each only if its version is still the one read
        (expire_session.lua): a session that moved on since (a late input refused, say) is
        left whole and read again at the next step. Returns how many were deleted."""
        k = self.keys
        calls: list[tuple[list[str], list[Any]]] = []
        for session, version, core in read:
            if core is not None and core.status != SessionStatus.CLOSED:
                # never an open session: only a close puts one in the expiring set
                log.error("an open session was found expiring; left alone", extra=kv(session=session))
                self.redis.zrem(k.expiring, session)
                continue
            partition = self.partition(session)
            # the partition's list of sessions too: expire_session.lua ZREMs each (set, member)
            listed = [*sorted(listing_entries(k, core)), (k.partition_sessions(partition), session)]
            own = k.session_keys(session)
            calls.append(([k.meta(session), k.expiring, k.idle, k.config, *own, *(s for s, _ in listed)],
                          [session, version, len(own), partition, *(m for _, m in listed)]))
        deleted = sum(1 for rc in evalsha_many(self.redis, self._expire_session, calls) if rc == 1)
        if deleted:
            metrics.SESSIONS_EXPIRED.inc(deleted)
            log.info("sessions expired", extra=kv(count=deleted))
        return deleted

    def close_idle_sessions(self) -> None:
        """Open sessions past their idle time: an engine-signed `session.close` (reason `idle`)
        on each one's input stream, written once per idle time (post_idle_close.lua). The
        machine applies it only if the session is still idle (retention.is_idle)."""
        if self.outbox is None:
            return
        now = time.monotonic()
        if not self._idle_more and now - self.idle_checked < self.IDLE_EVERY_S:
            return
        self.idle_checked = now
        due = [(m, int(score)) for m, score in self.due(self.keys.idle, int(time.time() * 1000),
                                                         self.LIFECYCLE_BATCH)]
        self._idle_more = len(due) == self.LIFECYCLE_BATCH
        if not due:
            return
        # one read of the engine's key and one round trip for the whole step, each post atomic
        secret = self.outbox.engine_key.load()
        calls: list[tuple[list[str], list[Any]]] = []
        for session, at in due:
            # purpose names the idle time: a session idle again later gets a fresh idempotency key
            fields = self.outbox.engine_input_fields(
                session, f"idle:{at}", {"type": "session.close", "reason": CloseReason.IDLE}, secret)
            calls.append(([self.keys.idle, self.outbox.input_stream(session), self.keys.config],
                          [session, at, self.partition(session),
                           *(v for pair in fields.items() for v in pair)]))
        for (session, _at), posted in zip(due, evalsha_many(self.redis, self._post_idle_close, calls),
                                          strict=True):
            if posted == 1:
                metrics.IDLE_CLOSES.inc()
                log.info("idle session closing", extra=kv(session=session))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
