"""The outbox flush: the effects a commit left (dispatcher/core/effects.py), done; and the
RQ jobs the commit script enqueues itself (`JobMaker`).

One MULTI does the effects and deletes them from the session's outbox, so a crash
leaves both or neither; an entry is acknowledged only after its flush, so the next
owner of the partition replays it, finds it applied, and flushes what is left.
A transition's jobs do not go through the outbox: `JobMaker` prepares each job's hash as
RQ writes it, and commit.lua writes it with the transition (docs/design.md, "The enqueue
path and the outbox").
"""

import hashlib
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import orjson
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now as utcnow
from rq.utils import utcformat

from parley.dispatcher.core.effects import (
    Cancel,
    Close,
    DeadlineAdd,
    DeadlineRemove,
    Effect,
    Enqueue,
    Idle,
    IndexAdd,
    IndexRemove,
    Listing,
    Report,
    Retire,
    Spawn,
    Stat,
)
from parley.dispatcher.engine_key import EngineKey
from parley.dispatcher.scripts import LUA
from parley.dispatcher.store import load_script
from parley.schemas.jobs import JOBS, JobKind, job_id
from parley.schemas.keys import Keys
from parley.schemas.listing import listing_member
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import ENGINE_PRINCIPAL, engine_input_id, job_token, signed_fields, signed_outcome

# Finished jobs leave nothing behind (docs/design.md): outcomes go to our results stream.
RESULT_TTL = 0
FAILURE_TTL = 24 * 3600

# EVAL, not EVALSHA: inside a MULTI a script missing from the cache (Redis restarted) would fail
# alone at EXEC while the job's push went through, leaving a job with no in-flight record.
# Likewise for the interrupt index: its counts must move with it or not at all.
# The in-flight numbering is commit.lua's too (both require inflight_lib); the index scripts
# share the listing's set names and members (index_lib).
RECORD_INFLIGHT, INDEX_ADD, INDEX_REMOVE, REBUILD_INDEX = (
    LUA.source(name) for name in ("record_inflight", "index_add", "index_remove", "rebuild_index"))
# EVAL too: a retired session's archive entry and its expiry go with the outbox deletion or
# not at all (a NOSCRIPT at EXEC would drop them while the outbox field is deleted).
RETIRE = LUA.source("retire")
#: about how many closed sessions the archive stream keeps (docs/operations.md)
DEFAULT_ARCHIVE_MAXLEN = 10_000


@dataclass(frozen=True, slots=True)
class PreparedJob:
    """One RQ job as its enqueue writes it, for commit.lua: the job hash's fields exactly as
    RQ's `enqueue_job` writes them (so workers, `rq info` and RQ's tools read it as one RQ
    made), the queue it is pushed on, and Parley's in-flight record of it."""

    job_id: str
    #: `rq:job:<id>`, the queue's list key (`rq:queue:<name>`), the queue's in-flight order
    job_key: str
    queue_key: str
    order_key: str
    #: field, value, field, value, ... of the job hash
    fields: list[Any]
    #: the in-flight record (JSON): what the sweeps and the worker's take read
    record: bytes
    #: the job's token key, and the token it holds until a take reads it (schemas/signing.py)
    token_key: str
    token: str


class _Recorder:
    """Stands in for the redis-py pipeline RQ's `enqueue_job(pipeline=)` writes into, and keeps
    what it would have written. RQ 3 writes a job without dependencies, rate limit or TTL as
    SADD rq:queues, HSET of the job hash (its status, then the whole mapping) and RPUSH on the
    queue; any other command is an AttributeError here, so an RQ that starts writing something
    else fails loudly (tests/integration/test_commit_jobs.py compares with RQ's own enqueue)
    instead of being half copied."""

    #: RQ puts a pipeline it is given into MULTI mode unless it already is: what it records is
    #: written by one atomic script, as good as a MULTI
    explicit_transaction = True

    def __init__(self, job_key: str, queue_key: str):
        self.job_key = job_key
        self.queue_key = queue_key
        self.fields: dict[Any, Any] = {}
        self.pushed: list[Any] = []

    def sadd(self, key: str, *values: Any) -> None:
        if key != Queue.redis_queues_keys or list(values) != [self.queue_key]:
            raise ValueError(f"RQ's enqueue added {values!r} to {key!r}: not what commit.lua writes")

    def hset(self, key: str, field: Any = None, value: Any = None, mapping: Any = None) -> None:
        if key != self.job_key:
            raise ValueError(f"RQ's enqueue wrote {key!r}, not the job hash {self.job_key!r}")
        if field is not None:
            self.fields[field] = value
        if mapping:
            self.fields.update(mapping)

    def rpush(self, key: str, *values: Any) -> None:
        if key != self.queue_key:
            raise ValueError(f"RQ's enqueue pushed on {key!r}, not {self.queue_key!r}")
        self.pushed.extend(values)


class JobMaker:
    """A transition's `Enqueue` effects as `PreparedJob`s (RQ's Job.create and enqueue, into a
    `_Recorder` instead of Redis): what the commit script writes, and the outbox's own enqueue of
    an `Enqueue` an older dispatcher left in an outbox."""

    def __init__(self, redis: Redis, keys: Keys, engine_key: EngineKey | None = None):
        self.redis = redis
        self.keys = keys
        # the key each job's token is derived from: the engine's, which no worker can read
        self.engine_key = engine_key or EngineKey(redis, keys)
        self._queues: dict[str, Queue] = {}
        self._templates: dict[tuple[JobKind, str], dict[Any, Any]] = {}

    def queue(self, name: str) -> Queue:
        """An RQ queue by its name in the job table (`JOBS[kind].queue`)."""
        q = self._queues.get(name)
        if q is None:
            q = Queue(self.keys.queue(name), connection=self.redis, serializer=JSONSerializer)
            self._queues[name] = q
        return q

    def prepare(self, session: str, fx: Enqueue, queue: Queue | None = None) -> PreparedJob:
        """The job's hash: its kind's template (what RQ wrote for a sample job of that kind) with
        the fields that differ between jobs filled in as RQ fills them (`_rq_varying`). `queue`:
        another than the kind's own (the outbox's `queue`, which tests point elsewhere)."""
        spec = JOBS[fx.job]
        jid = job_id(session, fx.work, fx.attempt)
        queue = queue or self.queue(spec.queue)
        template = self._templates.get((fx.job, queue.name))
        if template is None:  # per queue too: the hash names its queue (`origin`)
            template = self._templates[(fx.job, queue.name)] = self._template(fx.job, queue)
        fields = {**template, **_rq_varying(spec.func, job_args(session, fx), session, fx)}
        # `digest`: what a worker's take checks before it runs the job (take_job.lua): the
        # function and arguments the dispatcher issued, so that a job hash written or changed
        # by anyone else (workers may write rq:* keys) is never run
        record = orjson.dumps({
            "session": session, "work": fx.work, "attempt": fx.attempt, "kind": fx.job,
            "queue": queue.key, "reply_to": fx.reply_to, "at": int(time.time() * 1000),
            "digest": job_digest(fields["data"])})
        return PreparedJob(jid, Job.redis_job_namespace_prefix + jid, queue.key,
                           self.keys.inflight_order(queue.name), [x for kv in fields.items() for x in kv],
                           record, self.keys.job_token(jid), job_token(self.engine_key.current(), jid))

    def rq_prepare(self, session: str, fx: Enqueue, queue: Queue | None = None) -> dict[Any, Any]:
        """The job hash as RQ's own `Job.create` + `Queue.enqueue_job` write it, recorded."""
        spec = JOBS[fx.job]
        jid = job_id(session, fx.work, fx.attempt)
        queue = queue or self.queue(spec.queue)
        job = Job.create(spec.func, args=[job_args(session, fx)], id=jid, connection=self.redis,
                         serializer=JSONSerializer, timeout=_timeout(fx), result_ttl=RESULT_TTL,
                         failure_ttl=FAILURE_TTL, description=_description(session, fx))
        rec = _Recorder(job.key.decode() if isinstance(job.key, bytes) else job.key, queue.key)
        queue.enqueue_job(job, pipeline=rec)  # type: ignore[arg-type]  # records, writes nothing
        if rec.pushed != [jid]:
            raise ValueError(f"RQ's enqueue pushed {rec.pushed!r}, not the job {jid!r}")
        return rec.fields

    def _template(self, kind: JobKind, queue: Queue) -> dict[Any, Any]:
        """RQ's job hash for a job of this kind, made by RQ twice for two jobs that differ in
        everything a job can (session, work, attempt, time limit, arguments): the fields that
        differ must be exactly those `_rq_varying` fills in, or an RQ that writes a field more,
        or another way, is refused here rather than copied wrong (Job.create and enqueue_job
        cost about ten times what filling a template does: most of a job's preparation)."""
        one = Enqueue(seq=1, job=kind, work="w-1", attempt=1, timeout=30, reply_to="a", app=None,
                      args={"x": 1})
        two = Enqueue(seq=2, job=kind, work="w-2", attempt=2, timeout=61.5, reply_to="b", app="m:f",
                      args={"y": [2]})
        first, second = self.rq_prepare("s-1", one, queue), self.rq_prepare("s-2", two, queue)
        differ = {k for k in first.keys() | second.keys() if first.get(k) != second.get(k)}
        filled = set(_rq_varying("", {}, "", one))
        if not differ <= filled or first.keys() != second.keys():
            raise RuntimeError(f"RQ's job hash changed shape: fields {sorted(map(str, differ - filled))} "
                               "differ between jobs; update JobMaker (dispatcher/enqueue.py)")
        return {k: v for k, v in first.items() if k not in filled}


#: how long a queued job's token waits for its take (7 days): a job taken later finds none, is
#: not run, and is handed back as lost work (a retry is a new job, with a token of its own)
JOB_TOKEN_TTL_MS = 7 * 24 * 3600 * 1000


def job_digest(data: bytes | str) -> str:
    """SHA-1 of a job hash's `data` (RQ's serialized function and arguments), as Lua's
    `redis.sha1hex` computes it in take_job.lua. Not a signature: the record that holds it is
    written by dispatchers only (workers may read parley:inflight, never write it)."""
    return hashlib.sha1(data.encode() if isinstance(data, str) else data, usedforsecurity=False).hexdigest()


def job_args(session: str, fx: Enqueue) -> dict[str, Any]:
    """The one argument of a job's function: its identity, where to answer, and its kind's own."""
    return {"session": session, "work": fx.work, "attempt": fx.attempt, "reply_to": fx.reply_to,
            "app": fx.app, **fx.args}


def _timeout(fx: Enqueue) -> int:
    return max(1, math.ceil(fx.timeout))


def _description(session: str, fx: Enqueue) -> str:
    return f"{fx.work} of {session}"


def _rq_varying(func: str, args: dict[str, Any], session: str, fx: Enqueue) -> dict[str, Any]:
    """The fields of an RQ job hash that differ between Parley's jobs of one kind, as RQ 3 writes
    them: `data` is `Job.data` (the JSON of (function, instance, args, kwargs), zlib-compressed,
    `Job.to_dict`), the times are `utcformat(now())` (one time for both: RQ takes two a few
    microseconds apart), the rest are Job.create's arguments."""
    stamp = utcformat(utcnow())
    return {"created_at": stamp, "enqueued_at": stamp,
            "data": zlib.compress(JSONSerializer.dumps((func, None, [args], {}))),
            "description": _description(session, fx), "timeout": _timeout(fx)}


class Outbox:
    def __init__(self, redis: Redis, keys: Keys, archive_maxlen: int = DEFAULT_ARCHIVE_MAXLEN,
                 jobs: JobMaker | None = None):
        self.redis = redis
        self.keys = keys
        #: the archive stream's approximate cap; 0: closed sessions are not archived
        self.archive_maxlen = archive_maxlen
        self.jobs = jobs or JobMaker(redis, keys)
        self._partitions: int | None = None
        self.engine_key = self.jobs.engine_key  # one copy: the jobs' tokens and the engine's outcomes
        # the gauges' counts, for an index an older dispatcher wrote without them (once per Redis)
        load_script(redis, "count_interrupts")(keys=[keys.interrupt_info, keys.interrupt_anchors, keys.stats])
        # the listing's sets, for an index an older dispatcher wrote without them (once per Redis)
        before_session, after_session = keys.meta("\x00").split("\x00")
        redis.register_script(REBUILD_INDEX)(keys=[keys.interrupt_info, keys.stats],
                                             args=[*self._listing_names(), before_session, after_session])

    def queue(self, name: str) -> Queue:
        """An RQ queue by its name in the job table (`JOBS[kind].queue`)."""
        return self.jobs.queue(name)

    def input_stream(self, session: str) -> str:
        if self._partitions is None:
            raw = self.redis.hget(self.keys.config, "partitions")
            self._partitions = int(raw) if raw else 1
        return self.keys.inputs_of(session, self._partitions)

    def flush_many(self, batch: list[tuple[str, list[Effect]]],
                   then: Callable[[Any], None] | None = None, pipe: Any = None) -> list[Any] | None:
        """Every session's effects and their outbox deletion in one MULTI: one round trip
        (and, with appendfsync always, one fsync) for a whole batch of transitions. `then`
        queues more commands into the same MULTI (the dispatcher's acknowledgement and next
        read); `pipe`, a transaction pipeline the caller may have WATCHed keys on (fencing).
        The replies of the MULTI are returned (None when there was nothing to send)."""
        # An effect is an outbox field (session, seq): each is done once per flush, even when
        # two replays of one session in the batch both collected what its outbox still held.
        seen: set[tuple[str, Any]] = set()
        todo: list[tuple[str, list[Effect]]] = []
        for session, effects in batch:
            fresh = [fx for fx in effects if (session, fx.seq) not in seen]
            seen.update((session, fx.seq) for fx in fresh)
            if fresh:
                todo.append((session, fresh))
        batch = todo
        if not batch and then is None:
            return None
        if pipe is None:
            pipe = self.redis.pipeline(transaction=True)
        # Explicit MULTI first: RQ's enqueue_job(pipeline=) starts one itself otherwise,
        # which fails once an earlier effect has queued a command.
        pipe.multi()
        for session, effects in batch:
            self._queue_effects(pipe, session, effects)
        if then is not None:
            then(pipe)
        replies: list[Any] = pipe.execute()
        return replies

    def _queue_effects(self, pipe: Any, session: str, effects: list[Effect]) -> None:
        for fx in effects:
            match fx:
                case Enqueue():
                    self._enqueue(pipe, session, fx)
                case Cancel():
                    self._cancel(pipe, session, fx)
                case IndexAdd():
                    self._index_add(pipe, session, fx)
                case IndexRemove():
                    self._index_remove(pipe, session, fx)
                case Spawn():
                    self._spawn(pipe, fx)
                case Report():
                    pipe.xadd(fx.stream, self.engine_outcome_fields(fx.outcome))
                case Stat():
                    pipe.hincrby(self.keys.stats, fx.field, fx.delta)
                case Close():
                    self._close(pipe, session, fx)
                case DeadlineAdd():
                    pipe.zadd(self.keys.deadlines, {self.keys.index_member(session, fx.timer): fx.at})
                case DeadlineRemove():
                    pipe.zrem(self.keys.deadlines, self.keys.index_member(session, fx.timer))
                case Retire():
                    self._retire(pipe, session, fx)
                case Idle():
                    if fx.at is None:
                        pipe.zrem(self.keys.idle, session)
                    else:
                        pipe.zadd(self.keys.idle, {session: fx.at})
                case Listing():
                    self._listing(pipe, session, fx)
                case _:
                    assert_never(fx)
        pipe.hdel(self.keys.outbox(session), *[fx.seq for fx in effects])

    def _enqueue(self, pipe: Any, session: str, fx: Enqueue) -> None:
        """The job, and our record of it as in flight (for the unclaimed-work sweep). Only for an
        `Enqueue` an older dispatcher left in an outbox: a transition's jobs are enqueued by its
        commit (store.py). The same writes as commit.lua's, in the flush's MULTI."""
        job = self.jobs.prepare(session, fx, self.queue(JOBS[fx.job].queue))
        pipe.sadd(Queue.redis_queues_keys, job.queue_key)
        pipe.hset(job.job_key, mapping=dict(zip(job.fields[::2], job.fields[1::2], strict=True)))
        pipe.rpush(job.queue_key, job.job_id)
        pipe.eval(RECORD_INFLIGHT, 2, self.keys.inflight, job.order_key, job.job_id, job.record)
        pipe.set(job.token_key, job.token, px=JOB_TOKEN_TTL_MS)

    def _cancel(self, pipe: Any, session: str, fx: Cancel) -> None:
        # Best effort: a queued job is removed; a running model call is stopped by its worker,
        # which watches the in-flight record deleted here (workers/stopping.py); anything else
        # running finishes and its result is dropped by the core (voiding is logical: I4).
        jid = job_id(session, fx.work, fx.attempt)
        queue = self.queue(JOBS[fx.job].queue)
        pipe.lrem(queue.key, 0, jid)
        pipe.delete(Job.key_for(jid))
        pipe.delete(self.keys.job_token(jid))
        pipe.hdel(self.keys.inflight, jid)
        pipe.zrem(self.keys.inflight_order(queue.name), jid)

    def _index_keys(self) -> list[str]:
        k = self.keys
        return [k.interrupt_index, k.interrupt_info, k.deadlines, k.interrupt_anchors, k.stats]

    def _listing_names(self) -> list[str]:
        """The listing's set names, as index_lib.lua takes them."""
        k = self.keys
        return [k.interrupts_by_time, k.interrupts_by_session, k.interrupts_for_anyone,
                k.interrupts_reason_prefix, k.interrupts_principal_prefix]

    def _index_add(self, pipe: Any, session: str, fx: IndexAdd) -> None:
        """Into the index and its listing's sets, the deadlines, and the counts the metrics read
        (index_add.lua). The details are a row of the listing (parley/client/inbox.py, OpenInterrupt)."""
        member = self.keys.index_member(session, fx.interrupt_id)
        # A null field is left out of the row (one row per open interrupt, kept for as long as it
        # is open: most have no deadline, default, principals, schema, metadata or parent); the
        # listing reads a missing field as null (OpenInterrupt), index_lib.lua a missing
        # resumable_by as "anyone". `request` is written even when null: a row without it is an
        # older one the index's rebuild fills from the session's core.
        optional = {"anchor": fx.anchor, "expires_at": fx.deadline, "default": fx.default,
                    "resumable_by": fx.resumable_by, "response_schema": fx.response_schema,
                    "metadata": fx.metadata, "parent": fx.parent}
        details = orjson.dumps({
            "session": session, "interrupt_id": fx.interrupt_id, "reason": fx.reason,
            "request": fx.payload, "raised_at": fx.raised_at,
            **{k: v for k, v in optional.items() if v is not None}})
        pipe.eval(INDEX_ADD, 5, *self._index_keys(), member, fx.raised_at, details,
                  "" if fx.deadline is None else fx.deadline, *self._listing_names())

    def _index_remove(self, pipe: Any, session: str, fx: IndexRemove) -> None:
        pipe.eval(INDEX_REMOVE, 5, *self._index_keys(), self.keys.index_member(session, fx.interrupt_id),
                  *self._listing_names())

    def _retire(self, pipe: Any, session: str, fx: Retire) -> None:
        """Archive the closed session's document and schedule its expiry (retire.lua)."""
        k = self.keys
        pipe.eval(RETIRE, 6, k.meta(session), k.messages(session), k.events(session), k.archive,
                  k.expiring, k.idle, session, fx.closed_at, fx.expires_at, self.archive_maxlen)

    def _listing(self, pipe: Any, session: str, fx: Listing) -> None:
        """Move the session's member between the list of sessions' sets (schemas/listing.py):
        out of the sets it left, into those it entered. ZREM and ZADD do nothing the second
        time, so a flush replayed after a crash leaves the same sets."""
        k = self.keys
        member = listing_member(fx.created_at, session)
        left = [k.sessions_of_metadata(key, value) for key, value in fx.removed]
        entered = [k.sessions_of_metadata(key, value) for key, value in fx.added]
        if fx.before != fx.after:
            if fx.before is not None:
                left.append(k.sessions_of_status(fx.before))
            entered.append(k.sessions_of_status(fx.after))
        for name in left:
            pipe.zrem(name, member)
        for name in entered:
            pipe.zadd(name, {member: 0})

    def _spawn(self, pipe: Any, fx: Spawn) -> None:
        # The child's creation and first message, one input: a spawn either makes its own
        # session with the task in it, or finds the id taken and fails the call.
        spawn = {"type": "session.create", "parent": fx.parent.model_dump(), "task": fx.content}
        if fx.trace is not None:
            spawn["traceparent"] = fx.trace
        self._engine_input(pipe, fx.child, "spawn", spawn)

    def _close(self, pipe: Any, session: str, fx: Close) -> None:
        self._engine_input(pipe, fx.child, "close", {
            "type": "session.close", "reason": fx.reason,
            "parent": {"session": session, "call_id": fx.call_id, "attempt": fx.attempt}})

    def engine_input_fields(self, session: str, purpose: str, value: dict[str, Any],
                            secret: str | None = None) -> dict[str, Any]:
        """The stream fields of an engine input (see `_engine_input`); `secret`: the engine's
        key when the caller has just read it for several inputs."""
        secret = secret if secret is not None else self.engine_key.load()
        key = engine_input_id(secret, session, purpose)
        raw = orjson.dumps(value)
        return {"session": session, "id": key, "input": raw,
                **signed_fields(secret, ENGINE_PRINCIPAL, session, key, raw)}

    def engine_outcome_fields(self, outcome: WorkOutcome) -> dict[str, bytes | str]:
        """A results-stream entry of an outcome only the engine makes (a sub-agent's report),
        signed with the engine's key, read afresh (engine_key.py), which workers do not hold: a
        worker can write to results streams, never such an outcome."""
        return signed_outcome(self.engine_key.load(), outcome.model_dump_json().encode())

    def _engine_input(self, pipe: Any, session: str, purpose: str, value: dict[str, Any]) -> None:
        """An input of the engine's own, signed with the engine's key when it is written (not
        when committed: an outbox flushed late is still inside the signature's window), so it
        passes --require-signing and no producer can write one. Its idempotency key, the same
        on every flush and derived from the key, makes a second flush (after a crash) a no-op
        and cannot be used up by a producer first. The key is read afresh (engine_key.py)."""
        pipe.xadd(self.input_stream(session), self.engine_input_fields(session, purpose, value))
