"""The stored shape of a session, apart from its messages (which live in their own hash).

Messages are plain dicts in the wire shape of docs/protocol.md (Messages) plus two internal fields,
stripped for readers: `turn` (the client message that started the turn the message belongs to)
and `order` (its place in the session's creation order, counted in `Core.seq["order"]`).
"""

from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from parley.schemas.codes import SessionStatus


class QueuedTrigger(BaseModel):
    """A fired trigger with the actions proposed for it, as of when it fired (docs/protocol.md, Triggers)."""

    trigger: dict[str, Any]
    proposed: list[dict[str, Any]]
    turn: str | None = None
    # interrupt.resumed is delivered even when another interrupt still parks the branch (I9).
    bypass: bool = False
    # Its llm.call was withheld while an earlier trigger of its turn was out at a decide job
    # proposing one; handed back if that decision ends without a model call.
    llm_withheld: bool = False


class CallApproval(BaseModel):
    """A gated call's approval (schemas/approvals.py): the question asked, and its answer."""

    #: the engine's approval interrupt for this call
    interrupt_id: str
    #: the digest of the call's name and arguments the question showed
    digest: str
    #: None while the question is open; then whether an allowed principal said yes
    granted: bool | None = None
    #: who answered (None: unsigned, or the deadline)
    by: str | None = None
    #: the approval has let the call run: it never lets anything run again
    used: bool = False


class Work(BaseModel):
    """An open call: a tool call (`call-N`) or an LLM call (`llm-N`)."""

    id: str
    kind: Literal["tool", "llm"]
    turn: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    # tool: new (waiting for its tool.execute decision), running, deferred, asking (its code
    # called `parley.interrupt()`: it waits for the answer, then runs again); llm: running
    status: Literal["new", "running", "deferred", "asking"] = "new"
    attempt: int = 0
    head: str | None = None
    # a sub-agent call: the child session running it, and when the parent stops waiting (Unix ms)
    child: str | None = None
    deadline: int | None = None
    # llm: the trigger whose decision started the call, held again if a pause voids the call
    # outside the pausing interrupt's own turn
    origin: "QueuedTrigger | None" = None
    # tool with `needs_approval`: its approval, once the engine has asked
    approval: CallApproval | None = None
    #: the answers to the questions its code asked (`parley.interrupt()`), in order: each run
    #: starts from the beginning, and its N-th question returns the N-th answer
    answers: list[Any] = Field(default_factory=list)


class Deciding(BaseModel):
    """The one decide job in flight for the session."""

    work: str
    attempt: int
    item: QueuedTrigger


class Turn(BaseModel):
    id: str
    tip: str
    held: list[QueuedTrigger] = Field(default_factory=list)
    # the tip is a model reply without tool calls (what a sub-agent reports to its parent)
    replied: bool = False
    #: the turn's trace context (a traceparent; schemas/tracing.py), when it is traced
    trace: str | None = None


class Interrupt(BaseModel):
    id: str
    reason: str
    payload: Any = None
    anchor: str | None
    turn: str | None
    origin: QueuedTrigger | None
    voided_llm: bool = False
    # the voided call's own action (model, params), proposed again on resume
    voided_call: dict[str, Any] | None = None
    # raised by the engine itself (a budget stop), not by an app's decision
    system: bool = False
    raised_at: int
    timeout_s: float | None = None
    deadline: int | None = None
    default: Any = None
    resumable_by: list[str] | None = None
    #: what a resume's payload must match (actions.InterruptAction.response_schema)
    response_schema: dict[str, Any] | None = None
    #: an approval interrupt the engine raised for this call (schemas/approvals.py)
    approves: str | None = None
    #: the tool call whose code asked this (`parley.interrupt()`): the answer goes to it
    call: str | None = None
    #: its turn's trace context, kept for the span of its life (schemas/tracing.py)
    trace: str | None = None


class Core(BaseModel):
    session: str
    created_at: int
    # closed: refuses every input and drops every outcome (inputs.apply_input, outcomes.apply_outcome)
    status: SessionStatus = SessionStatus.OPEN
    #: when it was closed (Unix ms), for its retention and its archive
    closed_at: int | None = None
    #: the calls still running when it closed, by id: their results, when they come, are
    #: recorded as `tool.late` (once each), never applied (a job the close took off its queue
    #: never answers: its entry just stays)
    running_at_close: dict[str, Work] = Field(default_factory=dict)
    #: its last transition (Unix ms), kept only when an idle timeout is configured
    active_at: int | None = None
    head: str | None = None
    budget: dict[str, Any] | None = None
    used: dict[str, int] = Field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    seq: dict[str, int] = Field(default_factory=dict)
    #: how many messages the session has, and how many branches (leaves of its message tree):
    #: the admission limits' counts (dispatcher/core/admission.py), also written to the meta
    #: hash (`n_msgs`, `n_branches`) for the submit function. A session stored before they
    #: were kept is counted again from its messages (n_msgs differs from their number).
    n_msgs: int = 0
    n_branches: int = 0
    work: dict[str, Work] = Field(default_factory=dict)
    turns: dict[str, Turn] = Field(default_factory=dict)
    interrupts: dict[str, Interrupt] = Field(default_factory=dict)
    resumed: list[str] = Field(default_factory=list)
    queue: list[QueuedTrigger] = Field(default_factory=list)
    deciding: Deciding | None = None
    # sub-agents: this session's app when it is a child, its parent call, its children
    app: str | None = None
    parent: dict[str, Any] | None = None
    reported: bool = False
    children: list[str] = Field(default_factory=list)

    def to_json(self) -> str:
        """What the commit stores: fields at their defaults are left out (a parked seed session's
        core is a third smaller; `model_validate_json` fills them back in)."""
        return self.model_dump_json(exclude_defaults=True)


class SessionState(BaseModel):
    """What a transition reads: the core (None: no such session), the tree's shape, the bodies of
    the few messages it reads whole, and markers.

    The dispatcher loads `tree` (the shape's flat list, schemas/tree.py) from the meta hash and
    only the bodies `bodies_wanted` names: never the whole messages hash, except once for a
    session stored before the shape was kept (`tree` None: the core builds the shape from
    `messages`, all of them, and the commit stores it). A reader (`parley show`) loads every body
    and no shape."""

    core: Core | None
    #: message id -> stored message, for the messages loaded whole
    messages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: the shape as stored (schemas/tree.py `Shape.flat`); None: not stored
    tree: list[str | int] | None = None
    # stream name -> id of the last entry of that stream applied to this session
    applied: dict[str, str] = Field(default_factory=dict)
    # the input's idempotency key was already used
    duplicate: bool = False

    @classmethod
    def from_records(cls, core: bytes | None, messages: dict[bytes, bytes],
                     applied: bytes | None = None, duplicate: bool = False,
                     tree: list[str | int] | None = None) -> "SessionState":
        """The state from the raw values of the session's meta hash and (some of) its messages.
        Built without validating again what was just parsed: a session of thousands of messages
        would pay for it on every read."""
        return cls.model_construct(
            core=Core.model_validate_json(core) if core else None,
            messages={k.decode(): orjson.loads(v) for k, v in messages.items()},
            tree=tree,
            applied=orjson.loads(applied) if applied else {},
            duplicate=duplicate,
        )


def bodies_wanted(core: Core | None) -> list[str]:
    """The messages a transition of this session may read whole, chosen before it is computed:
    a sub-agent's child that has not reported yet reports its turn's tip (dispatcher/core/work.py
    `report`), an existing one when the turn ended earlier. Every other body a transition
    touches is one it adds; the model's request is read by the worker (workers/jobs.py)."""
    if core is None or core.parent is None or core.reported or core.status == SessionStatus.CLOSED:
        return []
    return [t.tip for t in core.turns.values()]


Work.model_rebuild()
