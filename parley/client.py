"""A producer's view of Parley: write inputs (partitioned), read events and sessions."""

import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal, overload

import orjson
from redis import Redis

from parley.inbox import DEFAULT_LIMIT, MAX_LIMIT, InterruptFilter, InterruptPage, read_page
from parley.schemas.keys import Keys
from parley.schemas.resumes import ResumeOutcome, is_outcome_of, resume_outcome, timed_out
from parley.schemas.signing import signed_fields
from parley.schemas.state import SessionState
from parley.schemas.view import show


class Client:
    def __init__(self, redis: Redis, prefix: str = "parley"):
        self.redis = redis
        self.keys = Keys(prefix)
        self._partitions: int | None = None

    def stream_for(self, session: str) -> str:
        """docs/protocol.md, "Inputs": `parley:inputs` with one partition, else `parley:inputs:<crc32 mod N>`.

        N is fixed once a dispatcher has published it, so it is read once, not per entry."""
        if self._partitions is None:
            raw = self.redis.hget(self.keys.config, "partitions")
            if not raw:
                return self.keys.inputs_of(session, 1)  # nothing published yet: ask again next time
            self._partitions = int(raw)
        return self.keys.inputs_of(session, self._partitions)

    def send(self, session: str, value: dict[str, Any], idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> str:
        """XADD one input; signed (docs/protocol.md, "Inputs") when given a principal and its key."""
        raw = orjson.dumps(value)
        fields: dict[Any, Any] = {"session": session, "input": raw}
        if principal is not None and key is not None:
            idempotency_key = idempotency_key or uuid.uuid4().hex  # a signed entry needs an id
            fields.update(signed_fields(key, principal, session, idempotency_key, raw))
        if idempotency_key is not None:
            fields["id"] = idempotency_key
        entry: Any = self.redis.xadd(self.stream_for(session), fields)
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    @overload
    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: Literal[False] = False,
               timeout_s: float = 10.0) -> str: ...

    @overload
    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: Literal[True],
               timeout_s: float = 10.0) -> ResumeOutcome: ...

    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: bool = False,
               timeout_s: float = 10.0) -> str | ResumeOutcome:
        """Send an `interrupt.resume`. Returns its entry id, or with `wait=True` what became of
        it (schemas/resumes.py), waiting at most `timeout_s` for the session's events to say."""
        value = {"type": "interrupt.resume", "interrupt_id": interrupt_id, "payload": payload}
        if not wait:
            return self.send(session, value, idempotency_key, principal, key)
        # Read the stream's last id before sending: the outcome is written after it.
        since = self._last_event_id(session)
        entry = self.send(session, value, idempotency_key, principal, key)
        return self._outcome_of(session, entry, since, timeout_s)

    def _last_event_id(self, session: str) -> str:
        last: Any = self.redis.xrevrange(self.keys.events(session), count=1)
        if not last:
            return "0-0"
        raw_id = last[0][0]
        return raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)

    def _outcome_of(self, session: str, entry: str, since: str, timeout_s: float) -> ResumeOutcome:
        """Block on the session's events (XREAD BLOCK, the remaining time at most) until one
        names `entry`, or the time is up."""
        deadline = time.monotonic() + timeout_s
        key, last = self.keys.events(session), since
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            reply: Any = self.redis.xread({key: last}, count=100, block=left_ms)
            for _stream, entries in reply or []:
                for raw_id, fields in entries:
                    last = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                    event = orjson.loads(fields[b"event"] if b"event" in fields else fields["event"])
                    if is_outcome_of(entry, event):
                        return resume_outcome(entry, event)
        return timed_out(entry, timeout_s)

    def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
               until: float | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after`; stops at `until` (a monotonic deadline)."""
        last = after
        key = self.keys.events(session)
        while until is None or time.monotonic() < until:
            reply: Any = self.redis.xread({key: last}, count=100, block=block_ms)
            for _stream, entries in reply or []:
                for raw_id, fields in entries:
                    last = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                    yield last, orjson.loads(fields[b"event"] if b"event" in fields else fields["event"])

    def show(self, session: str) -> dict[str, Any] | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.meta(session), "core")  # the reader's ACL grants HMGET, not HGET
        pipe.hgetall(self.keys.messages(session))
        (core,), messages = pipe.execute()
        if not core:
            return None
        return show(SessionState.from_records(core, messages))

    def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (docs/protocol.md, "Open interrupts
        across sessions"): O(log n + page) reads, whatever the number open."""
        return read_page(self.redis, self.keys, where or InterruptFilter(), limit, cursor)

    def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page."""
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.interrupt_page(where, MAX_LIMIT, cursor)
            rows += [row.model_dump() for row in page.items]
            if page.cursor is None:
                return rows
            cursor = page.cursor
