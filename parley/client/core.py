"""The client's core: every operation of `Client` and `AsyncClient` once, as sans-I/O steps.

An operation is a generator (`Op`) that yields what it needs done and receives the reply: one
command on one shard (`Command`), one round trip of calls on one shard (`Round`, how the
reads of parley/client/producer.py, inbox.py, sessions.py and export.py run), several such reads
side by side (`Each`), or a pause (`Sleep`); what it returns is the operation's result. The
routing (the shard of a session, the placement read again after a `moved` refusal or an empty
read), a send's moved-retry and the wait for a resume's or a close's outcome are written here
and nowhere else: the runners (sync.py on `redis`, aio.py on `redis.asyncio`) only do what
the steps ask, so both write the same entries and read the same outcomes. The clock is a
function the core is given, so a test drives every step without Redis or waiting.
"""

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

from pydantic import BaseModel
from redis.exceptions import ResponseError

from parley.client import inbox
from parley.client import sessions as listing
from parley.client.export import NoSuchSession, SessionExport, export_steps
from parley.client.follow import Reread, block_of, socket_timeout_of, within_socket_timeout
from parley.client.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage
from parley.client.producer import (
    DEFAULT_MOVED_TIMEOUT_S,
    SHARDED_NEEDS_PRODUCER,
    Call,
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
    resume_input,
    show_steps,
    submit_call,
    submit_error,
    text,
    xread_events,
)
from parley.client.sessions import SessionFilter, SessionPage
from parley.client.shards import VIEW_FIELDS, answered_views
from parley.schemas import deltas
from parley.schemas.inputs import Input
from parley.schemas.keys import Keys, partition_of
from parley.schemas.resumes import CLOSE, RESUME, CloseOutcome, OutcomeOf, OutcomeT, ResumeOutcome
from parley.schemas.shards import Placement, PlacementError, newest_placement_of

T = TypeVar("T")


# ---- what a step asks for ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Command:
    """One command on shard `shard`, called as is (no pipeline: an error reply is redis-py's
    own). `refusable`: a `ResponseError` is the reply, for the step to read, instead of raised."""

    shard: int
    call: Call
    refusable: bool = False
    #: a shard that does not answer (ConnectionError, TimeoutError): the error is the reply
    unreachable_ok: bool = False


@dataclass(frozen=True, slots=True)
class Round:
    """One round trip of `calls` on shard `shard` (a pipeline, no MULTI): their replies."""

    shard: int
    calls: list[Call]


@dataclass(frozen=True, slots=True)
class Each:
    """Several operations (one shard's read each), side by side where the runner can wait on
    several at once: their results, in order."""

    ops: "list[Op[Any]]"
    #: an operation whose shard does not answer (ConnectionError, TimeoutError) gives the
    #: error as its result instead of failing them all
    unreachable_ok: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Request: TypeAlias = Command | Round | Each | Sleep
#: an operation in steps: yields requests, receives their replies, returns its result
Op: TypeAlias = Generator[Request, Any, T]


def on(shard: int, steps: Steps) -> Op[Any]:
    """A read in round trips (`Steps`, parley/client/producer.py) run on shard `shard`."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send((yield Round(shard, calls)))
    except StopIteration as done:
        return done.value


#: entries an XREAD asks for, per stream
READ_COUNT = 100


def xread(shard: int, stream: str, after: str, block_ms: int) -> Command:
    """Up to READ_COUNT entries of `stream` after `after`, blocking at most `block_ms`."""
    return Command(shard, Call("xread", ({stream: after},), {"count": READ_COUNT, "block": block_ms}))


F = TypeVar("F", contravariant=True)
P = TypeVar("P", bound=BaseModel)


class Listing(Protocol[F, P]):
    """A listing's pages as steps, filtered by an `F`, of type `P` (a module: parley/client/inbox.py,
    parley/client/sessions.py)."""

    def page_steps(self, keys: Keys, flt: F, limit: int = ..., cursor: str | None = ...) -> Steps: ...

    def merged_after(self, flt: F, cursor: str | None) -> str | None: ...

    def shard_page_steps(self, keys: Keys, flt: F, limit: int, after: str | None) -> Steps: ...

    def merged_page(self, flt: F, limit: int, pages: Sequence[P],
                    placement: Placement | None = ...) -> P: ...


class Placed(Protocol):
    """Whatever holds the placement a client routes by: `parley.client.shards.Shards` for `Client`
    (so `client.shards` stays its routing), the core's own `Held` for `AsyncClient`."""

    placement: Placement | None


@dataclass(slots=True)
class Held:
    placement: Placement | None = None


# ---- the core ------------------------------------------------------------------------------------

class Core:
    """The state both runners route by, and their operations as steps.

    `clients`: the shards' clients in the deployment's order (only counted, and their socket
    timeouts read: a blocking read must stay within them). `producer`, `moved_timeout_s`: as
    `Client` documents them. `placed`: where the placement read last is kept."""

    def __init__(self, keys: Keys, clients: Sequence[Any], producer: str | None = None,
                 moved_timeout_s: float = DEFAULT_MOVED_TIMEOUT_S, placed: Placed | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not clients:
            raise ValueError("a deployment needs at least one Redis")
        self.keys = keys
        self.count = len(clients)
        self.timeouts = [socket_timeout_of(c) for c in clients]
        self.producer = None if producer is None else check_producer(producer)
        self.moved_timeout_s = moved_timeout_s
        self.placed: Placed = placed if placed is not None else Held()
        self.clock = clock
        self._partitions: dict[int, int] = {}

    @property
    def sharded(self) -> bool:
        return self.count > 1

    # ---- routing: once, for both runners ----

    def refresh(self) -> Op[Placement | None]:
        """The newest placement any shard holds (a move writes them one after another), kept;
        PlacementError when the clients are not the deployment's shards in order."""
        if not self.sharded:
            return None
        # every shard at once; a majority answering is enough (schemas/shards.py, `majority`)
        replies: list[Any] = yield Each([self._view_read(i) for i in range(self.count)])
        self.placed.placement = newest_placement_of(answered_views(replies), self.count)
        return self.placed.placement

    def _view_read(self, shard: int) -> Op[Any]:
        reply = yield Command(shard, Call("hmget", (self.keys.config, VIEW_FIELDS)), unreachable_ok=True)
        return reply

    def shard_of(self, session: str) -> Op[int]:
        """The shard of `session` (0 with one Redis); the placement is read once, and again
        when a submit is refused `moved` or a read finds nothing."""
        if not self.sharded:
            return 0
        if self.placed.placement is None:
            yield from self.refresh()
        if self.placed.placement is None:
            raise PlacementError("the shards hold no placement yet: start a dispatcher first")
        return self.placed.placement.shard_of_session(session)

    def followed(self, session: str, shard: int, reread: Reread) -> Op[int]:
        """The session's shard after a read found nothing on `shard`: the placement is read
        again (paced by `reread`), as a move may have taken the session elsewhere."""
        if not self.sharded or not reread.due(self.clock()):
            return shard
        yield from self.refresh()
        return (yield from self.shard_of(session))

    def moved_to(self, session: str, shard: int) -> Op[int | None]:
        """After a lookup found nothing on `shard`: the session's shard per the placement read
        again, when it is another (None: it is not, or there is one Redis)."""
        if not self.sharded:
            return None
        yield from self.refresh()
        now = yield from self.shard_of(session)
        return now if now != shard else None

    def partitions(self, shard: int = 0) -> Op[int]:
        """N, the partition count a dispatcher published (on `shard`): read once, not per entry
        (it is fixed once published); 1 until one is, and asked again next time."""
        if shard not in self._partitions:
            n = partitions_of((yield Command(shard, Call("hget", (self.keys.config, "partitions")))))
            if n is None:
                return 1
            self._partitions[shard] = n
        return self._partitions[shard]

    def stream_for(self, session: str) -> Op[str]:
        """docs/protocol.md, "Inputs": the producer's `parley:in:<producer>`, else `parley:inputs`,
        with one partition; `...:<crc32 mod N>` with N (the session's root's partition)."""
        n = yield from self.partitions((yield from self.shard_of(session)))
        if self.producer is not None:
            return self.keys.producer_inputs(self.producer, partition_of(session, n), n)
        return self.keys.inputs_of(session, n)

    # ---- writing inputs ----

    def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> Op[str]:
        """One input: checked, then XADDed (no producer) or submitted; a submit refused `moved`
        wrote nothing, so it waits (backoff), reads the placement again and submits again, for
        `moved_timeout_s` at most (then `SubmitUnavailable`)."""
        fields = input_fields(session, value, idempotency_key, principal, key)
        if self.producer is None:
            if self.sharded:
                raise ValueError(SHARDED_NEEDS_PRODUCER)
            stream = yield from self.stream_for(session)
            return text((yield Command(0, Call("xadd", (stream, fields)))))
        retry: MovedRetry | None = None
        while True:
            shard = yield from self.shard_of(session)
            partitions = yield from self.partitions(shard)
            call = submit_call(self.keys, self.producer, session, partitions, fields)
            reply = yield Command(shard, Call("fcall", call), refusable=True)
            if not isinstance(reply, ResponseError):
                return text(reply)
            error = submit_error(str(reply)) or reply
            if not is_moved(error):
                raise error from None
            retry = retry or MovedRetry(self.clock(), self.moved_timeout_s)
            delay = retry.delay(self.clock())
            if delay is None:
                raise retry.gave_up(session) from None
            yield Sleep(delay)
            self._partitions.clear()  # refused for a count changed since (`partitions resize`)
            yield from self.refresh()

    def resume(self, session: str, interrupt_id: str, payload: Any, idempotency_key: str | None,
               principal: str | None, key: str | None, wait: bool,
               timeout_s: float) -> Op[str | ResumeOutcome]:
        """An `interrupt.resume`: its entry id, or with `wait` what became of it."""
        value = resume_input(interrupt_id, payload)
        if not wait:
            return (yield from self.send(session, value, idempotency_key, principal, key))
        return (yield from self.send_and_wait(session, value, RESUME, timeout_s, idempotency_key,
                                              principal, key))

    def close(self, session: str, reason: str | None, idempotency_key: str | None,
              principal: str | None, key: str | None, wait: bool,
              timeout_s: float) -> Op[str | CloseOutcome]:
        """A `session.close`: its entry id, or with `wait` what became of it."""
        value = close_input(reason)
        if not wait:
            return (yield from self.send(session, value, idempotency_key, principal, key))
        return (yield from self.send_and_wait(session, value, CLOSE, timeout_s, idempotency_key,
                                              principal, key))

    def send_and_wait(self, session: str, value: Input, of: OutcomeOf[OutcomeT], timeout_s: float,
                      idempotency_key: str | None, principal: str | None, key: str | None) -> Op[OutcomeT]:
        """Send `value`, then block on the session's events (XREAD BLOCK, the remaining time at
        most) until one tells what became of it, or the time is up."""
        events = self.keys.events(session)
        # Read the stream's last id before sending: the outcome is written after it.
        since = yield from self.last_event_id(session)
        wait = OutcomeWait((yield from self.send(session, value, idempotency_key, principal, key)), since, of)
        deadline = self.clock() + timeout_s
        shard = yield from self.shard_of(session)  # where the send went (after any `moved` retry)
        reread = Reread()
        while (left_ms := int((deadline - self.clock()) * 1000)) > 0:
            # each read within the socket timeout: a longer wait is several reads, not a
            # TimeoutError that would pass for Redis being down
            block = within_socket_timeout(block_of(left_ms, self.sharded), self.timeouts[shard])
            reply = yield xread(shard, events, wait.last, block)
            outcome = wait.read(reply)
            if outcome is not None:
                return outcome
            if not reply:  # the session's partition may have moved meanwhile
                shard = yield from self.followed(session, shard, reread)
        return wait.timed_out(timeout_s)

    # ---- reading ----

    def last_event_id(self, session: str) -> Op[str]:
        """The id of the session's newest event now ("0-0": none): following from it gives
        only what happens from now on."""
        shard = yield from self.shard_of(session)
        return last_id((yield Command(shard, Call("xrevrange", (self.keys.events(session),), {"count": 1}))))

    def follow(self, session: str, after: str, block_ms: int, until: float | None,
               deltas: bool = False) -> "Op[Follow]":
        """Following the session's events from `after` (see `Follow`), from its shard now."""
        return Follow(self, session, (yield from self.shard_of(session)), after, block_ms, until, deltas)

    def show(self, session: str) -> Op[dict[str, Any] | None]:
        """The session's state (what `parley show` prints), None when it has no record; a
        session not found is looked for again after reading the placement again."""
        shard = yield from self.shard_of(session)
        view: dict[str, Any] | None = yield from on(shard, show_steps(self.keys, session))
        if view is None and (moved := (yield from self.moved_to(session, shard))) is not None:
            view = yield from on(moved, show_steps(self.keys, session))
        return view

    def export(self, session: str) -> Op[SessionExport]:
        """The whole session, read in one atomic script; `NoSuchSession` when it has no record
        (looked for again, like `show`, after reading the placement again)."""
        shard = yield from self.shard_of(session)
        try:
            export: SessionExport = yield from on(shard, export_steps(self.keys, session))
        except NoSuchSession:
            moved = yield from self.moved_to(session, shard)
            if moved is None:
                raise
            export = yield from on(moved, export_steps(self.keys, session))
        return export

    def open_interrupt(self, session: str, interrupt_id: str) -> Op[inbox.OpenInterrupt | None]:
        shard = yield from self.shard_of(session)
        row: inbox.OpenInterrupt | None = yield from on(
            shard, inbox.one_interrupt_steps(self.keys, session, interrupt_id))
        return row

    def listing_page(self, kind: "Listing[F, P]", where: F, limit: int, cursor: str | None) -> Op[P]:
        """One page of a listing, `kind` (parley/client/inbox.py, parley/client/sessions.py: they read their
        pages alike): O(log n + page) reads; with several shards, one such read of each, from
        the same position, merged in the listing's order. Each row is kept from its session's
        shard only (a move lists its sessions on two shards between its copy and its clean), by
        the placement read after the pages: a move that flipped meanwhile then keeps the
        target's rows, which the pages already hold (it copies before it flips)."""
        if not self.sharded:
            return (yield from on(0, kind.page_steps(self.keys, where, limit, cursor)))
        after = kind.merged_after(where, cursor)
        got: list[Any] = yield Each([on(i, kind.shard_page_steps(self.keys, where, limit, after))
                                     for i in range(self.count)], unreachable_ok=True)
        # A shard that does not answer: the page is of the others, and says which it lacks
        # (its rows come again on a later walk; the cursor is one position for every shard).
        down = [i for i, page in enumerate(got) if isinstance(page, Exception)]
        if len(down) == len(got):
            raise got[0]
        read = [page for page in got if not isinstance(page, Exception)]
        empty = read[0].model_copy(update={"items": [], "cursor": None})
        pages = [empty if isinstance(page, Exception) else page for page in got]
        merged = kind.merged_page(where, limit, pages, (yield from self.refresh()))
        return merged.model_copy(update={"unreachable": down}) if down else merged

    def interrupt_page(self, where: InterruptFilter | None, limit: int,
                       cursor: str | None) -> Op[InterruptPage]:
        """One page of the open interrupts across sessions."""
        return (yield from self.listing_page(inbox, where or InterruptFilter(), limit, cursor))

    def interrupts(self, where: InterruptFilter | None) -> Op[list[dict[str, Any]]]:
        """Every open interrupt that `where` keeps, as JSON rows (every shard's, merged, each
        from its session's shard: see `listing_page`)."""
        flt = where or InterruptFilter()
        parts: list[list[dict[str, Any]]] = yield Each(
            [on(i, inbox.every_row_steps(self.keys, flt)) for i in range(self.count)])
        if not self.sharded:
            return parts[0]
        return inbox.merged_rows(flt, parts, (yield from self.refresh()))

    def sessions(self, status: str | Iterable[str] | None, metadata: Mapping[str, Any] | None,
                 created_after: int | None, created_before: int | None, limit: int = DEFAULT_LIMIT,
                 cursor: str | None = None, newest_first: bool = False) -> Op[SessionPage]:
        """One page of the list of sessions; ValueError for a bad filter or cursor."""
        where = SessionFilter.of(status, metadata, created_after, created_before, newest_first)
        return (yield from self.listing_page(listing, where, limit, cursor))


class Follow:
    """One session's events followed from `after` until `until` (a monotonic deadline; None:
    for ever): `going()` says whether to read again, `read()` is one blocking XREAD on the
    session's shard, `take(reply)` its (id, event) pairs. With several shards, a read that
    comes back empty reads the placement again (at most every second): a session whose
    partition moved is followed to its new shard, from the same event id (a move copies the
    stream with its ids).

    With `deltas`, the same XREAD reads the session's deltas stream too (schemas/deltas.py),
    from the same point in time as `after` (both streams' ids are Redis's clock), and the two
    come out merged in the order they were written: a reply's pieces before the durable
    `message.created` that records it."""

    def __init__(self, core: Core, session: str, shard: int, after: str, block_ms: int,
                 until: float | None, deltas: bool = False):
        self.core, self.session, self.shard = core, session, shard
        self.key = core.keys.events(session)
        self.last, self.block_ms, self.until = after, block_ms, until
        self.deltas_key = core.keys.deltas(session) if deltas else None
        self.last_delta = after
        self.reread = Reread()

    def going(self) -> bool:
        return self.until is None or self.core.clock() < self.until

    def read(self) -> Op[Any]:
        block = within_socket_timeout(self.block_ms, self.core.timeouts[self.shard])
        if self.deltas_key is None:
            reply = yield xread(self.shard, self.key, self.last, block)
        else:
            streams = {self.key: self.last, self.deltas_key: self.last_delta}
            reply = yield Command(self.shard, Call("xread", (streams,),
                                                   {"count": READ_COUNT, "block": block}))
        if not reply:
            self.shard = yield from self.core.followed(self.session, self.shard, self.reread)
        return reply

    def take(self, reply: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        if self.deltas_key is None:
            for entry_id, event in xread_events(reply):
                self.last = entry_id
                yield entry_id, event
            return
        taken, last = deltas.merged([(text(name), entries) for name, entries in reply or []], READ_COUNT)
        self.last = last.get(self.key, self.last)
        self.last_delta = last.get(self.deltas_key, self.last_delta)
        for stream, raw_id, fields in taken:
            if stream == self.key:
                yield from xread_events([(stream, [(raw_id, fields)])])
            elif (delta := deltas.delta_of(fields)) is not None:
                yield text(raw_id), delta


class Face:
    """What both runners show besides their methods: the core's settings, as attributes."""

    core: Core

    @property
    def keys(self) -> Keys:
        return self.core.keys

    @property
    def producer(self) -> str | None:
        return self.core.producer

    @property
    def moved_timeout_s(self) -> float:
        return self.core.moved_timeout_s
