"""What a client does between Redis calls, shared by `Client` and `AsyncClient`.

Each client is a thin I/O shell: it issues the calls these functions describe and hands the
replies back. Building an entry's fields (and validating them exactly as a dispatcher will,
before anything is sent), choosing the partition, reading XREAD replies into events, finding
a resume's outcome and reading a session's view live here, once.
"""

import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias

import orjson
from pydantic import BaseModel, ValidationError

from parley.runtime.retry import backoff
from parley.runtime.telemetry import current_traceparent
from parley.schemas.codec import InputError, decode_input_entry
from parley.schemas.codes import RefusalCode
from parley.schemas.deltas import DELTA_TYPE, Delta
from parley.schemas.events import EVENT_ADAPTER, Event
from parley.schemas.inputs import Input, InterruptResume, SessionClose
from parley.schemas.keys import Keys, partition_of
from parley.schemas.producers import PRODUCER_NAME_RE
from parley.schemas.resumes import OutcomeOf, OutcomeT
from parley.schemas.signing import signed_fields
from parley.schemas.state import SessionState
from parley.schemas.view import show

#: what a client accepts as an input: a typed model (schemas/inputs.py) or its JSON as a dict
InputValue: TypeAlias = Input | Mapping[str, Any]


class InvalidInput(ValueError):
    """An input a dispatcher would refuse: raised before anything is sent."""


class SubmitRefused(Exception):
    """The submit function refused an input (docs/protocol.md, "Writing inputs"): `code` is one
    of `too_large`, `rate_limited`, `session_full`, `wrong_tenant`, `invalid_input`; nothing
    was written. `rate_limited` passes as the session's pending inputs are applied."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SubmitUnavailable(Exception):
    """Redis holds no submit function yet (a Redis started empty or flushed), or, in a
    deployment of several shards, the session's partition stayed `moved` longer than the
    client waits: nothing was written; send again soon."""


#: a producer's name (docs/operations.md, "Producers"): the registry's own rule
PRODUCER_RE = PRODUCER_NAME_RE
SUBMIT_FUNCTION = "parley_submit"
#: how the function's refusals start: `PARLEY <code> <message>`
REFUSAL_PREFIX = "PARLEY "


def check_producer(name: str) -> str:
    if not isinstance(name, str) or not PRODUCER_RE.fullmatch(name):
        raise ValueError(f"invalid producer name {name!r}: 1-32 characters of [a-z0-9_-], "
                         "starting with a letter or digit")
    return name


def submit_call(keys: Keys, producer: str, session: str, partitions: int,
                fields: Mapping[Any, Any]) -> tuple[Any, ...]:
    """The arguments of `FCALL parley_submit` for one entry's `fields` (as `input_fields` builds
    them): the producer's own stream of the session's partition and its pending hash as keys,
    then the prefix, the producer and the fields as XADD takes them."""
    stream = keys.producer_inputs(producer, partition_of(session, partitions), partitions)
    flat = [item for name, value in fields.items() for item in (name, value)]
    return (SUBMIT_FUNCTION, 2, stream, keys.pending(producer), keys.prefix, producer, *flat)


def submit_error(message: str) -> Exception | None:
    """What an error reply of `FCALL parley_submit` means to a producer: `SubmitRefused`,
    `SubmitUnavailable` (the function is not loaded), or None (any other error: raise it)."""
    if message.startswith(REFUSAL_PREFIX):
        code, _sep, text = message.removeprefix(REFUSAL_PREFIX).partition(" ")
        return SubmitRefused(code, text)
    if "Function not found" in message:
        return SubmitUnavailable("the submit function is not loaded in Redis (a Redis started "
                                 "empty?): start a dispatcher, or retry within seconds")
    return None


def is_moved(error: Exception) -> bool:
    """The refusal `moved` (a deployment of several shards): the session's partition is being
    moved, or is on another shard than the one called. Nothing was written, so sending again
    (to the shard the placement names then) is safe."""
    return isinstance(error, SubmitRefused) and error.code == RefusalCode.MOVED


#: how long a client waits out `moved` before it gives up (`SubmitUnavailable`): a move holds a
#: partition for the time it takes to copy it, seconds for most
DEFAULT_MOVED_TIMEOUT_S = 30.0


@dataclass(slots=True)
class MovedRetry:
    """When to submit again after `moved`: a jittered backoff (parley/runtime/retry.py), short at
    first since a placement read again may already name the new shard, until `timeout_s` past
    `started` (monotonic seconds). Pure: the caller reads the clock and sleeps."""

    started: float
    timeout_s: float = DEFAULT_MOVED_TIMEOUT_S
    attempts: int = 0
    base_s: float = 0.05
    cap_s: float = 1.0

    def delay(self, now: float) -> float | None:
        """Seconds to wait before the next try, or None once the time is up."""
        left = self.started + self.timeout_s - now
        if left <= 0:
            return None
        wait = min(left, backoff(self.attempts, base=self.base_s, cap=self.cap_s, jitter=True))
        self.attempts += 1
        return wait

    def gave_up(self, session: str) -> SubmitUnavailable:
        return SubmitUnavailable(f"session {session!r}: its partition is being moved between shards and "
                                 f"was not served again within {self.timeout_s:g} s (refused `moved` "
                                 f"{self.attempts + 1} times); nothing was written, send again later")


SHARDED_NEEDS_PRODUCER = ("a deployment of several shards takes inputs through the submit function: "
                          "give the client a producer (a plain XADD cannot be refused `moved` while "
                          "its partition moves, and would be lost)")


@dataclass(frozen=True, slots=True)
class Call:
    """One Redis command, by its redis-py method name, for a client to run in a pipeline."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


#: a read in steps: yields the calls of one round trip, receives their replies, returns the result
Steps: TypeAlias = Generator[list[Call], list[Any], Any]


def pipeline_of(redis: Any, calls: list[Call]) -> Any:
    """One round trip's calls queued on a pipeline of `redis` (sync or asyncio); no MULTI:
    the calls of a read need no transaction."""
    pipe = redis.pipeline(transaction=False)
    for call in calls:
        getattr(pipe, call.name)(*call.args, **call.kwargs)
    return pipe


def run_steps(redis: Any, steps: Steps) -> Any:
    """Drive `steps` on a synchronous Redis (`AsyncClient` has its own, awaiting)."""
    try:
        calls = next(steps)
        while True:
            calls = steps.send(pipeline_of(redis, calls).execute())
    except StopIteration as done:
        return done.value


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# ---- inputs -------------------------------------------------------------------------------------

def input_json(value: InputValue) -> bytes:
    if isinstance(value, BaseModel):
        # unset fields stay out: an omitted `parent_id` ("the active head") is not null ("a root")
        return orjson.dumps(traced(value.model_dump(mode="json", exclude_unset=True)))
    try:
        return orjson.dumps(traced(dict(value)))
    except (TypeError, ValueError) as err:
        raise InvalidInput(f"the input is not JSON: {err}") from None


def traced(value: dict[str, Any]) -> dict[str, Any]:
    """A message that starts a turn, sent inside an OpenTelemetry span of the producer's: the turn
    is traced in that trace (docs/tracing.md), unless the message names a trace of its own."""
    if value.get("type") != "message.create" or "traceparent" in value:
        return value
    traceparent = current_traceparent()
    return value if traceparent is None else {**value, "traceparent": traceparent}


def input_fields(session: str, value: InputValue, idempotency_key: str | None = None,
                 principal: str | None = None, key: str | None = None) -> dict[Any, Any]:
    """The XADD fields of one input, signed (docs/protocol.md, "Inputs") when given a principal
    and its key; checked as a dispatcher checks an entry, so a bad one is never sent."""
    raw = input_json(value)
    fields: dict[Any, Any] = {"session": session, "input": raw}
    if principal is not None and key is not None:
        idempotency_key = idempotency_key or uuid.uuid4().hex  # a signed entry needs an id
        fields.update(signed_fields(key, principal, session, idempotency_key, raw))
    if idempotency_key is not None:
        fields["id"] = idempotency_key
    try:
        decode_input_entry(fields)
    except InputError as err:
        raise InvalidInput(str(err)) from None
    return fields


def resume_input(interrupt_id: str, payload: Any) -> InterruptResume:
    try:
        return InterruptResume(type="interrupt.resume", interrupt_id=interrupt_id, payload=payload)
    except ValidationError as err:
        raise InvalidInput(f"invalid interrupt.resume: {err.errors()[0]['loc'][0]}: "
                           f"{err.errors()[0]['msg']}") from None


def close_input(reason: str | None) -> SessionClose:
    """A client's `session.close`; no reason: the dispatcher's default (`closed`)."""
    try:
        if reason is None:
            return SessionClose(type="session.close")
        return SessionClose(type="session.close", reason=reason)
    except ValidationError as err:
        raise InvalidInput(f"invalid session.close: {err.errors()[0]['loc'][0]}: "
                           f"{err.errors()[0]['msg']}") from None


def partitions_of(raw: Any) -> int | None:
    """The partition count a dispatcher published (`HGET config partitions`); None: not yet."""
    return int(raw) if raw else None


# ---- events -------------------------------------------------------------------------------------

def xread_events(reply: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, event) of each entry of an XREAD reply, with bytes or decoded replies."""
    for _stream, entries in reply or []:
        for raw_id, fields in entries:
            yield text(raw_id), orjson.loads(fields[b"event"] if b"event" in fields else fields["event"])


def typed_event(event: dict[str, Any]) -> Event | Delta:
    """An event dict as its model (schemas/events.py), or a delta as a `Delta`."""
    if event.get("type") == DELTA_TYPE:
        return Delta.model_validate(event)
    return EVENT_ADAPTER.validate_python(event)


def typed_events(events: Iterable[tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, Any]]:
    for entry_id, event in events:
        yield entry_id, typed_event(event)


def last_id(reply: Any) -> str:
    """The id of an XREVRANGE COUNT 1 reply's entry: where events after now start."""
    return text(reply[0][0]) if reply else "0-0"


@dataclass(slots=True)
class OutcomeWait(Generic[OutcomeT]):
    """Reading a session's events for the one that tells what became of input `entry`, as `of`
    reads it (`RESUME` or `CLOSE`: schemas/resumes.py)."""

    entry: str
    #: the id to read after: the stream's last before the input was sent, then the last read
    since: str
    of: OutcomeOf[OutcomeT]
    last: str = ""

    def __post_init__(self) -> None:
        self.last = self.last or self.since

    def read(self, reply: Any) -> OutcomeT | None:
        for entry_id, event in xread_events(reply):
            self.last = entry_id
            outcome = self.of.told(self.entry, event)
            if outcome is not None:
                return outcome
        return None

    def timed_out(self, timeout_s: float) -> OutcomeT:
        return self.of.timed_out(self.entry, timeout_s)


# ---- a session's view ---------------------------------------------------------------------------

def show_steps(keys: Keys, session: str) -> Steps:
    core_reply, messages = yield [
        Call("hmget", (keys.meta(session), "core")),  # the reader's ACL grants HMGET, not HGET
        Call("hgetall", (keys.messages(session),)),
    ]
    (core,) = core_reply
    if not core:
        return None
    return show(SessionState.from_records(core, messages))
