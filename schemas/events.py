"""Events (docs/protocol.md, Events): what the engine tells observers on `parley:{S}:events`.

The core builds events as plain dicts (fast, and exactly the JSON written);
these models are the contract they are checked against in tests and by clients.

A field whose value is null is not written (every session keeps its events in Redis: a parked
seed session's events fit one 1 KiB stream node without them), so each such field defaults to
None here; only the fields in USER_VALUE_FIELDS are written even when null.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from parley.schemas.codes import IgnoreCode, RefusalCode
from parley.schemas.results import AppException


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: int


class InputRef(BaseModel):
    """`input` of the events an input causes: the entry id, the type and the ids it names."""

    model_config = ConfigDict(extra="forbid")
    entry: str
    type: str | None
    interrupt_id: str | None = None
    call_id: str | None = None
    parent_id: str | None = None
    message_id: str | None = None
    head: str | None = None


class TriggerRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    call_id: str | None = None
    interrupt_id: str | None = None
    message_id: str | None = None


class SessionCreated(_Event):
    type: Literal["session.created"]
    #: absent (None) when the session has none
    budget: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    input: InputRef | None = None


class MessageCreated(_Event):
    type: Literal["message.created"]
    message: dict[str, Any]
    #: only a client's message (the one that starts a turn) names its entry
    input: InputRef | None = None


class BranchSwitched(_Event):
    type: Literal["branch.switched"]
    head: str
    parked: bool
    interrupt_ids: list[str]
    input: InputRef | None = None


class LlmStarted(_Event):
    type: Literal["llm.started"]
    call_id: str
    head: str


class LlmCompleted(_Event):
    type: Literal["llm.completed"]
    call_id: str
    head: str
    message_id: str


class LlmFailed(_Event):
    type: Literal["llm.failed"]
    call_id: str
    head: str
    error: str
    #: what the app's code raised, when that is the error
    exception: AppException | None = None


class LlmVoided(_Event):
    type: Literal["llm.voided"]
    call_id: str
    interrupt_id: str


class ApprovalRef(BaseModel):
    """Which approval let a gated call run (docs/protocol.md, "Approvals"): the engine's
    question, the digest of the call's name and arguments it showed, and who said yes."""

    model_config = ConfigDict(extra="forbid")
    interrupt_id: str
    digest: str
    #: None when the approval came unsigned (a tool without `approvers`, signing off)
    principal: str | None = None


class ToolStarted(_Event):
    type: Literal["tool.started"]
    call_id: str
    name: str
    child_session: str | None = None
    #: only for a tool with `needs_approval`
    approval: ApprovalRef | None = None


class ToolCompleted(_Event):
    type: Literal["tool.completed"]
    call_id: str
    name: str
    message_id: str
    error: str | None = None
    #: what the app's code raised, when that is the error
    exception: AppException | None = None


class ToolDeferred(_Event):
    type: Literal["tool.deferred"]
    call_id: str
    name: str
    arguments: dict[str, Any]
    approval: ApprovalRef | None = None


class TurnCompleted(_Event):
    type: Literal["turn.completed"]
    head: str


class InterruptRaised(_Event):
    type: Literal["interrupt.raised"]
    interrupt_id: str
    reason: str
    payload: Any
    #: absent (None) for a global interrupt
    anchor: str | None = None
    #: the tool call that asked, from inside its code (`parley.interrupt()`); absent otherwise
    call_id: str | None = None


class InterruptResumed(_Event):
    type: Literal["interrupt.resumed"]
    interrupt_id: str
    #: the interrupt's own reason and payload: which question this answers (None only in
    #: events written before they were reported)
    reason: str | None = None
    request: Any = None
    payload: Any
    delivered: bool
    timed_out: bool
    principal: str | None = None
    #: the resume's entry (absent when a deadline resumed it)
    input: InputRef | None = None
    #: the tool call that asked (`parley.interrupt()`), which runs again with this answer
    call_id: str | None = None


class DecisionHeld(_Event):
    type: Literal["decision.held"]
    trigger: TriggerRef
    head: str | None = None


class DecisionReleased(_Event):
    type: Literal["decision.released"]
    trigger: TriggerRef
    head: str | None = None


class DecisionFailed(_Event):
    type: Literal["decision.failed"]
    trigger: TriggerRef
    error: str
    #: what the app's code raised, when that is the error
    exception: AppException | None = None


class InterruptCancelled(_Event):
    """An open interrupt that will never be answered: its session was closed, or it asked for
    the approval of a call that was settled without it."""

    type: Literal["interrupt.cancelled"]
    interrupt_id: str
    reason: str
    request: Any = None
    #: why the session was closed (the `reason` of its `session.closed`), or `call_settled`: the
    #: engine's approval question about a call settled without it (docs/protocol.md, Approvals)
    why: str


class SessionClosed(_Event):
    type: Literal["session.closed"]
    #: a client's reason (`closed` when it gave none), or the engine's (`timeout`, `abandoned`)
    reason: str
    #: a client's close: its entry, and who signed it (None: unsigned); both absent when the
    #: engine closed the session (a sub-agent's child)
    input: InputRef | None = None
    principal: str | None = None


class ToolLate(_Event):
    """The result of a call that was still running when its session closed: recorded, never
    applied (no tool message, no trigger)."""

    type: Literal["tool.late"]
    call_id: str
    name: str
    #: exactly one of the two: the call's result (any JSON), or its error
    result: Any = None
    error: str | None = None


class InputRefused(_Event):
    type: Literal["input.refused"]
    input: InputRef | None = None
    code: RefusalCode
    message: str
    interrupt_ids: list[str] | None = None
    #: with invalid_resume: where the payload fails the response_schema (a JSON path, `$...`)
    path: str | None = None


class InputIgnored(_Event):
    type: Literal["input.ignored"]
    input: InputRef | None = None
    code: IgnoreCode


Event = Annotated[
    SessionCreated | MessageCreated | BranchSwitched | LlmStarted | LlmCompleted | LlmFailed
    | LlmVoided | ToolStarted | ToolCompleted | ToolDeferred | TurnCompleted | InterruptRaised
    | InterruptResumed | InterruptCancelled | DecisionHeld | DecisionReleased | DecisionFailed
    | SessionClosed | ToolLate
    | InputRefused | InputIgnored,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

#: The fields written even when their value is null (`Tx.emit`): a user's own JSON value (an
#: interrupt's payload and request, a resume's answer, a late call's result), where null is the
#: value given, not the absence of one. Every other null field of an event is left out.
USER_VALUE_FIELDS: frozenset[str] = frozenset({"payload", "request", "result"})

#: The events also copied to the fleet-wide feed (docs/protocol.md, "Feed"): what happens to
#: interrupts in any session, and the end of a turn, so one stream tells notifiers and
#: dashboards what thousands of session streams would.
FEED_EVENT_TYPES: frozenset[str] = frozenset(
    {"interrupt.raised", "interrupt.resumed", "interrupt.cancelled", "turn.completed"})
