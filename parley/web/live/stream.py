"""One page's event stream: the text/event-stream body made of its subscription's changes, each
raised row rendered (side by side, sent in order), pings while idle, until the page goes away
or may no longer see the inbox."""

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable

from parley.runtime.logs import kv
from parley.web.live.changes import RESET, Change, ChangeKind
from parley.web.live.sse import HELLO, PING, frame_of
from parley.web.live.subscription import Subscription

log = logging.getLogger("parley.web.live")

#: at most this many changes of one page are being rendered ahead of the one it sends
RENDER_AHEAD = 64


async def event_stream(subscription: Subscription, render: Callable[[Change], Awaitable[str | None]],
                       is_disconnected: Callable[[], Awaitable[bool]],
                       ping_s: float = 15.0,
                       still_allowed: Callable[[], Awaitable[bool]] | None = None,
                       ) -> AsyncGenerator[str, None]:
    """The text/event-stream body for one page: `event: raised` with the row's HTML (`render`
    returns None for a row the page's filters do not show: nothing is sent), `event: gone` with
    `{session, interrupt_id, timed_out, type}`, `event: reset`; a comment every `ping_s` without
    anything else sent. Ends when `is_disconnected()` (asked at least every `ping_s`), when
    `still_allowed()` says False (asked at least every `ping_s`: the person signed out or was
    removed), or when the subscription is closed; closes the subscription.

    The changes queued are rendered at once, side by side (up to RENDER_AHEAD), and sent in
    their order: a slow row holds the ones after it up by its own time only."""
    if ping_s <= 0:
        raise ValueError(f"ping_s must be positive, not {ping_s}")
    pending: deque[asyncio.Task[str | None]] = deque()
    try:
        yield HELLO
        sent_at = checked_at = time.monotonic()
        while not subscription.closed and not await is_disconnected():
            if still_allowed is not None and time.monotonic() - checked_at >= ping_s:
                if not await still_allowed():
                    return
                checked_at = time.monotonic()
            if not pending:
                due = min(sent_at, checked_at if still_allowed is not None else sent_at) + ping_s
                change = await subscription.get(timeout=max(0.0, due - time.monotonic()))
                if change is None:
                    if time.monotonic() - sent_at >= ping_s and not subscription.closed:
                        yield PING
                        sent_at = time.monotonic()
                    continue
                pending.append(asyncio.create_task(_frame_of(change, render)))
            # everything queued now starts rendering, so its lookups run side by side
            while len(pending) < RENDER_AHEAD:
                change = await subscription.get(timeout=0)
                if change is None:
                    break
                pending.append(asyncio.create_task(_frame_of(change, render)))
            text = await pending.popleft()
            if text is not None:
                yield text
                sent_at = time.monotonic()
    finally:
        for task in pending:
            task.cancel()
        subscription.close()


async def _frame_of(change: Change, render: Callable[[Change], Awaitable[str | None]]) -> str | None:
    """The event of `change` (None: a raised row this page does not show)."""
    if change.kind is not ChangeKind.RAISED:
        return frame_of(change)
    try:
        html = await render(change)
    except Exception:
        # the page would miss this row: it reloads instead, and the error is in the log
        log.exception("row not rendered: page reset", extra=kv(session=change.session,
                                                                interrupt=change.interrupt_id))
        return frame_of(RESET)
    return None if html is None else frame_of(change, html)
