"""`AsyncClient`: the producer's client on `redis.asyncio`, with the methods of `Client`.

A thin I/O shell over parley/producer.py, like `Client`: the two differ only in how they
wait for Redis.
"""

import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal, overload

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from parley.export import SessionExport, export_steps
from parley.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage, every_row_steps, page_steps
from parley.producer import (
    InputValue,
    OutcomeWait,
    Steps,
    check_producer,
    close_input,
    input_fields,
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
from parley.sessions import SessionFilter, SessionPage
from parley.sessions import page_steps as session_page_steps


async def run_steps(redis: Redis, steps: Steps) -> Any:
    """Drive `steps` on an asyncio Redis (see producer.run_steps)."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send(await pipeline_of(redis, calls).execute())
    except StopIteration as done:
        return done.value


class AsyncClient:
    """`producer`: as `Client`'s (submit through the submit function to its own streams)."""

    def __init__(self, redis: Redis, prefix: str = "parley", producer: str | None = None):
        self.redis = redis
        self.keys = Keys(prefix)
        self.producer = None if producer is None else check_producer(producer)
        self._partitions: int | None = None

    async def partitions(self) -> int:
        """N, the published partition count (see `Client.partitions`)."""
        if self._partitions is None:
            self._partitions = partitions_of(await self.redis.hget(self.keys.config, "partitions"))
            if self._partitions is None:
                return 1
        return self._partitions

    async def stream_for(self, session: str) -> str:
        """The input stream of `session` (see `Client.stream_for`)."""
        n = await self.partitions()
        if self.producer is not None:
            return self.keys.producer_inputs(self.producer, partition_of(session, n), n)
        return self.keys.inputs_of(session, n)

    async def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
                   principal: str | None = None, key: str | None = None) -> str:
        """Send one input (see `Client.send`): `InvalidInput` before sending a bad one,
        `SubmitRefused` / `SubmitUnavailable` from the submit function."""
        fields = input_fields(session, value, idempotency_key, principal, key)
        if self.producer is None:
            return text(await self.redis.xadd(await self.stream_for(session), fields))
        call = submit_call(self.keys, self.producer, session, await self.partitions(), fields)
        try:
            return text(await self.redis.fcall(*call))
        except ResponseError as err:
            raise submit_error(str(err)) or err from None

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
        since = last_id(await self.redis.xrevrange(self.keys.events(session), count=1))
        wait = OutcomeWait(await self.send(session, value, idempotency_key, principal, key), since, of)
        deadline = time.monotonic() + timeout_s
        events = self.keys.events(session)
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            outcome = wait.read(await self.redis.xread({events: wait.last}, count=100, block=left_ms))
            if outcome is not None:
                return outcome
        return wait.timed_out(timeout_s)

    async def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
                     until: float | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline)."""
        last = after
        key = self.keys.events(session)
        while until is None or time.monotonic() < until:
            reply = await self.redis.xread({key: last}, count=100, block=block_ms)
            for entry_id, event in xread_events(reply):
                last = entry_id
                yield entry_id, event

    async def watch(self, session: str, after: str = "0-0", until: float | None = None,
                    block_ms: int = 1000) -> AsyncIterator[tuple[str, Event]]:
        """`events`, typed: (id, event model of schemas/events.py)."""
        async for entry_id, event in self.events(session, after, block_ms, until):
            yield entry_id, EVENT_ADAPTER.validate_python(event)

    async def show(self, session: str) -> dict[str, Any] | None:
        view: dict[str, Any] | None = await run_steps(self.redis, show_steps(self.keys, session))
        return view

    async def export(self, session: str) -> SessionExport:
        """The whole session (see `Client.export`); `NoSuchSession` when it has no record."""
        export: SessionExport = await run_steps(self.redis, export_steps(self.keys, session))
        return export

    async def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                             cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (see `Client.interrupt_page`)."""
        page: InterruptPage = await run_steps(self.redis, page_steps(self.keys, where or InterruptFilter(),
                                                                     limit, cursor))
        return page

    async def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page."""
        rows: list[dict[str, Any]] = await run_steps(self.redis, every_row_steps(self.keys,
                                                                                where or InterruptFilter()))
        return rows

    async def sessions(self, status: str | Iterable[str] | None = None,
                       metadata: Mapping[str, Any] | None = None, created_after: int | None = None,
                       created_before: int | None = None, *, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None, newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (see `Client.sessions`)."""
        where = SessionFilter.of(status, metadata, created_after, created_before, newest_first)
        page: SessionPage = await run_steps(self.redis, session_page_steps(self.keys, where, limit, cursor))
        return page
