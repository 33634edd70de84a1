"""Work outcomes: what workers (and dispatchers, for internal outcomes) post to the results stream."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.schemas.tracing import TRACEPARENT_PATTERN


class AppException(BaseModel):
    """What the app's code raised, for the person who wrote it: the exception's type and message
    and the last frames of the app's own code (`path:line in function`), innermost last."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    message: str
    frames: list[str] = []


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
    # posted (with `lost`) by the worker that took the job and gives it back without running it
    # (a take its replicas never confirmed, a worker stopping with a job taken): signed with the
    # job's token, it is the taker's word that nothing ran, so the job is issued again whatever
    # the tool (docs/protocol.md, "Giving a job back")
    unrun: bool = False
    # what the app's code raised, when that is why `ok` is false (a decide, tool or model call
    # of the app's that failed with an exception of its own)
    exception: AppException | None = None
    # a tool's question (`parley.interrupt()` in its code, with no answer yet at that place):
    # the interrupt's fields (reason, payload, response_schema, timeout_s, default,
    # resumable_by); the call waits for the answer and runs again with it
    interrupt: dict[str, Any] | None = None
    # a sub-agent's report: the child session it comes from, and the work the child used
    source: str | None = None
    usage: dict[str, int] | None = None
    # the job's span (a traceparent), when the worker traces: the transition applying this
    # outcome is its child (docs/tracing.md)
    trace: Annotated[str, Field(pattern=TRACEPARENT_PATTERN)] | None = None

    @model_validator(mode="after")
    def _unrun_is_lost(self) -> "WorkOutcome":
        if self.unrun and (self.ok or not self.lost):
            raise ValueError("an unrun outcome is a lost one: ok false, lost true")
        if self.interrupt is not None and (self.kind != "tool" or self.ok or self.lost):
            raise ValueError("an interrupt outcome is a tool's, neither ok nor lost")
        return self

    @property
    def engine_made(self) -> bool:
        """Made by a dispatcher alone (a deadline, a sub-agent's report), never by a worker: applied
        only with the engine's signature (schemas/signing.py, `outcome_signature`)."""
        return self.kind == "deadline" or self.source is not None
