"""Client inputs (docs/protocol.md, Inputs): what producers write to `parley:inputs`."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from parley.schemas.keys import PREFIX_PATTERN
from parley.schemas.tracing import TRACEPARENT_PATTERN

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]


class _Input(BaseModel):
    # strict: JSON types are taken as they are ("3" is not a number, true is not 1)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    llm_calls: int | None = Field(default=None, ge=0)
    tool_calls: int | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=0)


class ParentLink(BaseModel):
    """A sub-agent's parent call, written by the parent's dispatcher when it spawns the
    child session. The parent checks it again when the child reports (the call, attempt and
    child must all match), so a forged link settles nothing."""

    model_config = ConfigDict(extra="forbid", strict=True)

    session: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/-]{1,256}$")]
    call_id: Name
    attempt: int
    app: Annotated[str, Field(min_length=1, max_length=256)]
    reply_to: Annotated[str, Field(pattern=rf"^{PREFIX_PATTERN}:results(:\d+)?$")]  # any prefix's


class CallRef(BaseModel):
    """A parent's call, as a `session.close` names it: the child checks it is that call's."""

    model_config = ConfigDict(extra="forbid", strict=True)

    session: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/-]{1,256}$")]
    call_id: Name
    attempt: int


class SessionCreate(_Input):
    """`parent` and `task` are the dispatcher's own (a sub-agent's spawn): the child's link to
    its parent call, and its first message, created with it in one step."""

    type: Literal["session.create"]
    budget: Budget | None = None
    metadata: dict[str, Any] | None = None
    parent: ParentLink | None = None
    task: str | None = None
    #: written by a dispatcher only, with `task`: the parent turn's trace context
    traceparent: Annotated[str, Field(pattern=TRACEPARENT_PATTERN)] | None = None

    @model_validator(mode="after")
    def _task_with_parent(self) -> "SessionCreate":
        if self.task is not None and self.parent is None:
            raise ValueError("`task` comes only with `parent`")
        if self.traceparent is not None and self.task is None:
            raise ValueError("`traceparent` comes only with `task`")
        return self


class MessageCreate(_Input):
    """`parent_id` omitted means "the active head"; null means "a new root".

    The difference is kept in `model_fields_set`, see `parent_given`.
    """

    type: Literal["message.create"]
    content: str
    parent_id: Name | None = None
    message_id: Name | None = None
    #: the producer's trace context (W3C traceparent): the turn is traced in the producer's trace
    traceparent: Annotated[str, Field(pattern=TRACEPARENT_PATTERN)] | None = None

    @property
    def parent_given(self) -> bool:
        return "parent_id" in self.model_fields_set


class InterruptResume(_Input):
    type: Literal["interrupt.resume"]
    interrupt_id: Name
    payload: Any = None


class BranchSwitch(_Input):
    type: Literal["branch.switch"]
    head: Name


class ToolResultInput(_Input):
    """Settles a deferred call: exactly one of `result` and `error`."""

    type: Literal["tool.result"]
    call_id: Name
    result: Any = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> "ToolResultInput":
        has_result = "result" in self.model_fields_set
        has_error = "error" in self.model_fields_set
        if has_result == has_error:
            raise ValueError("tool.result needs exactly one of `result` and `error`")
        if has_error and self.error is None:
            raise ValueError("`error` must be a string")
        return self


class SessionClose(_Input):
    """Close a session: it refuses every later input and runs nothing more (docs/protocol.md,
    `session.close`). A client's close may say why (`reason`, reported on `session.closed`).
    `parent` is the dispatcher's own: it closes the child of a sub-agent call its parent
    stopped waiting for, naming that call, which the child checks."""

    type: Literal["session.close"]
    reason: Annotated[str, Field(min_length=1, max_length=256)] = "closed"  # CloseReason.CLOSED
    parent: CallRef | None = None


Input = Annotated[
    SessionCreate | MessageCreate | InterruptResume | BranchSwitch | ToolResultInput | SessionClose,
    Field(discriminator="type"),
]
INPUT_ADAPTER: TypeAdapter[Input] = TypeAdapter(Input)
INPUT_TYPES = frozenset(
    {"session.create", "message.create", "interrupt.resume", "branch.switch", "tool.result",
     "session.close"}
)
