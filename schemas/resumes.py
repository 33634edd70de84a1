"""What became of an input a client waits for: a resume (`Client.resume(..., wait=True)`,
`parley resume --wait`) or a close (`Client.close(..., wait=True)`, `parley close --wait`).

Such an input has exactly one outcome, told by the first event that names its entry
(`input.entry`): for a resume `interrupt.resumed` (delivered or not), for a close
`session.closed`, and for either `input.refused` or `input.ignored`. Reading it is pure: the
client finds the event, `resume_outcome` / `close_outcome` say what it means, and `RESUME` /
`CLOSE` bundle that reading for the client's wait (parley/client/producer.py, `OutcomeWait`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

#: the events a resume's outcome is told by
OUTCOME_EVENTS = frozenset({"interrupt.resumed", "input.refused", "input.ignored"})
#: the events a close's outcome is told by
CLOSE_EVENTS = frozenset({"session.closed", "input.refused", "input.ignored"})


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


def names_entry(entry: str, event: dict[str, Any]) -> bool:
    ref = event.get("input")
    return isinstance(ref, dict) and ref.get("entry") == entry


def is_outcome_of(entry: str, event: dict[str, Any]) -> bool:
    """Whether `event` tells the outcome of the resume `entry`."""
    return event.get("type") in OUTCOME_EVENTS and names_entry(entry, event)


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


def _no_outcome(timeout_s: float) -> str:
    return (f"no outcome within {timeout_s:g} s: is a dispatcher running? "
            "The entry stays in its stream and is applied when one reads it")


def timed_out(entry: str, timeout_s: float) -> ResumeOutcome:
    return ResumeOutcome(status=ResumeStatus.TIMEOUT, entry=entry, message=_no_outcome(timeout_s))


def resume_told(entry: str, event: dict[str, Any]) -> ResumeOutcome | None:
    """The outcome of the resume `entry` if `event` tells it, else None."""
    return resume_outcome(entry, event) if is_outcome_of(entry, event) else None


# ---- a close -------------------------------------------------------------------------------------


class CloseStatus(StrEnum):
    #: closed by this input (`session.closed`)
    CLOSED = "closed"
    #: refused with a RefusalCode (e.g. `unauthorized`): nothing changed
    REFUSED = "refused"
    #: ignored with an IgnoreCode: `session_closed` (it was closed already), `unknown_session`,
    #: `duplicate`
    IGNORED = "ignored"
    #: no outcome before the time limit (no dispatcher running?): the entry stays in its stream
    TIMEOUT = "timeout"


class CloseExit(IntEnum):
    """`parley close --wait`'s exit status: those of `parley resume --wait` for the same
    outcomes (1 and 2 are click's own errors, 69 a Redis the CLI cannot use)."""

    CLOSED = 0
    REFUSED = 4
    IGNORED = 5
    TIMEOUT = 6


class CloseOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: CloseStatus
    #: the close's entry id in its input stream
    entry: str
    #: refused/ignored: the RefusalCode or IgnoreCode
    code: str | None = None
    #: refused: why (for humans); timeout: what to check
    message: str | None = None
    #: the event that told the outcome (None on timeout)
    event: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return int(CloseExit[self.status.name])

    def describe(self) -> str:
        """One line for a person."""
        match self.status:
            case CloseStatus.CLOSED:
                return f"closed (entry {self.entry})"
            case CloseStatus.REFUSED:
                return f"refused {self.code} (entry {self.entry}): {self.message}"
            case CloseStatus.IGNORED:
                return f"ignored {self.code} (entry {self.entry})"
        return f"timeout (entry {self.entry}): {self.message}"


def close_told(entry: str, event: dict[str, Any]) -> CloseOutcome | None:
    """The outcome of the close `entry` if `event` tells it, else None."""
    if event.get("type") not in CLOSE_EVENTS or not names_entry(entry, event):
        return None
    if event["type"] == "input.refused":
        return CloseOutcome(status=CloseStatus.REFUSED, entry=entry, code=event["code"],
                            message=event.get("message"), event=event)
    if event["type"] == "input.ignored":
        return CloseOutcome(status=CloseStatus.IGNORED, entry=entry, code=event["code"], event=event)
    return CloseOutcome(status=CloseStatus.CLOSED, entry=entry, event=event)


def close_timed_out(entry: str, timeout_s: float) -> CloseOutcome:
    return CloseOutcome(status=CloseStatus.TIMEOUT, entry=entry, message=_no_outcome(timeout_s))


# ---- what a waiting client reads -----------------------------------------------------------------

OutcomeT = TypeVar("OutcomeT", ResumeOutcome, CloseOutcome)


@dataclass(frozen=True, slots=True)
class OutcomeOf(Generic[OutcomeT]):
    """How a client waiting on one kind of input reads its outcome: `told(entry, event)` is the
    outcome if the event tells it (else None), `timed_out(entry, timeout_s)` the one when none
    came in time."""

    told: Callable[[str, dict[str, Any]], OutcomeT | None]
    timed_out: Callable[[str, float], OutcomeT]


RESUME: OutcomeOf[ResumeOutcome] = OutcomeOf(resume_told, timed_out)
CLOSE: OutcomeOf[CloseOutcome] = OutcomeOf(close_told, close_timed_out)
