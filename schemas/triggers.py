"""Triggers (docs/protocol.md, Triggers): what `decide(trigger, proposed)` receives.

One permissive model: a field that this type of trigger lacks reads as None, so
an app's checks read naturally (`trigger.name == "send_email"` on any trigger).
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

TriggerType = Literal[
    "session.created",
    "message.created",
    "llm.completed",
    "llm.failed",
    "tool.execute",
    "tool.completed",
    "interrupt.resumed",
]
TRIGGER_TYPES: frozenset[str] = frozenset(TriggerType.__args__)  # type: ignore[attr-defined]


class Trigger(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    type: TriggerType
    session: str
    head: str | None = None
    # session.created
    budget: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    # message.created, llm.completed
    message: dict[str, Any] | None = None
    # tool.*, llm.failed
    call_id: str | None = None
    name: str | None = None
    arguments: dict[str, Any] | None = None
    result: Any = None
    error: str | None = None
    pending: list[str] | None = None
    # interrupt.resumed
    interrupt_id: str | None = None
    reason: str | None = None
    request: Any = None
    payload: Any = None
    timed_out: bool | None = None
    origin: dict[str, Any] | None = None
