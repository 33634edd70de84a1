"""A producer's view of Parley: write inputs (partitioned), read events and sessions."""

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
from redis import Redis

from parley.inbox import DEFAULT_LIMIT, MAX_LIMIT, InterruptFilter, InterruptPage, read_page
from parley.schemas.keys import Keys
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
