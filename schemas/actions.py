"""Actions (docs/protocol.md, Actions): what `decide` returns, as a `Decision`."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from parley.schemas.decision_errors import explain, returned

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LlmCall(_Action):
    type: Literal["llm.call"] = "llm.call"
    model: str | None = None
    params: dict[str, Any] | None = None


class ToolExecute(_Action):
    """Runs an existing call (`call_id`, by default the trigger's) or, with `name` (and
    `arguments`), starts a new one; mixing the two forms is an invalid decision (the core's
    `decisions.validate` says which)."""

    type: Literal["tool.execute"] = "tool.execute"
    call_id: Name | None = None
    name: Name | None = None
    arguments: dict[str, Any] | None = None


class ToolResult(_Action):
    type: Literal["tool.result"] = "tool.result"
    call_id: Name | None = None
    result: Any


class ToolError(_Action):
    type: Literal["tool.error"] = "tool.error"
    call_id: Name | None = None
    error: str


class MessageAction(_Action):
    type: Literal["message"] = "message"
    content: str


class InterruptAction(_Action):
    type: Literal["interrupt"] = "interrupt"
    reason: Annotated[str, Field(min_length=1, max_length=256)]
    interrupt_id: Name | None = None
    payload: Any = None
    timeout_s: Annotated[float, Field(gt=0)] | None = None
    default: Any = None
    resumable_by: list[str] | None = None
    #: JSON Schema (Draft 2020-12) a resume's payload must match, else it is refused `invalid_resume`
    response_schema: dict[str, Any] | None = None


Action = Annotated[
    LlmCall | ToolExecute | ToolResult | ToolError | MessageAction | InterruptAction,
    Field(discriminator="type"),
]

# Actions that only record: the ones allowed after an `interrupt` in one decision (docs/protocol.md, Actions).
RECORDING_ACTIONS = frozenset({"message", "tool.result", "tool.error"})


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actions: list[Action] = Field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """The decision as JSON values, leaving out fields the app did not set."""
        return {"actions": [a.model_dump(mode="json", exclude_unset=True) | {"type": a.type}
                            for a in self.actions]}


DECISION_ADAPTER: TypeAdapter[Decision] = TypeAdapter(Decision)

#: each action type's model, in the order the docs list them
ACTION_MODELS: dict[str, type[BaseModel]] = {
    m.model_fields["type"].default: m
    for m in (LlmCall, ToolExecute, ToolResult, ToolError, MessageAction, InterruptAction)}


class InvalidDecision(ValueError):
    """A decision the engine cannot read; its message says what is wrong in one line (with a
    "did you mean" for a misspelt type or field)."""


def decision_from_app(value: Any) -> Decision:
    """Accepts what an app may return: a `Decision`, a dict `{"actions": [...]}`, or a list."""
    if isinstance(value, Decision):
        return value
    if isinstance(value, list):
        value = {"actions": value}
    if value is None:
        raise InvalidDecision("decide returned None; return `proposed` to carry on")
    if not isinstance(value, dict):
        raise InvalidDecision(returned(value))
    listed = value.get("actions", [])
    value = {"actions": [_plain(a) for a in listed] if isinstance(listed, list) else listed,
             **{k: v for k, v in value.items() if k != "actions"}}
    try:
        return Decision.model_validate(value)
    except ValidationError as exc:
        raise InvalidDecision(explain(exc, ACTION_MODELS)) from None


def _plain(action: Any) -> Any:
    if isinstance(action, BaseModel):
        return action.model_dump(exclude_unset=True) | {"type": getattr(action, "type", None)}
    return action
