"""A model's reply: what an app's `llm` returns, and what the engine records of it.

One model, read twice: the worker checks the app's reply with it before posting it
(so an app's mistake is reported where it happened), and the dispatcher's core reads
the posted value with it again before anything is recorded (the results stream is
written by workers, which the dispatcher does not trust to be well-formed).
"""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: Tool names as the model may call them (call ids are the engine's own: `call-N`).
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


class LlmToolCall(BaseModel):
    """One tool call the model asks for. Its `id` is the model's own, kept for the app's
    adapter only: the engine records the call under a `call-N` id it mints."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str | None = None
    name: ToolName
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _absent_is_empty(cls, value: Any) -> Any:
        return value or {}


class LlmReply(BaseModel):
    """A reply as docs/protocol.md ("The model") describes it. Missing or null `content`,
    `tool_calls` and `arguments` read as empty (adapters differ in what they leave out);
    a `usage` that is not an object is left out (only `usage.tokens` counts, for I3)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    content: str = ""
    tool_calls: list[LlmToolCall] = Field(default_factory=list)
    usage: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _absent_content(cls, value: Any) -> Any:
        return value or ""

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _absent_calls(cls, value: Any) -> Any:
        return value or []

    @field_validator("usage", mode="before")
    @classmethod
    def _usage_object(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else None

    def to_wire(self) -> dict[str, Any]:
        """The reply as a worker posts it: `usage` only when there is one."""
        return self.model_dump(exclude={"usage"} if self.usage is None else None)

    @property
    def tokens(self) -> int:
        """Tokens the reply reports spending (`usage.tokens`, a positive int), else 0."""
        tokens = (self.usage or {}).get("tokens")
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0


class InvalidLlmReply(ValueError):
    """A reply that is not one; its message is the `error` of the `llm.failed` it causes."""


def parse_llm_reply(value: Any) -> LlmReply:
    """The reply, or InvalidLlmReply naming the first problem and where it is."""
    try:
        return LlmReply.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidLlmReply(f"invalid model response: {first['msg']}"
                              + (f" at {where}" if where else "")) from None
