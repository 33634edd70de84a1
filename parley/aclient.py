"""`AsyncClient`: the producer's client on `redis.asyncio`, with the methods of `Client`.

A thin I/O shell over parley/producer.py, like `Client`: the two differ only in how they
wait for Redis.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, overload

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from parley import inbox
from parley import sessions as listing
from parley.export import NoSuchSession, SessionExport, export_steps
from parley.follow import Reread, block_of, socket_timeout_of, within_socket_timeout
from parley.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage, every_row_steps, page_steps
from parley.producer import (
    DEFAULT_MOVED_TIMEOUT_S,
    SHARDED_NEEDS_PRODUCER,
    InputValue,
    MovedRetry,
    OutcomeWait,
    Steps,
    check_producer,
    close_input,
    input_fields,
    is_moved,
    last_id,
    partitions_of,
    pipeline_of,
    resume_input,
    show_steps,
    submit_call,
    submit_error,
    text,
    xread_events,
)
from parley.schemas.events import EVENT_ADAPTER, Event
from parley.schemas.inputs import Input
from parley.schemas.keys import Keys, partition_of
from parley.schemas.resumes import CLOSE, RESUME, CloseOutcome, OutcomeOf, OutcomeT, ResumeOutcome
from parley.schemas.shards import Placement, PlacementError, newest_placement_of
from parley.sessions import SessionFilter, SessionPage
from parley.sessions import page_steps as session_page_steps
from parley.shards import VIEW_FIELDS, view_of


async def run_steps(redis: Redis, steps: Steps) -> Any:
    """Drive `steps` on an asyncio Redis (see producer.run_steps)."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send(await pipeline_of(redis, calls).execute())
    except StopIteration as done:
        return done.value


class AsyncClient:
    """`redis`: the deployment's Redis, or its shards' clients in the deployment's order; the
    placement is read through them, as `Client` reads it (see `Client` for the routing).
    `producer`, `moved_timeout_s`: as `Client`'s."""

    def __init__(self, redis: Redis | Sequence[Redis], prefix: str = "parley", producer: str | None = None,
                 *, moved_timeout_s: float = DEFAULT_MOVED_TIMEOUT_S):
        self.clients: list[Redis] = list(redis) if isinstance(redis, Sequence) else [redis]
        if not self.clients:
            raise ValueError("a deployment needs at least one Redis")
        #: the first shard's client (the only one with one Redis)
        self.redis = self.clients[0]
        self.keys = Keys(prefix)
        self.producer = None if producer is None else check_producer(producer)
        self.moved_timeout_s = moved_timeout_s
        self.placement: Placement | None = None
        self._partitions: dict[int, int] = {}

    @property
    def sharded(self) -> bool:
        return len(self.clients) > 1

    async def refresh(self) -> Placement | None:
        """The newest placement any shard holds (see `Shards.refresh`); PlacementError when the
        URLs are not the deployment's shards in order."""
        if not self.sharded:
            return None
        views = [view_of(i, await r.hmget(self.keys.config, VIEW_FIELDS)) for i, r in enumerate(self.clients)]
        self.placement = newest_placement_of(views)
        return self.placement

    async def _followed(self, session: str, shard: int, reread: Reread) -> int:
        """The session's shard after a read found nothing on `shard` (see `Client._followed`)."""
        if not self.sharded or not reread.due(time.monotonic()):
            return shard
        await self.refresh()
        return await self.index_of_session(session)

    async def _moved_to(self, session: str, shard: int) -> int | None:
        """After a lookup found nothing on `shard` (see `Client._moved_to`)."""
        if not self.sharded:
            return None
        await self.refresh()
        now = await self.index_of_session(session)
        return now if now != shard else None

    async def index_of_session(self, session: str) -> int:
        """The shard of `session` (0 with one Redis); the placement is read once, and again
        when a submit is refused `moved`."""
        if not self.sharded:
            return 0
        if self.placement is None and await self.refresh() is None:
            raise PlacementError("the shards hold no placement yet: start a dispatcher first")
        assert self.placement is not None
        return self.placement.shard_of_session(session)

    async def _redis_of(self, session: str) -> Redis:
        return self.clients[await self.index_of_session(session)]

    async def partitions(self, shard: int = 0) -> int:
        """N, the published partition count (see `Client.partitions`)."""
        if shard not in self._partitions:
            n = partitions_of(await self.clients[shard].hget(self.keys.config, "partitions"))
            if n is None:
                return 1
            self._partitions[shard] = n
        return self._partitions[shard]

    async def stream_for(self, session: str) -> str:
        """The input stream of `session` (see `Client.stream_for`)."""
        n = await self.partitions(await self.index_of_session(session))
        if self.producer is not None:
            return self.keys.producer_inputs(self.producer, partition_of(session, n), n)
        return self.keys.inputs_of(session, n)

    async def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
                   principal: str | None = None, key: str | None = None) -> str:
        """Send one input (see `Client.send`): `InvalidInput` before sending a bad one,
        `SubmitRefused` / `SubmitUnavailable` from the submit function; `moved` is waited out."""
        fields = input_fields(session, value, idempotency_key, principal, key)
        if self.producer is None:
            if self.sharded:
                raise ValueError(SHARDED_NEEDS_PRODUCER)
            return text(await self.redis.xadd(await self.stream_for(session), fields))
        retry: MovedRetry | None = None
        while True:
            shard = await self.index_of_session(session)
            call = submit_call(self.keys, self.producer, session, await self.partitions(shard), fields)
            try:
                return text(await self.clients[shard].fcall(*call))
            except ResponseError as err:
                error = submit_error(str(err)) or err
            if not is_moved(error):
                raise error from None
            retry = retry or MovedRetry(time.monotonic(), self.moved_timeout_s)
            delay = retry.delay(time.monotonic())
            if delay is None:
                raise retry.gave_up(session) from None
            await asyncio.sleep(delay)
            await self.refresh()

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
        value = resume_input(interrupt_id, payload)
        if not wait:
            return await self.send(session, value, idempotency_key, principal, key)
        return await self._send_and_wait(session, value, RESUME, timeout_s, idempotency_key, principal, key)

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
        value = close_input(reason)
        if not wait:
            return await self.send(session, value, idempotency_key, principal, key)
        return await self._send_and_wait(session, value, CLOSE, timeout_s, idempotency_key, principal, key)

    async def _send_and_wait(self, session: str, value: Input, of: OutcomeOf[OutcomeT], timeout_s: float,
                             idempotency_key: str | None, principal: str | None,
                             key: str | None) -> OutcomeT:
        """Send `value` and await what became of it (see `Client._send_and_wait`)."""
        since = last_id(await (await self._redis_of(session)).xrevrange(self.keys.events(session), count=1))
        wait = OutcomeWait(await self.send(session, value, idempotency_key, principal, key), since, of)
        deadline = time.monotonic() + timeout_s
        events = self.keys.events(session)
        shard = await self.index_of_session(session)  # where the send went (after any `moved` retry)
        reread = Reread()
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            # each read within the socket timeout: a longer wait is several reads, not a
            # TimeoutError that would pass for Redis being down
            client = self.clients[shard]
            block = within_socket_timeout(block_of(left_ms, self.sharded), socket_timeout_of(client))
            reply = await client.xread({events: wait.last}, count=100, block=block)
            outcome = wait.read(reply)
            if outcome is not None:
                return outcome
            if not reply:  # the session's partition may have moved meanwhile
                shard = await self._followed(session, shard, reread)
        return wait.timed_out(timeout_s)

    async def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
                     until: float | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline); a session whose partition moved is followed (see `Client.events`)."""
        last = after
        key = self.keys.events(session)
        shard = await self.index_of_session(session)
        reread = Reread()
        while until is None or time.monotonic() < until:
            client = self.clients[shard]
            reply = await client.xread({key: last}, count=100,
                                       block=within_socket_timeout(block_ms, socket_timeout_of(client)))
            if not reply:
                shard = await self._followed(session, shard, reread)
            for entry_id, event in xread_events(reply):
                last = entry_id
                yield entry_id, event

    async def watch(self, session: str, after: str = "0-0", until: float | None = None,
                    block_ms: int = 1000) -> AsyncIterator[tuple[str, Event]]:
        """`events`, typed: (id, event model of schemas/events.py)."""
        async for entry_id, event in self.events(session, after, block_ms, until):
            yield entry_id, EVENT_ADAPTER.validate_python(event)

    async def show(self, session: str) -> dict[str, Any] | None:
        """The session's state, None when it has no record (see `Client.show`)."""
        shard = await self.index_of_session(session)
        view: dict[str, Any] | None = await run_steps(self.clients[shard], show_steps(self.keys, session))
        if view is None and (moved := await self._moved_to(session, shard)) is not None:
            view = await run_steps(self.clients[moved], show_steps(self.keys, session))
        return view

    async def export(self, session: str) -> SessionExport:
        """The whole session (see `Client.export`); `NoSuchSession` when it has no record."""
        shard = await self.index_of_session(session)
        try:
            export: SessionExport = await run_steps(self.clients[shard], export_steps(self.keys, session))
        except NoSuchSession:
            moved = await self._moved_to(session, shard)
            if moved is None:
                raise
            export = await run_steps(self.clients[moved], export_steps(self.keys, session))
        return export

    async def open_interrupt(self, session: str, interrupt_id: str) -> inbox.OpenInterrupt | None:
        """One open interrupt as the listing shows it; None when it is not open (answered, timed
        out, cancelled) or was never raised."""
        shard = await self.index_of_session(session)
        row: inbox.OpenInterrupt | None = await run_steps(
            self.clients[shard], inbox.one_interrupt_steps(self.keys, session, interrupt_id))
        return row

    async def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                             cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (see `Client.interrupt_page`)."""
        flt = where or InterruptFilter()
        if not self.sharded:
            page: InterruptPage = await run_steps(self.redis, page_steps(self.keys, flt, limit, cursor))
            return page
        after = inbox.merged_after(flt, cursor)
        pages = await asyncio.gather(*(run_steps(r, inbox.shard_page_steps(self.keys, flt, limit, after))
                                       for r in self.clients))
        return inbox.merged_page(flt, limit, pages, await self.refresh())  # after: see `Client`

    async def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page."""
        flt = where or InterruptFilter()
        parts: list[list[dict[str, Any]]] = [await run_steps(r, every_row_steps(self.keys, flt))
                                             for r in self.clients]
        if not self.sharded:
            return parts[0]
        return inbox.merged_rows(flt, parts, await self.refresh())

    async def sessions(self, status: str | Iterable[str] | None = None,
                       metadata: Mapping[str, Any] | None = None, created_after: int | None = None,
                       created_before: int | None = None, *, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None, newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (see `Client.sessions`)."""
        where = SessionFilter.of(status, metadata, created_after, created_before, newest_first)
        if not self.sharded:
            steps = session_page_steps(self.keys, where, limit, cursor)
            page: SessionPage = await run_steps(self.redis, steps)
            return page
        after = listing.merged_after(where, cursor)
        pages = await asyncio.gather(*(run_steps(r, listing.shard_page_steps(self.keys, where, limit, after))
                                       for r in self.clients))
        return listing.merged_page(where, limit, pages, await self.refresh())
