"""A producer's view of Parley: write inputs (partitioned), read events and sessions.

A thin I/O shell over parley/producer.py, which `AsyncClient` (parley/aclient.py) shares.
"""

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, overload

from redis import Redis
from redis.exceptions import ResponseError

from parley.export import SessionExport, export_steps
from parley.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage, every_row_steps, page_steps
from parley.producer import (
    InputValue,
    OutcomeWait,
    check_producer,
    close_input,
    input_fields,
    last_id,
    partitions_of,
    resume_input,
    run_steps,
    show_steps,
    submit_call,
    submit_error,
    text,
    typed_events,
    xread_events,
)
from parley.schemas.events import Event
from parley.schemas.inputs import Input
from parley.schemas.keys import Keys, partition_of
from parley.schemas.resumes import CLOSE, RESUME, CloseOutcome, OutcomeOf, OutcomeT, ResumeOutcome
from parley.sessions import SessionFilter, SessionPage
from parley.sessions import page_steps as session_page_steps


class Client:
    """`producer`: submit every input through the submit function to this producer's own
    streams (docs/protocol.md, "Writing inputs"; a deployment with ACLs must name its
    producer). None: XADD to the shared `parley:inputs` streams (development, no ACLs)."""

    def __init__(self, redis: Redis, prefix: str = "parley", producer: str | None = None):
        self.redis = redis
        self.keys = Keys(prefix)
        self.producer = None if producer is None else check_producer(producer)
        self._partitions: int | None = None

    def partitions(self) -> int:
        """N, the partition count a dispatcher published: read once, not per entry (it is fixed
        once published); 1 until one is, and asked again next time."""
        if self._partitions is None:
            self._partitions = partitions_of(self.redis.hget(self.keys.config, "partitions"))
            if self._partitions is None:
                return 1
        return self._partitions

    def stream_for(self, session: str) -> str:
        """docs/protocol.md, "Inputs": the producer's `parley:in:<producer>`, else `parley:inputs`,
        with one partition; `...:<crc32 mod N>` with N."""
        n = self.partitions()
        if self.producer is not None:
            return self.keys.producer_inputs(self.producer, partition_of(session, n), n)
        return self.keys.inputs_of(session, n)

    def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> str:
        """Send one input (a typed model of schemas/inputs.py, or its JSON as a dict); signed
        (docs/protocol.md, "Inputs") when given a principal and its key. An input a dispatcher
        would refuse raises `InvalidInput` and nothing is sent; one the submit function refuses
        raises `SubmitRefused` (`SubmitUnavailable` while Redis holds no submit function)."""
        fields = input_fields(session, value, idempotency_key, principal, key)
        if self.producer is None:
            return text(self.redis.xadd(self.stream_for(session), fields))
        call = submit_call(self.keys, self.producer, session, self.partitions(), fields)
        try:
            return text(self.redis.fcall(*call))
        except ResponseError as err:
            raise submit_error(str(err)) or err from None

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
        value = resume_input(interrupt_id, payload)
        if not wait:
            return self.send(session, value, idempotency_key, principal, key)
        return self._send_and_wait(session, value, RESUME, timeout_s, idempotency_key, principal, key)

    @overload
    def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
              principal: str | None = None, key: str | None = None, wait: Literal[False] = False,
              timeout_s: float = 10.0) -> str: ...

    @overload
    def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
              principal: str | None = None, key: str | None = None, wait: Literal[True],
              timeout_s: float = 10.0) -> CloseOutcome: ...

    def close(self, session: str, reason: str | None = None, *, idempotency_key: str | None = None,
              principal: str | None = None, key: str | None = None, wait: bool = False,
              timeout_s: float = 10.0) -> str | CloseOutcome:
        """Send a `session.close` (docs/protocol.md): it stops everything the session runs, and
        it takes no more inputs. `reason` (1-256 characters) is reported on `session.closed`
        (`closed` when None). Returns its entry id, or with `wait=True` what became of it
        (schemas/resumes.py, `CloseOutcome`), waiting at most `timeout_s`."""
        value = close_input(reason)
        if not wait:
            return self.send(session, value, idempotency_key, principal, key)
        return self._send_and_wait(session, value, CLOSE, timeout_s, idempotency_key, principal, key)

    def _send_and_wait(self, session: str, value: Input, of: OutcomeOf[OutcomeT], timeout_s: float,
                       idempotency_key: str | None, principal: str | None, key: str | None) -> OutcomeT:
        """Send `value`, then block on the session's events (XREAD BLOCK, the remaining time at
        most) until one tells what became of it, or the time is up."""
        # Read the stream's last id before sending: the outcome is written after it.
        since = last_id(self.redis.xrevrange(self.keys.events(session), count=1))
        wait = OutcomeWait(self.send(session, value, idempotency_key, principal, key), since, of)
        deadline = time.monotonic() + timeout_s
        events = self.keys.events(session)
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            outcome = wait.read(self.redis.xread({events: wait.last}, count=100, block=left_ms))
            if outcome is not None:
                return outcome
        return wait.timed_out(timeout_s)

    def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
               until: float | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline)."""
        last = after
        key = self.keys.events(session)
        while until is None or time.monotonic() < until:
            for entry_id, event in xread_events(self.redis.xread({key: last}, count=100, block=block_ms)):
                last = entry_id
                yield entry_id, event

    def watch(self, session: str, after: str = "0-0", until: float | None = None,
              block_ms: int = 1000) -> Iterator[tuple[str, Event]]:
        """`events`, typed: (id, event model of schemas/events.py)."""
        return typed_events(self.events(session, after, block_ms, until))

    def show(self, session: str) -> dict[str, Any] | None:
        view: dict[str, Any] | None = run_steps(self.redis, show_steps(self.keys, session))
        return view

    def export(self, session: str) -> SessionExport:
        """The whole session: messages as a tree, events, open interrupts (docs/protocol.md,
        "Export and archive"), read in one atomic script; `NoSuchSession` when it has no record."""
        export: SessionExport = run_steps(self.redis, export_steps(self.keys, session))
        return export

    def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (docs/protocol.md, "Open interrupts
        across sessions"): O(log n + page) reads, whatever the number open."""
        page: InterruptPage = run_steps(self.redis, page_steps(self.keys, where or InterruptFilter(),
                                                               limit, cursor))
        return page

    def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page."""
        steps = every_row_steps(self.keys, where or InterruptFilter())
        rows: list[dict[str, Any]] = run_steps(self.redis, steps)
        return rows

    def sessions(self, status: str | Iterable[str] | None = None, metadata: Mapping[str, Any] | None = None,
                 created_after: int | None = None, created_before: int | None = None, *,
                 limit: int = DEFAULT_LIMIT, cursor: str | None = None,
                 newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (docs/operations.md, "The list of sessions"): by
        status (`active`, `parked`, `closed`; one or several; default all), by metadata pairs, by
        creation time (Unix ms, exclusive bounds), oldest first unless `newest_first`. O(log n +
        page) reads, whatever the number of sessions. ValueError for a bad filter or cursor."""
        where = SessionFilter.of(status, metadata, created_after, created_before, newest_first)
        page: SessionPage = run_steps(self.redis, session_page_steps(self.keys, where, limit, cursor))
        return page
