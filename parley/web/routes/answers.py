"""One interrupt: `GET /interrupt?session=S&id=I` (what it asks, the conversation that led
to it, the form of its answer) and `POST /interrupt/answer` (the answer, sent as a signed
resume as the signed-in principal; the page waits for the engine's word on it and shows it).
"""

import asyncio
import logging
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from parley.client.inbox import OpenInterrupt
from parley.web import deliver, followup, present
from parley.web.conversation import path_to, pretty_json
from parley.web.forms import APPROVE, DECLINE, answer_form, field_of_path, read_answer
from parley.web.observe import ANSWERS
from parley.web.present import AnswerResult, AnswerStatus
from parley.web.routes.common import checked_form, page, signed_in, text_of
from parley.web.state import Inbox, inbox_of

log = logging.getLogger("parley.inbox")


@signed_in
async def interrupt_page(request: Request, principal: str) -> Response:
    session, interrupt_id = request.query_params.get("session"), request.query_params.get("id")
    if not session or not interrupt_id:
        return PlainTextResponse("name the interrupt: /interrupt?session=S&id=I", status_code=400)
    return await interrupt_view(request, principal, session, interrupt_id)


@signed_in
async def answer(request: Request, principal: str) -> Response:
    inbox = inbox_of(request)
    form = await checked_form(request, ANSWERS)
    if isinstance(form, Response):
        return form
    session, interrupt_id = text_of(form.get("session")), text_of(form.get("interrupt_id"))
    if not session or not interrupt_id:
        return PlainTextResponse("the form names no interrupt", status_code=400)
    values: dict[str, Any] = {}
    row = await inbox.client.open_interrupt(session, interrupt_id)
    if row is None:
        answered = await resumed_event(inbox, session, interrupt_id)
        return await _answered(request, principal, session, interrupt_id,
                               present.no_longer_open(answered, principal))
    if not inbox.may_answer(principal, row):
        ANSWERS.labels("forbidden").inc()
        return await interrupt_view(request, principal, session, interrupt_id, status=403)
    decision = text_of(form.get("decision"))
    if row.response_schema is None:
        if decision not in ("approve", "decline"):
            return PlainTextResponse("decision must be approve or decline", status_code=400)
        payload: Any = APPROVE if decision == "approve" else DECLINE
    else:
        items = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
        # off the event loop: an app's `pattern` may backtrack on a hostile value, and that
        # must stall this request only, not every page and event stream of the process
        read = await asyncio.to_thread(read_answer, row.response_schema, items)
        values = read.values
        if not read.ok:
            result = AnswerResult(AnswerStatus.INVALID, "Not sent: the answer does not fit the form.")
            ANSWERS.labels(result.status.value).inc()
            return await interrupt_view(request, principal, session, interrupt_id, result, values,
                                        read.errors, status=422)
        payload = read.value
    answer_id = text_of(form.get("answer_id"))
    sent = await deliver.send(inbox, principal, row, payload,
                              f"inbox-{answer_id}" if answer_id and answer_id.isascii()
                              and 8 <= len(answer_id) <= 64 else None)
    result = sent.result
    followed = await deliver.followed(inbox, session, sent, payload)
    where = field_of_path(result.path, answer_form(row.response_schema))
    errors = {where: result.detail or ""} if result.path else {}
    next_row = await deliver.next_question(inbox, principal, {(session, interrupt_id)}) \
        if followed is not None else None
    return await _answered(request, principal, session, interrupt_id, result, values, errors,
                           followed=followed, next_row=next_row)


async def interrupt_view(request: Request, principal: str, session: str, interrupt_id: str,
                         result: AnswerResult | None = None, values: dict[str, Any] | None = None,
                         errors: dict[str, str] | None = None, status: int = 200, *,
                         followed: deliver.Followed | None = None,
                         next_row: OpenInterrupt | None = None) -> Response:
    """The interrupt's page: as it is now, with what became of an answer (`result`) and the
    values and errors of the form just posted (after a delivered one, the answer as sent, what
    the session did next, and the next open question); 404 when it is not open and nothing was
    posted."""
    inbox = inbox_of(request)
    # the row and the session's messages: two reads of one shard, at once
    row, view = await asyncio.gather(inbox.client.open_interrupt(session, interrupt_id),
                                     inbox.client.show(session))
    tip = (row.anchor if row is not None else None) or (view or {}).get("head")
    conversation = path_to((view or {}).get("messages") or [], tip)
    may = row is not None and inbox.may_answer(principal, row)
    context = {
        "session": session, "interrupt_id": interrupt_id, "row": row, "conversation": conversation,
        "request_json": None if row is None else pretty_json(row.request),
        "may_answer": may, "has_key": inbox.signing_key(principal) is not None,
        "form": None if row is None else answer_form(row.response_schema),
        "values": values or {}, "errors": errors or {}, "result": result,
        "answer_id": secrets.token_urlsafe(12), "followed": followed, "next_row": next_row,
    }
    if row is None and result is None and status == 200:
        status = 404
    return page(request, "interrupt.html", context, status=status)


async def _answered(request: Request, principal: str, session: str, interrupt_id: str,
                    result: AnswerResult, values: dict[str, Any] | None = None,
                    errors: dict[str, str] | None = None, *, followed: deliver.Followed | None = None,
                    next_row: OpenInterrupt | None = None) -> Response:
    ANSWERS.labels(result.status.value).inc()
    return await interrupt_view(request, principal, session, interrupt_id, result, values, errors,
                                status_of(result), followed=followed, next_row=next_row)


def status_of(result: AnswerResult) -> int:
    """The HTTP status of a page that shows `result`."""
    return {AnswerStatus.UNAVAILABLE: 503, AnswerStatus.INVALID: 422}.get(result.status, 200)


async def resumed_event(inbox: Inbox, session: str, interrupt_id: str) -> dict[str, Any] | None:
    """The event that ended an interrupt (resumed or cancelled), among the session's latest
    events; None when not found there."""
    shard = await inbox.client.index_of_session(session)
    entries: Any = await inbox.shards[shard].xrevrange(inbox.redis_keys.events(session), count=500)
    for _id, fields in entries or []:
        event = followup.event_of(fields)
        if (event is not None and event.get("interrupt_id") == interrupt_id
                and event.get("type") in ("interrupt.resumed", "interrupt.cancelled")):
            return event
    return None
