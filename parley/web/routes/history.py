"""The history of answered questions: `GET /history?session=S` (the questions of one session
that ended, read from its events stream) and `GET /history?principal=P` (the answers P gave,
read from every shard's feed); both newest first, a bounded read a page, with an Older link
(parley/web/history.py has the reading, docs/inbox.md "History" the bounds).

Any signed-in person may read anyone's history: the people of one inbox answer for one team,
and every one of them can already read every open question and its conversation.
"""

import asyncio
from typing import Any

from redis.asyncio import Redis
from starlette.requests import Request
from starlette.responses import Response

from parley.web.history import (
    Bounds,
    FeedPosition,
    FeedScan,
    HistoryPage,
    HistoryQuery,
    principal_history,
    session_history,
    stream_entries,
)
from parley.web.live.replies import text_of
from parley.web.query import QueryError
from parley.web.routes.common import page, signed_in
from parley.web.state import Inbox, inbox_of

#: what one page reads at most (docs/inbox.md, "History")
BOUNDS = Bounds()


@signed_in
async def history_page(request: Request, principal: str) -> Response:
    inbox = inbox_of(request)
    try:
        query = HistoryQuery.parse(request.query_params)
    except QueryError as exc:
        return page(request, "history.html", {"query": None, "view": None, "error": str(exc)}, status=400)
    view = await (session_view(inbox, query) if query.by_session else principal_view(inbox, query))
    return page(request, "history.html", {"query": query, "view": view, "error": None})


async def session_view(inbox: Inbox, query: HistoryQuery) -> HistoryPage:
    """The page of `query.session`'s history: its latest `session_events` events before
    `query.before` (one more, to know whether older ones are left), read on its shard."""
    assert query.session is not None
    shard = await inbox.client.index_of_session(query.session)
    newest = "+" if query.before is None else "(" + query.before  # `(`: after it, exclusive
    reply: Any = await inbox.shards[shard].xrevrange(inbox.redis_keys.events(query.session), max=newest,
                                                     min="-", count=BOUNDS.session_events + 1)
    # off the event loop: up to 2,000 events, messages and all, are parsed and read, and that
    # must stall this request only, not every page and event stream of the process
    session, principal = query.session, query.principal

    def read() -> HistoryPage:
        return session_history(session, stream_entries(reply), BOUNDS.session_events, principal)

    return await asyncio.to_thread(read)


async def principal_view(inbox: Inbox, query: HistoryQuery) -> HistoryPage:
    """The page of `query.principal`'s answers: every shard's feed read at once, each at most
    `feed_scan` entries, merged."""
    assert query.principal is not None
    before = None if query.before is None else FeedPosition.parse(query.before)
    feed = inbox.redis_keys.feed
    scans = [FeedScan(query.principal, i, before, limit=BOUNDS.page_rows, budget=BOUNDS.feed_scan,
                      chunk=BOUNDS.feed_chunk) for i in range(len(inbox.shards))]
    reads = [scan_feed(r, feed, s) for r, s in zip(inbox.shards, scans, strict=True)]
    firsts = await asyncio.gather(*(first_entry(r, feed) for r in inbox.shards), *reads)
    return principal_history(scans, firsts[:len(inbox.shards)], limit=BOUNDS.page_rows)


async def first_entry(r: Redis, feed: str) -> str | None:
    """The id of the feed's oldest entry (None: no feed): what it still holds is from then on."""
    reply: Any = await r.xrange(feed, min="-", max="+", count=1)
    return text_of(reply[0][0]) if reply else None


async def scan_feed(r: Redis, feed: str, scan: FeedScan) -> None:
    """Read one shard's feed for `scan` until it is done (XREVRANGE: the inbox's login may read
    the feed, not join a group on it)."""
    while (asked := scan.request()) is not None:
        newest, count = asked
        reply: Any = await r.xrevrange(feed, max=newest, min="-", count=count)
        scan.take(reply)
