"""The outbox flush: RQ enqueues, cancels and index updates, done after a commit.

One MULTI does the effects and deletes them from the session's outbox, so a crash
leaves both or neither; an entry is acknowledged only after its flush, so the next
owner of the partition replays it, finds it applied, and flushes what is left.
"""

import math
import time
from collections.abc import Callable
from typing import Any

import orjson
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.schemas.keys import Keys

# Finished jobs leave nothing behind (SPEC 3.2): outcomes go to our results stream.
RESULT_TTL = 0
KIND_OF_QUEUE = {"decide": "decide", "llm": "llm", "tools": "tool"}
FAILURE_TTL = 24 * 3600


class Outbox:
    def __init__(self, redis: Redis, keys: Keys):
        self.redis = redis
        self.keys = keys
        self._queues: dict[str, Queue] = {}
        self._partitions: int | None = None

    def queue(self, kind: str) -> Queue:
        q = self._queues.get(kind)
        if q is None:
            q = Queue(self.keys.queue(kind), connection=self.redis, serializer=JSONSerializer)
            self._queues[kind] = q
        return q

    def input_stream(self, session: str) -> str:
        if self._partitions is None:
            raw = self.redis.hget(self.keys.config, "partitions")
            self._partitions = int(raw) if raw else 1
        return self.keys.inputs_of(session, self._partitions)

    def flush(self, session: str, effects: list[dict[str, Any]]) -> None:
        self.flush_many([(session, effects)])

    def flush_many(self, batch: list[tuple[str, list[dict[str, Any]]]],
                   then: Callable[[Any], None] | None = None, pipe: Any = None) -> list[Any] | None:
        """Every session's effects and their outbox deletion in one MULTI: one round trip
        (and, with appendfsync always, one fsync) for a whole batch of transitions. `then`
        queues more commands into the same MULTI (the dispatcher's acknowledgement and next
        read); `pipe`, a transaction pipeline the caller may have WATCHed keys on (fencing).
        The replies of the MULTI are returned (None when there was nothing to send)."""
        # An effect is an outbox field (session, seq): each is done once per flush, even when
        # two replays of one session in the batch both collected what its outbox still held.
        seen: set[tuple[str, Any]] = set()
        todo: list[tuple[str, list[dict[str, Any]]]] = []
        for session, effects in batch:
            fresh = [fx for fx in effects if (session, fx["seq"]) not in seen]
            seen.update((session, fx["seq"]) for fx in fresh)
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

    def _queue_effects(self, pipe: Any, session: str, effects: list[dict[str, Any]]) -> None:
        for fx in effects:
            op = fx["op"]
            if op == "enqueue":
                queue = self.queue(fx["queue"])
                job = Job.create(fx["func"], args=[fx["payload"]], id=fx["job_id"],
                                 connection=self.redis, serializer=JSONSerializer,
                                 timeout=max(1, math.ceil(fx["timeout"])), result_ttl=RESULT_TTL,
                                 failure_ttl=FAILURE_TTL,
                                 description=f"{fx['payload']['work']} of {session}")
                queue.enqueue_job(job, pipeline=pipe)
                payload = fx["payload"]
                pipe.hset(self.keys.inflight, fx["job_id"], orjson.dumps({
                    "session": payload["session"], "work": payload["work"], "attempt": payload["attempt"],
                    "kind": KIND_OF_QUEUE[fx["queue"]], "queue": queue.key,
                    "reply_to": payload["reply_to"], "at": int(time.time() * 1000)}))
            elif op == "cancel":
                # Best effort: a queued job is removed; a running one finishes and its result
                # is dropped by the machine (voiding is logical, stopping is not relied on).
                queue = self.queue(fx["queue"])
                pipe.lrem(queue.key, 0, fx["job_id"])
                pipe.delete(Job.key_for(fx["job_id"]))
                pipe.hdel(self.keys.inflight, fx["job_id"])
            elif op == "index_add":
                member = self.keys.index_member(session, fx["interrupt_id"])
                pipe.zadd(self.keys.interrupt_index, {member: fx["raised_at"]})
                pipe.hset(self.keys.interrupt_info, member, orjson.dumps({
                    "session": session, "interrupt_id": fx["interrupt_id"], "reason": fx["reason"],
                    "anchor": fx["anchor"], "raised_at": fx["raised_at"], "parent": fx.get("parent")}))
                if fx.get("deadline") is not None:
                    pipe.zadd(self.keys.deadlines, {member: fx["deadline"]})
            elif op == "index_remove":
                member = self.keys.index_member(session, fx["interrupt_id"])
                pipe.zrem(self.keys.interrupt_index, member)
                pipe.hdel(self.keys.interrupt_info, member)
                pipe.zrem(self.keys.deadlines, member)
            elif op == "spawn":
                # The child's first inputs, as a client would send them; their idempotency
                # keys make a second flush (after a crash) a no-op.
                stream = self.input_stream(fx["child"])
                pipe.xadd(stream, {"session": fx["child"], "id": "parley-spawn", "input": orjson.dumps(
                    {"type": "session.create", "parent": fx["parent"]})})
                pipe.xadd(stream, {"session": fx["child"], "id": "parley-task", "input": orjson.dumps(
                    {"type": "message.create", "content": fx["content"]})})
            elif op == "report":
                pipe.xadd(fx["stream"], {"outcome": orjson.dumps(fx["outcome"])})
            elif op == "stat":
                pipe.hincrby(self.keys.stats, fx["field"], fx["delta"])
            else:
                raise ValueError(f"unknown outbox effect {op!r}")
        pipe.hdel(self.keys.outbox(session), *[fx["seq"] for fx in effects])
