"""`Client`: the producer's client on `redis`, running the steps of parley/client/core.py."""

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, overload

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from parley.client.core import Command, Core, Each, Face, Op, Request, Round, T
from parley.client.export import SessionExport
from parley.client.inbox import DEFAULT_LIMIT, InterruptFilter, InterruptPage, OpenInterrupt
from parley.client.producer import DEFAULT_MOVED_TIMEOUT_S, InputValue, pipeline_of, typed_events
from parley.client.sessions import SessionPage
from parley.client.shards import Shards
from parley.schemas.deltas import Delta
from parley.schemas.events import Event
from parley.schemas.keys import Keys
from parley.schemas.resumes import CloseOutcome, ResumeOutcome


def shards_of(redis: "Redis | Shards | Sequence[Redis]", keys: Keys) -> Shards:
    """What a client was given, as the shards of its deployment: one Redis (one shard, no
    placement, as before shards), `Shards`, or the shards' clients in the deployment's order."""
    if isinstance(redis, Shards):
        return redis
    return Shards(list(redis) if isinstance(redis, Sequence) else [redis], keys)


#: the name of the fan-out pool's threads (`Client._each`)
FANOUT_THREAD = "parley-shards"


class Client(Face):
    """`redis`: the deployment's Redis, or its shards (`parley.client.shards.Shards`, or their clients
    in order): every call about one session goes to the session's shard, and listings across
    sessions read every shard and merge (docs/operations.md, "Shards"); `shards` holds the
    placement it routes by.

    `producer`: submit every input through the submit function to this producer's own
    streams (docs/protocol.md, "Writing inputs"; a deployment with ACLs must name its
    producer). None: XADD to the shared `parley:inputs` streams (development, no ACLs; one
    Redis only: with several shards a send without a producer raises ValueError).
    `moved_timeout_s`: how long a send waits out a partition being moved between shards
    (refused `moved`) before it raises `SubmitUnavailable`."""

    def __init__(self, redis: "Redis | Shards | Sequence[Redis]", prefix: str = "parley",
                 producer: str | None = None, *, moved_timeout_s: float = DEFAULT_MOVED_TIMEOUT_S):
        keys = Keys(prefix)
        self.shards = shards_of(redis, keys)
        #: the first shard's client (the only one with one Redis)
        self.redis: Redis = self.shards.clients[0]
        self.core = Core(keys, self.shards.clients, producer, moved_timeout_s, self.shards)
        # the threads that read every shard at once (`_each`), made on the first listing
        self._fanout: ThreadPoolExecutor | None = None
        self._fanout_lock = threading.Lock()

    def _do(self, request: Request) -> Any:
        if isinstance(request, Round):
            return pipeline_of(self.shards.clients[request.shard], request.calls).execute()
        if isinstance(request, Each):
            return self._each(request.ops, request.unreachable_ok)
        if not isinstance(request, Command):
            return time.sleep(request.seconds)
        name, args, kwargs = request.call.name, request.call.args, request.call.kwargs
        try:
            return getattr(self.shards.clients[request.shard], name)(*args, **kwargs)
        except ResponseError as err:
            if request.refusable:
                return err
            raise
        except (RedisConnectionError, RedisTimeoutError) as err:
            if request.unreachable_ok:
                return err
            raise

    def _each(self, ops: "list[Op[Any]]", unreachable_ok: bool = False) -> list[Any]:
        """Several shards' operations at once, one thread each (redis-py's clients are safe to
        share between threads: each command takes a connection of its pool), so a listing over
        S shards costs one shard's round trips of wall time, not S times them."""
        if len(ops) <= 1 or threading.current_thread().name.startswith(FANOUT_THREAD):
            # one op, or asked from one of the pool's own threads (a read that looks the
            # placement up again): waiting on the pool from inside it could wait for ever
            return [(self._run_or_unreachable if unreachable_ok else self._run)(op) for op in ops]
        with self._fanout_lock:  # made on the first listing, one thread per shard
            if self._fanout is None:
                self._fanout = ThreadPoolExecutor(len(self.shards.clients),
                                                  thread_name_prefix=FANOUT_THREAD)
        return list(self._fanout.map(self._run_or_unreachable if unreachable_ok else self._run, ops))

    def _run_or_unreachable(self, op: "Op[Any]") -> Any:
        try:
            return self._run(op)
        except (RedisConnectionError, RedisTimeoutError) as err:
            return err

    def _run(self, op: Op[T]) -> T:
        """Do what `op` asks, one request at a time, and return its result."""
        try:
            request = next(op)
            while True:
                request = op.send(self._do(request))
        except StopIteration as done:
            return done.value

    def partitions(self, shard: int = 0) -> int:
        """N, the partition count published on `shard` (1 until one is; read once)."""
        return self._run(self.core.partitions(shard))

    def stream_for(self, session: str) -> str:
        """The input stream of `session` (docs/protocol.md, "Inputs")."""
        return self._run(self.core.stream_for(session))

    def send(self, session: str, value: InputValue, idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> str:
        """Send one input (a typed model of schemas/inputs.py, or its JSON as a dict); signed
        (docs/protocol.md, "Inputs") when given a principal and its key. An input a dispatcher
        would refuse raises `InvalidInput` and nothing is sent; one the submit function refuses
        raises `SubmitRefused` (`SubmitUnavailable` while Redis holds no submit function, or
        while the session's partition stays `moved` longer than `moved_timeout_s`)."""
        return self._run(self.core.send(session, value, idempotency_key, principal, key))

    @overload
    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: Literal[False] = False, timeout_s: float = 10.0) -> str: ...

    @overload
    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: Literal[True], timeout_s: float = 10.0) -> ResumeOutcome: ...

    def resume(self, session: str, interrupt_id: str, payload: Any = None, *,
               idempotency_key: str | None = None, principal: str | None = None,
               key: str | None = None, wait: bool = False, timeout_s: float = 10.0) -> str | ResumeOutcome:
        """Send an `interrupt.resume`. Returns its entry id, or with `wait=True` what became of
        it (schemas/resumes.py), waiting at most `timeout_s` for the session's events to say."""
        return self._run(self.core.resume(session, interrupt_id, payload, idempotency_key, principal,
                                          key, wait, timeout_s))

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
        return self._run(self.core.close(session, reason, idempotency_key, principal, key, wait, timeout_s))

    def last_event_id(self, session: str) -> str:
        """The id of the session's newest event now ("0-0": none yet): `events(session, after=...)`
        from it yields only what happens from then on."""
        return self._run(self.core.last_event_id(session))

    def events(self, session: str, after: str = "0-0", block_ms: int = 1000,
               until: float | None = None, *, deltas: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
        """Follow the session's events from `after` as (id, JSON dict); stops at `until` (a
        monotonic deadline). With several shards, a session whose partition moved is followed
        to its new shard, from the same event id (parley/client/core.py, `Follow`). With
        `deltas`, the pieces of model replies being generated come too, in order among the
        events, as `{"type": "llm.delta", ...}` (docs/protocol.md, "Token streaming")."""
        follow = self._run(self.core.follow(session, after, block_ms, until, deltas))
        while follow.going():
            yield from follow.take(self._run(follow.read()))

    @overload
    def watch(self, session: str, after: str = "0-0", until: float | None = None, block_ms: int = 1000,
              *, deltas: Literal[False] = False) -> Iterator[tuple[str, Event]]: ...

    @overload
    def watch(self, session: str, after: str = "0-0", until: float | None = None, block_ms: int = 1000,
              *, deltas: Literal[True]) -> Iterator[tuple[str, Event | Delta]]: ...

    def watch(self, session: str, after: str = "0-0", until: float | None = None, block_ms: int = 1000,
              *, deltas: bool = False) -> Iterator[tuple[str, Event | Delta]]:
        """`events`, typed: (id, event model of schemas/events.py, or with `deltas` a `Delta`)."""
        return typed_events(self.events(session, after, block_ms, until, deltas=deltas))

    def show(self, session: str) -> dict[str, Any] | None:
        """The session's state (what `parley show` prints), None when it has no record (looked
        for again after reading the placement again, with several shards)."""
        return self._run(self.core.show(session))

    def export(self, session: str) -> SessionExport:
        """The whole session: messages as a tree, events, open interrupts (docs/protocol.md,
        "Export and archive"), read in one atomic script; `NoSuchSession` when it has no record."""
        return self._run(self.core.export(session))

    def open_interrupt(self, session: str, interrupt_id: str) -> OpenInterrupt | None:
        """One open interrupt as the listing shows it; None when it is not open (answered, timed
        out, cancelled) or was never raised."""
        return self._run(self.core.open_interrupt(session, interrupt_id))

    def interrupt_page(self, where: InterruptFilter | None = None, limit: int = DEFAULT_LIMIT,
                       cursor: str | None = None) -> InterruptPage:
        """One page of the open interrupts across sessions (docs/protocol.md, "Open interrupts
        across sessions"): O(log n + page) reads, whatever the number open; with several
        shards, one such read of each, merged in the listing's order."""
        return self._run(self.core.interrupt_page(where, limit, cursor))

    def interrupts(self, where: InterruptFilter | None = None) -> list[dict[str, Any]]:
        """Every open interrupt that `where` keeps, as JSON rows, page by page (every shard's,
        in the listing's order)."""
        return self._run(self.core.interrupts(where))

    def sessions(self, status: str | Iterable[str] | None = None, metadata: Mapping[str, Any] | None = None,
                 created_after: int | None = None, created_before: int | None = None, *,
                 limit: int = DEFAULT_LIMIT, cursor: str | None = None,
                 newest_first: bool = False) -> SessionPage:
        """One page of the list of sessions (docs/operations.md, "The list of sessions"): by
        status (`active`, `parked`, `closed`; one or several; default all), by metadata pairs, by
        creation time (Unix ms, exclusive bounds), oldest first unless `newest_first`. O(log n +
        page) reads, whatever the number of sessions (of each shard, merged, with several).
        ValueError for a bad filter or cursor."""
        return self._run(self.core.sessions(status, metadata, created_after, created_before, limit,
                                            cursor, newest_first))
