"""Sending an answer and reading what followed it: the I/O around parley/web/followup.py and
parley/web/bulk.py, shared by the one-question page and the bulk form."""

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from parley.client.inbox import InterruptFilter, OpenInterrupt
from parley.client.producer import InvalidInput, SubmitRefused, SubmitUnavailable
from parley.runtime.logs import kv
from parley.schemas.resumes import ResumeOutcome
from parley.web import followup, present
from parley.web.followup import NextEvent
from parley.web.live.replies import text_of
from parley.web.present import AnswerResult, AnswerStatus
from parley.web.state import Inbox

log = logging.getLogger("parley.inbox")

#: how long a delivered answer's page waits for the session's next events (a decide job, a tool
#: starting): long enough for an app that answers at once, short enough not to hold the page
FOLLOW_S = 1.5
#: events of a session that end the wait: the session has done what the answer set off
SETTLED = frozenset({"turn.completed", "interrupt.raised", "session.closed", "tool.deferred"})
#: a session's latest events searched for the answer's `interrupt.resumed`
LOOK_BACK = 200


@dataclass(frozen=True)
class Sent:
    """An answer sent, and what the engine made of it."""

    result: AnswerResult
    #: the engine's word (None: the send failed before it, or it was not a valid input)
    outcome: ResumeOutcome | None = None


@dataclass(frozen=True)
class Followed:
    """What the page says once an answer was delivered."""

    #: the answer as sent, for a person
    summary: str
    #: the session's events after the answer, one line each
    next_events: list[NextEvent] = field(default_factory=list)


async def send(inbox: Inbox, principal: str, row: OpenInterrupt, payload: Any,
               idempotency_key: str | None) -> Sent:
    """Send `payload` as `principal`'s signed resume of `row` and wait for the engine's word."""
    key = inbox.signing_key(principal)
    if key is None:  # the keys file lost the person's key since the page checked may_answer
        return Sent(AnswerResult(AnswerStatus.REFUSED, "Not sent: the inbox has no signing key for you.",
                                 "Ask an administrator to add one to the keys file.", "no_key"))
    try:
        outcome = await inbox.client.resume(
            row.session, row.interrupt_id, payload, principal=principal, key=key, wait=True,
            timeout_s=inbox.config.resume_timeout_s, idempotency_key=idempotency_key)
    except InvalidInput as exc:
        return Sent(AnswerResult(AnswerStatus.INVALID, "Not sent: the answer is not a valid input.",
                                 str(exc)))
    except SubmitRefused as exc:
        return Sent(AnswerResult(AnswerStatus.REFUSED, f"Refused ({exc.code}).", exc.message, exc.code))
    except (SubmitUnavailable, RedisError) as exc:
        log.warning("answer not sent", extra=kv(session=row.session, error=repr(exc)))
        return Sent(AnswerResult(AnswerStatus.UNAVAILABLE,
                                 "Parley could not be reached: your answer may not have been sent.",
                                 "Reload the page: if the question is still open, answer again."))
    result = present.answer_result(outcome, principal)
    log.info("answer sent", extra=kv(session=row.session, interrupt_id=row.interrupt_id, principal=principal,
                                     outcome=result.status.value, code=result.code))
    return Sent(result, outcome)


def failed(exc: BaseException, row: OpenInterrupt) -> Sent:
    """What a person is told of one answer of several whose send raised what `send` does not
    expect (the others' outcomes still stand, and are shown)."""
    log.error("answer failed", extra=kv(session=row.session, interrupt_id=row.interrupt_id, error=repr(exc)),
              exc_info=exc)
    return Sent(AnswerResult(AnswerStatus.UNAVAILABLE, "Parley could not be reached: this answer may not "
                             "have been sent.", "Open the question: if it is still open, answer again."))


async def followed(inbox: Inbox, session: str, sent: Sent, payload: Any) -> Followed | None:
    """For a delivered answer: its summary and the session's next events, waited for at most
    FOLLOW_S; None for any other outcome. A failure to read them leaves the list empty (the
    answer was delivered: that is what the page must say)."""
    if sent.outcome is None or sent.result.status not in (AnswerStatus.DELIVERED, AnswerStatus.NOT_DELIVERED):
        return None
    summary = followup.answer_summary(payload)
    try:
        after = await _events_after_answer(inbox, session, sent.outcome.entry)
    except (RedisError, OSError) as exc:
        log.warning("could not read what followed an answer", extra=kv(session=session, error=repr(exc)))
        after = []
    return Followed(summary, followup.next_events(after))


async def _events_after_answer(inbox: Inbox, session: str, entry: str) -> list[Mapping[str, Any]]:
    shard = await inbox.client.index_of_session(session)
    raw: Any = await inbox.shards[shard].xrevrange(inbox.redis_keys.events(session), count=LOOK_BACK)
    entries = [(text_of(i), e) for i, fields in reversed(raw or [])
               if (e := followup.event_of(fields)) is not None]
    found = followup.events_after(entries, entry)
    if found is None:
        return []
    resumed_id, after = found
    if any(e.get("type") in SETTLED for e in after) or len(after) >= followup.MAX_NEXT_EVENTS:
        return after
    last = entries[-1][0] if entries else resumed_id
    until = time.monotonic() + FOLLOW_S
    more: list[Mapping[str, Any]] = list(after)
    async for _id, event in inbox.client.events(session, after=last, block_ms=250, until=until):
        more.append(event)
        if event.get("type") in SETTLED or len(more) >= followup.MAX_NEXT_EVENTS:
            break
    return more


async def next_question(inbox: Inbox, principal: str, answered: set[tuple[str, str]]) -> OpenInterrupt | None:
    """The oldest open question the person may answer, other than those just answered (the
    index may list one for a moment after its resume)."""
    where = InterruptFilter(principal=principal)
    page = await inbox.client.interrupt_page(where, limit=len(answered) + 5)
    for row in page.items:
        if (row.session, row.interrupt_id) not in answered and inbox.may_answer(principal, row):
            return row
    return None


async def gather_rows(inbox: Inbox, keys: list[tuple[str, str]]) -> list[OpenInterrupt | None]:
    """The open rows of several questions, read at once."""
    found = await asyncio.gather(*(inbox.client.open_interrupt(s, i) for s, i in keys))
    return list(found)
