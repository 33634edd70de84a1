"""A producer's view of Parley: write inputs (partitioned), read events and sessions.

A thin I/O shell over parley/producer.py, which `AsyncClient` (parley/aclient.py) shares.
"""

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from redis import Redis
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
    check_producer,
    close_input,
    input_fields,
    is_moved,
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
from parley.schemas.shards import Placement
from parley.sessions import SessionFilter, SessionPage
from parley.sessions import page_steps as session_page_steps
from parley.shards import Shards


def shards_of(redis: "Redis | Shards | Sequence[Redis]", keys: Keys) -> Shards:
    """What a client was given, as the shards of its deployment: one Redis (one shard, no
    placement, as before shards), `Shards`, or the shards' clients in the deployment's order."""
    if isinstance(redis, Shards):
        return redis
    if isinstance(redis, Sequence):
        return Shards(list(redis), keys)
    return Shards([redis], keys)


class Client:
    """`redis`: the deployment's Redis, or its shards (`parley.shards.Shards`, or their clients
    in order): every call about one session goes to the session's shard, and listings across
    sessions read every shard and merge (docs/operations.md, "Shards").

    `producer`: submit every input through the submit function to this producer's own
    streams (docs/protocol.md, "Writing inputs"; a deployment with ACLs must name its
    producer). None: XADD to the shared `parley:inputs` streams (development, no ACLs; one
    Redis only: with several shards a send without a producer raises ValueError).
    `moved_timeout_s`: how long a send waits out a partition being moved between shards
    (refused `moved`) before it raises `SubmitUnavailable`."""

    def __init__(self, redis: "Redis | Shards | Sequence[Redis]", prefix: str = "parley",
                 producer: str | None = None, *, moved_timeout_s: float = DEFAULT_MOVED_TIMEOUT_S):
        self.keys = Keys(prefix)
        self.shards = shards_of(redis, self.keys)
        #: the first shard's client (the only one with one Redis)
        self.redis: Redis = self.shards.clients[0]
        self.producer = None if producer is None else check_producer(producer)
        self.moved_timeout_s = moved_timeout_s
        self._partitions: dict[int, int] = {}

    def _redis_of(self, session: str) -> Redis:
        """The client of the shard that holds `session` (the placement is read once, and again
        when a submit is refused `moved`)."""
        return self.shards.for_session(session)

    def _followed(self, session: str, shard: int, reread: Reread) -> int:
        """The session's shard after a read found nothing on `shard`: the placement is read
        again (paced by `reread`), as a move may have taken the session elsewhere."""
        if not self.shards.sharded or not reread.due(time.monotonic()):
            return shard
        self.shards.refresh()
        return self.shards.index_of_session(session)

    def partitions(self, shard: int = 0) -> int:
        """N, the partition count a dispatcher published (on `shard`): read once, not per entry
        (it is fixed once published); 1 until one is, and asked again next time."""
        if shard not in self._partitions:
            n = partitions_of(self.shards.clients[shard].hget(self.keys.config, "partitions"))
            if n is None:
                return 1
            self._partitions[shard] = n
        return self._partitions[shard]

    def stream_for(self, session: str) -> str:
        """docs/protocol.md, "Inputs": the producer's `parley:in:<producer>`, else `parley:inputs`,
        with one partition; `...:<crc32 mod N>` with N (the session's root's partition)."""
        n = self.partitions(self.shards.index_of_session(session))
        if self.producer is not None:
            return self.keys.producer_inputs(self.producer, partition_of(session, n), n)
        return self.keys.inputs_of(session, n)

    def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> str:
        """Send one input (a typed model of schemas/inputs.py, or its JSON as a dict); signed
        (docs/protocol.md, "Inputs") when given a principal and its key. An input a dispatcher
        would refuse raises `InvalidInput` and nothing is sent; one the submit function refuses
        raises `SubmitRefused` (`SubmitUnavailable` while Redis holds no submit function, or
        while the session's partition stays `moved` longer than `moved_timeout_s`)."""
        fields = input_fields(session, value, idempotency_key, principal, key)
        if self.producer is None:
            if self.shards.sharded:
                raise ValueError(SHARDED_NEEDS_PRODUCER)
            return text(self.redis.xadd(self.stream_for(session), fields))
        retry: MovedRetry | None = None
        while True:
            shard = self.shards.index_of_session(session)
            call = submit_call(self.keys, self.producer, session, self.partitions(shard), fields)
            try:
                return text(self.shards.clients[shard].fcall(*call))
            except ResponseError as err:
                error = submit_error(str(err)) or err
            if not is_moved(error):
                raise error from None
            # nothing was written: wait for the move, read where the partition is, send again
            retry = retry or MovedRetry(time.monotonic(), self.moved_timeout_s)
            delay = retry.delay(time.monotonic())
            if delay is None:
                raise retry.gave_up(session) from None
            time.sleep(delay)
            self.shards.refresh()

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
        since = last_id(self._redis_of(session).xrevrange(self.keys.events(session), count=1))
        wait = OutcomeWait(self.send(session, value, idempotency_key, principal, key), since, of)
        deadline = time.monotonic() + timeout_s
        events = self.keys.events(session)
        shard = self.shards.index_of_session(session)  # where the send went (after any `moved` retry)
        reread = Reread()
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            # each read within the socket timeout: a longer wait is several reads, not a
            # TimeoutError that would pass for Redis being down
            client = self.shards.clients[shard]
            block = within_socket_timeout(block_of(left_ms, self.shards.sharded), socket_timeout_of(client))
            reply = client.xread({events: wait.last}, count=100, block=block)
            outcome = wait.read(reply)
            if outcome is not None:
                return outcome
            if not reply:  # the session's partition may have moved meanwhile
                shard = self._followed(session, shard, reread)
        return wait.timed_out(timeout_s)

    def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
               until: float | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline). With several shards, a read that comes back empty reads the
        placement again (at most every second): a session whose partition moved is followed
        to its new shard, from the same event id (a move copies the stream with its ids)."""
        last = after
        key = self.keys.events(session)
        shard = self.shards.index_of_session(session)
        reread = Reread()
        while until is None or time.monotonic() < until:
            client = self.shards.clients[shard]
            reply = client.xread({key: last}, count=100,
                                 block=within_socket_timeout(block_ms, socket_timeout_of(client)))
            if not reply:
                shard = self._followed(session, shard, reread)
            for entry_id, event in xread_events(reply):
                last = entry_id
                yield entry_id, event

    def watch(self, session: str, after: str = "0-0", until: float | None = None,
              block_ms: int = 1000) -> Iterator[tuple[str, Event]]:
        """`events`, typed: (id, event model of schemas/events.py)."""
        return typed_events(self.events(session, after, block_ms, until))

    def show(self, session: str) -> dict[str, Any] | None:
        """The session's state (what `parley show` prints), None when it has no record. With
        several shards, a session not found is looked for again after reading the placement
        again (its partition may have moved since it was last read)."""
        shard = self.shards.index_of_session(session)
        view: dict[str, Any] | None = run_steps(self.shards.clients[shard], show_steps(self.keys, session))
        if view is None and (moved := self._moved_to(session, shard)) is not None:
            view = run_steps(self.shards.clients[moved], show_steps(self.keys, session))
        return view

    def _moved_to(self, session: str, shard: int) -> int | None:
        """After a lookup found nothing on `shard`: the session's shard per the placement read
        again, when it is another (None: it is not, or there is one Redis)."""
        if not self.shards.sharded:
            return None
        self.shards.refresh()
        now = self.shards.index_of_session(session)
        return now if now != shard else None

    def export(self, session: str) -> SessionExport:
        """The whole session: messages as a tree, events, open interrupts (docs/protocol.md,
        "Export and archive"), read in one atomic script; `NoSuchSession` when it has no record
        (looked for again, like `show`, after reading the placement again)."""
        shard = self.shards.index_of_session(session)
        try:
            export: SessionExport = run_steps(self.shards.clients[shard], export_steps(self.keys, session))
        except NoSuchSession:
            moved = self._moved_to(session, shard)
            if moved is None:
                raise
            export = run_steps(self.shards.clients[moved], export_steps(self.keys, session))
        return export

    def open_interrupt(self, session: str, interrupt_id: str) -> inbox.OpenInterrupt | None:
        """One open interrupt as the listing shows it; None when it is not open (answered, timed
        out, cancelled) or was never raised."""
        row: inbox.OpenInterrupt | None = run_steps(
            self._redis_of(session), inbox.one_interrupt_steps(self.keys, session, interrupt_id))
        return row

    def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (docs/protocol.md, "Open interrupts
        across sessions"): O(log n + page) reads, whatever the number open; with several
        shards, one such read of each, merged in the listing's order."""
        flt = where or InterruptFilter()
        if not self.shards.sharded:
            page: InterruptPage = run_steps(self.redis, page_steps(self.keys, flt, limit, cursor))
            return page
        after = inbox.merged_after(flt, cursor)
        pages = [run_steps(r, inbox.shard_page_steps(self.keys, flt, limit, after))
                 for r in self.shards.clients]
        return inbox.merged_page(flt, limit, pages, self._placement_after_read())

    def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page (every shard's,
        in the listing's order)."""
        flt = where or InterruptFilter()
        parts: list[list[dict[str, Any]]] = [run_steps(r, every_row_steps(self.keys, flt))
                                             for r in self.shards.clients]
        if not self.shards.sharded:
            return parts[0]
        return inbox.merged_rows(flt, parts, self._placement_after_read())

    def sessions(self, status: str | Iterable[str] | None = None, metadata: Mapping[str, Any] | None = None,
                 created_after: int | None = None, created_before: int | None = None, *,
                 limit: int = DEFAULT_LIMIT, cursor: str | None = None,
                 newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (docs/operations.md, "The list of sessions"): by
        status (`active`, `parked`, `closed`; one or several; default all), by metadata pairs, by
        creation time (Unix ms, exclusive bounds), oldest first unless `newest_first`. O(log n +
        page) reads, whatever the number of sessions (of each shard, merged, with several).
        ValueError for a bad filter or cursor."""
        where = SessionFilter.of(status, metadata, created_after, created_before, newest_first)
        if not self.shards.sharded:
            page: SessionPage = run_steps(self.redis, session_page_steps(self.keys, where, limit, cursor))
            return page
        after = listing.merged_after(where, cursor)
        pages = [run_steps(r, listing.shard_page_steps(self.keys, where, limit, after))
                 for r in self.shards.clients]
        return listing.merged_page(where, limit, pages, self._placement_after_read())

    def _placement_after_read(self) -> Placement | None:
        """The placement a merged listing keeps each row by (from its session's shard only: a
        move lists its sessions on two shards between its copy and its clean). Read after the
        shards' pages: a move that flipped meanwhile then keeps the target's rows, which the
        pages already hold (it copies before it flips)."""
        return self.shards.refresh()
