"""Client inputs (docs/protocol.md, "Inputs"): one handler per input type, routed by `_HANDLERS`.

A handler either changes the session or says why it will not, by raising `RefuseInput`
or `IgnoreInput`; `apply_input` turns those into the `input.refused` / `input.ignored`
event in one place. Refusals and ignores are events for the sender, never errors of the engine.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parley.dispatcher.core import admission
from parley.dispatcher.core.closing import ClosedBy, close_session, is_closed
from parley.dispatcher.core.context import Context
from parley.dispatcher.core.interrupts import resume
from parley.dispatcher.core.retention import is_idle
from parley.dispatcher.core.transition import Transition, Tx
from parley.dispatcher.core.triggers import fire, release
from parley.dispatcher.core.turns import finish
from parley.dispatcher.core.work import open_tool, post_report, settle
from parley.schemas import answers
from parley.schemas.codec import InputEntry, entry_ids
from parley.schemas.codes import CallError, CloseReason, IgnoreCode, InputOutcome, RefusalCode
from parley.schemas.ids import is_child_session
from parley.schemas.inputs import (
    BranchSwitch,
    CallRef,
    Input,
    InterruptResume,
    MessageCreate,
    ParentLink,
    SessionClose,
    SessionCreate,
    ToolResultInput,
)
from parley.schemas.signing import ENGINE_PRINCIPAL
from parley.schemas.state import Core, SessionState, Turn
from parley.schemas.tracing import derived_traceparent
from parley.schemas.view import public_message


class RefuseInput(Exception):
    """The input is refused: it changes nothing, and its sender is told why."""

    def __init__(self, code: RefusalCode, message: str, **extra: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class IgnoreInput(Exception):
    """The input asks for what is already so (a replay, a late answer): nothing to do."""

    def __init__(self, code: IgnoreCode):
        super().__init__(code)
        self.code = code


def apply_input(state: SessionState, entry: InputEntry, entry_id: str, ctx: Context, *,
                owned: bool = False) -> Transition:
    """Apply one client input.

    `owned=True`: the caller will not use `state` again, so its core is edited in place
    rather than copied (it may be left half-changed if this raises)."""
    tx = Tx(state, ctx, entry.session, owned)
    tx.out.idempotency_key = entry.idempotency_key
    inp = entry.input
    tx.out.input_outcome = (inp.type, InputOutcome.APPLIED, "")
    try:
        if state.duplicate:
            raise IgnoreInput(IgnoreCode.DUPLICATE)
        _check_engine_only(tx, inp, entry)
        if is_closed(tx.core) and not isinstance(inp, SessionCreate):
            _closed(inp)
        _HANDLERS[type(inp)](tx, inp, _Source(entry, _input_ref(entry_id, inp)))
    except RefuseInput as no:
        tx.out.input_outcome = (inp.type, InputOutcome.REFUSED, no.code)
        tx.emit("input.refused", input=_input_ref(entry_id, inp), code=no.code, message=no.message,
                **no.extra)
    except IgnoreInput as noop:
        tx.out.input_outcome = (inp.type, InputOutcome.IGNORED, noop.code)
        tx.emit("input.ignored", input=_input_ref(entry_id, inp), code=noop.code)
    return finish(tx)


def _closed(inp: Input) -> None:
    """The one place a closed session answers its inputs (session.create changes nothing of it
    either: it is `session_exists`). A resume or a close asks for what closing already did
    (its interrupts were cancelled; it is closed): ignored. Anything else would change it:
    refused."""
    if isinstance(inp, InterruptResume | SessionClose):
        raise IgnoreInput(IgnoreCode.SESSION_CLOSED)
    raise RefuseInput(RefusalCode.SESSION_CLOSED, "the session is closed: it takes no more inputs")


@dataclass(frozen=True, slots=True)
class _Source:
    """The entry a handler applies, and how the events it causes name it (`input`)."""

    entry: InputEntry
    ref: dict[str, Any]


def from_engine(entry: InputEntry) -> bool:
    """An input a dispatcher wrote itself: its signature by the engine's key was verified
    (a producer holds no such key, and an unsigned entry's principal is never believed)."""
    return entry.principal == ENGINE_PRINCIPAL


def _check_engine_only(tx: Tx, inp: Input, entry: InputEntry) -> None:
    """What only the engine writes: the ids of sub-agents' children are its own (a producer's
    session there would be adopted by a spawn), and so are parent links (a spawn's, or a close
    by the parent call: a producer's close names no call)."""
    if from_engine(entry):
        return
    if isinstance(inp, SessionClose) and inp.parent is not None:
        raise RefuseInput(RefusalCode.ENGINE_ONLY,
                          "only the dispatcher closes a session for a parent call (`parent`)")
    if isinstance(inp, SessionCreate) and (inp.parent is not None or inp.task is not None):
        raise RefuseInput(RefusalCode.ENGINE_ONLY,
                          "only the dispatcher links a session to a parent call (`parent`, `task`)")
    if isinstance(inp, SessionCreate | MessageCreate) and is_child_session(tx.session):
        raise RefuseInput(RefusalCode.ENGINE_ONLY,
                          f"{tx.session!r} is a sub-agent's child id (`<parent>:sub-<n>`): only the "
                          "dispatcher creates such a session or starts a turn in it")


def _input_ref(entry_id: str, inp: Input) -> dict[str, Any]:
    """How an event names the input it is about: the entry, the type and the ids it names."""
    raw = inp.model_dump(mode="json", exclude_unset=True) | {"type": inp.type}
    return {"entry": entry_id, "type": raw.get("type"), **entry_ids(raw)}


def _create(tx: Tx, src: _Source, budget: dict[str, Any] | None, metadata: dict[str, Any] | None,
            parent: dict[str, Any] | None = None) -> None:
    tx.core = Core(session=tx.session, created_at=tx.ctx.now_ms, budget=budget, metadata=metadata,
                   parent=parent, app=parent["app"] if parent else None)
    tx.emit("session.created", budget=budget, metadata=metadata, input=src.ref)
    fire(tx, "session.created", None, [], budget=budget, metadata=metadata)


def _session_create(tx: Tx, inp: SessionCreate, src: _Source) -> None:
    if tx.core is not None:
        if inp.parent is not None:
            _spawn_onto_existing(tx, inp.parent)
        raise IgnoreInput(IgnoreCode.SESSION_EXISTS)
    _create(tx, src, inp.budget.model_dump(exclude_none=True) if inp.budget else None, inp.metadata,
            inp.parent.model_dump() if inp.parent else None)
    if inp.task is not None:  # a spawn: the child's first message, in the same step
        _start_turn(tx, src, None, None, inp.task, inp.traceparent)


def _spawn_onto_existing(tx: Tx, link: ParentLink) -> None:
    """A spawn never adopts a session: the call's arguments stay out of this conversation, and
    the parent's call fails at once rather than waiting for a report this session never sends.
    The same spawn again (its idempotency key expired) is only ignored."""
    if tx.c.parent != link.model_dump():
        post_report(tx, link.model_dump(), ok=False, error=CallError.SUBAGENT_SESSION_EXISTS)


def _message_create(tx: Tx, inp: MessageCreate, src: _Source) -> None:
    if tx.core is None and inp.parent_given and inp.parent_id is not None:
        raise RefuseInput(RefusalCode.UNKNOWN_PARENT, f"no message {inp.parent_id!r} in this session")
    if tx.core is None:
        _create(tx, src, None, None)  # implicit creation fires session.created first
    c = tx.c
    parent = inp.parent_id if inp.parent_given else c.head
    if parent is not None and not tx.has(parent):
        raise RefuseInput(RefusalCode.UNKNOWN_PARENT, f"no message {parent!r} in this session")
    parked = tx.parking(parent) if parent is not None else [
        i.id for i in c.interrupts.values() if i.anchor is None]
    if parked:  # I5 (and I3: a global interrupt refuses new roots too)
        raise RefuseInput(RefusalCode.BRANCH_PARKED, "the branch is parked by an open interrupt",
                      interrupt_ids=parked)
    parent_turn = tx.turn_of(parent)
    if parent_turn is not None and parent_turn.tip == parent:
        raise RefuseInput(RefusalCode.TURN_IN_PROGRESS, f"{parent!r} is the tip of a turn still running")
    if inp.message_id is not None and tx.has(inp.message_id):
        raise RefuseInput(RefusalCode.DUPLICATE_MESSAGE_ID, f"message id {inp.message_id!r} is already used")
    # Last: a message refused for any other reason would not have counted against a limit.
    # A session the message creates now holds nothing yet (and at least one of each is allowed).
    why = admission.full(tx.counts(), tx.ctx.admission, parent, tx.has_child(parent))
    if why is not None:
        raise RefuseInput(RefusalCode.SESSION_FULL, why)
    _start_turn(tx, src, parent, inp.message_id, inp.content, inp.traceparent)


def _start_turn(tx: Tx, src: _Source, parent: str | None, message_id: str | None, content: str,
                traceparent: str | None = None) -> None:
    """A user message under `parent` (None: a new root), and the turn it starts: in the
    producer's trace, or, when the dispatcher traces, one derived from the session and the turn."""
    c = tx.c
    mid = message_id or tx.mint("msg")
    message = {"id": mid, "parent_id": parent, "role": "user", "content": content, "turn": mid}
    if not tx.ctx.tracing:
        traceparent = None  # nothing stored, nothing carried: an untraced dispatcher pays nothing
    elif traceparent is None:
        traceparent = derived_traceparent(tx.session, mid, str(c.created_at))
    turn = Turn(id=mid, tip=mid, trace=traceparent)
    tx.touch(traceparent)
    c.turns[mid] = turn
    c.head = mid
    tx.add_message(message, src.ref)
    fire(tx, "message.created", turn, [{"type": "llm.call"}], message=public_message(message))


def _branch_switch(tx: Tx, inp: BranchSwitch, src: _Source) -> None:
    if tx.core is None or not tx.has(inp.head):
        raise RefuseInput(RefusalCode.UNKNOWN_MESSAGE, f"no message {inp.head!r} in this session")
    tx.c.head = inp.head
    ids = tx.parking(inp.head)
    tx.emit("branch.switched", head=inp.head, parked=bool(ids), interrupt_ids=ids, input=src.ref)  # I8
    release(tx, tx.turn_of(inp.head))  # I10


def _interrupt_resume(tx: Tx, inp: InterruptResume, src: _Source) -> None:
    if tx.core is None:
        raise IgnoreInput(IgnoreCode.UNKNOWN_INTERRUPT)
    rec = tx.c.interrupts.get(inp.interrupt_id)
    if rec is None:  # I11
        resumed = inp.interrupt_id in tx.c.resumed
        raise IgnoreInput(IgnoreCode.ALREADY_RESUMED if resumed else IgnoreCode.UNKNOWN_INTERRUPT)
    if rec.resumable_by is not None and src.entry.principal not in rec.resumable_by:
        # Only a signed resume by one of them clears it (unsigned: no principal).
        raise RefuseInput(RefusalCode.FORBIDDEN, "this interrupt may be resumed only by "
                      + ", ".join(rec.resumable_by))
    if rec.response_schema is not None:
        wrong = answers.mismatch(rec.response_schema, inp.payload)
        if wrong is not None:  # the interrupt stays open for a matching answer
            raise RefuseInput(RefusalCode.INVALID_RESUME,
                              f"the payload does not match the interrupt's response_schema: {wrong.message}",
                              path=wrong.path)
    resume(tx, rec, inp.payload, False, src.entry.principal, src.ref)


def _tool_result(tx: Tx, inp: ToolResultInput, src: _Source) -> None:
    w = open_tool(tx, inp.call_id) if tx.core is not None else None
    if w is None or w.status != "deferred":
        settled = tx.core is not None and _was_minted(tx.c, inp.call_id)
        raise IgnoreInput(IgnoreCode.ALREADY_SETTLED if settled else IgnoreCode.UNKNOWN_CALL)
    if "error" in inp.model_fields_set:
        settle(tx, w, error=inp.error)
    else:
        settle(tx, w, result=inp.result)


def _session_close(tx: Tx, inp: SessionClose, src: _Source) -> None:
    if from_engine(src.entry) and inp.parent is None and inp.reason == CloseReason.IDLE:
        # the idle sweep's close: it holds only if nothing happened since (retention.is_idle)
        if not is_idle(tx.core, tx.ctx):
            raise IgnoreInput(IgnoreCode.NOT_IDLE if tx.core is not None else IgnoreCode.UNKNOWN_SESSION)
        close_session(tx, inp.reason)
        return
    if tx.core is None:
        raise IgnoreInput(IgnoreCode.UNKNOWN_SESSION)
    if inp.parent is None:  # a client's close
        close_session(tx, inp.reason, ClosedBy(input=src.ref, principal=src.entry.principal))
        return
    if not _is_child_of(tx.core, inp.parent):
        # A parent closes only its own call's child, never a session that took that id first.
        raise IgnoreInput(IgnoreCode.UNKNOWN_SESSION)
    close_session(tx, inp.reason, by_parent=True)


def _is_child_of(core: Core, call: CallRef) -> bool:
    link = core.parent or {}
    return (link.get("session"), link.get("call_id"), link.get("attempt")) == \
        (call.session, call.call_id, call.attempt)


def _was_minted(core: Core, work_id: str) -> bool:
    """An id of a call this session made and has since settled (`call-N` / `llm-N`, N minted)."""
    kind, _, n = work_id.rpartition("-")
    return kind in ("call", "llm") and n.isdigit() and 0 < int(n) <= core.seq.get(kind, 0) \
        and work_id not in core.work


_HANDLERS: dict[type[Any], Callable[[Tx, Any, _Source], None]] = {
    SessionCreate: _session_create,
    MessageCreate: _message_create,
    BranchSwitch: _branch_switch,
    InterruptResume: _interrupt_resume,
    ToolResultInput: _tool_result,
    SessionClose: _session_close,
}
