"""`AsyncClient`: the producer's client on `redis.asyncio`, with the methods of `Client`, running
the same steps (parley/client/core.py): the two differ only in how they wait for Redis."""

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, overload

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley.client.core import Command, Core, Each, Face, Op, Request, Round, T
from parley.client.export import SessionExport
from parley.client.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage, OpenInterrupt
from parley.client.producer import DEFAULT_MOVED_TIMEOUT_S, InputValue, pipeline_of, typed_event
from parley.client.sessions import SessionPage
from parley.schemas.deltas import Delta
from parley.schemas.events import Event
from parley.schemas.keys import Keys
from parley.schemas.resumes import CloseOutcome, ResumeOutcome
from parley.schemas.shards import Placement


class AsyncClient(Face):
    """`redis`: the deployment's Redis, or its shards' clients in the deployment's order; the
    placement is read through them, as `Client` reads it (see `Client` for the routing).
    `producer`, `moved_timeout_s`: as `Client`'s."""

    def __init__(self, redis: Redis | Sequence[Redis], prefix: str = "parley", producer: str | None = None,
                 *, moved_timeout_s: float = DEFAULT_MOVED_TIMEOUT_S):
        self.clients: list[Redis] = list(redis) if isinstance(redis, Sequence) else [redis]
        self.core = Core(Keys(prefix), self.clients, producer, moved_timeout_s)
        #: the first shard's client (the only one with one Redis)
        self.redis = self.clients[0]

    @property
    def sharded(self) -> bool:
        return self.core.sharded

    @property
    def placement(self) -> Placement | None:
        """The placement read last (None: not yet, or one Redis)."""
        return self.core.placed.placement

    async def _do(self, request: Request) -> Any:
        if isinstance(request, Round):
            return await pipeline_of(self.clients[request.shard], request.calls).execute()
        if isinstance(request, Each):  # the shards' reads at once
            if not request.unreachable_ok:
                return await asyncio.gather(*(self._run(op) for op in request.ops))
            got = await asyncio.gather(*(self._run(op) for op in request.ops), return_exceptions=True)
            for result in got:  # only a shard that does not answer is a result; anything else raises
                if isinstance(result, BaseException) and not isinstance(
                        result, (RedisConnectionError, RedisTimeoutError)):
                    raise result
            return got
        if not isinstance(request, Command):
            return await asyncio.sleep(request.seconds)
        method = getattr(self.clients[request.shard], request.call.name)
        try:
            return await method(*request.call.args, **request.call.kwargs)
        except ResponseError as err:
            if not request.refusable:
                raise
            return err
        except (RedisConnectionError, RedisTimeoutError) as err:
            if not request.unreachable_ok:
                raise
            return err

    async def _run(self, op: Op[T]) -> T:
        """Await what `op` asks, one request at a time, and return its result."""
        reply = None
        try:
            while True:
                reply = await self._do(op.send(reply))
        except StopIteration as done:
            return done.value

    async def refresh(self) -> Placement | None:
        """The newest placement any shard holds (see `Shards.refresh`); PlacementError when the
        URLs are not the deployment's shards in order."""
        return await self._run(self.core.refresh())

    async def index_of_session(self, session: str) -> int:
        """The shard of `session` (0 with one Redis); the placement is read once, and again
        when a submit is refused `moved`."""
        return await self._run(self.core.shard_of(session))

    async def partitions(self, shard: int = 0) -> int:
        """N, the published partition count (see `Client.partitions`)."""
        return await self._run(self.core.partitions(shard))

    async def stream_for(self, session: str) -> str:
        """The input stream of `session` (see `Client.stream_for`)."""
        return await self._run(self.core.stream_for(session))

    async def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
                   principal: str | None = None, key: str | None = None) -> str:
        """Send one input (see `Client.send`): `InvalidInput` before sending a bad one,
        `SubmitRefused` / `SubmitUnavailable` from the submit function; `moved` is waited out."""
        return await self._run(self.core.send(session, value, idempotency_key, principal, key))

    @overload
    async def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
                     idempotency_key: str | None = None, principal: str | None = None,
                     key: str | None = None, wait: Literal[False] = False,
                     timeout_s: float = 10.0) -> str: ...

    @overload
    async def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
                     idempotency_key: str | None = None, principal: str | None = None,
                     key: str | None = None, wait: Literal[True],
                     timeout_s: float = 10.0) -> ResumeOutcome: ...

    async def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
                     idempotency_key: str | None = None, principal: str | None = None,
                     key: str | None = None, wait: bool = False,
                     timeout_s: float = 10.0) -> str | ResumeOutcome:
        """Send an `interrupt.resume` (see `Client.resume`); with `wait=True`, await its outcome."""
        return await self._run(self.core.resume(session, interrupt_id, payload, idempotency_key, principal,
                                                key, wait, timeout_s))

    @overload
    async def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
                    principal: str | None = None, key: str | None = None, wait: Literal[False] = False,
                    timeout_s: float = 10.0) -> str: ...

    @overload
    async def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
                    principal: str | None = None, key: str | None = None, wait: Literal[True],
                    timeout_s: float = 10.0) -> CloseOutcome: ...

    async def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
                    principal: str | None = None, key: str | None = None, wait: bool = False,
                    timeout_s: float = 10.0) -> str | CloseOutcome:
        """Send a `session.close` (see `Client.close`); with `wait=True`, await its outcome."""
        op = self.core.close(session, reason, idempotency_key, principal, key, wait, timeout_s)
        return await self._run(op)

    async def last_event_id(self, session: str) -> str:
        """The id of the session's newest event now ("0-0": none yet): `events(session, after=...)`
        from it yields only what happens from then on."""
        return await self._run(self.core.last_event_id(session))

    async def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
                     until: float | None = None, *, deltas: bool = False
                     ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline); a session whose partition moved is followed; with `deltas`, the
        pieces of model replies being generated come too (see `Client.events`)."""
        follow = await self._run(self.core.follow(session, after, block_ms, until, deltas))
        while follow.going():
            for entry_id, event in follow.take(await self._run(follow.read())):
                yield entry_id, event

    async def watch(self, session: str, after: str = "0-0", until: float | None = None,
                    block_ms: int = 1000, *, deltas: bool = False
                    ) -> AsyncIterator[tuple[str, Event | Delta]]:
        """`events`, typed: (id, event model of schemas/events.py, or with `deltas` a `Delta`)."""
        async for entry_id, event in self.events(session, after, block_ms, until, deltas=deltas):
            yield entry_id, typed_event(event)

    async def batches(self, session: str, after: str = "0-0", block_ms: int = 1000, *,
                      deltas: bool = False) -> AsyncIterator[list[tuple[str, Event | Delta]]]:
        """`watch`, one blocking read at a time, for ever: each read's typed entries, an empty list
        when `block_ms` passed with nothing new (so a caller can tell a quiet session, e.g. to
        stop following it once it waits for a person)."""
        follow = await self._run(self.core.follow(session, after, block_ms, None, deltas))
        while True:
            reply = await self._run(follow.read())
            yield [(entry_id, typed_event(event)) for entry_id, event in follow.take(reply)]

    async def show(self, session: str) -> dict[str, Any] | None:
        """The session's state, None when it has no record (see `Client.show`)."""
        return await self._run(self.core.show(session))

    async def export(self, session: str) -> SessionExport:
        """The whole session (see `Client.export`); `NoSuchSession` when it has no record."""
        return await self._run(self.core.export(session))

    async def open_interrupt(self, session: str, interrupt_id: str) -> OpenInterrupt | None:
        """One open interrupt as the listing shows it (see `Client.open_interrupt`)."""
        return await self._run(self.core.open_interrupt(session, interrupt_id))

    async def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                             cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (see `Client.interrupt_page`)."""
        return await self._run(self.core.interrupt_page(where, limit, cursor))

    async def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page."""
        return await self._run(self.core.interrupts(where))

    async def sessions(self, status: str | Iterable[str] | None = None,
                       metadata: Mapping[str, Any] | None = None, created_after: int | None = None,
                       created_before: int | None = None, *, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None, newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (see `Client.sessions`)."""
        op = self.core.sessions(status, metadata, created_after, created_before, limit, cursor, newest_first)
        return await self._run(op)
