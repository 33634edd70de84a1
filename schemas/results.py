"""Work outcomes: what workers (and dispatchers, for internal outcomes) post to the results stream."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class WorkOutcome(BaseModel):
    """One finished job. `work` and `attempt` let the dispatcher drop late or stale results."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: str
    work: str
    attempt: int
    # `deadline`: posted by a dispatcher when an interrupt's timeout_s has passed (`work` is its id)
    kind: Literal["decide", "llm", "tool", "deadline"]
    ok: bool
    value: Any = None
    error: str | None = None
    # posted by a dispatcher for a job whose worker died holding it (error: worker_lost)
    lost: bool = False
    # a sub-agent's report: the child session it comes from, and the work the child used
    source: str | None = None
    usage: dict[str, int] | None = None

    @property
    def engine_made(self) -> bool:
        """Made by a dispatcher alone (a deadline, a sub-agent's report), never by a worker: applied
        only with the engine's signature (schemas/signing.py, `outcome_signature`)."""
        return self.kind == "deadline" or self.source is not None
