"""What became of a resume (`Client.resume(..., wait=True)`, `parley resume --wait`).

A resume has exactly one outcome, told by the first event that names its entry
(`input.entry`): `interrupt.resumed` (delivered or not), `input.refused` or `input.ignored`.
Reading it is pure: the client finds the event, `resume_outcome` says what it means.
"""

from enum import IntEnum, StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

#: the events a resume's outcome is told by
OUTCOME_EVENTS = frozenset({"interrupt.resumed", "input.refused", "input.ignored"})


class ResumeStatus(StrEnum):
    #: cleared, and `decide` gets the `interrupt.resumed` trigger
    DELIVERED = "delivered"
    #: cleared, but nothing delivered yet (`next` says what happens instead)
    NOT_DELIVERED = "not_delivered"
    #: refused with a RefusalCode: nothing changed, the interrupt is still open
    REFUSED = "refused"
    #: ignored with an IgnoreCode: already resumed, or no such interrupt
    IGNORED = "ignored"
    #: no outcome before the time limit (no dispatcher running?): the entry stays in its stream
    TIMEOUT = "timeout"


class ResumeExit(IntEnum):
    """`parley resume --wait`'s exit status, one per outcome (1 and 2 are click's own errors,
    69 a Redis the CLI cannot use)."""

    DELIVERED = 0
    NOT_DELIVERED = 3
    REFUSED = 4
    IGNORED = 5
    TIMEOUT = 6


class ResumeOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: ResumeStatus
    #: the resume's entry id in its input stream
    entry: str
    #: refused/ignored: the RefusalCode or IgnoreCode
    code: str | None = None
    #: refused: why (for humans); not delivered: what happens next
    message: str | None = None
    #: refused invalid_resume: where the payload fails the response_schema
    path: str | None = None
    #: the event that told the outcome (None on timeout)
    event: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return int(ResumeExit[self.status.name])

    def describe(self) -> str:
        """One line for a person."""
        match self.status:
            case ResumeStatus.DELIVERED:
                return f"delivered (entry {self.entry})"
            case ResumeStatus.NOT_DELIVERED:
                return f"not delivered (entry {self.entry}): {self.message}"
            case ResumeStatus.REFUSED:
                where = f" (at {self.path})" if self.path else ""
                return f"refused {self.code} (entry {self.entry}): {self.message}{where}"
            case ResumeStatus.IGNORED:
                return f"ignored {self.code} (entry {self.entry})"
        return f"timeout (entry {self.entry}): {self.message}"


def is_outcome_of(entry: str, event: dict[str, Any]) -> bool:
    ref = event.get("input")
    return event.get("type") in OUTCOME_EVENTS and isinstance(ref, dict) and ref.get("entry") == entry


def resume_outcome(entry: str, event: dict[str, Any]) -> ResumeOutcome:
    """The outcome the event `is_outcome_of` the resume `entry` tells."""
    kind = event["type"]
    if kind == "input.refused":
        return ResumeOutcome(status=ResumeStatus.REFUSED, entry=entry, code=event["code"],
                             message=event.get("message"), path=event.get("path"), event=event)
    if kind == "input.ignored":
        return ResumeOutcome(status=ResumeStatus.IGNORED, entry=entry, code=event["code"], event=event)
    if event.get("delivered"):
        return ResumeOutcome(status=ResumeStatus.DELIVERED, entry=entry, event=event)
    return ResumeOutcome(status=ResumeStatus.NOT_DELIVERED, entry=entry, message=_what_next(event),
                         event=event)


def _what_next(event: dict[str, Any]) -> str:
    """Why a cleared interrupt delivered nothing, and what happens instead (docs/rules.md, I9, I3)."""
    if event.get("reason") == "budget":
        return ("a limit is still spent: the session is paused again by a new budget interrupt "
                "(resume that one with a higher limit)")
    return ("the interrupt's branch is not the active one: nothing is decided now; its turn goes "
            "on when the branch is switched back to (branch.switch)")


def timed_out(entry: str, timeout_s: float) -> ResumeOutcome:
    return ResumeOutcome(status=ResumeStatus.TIMEOUT, entry=entry,
                         message=f"no outcome within {timeout_s:g} s: is a dispatcher running? "
                                 "The entry stays in its stream and is applied when one reads it")
