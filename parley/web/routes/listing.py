"""The list of open interrupts: `GET /` (one page of it, filtered by its query string) and
`GET /events` (the same filter, live: server-sent events of rows raised since the page was
rendered, fed by every shard's feed through the process's one `FeedHub`)."""

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from parley.client.inbox import OpenInterrupt
from parley.web import present
from parley.web.live import Change, ChangeKind, event_stream, shown_by, since_of
from parley.web.observe import LIVE_PAGES
from parley.web.query import ListQuery, QueryError
from parley.web.routes.common import now_ms, page, signed_in
from parley.web.state import Inbox, inbox_of


@signed_in
async def list_page(request: Request, principal: str) -> Response:
    inbox = inbox_of(request)
    try:
        query = ListQuery.parse(request.query_params)
        result = await inbox.client.interrupt_page(query.interrupt_filter(principal),
                                                   limit=inbox.config.page_size, cursor=query.cursor)
    except (QueryError, ValueError) as exc:
        return page(request, "list.html", {"query": ListQuery(), "rows": [], "error": str(exc),
                                           "next_page": None, "may_answer_of": {}, "unreachable": []},
                    status=400)
    return page(request, "list.html", {
        "query": query, "rows": result.items, "error": None, "unreachable": result.unreachable,
        "next_page": None if result.cursor is None else "/" + query.query_string(result.cursor),
        "may_answer_of": {(r.session, r.interrupt_id): inbox.may_answer(principal, r)
                          for r in result.items},
    })


@signed_in
async def events(request: Request, principal: str) -> Response:
    inbox = inbox_of(request)
    try:
        query = ListQuery.parse(request.query_params)
    except QueryError as exc:
        return PlainTextResponse(str(exc), status_code=400)
    try:
        since = since_of(request.query_params.get("since"))
    except ValueError as exc:
        return PlainTextResponse(str(exc), status_code=400)
    where = query.interrupt_filter(principal)

    async def render(change: Change) -> str | None:
        if change.kind is not ChangeKind.RAISED or not shown_by(where, change):
            return None  # the feed's event tells: no lookup for a row this page drops
        row = await raised_row(inbox, change)
        if row is None or not where.matches(row):
            return None
        return render_row(inbox, row, principal)

    async def still_signed_in() -> bool:
        # a sign-out, a new password or a removal ends the stream too (within a ping)
        return await inbox.principal(request) is not None

    async def body() -> AsyncIterator[str]:
        with LIVE_PAGES.track_inprogress():
            async for frame in event_stream(inbox.hub.subscribe(since), render, request.is_disconnected,
                                            still_allowed=still_signed_in):
                yield frame

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def render_row(inbox: Inbox, row: OpenInterrupt, principal: str) -> str:
    return inbox.templates.get_template("_row.html").render(
        row=row, may_answer=inbox.may_answer(principal, row), now_ms=now_ms(),
        duration=present.duration)


async def raised_row(inbox: Inbox, change: Change) -> OpenInterrupt | None:
    """The row of an interrupt the feed says was raised, looked up once for every page of
    this process (live.RowCache: the index follows the feed entry by the outbox flush, so a
    row not there yet is asked again for a moment; one resumed meanwhile stays None)."""
    row: OpenInterrupt | None = await inbox.hub.rows.get(
        change.session, change.interrupt_id, inbox.client.open_interrupt)
    return row
