"""Server-sent events (pure): the text of each event a page's stream sends (text/event-stream).

`HELLO` opens a stream (and sets the browser's reconnect wait); `PING`, a comment, keeps an idle
one open; `frame_of` is a change's event: `raised` with the row's HTML, `gone` with
`{session, interrupt_id, timed_out, type}`, `reset`."""

from typing import Any

import orjson

from parley.web.live.changes import Change, ChangeKind

#: how long a browser waits before it reconnects a dropped event stream (the `retry:` field)
RECONNECT_MS = 3000


def frame(event: str, data: dict[str, Any]) -> str:
    """One server-sent event (JSON keeps the data on one line: a newline would end it)."""
    return f"event: {event}\ndata: {orjson.dumps(data).decode()}\n\n"


HELLO = f"retry: {RECONNECT_MS}\nevent: hello\ndata: {{}}\n\n"
PING = ": ping\n\n"


def frame_of(change: Change, html: str | None = None) -> str:
    """The event of `change`: a RAISED one's carries `html`, its row (a RESET is sent instead of
    a raised row without it)."""
    if change.kind is ChangeKind.RAISED and html is not None:
        return frame("raised", {"session": change.session, "interrupt_id": change.interrupt_id,
                                "html": html})
    if change.kind is ChangeKind.GONE:
        return frame("gone", {"session": change.session, "interrupt_id": change.interrupt_id,
                              "timed_out": change.timed_out, "type": change.type})
    return frame("reset", {})
