"""Work outcomes: what workers (and dispatchers, for internal outcomes) post to the results stream."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class WorkOutcome(BaseModel):
    """One finished job. `work` and `attempt` let the machine drop late or stale results."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: str
    work: str
    attempt: int
    kind: Literal["decide", "llm", "tool"]
    ok: bool
    value: Any = None
    error: str | None = None
