"""Several questions, one answer: `GET /bulk?pick=P&pick=...` (the picked questions and the one
form that answers them, or the groups they fall into when they ask for different answers) and
`POST /bulk/answer` (the answer, sent to each question as its own signed resume; each outcome is
reported on its own). The choosing is pure (parley/web/bulk.py)."""

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from parley.client.inbox import OpenInterrupt
from parley.web import bulk, deliver, followup
from parley.web.bulk import BulkError, Pick, Selection
from parley.web.followup import NextEvent
from parley.web.forms import APPROVE, DECLINE, answer_form, read_answer
from parley.web.observe import ANSWERS
from parley.web.present import AnswerResult, AnswerStatus
from parley.web.routes.common import checked_form, page, signed_in, text_of
from parley.web.state import Inbox, inbox_of


@signed_in
async def bulk_page(request: Request, principal: str) -> Response:
    try:
        picks = bulk.read_picks(request.query_params.getlist("pick"))
    except BulkError as exc:
        return page(request, "bulk.html", _context(error=str(exc)), status=400)
    selection = await _select(inbox_of(request), principal, picks)
    return page(request, "bulk.html", _context(selection=selection))


@signed_in
async def bulk_answer(request: Request, principal: str) -> Response:
    inbox = inbox_of(request)
    form = await checked_form(request, ANSWERS)
    if isinstance(form, Response):
        return form
    try:
        picks = bulk.read_picks([v for v in form.getlist("pick") if isinstance(v, str)])
    except BulkError as exc:
        return page(request, "bulk.html", _context(error=str(exc)), status=400)
    selection = await _select(inbox, principal, picks)
    if not selection.rows and len(selection.groups) <= 1:
        # all answered meanwhile (or sent twice): nothing is sent, the page says what became of each
        return page(request, "bulk.html", _context(selection=selection))
    if len(selection.groups) > 1:
        return page(request, "bulk.html", _context(selection=selection, error=(
            "These questions ask for different answers: answer each group on its own.")), status=400)
    payload, values, errors = await _payload(selection, form)
    if errors:
        result = AnswerResult(AnswerStatus.INVALID, "Not sent: the answer does not fit the form.")
        ANSWERS.labels(result.status.value).inc()
        return page(request, "bulk.html", _context(selection=selection, values=values, errors=errors,
                                                   result=result), status=422)
    answer_id = text_of(form.get("answer_id")) or ""
    usable_id = answer_id.isascii() and 8 <= len(answer_id) <= 64
    # one form's answers wait for the engine together, but at most SENDS_AT_ONCE of them (each
    # holds a blocking read of its session's events): a big selection takes a little longer
    # rather than take every connection of the process
    gate = asyncio.Semaphore(SENDS_AT_ONCE)

    async def one(row: OpenInterrupt) -> tuple[deliver.Sent, deliver.Followed | None]:
        async with gate:
            key = bulk.idempotency_key(answer_id, Pick(row.session, row.interrupt_id)) if usable_id else None
            sent = await deliver.send(inbox, principal, row, payload, key)
            return sent, await deliver.followed(inbox, row.session, sent, payload)

    outcomes = await asyncio.gather(*(one(row) for row in selection.rows), return_exceptions=True)
    reports: list[Report] = []
    for row, outcome in zip(selection.rows, outcomes, strict=True):
        sent, after = (deliver.failed(outcome, row), None) if isinstance(outcome, BaseException) else outcome
        ANSWERS.labels(sent.result.status.value).inc()
        reports.append(Report(row, sent.result, after.next_events if after is not None else []))
    answered = {(row.session, row.interrupt_id) for row in selection.rows}
    next_row = await deliver.next_question(inbox, principal, answered)
    return page(request, "bulk.html", _context(
        selection=selection, sent=reports, summary=followup.answer_summary(payload), next_row=next_row))


#: answers of one bulk form sent (and waited for) at the same time
SENDS_AT_ONCE = 8


@dataclass(frozen=True)
class Report:
    """What became of one question's answer of a bulk form."""

    row: OpenInterrupt
    result: AnswerResult
    #: the session's events after the answer (delivered ones only)
    next_events: list[NextEvent]


async def _select(inbox: Inbox, principal: str, picks: list[Pick]) -> Selection:
    rows = await deliver.gather_rows(inbox, [(p.session, p.interrupt_id) for p in picks])
    return bulk.select(picks, rows, lambda row: inbox.may_answer(principal, row))


async def _payload(selection: Selection, form: FormData) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """The answer the form gives (payload, the values to show again, errors beside fields)."""
    if selection.schema is None:
        decision = text_of(form.get("decision"))
        if decision not in ("approve", "decline"):
            return None, {}, {"answer": "choose Approve or Decline"}
        return (APPROVE if decision == "approve" else DECLINE), {}, {}
    items = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
    # off the event loop, as on the one-question page: a schema's pattern may backtrack
    read = await asyncio.to_thread(read_answer, selection.schema, items)
    return read.value, read.values, ({} if read.ok else read.errors)


def _context(*, selection: Selection | None = None, error: str | None = None,
             values: dict[str, Any] | None = None, errors: dict[str, str] | None = None,
             result: AnswerResult | None = None, sent: list[Report] | None = None,
             summary: str | None = None, next_row: OpenInterrupt | None = None) -> dict[str, Any]:
    rows = selection.rows if selection is not None else []
    return {
        "selection": selection, "error": error, "rows": rows,
        "form": answer_form(rows[0].response_schema) if rows else None,
        "values": values or {}, "errors": errors or {}, "result": result, "sent": sent,
        "summary": summary, "next_row": next_row, "answer_id": secrets.token_urlsafe(12),
        "token_of": bulk.token_of, "pick_of": bulk.pick_of,
        "group_link": lambda group: "/bulk?" + "&".join(
            "pick=" + bulk.pick_of(r) for r in group),
    }
