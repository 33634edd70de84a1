"""Effects: what a transition asks the shell to do once it is committed.

A transition's jobs (`Enqueue`) are written by its own commit script, on the session's shard
(`split_effects` says which). Everything else that touches keys outside the session (the
interrupt index, another session's inputs, the listings) goes into the session's outbox, in
the same commit; the shell then does it (dispatcher/enqueue.py) and deletes it from the
outbox in one MULTI (docs/design.md, "The enqueue path and the outbox").

Effects are stored, so they have a JSON form: `effect_to_dict` / `effect_from_dict`
(`effect_to_json` is the same thing, faster, for the commit). `seq` numbers a session's
effects in the order they were asked for: the outbox field, and the flush order.

The core says *what* job it wants (kind, work, attempt), never how RQ names it: the job id
and the function come from `parley.schemas.jobs`, where the worker's allowlist reads too.
"""

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

import orjson
from pydantic import BaseModel

from parley.schemas.codes import CloseReason, EffectKind
from parley.schemas.inputs import ParentLink
from parley.schemas.jobs import KIND_OF_QUEUE, JobKind
from parley.schemas.listing import Listed, ListingStatus
from parley.schemas.results import WorkOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class Enqueue:
    """Run a job. Its payload is what the worker receives: the shell adds the job's
    identity (session, work, attempt) and where to answer (reply_to, app) to `args`."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.ENQUEUE, init=False)
    job: JobKind
    work: str
    attempt: int
    #: seconds the job may run (RQ's job timeout)
    timeout: float
    #: the results stream the job posts its outcome to
    reply_to: str
    #: the session's sub-agent app spec, or None for the worker's own app
    app: str | None
    #: the kind's own arguments: decide {trigger, proposed}, llm {request}, tool {name, arguments}
    args: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """Take a voided job off its queue (best effort: stopping is never relied on, I4)."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.CANCEL, init=False)
    job: JobKind
    work: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexAdd:
    """An interrupt opened: list it in the fleet-wide index (`parley interrupts`)."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.INDEX_ADD, init=False)
    interrupt_id: str
    reason: str
    anchor: str | None
    raised_at: int
    #: Unix ms when its timeout_s passes (the deadline sweep resumes it with `default`)
    deadline: int | None
    #: the parent session, when this one is a sub-agent's
    parent: str | None
    #: what the listing shows besides (parley/client/inbox.py): the interrupt's payload, its deadline's
    #: default, who may resume it, and the session's metadata at raise time
    payload: Any = None
    default: Any = None
    resumable_by: list[str] | None = None
    metadata: dict[str, Any] | None = None
    #: what a resume's payload must match (None: any answer)
    response_schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexRemove:
    """An interrupt resumed: out of the index and the deadlines."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.INDEX_REMOVE, init=False)
    interrupt_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Spawn:
    """Start a sub-agent's child session with its first message (the call's arguments)."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.SPAWN, init=False)
    child: str
    content: str
    parent: ParentLink
    #: the parent turn's trace context: the child's turn is in the same trace
    trace: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A child session's first turn ended: post its reply as the parent call's outcome."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.REPORT, init=False)
    stream: str
    outcome: WorkOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """Move a fleet-wide counter, exactly once with the transition that moved it."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.STAT, init=False)
    field: str
    delta: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    """Close a sub-agent's child that its parent (this session) stopped waiting for: a
    `session.close` input naming the call, so only that call's child obeys it."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.CLOSE, init=False)
    child: str
    call_id: str
    attempt: int
    reason: CloseReason


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineAdd:
    """Put a timer of this session in the deadlines index; the deadline sweep posts it back
    as a `deadline` outcome naming `timer` once `at` (Unix ms) has passed."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.DEADLINE_ADD, init=False)
    timer: str
    at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineRemove:
    """Take a timer of this session out of the deadlines index (what it timed is over)."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.DEADLINE_REMOVE, init=False)
    timer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Retire:
    """The session closed: copy its whole document to the archive stream (unless the
    dispatcher runs without one), then list it in the expiring set until `expires_at`, when
    the expiry sweep deletes every key of it (docs/operations.md, "Retention and archive")."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.RETIRE, init=False)
    #: when it closed (Unix ms): the archive entry's `closed_at`
    closed_at: int
    #: when its retention ends (Unix ms)
    expires_at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Idle:
    """An open session's place in the idle set: closed as idle once `at` (Unix ms) has
    passed; None takes it out (an interrupt with a deadline is open: never idle)."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.IDLE, init=False)
    at: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """The session moved in the list of sessions (`parley sessions`): created, parked, active
    again, closed. The shell takes its member out of the sets it left and into those it
    entered (schemas/listing.py names them); emitted only when something of it changed."""

    seq: int
    op: EffectKind = dataclasses.field(default=EffectKind.LISTING, init=False)
    #: the member's creation time (with the session, its member in every set)
    created_at: int
    #: the status set it leaves (None: it was not listed, the session is new) and enters
    before: ListingStatus | None
    after: ListingStatus
    #: metadata pairs (key, value) whose sets it enters and leaves
    added: tuple[tuple[str, str], ...] = ()
    removed: tuple[tuple[str, str], ...] = ()


def listing_move(seq: int, before: Listed | None, after: Listed) -> Listing:
    """The move from where the session was listed (None: nowhere) to where it is now."""
    was = set(before.metadata) if before is not None else set()
    now = set(after.metadata)
    status_before = before.status if before is not None else None
    return Listing(seq=seq, created_at=after.created_at, before=status_before, after=after.status,
                   added=tuple(sorted(now - was)), removed=tuple(sorted(was - now)))


Effect = (Enqueue | Cancel | IndexAdd | IndexRemove | Spawn | Report | Stat | Close | DeadlineAdd
          | DeadlineRemove | Retire | Idle | Listing)

#: The class of each effect kind (what `effect_from_dict` builds).
EFFECT_TYPES: dict[EffectKind, type[Effect]] = {
    EffectKind.ENQUEUE: Enqueue, EffectKind.CANCEL: Cancel, EffectKind.INDEX_ADD: IndexAdd,
    EffectKind.INDEX_REMOVE: IndexRemove, EffectKind.SPAWN: Spawn, EffectKind.REPORT: Report,
    EffectKind.STAT: Stat, EffectKind.CLOSE: Close, EffectKind.DEADLINE_ADD: DeadlineAdd,
    EffectKind.DEADLINE_REMOVE: DeadlineRemove, EffectKind.RETIRE: Retire, EffectKind.IDLE: Idle,
    EffectKind.LISTING: Listing,
}


def _json_default(value: Any) -> Any:
    """orjson hook: the pydantic models an effect carries (Spawn.parent, Report.outcome)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON")


def effect_to_json(fx: Effect) -> bytes:
    """The stored form: the effect's fields, `op` naming its kind."""
    return orjson.dumps(fx, default=_json_default)


def effect_to_dict(fx: Effect) -> dict[str, Any]:
    """The stored form as plain JSON values (what `effect_to_json` writes)."""
    out: dict[str, Any] = orjson.loads(effect_to_json(fx))
    return out


def effect_from_dict(value: dict[str, Any]) -> Effect:
    """An effect from its stored form (also the form written before effects were typed)."""
    kind = EffectKind(value["op"])
    if kind is EffectKind.ENQUEUE and "job" not in value:
        return _legacy_enqueue(value)
    if kind is EffectKind.CANCEL and "job" not in value:
        return _legacy_cancel(value)
    known = {f.name: value[f.name] for f in fields(EFFECT_TYPES[kind]) if f.init and f.name in value}
    if "job" in known:
        known["job"] = JobKind(known["job"])
    if kind is EffectKind.CLOSE:
        known["reason"] = CloseReason(known["reason"])
    if kind is EffectKind.LISTING:
        known["before"] = None if known.get("before") is None else ListingStatus(known["before"])
        known["after"] = ListingStatus(known["after"])
        for name in ("added", "removed"):
            known[name] = tuple((str(k), str(v)) for k, v in known.get(name, ()))
    if kind is EffectKind.SPAWN:
        known["parent"] = ParentLink.model_construct(**known["parent"])  # checked by the child
    elif kind is EffectKind.REPORT:
        known["outcome"] = WorkOutcome.model_validate(known["outcome"])
    return EFFECT_TYPES[kind](**known)


def _legacy_enqueue(value: dict[str, Any]) -> Enqueue:
    """An enqueue written with its RQ queue, function and job id, the job's identity inside
    its payload: everything the shell derives now is recomputed from that identity."""
    payload = dict(value["payload"])
    return Enqueue(seq=value["seq"], job=KIND_OF_QUEUE[value["queue"]], work=payload.pop("work"),
                   attempt=payload.pop("attempt"), timeout=value["timeout"],
                   reply_to=payload.pop("reply_to"), app=payload.pop("app"),
                   args={k: v for k, v in payload.items() if k != "session"})


def _legacy_cancel(value: dict[str, Any]) -> Cancel:
    """A cancel written with only its RQ job id, which cannot be turned back into (work,
    attempt): it cancels nothing. Cancels are best effort (I4): the voided job's result, if
    it comes, is dropped as settled."""
    return Cancel(seq=value["seq"], job=KIND_OF_QUEUE[value["queue"]], work="", attempt=0)


def split_effects(effects: list[Effect]) -> tuple[list[Enqueue], list[Effect]]:
    """A transition's effects split into the jobs its commit script enqueues itself and the
    effects left for the outbox, each in the order asked for (docs/design.md, "The enqueue path
    and the outbox").

    A job enqueued and then cancelled within the same transition is neither enqueued nor
    cancelled: with the enqueue in the commit and the cancel in the settle after it, a worker
    could otherwise take a job that is already void. A job whose cancel comes *before* its
    enqueue in one transition (the same job id asked for again) keeps the outbox path, so the
    two stay in the order asked for."""
    cancelled_later: set[tuple[str, int]] = set()
    for fx in effects:
        if isinstance(fx, Cancel):
            cancelled_later.add((fx.work, fx.attempt))
    jobs: list[Enqueue] = []
    rest: list[Effect] = []
    seen_cancel: set[tuple[str, int]] = set()
    dropped: set[tuple[str, int]] = set()
    for fx in effects:
        if isinstance(fx, Enqueue):
            ident = (fx.work, fx.attempt)
            if ident in seen_cancel:
                rest.append(fx)  # its cancel came first: both keep the outbox's order
            elif ident in cancelled_later:
                dropped.add(ident)  # void before it was ever enqueued
            else:
                jobs.append(fx)
        elif isinstance(fx, Cancel):
            ident = (fx.work, fx.attempt)
            if ident in dropped:
                dropped.discard(ident)  # the one cancel of the job dropped above
            else:
                rest.append(fx)
            seen_cancel.add(ident)
        else:
            rest.append(fx)
    return jobs, rest
