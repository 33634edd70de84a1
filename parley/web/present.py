"""How the inbox words things for a person (pure): what became of an answer, how old a
question is, how long until its deadline."""

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from parley.schemas.codes import IgnoreCode, RefusalCode
from parley.schemas.resumes import ResumeOutcome, ResumeStatus
from parley.schemas.signing import BAD_SIGNATURE, UNKNOWN_PRINCIPAL


class AnswerStatus(StrEnum):
    """The outcome shown after an answer (`#outcome[data-status]`, the metric's `outcome`)."""

    DELIVERED = "delivered"
    #: cleared, but the session is on another branch: it goes on when switched back
    NOT_DELIVERED = "not_delivered"
    #: the engine refused it (the interrupt stays open): `code` says why
    REFUSED = "refused"
    #: someone else answered first (or its deadline did)
    ALREADY_ANSWERED = "already_answered"
    #: ignored for another reason (the session closed, a repeated submit, no such interrupt)
    IGNORED = "ignored"
    #: no word from the engine in time (no dispatcher running?); the answer is still queued
    TIMEOUT = "timeout"
    #: the form does not match the schema: nothing was sent
    INVALID = "invalid"
    #: Redis or the submit function could not take it: nothing was sent
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class AnswerResult:
    status: AnswerStatus
    #: one line for the person
    headline: str
    #: more, when there is more to say (the engine's reason, what happens next)
    detail: str | None = None
    #: the engine's refusal or ignore code
    code: str | None = None
    #: refused invalid_resume: where the payload fails the schema (a JSON path)
    path: str | None = None


_IGNORED = {
    IgnoreCode.SESSION_CLOSED.value: "The session was closed: its questions were cancelled with it.",
    IgnoreCode.DUPLICATE.value: "This answer was already sent (the form was submitted twice).",
    IgnoreCode.UNKNOWN_INTERRUPT.value: "The session has no such question.",
}


#: where the inbox and the dispatchers get their keys (the fix named on a refusal of its key)
SAME_KEYS_FILE = ("they must be started with the same keys file as the inbox (--keys-file / "
                  "PARLEY_KEYS_FILE). Tell whoever runs Parley.")


def refused_detail(outcome: ResumeOutcome, principal: str | None = None) -> str | None:
    """The detail shown for a refusal: the engine's message, but for a refusal of the inbox's
    own key (`unauthorized`, unknown principal or bad signature: the dispatchers were not given
    the inbox's keys file), which the person cannot fix and the operator can, the fix."""
    if outcome.code != RefusalCode.UNAUTHORIZED or outcome.message is None:
        return outcome.message
    why = outcome.message.removeprefix(f"{RefusalCode.UNAUTHORIZED.value}: ")
    whose = f"for {principal}" if principal else "for you"
    if why == UNKNOWN_PRINCIPAL:
        fix = f"The dispatchers do not know this inbox's key {whose}: {SAME_KEYS_FILE}"
    elif why == BAD_SIGNATURE:
        fix = f"The dispatchers' key {whose} is not the one this inbox signs with: {SAME_KEYS_FILE}"
    else:
        return outcome.message
    return f"{fix} (The engine said: {outcome.message}.)"


def answer_result(outcome: ResumeOutcome, principal: str | None = None) -> AnswerResult:
    """What the engine said about a resume, for the person who sent it (`principal`: the
    signed-in person, named in the fix when the dispatchers refused the inbox's key)."""
    match outcome.status:
        case ResumeStatus.DELIVERED:
            return AnswerResult(AnswerStatus.DELIVERED, "Delivered: the session goes on with your answer.")
        case ResumeStatus.NOT_DELIVERED:
            return AnswerResult(AnswerStatus.NOT_DELIVERED,
                                "Recorded, but not delivered yet: the conversation has moved to "
                                "another branch.", outcome.message)
        case ResumeStatus.REFUSED:
            return AnswerResult(AnswerStatus.REFUSED,
                                f"Refused ({outcome.code}): the question is still open.",
                                refused_detail(outcome, principal), outcome.code, outcome.path)
        case ResumeStatus.IGNORED if outcome.code == IgnoreCode.ALREADY_RESUMED.value:
            return AnswerResult(AnswerStatus.ALREADY_ANSWERED,
                                "Already answered: someone else answered first, or its deadline passed.",
                                code=outcome.code)
        case ResumeStatus.IGNORED:
            return AnswerResult(AnswerStatus.IGNORED, f"Ignored ({outcome.code}).",
                                _IGNORED.get(outcome.code or ""), outcome.code)
    return AnswerResult(AnswerStatus.TIMEOUT, "No word from the engine yet: your answer is queued.",
                        outcome.message)


def no_longer_open(ended_by: Mapping[str, Any] | None = None, me: str | None = None) -> AnswerResult:
    """An answer to a question that closed before it was sent (nothing is sent), worded by the
    event that closed it when it was found (`interrupt.resumed` or `interrupt.cancelled`)."""
    nothing = "Nothing was sent this time."
    if ended_by is None:
        return AnswerResult(AnswerStatus.ALREADY_ANSWERED,
                            "This question is no longer open: someone else answered it, its deadline "
                            "passed, or its session closed.", nothing)
    if ended_by.get("type") == "interrupt.cancelled":
        return AnswerResult(AnswerStatus.IGNORED, "This question was cancelled: its session was closed.",
                            nothing)
    if ended_by.get("timed_out"):
        return AnswerResult(AnswerStatus.ALREADY_ANSWERED, "Its deadline passed before your answer: the "
                            "session went on with the default answer.", nothing)
    who = ended_by.get("principal")
    if who is not None and who == me:
        return AnswerResult(AnswerStatus.ALREADY_ANSWERED, "You have already answered this question "
                            "(this form was sent again).", nothing)
    by = f"by {who}" if who else "by someone else"
    return AnswerResult(AnswerStatus.ALREADY_ANSWERED, f"Already answered {by}.", nothing)


def duration(ms: int) -> str:
    """A span for a person: `42s`, `3m 05s`, `2h 07m`, `3d 4h`."""
    seconds = max(0, ms) // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def age(raised_at: int, now_ms: int) -> str:
    return f"{duration(now_ms - raised_at)} ago"


def countdown(expires_at: int, now_ms: int) -> str:
    return "passed" if expires_at <= now_ms else f"in {duration(expires_at - now_ms)}"
